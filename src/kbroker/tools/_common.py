"""What every operator tool shares: Kafka-style option parsing and help, ``--command-config``
property files, client construction, and the failure contract (one ``Error: ...`` line on
stderr, exit code 1; 0 on success).

Help reads like Kafka's joptsimple output: the tool's one-line purpose, then an
``Option / Description`` table with ``<Type: what>`` argument hints.
"""
from __future__ import annotations

import argparse
import sys
import textwrap

from kbroker.client import errors as E
from kbroker.client.config import ADMIN, CONSUMER, PRODUCER


class ToolError(Exception):
    """A failure the tool reports as one line and exit code 1."""


class KafkaArgumentParser(argparse.ArgumentParser):
    """argparse with Kafka's help layout; a usage error raises ToolError (one line, exit 1)."""

    def __init__(self, prog: str, purpose: str):
        super().__init__(prog=prog, add_help=False, allow_abbrev=False)
        self.purpose = purpose
        self.add_argument("--help", action="store_true", help="Print usage information.")
        self.add_argument("--version", action="store_true", help="Display Kafka version.")

    def format_help(self) -> str:
        rows = []
        for a in sorted(self._actions, key=lambda a: a.option_strings[0]):
            flag = a.option_strings[0]
            if a.nargs == 0:
                left = flag
            else:
                type_name = {int: "Long", float: "Double"}.get(a.type, "String")
                what = a.metavar or a.dest.replace("_", "-")
                left = f"{flag} [{type_name}]" if a.nargs == "?" else f"{flag} <{type_name}: {what}>"
            doc = a.help or ""
            if a.default not in (None, False, [], "") and a.nargs != 0 and a.nargs != "?":
                doc += f" (default: {a.default})"
            rows.append((left, doc))
        out = [self.purpose, f"{'Option':<40}Description", f"{'------':<40}-----------"]
        for left, doc in rows:
            lefts = textwrap.wrap(left, 38, subsequent_indent="  ") or [""]
            docs = []
            for para in doc.split("\n"):
                docs += textwrap.wrap(para, 40) or [""]
            for i in range(max(len(lefts), len(docs))):
                l_ = lefts[i] if i < len(lefts) else ""
                d_ = docs[i] if i < len(docs) else ""
                out.append(f"{l_:<40}{d_}".rstrip())
        return "\n".join(out) + "\n"

    def error(self, message):
        raise ToolError(message)

    def parse(self, argv, out) -> argparse.Namespace | None:
        """Parsed options, or None after printing help / version (exit 0)."""
        args = self.parse_args(argv)
        if args.help or not argv:
            out.write(self.format_help())
            return None
        if args.version:
            from kbroker import __version__
            print(f"kbroker {__version__}", file=out)
            return None
        return args


def load_properties(path: str) -> dict[str, str]:
    """A Java ``.properties`` file: ``key=value`` / ``key: value`` / ``key value`` lines,
    ``#`` and ``!`` comments, ``\\`` line continuations."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ToolError(f"cannot read {path}: {e.strerror or e}") from None
    props: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.lstrip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        i = 0
        while i < len(line) and line[i] not in "=: \t":
            i += 2 if line[i] == "\\" else 1
        key = line[:i].replace("\\", "")
        rest = line[i:].lstrip(" \t")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t")
        props[key] = rest
    return props


def parse_properties(items) -> dict[str, str]:
    """``key=value`` items (``--producer-property`` / ``--property`` style)."""
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ToolError(f"Invalid property '{item}': expected key=value")
        out[k.strip()] = v
    return out


_DEFS = {"admin": ADMIN, "consumer": CONSUMER, "producer": PRODUCER}


def client_config(kind: str, bootstrap: str, command_config: str | None = None,
                  overrides: dict | None = None, client_id: str | None = None) -> dict:
    """Settings for a kbroker.client ``kind`` (admin / consumer / producer): the
    ``--command-config`` file, then ``overrides``, then ``bootstrap.servers``. Keys this
    client does not know are dropped with a warning, as the Java clients log them (one file
    serves the admin and the consumer in kafka-consumer-groups.sh)."""
    props = load_properties(command_config) if command_config else {}
    props.update(overrides or {})
    props["bootstrap.servers"] = bootstrap
    if client_id and "client.id" not in props:
        props["client.id"] = client_id
    known = {d.name for d in _DEFS[kind]}
    for k in [k for k in props if k not in known]:
        print(f"WARN: The configuration '{k}' was supplied but isn't a known config.", file=sys.stderr)
        del props[k]
    return props


def admin(bootstrap: str, command_config: str | None = None, timeout_ms: int | None = None):
    from kbroker.client.admin import Admin

    overrides = {"default.api.timeout.ms": timeout_ms} if timeout_ms is not None else None
    return Admin(client_config("admin", bootstrap, command_config, overrides, "kbroker-admin"))


def describe_error(e: BaseException) -> str:
    """One line for an exception (a KafkaError reads ``CODE_NAME: message``)."""
    text = str(e) or type(e).__name__
    return " ".join(text.split())


def run_tool(body, argv, out=None, err=None) -> int:
    """Run ``body(argv, out)`` under the failure contract; returns the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        rc = body(argv, out)
        out.flush()
        return rc or 0
    except ToolError as e:
        print(f"Error: {e}", file=err)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except (E.KafkaError, OSError, ValueError) as e:
        print(f"Error: {describe_error(e)}", file=err)
    return 1

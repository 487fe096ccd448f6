"""ConfigDef: typed, validated configuration keys with Kafka's names and defaults.

Modelled on Kafka's ``org.apache.kafka.common.config.ConfigDef``: each key has
a type, a default, an optional validator and a doc string. Values arrive as
strings (server.properties, ``--override``, AlterConfigs) or as Python values;
``parse`` turns them into the key's type and validates them. Any problem is a
:class:`ConfigError` whose message names the key.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; ``key`` names it."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


NO_DEFAULT = object()


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: str  # "int" | "long" | "boolean" | "string" | "list" | "double" | "password"
    default: Any = NO_DEFAULT
    validator: Callable[[Any], str | None] | None = None
    doc: str = ""
    synonyms: tuple[str, ...] = ()  # other keys that can supply this value (lower precedence)

    def parse(self, raw: Any) -> Any:
        value = _convert(self.name, self.type, raw)
        if self.validator is not None and value is not None:
            problem = self.validator(value)
            if problem:
                raise ConfigError(self.name, f"invalid value {raw!r}: {problem}")
        return value


def _convert(name: str, typ: str, raw: Any) -> Any:
    if raw is None:
        return None
    try:
        if typ in ("int", "long"):
            if isinstance(raw, bool):
                raise ValueError("not a number")
            value = int(str(raw).strip()) if not isinstance(raw, int) else raw
            lo, hi = (-(2**31), INT_MAX) if typ == "int" else (-(2**63), LONG_MAX)
            if not lo <= value <= hi:
                raise ValueError(f"out of range for {typ}")
            return value
        if typ == "double":
            return float(raw)
        if typ == "boolean":
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("true", "false"):
                return s == "true"
            raise ValueError("expected true or false")
        if typ == "list":
            if isinstance(raw, (list, tuple)):
                return [str(x).strip() for x in raw]
            s = str(raw).strip()
            return [x.strip() for x in s.split(",") if x.strip()] if s else []
        if typ in ("string", "password"):
            return str(raw).strip()
    except ValueError as e:
        raise ConfigError(name, f"invalid value {raw!r}: {e}") from None
    raise ConfigError(name, f"unknown config type {typ}")


# -- validators -----------------------------------------------------------

def at_least(lo: float) -> Callable[[Any], str | None]:
    return lambda v: None if v >= lo else f"must be at least {lo}"


def between(lo: float, hi: float) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi}"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        values = v if isinstance(v, list) else [v]
        bad = [x for x in values if x not in choices]
        return f"must be one of {', '.join(choices)}" if bad else None

    return check


@dataclass
class ConfigDef:
    keys: dict[str, ConfigKey] = field(default_factory=dict)

    def define(self, name: str, type: str, default: Any = NO_DEFAULT, validator=None, doc: str = "", synonyms: Iterable[str] = ()) -> "ConfigDef":
        if name in self.keys:
            raise ValueError(f"duplicate config key {name}")
        self.keys[name] = ConfigKey(name, type, default, validator, doc, tuple(synonyms))
        return self

    def __contains__(self, name: str) -> bool:
        return name in self.keys

    def parse(self, props: Mapping[str, Any], *, allow_unknown: bool = False) -> dict[str, Any]:
        """Parse and validate ``props``; return every key (explicit or default)."""
        if not allow_unknown:
            unknown = sorted(k for k in props if k not in self.keys)
            if unknown:
                raise ConfigError(unknown[0], "unknown configuration key" + (
                    f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""))
        out: dict[str, Any] = {}
        for name, key in self.keys.items():
            if name in props:
                out[name] = key.parse(props[name])
            elif key.default is NO_DEFAULT:
                raise ConfigError(name, "missing required configuration")
            else:
                out[name] = key.default
        return out


def read_properties(path: str) -> dict[str, str]:
    """Read a Java ``.properties`` file (the subset Kafka's server.properties uses).

    ``#``/``!`` comments, ``key=value`` or ``key: value`` or ``key value``,
    backslash line continuation.
    """
    props: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        pending = ""
        for raw in f:
            line = raw.rstrip("\n").rstrip("\r")
            if not pending and line.lstrip().startswith(("#", "!")):
                continue
            if line.endswith("\\") and not line.endswith("\\\\"):
                pending += line[:-1].lstrip() if pending else line[:-1]
                continue
            line = (pending + line.lstrip()) if pending else line
            pending = ""
            line = line.strip()
            if not line:
                continue
            for i, ch in enumerate(line):
                if ch in "=:" or ch.isspace():
                    key, value = line[:i].strip(), line[i + 1:].strip()
                    if ch.isspace() and value[:1] in ("=", ":"):
                        value = value[1:].strip()
                    break
            else:
                key, value = line, ""
            props[key] = value
    return props

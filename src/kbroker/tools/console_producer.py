"""kbroker console-producer: read lines from standard input and publish them (Kafka's
``kafka-console-producer.sh`` with its LineMessageReader).

    kbroker console-producer --bootstrap-server HOST:PORT --topic T \\
        [--property parse.key=true --property key.separator=:] [--property parse.headers=true] < lines.txt

One record per input line (``\\n`` or ``\\r\\n`` ends a line). Reader properties as Kafka's:
``parse.key`` / ``key.separator`` (tab), ``parse.headers`` / ``headers.delimiter`` (tab) /
``headers.separator`` (``,``) / ``headers.key.separator`` (``:``), ``null.marker``,
``ignore.error``; a line reads ``h1:v1,h2:v2<TAB>key<TAB>value``.

Binary data (kbroker's addition): ``--property key.encoding=base64|hex`` (and
``value.encoding``, ``headers.encoding``) decode that field of each line, so any bytes,
newlines included, survive a round trip with ``kbroker console-consumer`` and the same
properties. Without them the bytes of the line are sent as they are (no re-encoding).

Exit code 1 if any record could not be sent (each failure is reported on stderr).
"""
from __future__ import annotations

import base64
import binascii
import re
import signal
import sys

from kbroker.tools._common import (
    KafkaArgumentParser, ToolError, client_config, describe_error, load_properties, parse_properties, run_tool,
)

PURPOSE = "This tool helps to read data from standard input and publish it to Kafka."
ENCODINGS = ("utf8", "base64", "hex")


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker console-producer", PURPOSE)
    a = p.add_argument
    a("--topic", metavar="topic", help="REQUIRED: The topic name to produce messages to.")
    a("--bootstrap-server", metavar="server to connect to",
      help="REQUIRED: The server(s) to connect to. The broker list string in the form HOST1:PORT1,HOST2:PORT2.")
    a("--sync", action="store_true",
      help="If set message send requests to the brokers are synchronously, one at a time as they arrive.")
    a("--compression-codec", nargs="?", const="gzip", metavar="compression-codec",
      help="The compression codec: either 'none', 'gzip', 'snappy', 'lz4', or 'zstd'. If specified without value, "
           "then it defaults to 'gzip'")
    a("--batch-size", type=int, metavar="size", help="Number of messages to send in a single batch if they are not "
                                                     "being sent synchronously. (default: 16384)")
    a("--message-send-max-retries", type=int, metavar="Integer",
      help="Brokers can fail receiving the message for multiple reasons, and being unavailable transiently is just "
           "one of them. This property specifies the number of retries before the producer give up and drop this "
           "message. (default: 3)")
    a("--retry-backoff-ms", type=int, metavar="Long", help="Before each retry, the producer refreshes the metadata of "
                                                           "relevant topics. (default: 100)")
    a("--timeout", type=int, metavar="timeout_ms",
      help="If set and the producer is running in asynchronous mode, this gives the maximum amount of time a "
           "message will queue awaiting sufficient batch size. The value is given in ms. (default: 1000)")
    a("--request-required-acks", metavar="request required acks",
      help="The required `acks` of the producer requests (default: -1)")
    a("--request-timeout-ms", type=int, metavar="request timeout ms",
      help="The ack timeout of the producer requests. Value must be non-negative and non-zero. (default: 1500)")
    a("--metadata-expiry-ms", type=int, metavar="metadata expiration interval",
      help="The period of time in milliseconds after which we force a refresh of metadata even if we haven't seen "
           "any leadership changes. (default: 300000)")
    a("--max-block-ms", type=int, metavar="max block on send",
      help="The max time that the producer will block for during a send request. (default: 60000)")
    a("--max-memory-bytes", type=int, metavar="total memory in bytes",
      help="The total memory used by the producer to buffer records waiting to be sent to the server. "
           "(default: 33554432)")
    a("--property", action="append", metavar="prop",
      help="A mechanism to pass user-defined properties in the form key=value to the message reader.\n"
           "Default properties include:\n parse.key=false\n parse.headers=false\n ignore.error=false\n"
           " key.separator=\\t\n headers.delimiter=\\t\n headers.separator=,\n headers.key.separator=:\n"
           " null.marker=   When set, any fields (key, value and headers) equal to this will be replaced by null\n"
           " key.encoding, value.encoding, headers.encoding=utf8|base64|hex (kbroker: decode binary fields)\n"
           "Default parsing pattern when:\n parse.headers=true and parse.key=true:\n  \"h1:v1,h2:v2...\\tkey\\tvalue\"\n"
           " parse.key=true:\n  \"key\\tvalue\"\n parse.headers=true:\n  \"h1:v1,h2:v2...\\tvalue\"")
    a("--reader-config", metavar="config file", help="Config properties file for the message reader. Note that "
                                                     "--property takes precedence over this config.")
    a("--producer-property", action="append", metavar="producer_prop",
      help="A mechanism to pass user-defined properties in the form key=value to the producer. ")
    a("--producer.config", dest="producer_config", metavar="config file",
      help="Producer config properties file. Note that --producer-property takes precedence over this config.")
    a("--command-config", metavar="config file", help="Producer config properties file (same as --producer.config).")
    return p


def _flag(props, key) -> bool:
    return props.get(key, "false").strip().lower() == "true"


class LineReader:
    """Kafka's LineMessageReader over bytes: fields are str (surrogateescape keeps every
    byte) until ``_bytes`` turns them into the record's bytes."""

    def __init__(self, props: dict[str, str]):
        self.parse_key = _flag(props, "parse.key")
        self.key_sep = props.get("key.separator", "\t")
        self.parse_headers = _flag(props, "parse.headers")
        self.headers_delim = props.get("headers.delimiter", "\t")
        self.headers_sep = props.get("headers.separator", ",")
        self.headers_key_sep = props.get("headers.key.separator", ":")
        self.ignore_error = _flag(props, "ignore.error")
        self.null_marker = props.get("null.marker")
        self.enc = {f: props.get(f"{f}.encoding", "utf8").lower() for f in ("key", "value", "headers")}
        for f, e in self.enc.items():
            if e not in ENCODINGS:
                raise ToolError(f"Invalid {f}.encoding '{e}': expected one of {', '.join(ENCODINGS)}")
        pairs = [("headers.delimiter", self.headers_delim, "headers.separator", self.headers_sep),
                 ("headers.delimiter", self.headers_delim, "headers.key.separator", self.headers_key_sep),
                 ("headers.separator", self.headers_sep, "headers.key.separator", self.headers_key_sep)]
        for n1, v1, n2, v2 in pairs:
            if v1 == v2:
                raise ToolError(f"{n1} and {n2} may not be equal")
        for n, v in (("key.separator", self.key_sep), ("headers.separator", self.headers_sep),
                     ("headers.delimiter", self.headers_delim), ("headers.key.separator", self.headers_key_sep)):
            if self.null_marker is not None and v == self.null_marker:
                raise ToolError(f"null.marker and {n} may not be equal")
        self.line_number = 0

    def _bytes(self, s: str | None, field: str) -> bytes | None:
        if s is None or s == self.null_marker:
            return None
        raw = s.encode("utf-8", "surrogateescape")
        enc = self.enc[field]
        try:
            if enc == "base64":
                return base64.b64decode(raw, validate=True)
            if enc == "hex":
                return bytes.fromhex(raw.decode("ascii", "replace"))
        except (binascii.Error, ValueError):
            raise ToolError(f"Invalid {enc} in the {field} on line number {self.line_number}") from None
        return raw

    def _parse(self, enabled, line, start, sep, what) -> str | None:
        if not enabled:
            return None
        i = line.find(sep, start)
        if i == -1:
            if self.ignore_error:
                return None
            raise ToolError(f"No {what} found on line number {self.line_number}: '{line}'")
        return line[start:i]

    def record(self, line: str):
        """(key, value, headers) of one line (without its line terminator)."""
        self.line_number += 1
        headers = self._parse(self.parse_headers, line, 0, self.headers_delim, "headers delimiter")
        hoff = 0 if headers is None else len(headers) + len(self.headers_delim)
        key = self._parse(self.parse_key, line, hoff, self.key_sep, "key separator")
        koff = 0 if key is None else len(key) + len(self.key_sep)
        value = line[hoff + koff:]
        hs = []
        if headers is not None and headers != self.null_marker:
            for pair in re.split(re.escape(self.headers_sep), headers):
                i = pair.find(self.headers_key_sep)
                if i == -1:
                    if self.ignore_error:
                        hs.append((pair, None))
                        continue
                    raise ToolError(f"No header key separator found in pair '{pair}' on line number "
                                    f"{self.line_number}")
                hk = pair[:i]
                if hk == self.null_marker:
                    raise ToolError(f"Header keys should not be equal to the null marker '{self.null_marker}' as "
                                    "they can't be null")
                hs.append((hk, self._bytes(pair[i + len(self.headers_key_sep):], "headers")))
        return self._bytes(key, "key"), self._bytes(value, "value"), hs


def lines(stream):
    """Lines of a binary stream without their terminator (``\\n``, ``\\r\\n``), as str with
    surrogateescape so undecodable bytes pass through unchanged."""
    for raw in stream:
        if raw.endswith(b"\n"):
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        yield raw.decode("utf-8", "surrogateescape")


def producer_props(o) -> dict:
    props = load_properties(o.producer_config) if o.producer_config else {}
    if o.command_config:
        props.update(load_properties(o.command_config))
    props.update(parse_properties(o.producer_property))
    props["compression.type"] = o.compression_codec or "none"
    defaults = [("linger.ms", o.timeout, 1000), ("acks", o.request_required_acks, "-1"),
                ("request.timeout.ms", o.request_timeout_ms, 1500), ("retries", o.message_send_max_retries, 3),
                ("retry.backoff.ms", o.retry_backoff_ms, 100), ("buffer.memory", o.max_memory_bytes, 33554432),
                ("batch.size", o.batch_size, 16384), ("metadata.max.age.ms", o.metadata_expiry_ms, 300000),
                ("max.block.ms", o.max_block_ms, 60000)]
    for key, given, default in defaults:  # Kafka's maybeMergeOptions: an explicit flag wins
        if given is not None or key not in props:
            props[key] = given if given is not None else default
    return client_config("producer", o.bootstrap_server, None, props, "console-producer")


def _main(argv, out, err=None, stdin=None) -> int:
    err = err or sys.stderr
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    if not o.topic:
        raise ToolError("Missing required argument \"[topic]\"")
    if not o.bootstrap_server:
        raise ToolError("Missing required argument \"[bootstrap-server]\"")
    reader_props = load_properties(o.reader_config) if o.reader_config else {}
    reader_props.update(parse_properties(o.property))
    reader = LineReader(reader_props)
    from kbroker.client.producer import Producer

    producer = Producer(producer_props(o))
    failures = []

    def on_delivery(e, md, key=None, value=None):
        if e is not None:
            failures.append(e)
            print(f"ERROR Error when sending message to topic {o.topic} with key: "
                  f"{'null' if key is None else f'{len(key)} bytes'}, value: "
                  f"{'null' if value is None else f'{len(value)} bytes'} with error: {describe_error(e)}", file=err)

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    stream = stdin if stdin is not None else sys.stdin.buffer
    try:
        for line in lines(stream):
            key, value, headers = reader.record(line)
            fut = producer.send(o.topic, value=value, key=key, headers=headers or None,
                                on_delivery=lambda e, md, k=key, v=value: on_delivery(e, md, k, v))
            if o.sync:
                fut.get()
    except KeyboardInterrupt:
        pass
    finally:
        producer.close()
    if failures:
        raise ToolError(f"{len(failures)} record(s) could not be sent to {o.topic}")
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())

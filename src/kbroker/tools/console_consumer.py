"""kbroker console-consumer: read records and write them to standard output (Kafka's
``kafka-console-consumer.sh`` with its DefaultMessageFormatter).

    kbroker console-consumer --bootstrap-server HOST:PORT --topic T --from-beginning [--max-messages N]
    kbroker console-consumer --bootstrap-server HOST:PORT --topic T --partition 0 --offset 42 \\
        --property print.key=true --property print.headers=true --property print.offset=true

Without ``--partition`` the consumer subscribes in a group: ``--group`` (or ``group.id`` from
``--consumer-property`` / ``--consumer.config``), else a throwaway ``console-consumer-NNNNN``
group that commits nothing. ``--include REGEX`` subscribes to the topics matching it when the
consumer starts. Output per record, as Kafka's formatter: ``[CreateTime:ts<sep>][Partition:p<sep>]
[Offset:o<sep>][h1:v1,h2:v2<sep>][key<sep>]value<line.separator>``; ``null.literal`` (``null``)
for a missing key or value, ``NO_HEADERS`` for none. Bytes are written as they are.

Binary data (kbroker's addition): ``--property key.encoding=base64|hex`` (and
``value.encoding``, ``headers.encoding``) print that field encoded, one record per line
whatever bytes it holds; ``kbroker console-producer`` with the same properties reads it back.

Stops after ``--max-messages``, after ``--timeout-ms`` without a record, or on Ctrl-C/SIGTERM,
then prints ``Processed a total of N messages`` on stderr (and, with a TTY on stderr and
``--max-messages``, a running count meanwhile).
"""
from __future__ import annotations

import base64
import random
import re
import signal
import sys
import time

from kbroker.client.metadata import TopicPartition
from kbroker.tools._common import (
    KafkaArgumentParser, ToolError, client_config, load_properties, parse_properties, run_tool,
)

PURPOSE = "This tool helps to read data from Kafka topics and outputs it to standard output."
ENCODINGS = ("utf8", "base64", "hex")


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker console-consumer", PURPOSE)
    a = p.add_argument
    a("--topic", metavar="topic", help="The topic to consume on.")
    a("--include", metavar="Java regex (String)",
      help="Regular expression specifying list of topics to include for consumption.")
    a("--partition", type=int, metavar="partition",
      help="The partition to consume from. Consumption starts from the end of the partition unless '--offset' is "
           "specified.")
    a("--offset", metavar="consume offset",
      help="The offset to consume from (a non-negative number), or 'earliest' which means from beginning, or "
           "'latest' which means from end (default: latest)")
    a("--consumer-property", action="append", metavar="consumer_prop",
      help="A mechanism to pass user-defined properties in the form key=value to the consumer.")
    a("--consumer.config", dest="consumer_config", metavar="config file",
      help="Consumer config properties file. Note that --consumer-property takes precedence over this config.")
    a("--command-config", metavar="config file", help="Consumer config properties file (same as --consumer.config).")
    a("--formatter", metavar="class", help="The name of a class to use for formatting kafka messages for display. "
                                           "Only the default formatter is available.")
    a("--property", action="append", metavar="prop",
      help="The properties to initialize the message formatter. Default properties include: \n"
           " print.timestamp=true|false\n print.key=true|false\n print.offset=true|false\n print.epoch=true|false\n"
           " print.partition=true|false\n print.headers=true|false\n print.value=true|false\n"
           " key.separator=<key.separator>\n line.separator=<line.separator>\n headers.separator=<line.separator>\n"
           " null.literal=<null.literal>\n"
           " key.encoding, value.encoding, headers.encoding=utf8|base64|hex (kbroker: print binary fields encoded)")
    a("--formatter-config", metavar="config file",
      help="Config properties file to initialize the message formatter. Note that --property takes precedence "
           "over this config.")
    a("--from-beginning", action="store_true",
      help="If the consumer does not already have an established offset to consume from, start with the earliest "
           "message present in the log rather than the latest message.")
    a("--max-messages", type=int, metavar="num_messages",
      help="The maximum number of messages to consume before exiting. If not set, consumption is continual.")
    a("--timeout-ms", type=int, metavar="timeout_ms",
      help="If specified, exit if no message is available for consumption for the specified interval.")
    a("--skip-message-on-error", action="store_true",
      help="If there is an error when processing a message, skip it instead of halt.")
    a("--bootstrap-server", metavar="server to connect to", help="REQUIRED: The server(s) to connect to.")
    a("--isolation-level", metavar="String",
      help="Set to read_committed in order to filter out transactional messages which are not committed. Set to "
           "read_uncommitted to read all messages. (default: read_uncommitted)")
    a("--group", metavar="consumer group id", help="The consumer group id of the consumer.")
    return p


def _flag(props, key, default=False) -> bool:
    return props[key].strip().lower() == "true" if key in props else default


class Formatter:
    """Kafka's DefaultMessageFormatter: writes one record as bytes."""

    def __init__(self, props: dict[str, str]):
        self.ts = _flag(props, "print.timestamp")
        self.key = _flag(props, "print.key")
        self.value = _flag(props, "print.value", True)
        self.partition = _flag(props, "print.partition")
        self.offset = _flag(props, "print.offset")
        self.epoch = _flag(props, "print.epoch")
        self.headers = _flag(props, "print.headers")
        u = lambda k, d: props.get(k, d).encode("utf-8")  # noqa: E731
        self.key_sep, self.line_sep = u("key.separator", "\t"), u("line.separator", "\n")
        self.headers_sep, self.null = u("headers.separator", ","), u("null.literal", "null")
        self.enc = {f: props.get(f"{f}.encoding", "utf8").lower() for f in ("key", "value", "headers")}
        for f, e in self.enc.items():
            if e not in ENCODINGS:
                raise ToolError(f"Invalid {f}.encoding '{e}': expected one of {', '.join(ENCODINGS)}")

    def _field(self, b, field: str) -> bytes:
        if b is None:
            return self.null
        enc = self.enc[field]
        b = bytes(b)
        if enc == "base64":
            return base64.b64encode(b)
        if enc == "hex":
            return b.hex().encode()
        return b

    def format(self, r) -> bytes:
        cols = []
        if self.ts:
            cols.append(f"{'LogAppendTime' if r.timestamp_type == 1 else 'CreateTime'}:{r.timestamp}".encode()
                        if r.timestamp is not None and r.timestamp >= 0 else b"NO_TIMESTAMP")
        if self.partition:
            cols.append(b"Partition:%d" % r.partition)
        if self.offset:
            cols.append(b"Offset:%d" % r.offset)
        if self.epoch:
            cols.append(b"Epoch:%d" % r.leader_epoch if r.leader_epoch is not None and r.leader_epoch >= 0
                        else b"Epoch:NOT_PRESENT")
        if self.headers:
            hs = list(r.headers or ())
            cols.append(self.headers_sep.join(k.encode() + b":" + self._field(v, "headers") for k, v in hs)
                        if hs else b"NO_HEADERS")
        if self.key:
            cols.append(self._field(r.key, "key"))
        if self.value:
            cols.append(self._field(r.value, "value"))
        if not cols:
            return b""
        return self.key_sep.join(cols) + self.line_sep


def parse_offset(s: str | None, from_beginning: bool) -> int:
    if s is None:
        return -2 if from_beginning else -1
    if s.lower() == "earliest":
        return -2
    if s.lower() == "latest":
        return -1
    try:
        v = int(s)
        if v >= 0:
            return v
    except ValueError:
        pass
    raise ToolError(f"The provided offset value '{s}' is incorrect. Valid values are 'earliest', 'latest', or a "
                    "non-negative long.")


def consumer_props(o) -> dict:
    from_file = load_properties(o.consumer_config) if o.consumer_config else {}
    if o.command_config:
        from_file.update(load_properties(o.command_config))
    extra = parse_properties(o.consumer_property)
    groups = {g for g in (o.group, from_file.get("group.id"), extra.get("group.id")) if g is not None}
    if len(groups) > 1:
        raise ToolError("The group ids provided in different places (directly using '--group', via "
                        "'--consumer-property', or via '--consumer.config') do not match. Detected group ids: "
                        + ", ".join(f"'{g}'" for g in sorted(groups)))
    if groups and o.partition is not None:
        raise ToolError("Options group and partition cannot be specified together.")
    props = {**from_file, **extra}
    if "auto.offset.reset" in props:
        if o.from_beginning and props["auto.offset.reset"] != "earliest":
            raise ToolError(f"Can't simultaneously specify --from-beginning and 'auto.offset.reset="
                            f"{props['auto.offset.reset']}', please remove one option")
    else:
        props["auto.offset.reset"] = "earliest" if o.from_beginning else "latest"
    if o.isolation_level is not None or "isolation.level" not in props:
        props["isolation.level"] = o.isolation_level or "read_uncommitted"
    if groups:
        props["group.id"] = groups.pop()
    else:
        props["group.id"] = f"console-consumer-{random.randrange(100000)}"
        props.setdefault("enable.auto.commit", "false")
    return client_config("consumer", o.bootstrap_server, None, props, "console-consumer")


def check_args(o) -> None:
    if (o.topic is None) == (o.include is None):
        raise ToolError("Exactly one of --include/--topic is required. ")
    if o.partition is not None:
        if o.topic is None:
            raise ToolError("The topic is required when partition is specified.")
        if o.from_beginning and o.offset is not None:
            raise ToolError("Options from-beginning and offset cannot be specified together.")
    elif o.offset is not None:
        raise ToolError("The partition is required when offset is specified.")
    if not o.bootstrap_server:
        raise ToolError("Missing required argument \"[bootstrap-server]\"")
    if o.formatter not in (None, "kafka.tools.DefaultMessageFormatter",
                           "org.apache.kafka.tools.consumer.DefaultMessageFormatter"):
        raise ToolError(f"Unknown formatter {o.formatter}: only the default formatter is available")


def _main(argv, out, err=None) -> int:
    err = err or sys.stderr
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    check_args(o)
    offset = parse_offset(o.offset, o.from_beginning)
    fprops = load_properties(o.formatter_config) if o.formatter_config else {}
    fprops.update(parse_properties(o.property))
    fmt = Formatter(fprops)
    timeout_s = o.timeout_ms / 1000.0 if o.timeout_ms is not None and o.timeout_ms >= 0 else None
    from kbroker.client.consumer import Consumer

    consumer = Consumer(consumer_props(o))
    sink = getattr(out, "buffer", None)
    write = sink.write if sink is not None else (lambda b: out.write(b.decode("utf-8", "replace")))
    count = 0
    progress = o.max_messages is not None and err.isatty()
    last_progress = time.monotonic()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if o.partition is not None:
            tp = TopicPartition(o.topic, o.partition)
            consumer.assign([tp])
            if offset == -2:
                consumer.seek_to_beginning([tp])
            elif offset == -1:
                consumer.seek_to_end([tp])
            else:
                consumer.seek(tp, offset)
        elif o.topic is not None:
            consumer.subscribe([o.topic])
        else:
            try:
                pattern = re.compile(o.include)
            except re.error as e:
                raise ToolError(f"Invalid --include regular expression '{o.include}': {e}") from None
            topics = sorted(t for t in consumer.list_topics().topics if pattern.fullmatch(t))
            if not topics:
                raise ToolError(f"No topic matches --include '{o.include}'")
            consumer.subscribe(topics)
        idle_since = time.monotonic()
        while o.max_messages is None or count < o.max_messages:
            wait = 1.0 if timeout_s is None else max(0.0, min(1.0, idle_since + timeout_s - time.monotonic()))
            left = None if o.max_messages is None else o.max_messages - count
            recs = consumer.poll(wait, max_records=left)
            if not recs:
                if timeout_s is not None and time.monotonic() - idle_since >= timeout_s:
                    break
                continue
            for r in recs:
                try:
                    write(fmt.format(r))
                except (BrokenPipeError, OSError):
                    raise
                except Exception as e:  # noqa: BLE001 - a record the formatter cannot print
                    if not o.skip_message_on_error:
                        raise ToolError(f"Error processing message: {e}") from None
                    print(f"ERROR Error processing message, skipping this message: {e}", file=err)
                count += 1
            out.flush()
            idle_since = time.monotonic()
            if progress and time.monotonic() - last_progress >= 1.0:
                last_progress = time.monotonic()
                print(f"\rProcessed {count}/{o.max_messages} messages", end="", file=err, flush=True)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        print("Unable to write to standard out, closing consumer.", file=err)
    finally:
        try:
            consumer.close()
        finally:
            if progress:
                print(file=err)
            print(f"Processed a total of {count} messages", file=err)
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())

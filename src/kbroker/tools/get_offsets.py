"""kbroker get-offsets: offsets of topic partitions at a time (Kafka's ``kafka-get-offsets.sh``,
GetOffsetShell): one ``topic:partition:offset`` line per partition, sorted by ``topic-partition``.

    kbroker get-offsets --bootstrap-server HOST:PORT --topic T [--partitions 0,1] [--time -1|-2|-3|<ms>]
    kbroker get-offsets --bootstrap-server HOST:PORT --topic-partitions 'orders:0-3,audit.*'

``--topic`` is a regular expression matched against the whole name (no ``--topic``: every
topic); ``--time`` is ``latest`` (-1, default), ``earliest`` (-2), ``max-timestamp`` (-3) or
a timestamp in ms: the first offset whose record timestamp is at or after it. A partition
without such an offset prints nothing, as in Kafka.
"""
from __future__ import annotations

import re
import sys

from kbroker.client.metadata import TopicPartition
from kbroker.tools._common import KafkaArgumentParser, ToolError, admin, describe_error, run_tool

PURPOSE = "An interactive shell for getting topic-partition offsets."
INTERNAL_TOPICS = {"__consumer_offsets", "__transaction_state", "__share_group_state"}
_RULE = re.compile(r"([^:,]*)(?::(?:([0-9]*)|(?:([0-9]*)-([0-9]*))))?")
_SPECS = {"latest": -1, "earliest": -2, "max-timestamp": -3, "earliest-local": -4, "latest-tiered": -5}


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker get-offsets", PURPOSE)
    a = p.add_argument
    a("--bootstrap-server", metavar="HOST1:PORT1,...,HOST3:PORT3",
      help="REQUIRED. The server(s) to connect to in the form HOST1:PORT1,HOST2:PORT2.")
    a("--topic-partitions", metavar="topic1:1,topic2:0-3,topic3,topic4:5-,topic5:-3",
      help="Comma separated list of topic-partition patterns to get the offsets for, with the format of "
           f"'{_RULE.pattern}'. The first group is an optional regex for the topic name, if omitted, it matches any "
           "topic name. The section after ':' describes a 'partition' pattern, which can be: a number, a range in "
           "the format of 'NUMBER-NUMBER' (lower inclusive, upper exclusive), an inclusive lower bound in the "
           "format of 'NUMBER-', an exclusive upper bound in the format of '-NUMBER' or may be omitted to accept "
           "all partitions.")
    a("--topic", metavar="topic", help="The topic to get the offsets for. It also accepts a regular expression. If "
                                       "not present, all authorized topics are queried. Cannot be used if "
                                       "--topic-partitions is present.")
    a("--partitions", metavar="partition ids",
      help="Comma separated list of partition ids to get the offsets for. If not present, all partitions of the "
           "authorized topics are queried. Cannot be used if --topic-partitions is present.")
    a("--time", default="latest",
      metavar="<timestamp> / -1 or latest / -2 or earliest / -3 or max-timestamp",
      help="timestamp of the offsets before that. [Note: No offset is returned, if the timestamp greater than "
           "recently committed record timestamp is given.]")
    a("--command-config", metavar="config file", help="Property file containing configs to be passed to Admin Client.")
    a("--exclude-internal-topics", action="store_true",
      help="By default, internal topics are included. If specified, internal topics are excluded.")
    return p


def parse_time(s: str) -> int:
    if s in _SPECS:
        return _SPECS[s]
    try:
        return int(s)
    except ValueError:
        raise ToolError(f"Malformed time argument {s}. Please use -1 or latest / -2 or earliest / -3 or "
                        "max-timestamp / -4 or earliest-local / -5 or latest-tiered, or a specified long format "
                        "timestamp") from None


def _regex(pattern: str):
    try:
        return re.compile(pattern.replace(",", "|"))
    except re.error as e:
        raise ToolError(f"Invalid topic regular expression '{pattern}': {e}") from None


def build_filter(o):
    """A predicate (topic, partition) -> bool, as Kafka's TopicPartitionFilter."""
    if o.topic_partitions is not None:
        rules = []
        for spec in o.topic_partitions.split(","):
            m = _RULE.fullmatch(spec)
            if not m:
                raise ToolError(f"Invalid rule specification: {spec}")
            topic = _regex(m.group(1) or ".*")
            if m.group(2):
                lo, hi = int(m.group(2)), int(m.group(2)) + 1
            else:
                lo = int(m.group(3)) if m.group(3) else 0
                hi = int(m.group(4)) if m.group(4) else 1 << 31
            rules.append((topic, lo, hi))
        return lambda t, p: any(r.fullmatch(t) and lo <= p < hi for r, lo, hi in rules)
    topic = _regex(o.topic if o.topic is not None else ".*")
    parts: set[int] = set()
    if o.partitions:
        try:
            parts = {int(x) for x in o.partitions.split(",")}
        except ValueError:
            raise ToolError("--partitions expects a comma separated list of numeric partition ids, but received: "
                            f"{o.partitions}") from None
    return lambda t, p: bool(topic.fullmatch(t)) and (not parts or p in parts)


def fetch_offsets(adm, o, err) -> dict:
    if o.topic_partitions is not None and (o.topic is not None or o.partitions is not None):
        raise ToolError("--topic-partitions cannot be used with --topic or --partitions")
    spec = parse_time(o.time)
    allowed = build_filter(o)
    topics = adm.describe_topics(None)
    tps = [TopicPartition(t, p.partition) for t, parts in topics.items()
           if not (o.exclude_internal_topics and t in INTERNAL_TOPICS)
           for p in parts if allowed(t, p.partition)]
    if not tps:
        raise ToolError("Could not match any topic-partitions with the specified filters")
    res = adm.list_offsets({tp: spec for tp in tps}, raise_on_error=False)
    out = {}
    for tp in tps:
        r = res.get(tp)
        if isinstance(r, Exception) or r is None:
            print(f"Skip getting offsets for topic-partition {tp.topic}-{tp.partition} due to error: "
                  f"{describe_error(r) if r is not None else 'no response'}", file=err)
        elif r.offset != -1:
            out[tp] = r.offset
    return out


def _main(argv, out, err=None) -> int:
    err = err or sys.stderr
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    if not o.bootstrap_server:
        raise ToolError("Missing required argument \"[bootstrap-server]\"")
    adm = admin(o.bootstrap_server, o.command_config)
    try:
        offsets = fetch_offsets(adm, o, err)
    finally:
        adm.close()
    for tp, off in sorted(offsets.items(), key=lambda kv: f"{kv[0].topic}-{kv[0].partition}"):
        print(f"{tp.topic}:{tp.partition}:{off}", file=out)
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())

"""kbroker leader-election: elect partition leaders (Kafka's ``kafka-leader-election.sh``,
LeaderElectionCommand), through the Admin API's ElectLeaders, which a broker forwards to
the active controller.

    kbroker leader-election --bootstrap-server HOST:PORT --election-type preferred --all-topic-partitions
    kbroker leader-election --bootstrap-server HOST:PORT --election-type preferred --topic T --partition 0
    kbroker leader-election --bootstrap-server HOST:PORT --election-type unclean --path-to-json-file F

``preferred`` moves leadership back to each partition's first replica when it is in the
ISR; ``unclean`` elects a leader for partitions that have none, from outside the ISR if it
must (data written only to the lost leader is gone: that is what "unclean" means). The
output lines are Kafka's; exit code 1 if any partition failed.
"""
from __future__ import annotations

import json
import sys

from kbroker.client.admin import PREFERRED, UNCLEAN
from kbroker.client.errors import ElectionNotNeededError
from kbroker.client.metadata import TopicPartition
from kbroker.tools._common import KafkaArgumentParser, ToolError, admin, describe_error, run_tool

PURPOSE = "This tool attempts to elect a new leader for a set of topic partitions."
TYPES = {"preferred": PREFERRED, "unclean": UNCLEAN}


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker leader-election", PURPOSE)
    a = p.add_argument
    a("--bootstrap-server", metavar="host:port",
      help="A hostname and port for the broker to connect to, in the form host:port. Multiple comma separated "
           "URLs can be given. REQUIRED.")
    a("--admin.config", dest="admin_config", metavar="config file",
      help="Configuration properties files to pass to the admin client")
    a("--path-to-json-file", metavar="Path to JSON file",
      help='The JSON file with the list of partition for which leader elections should be performed, e.g. '
           '{"partitions": [{"topic": "foo", "partition": 1}]}. Not allowed if --all-topic-partitions or --topic '
           'flags are specified.')
    a("--topic", metavar="topic name",
      help="Name of topic for which to perform an election. Not allowed if --path-to-json-file or "
           "--all-topic-partitions is specified.")
    a("--partition", type=int, metavar="partition id",
      help="Partition id for which to perform an election. REQUIRED if --topic is specified.")
    a("--all-topic-partitions", action="store_true",
      help="Perform election on all of the eligible topic partitions based on the type of election (see the "
           "--election-type flag). Not allowed if --topic or --path-to-json-file is specified.")
    a("--election-type", metavar="election type",
      help='Type of election to attempt. Possible values are "preferred" for preferred leader election or '
           '"unclean" for unclean leader election. REQUIRED.')
    return p


def _partitions(o) -> list | None:
    """The partitions asked for; None for --all-topic-partitions."""
    given = [x for x in (o.path_to_json_file, o.topic, o.all_topic_partitions or None) if x is not None]
    if len(given) != 1:
        raise ToolError("One and only one of the following options is required: "
                        "--all-topic-partitions, --topic, --path-to-json-file")
    if o.all_topic_partitions:
        return None
    if o.topic is not None:
        if o.partition is None:
            raise ToolError("Missing required option(s) [partition]")
        return [TopicPartition(o.topic, o.partition)]
    if o.partition is not None:
        raise ToolError("Option partition is only allowed if topic is used")
    try:
        with open(o.path_to_json_file, encoding="utf-8") as f:
            doc = json.load(f)
        parts = [TopicPartition(str(p["topic"]), int(p["partition"])) for p in doc["partitions"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ToolError(f"Replica election data is invalid in {o.path_to_json_file}: {e}") from None
    if len(set(parts)) != len(parts):
        dup = sorted({f"{t}-{p}" for t, p in parts if parts.count(TopicPartition(t, p)) > 1})
        raise ToolError(f"Replica election data contains duplicate partitions: {', '.join(dup)}")
    return parts


def _main(argv, out) -> int:
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    if not o.bootstrap_server:
        raise ToolError("Missing required option(s) [bootstrap-server]")
    if o.election_type is None:
        raise ToolError("Missing required option(s) [election-type]")
    etype = o.election_type.lower()
    if etype not in TYPES:
        raise ToolError(f"Unknown election type: {o.election_type} (preferred or unclean)")
    partitions = _partitions(o)
    name = etype.upper()
    with admin(o.bootstrap_server, o.admin_config) as a:
        results = a.elect_leaders(TYPES[etype], partitions, raise_on_error=False)
    ok = sorted(tp for tp, e in results.items() if e is None)
    noop = sorted(tp for tp, e in results.items() if isinstance(e, ElectionNotNeededError))
    failed = sorted((tp, e) for tp, e in results.items() if e is not None and not isinstance(e, ElectionNotNeededError))
    if ok:
        print(f"Successfully completed leader election ({name}) for partitions "
              + ", ".join(f"{t}-{p}" for t, p in ok), file=out)
    if noop:
        print("Valid replica already elected for partitions " + ", ".join(f"{t}-{p}" for t, p in noop), file=out)
    for (t, p), e in failed:
        print(f"Error completing leader election ({name}) for partition: {t}-{p}: {describe_error(e)}", file=out)
    if failed:
        raise ToolError(f"{len(failed)} replica(s) could not be elected")
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())

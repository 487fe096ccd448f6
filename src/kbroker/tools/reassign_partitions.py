"""kbroker reassign-partitions: move partition replicas between brokers (Kafka's
``kafka-reassign-partitions.sh``, ReassignPartitionsCommand), through the Admin API's
AlterPartitionReassignments / ListPartitionReassignments, which a broker forwards to the
active controller.

    kbroker reassign-partitions --bootstrap-server H:P --generate \\
        --topics-to-move-json-file topics.json --broker-list 1,2,3
    kbroker reassign-partitions --bootstrap-server H:P --execute --reassignment-json-file plan.json
    kbroker reassign-partitions --bootstrap-server H:P --verify --reassignment-json-file plan.json
    kbroker reassign-partitions --bootstrap-server H:P --list
    kbroker reassign-partitions --bootstrap-server H:P --cancel --reassignment-json-file plan.json

Files are Kafka's JSON: ``{"version": 1, "topics": [{"topic": "t"}]}`` for --generate and
``{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2],
"log_dirs": ["any", "any"]}]}`` for a plan. The controller adds the new replicas, waits
until they are in the ISR, then removes the old ones (Kafka's KIP-455 flow). --generate
proposes a rack-unaware assignment as Kafka's AdminUtils does (random start, shifted
followers); replication throttles and log-dir moves (--throttle, --replica-alter-log-dirs-
throttle, non-"any" log_dirs) are not offered: kbroker has no replication quotas yet.
"""
from __future__ import annotations

import json
import random
import sys

from kbroker.client.metadata import TopicPartition
from kbroker.tools._common import KafkaArgumentParser, ToolError, admin, describe_error, run_tool

PURPOSE = "This tool helps to move topic partitions between replicas."
ACTIONS = ("generate", "execute", "verify", "list", "cancel")


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker reassign-partitions", PURPOSE)
    a = p.add_argument
    a("--bootstrap-server", metavar="Server(s) to use for bootstrapping",
      help="the server(s) to use for bootstrapping. REQUIRED.")
    a("--command-config", metavar="Admin client property file",
      help="Property file containing configs to be passed to Admin Client.")
    for act, what in (("generate", "Generate a candidate partition reassignment configuration."),
                      ("execute", "Kick off the reassignment as specified by the --reassignment-json-file option."),
                      ("verify", "Verify if the reassignment completed as specified by the "
                                 "--reassignment-json-file option."),
                      ("list", "List all active partition reassignments."),
                      ("cancel", "Cancel an active reassignment.")):
        a(f"--{act}", action="store_true", help=what)
    a("--reassignment-json-file", metavar="manual assignment json file path",
      help="The JSON file with the partition reassignment configuration.")
    a("--topics-to-move-json-file", metavar="topics to reassign json file path",
      help='Generate a reassignment configuration to move the partitions of the specified topics to the list of '
           'brokers specified by the --broker-list option. The format to use is - {"topics": [{"topic": "foo"}, '
           '{"topic": "foo1"}], "version": 1}')
    a("--broker-list", metavar="brokerlist",
      help='The list of brokers to which the partitions need to be reassigned in the form "0,1,2". This is '
           'required if --topics-to-move-json-file is used to generate reassignment configuration')
    a("--disable-rack-aware", action="store_true", help="Disable rack aware replica assignment")
    a("--additional", action="store_true",
      help="Execute this reassignment in addition to any other ongoing ones.")
    a("--timeout", type=int, default=10000, metavar="timeout",
      help="The maximum time in ms to wait for the request to complete.")
    return p


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise ToolError(f"cannot read {path}: {e}") from None
    except ValueError:
        raise ToolError("The input string is not a valid JSON") from None
    if not isinstance(doc, dict):
        raise ToolError(f"{what} must be a JSON object")
    version = doc.get("version", 1)
    if version != 1:
        raise ToolError(f"Not supported version field value {version}")
    return doc


def parse_plan(path: str) -> dict:
    """{TopicPartition: [replica ids]} from a reassignment JSON file, with Kafka's checks."""
    doc = _read_json(path, "a reassignment")
    parts = doc.get("partitions")
    if not parts:
        raise ToolError("Partition reassignment list cannot be empty")
    plan: dict = {}
    try:
        for p in parts:
            tp = TopicPartition(str(p["topic"]), int(p["partition"]))
            replicas = [int(r) for r in p["replicas"]]
            dirs = p.get("log_dirs")
            if dirs is not None and len(dirs) != len(replicas):
                raise ToolError(f"Size of replicas list {replicas} is different from size of log dirs list "
                                f"{dirs} for partition {tp.topic}-{tp.partition}")
            if dirs is not None and any(d != "any" for d in dirs):
                raise ToolError("moving replicas between log directories is not supported (log_dirs must be \"any\")")
            if not replicas:
                raise ToolError("Partition replica list cannot be empty")
            if len(set(replicas)) != len(replicas):
                raise ToolError(f"Partition replica lists may not contain duplicate entries: "
                                f"{tp.topic}-{tp.partition} contains {replicas}")
            if tp in plan:
                raise ToolError(f"Partition reassignment contains duplicate topic partitions: {tp.topic}-{tp.partition}")
            plan[tp] = replicas
    except (KeyError, TypeError, ValueError) as e:
        raise ToolError(f"malformed reassignment entry: {e}") from None
    return plan


def format_plan(plan: dict) -> str:
    """Kafka's formatAsReassignmentJson (compact, partitions sorted)."""
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(plan[(t, p)]), "log_dirs": ["any"] * len(plan[(t, p)])}
        for t, p in sorted(plan)]}, separators=(",", ":"))


def assign_replicas(n_partitions: int, rf: int, brokers: list[int], rnd: random.Random) -> list[list[int]]:
    """Kafka's AdminUtils.assignReplicasToBrokersRackUnaware: the first replica round-robin
    from a random broker, followers shifted so partitions spread over pairs of brokers."""
    if rf > len(brokers):
        raise ToolError(f"Replication factor: {rf} larger than available brokers: {len(brokers)}.")
    n = len(brokers)
    start = rnd.randrange(n)
    shift = rnd.randrange(n)
    out = []
    for pid in range(n_partitions):
        if pid > 0 and pid % n == 0:
            shift += 1
        first = (pid + start) % n
        replicas = [brokers[first]]
        for j in range(rf - 1):
            replicas.append(brokers[(first + 1 + (shift + j) % (n - 1)) % n])
        out.append(replicas)
    return out


def _current(a, topics) -> dict:
    described = a.describe_topics(sorted(topics))
    return {TopicPartition(t, p.partition): list(p.replicas) for t, parts in described.items() for p in parts}


def _tp(tp) -> str:
    return f"{tp[0]}-{tp[1]}"


def _generate(a, o, out) -> None:
    if not o.topics_to_move_json_file or not o.broker_list:
        raise ToolError("--generate needs --topics-to-move-json-file and --broker-list")
    doc = _read_json(o.topics_to_move_json_file, "the topics to move")
    try:
        topics = [str(t["topic"]) for t in doc["topics"]]
    except (KeyError, TypeError) as e:
        raise ToolError(f"malformed topics-to-move file: {e}") from None
    if len(set(topics)) != len(topics):
        raise ToolError(f"List of topics to reassign contains duplicate entries: {', '.join(sorted(topics))}")
    try:
        brokers = [int(b) for b in o.broker_list.split(",") if b.strip()]
    except ValueError:
        raise ToolError(f"invalid --broker-list {o.broker_list!r}") from None
    if len(set(brokers)) != len(brokers):
        raise ToolError(f"Broker list contains duplicate entries: {o.broker_list}")
    known = {b.node_id for b in a.describe_cluster().brokers}
    unknown = [b for b in brokers if b not in known]
    if unknown:
        raise ToolError(f"Unknown broker id {unknown[0]}")
    current = _current(a, topics)
    rnd = random.Random()
    proposed = {}
    for t in topics:
        parts = sorted(p for (tt, p) in current if tt == t)
        rf = len(current[(t, parts[0])]) if parts else 0
        for p, replicas in zip(parts, assign_replicas(len(parts), rf, sorted(brokers), rnd)):
            proposed[TopicPartition(t, p)] = replicas
    print(f"Current partition replica assignment\n{format_plan(current)}\n", file=out)
    print(f"Proposed partition reassignment configuration\n{format_plan(proposed)}", file=out)


def _execute(a, o, out) -> None:
    plan = parse_plan(o.reassignment_json_file)
    if not o.additional and a.list_partition_reassignments():
        raise ToolError("Cannot execute because there is an existing partition assignment.  Use --additional to "
                        "override this and create a new partition assignment in addition to the existing one. The "
                        "--additional flag can also be used to change the throttle by resubmitting the current "
                        "reassignment.")
    known = {b.node_id for b in a.describe_cluster().brokers}
    for replicas in plan.values():
        for r in replicas:
            if r not in known:
                raise ToolError(f"Unknown broker id {r}")
    current = _current(a, {t for t, _ in plan})
    missing = [tp for tp in plan if tp not in current]
    if missing:
        raise ToolError(f"Unable to find partition: {_tp(missing[0])}")
    print("Current partition replica assignment\n\n"
          f"{format_plan({tp: current[tp] for tp in plan})}\n\n"
          "Save this to use as the --reassignment-json-file option during rollback", file=out)
    errors = {tp: e for tp, e in a.alter_partition_reassignments(plan, raise_on_error=False).items() if e is not None}
    if errors:
        raise ToolError("Error reassigning partition(s):\n" + "\n".join(
            f"{_tp(tp)}: {describe_error(e)}" for tp, e in sorted(errors.items())))
    print(f"Successfully started partition reassignment{'' if len(plan) == 1 else 's'} for "
          + ",".join(_tp(tp) for tp in sorted(plan)), file=out)


def _verify(a, o, out) -> bool:
    """Prints Kafka's status lines; True when every reassignment is done."""
    plan = parse_plan(o.reassignment_json_file)
    ongoing = a.list_partition_reassignments(list(plan))
    current = _current(a, {t for t, _ in plan})
    lines = ["Status of partition reassignment:"]
    for tp in sorted(plan):
        if tp in ongoing:
            lines.append(f"Reassignment of partition {_tp(tp)} is still in progress.")
        elif current.get(tp) == plan[tp]:
            lines.append(f"Reassignment of partition {_tp(tp)} is completed.")
        else:
            lines.append(f"There is no active reassignment of partition {_tp(tp)}, but replica set is "
                         f"{','.join(map(str, current.get(tp, [])))} rather than {','.join(map(str, plan[tp]))}.")
    print("\n".join(lines), file=out)
    return not any(tp in ongoing for tp in plan)


def _list(a, out) -> None:
    ongoing = a.list_partition_reassignments()
    if not ongoing:
        print("No partition reassignments found.", file=out)
        return
    lines = []
    for tp in sorted(ongoing):
        r = ongoing[tp]
        line = f"{_tp(tp)}: replicas: {','.join(map(str, r.replicas))}."
        if r.adding_replicas:
            line += f" adding: {','.join(map(str, r.adding_replicas))}."
        if r.removing_replicas:
            line += f" removing: {','.join(map(str, r.removing_replicas))}."
        lines.append(line)
    print("Current partition reassignments:\n" + "\n".join(lines), file=out)


def _cancel(a, o, out) -> None:
    plan = parse_plan(o.reassignment_json_file)
    ongoing = a.list_partition_reassignments(list(plan))
    active = sorted(tp for tp in plan if tp in ongoing)
    if not active:
        print("None of the specified partition reassignments are active.", file=out)
        return
    errors = {tp: e for tp, e in a.alter_partition_reassignments({tp: None for tp in active},
                                                                 raise_on_error=False).items() if e is not None}
    if errors:
        raise ToolError(f"Error cancelling partition reassignment{'' if len(errors) == 1 else 's'} for:\n" + "\n".join(
            f"{_tp(tp)}: {describe_error(e)}" for tp, e in sorted(errors.items())))
    print(f"Successfully cancelled partition reassignment{'' if len(active) == 1 else 's'} for: "
          + ",".join(_tp(tp) for tp in active), file=out)


def _main(argv, out) -> int:
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    chosen = [act for act in ACTIONS if getattr(o, act)]
    if len(chosen) != 1:
        raise ToolError("Command must include exactly one action: --generate, --execute, --verify, --list, --cancel")
    if not o.bootstrap_server:
        raise ToolError("Please specify --bootstrap-server")
    act = chosen[0]
    if act in ("execute", "verify", "cancel") and not o.reassignment_json_file:
        raise ToolError(f"Missing required argument \"[reassignment-json-file]\" for --{act}")
    with admin(o.bootstrap_server, o.command_config, o.timeout) as a:
        if act == "generate":
            _generate(a, o, out)
        elif act == "execute":
            _execute(a, o, out)
        elif act == "verify":
            return 0 if _verify(a, o, out) else 1
        elif act == "list":
            _list(a, out)
        else:
            _cancel(a, o, out)
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())

"""kbroker consumer-groups: list, describe, delete consumer groups and reset or delete their
offsets (Kafka's ``kafka-consumer-groups.sh``: same flags, same columns).

    kbroker consumer-groups --bootstrap-server HOST:PORT --list [--state [s,...]] [--type [t,...]]
    kbroker consumer-groups --bootstrap-server HOST:PORT --describe --group G [--members [--verbose] | --state | --offsets]
    kbroker consumer-groups --bootstrap-server HOST:PORT --reset-offsets --group G --topic T[:0,1] | --all-topics
        --to-earliest | --to-latest | --to-current | --to-offset N | --shift-by N | --to-datetime T
        | --by-duration PnDTnHnMnS | --from-file CSV   [--dry-run (default) | --execute] [--export]
    kbroker consumer-groups --bootstrap-server HOST:PORT --delete --group G [--group G2] | --all-groups
    kbroker consumer-groups --bootstrap-server HOST:PORT --delete-offsets --group G --topic T[:0,1]

Works on classic and KIP-848 (``group.protocol=consumer``) groups alike: DescribeGroups
answers for both. Lag per partition = log end offset (ListOffsets latest) - committed offset;
``-`` where either is unknown. A reset commits as an admin (OffsetCommit, generation -1),
which Kafka allows only while the group is Empty or Dead; otherwise the tool refuses.

Differences from Kafka: errors go to stderr (Kafka prints ``Error:`` lines on stdout) and
every failure exits 1, so scripts can test the exit code.
"""
from __future__ import annotations

import datetime as _dt
import re
import sys
import time

from kbroker.client import errors as E
from kbroker.client.admin import EARLIEST, LATEST
from kbroker.client.metadata import TopicPartition
from kbroker.tools._common import KafkaArgumentParser, ToolError, admin, describe_error, run_tool

MISSING = "-"
PURPOSE = ("This tool helps to list all consumer groups, describe a consumer group, delete consumer "
           "group info, or reset consumer group offsets.")
STATES = ["PreparingRebalance", "CompletingRebalance", "Stable", "Dead", "Empty", "Assigning", "Reconciling"]
TYPES = ["consumer", "classic"]
_SCENARIOS = ["to_offset", "shift_by", "to_datetime", "by_duration", "to_earliest", "to_latest",
              "to_current", "from_file"]
_COMMIT_CHUNK = 500


def build_parser() -> KafkaArgumentParser:
    p = KafkaArgumentParser("kbroker consumer-groups", PURPOSE)
    a = p.add_argument
    a("--bootstrap-server", metavar="server to connect to", help="REQUIRED: The server(s) to connect to.")
    a("--command-config", metavar="command config property file",
      help="Property file containing configs to be passed to Admin Client and Consumer.")
    a("--group", action="append", metavar="consumer group", help="The consumer group we wish to act on.")
    a("--topic", action="append", metavar="topic",
      help="The topic whose consumer group information should be deleted or topic whose should be included "
           "in the reset offset process. In `reset-offsets` case, partitions can be specified using this "
           "format: `topic1:0,1,2`, where 0,1,2 are the partition to be included in the process. "
           "Reset-offsets also supports multiple topic inputs.")
    a("--all-topics", action="store_true", help="Consider all topics assigned to a group in the `reset-offsets` process.")
    a("--list", action="store_true", help="List all consumer groups.")
    a("--describe", action="store_true", help="Describe consumer group and list offset lag (number of messages "
                                              "not yet processed) related to given group.")
    a("--all-groups", action="store_true", help="Apply to all consumer groups.")
    a("--delete", action="store_true", help="Pass in groups to delete topic partition offsets and ownership "
                                            "information over the entire consumer group. For instance --group g1 --group g2")
    a("--timeout", type=int, default=5000, metavar="timeout (ms)",
      help="The timeout that can be set for some use cases. For example, it can be used when describing the "
           "group to specify the maximum amount of time in milliseconds to wait before the group stabilizes.")
    a("--reset-offsets", action="store_true",
      help="Reset offsets of consumer group. Supports one consumer group at the time, and instances should be "
           "inactive\nHas 2 execution options: --dry-run (the default) to plan which offsets to reset, and "
           "--execute to update the offsets. Additionally, the --export option is used to export the results to "
           "a CSV format.\nYou must choose one of the following reset specifications: --to-datetime, "
           "--by-duration, --to-earliest, --to-latest, --shift-by, --from-file, --to-current, --to-offset.\n"
           "To define the scope use --all-topics or --topic. One scope must be specified unless you use "
           "'--from-file'.")
    a("--delete-offsets", action="store_true", help="Delete offsets of consumer group. Supports one consumer "
                                                    "group at the time, and multiple topics.")
    a("--dry-run", action="store_true", help="Only show results without executing changes on Consumer Groups. "
                                             "Supported operations: reset-offsets.")
    a("--execute", action="store_true", help="Execute operation. Supported operations: reset-offsets.")
    a("--export", action="store_true", help="Export operation execution to a CSV file. Supported operations: "
                                            "reset-offsets.")
    a("--to-offset", type=int, metavar="offset", help="Reset offsets to a specific offset.")
    a("--from-file", metavar="path to CSV file", help="Reset offsets to values defined in CSV file.")
    a("--to-datetime", metavar="datetime", help="Reset offsets to offset from datetime. Format: 'YYYY-MM-DDTHH:mm:SS.sss'")
    a("--by-duration", metavar="duration", help="Reset offsets to offset by duration from current timestamp. "
                                                "Format: 'PnDTnHnMnS'")
    a("--to-earliest", action="store_true", help="Reset offsets to earliest offset.")
    a("--to-latest", action="store_true", help="Reset offsets to latest offset.")
    a("--to-current", action="store_true", help="Reset offsets to current offset.")
    a("--shift-by", type=int, metavar="number-of-offsets",
      help="Reset offsets shifting current offset by 'n', where 'n' can be positive or negative.")
    a("--members", action="store_true", help="Describe members of the group. This option may be used with "
                                             "'--describe' and '--bootstrap-server' options only.")
    a("--verbose", action="store_true", help="Provide additional information, if any, when describing the group. "
                                             "This option may be used with '--offsets'/'--members'/'--state' and "
                                             "'--bootstrap-server' options only.")
    a("--offsets", action="store_true", help="Describe the group and list all topic partitions in the group along "
                                             "with their offset lag. This is the default sub-action of and may be "
                                             "used with '--describe' and '--bootstrap-server' options only.")
    a("--state", nargs="?", const="", default=None,
      help="When specified with '--describe', includes the state of the group.\nWhen specified with '--list', it "
           "displays the state of all groups. It can also be used to list groups with specific states.")
    a("--type", nargs="?", const="", default=None,
      help="When specified with '--list', it displays the types of all the groups. It can also be used to list "
           "groups with specific types.")
    return p


def check_args(o) -> None:
    """Kafka's ConsumerGroupCommandOptions.checkArgs (usage errors)."""
    if not o.bootstrap_server:
        raise ToolError("Missing required argument \"[bootstrap-server]\"")
    actions = [o.list, o.describe, o.delete, o.reset_offsets, o.delete_offsets]
    if sum(bool(x) for x in actions) != 1:
        raise ToolError("Command must include exactly one action: --list, --describe, --delete, --reset-offsets, "
                        "--delete-offsets")
    scope = "--all-groups, --group"
    if o.describe:
        if not o.group and not o.all_groups:
            raise ToolError(f"Option --describe takes one of these options: {scope}")
        if sum(bool(x) for x in (o.members, o.offsets, o.state is not None)) > 1:
            raise ToolError("Option --describe takes at most one of these options: --members, --offsets, --state")
        if o.state:
            raise ToolError("Option --describe does not take a value for --state")
    elif o.members or o.offsets or o.verbose:
        raise ToolError("Option --members, --offsets and --verbose can only be used with --describe")
    if o.state is not None and not (o.describe or o.list):
        raise ToolError("Option --state can only be used with --describe or --list")
    if o.type is not None and not o.list:
        raise ToolError("Option --type can only be used with --list")
    if o.delete:
        if not o.group and not o.all_groups:
            raise ToolError(f"Option --delete takes one of these options: {scope}")
        if o.topic:
            raise ToolError("The consumer does not support topic-specific offset deletion from a consumer group.")
    if o.delete_offsets and (not o.group or not o.topic):
        raise ToolError("Option --delete-offsets takes the following options: --group, --topic")
    scenarios = [s for s in _SCENARIOS if getattr(o, s) not in (None, False)]
    if o.reset_offsets:
        if o.dry_run and o.execute:
            raise ToolError("Option --reset-offsets only accepts one of --execute and --dry-run")
        if not o.dry_run and not o.execute:
            print("WARN: No action will be performed as the --execute option is missing. You should add the "
                  "--dry-run option explicitly if you are scripting this command.", file=sys.stderr)
        if not o.group and not o.all_groups:
            raise ToolError(f"Option --reset-offsets takes one of these options: {scope}")
        if len(scenarios) > 1:
            names = ", ".join("--" + s.replace("_", "-") for s in scenarios)
            raise ToolError(f"Option --reset-offsets takes only one of these options: {names}")
        if not scenarios:
            raise ToolError("Option '--reset-offsets' requires one of the following scenarios: "
                            + ", ".join("--" + s.replace("_", "-") for s in _SCENARIOS))
        if not (o.all_topics or o.topic or o.from_file):
            raise ToolError("One of the reset scopes should be defined: --all-topics, --topic.")
        if o.all_topics and o.topic:
            raise ToolError("Option --all-topics cannot be used with --topic")
    elif scenarios or o.dry_run or o.execute or o.export or o.all_topics:
        raise ToolError("Options --to-*, --shift-by, --by-duration, --from-file, --dry-run, --execute, --export "
                        "and --all-topics can only be used with --reset-offsets")
    if o.group and o.all_groups:
        raise ToolError("Option --group cannot be used with --all-groups")
    if o.group and o.list:
        raise ToolError("Option --group cannot be used with --list")
    if o.topic and not (o.delete or o.reset_offsets or o.delete_offsets):
        raise ToolError("Option --topic can only be used with --reset-offsets or --delete-offsets")


# -- the service -------------------------------------------------------------------------------

def _parse_list(value: str, valid: list[str], what: str) -> set[str]:
    by_lower = {v.lower(): v for v in valid}
    out = set()
    for s in value.split(","):
        s = s.strip()
        if s.lower() not in by_lower:
            raise ToolError(f"Invalid {what} list '{value}'. Valid {what}s are: {', '.join(valid)}")
        out.add(by_lower[s.lower()])
    return out


def _group_type(g) -> str:
    return g.type or ("classic" if g.protocol_type in ("consumer", "") else "unknown")


def consumer_groups(adm) -> list:
    """Groups of the consumer protocol type, or empty (simple groups), as Kafka lists them."""
    return sorted((g for g in adm.list_consumer_groups() if g.protocol_type in ("consumer", "")),
                  key=lambda g: g.group_id)


def list_groups(adm, o, out) -> int:
    groups = consumer_groups(adm)
    if o.state is None and o.type is None:
        for g in groups:
            print(g.group_id, file=out)
        return 0
    states = _parse_list(o.state, STATES, "state") if o.state else set()
    types = _parse_list(o.type.lower(), TYPES, "type") if o.type else set()
    groups = [g for g in groups if (not states or g.state.lower() in {s.lower() for s in states})
              and (not types or _group_type(g) in types)]
    width = max([15] + [len(g.group_id) for g in groups]) + 10
    cols = [("GROUP", lambda g: g.group_id, width)]
    if o.type is not None:
        cols.append(("TYPE", lambda g: _group_type(g).capitalize(), 20))
    if o.state is not None:
        cols.append(("STATE", lambda g: g.state or "Unknown", 20))
    print(" ".join(f"{h:<{w}}" for h, _, w in cols), file=out)
    for g in groups:
        print(" ".join(f"{f(g):<{w}}" for _, f, w in cols), file=out)
    return 0


def _group_ids(adm, o) -> list[str]:
    return [g.group_id for g in consumer_groups(adm)] if o.all_groups else list(dict.fromkeys(o.group))


def _member_state_ok(group: str, state: str, rows: int | None, err) -> bool:
    """Kafka's shouldPrintMemberState: False (and an error) for a missing group."""
    if rows is None or state == "Dead":
        print(f"Error: Consumer group '{group}' does not exist.", file=err)
        return False
    if state == "Empty":
        print(f"\nConsumer group '{group}' has no active members.", file=err)
    elif state in ("PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"):
        print(f"\nWarning: Consumer group '{group}' is rebalancing.", file=err)
    return rows > 0


def log_offsets(adm, tps, spec) -> dict:
    """{tp: offset or None} (ListOffsets ``spec``: EARLIEST / LATEST / a timestamp)."""
    if not tps:
        return {}
    res = adm.list_offsets({tp: spec for tp in tps}, raise_on_error=False)
    return {tp: (None if isinstance(r, Exception) or r is None else r.offset)
            for tp, r in ((tp, res.get(tp)) for tp in tps)}


def collect_offsets(adm, group: str):
    """(state, rows): one row per assigned or committed partition:
    (group, topic, partition, committed, log_end, lag, consumer_id, host, client_id)."""
    desc = adm.describe_consumer_groups([group])[group]
    committed = adm.list_consumer_group_offsets(group) if desc.state != "Dead" else {}
    rows = []
    assigned: set = set()
    members = sorted((m for m in desc.members if m.assignment), key=lambda m: -len(m.assignment))
    plan = []
    for m in members:
        tps = sorted(set(TopicPartition(*tp) for tp in m.assignment))
        assigned.update(tps)
        plan.append((tps, m.member_id, m.host, m.client_id))
    rest = sorted(tp for tp in committed if tp not in assigned)
    if rest:
        plan.append((rest, MISSING, MISSING, MISSING))
    ends = log_offsets(adm, [tp for tps, *_ in plan for tp in tps], LATEST)
    for tps, member, host, client in plan:
        for tp in tps:
            c = committed.get(tp)
            off = c.offset if c is not None else None
            end = ends.get(tp)
            lag = end - off if off is not None and off != -1 and end is not None else None
            rows.append((group, tp.topic, tp.partition, off, end, lag, member, host, client))
    return desc, rows


def _s(v) -> str:
    return MISSING if v is None else str(v)


def print_offsets(group, state, rows, out, err) -> bool:
    if not _member_state_ok(group, state, None if state == "Dead" else len(rows), err):
        return state != "Dead"
    w = [max([15] + [len(_s(r[i])) for r in rows]) for i in (0, 1, 6, 7)]
    fmt = f"{{:<{w[0]}}} {{:<{w[1]}}} {{:<10}} {{:<15}} {{:<15}} {{:<15}} {{:<{w[2]}}} {{:<{w[3]}}} {{}}"
    print(file=out)
    print(fmt.format("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                     "HOST", "CLIENT-ID"), file=out)
    for r in rows:
        print(fmt.format(*(_s(x) for x in r)), file=out)
    return True


def print_members(group, desc, verbose, out, err) -> bool:
    if not _member_state_ok(group, desc.state, None if desc.state == "Dead" else len(desc.members), err):
        return desc.state != "Dead"
    ms = desc.members
    with_iid = any(m.group_instance_id for m in ms)
    w = {k: max([d] + [len(f(m)) for m in ms]) for k, d, f in (
        ("g", 15, lambda m: group), ("c", 15, lambda m: m.member_id), ("i", 17, lambda m: m.group_instance_id or ""),
        ("h", 15, lambda m: m.host), ("cl", 15, lambda m: m.client_id))}
    cols = [("GROUP", "g"), ("CONSUMER-ID", "c")] + ([("GROUP-INSTANCE-ID", "i")] if with_iid else []) + \
        [("HOST", "h"), ("CLIENT-ID", "cl")]
    head = " ".join(f"{name:<{w[k]}}" for name, k in cols) + f" {'#PARTITIONS':<15} "
    print(file=out)
    print(head + ("ASSIGNMENT" if verbose else ""), file=out)
    for m in ms:
        vals = {"g": group, "c": m.member_id, "i": m.group_instance_id or "", "h": m.host, "cl": m.client_id}
        line = " ".join(f"{vals[k]:<{w[k]}}" for _, k in cols) + f" {len(m.assignment):<15} "
        if verbose:
            by_topic: dict = {}
            for tp in m.assignment:
                by_topic.setdefault(tp[0], []).append(tp[1])
            line += ", ".join(f"{t}({','.join(map(str, sorted(ps)))})" for t, ps in sorted(by_topic.items())) \
                or MISSING
        print(line, file=out)
    return True


def print_state(group, desc, out, err) -> bool:
    if not _member_state_ok(group, desc.state, None if desc.state == "Dead" else 1, err):
        return desc.state != "Dead"
    c = desc.coordinator
    coord = f"{c.host}:{c.port}  ({c.node_id})" if c is not None else MISSING
    w = max(25, len(coord), len(group))
    fmt = f"{{:<{w}}} {{:<25}} {{:<20}} {{:<15}} {{}}"
    print(file=out)
    print(fmt.format("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"), file=out)
    print(fmt.format(group, coord, desc.protocol or "", desc.state, len(desc.members)), file=out)
    return True


def describe(adm, o, out, err) -> int:
    ok = True
    for g in sorted(_group_ids(adm, o)):
        if o.members:
            ok &= print_members(g, adm.describe_consumer_groups([g])[g], o.verbose, out, err)
        elif o.state is not None:
            ok &= print_state(g, adm.describe_consumer_groups([g])[g], out, err)
        else:
            desc, rows = collect_offsets(adm, g)
            ok &= print_offsets(g, desc.state, rows, out, err)
    return 0 if ok else 1


def delete_groups(adm, o, out, err) -> int:
    ids = _group_ids(adm, o)
    res = adm.delete_consumer_groups(ids, raise_on_error=False)
    failed = {g: e for g, e in res.items() if e is not None}
    ok = [g for g in ids if res.get(g) is None]
    if not failed:
        print(f"Deletion of requested consumer groups ('{', '.join(ok)}') was successful.", file=out)
        return 0
    detail = "; ".join(f"Group '{g}' could not be deleted due to: {describe_error(e)}" for g, e in failed.items())
    print(f"Error: Deletion of some consumer groups failed: {detail}", file=err)
    if ok:
        print(f"\nThese consumer groups were deleted successfully: '{', '.join(ok)}'", file=out)
    return 1


# -- reset / delete offsets ----------------------------------------------------------------------

def _topic_partitions(adm, topic_args) -> list[TopicPartition]:
    """``t`` (every partition) or ``t:0,1,2`` (those partitions)."""
    out, whole = [], []
    for arg in topic_args:
        if ":" in arg:
            parts = arg.split(":")
            if len(parts) != 2:
                raise ToolError(f"Invalid topic arg '{arg}', expected topic name and partitions")
            for p in parts[1].split(","):
                try:
                    out.append(TopicPartition(parts[0], int(p)))
                except ValueError:
                    raise ToolError(f"Invalid partition '{p}' specified in topic arg '{arg}''") from None
        else:
            whole.append(arg)
    if whole:
        for t, parts in adm.describe_topics(whole).items():
            out += [TopicPartition(t, p.partition) for p in parts]
    return list(dict.fromkeys(out))


def parse_datetime(s: str) -> int:
    """Kafka's Utils.getDateTime: ``YYYY-MM-DDTHH:mm:SS.sss`` with an optional zone (``Z``,
    ``+hh:mm``); no zone means the local time zone. Returns epoch milliseconds."""
    try:
        d = _dt.datetime.fromisoformat(s)
    except ValueError:
        raise ToolError(f"Error parsing date time '{s}': expected format 'YYYY-MM-DDTHH:mm:SS.sss'") from None
    if d.tzinfo is None:
        d = d.astimezone()
    return int(d.timestamp() * 1000)


_DURATION = re.compile(r"^([-+]?)P(?:([-+]?\d+)D)?(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+(?:[.,]\d+)?)S)?)?$",
                       re.IGNORECASE)


def parse_duration_ms(s: str) -> int:
    """java.time.Duration.parse's ISO-8601 form ``PnDTnHnMn.nS`` in milliseconds."""
    m = _DURATION.match(s.strip())
    if not m or s.strip().upper().endswith("T") or not any(m.group(i) for i in range(2, 6)):
        raise ToolError(f"Text cannot be parsed to a Duration: {s}")
    d, h, mi, sec = (float((m.group(i) or "0").replace(",", ".")) for i in range(2, 6))
    ms = int(round(((d * 24 + h) * 60 + mi) * 60_000 + sec * 1000))
    return -ms if m.group(1) == "-" else ms


def _read_plan(path: str, single_group: str | None) -> dict:
    """{group: {tp: offset}} from ``topic,partition,offset`` (one --group) or
    ``group,topic,partition,offset`` lines."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError as e:
        raise ToolError(f"cannot read {path}: {e.strerror or e}") from None
    plan: dict = {}
    for ln in lines:
        f = [x.strip() for x in ln.split(",")]
        try:
            if len(f) == 3 and single_group is not None:
                g, t, p, off = single_group, f[0], int(f[1]), int(f[2])
            elif len(f) == 4:
                g, t, p, off = f[0], f[1], int(f[2]), int(f[3])
            else:
                raise ValueError
        except ValueError:
            raise ToolError(f"Invalid line in {path}: '{ln}' (expected topic,partition,offset"
                            f" or group,topic,partition,offset)") from None
        plan.setdefault(g, {})[TopicPartition(t, p)] = off
    return plan


def _clamp(adm, wanted: dict, err) -> dict:
    """Kafka's checkOffsetsRange: an offset past the log end becomes the log end, one before
    the log start becomes the log start (with a warning)."""
    starts = log_offsets(adm, list(wanted), EARLIEST)
    ends = log_offsets(adm, list(wanted), LATEST)
    out = {}
    for tp, off in wanted.items():
        end, start = ends.get(tp), starts.get(tp)
        if end is None:
            raise ToolError(f"Error getting ending offset of topic partition: {tp.topic}-{tp.partition}")
        if off > end:
            print(f"WARN: New offset ({off}) is higher than latest offset for topic partition "
                  f"{tp.topic}-{tp.partition}. Value will be set to {end}", file=err)
            off = end
        elif start is not None and off < start:
            print(f"WARN: New offset ({off}) is lower than earliest offset for topic partition "
                  f"{tp.topic}-{tp.partition}. Value will be set to {start}", file=err)
            off = start
        out[tp] = off
    return out


def _by_timestamp(adm, tps, ts: int, err) -> dict:
    found = log_offsets(adm, tps, ts)
    missing = [tp for tp in tps if found.get(tp) is None or found[tp] < 0]
    for tp in missing:
        print(f"\nWarn: Partition {tp.partition} from topic {tp.topic} is empty. Falling back to latest known offset.",
              file=err)
    found.update(log_offsets(adm, missing, LATEST))
    return found


def prepare_reset(adm, o, group: str, tps: list, plan: dict | None, err) -> dict:
    """{tp: new offset} for the chosen scenario."""
    def need(res, what):
        for tp in tps:
            if res.get(tp) is None:
                raise ToolError(f"Error getting {what} offset of topic partition: {tp.topic}-{tp.partition}")
        return {tp: res[tp] for tp in tps}

    if o.to_offset is not None:
        return _clamp(adm, {tp: o.to_offset for tp in tps}, err)
    if o.to_earliest:
        return need(log_offsets(adm, tps, EARLIEST), "starting")
    if o.to_latest:
        return need(log_offsets(adm, tps, LATEST), "ending")
    if o.shift_by is not None:
        committed = adm.list_consumer_group_offsets(group)
        wanted = {}
        for tp in tps:
            if tp not in committed:
                raise ToolError(f"Cannot shift offset for partition {tp.topic}-{tp.partition} since there is no "
                                "current committed offset")
            wanted[tp] = committed[tp].offset + o.shift_by
        return _clamp(adm, wanted, err)
    if o.to_datetime is not None:
        return need(_by_timestamp(adm, tps, parse_datetime(o.to_datetime), err), "offset by timestamp of")
    if o.by_duration is not None:
        ts = int(time.time() * 1000) - parse_duration_ms(o.by_duration)
        return need(_by_timestamp(adm, tps, ts, err), "offset by timestamp of")
    if o.from_file is not None:
        mine = (plan or {}).get(group)
        if mine is None:
            print(f"Error: No reset plan for group {group} found", file=err)
            return {}
        return _clamp(adm, dict(mine), err)
    if o.to_current:
        committed = adm.list_consumer_group_offsets(group)
        out = {tp: committed[tp].offset for tp in tps if tp in committed}
        rest = [tp for tp in tps if tp not in committed]
        out.update(need(log_offsets(adm, rest, LATEST), "ending") if rest else {})
        return out
    raise ToolError("Option '--reset-offsets' requires one of the following scenarios")


def reset_offsets(adm, o, out, err) -> int:
    ids = _group_ids(adm, o)
    plan = _read_plan(o.from_file, ids[0] if len(ids) == 1 else None) if o.from_file else None
    execute = o.execute and not o.dry_run
    result: dict = {}
    ok = True
    for g in ids:
        state = adm.describe_consumer_groups([g])[g].state
        if state not in ("Empty", "Dead"):
            print(f"Error: Assignments can only be reset if the group '{g}' is inactive, but the current state "
                  f"is {state}.", file=err)
            result[g] = {}
            ok = False
            continue
        if o.all_topics:
            tps = sorted(adm.list_consumer_group_offsets(g))
        elif o.topic:
            tps = _topic_partitions(adm, o.topic)
        else:
            tps = []
        new = prepare_reset(adm, o, g, tps, plan, err)
        if execute and new:
            items = sorted(new.items())
            for i in range(0, len(items), _COMMIT_CHUNK):
                chunk = dict(items[i:i + _COMMIT_CHUNK])
                res = adm.alter_consumer_group_offsets(g, chunk, raise_on_error=False)
                bad = {tp: e for tp, e in res.items() if e is not None}
                if bad:
                    tp, e = next(iter(sorted(bad.items())))
                    raise ToolError(f"could not commit offsets of group '{g}' "
                                    f"({tp.topic}-{tp.partition}: {describe_error(e)})")
                if len(items) > _COMMIT_CHUNK:
                    print(f"Reset {min(i + _COMMIT_CHUNK, len(items))}/{len(items)} partitions of group '{g}'",
                          file=err)
        result[g] = new
    if o.export:
        single = o.group is not None and len(o.group) == 1
        for g, offs in result.items():
            for tp, off in sorted(offs.items()):
                print(f"{tp.topic},{tp.partition},{off}" if single else f"{g},{tp.topic},{tp.partition},{off}",
                      file=out)
    else:
        fmt = "{:<30} {:<30} {:<10} {:<15}"
        if result:
            print(file=out)
            print(fmt.format("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"), file=out)
        for g, offs in result.items():
            for tp, off in sorted(offs.items()):
                print(fmt.format(g, tp.topic, tp.partition, off), file=out)
    return 0 if ok else 1


def delete_offsets(adm, o, out, err) -> int:
    g = o.group[0]
    tps: list = []
    results: dict = {}
    for arg in o.topic:
        try:
            tps += _topic_partitions(adm, [arg])
        except E.KafkaError as e:
            results[TopicPartition(arg.split(":")[0], -1)] = e
    group_err, part = adm.delete_consumer_group_offsets(g, tps) if tps else (None, {})
    results.update(part)
    code = type(group_err).__name__ if group_err is not None else None
    messages = {
        "InvalidGroupIdError": f"'{g}' is not valid.",
        "GroupIdNotFoundError": f"'{g}' does not exist.",
        "GroupAuthorizationFailedError": f"Access to '{g}' is not authorized.",
        "NonEmptyGroupError": f"Deleting offsets of a consumer group '{g}' is forbidden if the group is not empty.",
    }
    failed = group_err is not None or any(e is not None for e in results.values())
    if group_err is not None:
        print(f"Error: {messages.get(code, f'Encounter some unknown error: {describe_error(group_err)}')}", file=err)
    elif failed:
        print("Error: Encounter some partition level error, see the follow-up details:", file=err)
    else:
        print(f"Request succeed for deleting offsets with topic {', '.join(o.topic)} group {g}", file=out)
    fmt = "{:<30} {:<15} {:<15}"
    print(file=out)
    print(fmt.format("TOPIC", "PARTITION", "STATUS"), file=out)
    for tp, e in sorted(results.items()):
        status = "Successful" if e is None else f"Error: {describe_error(e)}"
        print(fmt.format(tp.topic, tp.partition if tp.partition >= 0 else "Not Provided", status), file=out)
    return 1 if failed else 0


def _main(argv, out, err=None) -> int:
    err = err or sys.stderr
    o = build_parser().parse(argv, out)
    if o is None:
        return 0
    check_args(o)
    adm = admin(o.bootstrap_server, o.command_config, o.timeout)
    try:
        if o.list:
            return list_groups(adm, o, out)
        if o.describe:
            return describe(adm, o, out, err)
        if o.delete:
            return delete_groups(adm, o, out, err)
        if o.reset_offsets:
            return reset_offsets(adm, o, out, err)
        return delete_offsets(adm, o, out, err)
    finally:
        adm.close()


def main(argv: list[str] | None = None, out=None) -> int:
    return run_tool(_main, sys.argv[1:] if argv is None else argv, out)


if __name__ == "__main__":
    sys.exit(main())

"""kbroker consumer-groups (kafka-consumer-groups.sh) against a real broker, checked with
confluent-kafka: lag = log end - committed per partition; every reset scenario moves the
committed offsets exactly as asked; --dry-run moves nothing; a reset is refused while the
group has members (classic and KIP-848); --delete / --delete-offsets."""
import datetime
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.broker.kafka_helpers import create_topic
from tests.tools.conftest import name

# an hour ago: recent enough that time-based retention (7 days) leaves the records alone
TS0 = (int(time.time()) - 3600) * 1000


def fill(bootstrap, topic, counts, ts_step=None):
    """counts[p] records into partition p; record i of each partition has timestamp TS0 + i*ts_step."""
    p = Producer({"bootstrap.servers": bootstrap})
    for part, n in enumerate(counts):
        for i in range(n):
            kw = {"timestamp": TS0 + i * ts_step} if ts_step else {}
            p.produce(topic, value=b"v%d" % i, key=b"k", partition=part, **kw)
    assert p.flush(30) == 0


def commit(bootstrap, group, topic, offsets):
    """A simple (memberless) commit, as an application using assign() does."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, p, o) for p, o in enumerate(offsets)], asynchronous=False)
    c.close()


def committed(bootstrap, group, topic, partitions):
    """{partition: committed offset} through confluent-kafka's AdminClient."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    a = AdminClient({"bootstrap.servers": bootstrap})
    f = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p) for p in range(partitions)])])[group]
    return {tp.partition: tp.offset for tp in f.result(timeout=15).topic_partitions}


def watermarks(bootstrap, topic, partitions):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm-" + name()})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)}
    finally:
        c.close()


def rows(stdout, header="GROUP"):
    """Data rows (split on whitespace) of the table whose header starts with ``header``."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    i = next(i for i, ln in enumerate(lines) if ln.split()[0] == header)
    return [ln.split() for ln in lines[i + 1:]]


def active_consumer(bootstrap, group, topic, protocol="classic"):
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
            "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if protocol == "classic":
        conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    c = Consumer(conf)
    c.list_topics(topic, timeout=10)
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while not c.assignment():
        assert time.monotonic() < deadline, "no assignment"
        c.poll(0.2)
    return c


def test_describe_lag_of_a_memberless_group(broker, tool):
    t, g = name(), name("g")
    create_topic(broker.bootstrap, t, partitions=3)
    fill(broker.bootstrap, t, [10, 20, 30])
    commit(broker.bootstrap, g, t, [3, 20, 7])
    r = tool("consumer-groups", "--describe", "--group", g)
    assert r.returncode == 0, r.stderr
    assert f"Consumer group '{g}' has no active members." in r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "" and lines[1].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                                                   "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    got = {int(r_[2]): r_ for r_ in rows(r.stdout)}
    marks = watermarks(broker.bootstrap, t, 3)
    comm = committed(broker.bootstrap, g, t, 3)
    assert sorted(got) == [0, 1, 2]
    for p, row in got.items():
        assert row[0] == g and row[1] == t
        assert int(row[3]) == comm[p]
        assert int(row[4]) == marks[p][1]
        assert int(row[5]) == marks[p][1] - comm[p]
        assert row[6:] == ["-", "-", "-"]
    # the listing shows it, with its state
    r = tool("consumer-groups", "--list")
    assert g in r.stdout.split()
    r = tool("consumer-groups", "--list", "--state", "empty")
    assert [g, "Empty"] in rows(r.stdout)
    r = tool("consumer-groups", "--list", "--state", "stable")
    assert g not in r.stdout
    r = tool("consumer-groups", "--describe", "--all-groups")
    assert r.returncode == 0 and {x[0] for x in rows(r.stdout)} >= {g}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_active_group_describe_and_reset_refused(broker, tool, protocol):
    t, g = name(), name("g")
    create_topic(broker.bootstrap, t, partitions=2)
    fill(broker.bootstrap, t, [5, 8])
    c = active_consumer(broker.bootstrap, g, t, protocol)
    try:
        c.commit(offsets=[TopicPartition(t, 0, 2), TopicPartition(t, 1, 8)], asynchronous=False)
        deadline = time.monotonic() + 30
        while True:  # a KIP-848 member reconciles after its first heartbeats
            r = tool("consumer-groups", "--describe", "--group", g, "--state")
            if r.returncode == 0 and rows(r.stdout)[0][-2:] == ["Stable", "1"]:
                break
            assert time.monotonic() < deadline, r.stdout + r.stderr
            c.poll(0.3)
        st = rows(r.stdout)[0]
        assert st[0] == g and st[1] == broker.bootstrap
        r = tool("consumer-groups", "--describe", "--group", g)
        assert r.returncode == 0, r.stderr
        got = {int(x[2]): x for x in rows(r.stdout)}
        assert {p: (int(x[3]), int(x[4]), int(x[5])) for p, x in got.items()} == {0: (2, 5, 3), 1: (8, 8, 0)}
        member_id = got[0][6]
        assert member_id != "-" and got[1][6] == member_id
        r = tool("consumer-groups", "--describe", "--group", g, "--members", "--verbose")
        assert r.returncode == 0, r.stderr
        (m,) = rows(r.stdout)
        assert m[1] == member_id and m[4] == "2" and " ".join(m[5:]) == f"{t}(0,1)"
        if protocol == "consumer":
            r = tool("consumer-groups", "--list", "--type")
            assert [g, "Consumer"] in rows(r.stdout)
        # a reset is refused while the group has a member; nothing moves
        r = tool("consumer-groups", "--reset-offsets", "--group", g, "--topic", t, "--to-earliest", "--execute")
        assert r.returncode == 1
        assert (f"Assignments can only be reset if the group '{g}' is inactive, but the current state is "
                f"Stable.") in r.stderr
        assert committed(broker.bootstrap, g, t, 2) == {0: 2, 1: 8}
        # --delete-offsets of a consumed topic is refused too
        r = tool("consumer-groups", "--delete-offsets", "--group", g, "--topic", t)
        assert r.returncode == 1
    finally:
        c.close()
    # once the member left, the reset goes through
    deadline = time.monotonic() + 30
    while True:
        r = tool("consumer-groups", "--reset-offsets", "--group", g, "--topic", t, "--to-earliest", "--execute")
        if r.returncode == 0:
            break
        assert time.monotonic() < deadline, r.stderr
    assert committed(broker.bootstrap, g, t, 2) == {0: 0, 1: 0}


def _reset(tool, g, *args):
    r = tool("consumer-groups", "--reset-offsets", "--group", g, *args)
    assert r.returncode == 0, r.stderr
    return {(x[1], int(x[2])): int(x[3]) for x in rows(r.stdout)}, r.stdout + r.stderr


def test_reset_scenarios(broker, tool, tmp_path):
    t, g = name(), name("g")
    create_topic(broker.bootstrap, t, partitions=3)
    fill(broker.bootstrap, t, [10, 10, 10], ts_step=1000)
    commit(broker.bootstrap, g, t, [5, 5, 5])
    bs = broker.bootstrap

    def check(args, expect, scope=("--topic", t), parts=(0, 1, 2), dry=False):
        moved = {(t, p): o for p, o in expect.items() if p in parts}
        if dry:  # the plan --dry-run prints is what --execute then does; --dry-run commits nothing
            plan, text = _reset(tool, g, *scope, *args, "--dry-run")
            assert plan == moved, (args, text)
            assert committed(bs, g, t, 3) == {0: 5, 1: 5, 2: 5}, "--dry-run moved offsets"
        plan, text = _reset(tool, g, *scope, *args, "--execute")
        assert plan == moved, (args, text)
        assert committed(bs, g, t, 3) == expect, args
        commit(bs, g, t, [5, 5, 5])

    check(["--to-earliest"], {0: 0, 1: 0, 2: 0}, dry=True)
    check(["--to-latest"], {0: 10, 1: 10, 2: 10}, dry=True)
    check(["--to-offset", 7], {0: 7, 1: 7, 2: 7})
    check(["--to-offset", 99], {0: 10, 1: 10, 2: 10})          # clamped to the log end
    check(["--shift-by", -2], {0: 3, 1: 3, 2: 3}, dry=True)
    check(["--shift-by", 100], {0: 10, 1: 10, 2: 10})
    check(["--shift-by", -100], {0: 0, 1: 0, 2: 0})            # clamped to the log start
    check(["--to-current"], {0: 5, 1: 5, 2: 5})
    at = datetime.datetime.fromtimestamp((TS0 + 3000) / 1000, datetime.timezone.utc)
    check(["--to-datetime", at.strftime("%Y-%m-%dT%H:%M:%S.000Z")], {0: 3, 1: 3, 2: 3}, dry=True)
    check(["--to-datetime", at.astimezone().strftime("%Y-%m-%dT%H:%M:%S.500")], {0: 4, 1: 4, 2: 4})  # local time
    check(["--by-duration", "PT10M"], {0: 10, 1: 10, 2: 10})  # nothing that recent: log end
    check(["--by-duration", "P1DT2H"], {0: 0, 1: 0, 2: 0})
    check(["--to-offset", 1], {0: 1, 1: 5, 2: 5}, scope=("--topic", f"{t}:0"), parts=(0,))
    check(["--to-offset", 2], {0: 2, 1: 2, 2: 5}, scope=("--topic", f"{t}:0,1"), parts=(0, 1))
    check(["--to-earliest"], {0: 0, 1: 0, 2: 0}, scope=("--all-topics",))
    # neither --dry-run nor --execute: a dry run, with Kafka's warning
    r = tool("consumer-groups", "--reset-offsets", "--group", g, "--topic", t, "--to-latest")
    assert r.returncode == 0 and "WARN: No action will be performed as the --execute option is missing." in r.stderr
    assert committed(bs, g, t, 3) == {0: 5, 1: 5, 2: 5}
    plan = tmp_path / "plan.csv"
    plan.write_text(f"{t},0,4\n{t},2,9\n")
    check(["--from-file", str(plan)], {0: 4, 1: 5, 2: 9}, scope=(), parts=(0, 2), dry=True)
    # --export writes the plan as CSV that --from-file reads back
    r = tool("consumer-groups", "--reset-offsets", "--group", g, "--topic", t, "--to-offset", 6, "--export",
             "--dry-run")
    assert r.returncode == 0 and r.stdout.split() == [f"{t},0,6", f"{t},1,6", f"{t},2,6"]


def test_delete_offsets_and_group(broker, tool):
    t, t2, g = name(), name(), name("g")
    create_topic(broker.bootstrap, t, partitions=2)
    create_topic(broker.bootstrap, t2, partitions=1)
    fill(broker.bootstrap, t, [3, 3])
    commit(broker.bootstrap, g, t, [1, 2])
    commit(broker.bootstrap, g, t2, [0])
    r = tool("consumer-groups", "--delete-offsets", "--group", g, "--topic", f"{t}:1")
    assert r.returncode == 0, r.stderr
    assert f"Request succeed for deleting offsets with topic {t}:1 group {g}" in r.stdout
    assert rows(r.stdout, "TOPIC") == [[t, "1", "Successful"]]
    assert committed(broker.bootstrap, g, t, 2) == {0: 1, 1: -1001}
    r = tool("consumer-groups", "--delete", "--group", g)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"Deletion of requested consumer groups ('{g}') was successful."
    assert g not in tool("consumer-groups", "--list").stdout.split()
    r = tool("consumer-groups", "--describe", "--group", g)
    assert r.returncode == 1 and r.stderr.strip() == f"Error: Consumer group '{g}' does not exist."
    r = tool("consumer-groups", "--delete", "--group", g)
    assert r.returncode == 1 and r.stderr.startswith("Error: Deletion of some consumer groups failed")


def test_usage_errors(tool, tmp_path):
    r = tool("consumer-groups", "--describe")
    assert r.returncode == 1
    assert r.stderr.strip() == "Error: Option --describe takes one of these options: --all-groups, --group"
    r = tool("consumer-groups", "--list", "--describe")
    assert r.returncode == 1 and "exactly one action" in r.stderr
    r = tool("consumer-groups", "--reset-offsets", "--group", "g", "--to-earliest", "--to-latest", "--all-topics")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) >= 1
    r = tool("consumer-groups", "--list", bootstrap=False)
    assert r.returncode == 1 and r.stderr.strip() == 'Error: Missing required argument "[bootstrap-server]"'
    r = tool("consumer-groups", "--help", bootstrap=False)
    assert r.returncode == 0 and r.stdout.startswith("This tool helps to list all consumer groups")
    assert "--reset-offsets" in r.stdout and "Option" in r.stdout
    # --command-config: a client properties file (unknown keys are warned about, not fatal)
    cfg = tmp_path / "client.properties"
    cfg.write_text("# admin settings\nrequest.timeout.ms=20000\ngroup.id=ignored\n")
    r = tool("consumer-groups", "--list", "--command-config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "group.id" in r.stderr
    cfg.write_text("security.protocol=SASL_SSL\n")
    r = tool("consumer-groups", "--list", "--command-config", str(cfg))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1


def test_reset_of_many_partitions_commits_in_chunks_and_shows_progress():
    """In-process, on a stand-in Admin: 1200 partitions are committed 500 at a time, each
    chunk reported on stderr; stdout keeps Kafka's table."""
    import io
    from types import SimpleNamespace

    from kbroker.client.metadata import TopicPartition as TP
    from kbroker.tools import consumer_groups as cg

    class FakeAdmin:
        commits = []

        def describe_consumer_groups(self, ids):
            return {g: SimpleNamespace(state="Empty", members=[]) for g in ids}

        def describe_topics(self, names):
            return {n: [SimpleNamespace(partition=p) for p in range(1200)] for n in names}

        def list_offsets(self, specs, raise_on_error=True):
            return {tp: SimpleNamespace(offset=0 if spec == -2 else 9) for tp, spec in specs.items()}

        def alter_consumer_group_offsets(self, g, offsets, raise_on_error=True):
            self.commits.append(len(offsets))
            return {tp: None for tp in offsets}

    opts = cg.build_parser().parse_args(["--bootstrap-server", "x:1", "--reset-offsets", "--group", "g",
                                         "--topic", "big", "--to-latest", "--execute"])
    out, err = io.StringIO(), io.StringIO()
    assert cg.reset_offsets(FakeAdmin(), opts, out, err) == 0
    assert FakeAdmin.commits == [500, 500, 200]
    assert err.getvalue().splitlines() == [f"Reset {n}/1200 partitions of group 'g'" for n in (500, 1000, 1200)]
    table = [ln.split() for ln in out.getvalue().splitlines()[2:]]
    assert len(table) == 1200 and table[0] == ["g", "big", "0", "9"] and table[-1] == ["g", "big", "1199", "9"]

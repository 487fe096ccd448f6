"""At least once across a SIGKILL of the mirror, and the Tansu peer as a source and as a target.

Tansu 0.6 (the pinned peer) and transactions: InitProducerId, AddPartitionsToTxn, EndTxn and
fencing work and read_committed stops at open transactions, but its Fetch reports no aborted
transactions, so a read_committed reader sees *aborted* records. Exactly-once into Tansu
therefore holds only while no transaction aborts (a mirror killed mid-transaction leaves
records that Tansu shows), and out of Tansu aborted source records are mirrored."""
from __future__ import annotations

import threading
import time
import urllib.request

from kbroker.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from kbroker.testing import KBrokerProcess, TansuProcess

from tests.mirror.conftest import BROKER, count, mm2_props, read_partitions, topics, wait_until


def _end_offsets(bootstrap, topic, partitions):
    c = Consumer({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})
    try:
        return c.end_offsets([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        c.close()


def test_sigkill_and_restart_loses_nothing_and_duplicates_only_uncommitted(cluster_a, cluster_b, mirror):
    a, b = cluster_a.bootstrap, cluster_b.bootstrap
    with Admin({"bootstrap.servers": a}) as admin:
        admin.create_topics([NewTopic("stream", 3, 1)])
    total = 6000
    done, killed = threading.Event(), threading.Event()

    def produce():      # ~2000 records/s, 6,000 records but never all of them before the kill
        with Producer({"bootstrap.servers": a, "linger.ms": 2}) as p:
            for i in range(total):
                p.send("stream", f"r{i}".encode(), f"k{i % 13}".encode(), partition=i % 3)
                if i % 100 == 99:
                    time.sleep(0.05)
                if i == total - 100:
                    killed.wait(120)
            p.flush(30)
        done.set()
    t = threading.Thread(target=produce, daemon=True)
    t.start()
    # the dead instance leaves the group after session.timeout.ms: keep that short
    props = mm2_props(cluster_a, cluster_b, topics="stream", emit_checkpoints_enabled="false",
                      **{"A.consumer.session.timeout.ms": 6000, "A.consumer.heartbeat.interval.ms": 1000})
    m = mirror(props)
    wait_until(lambda: count(b, "A.stream") >= 1500, 40, "replication under way")
    m.kill()                                    # SIGKILL: no flush, no commit
    killed.set()
    written = _end_offsets(b, "A.stream", 3)    # what reached B before the kill
    assert sum(written.values()) < total, "the kill must land mid-stream"
    with Admin({"bootstrap.servers": a}) as admin:
        committed = {tp.partition: om.offset for tp, om in admin.list_consumer_group_offsets("mm2-A->B").items()
                     if tp.topic == "stream"}
    m2 = mirror(props)
    t.join(60)
    assert done.is_set()
    wait_until(lambda: count(b, "A.stream") >= total, 60, "everything on B after the restart")
    time.sleep(1)
    src = read_partitions(a, "stream")
    dst = read_partitions(b, "A.stream")
    for p in range(3):
        index = {r.value: i for i, r in enumerate(src[p])}
        seq = [index[r.value] for r in dst[p]]
        # ascending runs with no gap between them; the first starts at 0, the last ends at the end
        assert seq[0] == 0 and seq[-1] == len(src[p]) - 1
        runs = [[seq[0]]]
        for x in seq[1:]:
            if x == runs[-1][-1] + 1:
                runs[-1].append(x)
            else:
                assert x <= runs[-1][-1], f"partition {p}: records {runs[-1][-1] + 1}..{x - 1} lost"
                runs.append([x])
        assert set(seq) == set(range(len(src[p]))), f"partition {p} lost records"
        dups = len(seq) - len(src[p])
        # the restart resends exactly from the last committed offset: only what was written after it
        w = written[TopicPartition("A.stream", p)]
        assert dups <= w - committed.get(p, 0), (p, dups, w, committed)
        # records, keys and order of the resent suffix are the source's
        assert [(r.key, r.value) for r in dst[p][-len(src[p]):]] != [] and dst[p][-1].value == src[p][-1].value
    assert m2.terminate() == 0


def test_tansu_as_the_source_cluster(cluster_b, mirror, tmp_path):
    with TansuProcess().start() as tansu:
        a = tansu.bootstrap
        with Admin({"bootstrap.servers": a}) as admin:
            admin.create_topics([NewTopic("tansu-orders", 2, 1)])
        with Producer({"bootstrap.servers": a, "linger.ms": 2}) as p:
            for i in range(200):
                p.send("tansu-orders", f"v{i}".encode(), f"k{i % 5}".encode(), partition=i % 2,
                       timestamp_ms=1_700_000_000_000 + i, headers=[("h", str(i).encode())])
            p.flush(30)
        m = mirror(mm2_props(tansu, cluster_b, topics="tansu-orders"))
        # ~24 s here: the mirror's source consumer group takes that long to form on Tansu (its
        # rebalances are slow, see tests/client); 120 s leaves room on a loaded machine
        wait_until(lambda: count(cluster_b.bootstrap, "A.tansu-orders") == 200, 120, "A.tansu-orders on B")
        src, dst = read_partitions(a, "tansu-orders"), read_partitions(cluster_b.bootstrap, "A.tansu-orders")
        for p in src:
            assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in dst[p]] == \
                [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in src[p]]

        want = ['kafka_connect_mirror_MirrorSourceConnector_record_count_total{partition="%d",source="A",'
                'target="B",topic="A.tansu-orders"} 100.0' % p for p in (0, 1)]
        want.append('kafka_connect_mirror_MirrorSourceConnector_lag{partition="1",source="A",target="B",'
                    'topic="A.tansu-orders"} 0.0')

        def scrape():      # the task retires acknowledged records (and their lag) on its next polls
            body = urllib.request.urlopen(f"http://127.0.0.1:{m.metrics_port}/metrics", timeout=10).read().decode()
            return body if all(w in body for w in want) else None
        body = wait_until(scrape, 20, "both partitions' records, and no lag, in the metrics")
        assert 'kafka_connect_mirror_MirrorSourceConnector_replication_latency_ms_count{partition="1"' in body
        assert m.terminate() == 0


def _read_n(bootstrap, topic, partitions, n, timeout_s) -> dict[int, list]:
    """Read ``topic`` from the start until ``n`` records have come, then 1 s more (a duplicate
    would show). Tansu 0.6's ListOffsets(latest) answers the last batch's base offset + 1, not
    the high watermark, so end offsets cannot say where Tansu's log ends."""
    c = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", "allow.auto.create.topics": False,
                  "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        out = {p: [] for p in range(partitions)}
        deadline, settle = time.monotonic() + timeout_s, None
        while settle is None or time.monotonic() < settle:
            assert time.monotonic() < deadline, f"{sum(map(len, out.values()))} of {n} records of {topic}"
            for r in c.poll(0.2):
                out[r.partition].append(r)
            if settle is None and sum(map(len, out.values())) >= n:
                settle = time.monotonic() + 1.0
        return out
    finally:
        c.close()


def test_tansu_as_the_target_cluster(cluster_a, mirror):
    """kbroker -> Tansu: at least once, then exactly once (Tansu's transactions commit and
    fence; no kill here, see the module notes), records per partition identical. The source
    group lives on kbroker, so there is no slow Tansu group formation."""
    with TansuProcess().start() as tansu:
        a = cluster_a.bootstrap
        with Admin({"bootstrap.servers": a}) as admin:
            admin.create_topics([NewTopic("to-tansu", 2, 1), NewTopic("to-tansu-eos", 2, 1)])
        for topic in ("to-tansu", "to-tansu-eos"):
            with Producer({"bootstrap.servers": a, "linger.ms": 2}) as p:
                for i in range(200):
                    p.send(topic, f"v{i}".encode(), f"k{i % 5}".encode(), partition=i % 2,
                           timestamp_ms=1_700_000_000_000 + i, headers=[("h", str(i).encode())])
                p.flush(30)
        for topic, extra in (("to-tansu", {}),
                             ("to-tansu-eos", {"exactly.once.source.support": "enabled",
                                               "offset.storage.replication.factor": 1})):
            m = mirror(mm2_props(cluster_a, tansu, topics=topic, emit_heartbeats_enabled="false", **extra))
            dst = _read_n(tansu.bootstrap, f"A.{topic}", 2, 200, 60)
            src = read_partitions(a, topic)
            for p in src:
                assert [(r.key, r.value, r.headers, r.timestamp) for r in dst[p]] == \
                    [(r.key, r.value, r.headers, r.timestamp) for r in src[p]], (topic, p)
            assert m.terminate() == 0
        assert "A-mm2-MirrorSourceConnector-0" in m.log()


def test_sigterm_after_both_clusters_died_stops_within_the_graceful_timeout(mirror):
    """Connect's task.shutdown.graceful.timeout.ms: a stop waits that long for the flows,
    then abandons the ones blocked in a call to a cluster that no longer answers (before,
    the process waited 30 s per flow, and a test's teardown hit its own 30 s kill)."""
    a = KBrokerProcess(overrides=BROKER).start()
    b = KBrokerProcess(overrides=BROKER).start()
    try:
        with Producer({"bootstrap.servers": a.bootstrap}) as p:
            for i in range(10):
                p.send("orders", b"%d" % i)
            p.flush(10)
        m = mirror(mm2_props(a, b, ("A->B", "B->A"), topics="orders",
                             **{"task.shutdown.graceful.timeout.ms": 1000}))
        wait_until(lambda: "A.orders" in topics(b.bootstrap), 30, "the remote topic")
    finally:
        a.__exit__(None, None, None)
        b.__exit__(None, None, None)
    time.sleep(1.0)                                   # the flows are now retrying against nothing
    m.proc.send_signal(15)
    assert m.proc.wait(15) == 0                        # 1 s graceful timeout, not 30 s per flow

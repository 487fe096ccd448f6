"""MirrorMaker 2 end to end: two real kbroker brokers, ``kbroker mirror`` as a child process."""
from __future__ import annotations

import time

from kbroker.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from kbroker.client.admin import RESOURCE_TOPIC, SET, ConfigResource
from kbroker.mirror import heartbeats, translate_offsets

from tests.mirror.conftest import count, mm2_props, read_partitions, topics, wait_until


def _produce(bootstrap, topic, n, partitions, start=0):
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 2}) as p:
        for i in range(start, start + n):
            p.send(topic, f"value-{i}".encode() * 3, f"key-{i % 11}".encode(), partition=i % partitions,
                   timestamp_ms=1_700_000_000_000 + i, headers=[("trace", str(i).encode()), ("empty", None)])
        p.flush(30)


def _same(a_parts, b_parts):
    assert sorted(a_parts) == sorted(b_parts)
    for p, recs in a_parts.items():
        got = b_parts[p]
        assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in got] == \
            [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in recs], f"partition {p} differs"


def test_topics_records_partitions_and_configs_replicate(cluster_a, cluster_b, mirror):
    a, b = cluster_a.bootstrap, cluster_b.bootstrap
    with Admin({"bootstrap.servers": a}) as admin:
        admin.create_topics([NewTopic("orders", 3, 1, {"retention.ms": "3600000",
                                                       "min.insync.replicas": "1"})])
    _produce(a, "orders", 300, 3)
    m = mirror(mm2_props(cluster_a, cluster_b, topics="orders, payments"))
    wait_until(lambda: count(b, "A.orders") == 300, 40, "A.orders on B")
    _same(read_partitions(a, "orders"), read_partitions(b, "A.orders"))

    with Admin({"bootstrap.servers": b}) as admin:
        cfg = admin.describe_configs([ConfigResource(RESOURCE_TOPIC, "A.orders")])[(RESOURCE_TOPIC, "A.orders")]
        assert cfg["retention.ms"].value == "3600000"
        assert cfg["min.insync.replicas"].source != 1     # excluded by MM2's config.properties.exclude

    # a new topic, added partitions and a config change on A follow within the refresh intervals
    with Admin({"bootstrap.servers": a}) as admin:
        admin.create_topics([NewTopic("payments", 2, 1)])
        admin.create_partitions({"orders": 5})
        admin.incremental_alter_configs({ConfigResource(RESOURCE_TOPIC, "orders"): [("retention.ms", SET, "7200000")]})
    _produce(a, "payments", 40, 2)
    _produce(a, "orders", 50, 5, start=300)
    wait_until(lambda: count(b, "A.payments") == 40, 30, "A.payments on B")
    wait_until(lambda: count(b, "A.orders") == 350, 30, "records of the added partitions on B")
    _same(read_partitions(a, "orders"), read_partitions(b, "A.orders"))
    _same(read_partitions(a, "payments"), read_partitions(b, "A.payments"))

    def synced():
        with Admin({"bootstrap.servers": b}) as admin:
            res = ConfigResource(RESOURCE_TOPIC, "A.orders")
            return admin.describe_configs([res])[res]["retention.ms"].value == "7200000"
    wait_until(synced, 20, "retention.ms synced to A.orders")
    # heartbeats: the flow writes Heartbeat(A, B) to B's heartbeats topic
    beats = wait_until(lambda: [h for h in heartbeats({"bootstrap.servers": b}, 10) if h.source_cluster_alias == "A"],
                       20, "a heartbeat on B")
    assert beats[0].target_cluster_alias == "B"
    assert "orders" not in topics(b) and "A.A.orders" not in topics(b)
    assert m.terminate() == 0


def test_consumer_group_fails_over_with_checkpoints(cluster_a, cluster_b, mirror):
    a, b = cluster_a.bootstrap, cluster_b.bootstrap
    with Admin({"bootstrap.servers": a}) as admin:
        admin.create_topics([NewTopic("clicks", 2, 1)])
    _produce(a, "clicks", 400, 2)
    group = "clicks-app"
    # the application reads part of A and commits
    c = Consumer({"bootstrap.servers": a, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe(["clicks"])
    seen = []
    deadline = time.monotonic() + 30
    while len(seen) < 250 and time.monotonic() < deadline:
        seen.extend(c.poll(0.5, max_records=250 - len(seen)))
    c.commit()
    committed = {tp: c.position(tp) for tp in c.assignment()}
    c.close()
    assert sum(committed.values()) == 250

    lag_max = 10
    m = mirror(mm2_props(cluster_a, cluster_b, topics="clicks", offset_lag_max=lag_max,
                         **{"A->B.sync.group.offsets.enabled": "true"}))
    wait_until(lambda: count(b, "A.clicks") == 400, 40, "A.clicks on B")

    def checkpointed():
        offs = translate_offsets({"bootstrap.servers": b}, "A", group, 10)
        return offs if len(offs) == 2 else None
    offsets = wait_until(checkpointed, 30, "checkpoints for both partitions")
    # the translation never passes the committed position and re-reads at most offset.lag.max
    for tp, up in committed.items():
        down = offsets[TopicPartition("A.clicks", tp.partition)].offset
        assert up - lag_max <= down <= up, (tp, up, down)

    # sync.group.offsets: the group (no members on B) has its offsets committed on B
    def synced():
        with Admin({"bootstrap.servers": b}) as admin:
            got = admin.list_consumer_group_offsets(group)
        return got if len(got) == 2 else None
    on_b = wait_until(synced, 30, "the group's offsets committed on B")
    assert {tp: om.offset for tp, om in on_b.items()} == {tp: om.offset for tp, om in offsets.items()}

    # fail over: the same group on B resumes from there and misses nothing
    c = Consumer({"bootstrap.servers": b, "group.id": group, "auto.offset.reset": "none",
                  "enable.auto.commit": False})
    c.subscribe(["A.clicks"])
    rest = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rest.extend(c.poll(0.5))
        if c.assignment() and all(c.position(tp) >= 200 for tp in c.assignment()):
            break
    c.close()
    values_a = {r.value for r in seen}
    values_b = {r.value for r in rest}
    everything = {f"value-{i}".encode() * 3 for i in range(400)}
    assert values_a | values_b == everything, "a record was skipped on failover"
    reread = len(values_a & values_b)
    assert reread <= 2 * lag_max, reread
    assert m.terminate() == 0


def test_active_active_without_loops(cluster_a, cluster_b, mirror):
    a, b = cluster_a.bootstrap, cluster_b.bootstrap
    for bs in (a, b):
        with Admin({"bootstrap.servers": bs}) as admin:
            admin.create_topics([NewTopic("ledger", 2, 1)])
    _produce(a, "ledger", 30, 2)
    _produce(b, "ledger", 20, 2)
    m = mirror(mm2_props(cluster_a, cluster_b, flows=("A->B", "B->A"), topics="ledger, A\\.ledger, B\\.ledger"))
    wait_until(lambda: count(b, "A.ledger") == 30, 40, "A.ledger on B")
    wait_until(lambda: count(a, "B.ledger") == 20, 40, "B.ledger on A")
    time.sleep(3)      # three refresh intervals: a loop would have created these by now
    assert "B.A.ledger" not in topics(a) and "A.B.ledger" not in topics(b)
    assert "A.B.ledger" not in topics(a) and "B.A.ledger" not in topics(b)
    assert count(a, "ledger") == 30 and count(b, "ledger") == 20
    assert m.terminate() == 0


def _records_by_partition(port: int, topic: str) -> dict[int, float]:
    import re
    import urllib.request

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for m in re.finditer(r'MirrorSourceConnector_record_count_total\{partition="(\d+)",source="A",target="B",'
                         r'topic="' + re.escape(topic) + r'"\} ([0-9.e+]+)', body):
        if float(m.group(2)) > 0:
            out[int(m.group(1))] = float(m.group(2))
    return out


def test_two_instances_split_the_partitions(cluster_a, cluster_b, mirror):
    a, b = cluster_a.bootstrap, cluster_b.bootstrap
    with Admin({"bootstrap.servers": a}) as admin:
        admin.create_topics([NewTopic("split", 4, 1)])
    props = mm2_props(cluster_a, cluster_b, topics="split", heartbeats_replication_enabled="false",
                      emit_heartbeats_enabled="false",
                      **{"A.consumer.session.timeout.ms": 6000, "A.consumer.heartbeat.interval.ms": 500})
    m1, m2 = mirror(props), mirror(props)

    def both_assigned():
        with Admin({"bootstrap.servers": a}) as admin:
            d = admin.describe_consumer_groups(["mm2-A->B"])["mm2-A->B"]
        return d.state == "Stable" and len(d.members) == 2 and all(len(mb.assignment) == 2 for mb in d.members)
    wait_until(both_assigned, 40, "two mirror instances sharing the 4 partitions")
    _produce(a, "split", 400, 4)
    wait_until(lambda: count(b, "A.split") == 400, 30, "A.split on B")
    _same(read_partitions(a, "split"), read_partitions(b, "A.split"))
    p1 = wait_until(lambda: _records_by_partition(m1.metrics_port, "A.split"), 10, "instance 1 metrics")
    p2 = wait_until(lambda: _records_by_partition(m2.metrics_port, "A.split"), 10, "instance 2 metrics")
    assert set(p1) | set(p2) == {0, 1, 2, 3} and not set(p1) & set(p2), (p1, p2)
    assert sum(p1.values()) + sum(p2.values()) == 400
    assert m1.terminate() == 0 and m2.terminate() == 0

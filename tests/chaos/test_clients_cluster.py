"""Unchanged clients against a 3-broker KRaft cluster (kbroker.chaos.cluster) with RF 3 and
min.insync.replicas=2, through the SIGKILL of a partition leader (issue 16's "real
clients" proof): confluent-kafka, kafka-python and aiokafka each produce with acks=all
and idempotence while the leader of a partition dies and restarts, then consume the
topic back: every acknowledged record exactly once, at its acknowledged offset. A
consumer group keeps consuming, its committed offsets kept, through the death of its
group coordinator's broker."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kbroker.chaos.cluster import ChaosCluster

N = 300
PARTITIONS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ChaosCluster(str(tmp_path_factory.mktemp("clients")), overrides={"default.replication.factor": 3})
    try:
        c.start()
        c.wait_ready(60)
        _create_offsets_topic(c)
        yield c
    finally:
        c.stop()


def _create_offsets_topic(c):
    """FindCoordinator creates __consumer_offsets; do it while all three brokers are up, so the
    group's coordinator is online before the faults begin (created while one is down, it gets
    a replica on the fenced broker and runs under-replicated until that broker returns)."""
    from confluent_kafka import Consumer

    c.create_topic("warm-up", 1, 3)
    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "warm-up"})
    try:
        cons.subscribe(["warm-up"])
        c.wait(lambda: cons.poll(0.2) is None and cons.assignment(), 60, "a group joined")
    finally:
        cons.close()
    md = c.metadata("__consumer_offsets")
    assert md and all(len(r) == 3 for _, _, r, _, _ in md.values()), md


def _kill_leader_when(c, topic, started: threading.Event, killed: list):
    """Once ``started`` (a third of the records acknowledged), SIGKILL partition 0's leader
    and start it again."""
    started.wait(60)
    victim = c.leader(topic, 0)
    killed.append(victim)
    c.kill(victim)
    c.wait(lambda: c.metadata(topic)[0][0] not in (victim, -1), 30, "a new leader")
    c.start(victim)


def _confluent(c, topic, acked, started):
    from confluent_kafka import Consumer, Producer, TopicPartition

    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 2,
                  "message.timeout.ms": 60000, "topic.metadata.refresh.interval.ms": 1000})

    def cb(err, m):
        if err is None:
            acked.append((m.partition(), m.offset(), m.value()))
            if len(acked) >= N // 3:
                started.set()
    for i in range(N):
        p.produce(topic, value=b"c%d" % i, partition=i % PARTITIONS, on_delivery=cb)
        p.poll(0)
        time.sleep(0.01)
    assert p.flush(90) == 0

    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "readback-confluent", "enable.auto.commit": False})
    cons.assign([TopicPartition(topic, i, 0) for i in range(PARTITIONS)])
    out = []
    deadline = time.monotonic() + 60
    while len(out) < len(acked) and time.monotonic() < deadline:
        for m in cons.consume(500, 0.5):
            if not m.error():
                out.append((m.partition(), m.offset(), m.value()))
    cons.close()
    return out


def _kafka_python(c, topic, acked, started):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    p = KafkaProducer(bootstrap_servers=c.bootstrap.split(","), acks="all", enable_idempotence=True, linger_ms=2,
                      retries=1000, retry_backoff_ms=100, request_timeout_ms=10000, metadata_max_age_ms=1000)

    futs = []
    for i in range(N):
        f = p.send(topic, value=b"k%d" % i, partition=i % PARTITIONS)
        futs.append((f, b"k%d" % i))
        if sum(1 for g, _ in futs if g.is_done) >= N // 3:
            started.set()
        time.sleep(0.01)
    p.flush(90)
    for f, v in futs:
        md = f.get(timeout=60)
        acked.append((md.partition, md.offset, v))
    started.set()
    p.close(5)
    cons = KafkaConsumer(bootstrap_servers=c.bootstrap.split(","), enable_auto_commit=False,
                         consumer_timeout_ms=2000)
    tps = [TopicPartition(topic, i) for i in range(PARTITIONS)]
    cons.assign(tps)
    cons.seek_to_beginning(*tps)
    out = []
    deadline = time.monotonic() + 60
    while len(out) < len(acked) and time.monotonic() < deadline:
        for tp, msgs in cons.poll(500).items():
            out.extend((m.partition, m.offset, m.value) for m in msgs)
    cons.close()
    return out


def _aiokafka(c, topic, acked, started):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    async def go():
        p = AIOKafkaProducer(bootstrap_servers=c.bootstrap, acks="all", enable_idempotence=True, linger_ms=2,
                             request_timeout_ms=10000, retry_backoff_ms=100, metadata_max_age_ms=1000)
        await p.start()
        try:
            futs = []
            for i in range(N):
                futs.append((await p.send(topic, value=b"a%d" % i, partition=i % PARTITIONS), b"a%d" % i))
                await asyncio.sleep(0.01)
                done = sum(1 for f, _ in futs if f.done())
                if done >= N // 3:
                    started.set()
            for f, v in futs:
                md = await asyncio.wait_for(f, 90)
                acked.append((md.partition, md.offset, v))
            started.set()
        finally:
            await p.stop()
        cons = AIOKafkaConsumer(bootstrap_servers=c.bootstrap, enable_auto_commit=False)
        await cons.start()
        try:
            tps = [TopicPartition(topic, i) for i in range(PARTITIONS)]
            cons.assign(tps)
            await cons.seek_to_beginning(*tps)
            out = []
            deadline = time.monotonic() + 60
            while len(out) < len(acked) and time.monotonic() < deadline:
                for tp, msgs in (await cons.getmany(timeout_ms=500)).items():
                    out.extend((m.partition, m.offset, m.value) for m in msgs)
            return out
        finally:
            await cons.stop()
    return asyncio.run(go())


@pytest.mark.parametrize("client", ["confluent", "kafka-python", "aiokafka"])
def test_produce_and_consume_through_a_leader_kill(cluster, client):
    c = cluster
    topic = f"clients-{client}"
    c.create_topic(topic, PARTITIONS, 3, configs={"min.insync.replicas": 2})
    acked, started, killed = [], threading.Event(), []
    nemesis = threading.Thread(target=_kill_leader_when, args=(c, topic, started, killed), daemon=True)
    nemesis.start()
    try:
        out = {"confluent": _confluent, "kafka-python": _kafka_python, "aiokafka": _aiokafka}[client](
            c, topic, acked, started)
    finally:
        started.set()
        nemesis.join(90)
        c.wait_ready(30)
    assert killed, "the leader was never killed"
    assert len(acked) == N
    assert len(out) == len(set(out)), "a record read twice"
    read = {(p, o): v for p, o, v in out}
    assert len({v for v in read.values()}) == len(read), "a value written twice"
    for p, o, v in acked:
        assert read.get((p, o)) == v, f"acknowledged {v!r} at {p}/{o}, read {read.get((p, o))!r}"


def test_a_group_keeps_consuming_through_its_coordinators_death(cluster):
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    c = cluster
    topic = "group-through-coordinator"
    c.create_topic(topic, 3, 3, configs={"min.insync.replicas": 2})
    p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 2})

    def produce(prefix, n):
        for i in range(n):
            p.produce(topic, value=b"%s%d" % (prefix, i), partition=i % 3)
        assert p.flush(60) == 0

    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "g-coord", "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                     "topic.metadata.refresh.interval.ms": 1000})
    seen = set()

    def consume_until(n, timeout_s):
        deadline = time.monotonic() + timeout_s
        while len(seen) < n and time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is not None and not m.error():
                seen.add(m.value())
                cons.commit(message=m, asynchronous=True)
        return len(seen)

    victim = None
    try:
        cons.subscribe([topic])
        produce(b"a", 60)
        assert consume_until(60, 60) == 60
        cons.commit(asynchronous=False)
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        desc = admin.describe_consumer_groups(["g-coord"])["g-coord"].result(15)
        victim = desc.coordinator.id
        assert victim in c.broker_ids
        # __consumer_offsets has 3 replicas by default (Kafka's offsets.topic.replication.factor)
        md = c.metadata("__consumer_offsets")
        assert all(len(r) == 3 for _, _, r, _, _ in md.values()), md
        c.kill(victim)
        produce(b"b", 60)
        assert consume_until(120, 60) == 120, "the group stopped consuming after its coordinator died"
        deadline = time.monotonic() + 30
        while True:      # the client finds the new coordinator (the new leader of the group's partition)
            try:
                cons.commit(asynchronous=False)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        committed = cons.committed([TopicPartition(topic, i) for i in range(3)], timeout=15)
        assert sum(tp.offset for tp in committed) == 120
        desc = admin.describe_consumer_groups(["g-coord"])["g-coord"].result(15)
        assert desc.coordinator.id != victim
    finally:
        cons.close()
        if victim is not None and c.pid(victim) is None:
            c.start(victim)
        c.wait_ready(30)

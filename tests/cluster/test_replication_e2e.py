"""Replication on a KRaft cluster of real ``kbroker serve`` processes (1 controller + 3
brokers), with unchanged clients:

- confluent-kafka, idempotent and acks=all, to a topic with RF 3 and min.insync.replicas=2:
  every replica ends with the same batches (offsets, CRCs, leader epochs, read from the
  segment files) and the same high watermark (replication-offset-checkpoint);
- the leader SIGKILLed while producing: the controller elects a new leader from the ISR, the
  producer (retries) carries on, a consumer reads every acknowledged record exactly once, in
  order; the killed broker restarts, catches up and rejoins the ISR;
- a follower SIGSTOPped: it leaves the ISR (replica.lag.time.max.ms, or its session expiring)
  and acks=all carries on with two replicas; SIGCONT: it catches up and rejoins;
- the ISR below min.insync.replicas: acks=all answers NOT_ENOUGH_REPLICAS (nothing appended),
  acks=1 still appends; once the follower is back, acks=all succeeds again.
"""
from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.kernels import records as rec
from kbroker.log.checkpoints import OffsetCheckpointFile
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.frames import decode_response, encode_request
from kbroker.protocol.messages import find_coordinator as fc, produce as pr
from kbroker.testing import KRaftControllerQuorum

FAST = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 600,
        "controller.quorum.election.backoff.max.ms": 300, "controller.quorum.request.timeout.ms": 600,
        "broker.session.timeout.ms": 3000, "broker.heartbeat.interval.ms": 300,
        "offsets.topic.num.partitions": 3, "offsets.topic.replication.factor": 3,
        "group.initial.rebalance.delay.ms": 0,
        "replica.lag.time.max.ms": 1500, "replica.fetch.backoff.ms": 100,
        "replica.high.watermark.checkpoint.interval.ms": 200}
BROKERS = [2, 3, 4]
_BATCH = struct.Struct(">qiiBI")     # base offset, length, partition leader epoch, magic, crc


def _wait(cond, timeout_s=30.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            v = cond()
        except (KafkaException, OSError, KeyError):
            v = None
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout_s}s")


def _partition(q, topic, port=None):
    bootstrap = q.bootstrap if port is None else f"127.0.0.1:{port}"
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=5)
    return md.topics[topic].partitions[0]


def _create(q, topic, min_isr=2):
    admin = AdminClient({"bootstrap.servers": q.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3,
                                  config={"min.insync.replicas": str(min_isr)})])[topic].result(15)
    return _wait(lambda: (lambda p: p if p.leader in BROKERS and sorted(p.isrs) == BROKERS else None)(
        _partition(q, topic)), what=f"{topic} led with a full ISR")


def _log_dir(q, broker, topic):
    return os.path.join(q.procs[broker].data_dir, "logs", f"{topic}-0")


def _batches(q, broker, topic):
    """[(base offset, last offset, leader epoch, crc)] of the complete batches in the
    partition's segment files (read directly, as kbroker dump-log does)."""
    d = _log_dir(q, broker, topic)
    out = []
    for name in sorted(f for f in os.listdir(d) if f.endswith(".log")):
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        pos = 0
        while pos + 61 <= len(data):
            base, length, epoch, _magic, crc = _BATCH.unpack_from(data, pos)
            if length <= 0 or pos + 12 + length > len(data):
                break
            last = base + struct.unpack_from(">i", data, pos + 23)[0]
            out.append((base, last, epoch, crc))
            pos += 12 + length
    return out


def _checkpointed_hw(q, broker, topic):
    path = os.path.join(q.procs[broker].data_dir, "logs", "replication-offset-checkpoint")
    return OffsetCheckpointFile(path).read().get((topic, 0))


def _same_logs(q, topic, end):
    """Every broker's log holds the same batches up to ``end`` and checkpointed ``end`` as
    its high watermark."""
    def converged():
        if any(_checkpointed_hw(q, b, topic) != end for b in BROKERS):
            return None
        logs = {b: _batches(q, b, topic) for b in BROKERS}
        if any(not lg or lg[-1][1] + 1 != end for lg in logs.values()):
            return None
        return logs if all(lg == logs[BROKERS[0]] for lg in logs.values()) else None
    return _wait(converged, 30, f"the three replicas of {topic} identical up to {end}")


def _raw_produce(port, topic, acks, values, timeout_ms=5000):
    batch = rec.encode_batch([(int(time.time() * 1000), None, v, []) for v in values])
    body = pr.ProduceRequest(transactional_id=None, acks=acks, timeout_ms=timeout_ms, topic_data=[
        pr.TopicProduceData(name=topic, partition_data=[pr.PartitionProduceData(index=0, records=batch)])])
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_ms / 1000 + 10) as s:
        s.sendall(encode_request(ApiKey.PRODUCE, 9, 7, "repl-test", body))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
    r = decode_response(buf[4:4 + int.from_bytes(buf[:4], "big")], ApiKey.PRODUCE, 9)[1]
    return r.responses[0].partition_responses[0]


def _find_coordinator(port, group):
    """The coordinator a broker names for ``group`` (FindCoordinator v3), -1 if none."""
    body = fc.FindCoordinatorRequest(key=group, key_type=0)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(encode_request(ApiKey.FIND_COORDINATOR, 3, 7, "repl-test", body))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
    r = decode_response(buf[4:4 + int.from_bytes(buf[:4], "big")], ApiKey.FIND_COORDINATOR, 3)[1]
    return r.node_id if r.error_code == ErrorCode.NONE else -1


def _consume_all(q, topic, n, group):
    c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    got = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            got.append((m.offset(), m.value()))
        # nothing more than what was asked for shows up
        extra_deadline = time.monotonic() + 1.0
        while time.monotonic() < extra_deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append((m.offset(), m.value()))
    finally:
        c.close()
    return got


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    q = KRaftControllerQuorum(str(tmp_path_factory.mktemp("repl")), n=1, overrides=FAST, brokers=3)
    try:
        q.start()
        _wait(lambda: sorted(AdminClient({"bootstrap.servers": q.bootstrap}).list_topics(timeout=5).brokers)
              == BROKERS, what="3 brokers unfenced")
        yield q
    finally:
        q.stop()


def _heal(q):
    """Every broker running (SIGCONT, restarted) and unfenced: tests leave the cluster whole."""
    for b in BROKERS:
        p = q.procs[b]
        if p.proc is None or p.proc.poll() is not None:
            p.start()
        else:
            os.kill(p.pid, signal.SIGCONT)
    _wait(lambda: sorted(AdminClient({"bootstrap.servers": q.bootstrap}).list_topics(timeout=5).brokers)
          == BROKERS, what="3 brokers unfenced")


def test_rf3_acks_all_replicates_identical_logs(cluster):
    q = cluster
    _create(q, "repl")
    p = Producer({"bootstrap.servers": q.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2})
    errors = []
    for i in range(3000):
        p.produce("repl", value=b"v%d" % i, on_delivery=lambda e, m: errors.append(e) if e else None)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert errors == []
    logs = _same_logs(q, "repl", 3000)
    assert len({e for _, _, e, _ in logs[BROKERS[0]]}) == 1      # one leader epoch, no truncation
    part = _partition(q, "repl")
    assert sorted(part.isrs) == BROKERS
    got = _consume_all(q, "repl", 3000, "g-repl")
    assert [v for _, v in got] == [b"v%d" % i for i in range(3000)]


def test_leader_sigkill_elects_a_new_leader_and_loses_no_acknowledged_record(cluster):
    q = cluster
    first = _create(q, "failover")
    victim = first.leader
    acked: list[tuple[int, bytes]] = []
    errors = []
    lock = threading.Lock()

    def delivered(err, msg):
        with lock:
            if err is not None:
                errors.append(err)
            else:
                acked.append((msg.offset(), msg.value()))

    p = Producer({"bootstrap.servers": q.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                  "message.timeout.ms": 60000, "retry.backoff.ms": 50, "topic.metadata.refresh.interval.ms": 500})
    n = 0

    def produce(count):
        nonlocal n
        for _ in range(count):
            p.produce("failover", value=b"f%d" % n, on_delivery=delivered)
            n += 1
        p.poll(0)

    produce(1000)
    assert p.flush(30) == 0
    produce(500)                  # in flight when the leader dies
    q.procs[victim].kill()
    for _ in range(10):           # and more while the controller fences it and elects another
        produce(100)
        time.sleep(0.1)
    assert p.flush(90) == 0
    assert errors == []
    assert len(acked) == n
    after = _wait(lambda: (lambda x: x if x.leader in BROKERS and x.leader != victim else None)(
        _partition(q, "failover", q.broker_ports[next(b for b in BROKERS if b != victim)])),
        what="a new leader")
    assert victim not in after.isrs

    # every acknowledged record once, at its acknowledged offset, in the producer's order
    got = _consume_all(q, "failover", n, "g-failover")
    assert sorted(acked) == got
    assert [v for _, v in got] == [b"f%d" % i for i in range(n)]

    # the killed broker restarts, truncates what it must, catches up and rejoins the ISR
    q.procs[victim].start()
    _wait(lambda: sorted(_partition(q, "failover").isrs) == BROKERS, 60, "the restarted broker back in the ISR")
    _same_logs(q, "failover", n)


def test_paused_follower_leaves_the_isr_and_rejoins(cluster):
    q = cluster
    _heal(q)
    part = _create(q, "pause")
    follower = next(b for b in part.replicas if b != part.leader)
    p = Producer({"bootstrap.servers": q.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2})
    errors = []
    for i in range(200):
        p.produce("pause", value=b"a%d" % i, on_delivery=lambda e, m: errors.append(e) if e else None)
    assert p.flush(30) == 0
    os.kill(q.procs[follower].pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        for i in range(200, 400):
            p.produce("pause", value=b"a%d" % i, on_delivery=lambda e, m: errors.append(e) if e else None)
        assert p.flush(60) == 0
        assert errors == []
        # the leader acted on the AlterPartition answer; the metadata record follows
        _wait(lambda: sorted(_partition(q, "pause", q.broker_ports[part.leader]).isrs)
              == sorted(b for b in BROKERS if b != follower), 10, "the shrunk ISR published")
        assert time.monotonic() - t0 < 30
    finally:
        os.kill(q.procs[follower].pid, signal.SIGCONT)
    _wait(lambda: sorted(_partition(q, "pause").isrs) == BROKERS, 60, "the paused follower back in the ISR")
    _same_logs(q, "pause", 400)


def test_isr_below_min_insync_answers_not_enough_replicas(cluster):
    q = cluster
    _heal(q)
    part = _create(q, "minisr", min_isr=3)
    leader_port = q.broker_ports[part.leader]
    # the leader may learn of its leadership a moment after the broker that answered Metadata
    r = _wait(lambda: (lambda r: r if r.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER else None)(
        _raw_produce(leader_port, "minisr", -1, [b"ok0"])), 10, "the leader serving")
    assert (r.error_code, r.base_offset) == (ErrorCode.NONE, 0)
    follower = next(b for b in part.replicas if b != part.leader)
    os.kill(q.procs[follower].pid, signal.SIGSTOP)
    try:
        _wait(lambda: follower not in _partition(q, "minisr", leader_port).isrs, 30, "the ISR shrunk")
        r = _raw_produce(leader_port, "minisr", -1, [b"refused"])
        assert r.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
        r = _raw_produce(leader_port, "minisr", 1, [b"acks1"])
        assert (r.error_code, r.base_offset) == (ErrorCode.NONE, 1)     # nothing of the refused batch
    finally:
        os.kill(q.procs[follower].pid, signal.SIGCONT)
    _wait(lambda: sorted(_partition(q, "minisr", leader_port).isrs) == BROKERS, 60, "the follower back in the ISR")
    # the leader acts on the ISR the controller committed (its AlterPartition answer or the
    # metadata record, whichever reaches it first; the handler view may be a moment ahead)
    r = _wait(lambda: (lambda r: r if r.error_code != ErrorCode.NOT_ENOUGH_REPLICAS else None)(
        _raw_produce(leader_port, "minisr", -1, [b"ok2"])), 10, "acks=all accepted again")
    assert (r.error_code, r.base_offset) == (ErrorCode.NONE, 2)
    _same_logs(q, "minisr", 3)


def test_controlled_shutdown_moves_leadership_without_failed_sends(cluster):
    """SIGTERM to the leader: the controller moves leadership to an ISR member before the
    broker stops (controlled shutdown), so an idempotent acks=all producer sees no error."""
    q = cluster
    _heal(q)
    first = _create(q, "graceful")
    victim = first.leader
    errors, acked = [], []

    def delivered(err, msg):
        (errors.append(err) if err is not None else acked.append((msg.offset(), msg.value())))

    p = Producer({"bootstrap.servers": q.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                  "retry.backoff.ms": 50, "topic.metadata.refresh.interval.ms": 500})
    n = 0
    for _ in range(5):
        for _ in range(100):
            p.produce("graceful", value=b"g%d" % n, on_delivery=delivered)
            n += 1
        p.poll(0.05)
    q.procs[victim].proc.send_signal(signal.SIGTERM)
    for _ in range(20):
        for _ in range(100):
            p.produce("graceful", value=b"g%d" % n, on_delivery=delivered)
            n += 1
        p.poll(0.1)
    assert p.flush(60) == 0
    assert q.procs[victim].proc.wait(30) == 0            # exited cleanly (no second SIGTERM)
    q.procs[victim].terminate()                          # reaped
    assert errors == []
    moved = _partition(q, "graceful")
    assert moved.leader in BROKERS and moved.leader != victim
    got = _consume_all(q, "graceful", n, "g-graceful")
    assert sorted(acked) == got and [v for _, v in got] == [b"g%d" % i for i in range(n)]
    q.procs[victim].start()
    _wait(lambda: sorted(_partition(q, "graceful").isrs) == BROKERS, 60, "the restarted broker back in the ISR")


def test_consumer_group_survives_its_coordinators_death(cluster):
    """__consumer_offsets has 3 replicas: when the coordinator's broker is SIGKILLed, the
    new leader of the group's offsets partition loads the group, and the group's committed
    offsets survive."""
    q = cluster
    _heal(q)
    _create(q, "grp")
    p = Producer({"bootstrap.servers": q.bootstrap, "enable.idempotence": True, "acks": "all"})
    for i in range(400):
        p.produce("grp", value=b"c%d" % i)
    assert p.flush(30) == 0

    def consumer():
        c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": "g-coord", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        c.subscribe(["grp"])
        return c

    def take(c, count):
        got = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
        return got

    c = consumer()
    try:
        first = take(c, 200)
        assert first == [b"c%d" % i for i in range(200)]
        c.commit(asynchronous=False)
    finally:
        c.close()
    coordinator = _find_coordinator(q.broker_ports[BROKERS[0]], "g-coord")
    assert coordinator in BROKERS
    q.procs[coordinator].kill()
    alive = next(b for b in BROKERS if b != coordinator)
    try:
        _wait(lambda: _find_coordinator(q.broker_ports[alive], "g-coord") not in (-1, coordinator), 60,
              "another coordinator")
        c = consumer()
        try:
            rest = take(c, 200)
            assert rest == [b"c%d" % i for i in range(200, 400)]     # resumed at the committed offset
            c.commit(asynchronous=False)
            committed = c.committed([TopicPartition("grp", 0)], timeout=10)
            assert committed[0].offset == 400
        finally:
            c.close()
    finally:
        q.procs[coordinator].start()


def test_offsets_topic_created_while_a_broker_is_down_keeps_its_replication_factor(tmp_path):
    """__consumer_offsets is created on the first FindCoordinator, here while one of the 3
    registered brokers is down: it gets offsets.topic.replication.factor replicas (3, the
    default) all the same, one on the broker that is down, as Kafka's controller places
    them; the group gets its coordinator, and the broker, once back, joins every ISR.
    (It was clamped to the 2 alive brokers, for good.)"""
    overrides = {k: v for k, v in FAST.items() if k != "offsets.topic.replication.factor"}
    q = KRaftControllerQuorum(str(tmp_path), n=1, overrides=overrides, brokers=3)
    try:
        q.start()
        brokers = lambda: sorted(AdminClient({"bootstrap.servers": q.bootstrap}).list_topics(timeout=5).brokers)
        _wait(lambda: brokers() == BROKERS, what="3 brokers unfenced")
        down = BROKERS[2]
        q.procs[down].kill()
        _wait(lambda: brokers() == BROKERS[:2], what="the killed broker fenced")
        _wait(lambda: _find_coordinator(q.broker_ports[BROKERS[0]], "g-down") in BROKERS[:2], 60,
              "a coordinator")
        md = AdminClient({"bootstrap.servers": q.bootstrap}).list_topics("__consumer_offsets", timeout=5)
        parts = md.topics["__consumer_offsets"].partitions
        assert len(parts) == 3
        assert all(sorted(p.replicas) == BROKERS for p in parts.values()), \
            {i: p.replicas for i, p in parts.items()}
        q.procs[down].start()

        def full_isr():
            md = AdminClient({"bootstrap.servers": q.bootstrap}).list_topics("__consumer_offsets", timeout=5)
            return all(sorted(p.isrs) == BROKERS for p in md.topics["__consumer_offsets"].partitions.values())
        _wait(full_isr, 60, "the returned broker in every ISR")
    finally:
        q.stop()

"""Transactions end to end with confluent-kafka (librdkafka), kafka-python and aiokafka: the
coordinator (EndTxn, markers over the wire) and the partition leaders (WriteTxnMarkers, LSO,
read_committed) together.
"""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.broker.kafka_helpers import create_topic
from tests.broker.raw_client import RawClient

from kbroker.protocol import ApiKey as K, ErrorCode as E
from kbroker.protocol.messages import describe_transactions as dtx


def _producer(broker, tid, **kw):
    conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": tid, "linger.ms": 5,
            "transaction.timeout.ms": 30000}
    conf.update(kw)
    p = Producer(conf)
    p.init_transactions(30)
    return p


def _consume_all(broker, topic, partitions, isolation, expect_at_least=0, timeout_s=20, idle_s=1.5):
    """Every value readable from the beginning with ``isolation``; stops once it has at least
    ``expect_at_least`` values and nothing new came for ``idle_s``."""
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "e2e-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                if len(out) >= expect_at_least and time.monotonic() - last > idle_s:
                    break
                continue
            assert m.error() is None, m.error()
            out.append(m.value())
            last = time.monotonic()
    finally:
        c.close()
    return out


def _describe(broker, tid):
    with RawClient(broker.port) as c:
        (d,) = c.call(K.DESCRIBE_TRANSACTIONS, 0, dtx.DescribeTransactionsRequest(transactional_ids=[tid])
                      ).transaction_states
    return d


def _wait_state(broker, tid, state, timeout_s=15):
    deadline = time.monotonic() + timeout_s
    d = _describe(broker, tid)
    while d.transaction_state != state and time.monotonic() < deadline:
        time.sleep(0.05)
        d = _describe(broker, tid)
    assert d.transaction_state == state, d
    return d


def test_commit_and_abort_seen_by_read_committed(broker):
    topic = "e2e-tx-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, topic, partitions=2)
    tid = "e2e-" + uuid.uuid4().hex[:6]
    p = _producer(broker, tid)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=b"c%d" % i, partition=i % 2)
    p.commit_transaction(30)
    _wait_state(broker, tid, "CompleteCommit")
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=b"a%d" % i, partition=i % 2)
    p.flush(30)
    p.abort_transaction(30)
    _wait_state(broker, tid, "CompleteAbort")
    p.begin_transaction()
    p.produce(topic, value=b"last", partition=0)
    p.commit_transaction(30)

    committed = _consume_all(broker, topic, 2, "read_committed", expect_at_least=11)
    assert sorted(committed) == sorted([b"c%d" % i for i in range(10)] + [b"last"])
    everything = _consume_all(broker, topic, 2, "read_uncommitted", expect_at_least=16)
    assert sorted(everything) == sorted([b"c%d" % i for i in range(10)] + [b"a%d" % i for i in range(5)]
                                        + [b"last"])


def test_open_transaction_holds_read_committed_back_and_fencing_aborts_it(broker):
    topic = "e2e-open-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, topic, partitions=1)
    tid = "e2e-" + uuid.uuid4().hex[:6]
    p1 = _producer(broker, tid)
    p1.begin_transaction()
    p1.produce(topic, value=b"open", partition=0)
    p1.flush(30)
    assert _consume_all(broker, topic, 1, "read_committed", idle_s=1.0, timeout_s=5) == []
    p2 = _producer(broker, tid)         # fences p1: its transaction is aborted by the coordinator
    d = _wait_state(broker, tid, "Empty")
    assert d.producer_epoch >= 2
    with pytest.raises(KafkaException):
        p1.commit_transaction(10)
    p2.begin_transaction()
    p2.produce(topic, value=b"p2", partition=0)
    p2.commit_transaction(30)
    assert _consume_all(broker, topic, 1, "read_committed", expect_at_least=1) == [b"p2"]


def test_send_offsets_to_transaction_commits_with_the_transaction(broker):
    """Consume-transform-produce: the group's offsets become visible only when the
    transaction commits (TxnOffsetCommit + the COMMIT marker on __consumer_offsets)."""
    src = "e2e-src-" + uuid.uuid4().hex[:8]
    dst = "e2e-dst-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, src, partitions=1)
    create_topic(broker.bootstrap, dst, partitions=1)
    feed = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(6):
        feed.produce(src, value=b"in%d" % i, partition=0)
    assert feed.flush(30) == 0
    group = "e2e-g-" + uuid.uuid4().hex[:6]
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.assign([TopicPartition(src, 0, 0)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 6 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m)
    assert len(got) == 6
    p = _producer(broker, "e2e-ctp-" + uuid.uuid4().hex[:6])

    def copy(msgs, commit):
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, value=m.value().replace(b"in", b"out"), partition=0)
        p.send_offsets_to_transaction([TopicPartition(src, 0, msgs[-1].offset() + 1)],
                                      c.consumer_group_metadata(), 30)
        (p.commit_transaction if commit else p.abort_transaction)(30)

    def committed():
        (tp,) = c.committed([TopicPartition(src, 0)], timeout=15)
        return tp.offset

    copy(got[:3], commit=True)
    assert committed() == 3
    copy(got[3:], commit=False)                  # aborted: neither the output nor the offsets
    assert committed() == 3
    copy(got[3:], commit=True)
    assert committed() == 6
    c.close()
    out = _consume_all(broker, dst, 1, "read_committed", expect_at_least=6)
    assert out == [b"out%d" % i for i in range(6)]


def test_transactions_across_a_restart(fresh_broker):
    """The coordinator reloads __transaction_state (its epoch is the partition's leader
    epoch, so the leaders accept its markers after the restart) and an open transaction
    left by the old process is aborted when its producer comes back."""
    b = fresh_broker()
    topic = "e2e-rs-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic, partitions=1)
    tid = "e2e-rs-" + uuid.uuid4().hex[:6]
    p = _producer(b, tid)
    p.begin_transaction()
    p.produce(topic, value=b"one", partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, value=b"left-open", partition=0)
    p.flush(30)
    assert b.terminate() == 0
    b2 = fresh_broker()
    p2 = _producer(b2, tid)                  # fences and aborts the open transaction
    p2.begin_transaction()
    p2.produce(topic, value=b"two", partition=0)
    p2.commit_transaction(30)
    assert _consume_all(b2, topic, 1, "read_committed", expect_at_least=2) == [b"one", b"two"]


def test_offsets_of_every_transaction_are_in_the_log_after_a_restart(fresh_broker):
    """Each TxnOffsetCommit of a producer is written (the group coordinator's batches are
    COORDINATOR appends, whose sequences the log does not check, as in Kafka): before,
    the second transaction's batch — same producer epoch, sequence 0 again — was taken
    for a retry of the first and dropped, so its offsets were lost on restart."""
    b = fresh_broker()
    src = "e2e-oc-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, src, partitions=2)
    group = "e2e-oc-" + uuid.uuid4().hex[:6]
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False})
    p = _producer(b, "e2e-oc-" + uuid.uuid4().hex[:6])
    for offset in (3, 5, 8):   # three transactions, each committing the same two partitions
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition(src, 0, offset), TopicPartition(src, 1, offset + 1)],
                                      c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
    c.close()
    assert b.terminate() == 0
    b2 = fresh_broker()
    c2 = Consumer({"bootstrap.servers": b2.bootstrap, "group.id": group, "enable.auto.commit": False})
    deadline = time.monotonic() + 20
    while True:
        try:
            got = [tp.offset for tp in c2.committed([TopicPartition(src, 0), TopicPartition(src, 1)], timeout=10)]
            break
        except KafkaException:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    c2.close()
    assert got == [8, 9]


def test_kafka_python_transactions(broker):
    from kafka import KafkaProducer

    topic = "e2e-kp-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, topic, partitions=1)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="e2e-kp-" + uuid.uuid4().hex[:6])
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"kp-commit", partition=0)
    p.commit_transaction()
    p.begin_transaction()
    p.send(topic, b"kp-abort", partition=0)
    p.flush()
    p.abort_transaction()
    p.close(timeout=10)
    assert _consume_all(broker, topic, 1, "read_committed", expect_at_least=1) == [b"kp-commit"]


def test_aiokafka_transactions(broker):
    import asyncio

    from aiokafka import AIOKafkaProducer

    topic = "e2e-aio-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, topic, partitions=1)

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="e2e-aio-" + uuid.uuid4().hex[:6])
        await asyncio.wait_for(p.start(), 30)
        try:
            async with p.transaction():
                await p.send_and_wait(topic, b"aio-commit", partition=0)
            await p.begin_transaction()
            await p.send_and_wait(topic, b"aio-abort", partition=0)
            await p.abort_transaction()
        finally:
            await asyncio.wait_for(p.stop(), 10)

    asyncio.run(run())
    assert _consume_all(broker, topic, 1, "read_committed", expect_at_least=1) == [b"aio-commit"]

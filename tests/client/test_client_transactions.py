"""kbroker.client transactions against a real broker: commit and abort across partitions
(read back with our read_committed consumer and with librdkafka's), consume-transform-
produce with send_offsets_to_transaction, and fencing by a newer producer with the same
transactional.id."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer as CkConsumer, TopicPartition as CkTP

from kbroker.client import errors as E
from kbroker.client.consumer.consumer import Consumer
from kbroker.client.metadata import TopicPartition
from kbroker.client.producer.producer import Producer
from kbroker.testing import KBrokerProcess
from tests.broker.kafka_helpers import create_topic


@pytest.fixture(scope="module")
def broker():
    b = KBrokerProcess(overrides={"num.partitions": 2, "group.initial.rebalance.delay.ms": 0,
                                  "transaction.state.log.num.partitions": 4}).start()
    yield b
    b.__exit__(None, None, None)


def _read(bootstrap, topic, isolation, n_partitions=2):
    c = CkConsumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                    "isolation.level": isolation, "enable.auto.commit": False})
    c.assign([CkTP(topic, p, 0) for p in range(n_partitions)])
    out = []
    idle = 0
    while idle < 3:
        ms = c.consume(500, 1.0)
        if not ms:
            idle += 1
            continue
        out += [m.value() for m in ms if not m.error()]
    c.close()
    return sorted(out)


def _tx_producer(bootstrap, tid):
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 1,
                     "transaction.timeout.ms": 30000})


def test_commit_and_abort_are_atomic_across_partitions(broker):
    topic = f"tx-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    p = _tx_producer(broker.bootstrap, f"tid-{uuid.uuid4().hex[:6]}")
    try:
        p.init_transactions(30)
        # the broker finalizes transaction.version 2: no AddPartitionsToTxn, an epoch per transaction
        assert p._txn.transaction_v2
        epoch = p._txn.producer_epoch
        p.begin_transaction()
        for i in range(10):
            p.send(topic, value=b"c%d" % i, partition=i % 2)
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(6):
            p.send(topic, value=b"a%d" % i, partition=i % 2)
        p.flush(30)
        p.abort_transaction(30)
        p.begin_transaction()
        p.send(topic, value=b"c-last", partition=1)
        p.commit_transaction(30)
        p.begin_transaction()              # an empty transaction commits (nothing at the coordinator)
        p.commit_transaction(30)
        p.begin_transaction()
        p.abort_transaction(30)
        assert p._txn.producer_epoch == epoch + 3
    finally:
        p.close()
    committed = sorted([b"c%d" % i for i in range(10)] + [b"c-last"])
    assert _read(broker.bootstrap, topic, "read_committed") == committed
    assert len(_read(broker.bootstrap, topic, "read_uncommitted")) == 17
    ours = Consumer({"bootstrap.servers": broker.bootstrap, "isolation.level": "read_committed"})
    try:
        ours.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        ours.seek_to_beginning()
        got = []
        for _ in range(20):
            got += [r.value for r in ours.poll(1.0)]
            if len(got) >= len(committed):
                break
        assert sorted(got) == committed
    finally:
        ours.close()


def test_consume_transform_produce_commits_offsets_with_the_output(broker):
    src, dst = f"in-{uuid.uuid4().hex[:6]}", f"out-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, src, partitions=1)
    create_topic(broker.bootstrap, dst, partitions=1)
    seed = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        seed.send(src, value=b"%d" % i)
    seed.close()
    group = f"g-{uuid.uuid4().hex[:6]}"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    p = _tx_producer(broker.bootstrap, f"copier-{uuid.uuid4().hex[:6]}")
    try:
        c.subscribe([src])
        p.init_transactions(30)
        copied = 0
        for _ in range(30):
            recs = list(c.poll(1.0))
            if not recs:
                if copied >= 20:
                    break
                continue
            p.begin_transaction()
            for r in recs:
                p.send(dst, value=r.value.upper() if r.value else r.value)
            last = recs[-1]
            p.send_offsets_to_transaction({TopicPartition(src, 0): last.offset + 1}, c.group_metadata(), 30)
            p.commit_transaction(30)
            copied += len(recs)
        assert copied == 20
        committed = c.committed([TopicPartition(src, 0)])
        assert committed[TopicPartition(src, 0)].offset == 20
    finally:
        p.close()
        c.close()
    assert _read(broker.bootstrap, dst, "read_committed", 1) == sorted(b"%d" % i for i in range(20))


def test_a_newer_producer_fences_the_older_one(broker):
    topic = f"fence-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, partitions=1)
    tid = f"z-{uuid.uuid4().hex[:6]}"
    old = _tx_producer(broker.bootstrap, tid)
    new = _tx_producer(broker.bootstrap, tid)
    try:
        old.init_transactions(30)
        old.begin_transaction()
        old.send(topic, value=b"zombie", partition=0)
        old.flush(30)
        new.init_transactions(30)           # aborts the old producer's open transaction
        new.begin_transaction()
        new.send(topic, value=b"live", partition=0)
        new.commit_transaction(30)
        with pytest.raises(E.KafkaError):
            old.commit_transaction(30)
    finally:
        old.close()
        new.close()
    assert _read(broker.bootstrap, topic, "read_committed", 1) == [b"live"]

"""The Jepsen transaction anomalies (issue 17): a request of transaction T1 held in a
fault-injecting proxy and released after T2 began must not commit, abort or tear T2.
Unchanged librdkafka (confluent-kafka) producers behind a ``FaultProxy(framed=True)`` in
front of one kbroker node; the outcome is read back with read_committed and
read_uncommitted consumers."""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from kbroker.chaos.proxy import FaultProxy
from kbroker.protocol import ApiKey
from kbroker.testing import KBrokerProcess
from tests.broker.kafka_helpers import create_topic


@pytest.fixture
def proxied(tmp_path, request):
    """(proxy, broker); parametrized indirectly with extra broker overrides."""
    proxy = FaultProxy(framed=True).start()
    b = KBrokerProcess(data_dir=str(tmp_path),
                       overrides={"advertised.listeners": f"PLAINTEXT://{proxy.bootstrap}",
                                  "transaction.state.log.num.partitions": 1, **getattr(request, "param", {})})
    proxy.upstream_port = b.port
    b.start()
    try:
        yield proxy, b
    finally:
        proxy.stop()
        b.cleanup()


def _producer(proxy, tid, **kw):
    conf = {"bootstrap.servers": proxy.bootstrap, "transactional.id": tid, "linger.ms": 0,
            "transaction.timeout.ms": 60000, "request.timeout.ms": 1500, "message.timeout.ms": 4000,
            "socket.timeout.ms": 1500, **kw}
    p = Producer(conf)
    p.init_transactions(30)
    return p


def _read(bootstrap, topic, partitions, isolation, expect, timeout_s=20):
    """Every value of ``topic`` read with ``isolation`` up to the end (the consumer reaches
    each partition's end: a hanging transaction would stop read_committed short)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g-" + uuid.uuid4().hex, "enable.auto.commit": False,
                  "isolation.level": isolation, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out, eof = [], set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                eof.add(m.partition())
                if len(eof) == partitions and len(out) >= expect:
                    break
                continue
            out.append((m.partition(), m.value()))
    finally:
        c.close()
    return sorted(out)


def _wait(cond, what, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_late_produce_of_an_aborted_transaction_is_not_part_of_the_next(proxied):
    """(a) T1's Produce to p0 is held; its batch times out, T1 is aborted (librdkafka bumps
    the epoch), T2 writes to p1, then the held Produce arrives: it must not join T2 (the
    coordinator's KIP-890 verification refuses it), nor hang p0's last stable offset."""
    proxy, broker = proxied
    topic = "late-produce"
    create_topic(proxy.bootstrap, topic, partitions=2)
    p = _producer(proxy, "txn-a")
    proxy.hold_requests(ApiKey.PRODUCE)
    p.begin_transaction()
    p.produce(topic, b"t1", partition=0)
    _wait(lambda: proxy.held_requests >= 1, "T1's produce never reached the proxy")
    with pytest.raises(KafkaException) as exc:
        p.commit_transaction(20)
    assert exc.value.args[0].txn_requires_abort(), exc.value
    proxy.stop_holding()
    p.abort_transaction(20)
    p.begin_transaction()
    p.produce(topic, b"t2-p1", partition=1)
    p.flush(10)
    proxy.release()
    _wait(lambda: proxy.released_replies >= 1, "the held produce was never answered")
    p.produce(topic, b"t2-p0", partition=0)
    p.commit_transaction(20)
    p.flush(5)
    assert _read(proxy.bootstrap, topic, 2, "read_committed", 2) == [(0, b"t2-p0"), (1, b"t2-p1")]
    assert _read(proxy.bootstrap, topic, 2, "read_uncommitted", 2) == [(0, b"t2-p0"), (1, b"t2-p1")]


def test_late_end_txn_of_a_committed_transaction_does_not_end_the_next(proxied):
    """(b) T1's EndTxn(commit) is held; librdkafka times it out and retries, T1 commits;
    T2 begins, the held EndTxn arrives (a retry of a completed commit: a no-op), then T2
    writes and aborts: T2 must stay aborted. (Released after T2 added a partition, the late
    EndTxn of transaction version 1 has T2's epoch and would commit T2: Kafka's anomaly too,
    which transaction version 2's epoch bump per transaction closes.)"""
    proxy, broker = proxied
    topic = "late-end-txn"
    create_topic(proxy.bootstrap, topic, partitions=1)
    p = _producer(proxy, "txn-b")
    p.begin_transaction()
    p.produce(topic, b"t1", partition=0)
    p.flush(10)
    proxy.hold_requests(ApiKey.END_TXN)
    committed = []

    t = threading.Thread(target=lambda: committed.append(p.commit_transaction(30)))
    t.start()
    _wait(lambda: proxy.held_requests >= 1, "T1's EndTxn was never held")
    proxy.stop_holding()
    t.join(40)
    assert committed == [None]
    p.begin_transaction()
    proxy.release()
    _wait(lambda: proxy.released_replies >= 1, "the held EndTxn was never answered")
    p.produce(topic, b"t2", partition=0)
    p.flush(10)
    p.abort_transaction(20)
    assert _read(proxy.bootstrap, topic, 1, "read_committed", 1) == [(0, b"t1")]
    p.begin_transaction()
    p.produce(topic, b"t3", partition=0)
    p.commit_transaction(20)
    assert _read(proxy.bootstrap, topic, 1, "read_committed", 2) == [(0, b"t1"), (0, b"t3")]


def test_late_add_partitions_of_an_earlier_transaction_does_not_tear_the_next(proxied):
    """(c) T1's AddPartitionsToTxn(p0) is held; librdkafka retries it, T1 commits its p0
    record; T2 writes to p1, the held AddPartitionsToTxn arrives (it adds p0 to T2: a
    marker without data there), T2 aborts: p1's record stays invisible, p0's committed,
    and neither partition's last stable offset hangs."""
    proxy, broker = proxied
    topic = "late-add"
    create_topic(proxy.bootstrap, topic, partitions=2)
    p = _producer(proxy, "txn-c")
    p.begin_transaction()
    proxy.hold_requests(ApiKey.ADD_PARTITIONS_TO_TXN)
    p.produce(topic, b"t1-p0", partition=0)
    _wait(lambda: proxy.held_requests >= 1, "T1's AddPartitionsToTxn was never held")
    proxy.stop_holding()
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, b"t2-p1", partition=1)
    p.flush(10)
    proxy.release()
    _wait(lambda: proxy.released_replies >= 1, "the held AddPartitionsToTxn was never answered")
    p.abort_transaction(20)
    assert _read(proxy.bootstrap, topic, 2, "read_committed", 1) == [(0, b"t1-p0")]
    p.begin_transaction()
    p.produce(topic, b"t3-p0", partition=0)
    p.commit_transaction(20)
    assert _read(proxy.bootstrap, topic, 2, "read_committed", 2) == [(0, b"t1-p0"), (0, b"t3-p0")]


# -- transaction version 2 (KIP-890 part 2): kbroker's own producer, which speaks it --------------

def _tv2_producer(proxy, tid):
    from kbroker.client.producer.producer import Producer as OurProducer
    p = OurProducer({"bootstrap.servers": proxy.bootstrap, "transactional.id": tid, "linger.ms": 0,
                     "request.timeout.ms": 1500, "delivery.timeout.ms": 3000, "transaction.timeout.ms": 60000})
    p.init_transactions(30)
    assert p._txn.transaction_v2
    return p


def test_tv2_late_end_txn_is_fenced_after_the_next_transaction_added_a_partition(proxied):
    """(b) with transaction version 2, released after T2 wrote (the case version 1 cannot
    protect): the late EndTxn(commit) of T1 has T1's epoch, T2 runs at the bumped one, so
    the late commit is fenced and T2 ends as the producer decides (aborted)."""
    proxy, broker = proxied
    topic = "tv2-late-end-txn"
    create_topic(proxy.bootstrap, topic, partitions=1)
    p = _tv2_producer(proxy, "txn-tv2-b")
    try:
        p.begin_transaction()
        p.send(topic, value=b"t1", partition=0).get(10)
        proxy.hold_requests(ApiKey.END_TXN)
        committed = []
        t = threading.Thread(target=lambda: committed.append(p.commit_transaction(30)))
        t.start()
        _wait(lambda: proxy.held_requests >= 1, "T1's EndTxn was never held")
        proxy.stop_holding()          # the retry, on a new connection, commits T1
        t.join(40)
        assert committed == [None]
        p.begin_transaction()
        p.send(topic, value=b"t2", partition=0).get(10)     # T2 is Ongoing at the coordinator
        proxy.release()
        _wait(lambda: proxy.released_replies >= 1, "the held EndTxn was never answered")
        p.abort_transaction(20)
        assert _read(proxy.bootstrap, topic, 1, "read_committed", 1) == [(0, b"t1")]
        p.begin_transaction()
        p.send(topic, value=b"t3", partition=0)
        p.commit_transaction(20)
    finally:
        p.close()
    assert _read(proxy.bootstrap, topic, 1, "read_committed", 2) == [(0, b"t1"), (0, b"t3")]


@pytest.mark.parametrize("proxied", [{"transaction.partition.verification.enable": False}], indirect=True)
def test_tv2_late_produce_of_an_aborted_transaction_is_fenced(proxied):
    """(a) with transaction version 2 and verification off (version 2 adds partitions
    regardless): T1's produce never arrives in time, so T1 cannot commit; it is aborted (the
    coordinator never saw it: an empty abort, which still bumps the epoch), T2 writes, then
    T1's produce arrives with the old epoch and is refused."""
    proxy, broker = proxied
    topic = "tv2-late-produce"
    create_topic(proxy.bootstrap, topic, partitions=2)
    p = _tv2_producer(proxy, "txn-tv2-a")
    try:
        proxy.hold_requests(ApiKey.PRODUCE)
        p.begin_transaction()
        fut = p.send(topic, value=b"t1", partition=0)
        _wait(lambda: proxy.held_requests >= 1, "T1's produce never reached the proxy")
        with pytest.raises(Exception):
            fut.get(20)                            # delivery.timeout.ms
        proxy.stop_holding()
        with pytest.raises(Exception, match="a batch of the transaction failed"):
            p.commit_transaction(20)               # a failed batch leaves only the abort
        p.abort_transaction(20)
        p.begin_transaction()
        p.send(topic, value=b"t2-p1", partition=1).get(10)
        proxy.release()
        _wait(lambda: proxy.released_replies >= 1, "the held produce was never answered")
        p.send(topic, value=b"t2-p0", partition=0).get(10)
        p.commit_transaction(20)
    finally:
        p.close()
    assert _read(proxy.bootstrap, topic, 2, "read_committed", 2) == [(0, b"t2-p0"), (1, b"t2-p1")]
    assert _read(proxy.bootstrap, topic, 2, "read_uncommitted", 2) == [(0, b"t2-p0"), (1, b"t2-p1")]

"""Transactions on a KRaft cluster of real processes (1 controller + 3 brokers), topics of
RF 1 spread over the brokers: ``__transaction_state`` created through the controller on
the first FindCoordinator(TRANSACTION) and each partition loaded by the broker that leads
it; producer ids from controller-allocated blocks; COMMIT/ABORT markers sent over the wire
to the partition leaders on the other brokers; KIP-890 verification of produce and
TxnOffsetCommit asked of the coordinator on another broker. confluent-kafka commits and
aborts, a read_committed consumer sees exactly the committed records, and a
consume-transform-produce copier (send_offsets_to_transaction) copies every input record
exactly once."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import find_coordinator as fc
from kbroker.testing import KRaftControllerQuorum
from tests.cluster.test_kraft_data_plane import BROKERS, FAST, _leaders, _metadata, _raw, _wait

TXN = {**FAST, "transaction.state.log.num.partitions": 6, "transaction.state.log.replication.factor": 1}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    q = KRaftControllerQuorum(str(tmp_path_factory.mktemp("kraft-txn")), n=1, overrides=TXN, brokers=3)
    try:
        q.start()
        _wait(lambda: sorted(_metadata(q).brokers) == BROKERS, what="3 brokers unfenced")
        yield q
    finally:
        q.stop()


def _spread_topic(q, name, partitions=3):
    """A topic of RF 1 whose partitions the controller placed on different brokers."""
    admin = AdminClient({"bootstrap.servers": q.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(15)
    port = q.broker_ports[BROKERS[0]]
    leaders = _wait(lambda: (lambda ls: ls if len(ls) == partitions and all(l >= 0 for l, _ in ls.values())
                             else None)(_leaders(port, name)), what=f"{name} leaders")
    assert len({l for l, _ in leaders.values()}) > 1, leaders
    return leaders


def _producer(q, tid):
    p = Producer({"bootstrap.servers": q.bootstrap, "transactional.id": tid, "linger.ms": 5,
                  "transaction.timeout.ms": 30000})
    p.init_transactions(60)
    return p


def _read(q, topic, partitions, isolation, expect, timeout_s=30, idle_s=1.5):
    c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": "r-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "isolation.level": isolation})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                if len(out) >= expect and time.monotonic() - last > idle_s:
                    break
                continue
            assert m.error() is None, m.error()
            out.append(m.value())
            last = time.monotonic()
    finally:
        c.close()
    return out


def _coordinator(q, tid):
    r = _raw(q.broker_ports[BROKERS[0]], ApiKey.FIND_COORDINATOR, 4,
             fc.FindCoordinatorRequest(key_type=1, coordinator_keys=[tid]))
    (c,) = r.coordinators
    return c.error_code, c.node_id


def test_commit_abort_and_read_committed(cluster):
    q = cluster
    topic = "kt-" + uuid.uuid4().hex[:6]
    _spread_topic(q, topic)
    tid = "kt-" + uuid.uuid4().hex[:6]
    p = _producer(q, tid)
    err, node = _coordinator(q, tid)
    assert err == ErrorCode.NONE and node in BROKERS
    for tag, commit in ((b"c", True), (b"a", False), (b"d", True)):
        p.begin_transaction()
        for i in range(30):
            p.produce(topic, value=tag + b"%d" % i, partition=i % 3)
        assert p.flush(30) == 0   # written before the abort (which would drop what is still queued)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    committed = _read(q, topic, 3, "read_committed", expect=60)
    assert sorted(committed) == sorted([b"c%d" % i for i in range(30)] + [b"d%d" % i for i in range(30)])
    assert len(_read(q, topic, 3, "read_uncommitted", expect=90)) == 90


def test_consume_transform_produce_copies_exactly_once(cluster):
    q = cluster
    src, dst = "kin-" + uuid.uuid4().hex[:6], "kout-" + uuid.uuid4().hex[:6]
    _spread_topic(q, src)
    _spread_topic(q, dst)
    feed = Producer({"bootstrap.servers": q.bootstrap, "linger.ms": 5})
    n = 90
    for i in range(n):
        feed.produce(src, value=b"in%d" % i, partition=i % 3)
    assert feed.flush(30) == 0
    group = "copier-" + uuid.uuid4().hex[:6]
    c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe([src])
    p = _producer(q, "copier-" + uuid.uuid4().hex[:6])
    copied = 0
    aborted_once = False
    deadline = time.monotonic() + 90
    while copied < n and time.monotonic() < deadline:
        msgs = [m for m in c.consume(30, 0.5) if m.error() is None]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(dst, value=m.value().replace(b"in", b"out"), partition=m.partition())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
        if not aborted_once:  # one aborted round: its output and offsets must both vanish
            aborted_once = True
            assert p.flush(30) == 0
            p.abort_transaction(30)
            for tp in c.assignment():
                committed = c.committed([tp], timeout=15)[0].offset
                c.seek(TopicPartition(tp.topic, tp.partition, committed if committed >= 0 else 0))
            continue
        p.commit_transaction(30)
        copied += len(msgs)
    assert copied == n
    ends = {tp.partition: tp.offset for tp in c.committed([TopicPartition(src, i) for i in range(3)], timeout=15)}
    c.close()
    assert sum(ends.values()) == n
    out = _read(q, dst, 3, "read_committed", expect=n)
    assert sorted(out) == sorted(b"out%d" % i for i in range(n))


def test_late_produce_after_abort_is_refused_by_a_leader_on_another_broker(cluster):
    """KIP-890 part 1 across brokers: the partition's leader is not the transaction's
    coordinator, so it verifies with verify_only AddPartitionsToTxn over the wire (with
    verification off, the late batch is appended and opens a transaction that hangs)."""
    from kbroker.kernels import records
    from kbroker.protocol.messages import (
        add_partitions_to_txn as apt, describe_transactions as dtx, end_txn, init_producer_id as ipi, produce as pr,
    )
    q = cluster
    topic = "klate-" + uuid.uuid4().hex[:6]
    leaders = _spread_topic(q, topic)
    for _ in range(50):   # a transactional id whose coordinator does not lead partition 0
        tid = "klate-" + uuid.uuid4().hex[:8]
        err, coordinator = _wait(lambda: (lambda r: r if r[0] == ErrorCode.NONE else None)(_coordinator(q, tid)),
                                 timeout_s=30, what="transaction coordinator")
        if coordinator != leaders[0][0]:
            break
    cport, lport = q.broker_ports[coordinator], q.broker_ports[leaders[0][0]]

    def init():
        r = _raw(cport, ApiKey.INIT_PRODUCER_ID, 4, ipi.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))
        return r if r.error_code == ErrorCode.NONE else None
    r = _wait(init, timeout_s=30, what="InitProducerId")
    pid, epoch = r.producer_id, r.producer_epoch

    def produce(seq, value):
        batch = records.encode_batch([(int(time.time() * 1000), None, value, [])], producer_id=pid,
                                     producer_epoch=epoch, base_sequence=seq, is_transactional=True)
        resp = _raw(lport, ApiKey.PRODUCE, 9, pr.ProduceRequest(
            transactional_id=tid, acks=-1, timeout_ms=5000, topic_data=[pr.TopicProduceData(
                name=topic, partition_data=[pr.PartitionProduceData(index=0, records=batch)])]))
        return resp.responses[0].partition_responses[0].error_code

    r = _raw(cport, ApiKey.ADD_PARTITIONS_TO_TXN, 3, apt.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[apt.AddPartitionsToTxnTopic(name=topic, partitions=[0])]))
    assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == ErrorCode.NONE
    # the leader may apply the topic's metadata a moment after the broker that named it
    first = _wait(lambda: (lambda e: None if e == ErrorCode.NOT_LEADER_OR_FOLLOWER else (e,))(produce(0, b"aborted")),
                  what="leader ready")
    assert first == (ErrorCode.NONE,)
    r = _raw(cport, ApiKey.END_TXN, 3, end_txn.EndTxnRequest(transactional_id=tid, producer_id=pid,
                                                             producer_epoch=epoch, committed=False))
    assert r.error_code == ErrorCode.NONE
    _wait(lambda: _raw(cport, ApiKey.DESCRIBE_TRANSACTIONS, 0, dtx.DescribeTransactionsRequest(
        transactional_ids=[tid])).transaction_states[0].transaction_state == "CompleteAbort", what="CompleteAbort")
    assert produce(1, b"late") == ErrorCode.INVALID_TXN_STATE
    c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": "l-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed"})
    try:
        _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()
    assert high == 2    # the aborted record and its marker; no late batch holding the LSO


def test_transaction_version_2_leader_on_another_broker_adds_the_partition(cluster):
    """KIP-890 part 2 across brokers: the cluster is formatted with transaction.version 2;
    a Produce v12 to a leader that is not the coordinator makes it add the partition with
    AddPartitionsToTxn v5 over the wire; EndTxn v5 bumps the epoch, the markers carry it,
    and the previous epoch's late produce is fenced."""
    from kbroker.kernels import records
    from kbroker.protocol.messages import (
        api_versions as av, describe_transactions as dtx, end_txn, init_producer_id as ipi, produce as pr,
    )
    q = cluster
    r = _raw(q.broker_ports[BROKERS[0]], ApiKey.API_VERSIONS, 3,
             av.ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    assert {f.name: f.max_version_level for f in r.finalized_features}.get("transaction.version") == 2
    topic = "ktv2-" + uuid.uuid4().hex[:6]
    leaders = _spread_topic(q, topic)
    for _ in range(50):   # a transactional id whose coordinator does not lead partition 0
        tid = "ktv2-" + uuid.uuid4().hex[:8]
        err, coordinator = _wait(lambda: (lambda r: r if r[0] == ErrorCode.NONE else None)(_coordinator(q, tid)),
                                 timeout_s=30, what="transaction coordinator")
        if coordinator != leaders[0][0]:
            break
    cport, lport = q.broker_ports[coordinator], q.broker_ports[leaders[0][0]]
    r = _wait(lambda: (lambda r: r if r.error_code == ErrorCode.NONE else None)(_raw(
        cport, ApiKey.INIT_PRODUCER_ID, 4, ipi.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))),
        timeout_s=30, what="InitProducerId")
    pid, epoch = r.producer_id, r.producer_epoch

    def produce(epoch, seq, value):
        batch = records.encode_batch([(int(time.time() * 1000), None, value, [])], producer_id=pid,
                                     producer_epoch=epoch, base_sequence=seq, is_transactional=True)
        resp = _raw(lport, ApiKey.PRODUCE, 12, pr.ProduceRequest(
            transactional_id=tid, acks=-1, timeout_ms=5000, topic_data=[pr.TopicProduceData(
                name=topic, partition_data=[pr.PartitionProduceData(index=0, records=batch)])]))
        code = resp.responses[0].partition_responses[0].error_code
        # not yet the leader's metadata, or the previous transaction's markers still going out
        return None if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS) else (code,)

    def end(epoch, commit):
        return _raw(cport, ApiKey.END_TXN, 5, end_txn.EndTxnRequest(transactional_id=tid, producer_id=pid,
                                                                    producer_epoch=epoch, committed=commit))

    def state():
        return _raw(cport, ApiKey.DESCRIBE_TRANSACTIONS, 0, dtx.DescribeTransactionsRequest(
            transactional_ids=[tid])).transaction_states[0]

    assert _wait(lambda: produce(epoch, 0, b"t1"), what="T1's produce") == (ErrorCode.NONE,)
    assert state().topics[0].topic == topic                  # added by the leader, not by the producer
    r = end(epoch, True)
    assert (r.error_code, r.producer_id, r.producer_epoch) == (ErrorCode.NONE, pid, epoch + 1)
    _wait(lambda: state().transaction_state == "CompleteCommit", what="CompleteCommit")
    assert _wait(lambda: produce(epoch + 1, 0, b"t2"), what="T2's produce") == (ErrorCode.NONE,)
    assert produce(epoch, 1, b"late") == (ErrorCode.INVALID_PRODUCER_EPOCH,)
    assert end(epoch, True).error_code == ErrorCode.PRODUCER_FENCED    # T1's late commit leaves T2 open
    assert end(epoch + 1, False).error_code == ErrorCode.NONE
    assert sorted(_read(q, topic, 1, "read_committed", expect=1)) == [b"t1"]

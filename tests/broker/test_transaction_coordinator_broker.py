"""The transaction coordinator in a real broker: FindCoordinator(TRANSACTION), InitProducerId
with a transactional id, __transaction_state created as Kafka does and reloaded on restart,
confluent-kafka's init_transactions and fencing.

What needs the partition leaders' WriteTxnMarkers handler (markers, LSO, read_committed)
is in the end-to-end tests; here only the coordinator's side is checked, which holds
whether markers complete or not.
"""
from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer

from kbroker.protocol import ApiKey as K, ErrorCode as E
from kbroker.protocol.messages import (
    add_partitions_to_txn as apt, describe_transactions as dtx, find_coordinator as fc, init_producer_id as ipi,
    metadata as md,
)
from tests.broker.kafka_helpers import create_topic
from tests.broker.raw_client import RawClient


def _init(c: RawClient, tid: str, timeout_ms: int = 60000, version: int = 4):
    deadline = time.monotonic() + 15
    while True:
        r = c.call(K.INIT_PRODUCER_ID, version, ipi.InitProducerIdRequest(transactional_id=tid,
                                                                         transaction_timeout_ms=timeout_ms))
        if r.error_code != E.COORDINATOR_LOAD_IN_PROGRESS or time.monotonic() > deadline:
            return E(r.error_code), r.producer_id, r.producer_epoch
        time.sleep(0.05)


def _describe(c: RawClient, tid: str):
    (d,) = c.call(K.DESCRIBE_TRANSACTIONS, 0, dtx.DescribeTransactionsRequest(transactional_ids=[tid])
                  ).transaction_states
    return d


def _add(c: RawClient, tid, pid, epoch, topic, partitions):
    r = c.call(K.ADD_PARTITIONS_TO_TXN, 3, apt.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[apt.AddPartitionsToTxnTopic(name=topic, partitions=partitions)]))
    return {p.partition_index: p.partition_error_code for t in r.results_by_topic_v3_and_below
            for p in t.results_by_partition}


def test_transaction_state_topic_is_internal_and_compacted(broker):
    with RawClient(broker.port) as c:
        assert _init(c, "tsi-" + uuid.uuid4().hex[:6])[0] == E.NONE
        r = c.call(K.METADATA, 12, md.MetadataRequest(topics=[md.MetadataRequestTopic(name="__transaction_state")],
                                                     allow_auto_topic_creation=False))
        (t,) = r.topics
        assert t.error_code == E.NONE and t.is_internal and len(t.partitions) == 50
        r = c.call(K.FIND_COORDINATOR, 4, fc.FindCoordinatorRequest(key_type=1, coordinator_keys=["a", "b"]))
        assert all(x.error_code == E.NONE and x.port == broker.port for x in r.coordinators)
    from confluent_kafka.admin import AdminClient, ConfigResource
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, "__transaction_state")
    configs = admin.describe_configs([res])[res].result(timeout=15)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["compression.type"].value == "uncompressed"


def test_coordinator_state_survives_a_restart(fresh_broker):
    b = fresh_broker()
    topic = "tcr-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic, partitions=3)
    tid = "tcr-" + uuid.uuid4().hex[:6]
    with RawClient(b.port) as c:
        err, pid, epoch = _init(c, tid, timeout_ms=120000)
        assert (err, epoch) == (E.NONE, 0)
        assert _add(c, tid, pid, epoch, topic, [0, 2]) == {0: E.NONE, 2: E.NONE}
        before = _describe(c, tid)
    assert before.transaction_state == "Ongoing"
    assert b.terminate() == 0
    b2 = fresh_broker()
    with RawClient(b2.port) as c:
        deadline = time.monotonic() + 15
        d = _describe(c, tid)
        while d.error_code == E.COORDINATOR_LOAD_IN_PROGRESS and time.monotonic() < deadline:
            time.sleep(0.05)
            d = _describe(c, tid)
        assert (d.error_code, d.transaction_state, d.producer_id, d.producer_epoch, d.transaction_timeout_ms,
                d.transaction_start_time_ms) == (E.NONE, "Ongoing", pid, epoch, 120000,
                                                 before.transaction_start_time_ms)
        assert [(t.topic, sorted(t.partitions)) for t in d.topics] == [(topic, [0, 2])]
        # a new producer instance fences the reloaded transaction: it is aborted with a bumped epoch
        assert _init(c, tid)[0] == E.CONCURRENT_TRANSACTIONS
        d = _describe(c, tid)
        assert d.transaction_state in ("PrepareAbort", "CompleteAbort") and d.producer_epoch == epoch + 1
        # the fenced producer is refused
        assert _add(c, tid, pid, epoch, topic, [1]) == {1: E.PRODUCER_FENCED}


def test_confluent_init_transactions_and_fencing(broker):
    tid = "cit-" + uuid.uuid4().hex[:6]
    conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": tid, "transaction.timeout.ms": 30000}
    p1 = Producer(conf)
    p1.init_transactions(30)
    p2 = Producer(conf)
    p2.init_transactions(30)  # the same transactional id: p1 is fenced
    with RawClient(broker.port) as c:
        d = _describe(c, tid)
    assert (d.error_code, d.transaction_state, d.producer_epoch) == (E.NONE, "Empty", 1)
    p3 = Producer(conf)
    p3.init_transactions(30)
    with RawClient(broker.port) as c:
        d3 = _describe(c, tid)
    assert (d3.producer_id, d3.producer_epoch) == (d.producer_id, 2)
    for p in (p1, p2, p3):
        p.flush(5)

"""The client's TransactionManager without a broker: the order of its requests, the state
machine, retries, coordinator moves, abortable and fatal errors (Kafka's semantics)."""
from __future__ import annotations

import pytest

from kbroker.client import errors as E
from kbroker.client.metadata import TopicPartition
from kbroker.client.producer.transaction_manager import (
    GROUP, ConsumerGroupMetadata, State, TransactionManager, stamp_producer_state,
)
from kbroker.kernels import records
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import add_offsets_to_txn as aot
from kbroker.protocol.messages import add_partitions_to_txn as apt
from kbroker.protocol.messages import end_txn as et
from kbroker.protocol.messages import txn_offset_commit as toc
from kbroker.protocol.messages.find_coordinator import Coordinator, FindCoordinatorResponse
from kbroker.protocol.messages.init_producer_id import InitProducerIdResponse

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def found(node=7):
    return FindCoordinatorResponse(coordinators=[Coordinator(key="x", node_id=node, host="h", port=1, error_code=0)])


def added(tps, code=0):
    by = {}
    for tp in tps:
        by.setdefault(tp.topic, []).append(apt.AddPartitionsToTxnPartitionResult(partition_index=tp.partition,
                                                                               partition_error_code=code))
    return apt.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=[
        apt.AddPartitionsToTxnTopicResult(name=t, results_by_partition=ps) for t, ps in by.items()])


def step(tm, api_key, resp, incomplete=False):
    """The next request must be ``api_key``; answer it with ``resp``; returns the request."""
    tm.backoff_until = 0.0
    h = tm.next_request(0.0, incomplete)
    assert h is not None and h.api_key == api_key, (h and ApiKey(h.api_key).name, ApiKey(api_key).name)
    req = h.build()
    tm.on_response(h, resp, None)
    return req


def ready(tm):
    r = tm.initialize()
    step(tm, ApiKey.FIND_COORDINATOR, found())
    req = step(tm, ApiKey.INIT_PRODUCER_ID, InitProducerIdResponse(producer_id=42, producer_epoch=3))
    assert req.transactional_id == "tx" and req.transaction_timeout_ms == 60000
    assert r.is_done() and r.error is None and tm.state is State.READY
    return tm


def test_a_whole_transaction_in_kafkas_order():
    tm = ready(TransactionManager("tx"))
    tm.begin()
    tm.maybe_add_partition(TP0)
    tm.maybe_add_partition(TP1)
    assert tm.blocks_produce()
    req = step(tm, ApiKey.ADD_PARTITIONS_TO_TXN, added([TP0, TP1]))
    assert (req.v3_and_below_producer_id, req.v3_and_below_producer_epoch) == (42, 3)
    assert [(t.name, t.partitions) for t in req.v3_and_below_topics] == [("t", [0, 1])]
    assert not tm.blocks_produce() and tm.partitions_in_txn == {TP0, TP1}
    tm.maybe_add_partition(TP0)                          # already in: nothing to add
    assert tm.next_request(0.0, False) is None

    r = tm.send_offsets({TP0: 10}, ConsumerGroupMetadata("g", 5, "m-1"))
    step(tm, ApiKey.ADD_OFFSETS_TO_TXN, aot.AddOffsetsToTxnResponse(error_code=0))
    step(tm, ApiKey.FIND_COORDINATOR, found(9))          # the group's coordinator
    assert tm.coordinators[(GROUP, "g")][0] == 9
    req = step(tm, ApiKey.TXN_OFFSET_COMMIT, toc.TxnOffsetCommitResponse(topics=[toc.TxnOffsetCommitResponseTopic(
        name="t", partitions=[toc.TxnOffsetCommitResponsePartition(partition_index=0, error_code=0)])]))
    assert (req.group_id, req.generation_id, req.member_id) == ("g", 5, "m-1")
    assert req.topics[0].partitions[0].committed_offset == 10
    assert r.is_done() and r.error is None

    r = tm.begin_commit()
    assert tm.next_request(0.0, True) is None            # batches still in flight: EndTxn waits
    req = step(tm, ApiKey.END_TXN, et.EndTxnResponse(error_code=0))
    assert req.committed is True and r.is_done() and r.error is None
    assert tm.state is State.READY and tm.partitions_in_txn == set()


def test_retriable_errors_and_a_moved_coordinator_are_retried():
    tm = ready(TransactionManager("tx", retry_backoff_s=0.0))
    tm.begin()
    tm.maybe_add_partition(TP0)
    step(tm, ApiKey.ADD_PARTITIONS_TO_TXN, added([TP0], ErrorCode.CONCURRENT_TRANSACTIONS))
    step(tm, ApiKey.ADD_PARTITIONS_TO_TXN, added([TP0], ErrorCode.NOT_COORDINATOR))
    step(tm, ApiKey.FIND_COORDINATOR, found(8))
    step(tm, ApiKey.ADD_PARTITIONS_TO_TXN, added([TP0]))
    r = tm.begin_commit()
    step(tm, ApiKey.END_TXN, et.EndTxnResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    tm.backoff_until = 0.0
    h = tm.next_request(0.0, False)
    assert h.api_key == ApiKey.END_TXN
    tm.on_response(h, None, E.KafkaConnectionError("gone"))   # a lost connection: find it again
    step(tm, ApiKey.FIND_COORDINATOR, found(8))
    step(tm, ApiKey.END_TXN, et.EndTxnResponse(error_code=0))
    assert r.error is None and tm.state is State.READY


def test_fenced_is_fatal_and_an_abortable_error_needs_an_abort():
    tm = ready(TransactionManager("tx"))
    tm.begin()
    tm.maybe_add_partition(TP0)
    step(tm, ApiKey.ADD_PARTITIONS_TO_TXN, added([TP0], ErrorCode.TOPIC_AUTHORIZATION_FAILED))
    assert tm.state is State.ABORTABLE_ERROR and tm.in_error() is not None
    with pytest.raises(E.KafkaError):
        tm.begin_commit()
    with pytest.raises(E.KafkaError):
        tm.maybe_add_partition(TP1)
    r = tm.begin_abort()                                 # nothing reached the coordinator
    assert r.is_done() and tm.state is State.READY

    tm.begin()
    tm.maybe_add_partition(TP0)
    step(tm, ApiKey.ADD_PARTITIONS_TO_TXN, added([TP0]))
    r = tm.begin_abort()
    req = step(tm, ApiKey.END_TXN, et.EndTxnResponse(error_code=ErrorCode.PRODUCER_FENCED))
    assert req.committed is False
    assert tm.state is State.FATAL_ERROR and isinstance(r.error, E.KafkaError)
    assert r.error.code == ErrorCode.PRODUCER_FENCED
    with pytest.raises(E.KafkaError):
        tm.begin()


def test_init_is_fatal_on_an_unauthorized_id_and_transitions_are_checked():
    tm = TransactionManager("tx")
    with pytest.raises(E.IllegalStateError):
        tm.begin()
    r = tm.initialize()
    step(tm, ApiKey.FIND_COORDINATOR, found())
    step(tm, ApiKey.INIT_PRODUCER_ID, InitProducerIdResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    assert tm.state is State.FATAL_ERROR
    with pytest.raises(E.KafkaError):
        r.wait(0)


def test_batches_are_stamped_transactional():
    raw = records.encode_batch([(1, b"k", b"v", ())], base_offset=0)
    out = stamp_producer_state(raw, 42, 3, 7, transactional=True)
    (b,) = list(records.iter_batches(out))
    b.validate()
    assert b.is_transactional and (b.producer_id, b.producer_epoch, b.base_sequence) == (42, 3, 7)
    (plain,) = list(records.iter_batches(stamp_producer_state(raw, 42, 3, 7)))
    assert not plain.is_transactional


def test_an_empty_transaction_ends_locally_but_one_with_offsets_only_sends_end_txn():
    """Kafka's client: commit or abort of a transaction that reached nothing at the
    coordinator completes without EndTxn (the coordinator would refuse an EndTxn for a
    transaction it never saw); offsets alone make it a real transaction."""
    tm = ready(TransactionManager("tx"))
    tm.begin()
    r = tm.begin_commit()
    assert r.is_done() and r.error is None and tm.state is State.READY
    assert tm.next_request(0.0, False) is None
    tm.begin()
    r = tm.begin_abort()
    assert r.is_done() and tm.state is State.READY
    tm.begin()
    tm.send_offsets({TP0: 1}, ConsumerGroupMetadata("g"))
    step(tm, ApiKey.ADD_OFFSETS_TO_TXN, aot.AddOffsetsToTxnResponse(error_code=0))
    step(tm, ApiKey.FIND_COORDINATOR, found(9))
    step(tm, ApiKey.TXN_OFFSET_COMMIT, toc.TxnOffsetCommitResponse(topics=[toc.TxnOffsetCommitResponseTopic(
        name="t", partitions=[toc.TxnOffsetCommitResponsePartition(partition_index=0, error_code=0)])]))
    r = tm.begin_abort()
    assert not r.is_done()
    step(tm, ApiKey.END_TXN, et.EndTxnResponse(error_code=0))
    assert r.is_done() and tm.state is State.READY


def test_an_abort_while_the_first_add_partitions_is_retried_ends_locally():
    """begin_abort while the transaction's first AddPartitionsToTxn is in flight queues an
    EndTxn; if that AddPartitionsToTxn then comes back retriable (CONCURRENT_TRANSACTIONS: the
    previous transaction's markers are still being written) it is not sent again, so the
    coordinator never saw this transaction: the abort must end locally, as Kafka's
    TransactionManager.nextRequest does, not send an EndTxn the coordinator answers with
    INVALID_TXN_STATE (fatal)."""
    tm = ready(TransactionManager("tx", retry_backoff_s=0.0))
    tm.begin()
    tm.maybe_add_partition(TP0)
    tm.backoff_until = 0.0
    h = tm.next_request(0.0, False)
    assert h.api_key == ApiKey.ADD_PARTITIONS_TO_TXN
    r = tm.begin_abort()                      # the AddPartitionsToTxn is in flight
    assert not r.is_done()
    tm.on_response(h, added([TP0], ErrorCode.CONCURRENT_TRANSACTIONS), None)
    tm.backoff_until = 0.0
    assert tm.next_request(0.0, False) is None
    assert r.is_done() and r.error is None and tm.state is State.READY
    assert not tm.blocks_produce()
    tm.begin()                                # and the next transaction starts cleanly
    tm.maybe_add_partition(TP1)
    step(tm, ApiKey.ADD_PARTITIONS_TO_TXN, added([TP1]))
    r = tm.begin_commit()
    step(tm, ApiKey.END_TXN, et.EndTxnResponse(error_code=0))
    assert r.error is None and tm.state is State.READY


def test_transaction_version_2_adds_nothing_and_takes_the_bumped_epoch():
    """KIP-890 part 2 (the broker finalizes transaction.version 2): no AddPartitionsToTxn
    nor AddOffsetsToTxn; EndTxn v5's answer is the next transaction's epoch, whose
    sequences restart at 0; a failed batch leaves only the abort."""
    tm = ready(TransactionManager("tx"))
    tm.transaction_v2 = True
    tm.begin()
    tm.maybe_add_partition(TP0)
    assert not tm.blocks_produce() and tm.partitions_in_txn == {TP0}
    tm.next_sequence[TP0] = 5
    r = tm.send_offsets({TP0: 10}, ConsumerGroupMetadata("g"))
    step(tm, ApiKey.FIND_COORDINATOR, found(9))
    step(tm, ApiKey.TXN_OFFSET_COMMIT, toc.TxnOffsetCommitResponse(topics=[toc.TxnOffsetCommitResponseTopic(
        name="t", partitions=[toc.TxnOffsetCommitResponsePartition(partition_index=0, error_code=0)])]))
    assert r.is_done() and r.error is None
    r = tm.begin_commit()
    h = tm.next_request(0.0, False)
    assert h.api_key == ApiKey.END_TXN and h.version == 5
    tm.on_response(h, et.EndTxnResponse(error_code=0, producer_id=42, producer_epoch=4), None)
    assert r.error is None and (tm.producer_id, tm.producer_epoch, tm.next_sequence) == (42, 4, {})
    tm.begin()
    tm.maybe_add_partition(TP1)
    tm.transaction_started = True            # as assign() does when the batch is drained
    r = tm.begin_commit()
    tm.batch_failed(E.for_code(ErrorCode.REQUEST_TIMED_OUT, "expired"))
    assert tm.state is State.ABORTABLE_ERROR and isinstance(r.error, E.KafkaError)

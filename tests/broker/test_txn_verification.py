"""KIP-890 part 1 against a real broker: a partition leader verifies a transactional
produce with the transaction coordinator before appending it
(kbroker/server/txn_verification.py, kbroker/log/txn_verification.py).

The hanging transaction KIP-890 fixes: a producer's transaction is aborted, then a late
produce of that transaction (a retry held in the network) reaches the leader. Without
verification the log takes it as the start of a new transaction that the coordinator
never heard of: no marker will ever end it, and the last stable offset (and every
read_committed consumer) stops there for good. With verification the coordinator says
the partition is not in an ongoing transaction and the batch is refused.
"""
from __future__ import annotations

import time
import uuid

import pytest

from kbroker.kernels import records
from kbroker.protocol import ApiKey as K, ErrorCode as E
from kbroker.protocol.messages import txn_offset_commit as toc
from kbroker.protocol.messages.end_txn import EndTxnRequest
from tests.broker.kafka_helpers import create_topic
from tests.broker.raw_client import RawClient
from tests.broker.test_transaction_coordinator_broker import _add, _describe, _init
from tests.broker.test_transactions_log import TS, list_latest, produce

VERIFY = "transaction.partition.verification.enable"


def _batch(pid, epoch, seq, value):
    return records.encode_batch([(TS, None, value, [])], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                is_transactional=True)


def _end(c, tid, pid, epoch, commit):
    r = c.call(K.END_TXN, 3, EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                           committed=commit))
    return E(r.error_code)


def _wait_state(c, tid, state):
    deadline = time.monotonic() + 20
    while _describe(c, tid).transaction_state != state:
        assert time.monotonic() < deadline, f"{tid} never reached {state}"
        time.sleep(0.02)


def _abort_then_late_produce(port, topic, produce_version=9):
    """One transaction writes offset 0 and aborts (marker at 1); then the late produce
    of that transaction arrives. Returns (its error, high watermark, last stable offset)."""
    tid = "hang-" + uuid.uuid4().hex[:8]
    with RawClient(port) as c:
        err, pid, epoch = _init(c, tid)
        assert err == E.NONE
        assert _add(c, tid, pid, epoch, topic, [0]) == {0: E.NONE}
        assert produce(c, topic, 0, _batch(pid, epoch, 0, b"aborted"), tid)[0] == E.NONE
        assert _end(c, tid, pid, epoch, False) == E.NONE
        _wait_state(c, tid, "CompleteAbort")
        late, _ = produce(c, topic, 0, _batch(pid, epoch, 1, b"late"), tid, version=produce_version)
        return E(late), list_latest(c, topic, 0, 0), list_latest(c, topic, 0, 1)


def _offsets_without_add_offsets(port, topic, version=3):
    """A TxnOffsetCommit of a producer that never sent AddOffsetsToTxn: its error, and
    the transaction's partitions at the coordinator."""
    tid = "toc-" + uuid.uuid4().hex[:8]
    with RawClient(port) as c:
        err, pid, epoch = _init(c, tid)
        assert err == E.NONE
        r = c.call(K.TXN_OFFSET_COMMIT, version, toc.TxnOffsetCommitRequest(
            transactional_id=tid, group_id="g-" + tid, producer_id=pid, producer_epoch=epoch, topics=[
                toc.TxnOffsetCommitRequestTopic(name=topic, partitions=[
                    toc.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=1)])]))
        return E(r.topics[0].partitions[0].error_code), [t.topic for t in _describe(c, tid).topics]


def test_a_late_produce_after_abort_is_refused_and_the_lso_does_not_hang(broker):
    topic = "hang-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, topic, partitions=1)
    err, hw, lso = _abort_then_late_produce(broker.port, topic)
    assert err == E.INVALID_TXN_STATE       # Produce below v11: INVALID_TXN_STATE
    assert (hw, lso) == (2, 2)              # the aborted record and its marker; nothing open


def test_produce_v11_sees_transaction_abortable(broker):
    topic = "hang-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, topic, partitions=1)
    err, hw, lso = _abort_then_late_produce(broker.port, topic, produce_version=11)
    assert err == E.TRANSACTION_ABORTABLE and lso == hw == 2


def test_without_verification_the_late_produce_hangs_the_lso(fresh_broker):
    """The same sequence with transaction.partition.verification.enable=false: the bug
    KIP-890 fixes (this is why the test above fails without verification)."""
    b = fresh_broker(**{VERIFY: "false", "num.partitions": 1})
    topic = "hang-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic, partitions=1)
    err, hw, lso = _abort_then_late_produce(b.port, topic)
    assert err == E.NONE and (hw, lso) == (3, 2)   # a transaction nobody will end holds the LSO at 2
    # TxnOffsetCommit follows the flag too (Kafka: no verification, the offsets are written)
    assert _offsets_without_add_offsets(b.port, topic) == (E.NONE, [])
    # ... but transaction version 2's TxnOffsetCommit v5 adds the group's partition whatever the flag
    assert _offsets_without_add_offsets(b.port, topic, version=5) == (E.NONE, ["__consumer_offsets"])
    # verification is dynamic: on again, the next late produce of another producer is refused
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    node = str(admin.describe_cluster().result(timeout=15).nodes[0].id)
    res = ConfigResource(ConfigResource.Type.BROKER, node, incremental_configs=[
        ConfigEntry(VERIFY, "true", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=15)
    topic2 = "hang-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic2, partitions=1)
    assert _abort_then_late_produce(b.port, topic2) == (E.INVALID_TXN_STATE, 2, 2)
    assert _offsets_without_add_offsets(b.port, topic2)[0] == E.INVALID_TXN_STATE


def test_partition_not_added_fenced_producer_and_a_normal_transaction(broker):
    topic = "ver-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, topic, partitions=2)
    tid = "ver-" + uuid.uuid4().hex[:8]
    with RawClient(broker.port) as c:
        err, pid, epoch = _init(c, tid)
        assert _add(c, tid, pid, epoch, topic, [0]) == {0: E.NONE}
        # partition 1 was never added to the transaction
        assert produce(c, topic, 1, _batch(pid, epoch, 0, b"x"), tid)[0] == E.INVALID_TXN_STATE
        # partition 0 was: verified, appended; the next batch needs no verification
        assert produce(c, topic, 0, _batch(pid, epoch, 0, b"a"), tid)[0] == E.NONE
        assert produce(c, topic, 0, _batch(pid, epoch, 1, b"b"), tid)[0] == E.NONE
        assert _end(c, tid, pid, epoch, True) == E.NONE
        _wait_state(c, tid, "CompleteCommit")
        assert list_latest(c, topic, 0, 1) == list_latest(c, topic, 0, 0) == 3
        # a new producer epoch fences the old one: its produce answers INVALID_PRODUCER_EPOCH
        err, pid2, epoch2 = _init(c, tid)
        assert err == E.NONE and (pid2, epoch2) == (pid, epoch + 1)
        assert _add(c, tid, pid2, epoch2, topic, [1]) == {1: E.NONE}
        assert produce(c, topic, 1, _batch(pid, epoch, 0, b"zombie"), tid)[0] == E.INVALID_PRODUCER_EPOCH
        # an unknown transactional id
        assert produce(c, topic, 1, _batch(pid, epoch, 0, b"?"), "no-such-" + tid)[0] == \
            E.INVALID_PRODUCER_ID_MAPPING
        assert list_latest(c, topic, 1, 1) == list_latest(c, topic, 1, 0) == 0

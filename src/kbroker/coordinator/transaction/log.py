"""The transaction coordinator's records in ``__transaction_state``.

Kafka: ``core/.../coordinator/transaction/TransactionLog.scala``. One record per
transition of a transactional id, compacted by key::

    key   = int16 0 | TransactionLogKey v0 (transactional_id)
    value = int16 0 | TransactionLogValue v0 (producer id/epoch, timeout, status,
            partitions, last-update and start timestamps);   null = tombstone (expired id)

We write value version 0 for transactions of clients below transaction version 2 (as Kafka
3.9 does), and the flexible version 1 for transaction version 2 ones: its tagged fields
keep the previous and next producer ids and the client's transaction version, which a
transaction version 2 EndTxn needs after a reload; both versions are read. Partitions are null for Empty (Kafka's
rule), grouped by topic otherwise. Keys of an unknown version are skipped on load
(Kafka's UnknownKey).
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from kbroker.coordinator.records.transaction_log import PartitionsSchema, TransactionLogKey, TransactionLogValue
from kbroker.coordinator.transaction.metadata import TransactionState, TxnTransitMetadata, supports_epoch_bump

__all__ = ["TRANSACTION_STATE_TOPIC", "key_bytes", "value_bytes", "record", "tombstone", "read_record", "TxnRecord"]

TRANSACTION_STATE_TOPIC = "__transaction_state"

KEY_VERSION = 0
VALUE_VERSION = 0
_S_h = struct.Struct(">h")


def key_bytes(transactional_id: str) -> bytes:
    return _S_h.pack(KEY_VERSION) + TransactionLogKey(transactional_id=transactional_id).encode(KEY_VERSION)


def value_bytes(t: TxnTransitMetadata) -> bytes:
    if t.state is TransactionState.EMPTY and t.topic_partitions:
        raise ValueError(f"an Empty transaction has no partitions: {t}")
    partitions = None
    if t.state is not TransactionState.EMPTY:
        by_topic: dict[str, list[int]] = {}
        for topic, p in sorted(t.topic_partitions):
            by_topic.setdefault(topic, []).append(p)
        partitions = [PartitionsSchema(topic=topic, partition_ids=ps) for topic, ps in by_topic.items()]
    v = TransactionLogValue(
        producer_id=t.producer_id, producer_epoch=t.producer_epoch, transaction_timeout_ms=t.txn_timeout_ms,
        transaction_status=t.state.id, transaction_partitions=partitions,
        transaction_last_update_timestamp_ms=t.txn_last_update_timestamp,
        transaction_start_timestamp_ms=t.txn_start_timestamp)
    version = VALUE_VERSION
    if supports_epoch_bump(t.client_transaction_version):
        version = 1
        v.previous_producer_id = t.prev_producer_id
        v.next_producer_id = t.next_producer_id
        v.client_transaction_version = t.client_transaction_version
    return _S_h.pack(version) + v.encode(version)


def record(transactional_id: str, t: TxnTransitMetadata) -> tuple[bytes, bytes]:
    return key_bytes(transactional_id), value_bytes(t)


def tombstone(transactional_id: str) -> tuple[bytes, None]:
    return key_bytes(transactional_id), None


class TxnRecord(NamedTuple):
    """A decoded record: ``transit`` None is a tombstone. ``prev_producer_id`` (v1's
    tagged field) is -1 in a v0 value; ``last_producer_epoch`` is never in the log: -1."""

    transactional_id: str
    transit: TxnTransitMetadata | None


def read_record(key, value) -> TxnRecord | None:
    """Decode one record; None for a key of an unknown version; ValueError if unreadable."""
    if key is None or len(key) < 2:
        raise ValueError("__transaction_state record without a versioned key")
    kv = _S_h.unpack_from(key, 0)[0]
    if kv != KEY_VERSION:
        return None
    tid = TransactionLogKey.decode(memoryview(key)[2:], kv).transactional_id
    if value is None:
        return TxnRecord(tid, None)
    vv = _S_h.unpack_from(value, 0)[0]
    if vv not in (0, 1):
        raise ValueError(f"unknown TransactionLogValue version {vv}")
    v = TransactionLogValue.decode(memoryview(value)[2:], vv)
    state = TransactionState.from_id(v.transaction_status)
    partitions = frozenset()
    if state is not TransactionState.EMPTY and v.transaction_partitions:
        partitions = frozenset((ps.topic, p) for ps in v.transaction_partitions for p in ps.partition_ids)
    return TxnRecord(tid, TxnTransitMetadata(
        v.producer_id, v.previous_producer_id, v.producer_epoch, -1, v.transaction_timeout_ms, state, partitions,
        v.transaction_start_timestamp_ms, v.transaction_last_update_timestamp_ms, v.next_producer_id,
        v.client_transaction_version))

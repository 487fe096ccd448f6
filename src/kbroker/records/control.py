"""Transaction control batches: the COMMIT / ABORT markers (Kafka's ``ControlRecordType``,
``EndTransactionMarker``, ``MemoryRecords.withEndTransactionMarker``).

The one place that encodes and parses them. A marker is a record batch v2 with the
control (0x20) and transactional (0x10) attribute flags, the producer's id and epoch,
base sequence -1, and exactly one record::

    key   = ControlRecordType v0:   version int16 (0), type int16 (0 ABORT, 1 COMMIT)
    value = EndTransactionMarker v0: version int16 (0), coordinator_epoch int32

(big-endian). Kafka reads a newer marker value version as version 0 and a key version
above 0 the same way; so do we. KRaft control types (2..6) share the key layout but are
not end-transaction markers: :func:`parse_end_txn_marker` answers None for them.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from kbroker.kernels import records as _records

__all__ = ["ABORT", "COMMIT", "EndTxnMarker", "control_record_type", "encode_end_txn_marker",
           "end_txn_marker_of_record", "parse_end_txn_marker"]

#: ControlRecordType ids
ABORT = 0
COMMIT = 1
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0

_KEY = struct.Struct(">hh")            # version, type
_VALUE = struct.Struct(">hi")          # version, coordinator_epoch


class EndTxnMarker(NamedTuple):
    """A parsed COMMIT / ABORT marker."""

    is_commit: bool
    coordinator_epoch: int

    @property
    def is_abort(self) -> bool:
        return not self.is_commit

    @property
    def control_type(self) -> int:
        return COMMIT if self.is_commit else ABORT


def encode_end_txn_marker(producer_id: int, producer_epoch: int, coordinator_epoch: int, is_commit: bool,
                          timestamp_ms: int, *, base_offset: int = 0, partition_leader_epoch: int = -1) -> bytes:
    """One control batch holding a COMMIT (``is_commit``) or ABORT marker, as Kafka's
    ``MemoryRecords.withEndTransactionMarker`` writes it (uncompressed, create time)."""
    key = _KEY.pack(CONTROL_KEY_VERSION, COMMIT if is_commit else ABORT)
    value = _VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch)
    return _records.encode_batch([(timestamp_ms, key, value, ())], base_offset=base_offset,
                                 producer_id=producer_id, producer_epoch=producer_epoch,
                                 base_sequence=-1, partition_leader_epoch=partition_leader_epoch,
                                 is_transactional=True, is_control=True)


def control_record_type(key) -> int | None:
    """The ControlRecordType id of a control record's key (None when it is too short)."""
    if key is None or len(key) < _KEY.size:
        return None
    return _KEY.unpack_from(key)[1]


def end_txn_marker_of_record(key, value) -> EndTxnMarker | None:
    """The marker held by one control record (key, value), None when it is not a
    COMMIT/ABORT marker or its value is shorter than version 0's six bytes."""
    ctype = control_record_type(key)
    if ctype not in (ABORT, COMMIT) or value is None or len(value) < _VALUE.size:
        return None
    return EndTxnMarker(ctype == COMMIT, _VALUE.unpack_from(value)[1])


def parse_end_txn_marker(batch_bytes) -> EndTxnMarker | None:
    """The marker of a control batch (the first record decides, as Kafka's
    ``ProducerAppendInfo.append``); None for an empty control batch, a KRaft control
    batch or bytes that do not decode. The CRC is not checked (the caller read a
    validated log or built the batch)."""
    try:
        batch = _records.decode_batch(batch_bytes, check_crc=False)
        recs = batch.records
        if not recs:
            return None
        rec = recs[0]
        return end_txn_marker_of_record(rec.key, rec.value)
    except (_records.CorruptRecordError, _records.InvalidRecordError, ValueError, struct.error):
        return None

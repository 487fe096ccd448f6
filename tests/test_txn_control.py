"""Transaction control batches (kbroker.records.control): Kafka's byte layout of
COMMIT / ABORT markers, and the parse every reader of the log uses."""
from __future__ import annotations

import struct

import pytest

from kbroker._core import records as compiled
from kbroker._core.ref import records as ref
from kbroker.log.segment import end_txn_marker, iter_batch_headers
from kbroker.records import control


@pytest.mark.parametrize("is_commit", [True, False])
def test_marker_layout_is_kafkas(is_commit):
    data = control.encode_end_txn_marker(4242, 7, 5, is_commit, 1_700_000_000_123)
    for kernel in (compiled, ref):
        b = kernel.decode_batch(data)          # CRC checked
        assert b.is_control and b.is_transactional
        assert (b.producer_id, b.producer_epoch, b.base_sequence) == (4242, 7, -1)
        assert b.attributes & 0x37 == 0x30      # control + transactional, uncompressed
        assert len(b.records) == 1
        r = b.records[0]
        assert bytes(r.key) == struct.pack(">hh", 0, 1 if is_commit else 0)
        assert bytes(r.value) == struct.pack(">hi", 0, 5)
        assert r.timestamp == 1_700_000_000_123
    m = control.parse_end_txn_marker(data)
    assert m == control.EndTxnMarker(is_commit, 5) and m.is_abort is (not is_commit)
    assert end_txn_marker(data) == (not is_commit, 5)
    (h,) = iter_batch_headers(data)
    assert h.is_control and h.is_transactional and h.producer_id == 4242


def test_parse_rejects_what_is_not_an_end_marker():
    # a KRaft control record (LEADER_CHANGE) shares the key layout
    leader_change = compiled.encode_batch([(0, struct.pack(">hh", 0, 2), b"\x00\x00", ())],
                                          is_control=True)
    assert control.parse_end_txn_marker(leader_change) is None
    # value shorter than version 0's six bytes
    short = compiled.encode_batch([(0, struct.pack(">hh", 0, 1), b"\x00\x00\x00", ())], is_control=True,
                                  is_transactional=True, producer_id=1, producer_epoch=0)
    assert control.parse_end_txn_marker(short) is None
    # an empty control batch (all its records cleaned away)
    empty = compiled.encode_batch([], is_control=True, is_transactional=True, producer_id=1, producer_epoch=0)
    assert control.parse_end_txn_marker(empty) is None
    assert control.parse_end_txn_marker(b"\x00" * 10) is None
    # a newer value version is read as version 0 (Kafka's EndTransactionMarker.deserialize)
    newer = compiled.encode_batch([(0, struct.pack(">hh", 0, 0), struct.pack(">hi", 3, 9) + b"xx", ())],
                                  is_control=True, is_transactional=True, producer_id=1, producer_epoch=0)
    assert control.parse_end_txn_marker(newer) == control.EndTxnMarker(False, 9)


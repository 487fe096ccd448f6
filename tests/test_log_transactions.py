"""Transactions in the log: markers, ongoing transactions, the last stable offset,
the ``.txnindex`` (kbroker/log/log.py, producer_state.py, txn_index.py)."""
import os
import shutil

import pytest

from kbroker.kernels import records
from kbroker.log import LogConfig
from kbroker.log.log import Log
from kbroker.log.producer_state import (
    InvalidProducerEpochError, InvalidTxnStateError, TransactionCoordinatorFencedError,
)
from kbroker.log.txn_index import ABORTED_TXN_SIZE, AbortedTxn, TransactionIndex, decode_entries
from tests._log_util import Clock

T0 = 1_700_000_000_000


def tbatch(pid, seq, n=1, epoch=0, transactional=True):
    return bytearray(records.encode_batch([(T0, b"k", b"v%d" % i, []) for i in range(n)], producer_id=pid,
                                          producer_epoch=epoch, base_sequence=seq,
                                          is_transactional=transactional))


def plain(n=1):
    return bytearray(records.encode_batch([(T0, None, b"p%d" % i, []) for i in range(n)]))


def open_log(path, **cfg):
    return Log.open(str(path), LogConfig(cfg), time_ms=Clock())


def hw_to_end(lg):
    lg.update_high_watermark(lg.log_end_offset)


def txnindex_files(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d)) if n.endswith(".txnindex")}


def build(lg):
    """pid 1 commits [0,1], plain 2, pid 2 aborts [3,4] around pid 3's open txn at 5."""
    lg.append_as_leader(tbatch(1, 0, n=2))          # 0-1
    hw_to_end(lg)
    assert lg.last_stable_offset == 0 and lg.high_watermark == 2
    lg.append_as_leader(plain())                    # 2
    lg.append_as_leader(tbatch(2, 0, n=2))          # 3-4
    lg.append_as_leader(tbatch(3, 0))               # 5
    hw_to_end(lg)
    assert lg.last_stable_offset == 0
    info = lg.append_end_txn_marker(1, 0, 7, True)  # COMMIT at 6
    assert info.first_offset == 6
    assert lg.last_stable_offset == 0               # marker not yet below the high watermark
    hw_to_end(lg)
    assert lg.last_stable_offset == 3               # pid 2's transaction is the first open one
    lg.append_end_txn_marker(2, 0, 7, False)        # ABORT at 7
    hw_to_end(lg)
    assert lg.last_stable_offset == 5               # pid 3 still open


def test_markers_move_the_last_stable_offset_and_abort_writes_the_txnindex(tmp_path):
    lg = open_log(tmp_path / "t-0")
    build(lg)
    # the abort's entry: LSO stored = pid 3's first offset
    assert lg.collect_aborted_transactions(0, 8) == [AbortedTxn(2, 3, 7, 5)]
    assert lg.collect_aborted_transactions(8, 9) == []
    assert lg.collect_aborted_transactions(0, 3) == []          # its data starts at 3
    (name, data), = txnindex_files(lg.dir).items()
    assert name == "00000000000000000000.txnindex" and len(data) == ABORTED_TXN_SIZE
    assert decode_entries(data) == (AbortedTxn(2, 3, 7, 5),)
    lg.append_end_txn_marker(3, 0, 7, True)                     # 8
    hw_to_end(lg)
    assert lg.last_stable_offset == lg.high_watermark == 9
    assert lg.first_unstable_offset is None
    lg.close()


def test_producer_rules_for_transactional_batches_and_markers(tmp_path):
    lg = open_log(tmp_path / "t-0")
    lg.append_as_leader(tbatch(1, 0, epoch=3))
    with pytest.raises(InvalidTxnStateError) as e:               # plain write inside its open txn
        lg.append_as_leader(tbatch(1, 1, epoch=3, transactional=False))
    assert e.value.error_code == 48
    with pytest.raises(InvalidProducerEpochError):               # a marker from an older epoch
        lg.append_end_txn_marker(1, 2, 5, True)
    with pytest.raises(InvalidProducerEpochError):               # data from an older epoch
        lg.append_as_leader(tbatch(1, 1, epoch=2))
    lg.append_end_txn_marker(1, 3, 5, False)
    with pytest.raises(TransactionCoordinatorFencedError) as e:  # an older coordinator epoch
        lg.append_end_txn_marker(1, 3, 4, True)
    assert e.value.error_code == 52
    leo = lg.log_end_offset
    assert leo == 2
    # a marker for a producer without an open transaction is written, completes nothing
    lg.append_end_txn_marker(1, 3, 5, True)
    hw_to_end(lg)
    assert lg.last_stable_offset == lg.log_end_offset == 3
    assert lg.collect_aborted_transactions(0, 3) == [AbortedTxn(1, 0, 1, 2)]


def test_clean_restart_keeps_lso_and_txnindex(tmp_path):
    lg = open_log(tmp_path / "t-0")
    build(lg)
    files = txnindex_files(lg.dir)
    lg.close()
    lg = open_log(tmp_path / "t-0")
    hw_to_end(lg)
    assert lg.last_stable_offset == 5
    assert txnindex_files(lg.dir) == files
    lg.append_end_txn_marker(3, 0, 7, False)
    hw_to_end(lg)
    assert lg.last_stable_offset == lg.high_watermark
    assert lg.collect_aborted_transactions(0, 100) == [AbortedTxn(2, 3, 7, 5), AbortedTxn(3, 5, 8, 9)]


def test_recovery_without_snapshots_or_txnindex_rebuilds_both_identically(tmp_path):
    d = tmp_path / "t-0"
    lg = open_log(d, **{"segment.bytes": 300})                 # several segments
    build(lg)
    lg.append_as_leader(tbatch(4, 0))
    lg.append_end_txn_marker(4, 0, 7, False)
    hw_to_end(lg)
    assert lg.num_segments > 2
    files = txnindex_files(d)
    assert len(files) == 2
    aborted = lg.collect_aborted_transactions(0, 100)
    lso = lg.last_stable_offset
    # a crash: no clean close; then lose every snapshot and .txnindex
    copy = tmp_path / "copy-0"
    shutil.copytree(d, copy)
    for n in os.listdir(copy):
        if n.endswith((".snapshot", ".txnindex")):
            os.unlink(copy / n)
    lg2 = Log.open(str(copy), LogConfig({"segment.bytes": 300}), time_ms=Clock())
    hw_to_end(lg2)
    assert txnindex_files(copy) == files
    assert lg2.last_stable_offset == lso == 5
    assert lg2.collect_aborted_transactions(0, 100) == aborted
    # and a second recovery of the same files adds nothing twice
    lg2.close()
    lg3 = Log.open(str(copy), LogConfig({"segment.bytes": 300}), time_ms=Clock())
    assert txnindex_files(copy) == files


def test_truncation_drops_txnindex_entries_and_reopens_transactions(tmp_path):
    lg = open_log(tmp_path / "t-0")
    build(lg)
    lg.truncate_to(7)                                            # the ABORT at 7 goes
    assert txnindex_files(lg.dir) == {}
    hw_to_end(lg)
    assert lg.last_stable_offset == 3                            # pid 2 open again
    assert lg.collect_aborted_transactions(0, 100) == []


def test_transaction_index_file_format(tmp_path):
    idx = TransactionIndex(str(tmp_path / "00000000000000000000.txnindex"))
    assert idx.entries == () and not os.path.exists(idx.path)
    idx.append(AbortedTxn(5, 10, 20, 21))
    idx.append(AbortedTxn(6, 15, 30, 31))
    with pytest.raises(ValueError):
        idx.append(AbortedTxn(7, 1, 25, 26))
    raw = open(idx.path, "rb").read()
    assert raw[:ABORTED_TXN_SIZE].hex() == (
        "0000" "0000000000000005" "000000000000000a" "0000000000000014" "0000000000000015")
    assert TransactionIndex(idx.path).entries == idx.entries
    assert idx.collect(21, 100) == ([AbortedTxn(6, 15, 30, 31)], False)
    assert idx.collect(0, 21) == ([AbortedTxn(5, 10, 20, 21)], True)
    idx.truncate_to(30)
    assert TransactionIndex(idx.path).entries == (AbortedTxn(5, 10, 20, 21),)


def test_has_ongoing_transaction(tmp_path):
    lg = open_log(tmp_path / "t-0")
    assert not lg.has_ongoing_transaction(1)
    lg.append_as_leader(tbatch(1, 0))
    assert lg.has_ongoing_transaction(1) and not lg.has_ongoing_transaction(2)
    lg.append_end_txn_marker(1, 0, 0, True)
    assert not lg.has_ongoing_transaction(1)


def test_aborted_transactions_for_a_read_that_skips_a_gap_to_the_next_segment(tmp_path):
    """A read at an offset past its segment's last batch (a gap: compaction, or a replica
    append) returns the next segment's batches: the aborted transactions of that segment
    are in the answer."""
    lg = open_log(tmp_path / "t-0")
    lg.append_as_leader(plain(2))                       # 0-1
    lg.roll(5)                                          # offsets 2-4 never written
    b = bytearray(records.encode_batch([(T0, b"k", b"v", [])] * 2, producer_id=9, producer_epoch=0,
                                       base_sequence=0, is_transactional=True, base_offset=5))
    lg.append(b, assign_offsets=False)                  # 5-6, as a replica would
    lg.append_end_txn_marker(9, 0, 0, False)            # 7
    hw_to_end(lg)
    info = lg.read(3, 1 << 20, lg.last_stable_offset)
    assert info.fetch_offset_metadata.segment_base_offset == 5
    assert lg.aborted_transactions_for_read(3, info, lg.last_stable_offset) == [AbortedTxn(9, 5, 7, 8)]

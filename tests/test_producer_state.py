"""ProducerStateManager: Kafka's idempotent-producer rules, duplicates, expiry, snapshots."""
import os
import struct
from typing import NamedTuple

import crc32c as crc_oracle  # the PyPI package: an implementation independent of ours
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.log.producer_state import (
    INT32_MAX, NUM_BATCHES_TO_RETAIN, AppendOrigin, BatchMetadata, CorruptSnapshotError, InvalidProducerEpochError,
    InvalidTxnStateError, OutOfOrderSequenceError, ProducerStateEntry, ProducerStateError, ProducerStateManager,
    TransactionCoordinatorFencedError, UnknownProducerIdError, decode_snapshot, decrement_sequence, encode_snapshot,
    increment_sequence, read_snapshot, snapshot_file_name,
)

DAY_MS = 86_400_000
T0 = 1_700_000_000_000


class Batch(NamedTuple):
    """The header fields the producer state reads (a subset of kernels.records.BatchInfo)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_offset_delta: int = 0
    max_timestamp: int = T0
    is_transactional: bool = False
    is_control: bool = False


class Partition:
    """Drives a ProducerStateManager the way Log.append will: dedup, validate, write, commit."""

    def __init__(self, psm: ProducerStateManager, leo: int = 0):
        self.psm = psm
        self.leo = leo

    def produce(self, batch: Batch, origin=AppendOrigin.CLIENT) -> int:
        """Returns the base offset the produce response carries."""
        pending = self.psm.analyze_and_validate([(batch, self.leo)], origin)
        if pending.duplicate is not None:
            return pending.duplicate.first_offset
        base = self.leo
        self.leo += batch.last_offset_delta + 1        # "the write"
        self.psm.apply_append(pending.updated_producers, self.leo)
        return base


@pytest.fixture
def part(tmp_path):
    return Partition(ProducerStateManager(str(tmp_path), topic_partition="t-0"))


# -- sequence arithmetic --------------------------------------------------------------------
def test_sequence_wrap_helpers():
    assert increment_sequence(5, 3) == 8
    assert increment_sequence(INT32_MAX, 1) == 0
    assert increment_sequence(INT32_MAX - 1, 3) == 1
    assert decrement_sequence(1, 3) == INT32_MAX - 1
    assert decrement_sequence(8, 3) == 5
    for s in (0, 1, INT32_MAX - 2, INT32_MAX):
        for d in (0, 1, 2, 4, 100):
            assert decrement_sequence(increment_sequence(s, d), d) == s


def test_error_codes():
    assert OutOfOrderSequenceError.error_code == 45
    assert InvalidProducerEpochError.error_code == 47
    assert InvalidTxnStateError.error_code == 48
    assert TransactionCoordinatorFencedError.error_code == 52
    assert UnknownProducerIdError.error_code == 59
    assert issubclass(UnknownProducerIdError, ProducerStateError)


# -- sequence / epoch rules -----------------------------------------------------------------
def test_in_order_sequences_accepted(part):
    assert part.produce(Batch(1, 0, 0, 2)) == 0          # seqs 0..2
    assert part.produce(Batch(1, 0, 3, 0)) == 3          # seq 3
    assert part.produce(Batch(1, 0, 4, 4)) == 4          # seqs 4..8
    e = part.psm.last_entry(1)
    assert (e.producer_epoch, e.first_seq, e.last_seq, e.last_data_offset) == (0, 0, 8, 8)


def test_gap_is_out_of_order(part):
    part.produce(Batch(1, 0, 0, 1))
    with pytest.raises(OutOfOrderSequenceError):
        part.produce(Batch(1, 0, 3))                     # expected 2
    with pytest.raises(OutOfOrderSequenceError):
        part.produce(Batch(1, 0, 1))                     # overlaps, not an exact duplicate
    assert part.psm.last_entry(1).last_seq == 1          # nothing recorded
    assert part.leo == 2


def test_unknown_producer_accepts_any_first_sequence(part):
    """KIP-360 (Kafka >= 2.5): no state for the producer -> any sequence, no UNKNOWN_PRODUCER_ID."""
    assert part.produce(Batch(7, 3, 42, 1)) == 0
    e = part.psm.last_entry(7)
    assert (e.producer_epoch, e.first_seq, e.last_seq) == (3, 42, 43)
    with pytest.raises(OutOfOrderSequenceError):          # from now on it is tracked
        part.produce(Batch(7, 3, 45))
    part.produce(Batch(7, 3, 44))


def test_lower_epoch_is_invalid_producer_epoch(part):
    part.produce(Batch(1, 5, 0))
    with pytest.raises(InvalidProducerEpochError):
        part.produce(Batch(1, 4, 1))
    with pytest.raises(InvalidProducerEpochError):
        part.produce(Batch(1, 4, 0))


def test_epoch_bump_restarts_at_zero(part):
    part.produce(Batch(1, 0, 0, 9))
    with pytest.raises(OutOfOrderSequenceError):
        part.produce(Batch(1, 1, 10))                    # new epoch must start at 0
    part.produce(Batch(1, 1, 0, 1))
    e = part.psm.last_entry(1)
    assert (e.producer_epoch, e.first_seq, e.last_seq) == (1, 0, 1)
    assert len(e.batch_metadata) == 1                    # the old epoch's batches are forgotten
    with pytest.raises(InvalidProducerEpochError):        # the old epoch is fenced
        part.produce(Batch(1, 0, 0, 9))
    part.produce(Batch(1, 1, 2))


def test_wrap_around_after_int32_max(part):
    part.produce(Batch(1, 0, INT32_MAX - 2, 2))           # unknown producer: seqs MAX-2..MAX
    assert part.psm.last_entry(1).last_seq == INT32_MAX
    with pytest.raises(OutOfOrderSequenceError):
        part.produce(Batch(1, 0, 1))
    part.produce(Batch(1, 0, 0, 0))                       # MAX -> 0
    part.produce(Batch(1, 0, 1, 0))


def test_batch_spanning_the_wrap(part):
    part.produce(Batch(1, 0, INT32_MAX - 1, 0))
    base = part.produce(Batch(1, 0, INT32_MAX, 3))        # seqs MAX, 0, 1, 2
    e = part.psm.last_entry(1)
    assert e.last_seq == 2 and e.batch_metadata[-1].first_seq == INT32_MAX
    assert part.produce(Batch(1, 0, INT32_MAX, 3)) == base  # its retry is a duplicate
    assert part.leo == base + 4
    part.produce(Batch(1, 0, 3))


def test_several_batches_in_one_append_validated_in_turn(part):
    psm = part.psm
    part.produce(Batch(1, 0, 0))
    info = psm.prepare_update(1, AppendOrigin.CLIENT)
    info.append_data_batch(0, 1, 2, T0, 1, 2)
    info.append_data_batch(0, 3, 5, T0, 3, 5)            # checked against the batch before it
    with pytest.raises(OutOfOrderSequenceError):
        info.append_data_batch(0, 9, 9, T0, 6, 6)
    with pytest.raises(OutOfOrderSequenceError):
        info.append_data_batch(0, 1, 2, T0, 6, 7)
    assert psm.last_entry(1).last_seq == 0               # nothing committed before update()
    psm.update(info)
    assert psm.last_entry(1).last_seq == 5
    assert [b.first_seq for b in psm.last_entry(1).batch_metadata] == [0, 1, 3]


def test_first_append_of_unknown_producer_is_not_sequence_checked(part):
    """Kafka checks against the state *before* the append: with no epoch, every batch of it passes."""
    info = part.psm.prepare_update(1, AppendOrigin.CLIENT)
    info.append_data_batch(0, 0, 1, T0, 0, 1)
    info.append_data_batch(0, 9, 9, T0, 2, 2)
    part.psm.update(info)
    assert part.psm.last_entry(1).last_seq == 9


def test_failed_write_leaves_state_untouched(part):
    part.produce(Batch(1, 0, 0))
    pending = part.psm.analyze_and_validate([(Batch(1, 0, 1), part.leo)])
    assert pending.duplicate is None
    # the segment write fails -> apply_append is never called
    assert part.psm.last_entry(1).last_seq == 0
    part.produce(Batch(1, 0, 1))                          # the retry is still in sequence


def test_replication_origin_skips_checks(part):
    psm = part.psm
    part.produce(Batch(1, 5, 0))
    psm.update_from_batch(Batch(1, 5, 77), 1)             # gap: fine for replication
    psm.update_from_batch(Batch(1, 4, 3), 2)              # lower epoch: only a warning, adopted as Kafka
    assert psm.last_entry(1).producer_epoch == 4
    assert psm.map_end_offset == 3


def test_coordinator_origin_checks_epoch_only(part):
    psm = part.psm
    part.produce(Batch(1, 2, 0))
    info = psm.prepare_update(1, AppendOrigin.COORDINATOR)
    info.append_data_batch(2, 50, 50, T0, 1, 1)           # any sequence
    with pytest.raises(InvalidProducerEpochError):
        info.append_data_batch(1, 51, 51, T0, 2, 2)


def test_no_producer_id_batches_ignored(part):
    pending = part.psm.analyze_and_validate([(Batch(-1, -1, -1, 3), 0)])
    assert pending.updated_producers == {} and pending.duplicate is None
    assert part.psm.find_duplicate_batch(Batch(-1, -1, -1)) is None
    with pytest.raises(ValueError):
        part.psm.update(part.psm.prepare_update(-1, AppendOrigin.CLIENT))


# -- duplicates ------------------------------------------------------------------------------
def test_each_of_last_five_batches_is_a_duplicate_the_sixth_is_not(part):
    bases = []
    for i in range(6):
        bases.append(part.produce(Batch(1, 0, i * 3, 2, max_timestamp=T0 + i)))
    leo = part.leo
    assert len(part.psm.last_entry(1).batch_metadata) == NUM_BATCHES_TO_RETAIN
    for i in range(1, 6):                                 # the 5 most recent
        dup = part.psm.find_duplicate_batch(Batch(1, 0, i * 3, 2))
        assert dup == BatchMetadata(i * 3 + 2, bases[i] + 2, 2, T0 + i)
        assert part.produce(Batch(1, 0, i * 3, 2)) == bases[i]
    assert part.leo == leo                                # nothing appended
    assert part.psm.find_duplicate_batch(Batch(1, 0, 0, 2)) is None   # 6th-oldest: forgotten
    with pytest.raises(OutOfOrderSequenceError):
        part.produce(Batch(1, 0, 0, 2))


def test_duplicate_needs_same_epoch_and_exact_range(part):
    part.produce(Batch(1, 0, 0, 4))
    assert part.psm.find_duplicate_batch(Batch(1, 0, 0, 4)) is not None
    assert part.psm.find_duplicate_batch(Batch(1, 1, 0, 4)) is None
    assert part.psm.find_duplicate_batch(Batch(1, 0, 0, 3)) is None
    assert part.psm.find_duplicate_batch(Batch(1, 0, 1, 3)) is None
    assert part.psm.find_duplicate_batch(Batch(2, 0, 0, 4)) is None


def test_with_real_batch_headers(tmp_path):
    """The duck-typed batch argument accepts kernels.records.BatchInfo as produced by the records kernel."""
    from kbroker.kernels import records
    buf = records.encode_batch([(T0, b"k", b"v", []), (T0 + 5, None, b"w", [])],
                               producer_id=9, producer_epoch=1, base_sequence=0)
    (info,) = records.validate_batches(buf)
    p = Partition(ProducerStateManager(str(tmp_path)), leo=100)
    assert p.produce(info) == 100
    assert p.psm.last_entry(9).batch_metadata[-1] == BatchMetadata(1, 101, 1, T0 + 5)
    assert p.produce(info) == 100
    assert p.leo == 102


# -- expiry ----------------------------------------------------------------------------------
def test_remove_expired_producers(tmp_path):
    psm = ProducerStateManager(str(tmp_path))
    p = Partition(psm)
    p.produce(Batch(1, 0, 0, max_timestamp=T0))
    p.produce(Batch(2, 0, 0, max_timestamp=T0 + 1000))
    assert psm.remove_expired_producers(T0 + DAY_MS - 1) == []
    assert psm.remove_expired_producers(T0 + DAY_MS) == [1]           # >= expiration
    assert psm.last_entry(1) is None and psm.producer_id_count == 1
    p.produce(Batch(1, 0, 17, max_timestamp=T0 + DAY_MS))              # forgotten: any sequence again
    assert psm.remove_expired_producers(T0 + 1000 + DAY_MS) == [2]


def test_expiration_config_and_ongoing_txn_never_expires(tmp_path):
    psm = ProducerStateManager(str(tmp_path), producer_id_expiration_ms=1000)
    p = Partition(psm)
    p.produce(Batch(1, 0, 0, is_transactional=True))
    p.produce(Batch(2, 0, 0))
    assert psm.remove_expired_producers(T0 + 10_000) == [2]
    assert psm.last_entry(1).current_txn_first_offset == 0


# -- transactions seam ----------------------------------------------------------------------
def test_transactional_batches_and_markers(part):
    psm = part.psm
    part.produce(Batch(1, 0, 0))
    info = psm.prepare_update(1, AppendOrigin.CLIENT)
    info.append_data_batch(0, 1, 1, T0, 1, 1, is_transactional=True)
    assert info.started_transactions == [1]
    with pytest.raises(InvalidTxnStateError):
        info.append_data_batch(0, 2, 2, T0, 2, 2, is_transactional=False)
    psm.apply_append({1: info}, 2)
    assert psm.last_entry(1).current_txn_first_offset == 1
    completed = psm.update_from_batch(Batch(1, 0, -1, is_control=True), 2, end_txn_marker=(False, 3))
    assert tuple(completed) == (1, 1, 2, False)
    e = psm.last_entry(1)
    assert e.current_txn_first_offset is None and e.coordinator_epoch == 3
    marker = psm.prepare_update(1, AppendOrigin.COORDINATOR)
    with pytest.raises(TransactionCoordinatorFencedError):
        marker.append_end_txn_marker(0, 2, True, 3, T0)


# -- snapshots -------------------------------------------------------------------------------
def _expected_snapshot(rows):
    body = struct.pack(">i", len(rows))
    for (pid, epoch, seq, off, delta, ts, coord, txn) in rows:
        body += (pid.to_bytes(8, "big", signed=True) + epoch.to_bytes(2, "big", signed=True)
                 + seq.to_bytes(4, "big", signed=True) + off.to_bytes(8, "big", signed=True)
                 + delta.to_bytes(4, "big", signed=True) + ts.to_bytes(8, "big", signed=True)
                 + coord.to_bytes(4, "big", signed=True) + txn.to_bytes(8, "big", signed=True))
    return b"\x00\x01" + crc_oracle.crc32c(body).to_bytes(4, "big") + body


def test_snapshot_bytes_match_kafka_layout(tmp_path):
    psm = ProducerStateManager(str(tmp_path))
    p = Partition(psm, leo=40)
    p.produce(Batch(1000, 3, 0, 1, max_timestamp=T0))            # offsets 40..41
    p.produce(Batch(7, 0, 5, 0, max_timestamp=T0 + 9))           # offset 42
    p.produce(Batch(1000, 3, 2, 2, max_timestamp=T0 + 20))       # offsets 43..45
    path = psm.take_snapshot()
    assert os.path.basename(path) == "00000000000000000046.snapshot" == snapshot_file_name(46)
    data = open(path, "rb").read()
    expected = _expected_snapshot([
        # producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp, coordinator_epoch, txn_first
        (7, 0, 5, 42, 0, T0 + 9, -1, -1),
        (1000, 3, 4, 45, 2, T0 + 20, -1, -1),
    ])
    assert data == expected
    # field by field, at Kafka's offsets
    assert struct.unpack_from(">h", data, 0) == (1,)
    assert struct.unpack_from(">I", data, 2) == (crc_oracle.crc32c(data[6:]),)
    assert struct.unpack_from(">i", data, 6) == (2,)
    assert len(data) == 10 + 2 * 46
    e = 10 + 46
    assert struct.unpack_from(">q", data, e) == (1000,)
    assert struct.unpack_from(">h", data, e + 8) == (3,)
    assert struct.unpack_from(">i", data, e + 10) == (4,)
    assert struct.unpack_from(">q", data, e + 14) == (45,)
    assert struct.unpack_from(">i", data, e + 22) == (2,)
    assert struct.unpack_from(">q", data, e + 26) == (T0 + 20,)
    assert struct.unpack_from(">i", data, e + 34) == (-1,)
    assert struct.unpack_from(">q", data, e + 38) == (-1,)
    # read back: each producer's last batch only
    assert read_snapshot(path) == [
        ProducerStateEntry(7, 0, -1, T0 + 9, None, [BatchMetadata(5, 42, 0, T0 + 9)]),
        ProducerStateEntry(1000, 3, -1, T0 + 20, None, [BatchMetadata(4, 45, 2, T0 + 20)]),
    ]


def test_snapshot_entry_without_batches_and_with_txn():
    entries = [ProducerStateEntry(5, 2, 7, T0, 33), ProducerStateEntry(-0x8000000000000000 + 1, 0, 0, -1, None)]
    data = encode_snapshot(entries)
    assert data == _expected_snapshot([(5, 2, -1, -1, 0, T0, 7, 33),
                                       (-0x8000000000000000 + 1, 0, -1, -1, 0, -1, 0, -1)])
    assert decode_snapshot(data) == entries
    assert encode_snapshot([]) == _expected_snapshot([])


def test_load_from_snapshot_restores_state(tmp_path):
    psm = ProducerStateManager(str(tmp_path))
    p = Partition(psm)
    for i in range(3):
        p.produce(Batch(1, 0, i * 2, 1, max_timestamp=T0 + i))
    p.produce(Batch(2, 4, 0, max_timestamp=T0))
    psm.take_snapshot()
    assert psm.take_snapshot() is None                    # no new offsets: no new file
    fresh = ProducerStateManager(str(tmp_path))
    assert fresh.load_from_snapshot(0, 7, T0) == 7
    assert fresh.map_end_offset == 7 and fresh.producer_id_count == 2
    assert fresh.last_entry(1).batch_metadata[-1] == psm.last_entry(1).batch_metadata[-1]
    q = Partition(fresh, leo=7)
    assert q.produce(Batch(1, 0, 4, 1)) == 4              # the last batch survives as a duplicate
    with pytest.raises(OutOfOrderSequenceError):
        q.produce(Batch(1, 0, 2, 1))                      # older batches do not (as Kafka)
    q.produce(Batch(1, 0, 6))
    # expired producers are not loaded
    again = ProducerStateManager(str(tmp_path))
    again.load_from_snapshot(0, 7, T0 + 2 + DAY_MS)
    assert again.producer_id_count == 0


def test_corrupt_snapshot_ignored_and_older_used(tmp_path):
    psm = ProducerStateManager(str(tmp_path))
    p = Partition(psm)
    p.produce(Batch(1, 0, 0))
    older = psm.take_snapshot()                           # offset 1
    p.produce(Batch(1, 0, 1))
    newer = psm.take_snapshot()                           # offset 2
    raw = bytearray(open(newer, "rb").read())
    raw[6 + 4 + 13] ^= 0x01                               # a byte of last_sequence
    open(newer, "wb").write(raw)
    with pytest.raises(CorruptSnapshotError):
        read_snapshot(newer)
    fresh = ProducerStateManager(str(tmp_path))
    assert fresh.load_from_snapshot(0, 10, T0) == 1       # fell back to the older one
    assert not os.path.exists(newer) and os.path.exists(older)
    assert fresh.last_entry(1).last_seq == 0
    # the log replays the batch after the snapshot
    fresh.update_from_batch(Batch(1, 0, 1), 1)
    assert fresh.last_entry(1).last_seq == 1 and fresh.map_end_offset == 2


@pytest.mark.parametrize("mutate", [
    lambda d: d[:9],                                      # too short
    lambda d: d[:-1],                                     # cut inside an entry
    lambda d: d + b"\x00",                                # trailing byte
    lambda d: b"\x00\x02" + d[2:],                        # unknown version
    lambda d: d[:6] + b"\xff\xff\xff\xff" + d[10:],       # negative count
    lambda d: d[:2] + bytes([d[2] ^ 0x80]) + d[3:],       # stored crc
])
def test_decode_snapshot_rejects(mutate):
    data = encode_snapshot([ProducerStateEntry(1, 0, -1, T0, None, [BatchMetadata(3, 10, 1, T0)])])
    bad = mutate(data)
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(bad)


def test_all_snapshots_corrupt_starts_from_log_start(tmp_path):
    open(tmp_path / snapshot_file_name(5), "wb").write(b"garbage!!!!!")
    psm = ProducerStateManager(str(tmp_path))
    assert psm.snapshot_offsets() == [5]
    assert psm.load_from_snapshot(3, 10, T0) == 3
    assert psm.snapshot_offsets() == [] and psm.is_empty()


def test_stale_tmp_removed_and_foreign_files_ignored(tmp_path):
    (tmp_path / (snapshot_file_name(9) + ".tmp")).write_bytes(b"half")
    (tmp_path / "00000000000000000000.log").write_bytes(b"")
    (tmp_path / "x.snapshot").write_bytes(b"")
    psm = ProducerStateManager(str(tmp_path))
    assert psm.snapshot_offsets() == []
    assert not (tmp_path / (snapshot_file_name(9) + ".tmp")).exists()


# -- truncation ------------------------------------------------------------------------------
def _three_snapshots(tmp_path):
    psm = ProducerStateManager(str(tmp_path))
    p = Partition(psm)
    for i in range(3):
        p.produce(Batch(1, 0, i, max_timestamp=T0))
        psm.take_snapshot()                               # at 1, 2, 3
    p.produce(Batch(1, 0, 3, max_timestamp=T0))           # leo 4, not snapshotted
    return psm, p


def test_truncate_and_reload(tmp_path):
    psm, _ = _three_snapshots(tmp_path)
    assert psm.snapshot_offsets() == [1, 2, 3]
    assert psm.truncate_and_reload(0, 2, T0) == 2         # log truncated to end at offset 2
    assert psm.snapshot_offsets() == [1, 2]
    assert psm.last_entry(1).last_seq == 1
    q = Partition(psm, leo=2)
    q.produce(Batch(1, 0, 2))                             # seq 2 is expected again


def test_truncate_and_reload_between_snapshots_replays(tmp_path):
    psm, _ = _three_snapshots(tmp_path)
    assert psm.truncate_and_reload(0, 3, T0) == 3          # snapshot at 3 is still valid
    assert psm.truncate_and_reload(1, 3, T0) == 3          # same end: only the start moves
    assert psm.snapshot_offsets() == [2, 3]                # <= log start deleted (as Kafka)
    assert psm.truncate_and_reload(2, 2, T0) == 2          # nothing left in (2, 2]: start over at 2
    assert psm.snapshot_offsets() == [] and psm.is_empty()


def test_truncate_head_keeps_producers(tmp_path):
    psm, p = _three_snapshots(tmp_path)
    psm.truncate_head(3)
    assert psm.snapshot_offsets() == [3]
    assert psm.last_entry(1).last_seq == 3                 # KIP-360: state survives retention
    p.produce(Batch(1, 0, 4))
    psm.truncate_head(10)                                  # start beyond the end (DeleteRecords to LEO)
    assert psm.map_end_offset == 10 and psm.last_snap_offset == 10 and psm.snapshot_offsets() == []
    assert psm.last_entry(1).last_seq == 4


def test_truncate_fully_and_start_at(tmp_path):
    psm, _ = _three_snapshots(tmp_path)
    psm.truncate_fully_and_start_at(50)
    assert psm.is_empty() and psm.snapshot_offsets() == [] and psm.map_end_offset == 50
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".snapshot")]
    Partition(psm, leo=50).produce(Batch(1, 0, 9))          # unknown again


def test_delete_snapshots_before_and_mark_for_deletion(tmp_path):
    psm, _ = _three_snapshots(tmp_path)
    psm.delete_snapshots_before(2)
    assert psm.snapshot_offsets() == [2, 3] and psm.oldest_snapshot_offset() == 2
    marked = psm.remove_and_mark_snapshot_for_deletion(2)
    assert marked.endswith(".snapshot.deleted") and os.path.exists(marked)
    assert psm.snapshot_offsets() == [3] and psm.latest_snapshot_offset() == 3
    assert psm.remove_and_mark_snapshot_for_deletion(2) is None


def test_remove_stray_snapshots(tmp_path):
    psm, _ = _three_snapshots(tmp_path)
    psm.update_map_end_offset(9)
    psm.take_snapshot()                                    # clean-shutdown snapshot above all segments
    psm.remove_stray_snapshots([0, 2])
    assert psm.snapshot_offsets() == [2, 9]
    psm.remove_stray_snapshots([0, 2, 12])                 # 9 is now below a segment: removed
    assert psm.snapshot_offsets() == [2]


def test_rebuild_by_replay_equals_live_state(tmp_path):
    live_dir, replay_dir = tmp_path / "a", tmp_path / "b"
    live_dir.mkdir(), replay_dir.mkdir()
    live = Partition(ProducerStateManager(str(live_dir)))
    appended = []
    for i in range(20):
        pid = i % 3
        b = Batch(pid, 0, (i // 3) * 2, 1, max_timestamp=T0 + i)
        appended.append((b, live.produce(b)))
    replay = ProducerStateManager(str(replay_dir))
    for b, base in appended:
        replay.update_from_batch(b, base)
    assert replay.map_end_offset == live.leo
    for pid in range(3):
        assert replay.last_entry(pid) == live.psm.last_entry(pid)


@pytest.mark.parametrize("count", [-1, 0, 2])
def test_decode_snapshot_rejects_count_mismatch_with_valid_crc(count):
    body = struct.pack(">i", count) + bytes(46)
    data = b"\x00\x01" + crc_oracle.crc32c(body).to_bytes(4, "big") + body
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(data)


def test_log_append_time_replaces_batch_timestamp(part):
    pending = part.psm.analyze_and_validate([(Batch(1, 0, 0, max_timestamp=5), 0)], log_append_time_ms=T0)
    part.psm.apply_append(pending.updated_producers, 1)
    assert part.psm.last_entry(1).last_timestamp == T0


_i16 = st.integers(-2**15, 2**15 - 1)
_i32 = st.integers(-2**31, 2**31 - 1)
_i64 = st.integers(-2**63, 2**63 - 1)


@st.composite
def _entries(draw):
    out = []
    for pid in draw(st.sets(_i64, max_size=8)):
        last_offset = draw(st.one_of(st.just(-1), st.integers(0, 2**62)))
        ts = draw(_i64)
        batches = [BatchMetadata(draw(_i32), last_offset, draw(_i32), ts)] if last_offset >= 0 else []
        txn = draw(st.one_of(st.none(), st.integers(0, 2**63 - 1)))
        out.append(ProducerStateEntry(pid, draw(_i16), draw(_i32), ts, txn, batches))
    return out


@settings(max_examples=200, deadline=None)
@given(_entries())
def test_snapshot_round_trip_property(entries):
    data = encode_snapshot(entries)
    assert len(data) == 10 + 46 * len(entries)
    assert int.from_bytes(data[2:6], "big") == crc_oracle.crc32c(data[6:])
    assert decode_snapshot(data) == entries

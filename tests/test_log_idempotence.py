"""The log's idempotent-producer state: duplicates, sequence/epoch errors, snapshots
at roll and close, rebuild from snapshot + replay on open, truncation, retention,
expiry (kbroker/log/log.py + producer_state.py)."""
import os
import time

import pytest

from kbroker.kernels import records
from kbroker.log import LogConfig, LogManager
from kbroker.log.log import Log
from kbroker.log.producer_state import (
    INT32_MAX, InvalidProducerEpochError, OutOfOrderSequenceError, read_snapshot,
)
from kbroker.log.segment import LogSegment
from tests._log_util import Clock, read_all

PID = 4242


def ibatch(seq, n=1, pid=PID, epoch=0, ts=None, value=b"v"):
    """An idempotent batch of ``n`` records starting at sequence ``seq``."""
    ts = ts if ts is not None else Clock().now
    return bytearray(records.encode_batch([(ts, b"k", value + b"%d" % i, []) for i in range(n)],
                                          producer_id=pid, producer_epoch=epoch, base_sequence=seq))


def open_log(path, clock=None, **cfg):
    return Log.open(str(path), LogConfig(cfg), time_ms=clock or Clock())


def snapshots(lg):
    return sorted(int(n.split(".")[0]) for n in os.listdir(lg.dir) if n.endswith(".snapshot"))


def test_duplicate_of_each_of_the_last_five_batches_returns_original_offsets(tmp_path):
    lg = open_log(tmp_path / "t-0")
    firsts = []
    for i in range(7):
        info = lg.append(ibatch(2 * i, n=2))
        firsts.append(info.first_offset)
        assert (info.first_offset, info.last_offset, info.batch_count) == (2 * i, 2 * i + 1, 1)
    leo = lg.log_end_offset
    for i in range(2, 7):                      # the last 5 batches: retries are answered, not appended
        info = lg.append(ibatch(2 * i, n=2))
        assert (info.first_offset, info.last_offset, info.batch_count) == (firsts[i], firsts[i] + 1, 0)
    assert lg.log_end_offset == leo
    # the 6th-newest is no longer remembered: it is out of sequence now
    with pytest.raises(OutOfOrderSequenceError) as e:
        lg.append(ibatch(2, n=2))
    assert e.value.error_code == 45
    assert lg.log_end_offset == leo
    assert len(read_all(lg)) == 14


def test_gap_stale_epoch_and_unknown_producer(tmp_path):
    lg = open_log(tmp_path / "t-0")
    assert lg.append(ibatch(0, n=3)).first_offset == 0
    with pytest.raises(OutOfOrderSequenceError):          # 3 expected, 4 is a gap
        lg.append(ibatch(4))
    with pytest.raises(OutOfOrderSequenceError):          # new epoch must start at 0
        lg.append(ibatch(3, epoch=1))
    assert lg.append(ibatch(0, epoch=1)).first_offset == 3
    with pytest.raises(InvalidProducerEpochError) as e:   # epoch 0 is fenced now
        lg.append(ibatch(3, epoch=0))
    assert e.value.error_code == 47
    # a producer the partition has never seen may start anywhere (KIP-360)
    assert lg.append(ibatch(77, pid=PID + 1)).first_offset == 4
    assert lg.append(ibatch(78, pid=PID + 1)).first_offset == 5
    assert lg.log_end_offset == 6
    # a non-idempotent batch is never checked
    assert lg.append(bytearray(records.encode_batch([(1, b"k", b"v", [])]))).first_offset == 6


def test_sequence_wraps_at_int32_max(tmp_path):
    lg = open_log(tmp_path / "t-0")
    lg.append(ibatch(INT32_MAX - 1, n=3))                  # sequences MAX-1, MAX, 0
    assert lg.append(ibatch(INT32_MAX - 1, n=3)).batch_count == 0   # its retry is a duplicate
    with pytest.raises(OutOfOrderSequenceError):
        lg.append(ibatch(0))
    assert lg.append(ibatch(1, n=2)).first_offset == 3
    assert lg.producer_state.last_entry(PID).last_seq == 2


def test_failed_validation_appends_nothing_and_keeps_state(tmp_path):
    lg = open_log(tmp_path / "t-0")
    lg.append(ibatch(0))
    buf = ibatch(1) + ibatch(5)     # second batch of the request has a gap: the whole append fails
    with pytest.raises(OutOfOrderSequenceError):
        lg.append(buf)
    assert lg.log_end_offset == 1
    assert lg.append(ibatch(1)).first_offset == 1


def test_replica_append_is_not_checked(tmp_path):
    lg = open_log(tmp_path / "t-0")
    lg.append(ibatch(0))
    b = records.encode_batch([(1, b"k", b"v", [])], base_offset=1, producer_id=PID, producer_epoch=0,
                             base_sequence=9)
    assert lg.append(bytearray(b), assign_offsets=False).first_offset == 1
    assert lg.producer_state.last_entry(PID).last_seq == 9


def test_snapshot_at_every_roll_and_on_clean_close(tmp_path):
    lg = open_log(tmp_path / "t-0", **{"segment.bytes": 400})
    for i in range(12):
        lg.append(ibatch(i, value=b"x" * 60))
    bases = [s.base_offset for s in lg.segments]
    assert len(bases) > 2
    assert snapshots(lg) == bases[1:]                     # one per roll, named by the new base offset
    leo = lg.log_end_offset
    lg.close()
    assert snapshots(lg)[-1] == leo
    entries = read_snapshot(os.path.join(lg.dir, f"{leo:020d}.snapshot"))
    assert [(e.producer_id, e.last_seq, e.last_data_offset) for e in entries] == [(PID, 11, leo - 1)]


def test_clean_reopen_loads_snapshot_without_scanning(tmp_path, monkeypatch):
    lg = open_log(tmp_path / "t-0", **{"segment.bytes": 400})
    for i in range(12):
        lg.append(ibatch(i, value=b"x" * 60))
    lg.close()
    scanned = []
    orig = LogSegment.batch_headers
    monkeypatch.setattr(LogSegment, "batch_headers", lambda self, start: (scanned.append(start), orig(self, start))[1])
    lg = Log.open(lg.dir, LogConfig({"segment.bytes": 400}), had_clean_shutdown=True, time_ms=Clock())
    assert scanned == []
    # only the last batch of a producer survives a snapshot (as Kafka): its retry is a duplicate
    assert lg.append(ibatch(11, value=b"x" * 60)).batch_count == 0
    with pytest.raises(OutOfOrderSequenceError):
        lg.append(ibatch(10, value=b"x" * 60))
    assert lg.append(ibatch(12, value=b"x" * 60)).first_offset == 12


def test_crash_reopen_replays_only_after_newest_snapshot(tmp_path, monkeypatch):
    cfg = {"segment.bytes": 400}
    lg = open_log(tmp_path / "t-0", **cfg)
    for i in range(12):
        lg.append(ibatch(i, value=b"x" * 60))
    lg.roll()
    last_base = lg.segments[-1].base_offset
    assert last_base == 12 and snapshots(lg)[-1] == last_base
    for i in range(12, 15):                               # stays in the active segment
        lg.append(ibatch(i, value=b"y"))
    assert lg.segments[-1].base_offset == last_base
    leo = lg.log_end_offset
    for s in lg.segments:                                 # "crash": no close, no snapshot at the end
        s.flush()
    scanned = []
    orig = LogSegment.batch_headers
    monkeypatch.setattr(LogSegment, "batch_headers",
                        lambda self, start: (scanned.append((self.base_offset, start)), orig(self, start))[1])
    lg2 = Log.open(lg.dir, LogConfig(cfg), had_clean_shutdown=False, time_ms=Clock())
    assert scanned == [(last_base, last_base)]
    assert lg2.log_end_offset == leo
    # the batches after the snapshot are all remembered again: each retry is a duplicate
    for i, off in zip(range(12, 15), range(leo - 3, leo)):
        info = lg2.append(ibatch(i, value=b"y"))
        assert (info.first_offset, info.batch_count) == (off, 0)
    assert lg2.log_end_offset == leo
    assert snapshots(lg2)[-1] == leo                      # written at the end of the rebuild


def test_corrupt_snapshot_falls_back_to_older_one(tmp_path):
    cfg = {"segment.bytes": 400}
    lg = open_log(tmp_path / "t-0", **cfg)
    for i in range(12):
        lg.append(ibatch(i, value=b"x" * 60))
    snaps = snapshots(lg)
    for s in lg.segments:
        s.flush()
    with open(os.path.join(lg.dir, f"{snaps[-1]:020d}.snapshot"), "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff")
    lg2 = Log.open(lg.dir, LogConfig(cfg), had_clean_shutdown=False, time_ms=Clock())
    assert lg2.producer_state.last_entry(PID).last_seq == 11
    assert lg2.append(ibatch(11, value=b"x" * 60)).batch_count == 0


def test_log_written_before_producer_state_existed(tmp_path):
    lg = open_log(tmp_path / "t-0")
    for i in range(3):
        lg.append(ibatch(i))
    lg.close()
    for n in os.listdir(lg.dir):
        if n.endswith(".snapshot"):
            os.unlink(os.path.join(lg.dir, n))
    # clean shutdown and no snapshot at all: Kafka's upgrade path, no scan; one segment:
    # no snapshot is written either (a crash would replay the segment recovery scans)
    lg = Log.open(lg.dir, LogConfig(), had_clean_shutdown=True, time_ms=Clock())
    assert lg.producer_state.is_empty()
    assert snapshots(lg) == []
    assert lg.append(ibatch(9)).first_offset == 3        # unknown producer: accepted
    lg.close()
    # after a crash without snapshots the whole log is replayed
    for n in os.listdir(lg.dir):
        if n.endswith(".snapshot"):
            os.unlink(os.path.join(lg.dir, n))
    lg = Log.open(lg.dir, LogConfig(), had_clean_shutdown=False, time_ms=Clock())
    assert lg.producer_state.last_entry(PID).last_seq == 9


def test_truncate_to_reloads_producer_state(tmp_path):
    lg = open_log(tmp_path / "t-0", **{"segment.bytes": 400})
    for i in range(12):
        lg.append(ibatch(i, value=b"x" * 60))
    assert len(lg.segments) > 2
    lg.truncate_to(7)
    assert lg.log_end_offset == 7
    assert all(o <= 7 for o in snapshots(lg))
    assert lg.producer_state.last_entry(PID).last_seq == 6
    with pytest.raises(OutOfOrderSequenceError):
        lg.append(ibatch(8, value=b"x" * 60))
    assert lg.append(ibatch(7, value=b"x" * 60)).first_offset == 7
    lg.truncate_fully_and_start_at(100)
    assert lg.producer_state.is_empty() and snapshots(lg) == []


def test_log_start_offset_moves_delete_old_snapshots_and_keep_producers(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path / "t-0", clock, **{"segment.bytes": 400, "file.delete.delay.ms": 0})
    for i in range(12):
        lg.append(ibatch(i, value=b"x" * 60))
    lg.update_high_watermark(lg.log_end_offset)
    bases = [s.base_offset for s in lg.segments]
    lg.delete_records(bases[2] + 1)
    assert snapshots(lg) and min(snapshots(lg)) >= bases[2] + 1
    assert lg.delete_old_segments() == 2
    assert lg.log_start_offset == bases[2] + 1
    assert lg.producer_state.last_entry(PID).last_seq == 11
    assert lg.append(ibatch(12, value=b"x" * 60)).first_offset == 12


def test_log_manager_expires_idle_producers(tmp_path):
    clock = Clock()
    lm = LogManager([str(tmp_path / "d")], LogConfig(), time_ms=clock, background=False,
                    producer_id_expiration_ms=60_000)
    lm.startup()
    lg = lm.get_or_create_log(("t", 0))
    lg.append(ibatch(0, ts=clock.now))
    lg.append(ibatch(5, pid=PID + 1, ts=clock.now + 50_000))
    clock.now += 60_000
    assert lm.remove_expired_producers() == 1
    assert lg.producer_state.last_entry(PID) is None
    assert lg.producer_state.last_entry(PID + 1) is not None
    assert lg.append(ibatch(9)).first_offset == 2        # forgotten producer: accepted at any sequence
    lm.shutdown()


def test_log_manager_restart_keeps_producer_state(tmp_path):
    d = str(tmp_path / "d")
    lm = LogManager([d], LogConfig(), background=False)
    lm.startup()
    lg = lm.get_or_create_log(("t", 0))
    now = int(time.time() * 1000)
    for i in range(4):
        lg.append(ibatch(i, ts=now))
    lg.append(ibatch(0, pid=PID + 1, ts=now - 86_400_000))   # idle for producer.id.expiration.ms
    lm.shutdown()
    lm = LogManager([d], LogConfig(), background=False)
    lm.startup()
    lg = lm.get_log(("t", 0))
    assert lg.append(ibatch(3, ts=now)).batch_count == 0
    assert lg.append(ibatch(4, ts=now)).first_offset == 5
    assert lg.producer_state.last_entry(PID + 1) is None     # expired producers are not loaded
    lm.shutdown()


def test_rename_dir_moves_snapshots(tmp_path):
    lg = open_log(tmp_path / "t-0", **{"segment.bytes": 400})
    for i in range(12):
        lg.append(ibatch(i, value=b"x" * 60))
    new = str(tmp_path / "t-0.abc-delete")
    lg.rename_dir(new)
    assert snapshots(lg) == [3, 6, 9]
    lg.truncate_to(3)      # deletes the snapshots above 3 through their new paths
    assert snapshots(lg) == [3]
    lg.close()


def test_crash_reopen_of_a_small_segment_opens_no_index_and_reads_no_txnindex(tmp_path, monkeypatch):
    """A restart after a crash replays the batches after the newest snapshot: in a small
    active segment they are found by its one read, not through the offset index (Kafka's
    lazy indexes stay unopened), and a segment the listing shows without a .txnindex has
    none to read. The replayed batches are known again."""
    from kbroker.log import txn_index
    lg = open_log(tmp_path / "t-0", **{"index.interval.bytes": 1})
    for i in range(3):
        lg.append(ibatch(i))
    lg.close()                                            # snapshot at 3
    lg = open_log(tmp_path / "t-0", **{"index.interval.bytes": 1})
    for i in range(3, 6):
        lg.append(ibatch(i))
    for s in lg.segments:                                 # "crash": no close, no snapshot at 6
        s.flush()
    assert snapshots(lg) == [3]
    opened = []
    monkeypatch.setattr(txn_index, "open", lambda p, *a: (opened.append(p), open(p, *a))[1], raising=False)
    lg2 = Log.open(lg.dir, LogConfig({"index.interval.bytes": 1}), had_clean_shutdown=False, time_ms=Clock())
    seg = lg2.segments[-1]
    assert lg2.log_end_offset == 6
    assert not seg.offset_index.is_loaded and not seg.time_index.is_loaded
    assert opened == []
    for i in range(3, 6):                                 # each replayed batch: a duplicate
        info = lg2.append(ibatch(i))
        assert (info.first_offset, info.batch_count) == (i, 0)
    assert lg2.log_end_offset == 6
    assert lg2.append(ibatch(6)).first_offset == 6
    assert [o for o, _ in read_all(lg2, 4)] == [4, 5, 6]
    lg2.close()


def test_batch_headers_of_a_small_segment_start_at_the_batch_holding_the_offset(tmp_path):
    lg = open_log(tmp_path / "t-0", **{"index.interval.bytes": 1})
    for i in range(4):
        lg.append(ibatch(2 * i, n=2))                     # offsets [0,1] [2,3] [4,5] [6,7]
    seg = lg.segments[-1]
    for start in range(0, 9):
        got = [(h.base_offset, h.last_offset) for h in seg.batch_headers(start)]
        assert got == [(b, b + 1) for b in range(0, 8, 2) if b + 1 >= start], start
    lg.close()


def test_next_in_sequence_fast_path_matches_the_general_path(tmp_path):
    """Log.append takes a one-kernel-call path for a batch that is simply its idempotent or
    transactional producer's next one (ProducerStateManager.next_in_sequence). Random
    appends (next in sequence, retries of each of the last batches, gaps, stale and new
    epochs, new producers, transactions opened by a batch and ended by COMMIT/ABORT
    markers, several batches at once, small segments that roll)
    give the same offsets, errors, bytes and producer state with the BatchInfos (fast path
    allowed) as without them (always the general path)."""
    import random

    from kbroker.log.producer_state import ProducerStateError

    rng = random.Random(7)
    clock = Clock()
    fast = open_log(tmp_path / "f-0", clock, **{"segment.bytes": 4096})
    slow = open_log(tmp_path / "s-0", clock, **{"segment.bytes": 4096})
    seqs = {}                  # pid -> (epoch, next sequence)
    hits = txn_hits = 0
    try:
        for step in range(1500):
            clock.now += rng.randint(0, 3)
            pid = rng.choice([101, 102, 103, 104, -1])
            epoch, nxt = seqs.get(pid, (0, 0))
            n = rng.randint(1, 4)
            kind = rng.random()
            if pid == -1:
                bufs = [bytearray(records.encode_batch([(clock.now, b"k", b"p%d" % i, []) for i in range(n)]))]
            else:
                seq = nxt
                if kind < 0.1:
                    seq = max(0, nxt - rng.randint(1, 6) * n)      # a retry (or an older batch)
                elif kind < 0.13:
                    seq = nxt + rng.randint(1, 3)                  # a gap
                elif kind < 0.16:
                    epoch, seq = epoch + 1, 0                      # a new epoch
                elif kind < 0.18:
                    epoch = max(0, epoch - 1)                      # a stale epoch
                txn = pid == 104                                   # transactional (ended by markers)
                many = 2 if 0.2 < kind < 0.25 else 1               # two batches in one append
                bufs = []
                for j in range(many):
                    bufs.append(bytearray(records.encode_batch(
                        [(clock.now, b"k", b"v%d" % i, []) for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq + j * n, is_transactional=txn)))
            buf = bytearray(b"".join(bufs))
            results = []
            for lg, infos in ((fast, records.validate_batches(buf)), (slow, None)):
                try:
                    info = lg.append(bytearray(buf), infos, leader_epoch=0)
                    results.append((info.first_offset, info.last_offset, info.batch_count))
                except ProducerStateError as e:
                    results.append(type(e).__name__)
            assert results[0] == results[1], (step, results)
            if isinstance(results[0], tuple) and results[0][2] and pid != -1:
                if many == 1 and (epoch, seq) == seqs.get(pid, (0, 0)) and pid in seqs:
                    hits += 1                  # a next-in-sequence batch (fast unless it opens a txn)
                    txn_hits += txn
                seqs[pid] = (epoch, seq + many * n)
            if pid == 104 and rng.random() < 0.15:                 # the coordinator ends the transaction
                commit = rng.random() < 0.5
                ends = []
                for lg in (fast, slow):
                    try:
                        ends.append(lg.append_end_txn_marker(104, seqs.get(104, (0, 0))[0], 0, commit,
                                                             leader_epoch=0).first_offset)
                    except ProducerStateError as e:
                        ends.append(type(e).__name__)
                assert ends[0] == ends[1], (step, ends)
                assert fast.last_stable_offset == slow.last_stable_offset
            assert fast.log_end_offset == slow.log_end_offset
            assert dict(fast.producer_state.active_producers) == dict(slow.producer_state.active_producers), step
            assert fast.producer_state.map_end_offset == slow.producer_state.map_end_offset
        assert read_all(fast) == read_all(slow)
        assert len(fast.segments) > 3          # rolls happened along the way
        assert hits > 300 and txn_hits > 50, (hits, txn_hits)
    finally:
        fast.close()
        slow.close()

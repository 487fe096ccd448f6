"""A follower's log operations (kbroker/log/log.py): append_as_follower (the leader's
batches as they are), truncate_to / truncate_fully_and_start_at as a follower uses them
(durable: a crash after them resurrects nothing), end_offset_for_epoch. Each on disk,
each followed by a restart: a clean one and a crash (the Log abandoned, reopened
without the clean-shutdown marker and with the recovery point it had before)."""
import os

import pytest

from kbroker.kernels import records
from kbroker.log import LogConfig
from kbroker.log.errors import CorruptRecordError, UnexpectedAppendOffsetError
from kbroker.log.log import Log
from kbroker.log.producer_state import OutOfOrderSequenceError
from tests._log_util import Clock, read_all

PID = 777
SEG = 400   # bytes per segment: a few batches each


def lbatch(base, n=1, epoch=0, pid=-1, seq=-1, value=b"v"):
    """A batch as a leader wrote it: offsets from ``base``, partition leader epoch ``epoch``."""
    kw = dict(producer_id=pid, producer_epoch=0, base_sequence=seq) if pid >= 0 else {}
    return records.encode_batch([(Clock().now + i, b"k", value + b"%d" % (base + i), []) for i in range(n)],
                                base_offset=base, partition_leader_epoch=epoch, **kw)


def open_log(path, *, crash_of=None, **cfg):
    """Open ``path``; ``crash_of``: reopen after a crash of that Log (no clean shutdown,
    its recovery point as the last checkpoint would have it)."""
    cfg.setdefault("segment.bytes", SEG)
    rp = 0 if crash_of is None else crash_of.recovery_point
    # a deferred leader-epoch checkpoint, as under a LogManager (written on flush only)
    return Log.open(str(path), LogConfig(cfg), time_ms=Clock(), recovery_point=rp,
                    scheduler=lambda fn: False)


def reopened(lg, how, **cfg):
    if how == "clean":
        lg.close()
        return Log.open(lg.dir, LogConfig({"segment.bytes": SEG, **cfg}), time_ms=Clock(),
                        had_clean_shutdown=True, scheduler=lambda fn: False)
    return open_log(lg.dir, crash_of=lg, **cfg)


RESTARTS = ["clean", "crash"]


def values(lg):
    return [(o, v) for o, v in read_all(lg)]


def leader_log_values(n):
    return [(i, b"v%d" % i) for i in range(n)]


@pytest.mark.parametrize("how", RESTARTS)
def test_append_as_follower_keeps_offsets_epochs_and_producers(tmp_path, how):
    lg = open_log(tmp_path / "t-0")
    buf = lbatch(0, 3, epoch=1) + lbatch(3, 2, epoch=1, pid=PID, seq=0) + lbatch(5, 2, epoch=4, pid=PID, seq=2)
    info = lg.append_as_follower(buf)
    assert (info.first_offset, info.last_offset) == (0, 6)
    assert lg.log_end_offset == 7
    assert lg.leader_epoch_cache.epoch_entries() == [(1, 0), (4, 5)]
    assert lg.producer_state.last_entry(PID).last_seq == 3
    assert lg.high_watermark == 0          # the caller's: min(leader's, own log end)
    lg.update_high_watermark(100)
    assert lg.high_watermark == 7
    # the bytes are the leader's: epochs and offsets as written
    got = records.decode_batches(lg.read(0, 1 << 20).records.read_bytes())
    assert [(b.base_offset, b.partition_leader_epoch) for b in got] == [(0, 1), (3, 1), (5, 4)]
    lg = reopened(lg, how)
    assert values(lg) == leader_log_values(7)
    assert lg.leader_epoch_cache.epoch_entries() == [(1, 0), (4, 5)]
    assert lg.producer_state.last_entry(PID).last_seq == 3
    # this replica becomes leader: a retry of the producer's last batch is a duplicate ...
    retry = bytearray(lbatch(0, 2, pid=PID, seq=2))
    dup = lg.append_as_leader(retry, leader_epoch=5)
    assert (dup.first_offset, dup.last_offset, lg.log_end_offset) == (5, 6, 7)
    # ... and a gap is refused: idempotence holds across the leader change
    with pytest.raises(OutOfOrderSequenceError):
        lg.append_as_leader(bytearray(lbatch(0, 1, pid=PID, seq=9)), leader_epoch=5)
    lg.append_as_leader(bytearray(lbatch(0, 1, pid=PID, seq=4)), leader_epoch=5)
    assert lg.leader_epoch_cache.epoch_entries() == [(1, 0), (4, 5), (5, 7)]


def test_append_as_follower_refuses_wrong_offsets_and_corrupt_batches(tmp_path):
    lg = open_log(tmp_path / "t-0")
    lg.append_as_follower(lbatch(0, 2, epoch=1))
    before = (lg.log_end_offset, lg.size_in_bytes, lg.leader_epoch_cache.epoch_entries())
    with pytest.raises(UnexpectedAppendOffsetError, match="not at the log end offset 2"):
        lg.append_as_follower(lbatch(3, 1, epoch=1))          # a gap
    with pytest.raises(UnexpectedAppendOffsetError):
        lg.append_as_follower(lbatch(1, 2, epoch=1))          # overlaps what we have
    bad = bytearray(lbatch(2, 2, epoch=2))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        lg.append_as_follower(bytes(lbatch(2, 1, epoch=2)) + bytes(bad))   # a good batch first
    with pytest.raises(CorruptRecordError):
        lg.append_as_follower(lbatch(2, 1, epoch=2) + lbatch(2, 1, epoch=2))  # offsets go back
    with pytest.raises(CorruptRecordError):
        lg.append_as_follower(lbatch(2, 2, epoch=2)[:-3])     # torn
    assert (lg.log_end_offset, lg.size_in_bytes, lg.leader_epoch_cache.epoch_entries()) == before
    lg.append_as_follower(memoryview(lbatch(2, 1, epoch=2)))
    assert values(lg) == leader_log_values(3)


def test_append_as_follower_on_a_compacted_topic_accepts_a_gap(tmp_path):
    lg = open_log(tmp_path / "t-0", **{"cleanup.policy": "compact"})
    lg.append_as_follower(lbatch(0, 2, epoch=1))
    lg.append_as_follower(lbatch(5, 1, epoch=1))      # the leader compacted 2..4 away
    assert lg.log_end_offset == 6
    with pytest.raises(UnexpectedAppendOffsetError):
        lg.append_as_follower(lbatch(4, 1, epoch=1))


def _follower_with_two_epochs(path):
    """Offsets 0..29 in epoch 1, 30..59 in epoch 3 (several 1 KiB segments), an
    idempotent producer throughout, everything flushed (recovery point 60)."""
    lg = open_log(path)
    for base in range(0, 60, 5):
        lg.append_as_follower(lbatch(base, 5, epoch=1 if base < 30 else 3, pid=PID, seq=base))
    lg.flush()
    assert lg.num_segments > 3 and lg.recovery_point == 60
    return lg


@pytest.mark.parametrize("how", RESTARTS)
def test_truncate_to_then_restart(tmp_path, how):
    lg = _follower_with_two_epochs(tmp_path / "t-0")
    lg.update_high_watermark(50)
    segs_before = lg.num_segments
    assert lg.truncate_to(35)             # mid-batch: the batch 35..39 goes too
    assert lg.log_end_offset == 35
    assert lg.high_watermark == 35 and lg.recovery_point == 35
    assert lg.num_segments < segs_before
    assert lg.leader_epoch_cache.epoch_entries() == [(1, 0), (3, 30)]
    assert lg.producer_state.last_entry(PID).last_seq == 34
    assert lg.end_offset_for_epoch(3) == (3, 35)
    # the index answers nothing past the cut
    assert lg.active_segment.translate_offset(40) is None
    lg = reopened(lg, how)
    assert values(lg) == leader_log_values(35)
    assert lg.leader_epoch_cache.epoch_entries() == [(1, 0), (3, 30)]
    assert lg.producer_state.last_entry(PID).last_seq == 34
    assert not [n for n in os.listdir(lg.dir) if n.endswith(".snapshot") and int(n[:20]) > 35]


@pytest.mark.parametrize("how", RESTARTS)
def test_truncate_below_an_epoch_then_a_new_leaders_batches_survive_a_crash(tmp_path, how):
    """The replica that led epoch 3 diverged: it truncates to 30 (the end of epoch 1) and
    takes epoch 4 from the new leader. Restart with the recovery point of *before* the
    truncation: nothing of epoch 3 comes back (the deferred epoch checkpoint was written)."""
    lg = _follower_with_two_epochs(tmp_path / "t-0")
    stale_rp = lg.recovery_point
    lg.truncate_to(30)
    assert lg.leader_epoch_cache.epoch_entries() == [(1, 0)]
    lg.append_as_follower(lbatch(30, 4, epoch=4, value=b"new"))
    assert lg.leader_epoch_cache.epoch_entries() == [(1, 0), (4, 30)]
    if how == "crash":
        lg._recovery_point = stale_rp        # as if the checkpoint had not caught up
    lg = reopened(lg, how)
    assert values(lg) == leader_log_values(30) + [(30 + i, b"new%d" % (30 + i)) for i in range(4)]
    assert lg.leader_epoch_cache.epoch_entries() == [(1, 0), (4, 30)]
    assert lg.end_offset_for_epoch(3) == (1, 30)
    assert lg.producer_state.last_entry(PID).last_seq == 29


@pytest.mark.parametrize("how", RESTARTS)
def test_truncate_fully_and_start_at_then_restart(tmp_path, how):
    lg = _follower_with_two_epochs(tmp_path / "t-0")
    lg.update_high_watermark(40)
    lg.truncate_fully_and_start_at(100)
    assert (lg.log_start_offset, lg.log_end_offset, lg.high_watermark) == (100, 100, 100)
    assert lg.leader_epoch_cache.epoch_entries() == []
    assert lg.producer_state.last_entry(PID) is None
    lg.append_as_follower(lbatch(100, 2, epoch=7))
    lg = reopened(lg, how)
    if how == "crash":
        lg.close()
        # the log start offset comes from the log-start-offset checkpoint in a LogManager
        lg = Log.open(lg.dir, LogConfig({"segment.bytes": SEG}), time_ms=Clock(), log_start_offset=100,
                      scheduler=lambda fn: False)
    assert (lg.log_start_offset, lg.log_end_offset) == (100, 102)
    assert [o for o, _ in values(lg)] == [100, 101]
    assert lg.leader_epoch_cache.epoch_entries() == [(7, 100)]
    assert lg.producer_state.last_entry(PID) is None


def test_truncate_to_below_the_first_segment_restarts_the_log_there(tmp_path):
    lg = open_log(tmp_path / "t-0")
    lg.truncate_fully_and_start_at(50)
    lg.append_as_follower(lbatch(50, 3, epoch=2))
    assert lg.truncate_to(20)
    assert (lg.log_start_offset, lg.log_end_offset) == (20, 20)
    lg = reopened(lg, "clean")
    assert (lg.log_start_offset, lg.log_end_offset) == (20, 20)
    assert lg.leader_epoch_cache.epoch_entries() == []


def test_end_offset_for_epoch(tmp_path):
    """Kafka's LeaderEpochFileCache.endOffsetFor, as the leader answers a diverging epoch."""
    lg = open_log(tmp_path / "t-0")
    assert lg.end_offset_for_epoch(0) == (-1, -1)           # no entries
    lg.append_as_follower(lbatch(0, 5, epoch=2) + lbatch(5, 5, epoch=4) + lbatch(10, 2, epoch=7))
    assert lg.end_offset_for_epoch(-1) == (-1, -1)
    assert lg.end_offset_for_epoch(1) == (1, 0)             # below the first entry
    assert lg.end_offset_for_epoch(2) == (2, 5)
    assert lg.end_offset_for_epoch(3) == (2, 5)             # a gap: the floor epoch's end
    assert lg.end_offset_for_epoch(4) == (4, 10)
    assert lg.end_offset_for_epoch(6) == (4, 10)
    assert lg.end_offset_for_epoch(7) == (7, 12)            # the latest: the log end
    assert lg.end_offset_for_epoch(8) == (-1, -1)           # above the latest
    lg = reopened(lg, "crash")
    assert lg.end_offset_for_epoch(3) == (2, 5)
    assert lg.end_offset_for_epoch(7) == (7, 12)


@pytest.mark.parametrize("full", [False, True])
def test_truncation_is_durable_before_it_returns(tmp_path, monkeypatch, full):
    """What a power loss keeps is what was fsynced: the cut segment, the directory
    (segments renamed .deleted, snapshots unlinked) and the leader-epoch checkpoint
    (deferred under a LogManager) are synced by the truncation itself."""
    from kbroker.log.checkpoints import LeaderEpochCheckpointFile
    lg = _follower_with_two_epochs(tmp_path / "t-0")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                 real_fsync(fd))[1])
    if full:
        lg.truncate_fully_and_start_at(100)
    else:
        lg.truncate_to(30)
    assert not lg.leader_epoch_cache.dirty
    on_disk = LeaderEpochCheckpointFile(os.path.join(lg.dir, "leader-epoch-checkpoint")).read()
    assert on_disk == ([] if full else [(1, 0)])
    assert os.path.realpath(lg.dir) in synced
    if not full:
        assert os.path.realpath(lg.active_segment.log_path) in synced


def test_truncate_to_the_log_end_drops_an_epoch_entry_without_batches(tmp_path):
    """A replica that led epoch 4 without writing in it (assign_epoch_start_offset) and
    is told its epoch-3 data ends at its log end: the log keeps every batch, the epoch
    cache loses (4, end), else its next fetch names epoch 4 again, forever."""
    lg = open_log(tmp_path / "t-0")
    lg.append_as_follower(lbatch(0, 3, epoch=3))
    lg.assign_epoch_start_offset(4, 3)
    assert lg.leader_epoch_cache.epoch_entries() == [(3, 0), (4, 3)]
    assert lg.truncate_to(3) is False
    assert lg.log_end_offset == 3
    assert lg.latest_epoch == 3
    lg = reopened(lg, "crash")
    assert lg.leader_epoch_cache.epoch_entries() == [(3, 0)]

"""Partition lifecycle at scale (issue 23): what the LogManager and a Log write, and when.

* the leader-epoch checkpoint is not written on the append path of a LogManager's log;
  it is written before the recovery point moves and at close, and recovery rebuilds
  the entries it may lack (or hold stale) from the batches past the recovery point;
* a new partition directory costs two directory fsyncs and no file fsync;
* a clean shutdown on a local file system fsyncs no file, then syncs the file system
  once per log dir before the clean-shutdown marker; elsewhere it fsyncs every file;
* the time index's final entry (roll, close) and rebuilt indexes are written with
  pwrite into exactly-sized files, and read back right;
* the log-dir choice for a new log does not walk the existing logs.
"""
import os

import pytest

from kbroker.log import LogConfig, LogManager
from kbroker.log import checkpoints as ckpt
from kbroker.log.checkpoints import LeaderEpochCheckpointFile
from kbroker.log.log import Log
from _log_util import Clock, batch, read_all


def _epoch_file(lg_dir):
    return LeaderEpochCheckpointFile(os.path.join(lg_dir, "leader-epoch-checkpoint")).read()


def _queue():
    jobs = []
    return jobs, lambda fn: jobs.append(fn) or True


def test_append_does_not_write_the_epoch_checkpoint(tmp_path, monkeypatch):
    """A LogManager's log (one with a scheduler): the first append of an epoch marks the
    cache dirty only; flush (before the recovery point moves) and close write it."""
    writes = []
    real = LeaderEpochCheckpointFile.write
    monkeypatch.setattr(LeaderEpochCheckpointFile, "write",
                        lambda self, entries, sync=True: writes.append(list(entries)) or real(self, entries, sync=sync))
    _, scheduler = _queue()
    lg = Log.open(str(tmp_path / "t-0"), LogConfig(), scheduler=scheduler)
    lg.append(batch(2), leader_epoch=0)
    lg.append(batch(3), leader_epoch=4)
    assert writes == [] and lg.leader_epoch_cache.dirty
    assert lg.leader_epoch_cache.epoch_entries() == [(0, 0), (4, 2)]
    lg.flush()
    assert writes == [[(0, 0), (4, 2)]] and _epoch_file(lg.dir) == [(0, 0), (4, 2)]
    lg.append(batch(1), leader_epoch=6)
    lg.close()
    assert _epoch_file(lg.dir) == [(0, 0), (4, 2), (6, 5)]


def test_crash_before_the_epoch_checkpoint_rebuilds_it(tmp_path):
    """SIGKILL between an append and the checkpoint write: the file lacks the new
    epochs; the unclean load rebuilds them from the scanned batches."""
    _, scheduler = _queue()
    d = str(tmp_path / "t-0")
    lg = Log.open(d, LogConfig(), scheduler=scheduler)
    for epoch, n in ((0, 3), (2, 4), (5, 2)):
        lg.append(batch(n), leader_epoch=epoch)
    assert _epoch_file(d) == []            # nothing written yet: "crash" now (no close)
    again = Log.open(d, LogConfig(), recovery_point=0, had_clean_shutdown=False)
    assert again.leader_epoch_cache.epoch_entries() == [(0, 0), (2, 3), (5, 7)]
    assert again.end_offset_for_epoch(2) == (2, 7)
    assert again.log_end_offset == 9 and len(read_all(again)) == 9
    again.close()


def test_stale_epoch_checkpoint_past_the_recovery_point_is_replaced(tmp_path):
    """A checkpoint holding entries the log no longer has (written before a truncation
    whose own write was lost) is not trusted past the recovery point: those entries
    are rebuilt from the batches, even where the stale epoch is the higher one."""
    _, scheduler = _queue()
    d = str(tmp_path / "t-0")
    lg = Log.open(d, LogConfig({"segment.bytes": 1000}), scheduler=scheduler)
    for _ in range(12):
        lg.append(batch(1), leader_epoch=1)
    lg.roll()
    lg.flush()                           # recovery point 12, file [(1, 0)]
    for _ in range(3):
        lg.append(batch(1), leader_epoch=3)
    LeaderEpochCheckpointFile(os.path.join(d, "leader-epoch-checkpoint")).write([(1, 0), (7, 13)])
    again = Log.open(d, LogConfig({"segment.bytes": 1000}), recovery_point=12, had_clean_shutdown=False)
    assert again.leader_epoch_cache.epoch_entries() == [(1, 0), (3, 12)]
    again.close()


def test_new_partition_dir_costs_no_fsync_until_its_first_flush(tmp_path, monkeypatch):
    """A new log fsyncs nothing when it is created (CreateTopics, Kafka's
    createLogDirectory; partition.metadata is written in place); its first flush fsyncs
    its directory and then its entry in the log dir, before the recovery point moves;
    later flushes do not, until a roll creates a segment (Kafka's LocalLog.flush)."""
    synced = []
    monkeypatch.setattr("kbroker.log.log.fsync_dir", lambda p: synced.append(os.path.abspath(p)))
    fsyncs = _count_fsyncs(monkeypatch)
    parent = tmp_path / "logs"
    parent.mkdir()
    import uuid
    lg = Log.open(str(parent / "t-0"), LogConfig({"segment.bytes": 1000}), scheduler=_queue()[1],
                  topic_id=uuid.uuid4())
    assert synced == [] and fsyncs == []
    assert lg.topic_id is not None and lg.dir_sync_pending
    lg.append(batch(1))
    assert synced == [] and lg.recovery_point == 0
    lg.flush()
    assert synced == [lg.dir, str(parent)] and lg.recovery_point == 1 and not lg.dir_sync_pending
    synced.clear()
    lg.append(batch(1))
    lg.flush()
    assert synced == []
    while lg.num_segments == 1:
        lg.append(batch(5, value=b"x" * 100))
    assert synced == [] and lg.dir_sync_pending     # the roll's segment: at the next flush
    lg.flush()
    assert synced == [lg.dir] and not lg.dir_sync_pending
    lg.close()
    again = Log.open(lg.dir, LogConfig(), had_clean_shutdown=True)
    assert again.topic_id == lg.topic_id and not again.dir_sync_pending
    again.close()


def test_new_partition_dir_with_fsync_every_append_is_synced_at_once(tmp_path, monkeypatch):
    """fsync-every-append: a new log's directory and its log dir entry are fsynced when
    it is created (an acknowledged append must not lose its directory); a log switched
    to that mode later syncs what is pending at once."""
    synced = []
    monkeypatch.setattr("kbroker.log.log.fsync_dir", lambda p: synced.append(os.path.abspath(p)))
    parent = tmp_path / "logs"
    parent.mkdir()
    lg = Log.open(str(parent / "t-0"), LogConfig(), fsync_every_append=True)
    assert sorted(synced) == sorted([str(parent), lg.dir]) and not lg.dir_sync_pending
    lg.close()
    synced.clear()
    other = Log.open(str(parent / "t-1"), LogConfig())
    assert synced == [] and other.dir_sync_pending
    other.set_fsync_every_append(True)
    assert synced == [other.dir, str(parent)] and not other.dir_sync_pending
    other.close()


def _count_fsyncs(monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    return calls


def test_clean_shutdown_syncs_the_file_system_once(tmp_path, monkeypatch):
    dirs = [str(tmp_path / "d1"), str(tmp_path / "d2")]
    clock = Clock()
    lm = LogManager(dirs, LogConfig(), time_ms=clock, background=False)
    lm.startup()
    logs = [lm.get_or_create_log(("t", p)) for p in range(20)]
    for lg in logs:
        lg.append(batch(2, ts=clock.now), leader_epoch=0)
    synced = []
    monkeypatch.setattr(ckpt, "file_system_type", lambda p: "ext4")
    monkeypatch.setattr(ckpt, "syncfs", lambda p: synced.append(p) or True)
    fsyncs = _count_fsyncs(monkeypatch)
    lm.shutdown()
    assert sorted(synced) == sorted(os.path.abspath(d) for d in dirs)
    # only the checkpoints and markers: 3 checkpoints + marker per dir, each file + its dir
    assert len(fsyncs) <= 2 * 4 * len(dirs)
    lm = LogManager(dirs, LogConfig(), time_ms=clock, background=False)
    lm.startup()
    for p in range(20):
        lg = lm.get_log(("t", p))
        assert lg.log_end_offset == 2 and lg.recovery_point == 2 and lg.recovered_segments_on_load == 0
        assert lg.leader_epoch_cache.epoch_entries() == [(0, 0)]
    lm.shutdown()


def test_clean_shutdown_on_other_file_systems_fsyncs_every_log(tmp_path, monkeypatch):
    clock = Clock()
    lm = LogManager([str(tmp_path / "d")], LogConfig(), time_ms=clock, background=False)
    lm.startup()
    for p in range(10):
        lm.get_or_create_log(("t", p)).append(batch(1, ts=clock.now), leader_epoch=0)
    monkeypatch.setattr(ckpt, "file_system_type", lambda p: "fuse.sshfs")
    monkeypatch.setattr(ckpt, "syncfs", lambda p: pytest.fail("syncfs on a FUSE file system"))
    fsyncs = _count_fsyncs(monkeypatch)
    lm.shutdown()
    assert len(fsyncs) >= 10 * 3          # per log: segment, epoch checkpoint, producer snapshot


def test_syncfs_helper(tmp_path):
    assert ckpt.file_system_type(str(tmp_path)) is not None
    if ckpt.file_system_type(str(tmp_path)) in ckpt.SYNCFS_FILE_SYSTEMS:
        assert ckpt.syncfs(str(tmp_path)) is True


def test_final_time_index_entry_written_on_close_and_roll(tmp_path):
    d = str(tmp_path / "t-0")
    cfg = LogConfig({"segment.bytes": 2000, "index.interval.bytes": 100})
    lg = Log.open(d, cfg)
    for ts in (10, 30, 20):
        lg.append(batch(1, ts=ts))
    lg.close()
    ti = os.path.join(d, "00000000000000000000.timeindex")
    assert os.path.getsize(ti) == 12      # exactly one entry: (30, 1), at the second batch
    lg = Log.open(d, cfg, had_clean_shutdown=True)
    seg = lg.active_segment
    assert seg.time_index.entries == 1 and seg.time_index.last_entry == (30, 1)
    assert lg.fetch_offset_by_timestamp(25).offset == 1
    for ts in (40, 50):
        lg.append(batch(1, ts=ts))
    lg.roll()
    assert lg.segments[0].time_index.last_entry == (50, 4)
    assert lg.fetch_offset_by_timestamp(45).offset == 4
    lg.close()


def test_small_segment_closes_without_index_files_and_keeps_its_timestamps(tmp_path):
    """A segment of at most index.interval.bytes whose indexes have no file closes
    without creating any (two files per partition were most of a clean stop at 10,000
    partitions): they hold no entry, and the max timestamp (the time index's final entry)
    is read back from the .log. The next start neither rebuilds nor creates them; a
    crash after it recovers the segment without creating them; offsets and timestamps
    are found all along, and a roll writes the final time entry as before."""
    d = str(tmp_path / "t-0")
    cfg = LogConfig({"segment.bytes": 4000})
    lg = Log.open(d, cfg)
    for ts in (10, 30, 20):
        lg.append(batch(1, ts=ts))
    lg.close()
    def index_files():
        return sorted(n for n in os.listdir(d) if n.endswith("index"))
    assert index_files() == []
    lg = Log.open(d, cfg, had_clean_shutdown=True)
    assert lg.recovered_segments_on_load == 0 and index_files() == []
    seg = lg.active_segment
    assert (seg.max_timestamp_so_far, seg.offset_of_max_timestamp_so_far) == (30, 1)
    assert [o for o, _ in read_all(lg)] == [0, 1, 2] and index_files() == []
    lg.append(batch(1, ts=40))
    assert index_files() == []
    crashed = Log.open(d, cfg, had_clean_shutdown=False)      # no close: a crash
    assert crashed.recovered_segments_on_load == 1 and index_files() == []
    assert crashed.log_end_offset == 4 and crashed.active_segment.max_timestamp_so_far == 40
    assert crashed.fetch_offset_by_timestamp(35).offset == 3
    assert crashed.fetch_offset_by_timestamp(25).offset == 1
    crashed.append(batch(1, ts=50))
    crashed.roll()
    assert crashed.segments[0].time_index.last_entry == (50, 4)
    crashed.close()
    again = Log.open(d, cfg, had_clean_shutdown=True)
    assert again.recovered_segments_on_load == 0
    assert [o for o, _ in read_all(again)] == [0, 1, 2, 3, 4]
    assert again.fetch_offset_by_timestamp(45).offset == 4
    again.close()


def test_recovery_writes_exact_indexes(tmp_path):
    d = str(tmp_path / "t-0")
    cfg = LogConfig({"index.interval.bytes": 1})
    lg = Log.open(d, cfg)
    for ts in range(1, 41):
        lg.append(batch(1, ts=ts * 10))
    expected = [lg.fetch_offset_by_timestamp(t) for t in (5, 155, 400)]
    # a crash: no close, indexes still 10 MiB and preallocated
    again = Log.open(d, cfg, recovery_point=0, had_clean_shutdown=False)
    seg = again.active_segment
    assert os.path.getsize(seg.offset_index.path) == 8 * seg.offset_index.entries > 0
    assert os.path.getsize(seg.time_index.path) == 12 * seg.time_index.entries > 0
    assert [again.fetch_offset_by_timestamp(t) for t in (5, 155, 400)] == expected
    assert len(read_all(again)) == 40
    again.append(batch(1, ts=999))
    assert again.fetch_offset_by_timestamp(990).offset == 40
    again.close()


def test_log_dir_choice_does_not_walk_the_logs(tmp_path):
    dirs = [str(tmp_path / f"d{i}") for i in range(3)]
    lm = LogManager(dirs, LogConfig(), background=False)
    lm.startup()
    for p in range(9):
        lm.get_or_create_log(("t", p))
    assert sorted(lm._dir_counts.values()) == [3, 3, 3]
    lm.delete_log(("t", 0))
    first = os.path.dirname(lm.get_log(("t", 1)).dir)
    lost = [d for d in map(os.path.abspath, dirs) if lm._dir_counts.get(d) == 2]
    assert len(lost) == 1
    # the next log goes to the dir that lost one, without looking at the logs
    logs = lm._logs
    lm._logs = _Unwalkable(logs)
    lg = lm.get_or_create_log(("u", 0))
    lm._logs = dict(lm._logs)
    assert os.path.dirname(lg.dir) == lost[0] and first
    lm.shutdown()


class _Unwalkable(dict):
    def values(self):
        raise AssertionError("walked the logs")


def test_idle_ticks_touch_no_log(tmp_path, monkeypatch):
    """The once-a-second deletion task and the periodic checkpoints do no per-log
    work (no lock, no file write) while nothing changed."""
    clock = Clock()
    lm = LogManager([str(tmp_path / "d")], LogConfig({"file.delete.delay.ms": 1000}), time_ms=clock,
                    background=False)
    lm.startup()
    for p in range(50):
        lm.get_or_create_log(("t", p)).append(batch(1, ts=clock.now))
    calls = []
    real = Log.delete_pending_segments
    monkeypatch.setattr(Log, "delete_pending_segments",
                        lambda self, *a, **k: calls.append(self.name) or real(self, *a, **k))
    writes = []
    real_write = ckpt.OffsetCheckpointFile.write
    monkeypatch.setattr(ckpt.OffsetCheckpointFile, "write",
                        lambda self, offsets: writes.append(self.path) or real_write(self, offsets))
    lm.delete_pending()
    assert calls == []
    lm.checkpoint_high_watermarks()
    lm.checkpoint_recovery_offsets()
    assert len(writes) == 2
    lm.checkpoint_high_watermarks()
    lm.checkpoint_recovery_offsets()
    assert len(writes) == 2                      # unchanged: not rewritten
    lg = lm.get_log(("t", 3))
    lg.update_high_watermark(1)
    lm.checkpoint_high_watermarks()
    assert len(writes) == 3
    lg.roll()
    lg.truncate_to(0)                            # the rolled segment's deletion is pending
    lm.delete_pending(now_ms=clock.now + 10_000)
    assert calls == ["t-3"]
    lm.shutdown()


def test_batched_dir_sync_fsyncs_the_log_dir_once(tmp_path, monkeypatch):
    """CreateTopics with fsync-every-append: each new partition directory is fsynced, its
    log dir once per topic. Without it, creating logs fsyncs nothing."""
    import kbroker.log.manager as manager_mod
    synced = []
    monkeypatch.setattr("kbroker.log.log.fsync_dir", lambda p: synced.append(("log", os.path.abspath(p))))
    monkeypatch.setattr(manager_mod, "fsync_dir", lambda p: synced.append(("manager", os.path.abspath(p))))
    d = str(tmp_path / "d")
    lm = LogManager([d], LogConfig({"kbroker.fsync.every.append": True}), background=False)
    lm.startup()
    with lm.batched_dir_sync():
        logs = [lm.get_or_create_log(("t", p)) for p in range(50)]
        assert ("log", os.path.abspath(d)) not in synced and ("manager", os.path.abspath(d)) not in synced
    assert sorted(synced) == sorted([("log", lg.dir) for lg in logs] + [("manager", os.path.abspath(d))])
    synced.clear()
    lg = lm.get_or_create_log(("u", 0))           # outside a batch: its log dir at once
    assert sorted(synced) == sorted([("log", lg.dir), ("log", os.path.abspath(d))])
    synced.clear()
    with lm.batched_dir_sync():
        plain = [lm.get_or_create_log(("v", p), LogConfig()) for p in range(5)]
    assert synced == [] and all(lg.dir_sync_pending for lg in plain)
    lm.shutdown()


def test_deletion_tick_visits_only_logs_with_pending_deletions(tmp_path, monkeypatch):
    clock = Clock()
    lm = LogManager([str(tmp_path / "d")], LogConfig({"file.delete.delay.ms": 1000, "retention.ms": 1000,
                                                     "segment.bytes": 1000}),
                    time_ms=clock, background=False)
    lm.startup()
    logs = [lm.get_or_create_log(("t", p)) for p in range(20)]
    old = logs[5]
    for _ in range(30):
        old.append(batch(1, ts=clock.now))
    old.update_high_watermark(old.log_end_offset)
    visited = []
    monkeypatch.setattr(type(old), "pending_deletes", property(lambda self: visited.append(self.name) or
                                                                len(self._pending_deletes)))
    clock.now += 5000
    assert lm.cleanup_logs() > 0 and old.pending_deletes
    visited.clear()
    lm._delete_pending_tick()                   # not due yet: only the log with deletions
    assert set(visited) == {"t-5"}
    clock.now += 2000
    visited.clear()
    lm._delete_pending_tick()
    assert set(visited) == {"t-5"} and old._pending_deletes == []
    visited.clear()
    lm._delete_pending_tick()
    assert visited == []                        # nothing pending anywhere: no log visited
    clock.now += 60000
    lm._delete_pending_tick()                   # the periodic full sweep
    assert len(visited) == 20
    lm.shutdown()


def test_first_small_append_creates_no_index_file(tmp_path):
    """The first record to a new partition writes the .log only: its index files are
    created at close (exact size) once it is past index.interval.bytes, or when an
    entry is due, or by a time lookup; a partition of at most index.interval.bytes
    closes without index files, and the next start takes them as empty, not lost."""
    d = str(tmp_path / "t-0")
    lg = Log.open(d, LogConfig({"index.interval.bytes": 4096}))
    idx = [os.path.join(d, "00000000000000000000" + s) for s in (".index", ".timeindex")]
    lg.append(batch(1, ts=100))
    lg.append(batch(1, ts=300))
    assert not any(os.path.exists(p) for p in idx)
    assert len(read_all(lg)) == 2 and lg.fetch_offset_by_timestamp(200).offset == 1
    for _ in range(60):                           # past index.interval.bytes: entries
        lg.append(batch(1, ts=400))
    assert lg.active_segment.offset_index.entries > 0
    lg.close()
    again = Log.open(d, LogConfig({"index.interval.bytes": 4096}), had_clean_shutdown=True)
    assert again.recovered_segments_on_load == 0 and len(read_all(again)) == 62
    again.close()

    e = str(tmp_path / "u-0")
    lg = Log.open(e, LogConfig())
    lg.append(batch(1, ts=100))
    assert len(read_all(lg)) == 1                 # a fetch creates no index file either
    lg.close()
    f = str(tmp_path / "v-0")
    Log.open(f, LogConfig()).close()              # never written
    for path in (e, f):                           # small: closed without index files
        assert not [n for n in os.listdir(path) if n.endswith("index")]
    for path in (e, f):
        again = Log.open(path, LogConfig(), had_clean_shutdown=True)
        assert again.recovered_segments_on_load == 0
        again.append(batch(1, ts=500))
        assert again.fetch_offset_by_timestamp(450).offset == again.log_end_offset - 1
        again.close()


@pytest.mark.parametrize("twins", [False, True], ids=["cython", "python"])
def test_restarted_active_index_grows_only_when_an_entry_is_due(tmp_path, monkeypatch, twins):
    """An active segment's index files (exact size after a clean close) are extended to
    segment.index.bytes only when an index entry needs the room, under the index's
    lock: a small record after a restart leaves them exact, so recovery after a crash
    finds them right and rewrites nothing but the time index's final entry (it used
    to truncate two 10 MiB files per partition). Entries past the first still land."""
    if twins:
        from kbroker._core.ref import offset_index as ref_oi, time_index as ref_ti
        from kbroker.log import segment as seg_mod
        monkeypatch.setattr(seg_mod, "_offset_index", ref_oi)
        monkeypatch.setattr(seg_mod, "_time_index", ref_ti)
    cfg = LogConfig({"index.interval.bytes": 4096})
    d = str(tmp_path / "t-0")
    idx = [os.path.join(d, "00000000000000000000" + s) for s in (".index", ".timeindex")]
    lg = Log.open(d, cfg)
    lg.append(batch(1, ts=100))
    assert lg.fetch_offset_by_timestamp(50).offset == 0     # a time lookup creates both files
    lg.close()
    assert [os.path.getsize(p) for p in idx] == [0, 12]

    lg = Log.open(d, cfg, had_clean_shutdown=True)
    lg.append(batch(1, ts=200))                   # small: no index entry due
    assert len(read_all(lg)) == 2                 # a read maps the indexes, and grows nothing
    assert [os.path.getsize(p) for p in idx] == [0, 12]
    written = []
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, pos: written.append(os.readlink(
        f"/proc/self/fd/{fd}")) or real(fd, data, pos))
    # a crash here (no close): recovery leaves the offset index file alone
    crashed = Log.open(d, cfg, had_clean_shutdown=False)
    assert crashed.recovered_segments_on_load == 1
    assert not any(p.endswith(".index") for p in written)
    assert len(read_all(crashed)) == 2 and crashed.fetch_offset_by_timestamp(150).offset == 1
    monkeypatch.setattr(os, "pwrite", real)
    for _ in range(60):                           # past index.interval.bytes: entries, file grown
        crashed.append(batch(1, ts=400))
    assert crashed.active_segment.offset_index.entries > 0
    assert os.path.getsize(idx[0]) == cfg.segment_index_bytes - cfg.segment_index_bytes % 8
    entries = crashed.active_segment.offset_index.entries
    crashed.close()
    assert os.path.getsize(idx[0]) == 8 * entries
    again = Log.open(d, cfg, had_clean_shutdown=True)
    assert len(read_all(again)) == 62 and again.fetch_offset_by_timestamp(300).offset == 2
    again.close()


def test_new_partition_metadata_is_written_off_the_create_path(tmp_path):
    """A LogManager's new log (one with a scheduler) leaves partition.metadata to the
    scheduler's thread (Kafka's flush-metadata-file task): nothing but the directory and
    the segment is created on the CreateTopics path. The topic id is known at once; the
    file is there after the job, or after close / the first flush if the job never ran."""
    import uuid
    jobs, scheduler = _queue()
    tid = uuid.uuid4()
    lg = Log.open(str(tmp_path / "t-0"), LogConfig(), scheduler=scheduler, topic_id=tid)
    meta = tmp_path / "t-0" / "partition.metadata"
    assert lg.topic_id == tid and not meta.exists()
    assert sorted(os.listdir(lg.dir)) == ["00000000000000000000.log"]
    for job in jobs:
        job()
    assert ckpt.PartitionMetadataFile(str(meta)).read() == tid
    lg.close()

    jobs, scheduler = _queue()
    lg = Log.open(str(tmp_path / "t-1"), LogConfig(), scheduler=scheduler, topic_id=tid)
    lg.append(batch(1))
    lg.flush()                                          # the job has not run: the flush writes it
    meta = tmp_path / "t-1" / "partition.metadata"
    assert ckpt.PartitionMetadataFile(str(meta)).read() == tid
    jobs, scheduler = _queue()
    lg2 = Log.open(str(tmp_path / "t-2"), LogConfig(), scheduler=scheduler, topic_id=tid)
    lg2.close()                                         # nor here: close writes it
    again = Log.open(lg2.dir, LogConfig(), had_clean_shutdown=True)
    assert again.topic_id == tid
    again.close()
    for job in jobs:                                    # a late job is a no-op
        job()
    lg.close()

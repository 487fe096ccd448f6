"""What a restart of many logs may skip (issue 23: 10,000 partitions restart in seconds):
stale producer snapshots are forgotten at load and unlinked on the background thread,
not one per partition on the load path; a recovery after a crash leaves index files
that already hold the right entries alone, and still truncates a torn tail."""
import os
import shutil
import time

from kbroker.kernels import records
from kbroker.log import LogConfig, LogManager
from kbroker.log.segment import LogSegment
from _log_util import batch, read_all

PARTITIONS = 20


def _snapshots(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".snapshot"))


def _idempotent_batch(producer_id, seq):
    return bytearray(records.encode_batch([(1000, b"k", b"v" * 100, [])], producer_id=producer_id,
                                          producer_epoch=0, base_sequence=seq))


def _restart_with_new_data(dirs, rounds):
    """``rounds`` clean restarts, one idempotent record per log in between: each clean
    stop leaves a snapshot at the log end (a log with producer state), so every
    start-up finds the previous one stale."""
    for r in range(rounds):
        lm = LogManager(dirs, LogConfig(), background=False)
        lm.startup()
        for p in range(PARTITIONS):
            lm.get_or_create_log(("t", p)).append(_idempotent_batch(1000 + p, r))
        lm.shutdown()


def test_a_restart_leaves_stale_snapshots_to_the_background_thread(tmp_path, monkeypatch):
    dirs = [str(tmp_path)]
    _restart_with_new_data(dirs, 2)
    d0 = os.path.join(dirs[0], "t-0")
    assert _snapshots(d0) == ["00000000000000000001.snapshot", "00000000000000000002.snapshot"]

    unlinked = []
    real_unlink = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p, *a, **kw: (unlinked.append(p), real_unlink(p, *a, **kw))[1])
    lm = LogManager(dirs, LogConfig())          # background thread: started after the load
    lm.load_logs()
    assert not [p for p in unlinked if p.endswith(".snapshot")], "load path unlinked snapshots"
    assert _snapshots(d0) == ["00000000000000000001.snapshot", "00000000000000000002.snapshot"]
    lg = lm.get_log(("t", 0))
    assert lg.producer_state.snapshot_offsets() == [2]          # the stale one is forgotten
    lm.shutdown()

    lm = LogManager(dirs, LogConfig())
    lm.startup()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(
                len(_snapshots(os.path.join(dirs[0], f"t-{p}"))) > 1 for p in range(PARTITIONS)):
            time.sleep(0.01)
        for p in range(PARTITIONS):
            assert _snapshots(os.path.join(dirs[0], f"t-{p}")) == ["00000000000000000002.snapshot"]
        assert lm.get_log(("t", 0)).log_end_offset == 2
    finally:
        lm.shutdown()


def test_a_forgotten_snapshot_taken_again_is_not_deleted(tmp_path):
    dirs = [str(tmp_path)]
    _restart_with_new_data(dirs, 2)
    lm = LogManager(dirs, LogConfig(), background=False)
    lm.startup()
    lg = lm.get_log(("t", 0))
    psm = lg.producer_state
    assert _snapshots(lg.dir) == ["00000000000000000002.snapshot"]   # no scheduler: deleted inline
    shutil.copy(os.path.join(lg.dir, "00000000000000000002.snapshot"),
                os.path.join(lg.dir, "00000000000000000001.snapshot"))
    with lg._lock:
        forgotten = psm.remove_stray_snapshots([0], defer=True)
        assert [o for o, _ in forgotten] == [1]
        psm._snapshots[1] = forgotten[0][1]     # a snapshot at that offset again (same name)
        assert psm.delete_forgotten_snapshots(forgotten) == 0
        del psm._snapshots[1]
        assert psm.delete_forgotten_snapshots(forgotten) == 1
    assert _snapshots(lg.dir) == ["00000000000000000002.snapshot"]
    lm.shutdown()


def _index_files(d):
    return {n: os.stat(os.path.join(d, n)) for n in os.listdir(d) if n.endswith("index")}


def test_recovery_keeps_right_index_files_and_truncates_a_torn_tail(tmp_path):
    dirs = [str(tmp_path)]
    cfg = LogConfig({"index.interval.bytes": 1})          # an index entry per batch
    lm = LogManager(dirs, cfg, background=False)
    lm.startup()
    logs = [lm.get_or_create_log(("t", p)) for p in range(3)]
    for lg in logs:
        for i in range(5):
            lg.append(batch(2, ts=1000 + i))
        lg.flush()
    paths = [lg.dir for lg in logs]
    for lg in logs:
        lg.close()                 # no clean-shutdown marker, no checkpoints: a crash
    seg_log = os.path.join(paths[1], "00000000000000000000.log")
    size = os.path.getsize(seg_log)
    with open(seg_log, "ab") as f:  # a torn batch at the end of partition 1
        f.write(batch(2)[:30])
    before = {p: _index_files(p) for p in paths}

    writes = []
    real = LogSegment._replace_index_files

    def spy(self, oi, ti):
        writes.append(self.dir)
        return real(self, oi, ti)
    LogSegment._replace_index_files = spy
    try:
        lm = LogManager(dirs, cfg, background=False)
        lm.startup()
    finally:
        LogSegment._replace_index_files = real
    assert sorted(set(writes)) == sorted(paths)          # every segment was recovered
    for p in (paths[0], paths[2]):                        # right files: not rewritten
        after = _index_files(p)
        assert {n: (s.st_ino, s.st_mtime_ns, s.st_size) for n, s in after.items()} == \
            {n: (s.st_ino, s.st_mtime_ns, s.st_size) for n, s in before[p].items()}
    assert os.path.getsize(seg_log) == size               # the torn tail is gone
    for p in range(3):
        lg = lm.get_log(("t", p))
        assert lg.log_end_offset == 10
        assert lg.read(8, 10_000).records is not None     # the index still finds the last batch
        lg.append(batch(1))
        assert lg.log_end_offset == 11
    lm.shutdown()


def test_a_clean_restart_leaves_small_segments_indexes_unchecked(tmp_path):
    """Kafka's lazy indexes: the log end of a small active segment is found by a header scan,
    so a clean start-up neither checks nor opens its index; a damaged index is still found
    and rebuilt on first use. A large segment is scanned from its last index entry."""
    dirs = [str(tmp_path)]
    cfg = LogConfig({"index.interval.bytes": 1})
    lm = LogManager(dirs, cfg, background=False)
    lm.startup()
    small, big = lm.get_or_create_log(("s", 0)), lm.get_or_create_log(("b", 0))
    for i in range(5):
        small.append(batch(2, ts=1000 + i))
    value = b"x" * 20_000
    for i in range(20):                                  # ~400 KB: above the scan-from-start bound
        big.append(batch(1, ts=1000 + i, value=value))
    lm.shutdown()
    index = os.path.join(str(tmp_path), "s-0", "00000000000000000000.index")
    with open(index, "r+b") as f:                        # no longer a whole number of entries
        f.truncate(os.path.getsize(index) - 3)

    lm = LogManager(dirs, cfg, background=False)
    lm.startup()
    try:
        small, big = lm.get_log(("s", 0)), lm.get_log(("b", 0))
        assert (small.log_end_offset, big.log_end_offset) == (10, 20)
        assert not small._segments[-1]._indexes_checked
        assert big._segments[-1]._indexes_checked
        assert [o for o, _ in read_all(small, 7)] == [7, 8, 9]   # first use: checked, rebuilt
        assert small._segments[-1]._indexes_checked
        small.append(batch(1))
        assert small.log_end_offset == 11
    finally:
        lm.shutdown()


def test_loading_many_logs_runs_no_cyclic_garbage_collection(tmp_path):
    """Every object a load makes lives with its log: the automatic collections found
    nothing to free and, over a growing heap, were a third of a 10,000-log load. The load
    runs without them and leaves the collector as it found it."""
    import gc
    dirs = [str(tmp_path)]
    _restart_with_new_data(dirs, 1)
    for p in range(PARTITIONS, 300):                      # enough objects for many gen-0 passes
        os.makedirs(os.path.join(dirs[0], f"u-{p}"))
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    assert gc.isenabled()
    lm = LogManager(dirs, LogConfig(), background=False)
    gc.callbacks.append(count)
    try:
        lm.load_logs()
    finally:
        gc.callbacks.remove(count)
    try:
        assert len(lm.logs) == 300
        assert collections == []
        assert gc.isenabled()
        assert lm.get_log(("t", 3)).log_end_offset == 1
    finally:
        lm.shutdown()

    gc.disable()                                          # a caller's choice is kept
    try:
        lm = LogManager(dirs, LogConfig(), background=False)
        lm.load_logs()
        assert not gc.isenabled()
        lm.shutdown()
    finally:
        gc.enable()


def test_logs_with_little_to_scan_load_on_one_thread_large_recoveries_on_the_recovery_threads(
        tmp_path, monkeypatch):
    """After a clean shutdown nothing is recovered and the load is interpreter work, which a
    second thread only slows (the GIL): every log loads on the calling thread. After a crash
    the logs with a megabyte or more to scan (CRC scans release the GIL) go to the recovery
    threads; the small ones load on the calling thread meanwhile."""
    import threading
    from kbroker.log import log as log_module
    from kbroker.log.config import LogManagerConfig
    dirs = [str(tmp_path)]
    _restart_with_new_data(dirs, 1)
    lm = LogManager(dirs, LogConfig(), background=False)
    lm.startup()
    for p in (0, 1):                                      # ~1.2 MB each past the recovery point
        big = lm.get_log(("t", p))
        for _ in range(12):
            big.append(batch(1, value=b"x" * 100_000))
    lm.shutdown()
    threads = {}
    real_open = log_module.Log.open.__func__

    def spy(cls, path, *a, **kw):
        threads[os.path.basename(path)] = threading.current_thread()
        return real_open(cls, path, *a, **kw)
    monkeypatch.setattr(log_module.Log, "open", classmethod(spy))

    def load():
        threads.clear()
        lm = LogManager(dirs, LogConfig(), background=False,
                        manager_config=LogManagerConfig(log_dirs=tuple(dirs), recovery_threads_per_data_dir=2))
        lm.load_logs()
        assert len(lm.logs) == PARTITIONS
        assert [lg.log_end_offset for _, lg in sorted(lm.logs.items())][:3] == [13, 13, 1]
        return lm

    me = threading.current_thread()
    lm = load()                                           # after a clean shutdown
    assert set(threads.values()) == {me}
    lm.shutdown()
    os.unlink(os.path.join(dirs[0], ".kafka_cleanshutdown"))
    rp = os.path.join(dirs[0], "recovery-point-offset-checkpoint")
    with open(rp, "w") as f:                              # as after a crash: everything to recover
        f.write("0\n0\n")
    lm = load()
    assert {n for n, t in threads.items() if t is not me} == {"t-0", "t-1"}
    assert all(threads[n].name.startswith("kbroker-log-recovery") for n in ("t-0", "t-1"))
    lm.shutdown()


def test_a_crash_recovery_that_rebuilds_the_same_epochs_rewrites_no_epoch_checkpoint(tmp_path):
    """Recovery drops the leader-epoch entries of the segments it scans and assigns them
    again from the batches: mostly the same ones. The close after it writes the file only
    if they differ (each write is a file creation and an fsync, per log)."""
    dirs = [str(tmp_path)]
    lm = LogManager(dirs, LogConfig(), background=False)
    lm.startup()
    for p in range(3):
        lg = lm.get_or_create_log(("t", p))
        lg.append(batch(2), leader_epoch=0)
        lg.append(batch(1), leader_epoch=5)
    lm.shutdown()
    lm = LogManager(dirs, LogConfig(), background=False)
    lm.startup()
    for p in range(3):
        lm.get_log(("t", p)).append(batch(1), leader_epoch=5)    # no new epoch entry
    lm.get_log(("t", 2)).append(batch(1), leader_epoch=7)        # a new one, not in the file yet
    for lg in lm.all_logs():
        for s in lg.segments:
            s.flush()                     # a crash: no close, no checkpoints, no marker
    files = [os.path.join(dirs[0], f"t-{p}", "leader-epoch-checkpoint") for p in range(3)]
    before = [(os.stat(f).st_ino, os.stat(f).st_mtime_ns) for f in files]

    lm2 = LogManager(dirs, LogConfig(), background=False)
    lm2.startup()
    assert [lm2.get_log(("t", p)).log_end_offset for p in range(3)] == [4, 4, 5]
    lm2.shutdown()
    after = [(os.stat(f).st_ino, os.stat(f).st_mtime_ns) for f in files]
    assert after[:2] == before[:2]                        # same entries: not rewritten
    assert after[2] != before[2]

    lm3 = LogManager(dirs, LogConfig(), background=False)
    lm3.startup()
    try:
        assert [lm3.get_log(("t", p)).leader_epoch_cache.epoch_entries() for p in range(3)] == \
            [[(0, 0), (5, 2)], [(0, 0), (5, 2)], [(0, 0), (5, 2), (7, 4)]]
    finally:
        lm3.shutdown()

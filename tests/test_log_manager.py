"""LogManager: dirs, checkpoints, background tasks, clean shutdown, 1,000 partitions."""
import os
import time

import pytest

from kbroker import kernels

from kbroker.log import LogConfig, LogManager, LogManagerConfig
from kbroker.log.checkpoints import OffsetCheckpointFile
from _log_util import Clock, batch, read_all


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def test_create_get_delete_and_checkpoints(tmp_path):
    dirs = [str(tmp_path / "d1"), str(tmp_path / "d2")]
    clock = Clock()
    lm = LogManager(dirs, LogConfig({"file.delete.delay.ms": 1000}), time_ms=clock, background=False)
    lm.startup()
    a = lm.get_or_create_log(("orders", 0))
    b = lm.get_or_create_log(("orders", 1))
    assert os.path.dirname(a.dir) != os.path.dirname(b.dir)       # spread over dirs
    assert lm.get_or_create_log(("orders", 0)) is a and lm.get_log(("orders", 1)) is b
    for i in range(5):
        a.append(batch(1, ts=clock.now))
    a.update_high_watermark(3)
    lm.checkpoint_high_watermarks()
    lm.checkpoint_recovery_offsets()
    d1 = os.path.dirname(a.dir)
    assert OffsetCheckpointFile(os.path.join(d1, "replication-offset-checkpoint")).read() == {("orders", 0): 3}
    lm.shutdown()
    for d in dirs:
        assert os.path.exists(os.path.join(d, ".kafka_cleanshutdown"))
    assert OffsetCheckpointFile(os.path.join(d1, "recovery-point-offset-checkpoint")).read() == {("orders", 0): 5}

    lm = LogManager(dirs, LogConfig({"file.delete.delay.ms": 1000}), time_ms=clock, background=False)
    lm.startup()
    for d in dirs:
        assert not os.path.exists(os.path.join(d, ".kafka_cleanshutdown"))   # removed after load
    a = lm.get_log(("orders", 0))
    assert a.log_end_offset == 5 and a.high_watermark == 3 and a.recovered_segments_on_load == 0
    old_dir = a.dir
    lm.delete_log(("orders", 0))
    assert lm.get_log(("orders", 0)) is None and not os.path.exists(old_dir)
    assert [n for n in os.listdir(d1) if n.endswith("-delete")]
    clock.now += 1000
    lm.delete_pending()
    assert not [n for n in os.listdir(d1) if n.endswith("-delete")]
    lm.shutdown()


def test_unclean_start_recovers(tmp_path):
    d = str(tmp_path / "d")
    lm = LogManager([d], LogConfig({"segment.bytes": 1000}), background=False)
    lm.startup()
    lg = lm.get_or_create_log(("t", 0))
    for i in range(20):
        lg.append(batch(1))
    lm.checkpoint_recovery_offsets()    # recovery point still 0..; no shutdown marker
    lg.close()
    lm2 = LogManager([d], LogConfig({"segment.bytes": 1000}), background=False)
    lm2.startup()
    lg2 = lm2.get_log(("t", 0))
    assert lg2.recovered_segments_on_load >= 1 and lg2.log_end_offset == 20
    lm2.shutdown()


def test_background_retention_and_flush(tmp_path):
    clock = Clock()
    cfg = LogConfig({"segment.bytes": 1000, "retention.ms": 1000, "file.delete.delay.ms": 0, "flush.ms": 500})
    lm = LogManager([str(tmp_path / "d")], cfg, time_ms=clock, background=False)
    lm.startup()
    lg = lm.get_or_create_log(("t", 0))
    for i in range(20):
        lg.append(batch(1, ts=clock.now))
    lg.update_high_watermark(20)
    assert lm.cleanup_logs() == 0
    assert lm.flush_dirty_logs(clock.now + 499) == 0
    assert lm.flush_dirty_logs(clock.now + 500) == 1 and lg.recovery_point == 20
    clock.now += 1001
    assert lm.cleanup_logs() > 0
    assert lg.num_segments == 1 and lg.log_start_offset == 20
    lm.shutdown()


def test_background_thread_runs_tasks(tmp_path):
    mc = LogManagerConfig(log_dirs=(str(tmp_path / "d"),), retention_check_interval_ms=10)
    lm = LogManager(None, LogConfig({"segment.bytes": 1000, "retention.ms": 1, "file.delete.delay.ms": 0}),
                    manager_config=mc)
    lm.startup()
    try:
        lg = lm.get_or_create_log(("t", 0))
        for i in range(20):
            lg.append(batch(1, ts=1))
        lg.update_high_watermark(20)
        lm._scheduler.schedule(lm.cleanup_logs)          # the periodic task's body, now
        deadline = time.monotonic() + 10
        while lg.num_segments > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lg.num_segments == 1
    finally:
        lm.shutdown()


def test_fsync_mode_flag(tmp_path):
    lm = LogManager([str(tmp_path / "d")], manager_config=LogManagerConfig(
        log_dirs=(str(tmp_path / "d"),), fsync_every_append=True), background=False)
    lm.startup()
    lg = lm.get_or_create_log(("t", 0))
    assert lg.active_segment.fsync_every_append
    lg.append(batch(1))
    lm.shutdown()


def test_thousand_partitions_fds_and_clean_start(tmp_path):
    d = str(tmp_path / "d")
    cfg = LogConfig({"segment.index.bytes": 1 << 20})
    base_fds = fd_count()
    lm = LogManager([d], cfg, background=False)
    lm.startup()
    for p in range(1000):
        lm.get_or_create_log(("t", p)).append(batch(1))
    opened = fd_count() - base_fds
    # Compiled kernels: one .log fd per partition, a mapped index holds none.
    # The twin's mmap module keeps a dup()ed fd per mapping (no trackfd before 3.13).
    per = 1 if kernels.SELECTED.get("offset_index") == "cython" else 3
    assert opened <= per * 1000 + 10, opened
    lm.shutdown()
    assert fd_count() - base_fds <= 5

    t0 = time.perf_counter()
    lm = LogManager([d], cfg, background=False)
    lm.startup()
    elapsed = time.perf_counter() - t0
    assert len(lm.logs) == 1000
    assert all(lg.recovered_segments_on_load == 0 and lg.log_end_offset == 1 for lg in lm.all_logs())
    assert fd_count() - base_fds <= per * 1000 + 10
    print(f"clean start of 1000 partitions: {elapsed:.3f} s")
    assert elapsed < 20          # generous on a shared box; bench_log.py measures it properly
    assert read_all(lm.get_log(("t", 999))) == [(0, b"v" * 100)]
    lm.shutdown()

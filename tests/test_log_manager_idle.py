"""The LogManager's periodic work is proportional to what changed (issue 23: idle CPU
at 10,000 partitions): the high-watermark checkpoint task (every 5 s) neither scans
every log nor rewrites the file when no high watermark moved and no log came or went."""
import os

from kbroker.log import LogConfig, LogManager
from kbroker.log.checkpoints import REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile
from tests._log_util import batch


def test_hw_checkpoint_task_skips_the_scan_when_nothing_moved(tmp_path, monkeypatch):
    d = str(tmp_path / "d")
    lm = LogManager([d], LogConfig(), background=False)
    lm.startup()
    try:
        logs = [lm.get_or_create_log(("t", p)) for p in range(50)]
        for lg in logs:
            lg.append(batch(1))
            lg.update_high_watermark(1)
        scans = []
        real = lm._offsets_by_dir
        monkeypatch.setattr(lm, "_offsets_by_dir", lambda fn: scans.append(1) or real(fn))
        path = os.path.join(d, REPLICATION_OFFSET_CHECKPOINT)
        lm.checkpoint_high_watermarks()
        assert len(scans) == 1 and OffsetCheckpointFile(path).read() == {("t", p): 1 for p in range(50)}
        mtime = os.stat(path).st_mtime_ns
        for _ in range(5):                       # idle: no scan, no write
            lm.checkpoint_high_watermarks()
        assert len(scans) == 1 and os.stat(path).st_mtime_ns == mtime

        logs[7].append(batch(1))                 # an append alone does not move the HW...
        lm.checkpoint_high_watermarks()
        assert len(scans) == 1
        logs[7].update_high_watermark(2)         # ...its advance does
        lm.checkpoint_high_watermarks()
        assert len(scans) == 2 and OffsetCheckpointFile(path).read()[("t", 7)] == 2
        lm.checkpoint_high_watermarks()
        assert len(scans) == 2

        from kbroker.log.info import LogOffsetMetadata
        logs[8].append(batch(1))
        assert logs[8].maybe_increment_high_watermark(LogOffsetMetadata(2)) is not None
        lm.checkpoint_high_watermarks()
        assert len(scans) == 3 and OffsetCheckpointFile(path).read()[("t", 8)] == 2

        lm.get_or_create_log(("u", 0))           # a new log: in the next checkpoint
        lm.checkpoint_high_watermarks()
        assert len(scans) == 4 and ("u", 0) in OffsetCheckpointFile(path).read()
        lm.delete_log(("u", 0))                  # a deleted one: out of it
        lm.checkpoint_high_watermarks()
        assert len(scans) == 5 and ("u", 0) not in OffsetCheckpointFile(path).read()
    finally:
        lm.shutdown()
    # the shutdown's checkpoint holds every high watermark; a restart reads them back
    lm = LogManager([d], LogConfig(), background=False)
    lm.startup()
    try:
        assert lm.get_log(("t", 7)).high_watermark == 2 and lm.get_log(("t", 0)).high_watermark == 1
    finally:
        lm.shutdown()

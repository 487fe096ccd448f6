"""Topic configs whose effect is inside the storage engine: preallocate and a live
change of kbroker.fsync.every.append (the broker-level walk is tests/broker/test_config_walk.py)."""
import os

from kbroker.kernels import records
from kbroker.log.config import LogConfig
from kbroker.log.log import Log
from kbroker.log.manager import LogManager

from tests._log_util import batch, read_all

SEGMENT_BYTES = 64 * 1024


def _log_file_sizes(d):
    return {n: os.path.getsize(os.path.join(d, n)) for n in sorted(os.listdir(d)) if n.endswith(".log")}


def test_preallocate_extends_active_segment_and_trims_on_roll_and_close(tmp_path):
    d = str(tmp_path / "t-0")
    lg = Log.open(d, LogConfig({"preallocate": "true", "segment.bytes": SEGMENT_BYTES}))
    assert list(_log_file_sizes(d).values()) == [SEGMENT_BYTES]
    for _ in range(3):
        lg.append(batch(2))
    assert [v for _, v in read_all(lg)] == [b"v" * 100] * 6
    assert lg.active_segment.size < SEGMENT_BYTES == os.path.getsize(lg.active_segment.log_path)
    first_size = lg.active_segment.size
    lg.roll()
    sizes = _log_file_sizes(d)
    assert list(sizes.values()) == [first_size, SEGMENT_BYTES]  # rolled one trimmed, new one preallocated
    lg.append(batch(1))
    last = lg.active_segment.size
    lg.close()
    assert list(_log_file_sizes(d).values()) == [first_size, last]
    lg = Log.open(d, LogConfig({"preallocate": "true", "segment.bytes": SEGMENT_BYTES}), had_clean_shutdown=True,
                  recovery_point=7)
    assert lg.log_end_offset == 7 and len(read_all(lg)) == 7
    lg.close()


def test_preallocated_tail_is_recovered_after_a_crash(tmp_path):
    d = str(tmp_path / "t-0")
    cfg = LogConfig({"preallocate": "true", "segment.bytes": SEGMENT_BYTES})
    lg = Log.open(d, cfg)
    for _ in range(4):
        lg.append(batch(1))
    # a crash: nothing closed, the active file still has its zero-filled preallocated tail
    assert os.path.getsize(lg.active_segment.log_path) == SEGMENT_BYTES
    again = Log.open(d, cfg, had_clean_shutdown=False, recovery_point=0)
    assert again.log_end_offset == 4 and [o for o, _ in read_all(again)] == [0, 1, 2, 3]
    again.append(batch(1))
    assert [o for o, _ in read_all(again)] == [0, 1, 2, 3, 4]
    again.close()
    assert os.path.getsize(again.active_segment.log_path) == again.active_segment.size


def test_without_preallocate_files_grow_with_appends(tmp_path):
    d = str(tmp_path / "t-0")
    lg = Log.open(d, LogConfig({"segment.bytes": SEGMENT_BYTES}))
    assert list(_log_file_sizes(d).values()) == [0]
    lg.close()


def test_fsync_every_append_changed_on_a_live_log(tmp_path, monkeypatch):
    """AlterConfigs of kbroker.fsync.every.append reaches the live log: the next append
    is fdatasync'ed (and stops being so when the override goes)."""
    lm = LogManager([str(tmp_path)], background=False)
    lg = lm.get_or_create_log(("t", 0))
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd)))
    lg.append(batch(1))  # no BatchInfos: the Python append path, whose fdatasync is patched
    assert synced == []
    lm.update_topic_config("t", {"kbroker.fsync.every.append": "true"})
    lg.append(batch(1))
    assert len(synced) == 1
    lm.update_topic_config("t", {})
    lg.append(batch(1))
    assert len(synced) == 1
    lg.close()


def test_broker_default_change_reaches_live_logs_under_topic_overrides(tmp_path, monkeypatch):
    """LogManager.update_broker_defaults (dynamic broker configs): every live log gets the new
    defaults and fsync mode; a topic's own override still wins."""
    lm = LogManager([str(tmp_path)], background=False)
    lm.update_topic_config("pinned", {"retention.ms": "5000"})
    plain, pinned = lm.get_or_create_log(("plain", 0)), lm.get_or_create_log(("pinned", 0))
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd)))
    lm.update_broker_defaults(LogConfig.from_broker({"log.retention.ms": "7000"}), True)
    assert (plain.config.retention_ms, pinned.config.retention_ms) == (7000, 5000)
    plain.append(batch(1))
    assert synced == [plain.active_segment.fd]
    plain.close()
    pinned.close()


def test_segment_jitter_ms_rolls_segments_earlier(tmp_path, monkeypatch):
    """segment.jitter.ms: each new segment's roll deadline is segment.ms minus a random jitter
    below segment.jitter.ms (Kafka's LogSegment rollJitterMs)."""
    import random

    monkeypatch.setattr(random, "randrange", lambda n: n - 1)  # the largest jitter
    lg = Log.open(str(tmp_path / "t-0"), LogConfig({"segment.ms": 10_000, "segment.jitter.ms": 4_000}))
    assert lg.active_segment.roll_jitter_ms == 3_999
    lg.append(bytearray(records.encode_batch([(1_000, None, b"a", [])])))
    # 6,002 ms after the first batch: past segment.ms - jitter (6,001), well before segment.ms
    lg.append(bytearray(records.encode_batch([(7_002, None, b"b", [])])))
    assert lg.num_segments == 2
    lg.close()

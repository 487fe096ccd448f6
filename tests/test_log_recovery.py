"""Start-up load and crash recovery (kbroker.log.recovery)."""
import os
import struct

import pytest

from kbroker.log import Log, LogConfig
from _log_util import batch, read_all

CFG = {"segment.bytes": 2000, "index.interval.bytes": 200}


def build(tmp_path, n=40):
    lg = Log.open(str(tmp_path / "t-0"), LogConfig(CFG))
    for i in range(n):
        lg.append(batch(1, value=b"%03d" % i + b"v" * 90), leader_epoch=i // 10)
    lg.close()
    return lg.dir


def reopen(d, **kw):
    return Log.open(d, LogConfig(CFG), **kw)


def seg_files(d, ext):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(ext))


def values(lg):
    return [(o, v[:3]) for o, v in read_all(lg)]


def test_clean_start_scans_nothing(tmp_path):
    d = build(tmp_path)
    lg = reopen(d, had_clean_shutdown=True, recovery_point=40)
    assert lg.recovered_segments_on_load == 0 and lg.log_end_offset == 40
    assert values(lg) == [(i, b"%03d" % i) for i in range(40)]
    lg.close()


def test_unclean_start_scans_from_recovery_point(tmp_path):
    d = build(tmp_path)
    logs = seg_files(d, ".log")
    lg = reopen(d, recovery_point=0)
    assert lg.recovered_segments_on_load == len(logs)
    lg.close()
    second_base = int(os.path.basename(logs[1]).split(".")[0])
    lg = reopen(d, recovery_point=second_base + 1)
    assert lg.recovered_segments_on_load == len(logs) - 1
    assert lg.recovery_point == second_base + 1
    lg.close()


def test_corrupt_bytes_mid_segment_truncates_and_drops_later_segments(tmp_path):
    d = build(tmp_path)
    logs = seg_files(d, ".log")
    target = logs[1]
    size = os.path.getsize(target)
    with open(target, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 8)
    lg = reopen(d, recovery_point=0)
    base = int(os.path.basename(target).split(".")[0])
    assert lg.num_segments == 2                          # later segments deleted
    assert lg.truncated_bytes_on_load > 0
    leo = lg.log_end_offset
    assert base < leo < 40
    assert values(lg) == [(i, b"%03d" % i) for i in range(leo)]
    # offsets continue without a gap or duplicate
    assert lg.append(batch(1)).first_offset == leo
    assert lg.leader_epoch_cache.epoch_entries()[-1][1] < leo
    lg.close()


def test_torn_tail(tmp_path):
    d = build(tmp_path)
    last = seg_files(d, ".log")[-1]
    with open(last, "ab") as f:
        f.write(bytes(batch(1))[:50])                     # a partial batch at the end
    lg = reopen(d, recovery_point=0)
    assert lg.log_end_offset == 40 and lg.truncated_bytes_on_load == 50
    assert lg.append(batch(1)).first_offset == 40
    assert values(lg)[-1][0] == 40
    lg.close()


def test_zero_filled_tail(tmp_path):
    d = build(tmp_path)
    last = seg_files(d, ".log")[-1]
    with open(last, "ab") as f:
        f.write(b"\x00" * 5000)
    lg = reopen(d, recovery_point=0)
    assert lg.log_end_offset == 40
    lg.close()


@pytest.mark.parametrize("damage", ["delete_index", "truncate_index", "garbage_index", "delete_timeindex"])
def test_index_damage_rebuilt_on_clean_start(tmp_path, damage):
    d = build(tmp_path)
    idx = seg_files(d, ".index")[0]
    tix = seg_files(d, ".timeindex")[0]
    good = open(idx, "rb").read()
    if damage == "delete_index":
        os.unlink(idx)
    elif damage == "truncate_index":
        with open(idx, "r+b") as f:
            f.truncate(len(good) - 3)
    elif damage == "garbage_index":
        with open(idx, "wb") as f:
            f.write(struct.pack(">ii", -5, 0))
    else:
        os.unlink(tix)
    lg = reopen(d, had_clean_shutdown=True, recovery_point=40)
    assert values(lg) == [(i, b"%03d" % i) for i in range(40)]
    for off in range(40):
        assert lg.read(off, 1).fetch_offset_metadata.message_offset == off
    lg.close()
    assert open(idx, "rb").read() == good                 # rebuilt byte-identical
    assert os.path.getsize(tix) % 12 == 0


def test_leftover_files(tmp_path):
    d = build(tmp_path)
    logs = seg_files(d, ".log")
    # a .deleted segment, a .cleaned file, an orphan index and stray tmp
    open(os.path.join(d, "00000000000000000999.log.deleted"), "wb").write(b"x")
    open(os.path.join(d, "00000000000000000777.log.cleaned"), "wb").write(b"x")
    open(os.path.join(d, "00000000000000000888.index"), "wb").write(b"")
    open(os.path.join(d, "leader-epoch-checkpoint.tmp"), "wb").write(b"")
    # a completed-but-not-renamed swap: segment 0's content as a swap replacing segments 0 and 1
    s0, s1 = logs[0], logs[1]
    combined = open(s0, "rb").read() + open(s1, "rb").read()
    open(s0 + ".swap", "wb").write(combined)
    lg = reopen(d, recovery_point=0)
    names = os.listdir(d)
    assert not [n for n in names if n.endswith((".deleted", ".cleaned", ".swap", ".tmp"))]
    assert "00000000000000000888.index" not in names
    assert os.path.basename(s1) not in names               # replaced by the swap
    assert values(lg) == [(i, b"%03d" % i) for i in range(40)]
    lg.close()


def test_swap_above_cleaned_offset_is_discarded(tmp_path):
    d = build(tmp_path)
    logs = seg_files(d, ".log")
    base1 = os.path.basename(logs[1]).split(".")[0]
    open(os.path.join(d, base1 + ".log.cleaned"), "wb").write(b"junk")
    open(os.path.join(d, base1 + ".log.swap"), "wb").write(b"junk")
    lg = reopen(d, recovery_point=0)
    assert values(lg) == [(i, b"%03d" % i) for i in range(40)]
    lg.close()


def test_log_start_beyond_end_restarts_log(tmp_path):
    d = build(tmp_path)
    lg = reopen(d, had_clean_shutdown=True, log_start_offset=100)
    assert lg.log_start_offset == lg.log_end_offset == 100 and lg.num_segments == 1
    lg.close()

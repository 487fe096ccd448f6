"""Log / LogSegment behaviour: append, read, roll, indexes, retention, truncation."""
import os
import struct

import pytest

from kbroker.kernels import records
from kbroker.log import (
    FetchDataInfo, Log, LogConfig, OffsetOutOfRangeError, RecordBatchTooLargeError, RecordTooLargeError,
)
from kbroker.log.errors import CorruptRecordError, UnexpectedAppendOffsetError
from kbroker.records.region import FileRegion
from _log_util import Clock, batch, read_all


@pytest.fixture(autouse=True, params=["no_infos", "broker_infos"])
def append_path(request, monkeypatch):
    """Every test twice: ``Log.append(buf)`` as written, and with the batch infos of
    ``validate_batches`` as ReplicaManager passes them (the one-kernel-call fast path
    for batches without producer ids); buffers that do not validate go without."""
    if request.param == "broker_infos":
        real = Log.append

        def append(self, buf, infos=None, **kw):
            if infos is None:
                try:
                    infos = records.validate_batches(buf)
                except Exception:
                    infos = None
            return real(self, buf, infos, **kw)

        monkeypatch.setattr(Log, "append", append)
    return request.param


def open_log(tmp_path, clock=None, **overrides):
    return Log.open(str(tmp_path / "topic-0"), LogConfig(overrides), time_ms=clock or Clock())


def test_append_assigns_offsets_and_writes_wire_bytes(tmp_path):
    lg = open_log(tmp_path)
    b1, b2 = batch(3), batch(2, ts=2000)
    i1 = lg.append(b1)
    i2 = lg.append(b2)
    assert (i1.first_offset, i1.last_offset, i2.first_offset, i2.last_offset) == (0, 2, 3, 4)
    assert lg.log_end_offset == 5 and lg.high_watermark == 0
    data = open(os.path.join(lg.dir, "00000000000000000000.log"), "rb").read()
    # The file holds the batches exactly as sent, with base_offset rewritten.
    expect = bytearray(records.encode_batch([(1000, b"k", b"v" * 100, [])] * 3))
    expect += records.encode_batch([(2000, b"k", b"v" * 100, [])] * 2, base_offset=3)
    assert data == bytes(expect)
    lg.close()


def test_read_region_bounds(tmp_path):
    lg = open_log(tmp_path)
    sizes = []
    for i in range(10):
        b = batch(2)
        sizes.append(len(b))
        lg.append(b)
    info = lg.read(5, 10_000)
    assert isinstance(info.records, FileRegion)
    assert info.records.position == 2 * sizes[0]            # the batch holding offset 5 starts at offset 4
    assert info.fetch_offset_metadata.message_offset == 5
    assert info.records.size == 8 * sizes[0]
    # max_offset (exclusive) bounds the read at a batch boundary
    lg.update_high_watermark(8)
    info = lg.read(4, 10_000, max_offset=lg.high_watermark)
    assert info.records.size == 2 * sizes[0]
    assert lg.read(8, 10_000, max_offset=8).records == b""
    # max_bytes smaller than a batch: whole first batch with min_one_message
    info = lg.read(0, 10)
    assert info.records.size == sizes[0]
    info = lg.read(0, 10, min_one_message=False)
    assert info.records == b"" and info.first_entry_incomplete
    # byte bound
    assert lg.read(0, sizes[0] + 5).records.size == sizes[0] + 5
    # at the log end: empty; beyond: out of range
    assert lg.read(20, 100).records == b""
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(21, 100)
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(-1, 100)
    lg.close()


def test_roll_on_segment_bytes_and_index_entries(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 2000, "index.interval.bytes": 300})
    for i in range(30):
        lg.append(batch(1))
    names = sorted(n for n in os.listdir(lg.dir) if n.endswith(".log"))
    assert len(names) == lg.num_segments > 1
    for s in lg.segments:
        assert s.size <= 2000
    # rolled segments' indexes are trimmed; entries point at batch starts
    first = lg.segments[0]
    assert os.path.getsize(first.offset_index.path) == first.offset_index.entries * 8
    bsize = len(batch(1))
    for k in range(first.offset_index.entries):
        off, pos = first.offset_index.entry(k)
        assert pos % bsize == 0 and off == first.base_offset + pos // bsize
    assert read_all(lg) == [(i, b"v" * 100) for i in range(30)]
    # every offset is readable through index + scan
    for off in range(30):
        info = lg.read(off, 1)
        b = records.decode_batches(info.records.read_bytes())[0]
        assert b.base_offset == off
    lg.close()


def test_roll_on_segment_ms_uses_batch_timestamps(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"segment.ms": 1000})
    lg.append(batch(1, ts=10_000))
    lg.append(batch(1, ts=10_500))
    assert lg.num_segments == 1
    lg.append(batch(1, ts=11_001))           # 1001 ms after the segment's first batch
    assert lg.num_segments == 2 and lg.active_segment.base_offset == 2
    lg.close()


def test_roll_on_full_index(tmp_path):
    lg = open_log(tmp_path, **{"segment.index.bytes": 8 * 3, "index.interval.bytes": 0})
    for i in range(10):
        lg.append(batch(1))
    assert lg.num_segments >= 3
    assert read_all(lg) == [(i, b"v" * 100) for i in range(10)]
    lg.close()


def test_roll_explicit_and_empty(tmp_path):
    lg = open_log(tmp_path)
    assert lg.roll().base_offset == 0 and lg.num_segments == 1   # empty active: no new segment
    lg.append(batch(2))
    seg = lg.roll()
    assert seg.base_offset == 2 and lg.num_segments == 2
    assert lg.recovery_point == 2                                 # rolled segment flushed
    lg.close()


def test_too_large(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 500, "max.message.bytes": 300})
    with pytest.raises(RecordBatchTooLargeError):
        lg.append(batch(1, value=b"x" * 600))
    with pytest.raises(RecordTooLargeError):
        lg.append(batch(1, value=b"x" * 300))
    with pytest.raises(CorruptRecordError):
        lg.append(bytearray(b"\x00" * 70))
    assert lg.log_end_offset == 0
    lg.close()


def test_follower_append_keeps_offsets(tmp_path):
    lg = open_log(tmp_path)
    b = bytearray(records.encode_batch([(1, None, b"a", [])] * 2, base_offset=10))
    with pytest.raises(UnexpectedAppendOffsetError):
        lg.truncate_fully_and_start_at(20)
        lg.append(b, assign_offsets=False)
    lg.truncate_fully_and_start_at(10)
    info = lg.append(b, assign_offsets=False)
    assert (info.first_offset, lg.log_end_offset) == (10, 12)
    lg.close()


def test_append_as_leader_validates(tmp_path):
    lg = open_log(tmp_path)
    b = batch(2)
    b[-1] ^= 1                                   # CRC now wrong
    with pytest.raises(CorruptRecordError):
        lg.append_as_leader(b)
    b[-1] ^= 1
    assert lg.append_as_leader(b, leader_epoch=3).last_offset == 1
    assert struct.unpack_from(">i", open(lg.active_segment.log_path, "rb").read(), 12)[0] == 3
    lg.close()


def test_timestamp_lookup(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 1500, "index.interval.bytes": 200})
    ts = [5000, 5000, 4000, 7000, 6000, 9000, 9000, 12000, 3000, 15000]
    for i, t in enumerate(ts):
        lg.append(bytearray(records.encode_batch([(t, b"k", b"v" * 100, []), (t + 1, b"k", b"w", [])])))
    assert lg.num_segments > 1
    for target in (0, 4000, 5000, 5001, 5002, 6500, 7001, 9000, 12001, 15001):
        expect = next(((t if t >= target else t + 1, 2 * i + (0 if t >= target else 1))
                       for i, t in enumerate(ts) if t + 1 >= target), None)
        got = lg.fetch_offset_by_timestamp(target)
        assert (got[:2] if got else None) == expect, target
    assert lg.fetch_offset_by_timestamp(-2).offset == 0
    assert lg.fetch_offset_by_timestamp(-1).offset == 20
    assert lg.fetch_offset_by_timestamp(-3)[:2] == (15001, 19)
    lg.close()


def test_time_index_file_bytes(tmp_path):
    lg = open_log(tmp_path, **{"index.interval.bytes": 1})
    for i, t in enumerate([100, 300, 200, 400]):
        lg.append(bytearray(records.encode_batch([(t, None, b"x", [])])))
    seg = lg.active_segment
    lg.roll()
    # entries before batches 2,3,4 (more than 1 byte since the last entry), plus the roll entry
    sz = len(records.encode_batch([(100, None, b"x", [])]))
    assert open(seg.offset_index.path, "rb").read() == struct.pack(">iiiiii", 1, sz, 2, 2 * sz, 3, 3 * sz)
    assert open(seg.time_index.path, "rb").read() == struct.pack(">qiqi", 300, 1, 400, 3)
    lg.close()


def test_truncate_to(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 1000})
    for i in range(20):
        lg.append(batch(2), leader_epoch=i // 5)
    lg.update_high_watermark(40)
    nseg = lg.num_segments
    assert lg.truncate_to(17)                 # mid-batch: the whole batch [16, 17] goes
    assert lg.log_end_offset == 16 and lg.high_watermark == 16
    assert lg.num_segments < nseg
    assert lg.leader_epoch_cache.epoch_entries() == [(0, 0), (1, 10)]
    assert [o for o, _ in read_all(lg)] == list(range(16))
    lg.append(batch(1))
    assert lg.log_end_offset == 17
    assert not lg.truncate_to(100)
    assert lg.truncate_to(0) and lg.log_end_offset == 0 and read_all(lg) == []
    lg.close()


def test_delete_records_and_retention(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"segment.bytes": 1000, "file.delete.delay.ms": 1000})
    for i in range(30):
        lg.append(batch(1, ts=clock.now))
    with pytest.raises(OffsetOutOfRangeError):
        lg.delete_records(5)                  # beyond the high watermark
    lg.update_high_watermark(30)
    assert lg.delete_records(12) == 12
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(11, 100)
    assert lg.fetch_offset_by_timestamp(-2).offset == 12
    before = lg.num_segments
    n = lg.delete_old_segments()
    assert n >= 1 and lg.num_segments == before - n
    assert lg.segments[0].base_offset <= 12 < (lg.segments[1].base_offset if lg.num_segments > 1 else 99)
    assert lg.log_start_offset == 12
    deleted = [f for f in os.listdir(lg.dir) if f.endswith(".deleted")]
    assert len(deleted) == 3 * n              # .log, .index, .timeindex renamed
    assert lg.delete_pending_segments(clock.now + 999) == 0
    assert lg.delete_pending_segments(clock.now + 1000) == n
    assert not [f for f in os.listdir(lg.dir) if f.endswith(".deleted")]
    lg.close()


def test_retention_ms_and_bytes(tmp_path):
    clock = Clock(1_000_000)
    lg = open_log(tmp_path, clock, **{"segment.bytes": 1000, "retention.ms": 10_000,
                                      "retention.bytes": 2500, "file.delete.delay.ms": 0})
    for i in range(30):
        lg.append(batch(1, ts=900_000 + i * 1000))
    lg.update_high_watermark(lg.log_end_offset)
    total = lg.size_in_bytes
    lg.delete_old_segments(now_ms=0)          # nothing is older than retention.ms at t=0
    # Kafka: delete oldest segments while the excess is at least the segment's size
    assert total > 2500 and lg.size_in_bytes >= 2500
    assert lg.size_in_bytes - 2500 < lg.segments[0].size
    # time: every batch older than 10s at t=10^7 -> everything goes, active segment kept (rolled)
    lg.delete_old_segments(now_ms=10_000_000)
    assert lg.num_segments == 1 and lg.active_segment.size == 0
    assert lg.log_start_offset == lg.log_end_offset == 30
    lg.append(batch(1))
    assert lg.log_end_offset == 31
    lg.close()


def test_retention_needs_high_watermark(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 1000, "retention.ms": 1, "file.delete.delay.ms": 0})
    for i in range(10):
        lg.append(batch(1, ts=1))
    assert lg.delete_old_segments(now_ms=10**13) == 0   # nothing below the high watermark
    lg.update_high_watermark(5)
    assert 0 < lg.delete_old_segments(now_ms=10**13)
    assert lg.segments[0].base_offset <= 5
    lg.close()


def test_compact_policy_keeps_segments(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 1000, "retention.ms": 1, "cleanup.policy": "compact"})
    for i in range(10):
        lg.append(batch(1, ts=1))
    lg.update_high_watermark(10)
    assert lg.delete_old_segments(now_ms=10**13) == 0
    lg.close()


def test_leader_epochs(tmp_path):
    lg = open_log(tmp_path)
    lg.append(batch(2), leader_epoch=0)
    lg.append(batch(2), leader_epoch=0)
    lg.append(batch(3), leader_epoch=2)
    assert lg.end_offset_for_epoch(0) == (0, 4)
    assert lg.end_offset_for_epoch(1) == (0, 4)
    assert lg.end_offset_for_epoch(2) == (2, 7)
    assert lg.end_offset_for_epoch(3) == (-1, -1)
    with open(os.path.join(lg.dir, "leader-epoch-checkpoint"), "rb") as f:
        assert f.read() == b"0\n2\n0 0\n2 4\n"
    lg.close()


def test_flush_messages_moves_recovery_point(tmp_path):
    lg = open_log(tmp_path, **{"flush.messages": 3})
    lg.append(batch(1)); lg.append(batch(1))
    assert lg.recovery_point == 0
    lg.append(batch(1))
    assert lg.recovery_point == 3
    lg.flush()
    lg.close()


def test_reopen_after_close_continues(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 1000})
    for i in range(25):
        lg.append(batch(1, value=b"%d" % i))
    lg.close()
    lg = Log.open(lg.dir, LogConfig({"segment.bytes": 1000}), recovery_point=25, had_clean_shutdown=True)
    assert lg.log_end_offset == 25 and lg.recovered_segments_on_load == 0
    lg.append(batch(1, value=b"25"))
    assert read_all(lg) == [(i, b"%d" % i) for i in range(26)]
    lg.close()


def test_follower_append_far_ahead_rolls_for_relative_offset_overflow(tmp_path):
    lg = open_log(tmp_path)
    lg.append(batch(1))
    far = (1 << 31) + 100
    b = bytearray(records.encode_batch([(1, None, b"a", [])], base_offset=far))
    lg.append(b, assign_offsets=False)
    assert lg.num_segments == 2 and lg.active_segment.base_offset == far
    assert lg.log_end_offset == far + 1
    lg.close()


def test_layering_storage_does_not_import_server_or_network():
    import ast, pathlib
    root = pathlib.Path(__file__).resolve().parent.parent / "src" / "kbroker"
    for py in list((root / "log").glob("*.py")):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                for n in names:
                    assert not n.startswith(("kbroker.network", "kbroker.server", "kbroker.protocol")), (py, n)


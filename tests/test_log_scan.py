"""log_scan kernel: recovery scan, header walks, append preparation (both twins)."""
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

import kbroker._core.log_scan as c_scan
import kbroker._core.ref.log_scan as r_scan
from kbroker._core.errors import CorruptRecordError
from kbroker.kernels import records

IMPLS = [pytest.param(c_scan, id="cython"), pytest.param(r_scan, id="python")]


@pytest.fixture(params=IMPLS)
def scan_mod(request):
    return request.param


def make_log(n_batches, base=0, records_per_batch=2, value_size=50, epoch_every=None, ts0=1000):
    """A .log region: batches with consecutive offsets from ``base``."""
    out = bytearray()
    off = base
    positions = []
    for i in range(n_batches):
        b = bytearray(records.encode_batch(
            [(ts0 + i, b"k%d" % i, b"v" * value_size, [])] * records_per_batch, base_offset=off))
        if epoch_every:
            struct.pack_into(">i", b, 12, i // epoch_every)
        positions.append(len(out))
        out += b
        off += records_per_batch
    return bytes(out), positions


def fields(r):
    return (r.valid_bytes, r.batch_count, r.first_offset, r.next_offset, r.max_timestamp,
            r.offset_of_max_timestamp, r.first_batch_max_timestamp, r.error, r.offset_index_entries,
            r.time_index_entries, r.epochs)


def test_scan_valid(scan_mod):
    data, positions = make_log(40, base=500, epoch_every=10)
    r = scan_mod.scan(data, 500, index_interval_bytes=300)
    assert r.error is None and r.valid_bytes == len(data) and r.batch_count == 40
    assert r.first_offset == 500 and r.next_offset == 580
    assert r.max_timestamp == 1039 and r.offset_of_max_timestamp == 579
    assert r.epochs == [(0, 500), (1, 520), (2, 540), (3, 560)]
    # Kafka's rule: entry when bytes since the last entry position > interval
    expected, last = [], 0
    for i, pos in enumerate(positions):
        if pos - last > 300:
            expected.append((500 + 2 * i + 1 - 500, pos))
            last = pos
    got = [struct.unpack_from(">ii", r.offset_index_entries, k) for k in range(0, len(r.offset_index_entries), 8)]
    assert got == expected and got
    assert len(r.time_index_entries) == 12 * len(expected)


@pytest.mark.parametrize("damage", ["crc", "torn", "zeros", "magic", "short_header", "order"])
def test_scan_stops_at_first_invalid_byte(scan_mod, damage):
    data, positions = make_log(10)
    cut = positions[6]
    buf = bytearray(data)
    if damage == "crc":
        buf[cut + 70] ^= 0xFF
    elif damage == "torn":
        buf = buf[: cut + 30 + 61]
    elif damage == "zeros":
        buf = buf[:cut] + bytes(4096)
    elif damage == "magic":
        buf[cut + 16] = 1
    elif damage == "short_header":
        buf = buf[: cut + 10]
    elif damage == "order":
        struct.pack_into(">q", buf, cut, 0)   # base offset going backwards (CRC unaffected)
    r = scan_mod.scan(bytes(buf), 0)
    assert r.valid_bytes == cut and r.batch_count == 6 and r.next_offset == 12
    assert r.error is not None


def test_scan_twins_agree_on_random_damage():
    data, _ = make_log(30, epoch_every=7)
    rnd = __import__("random").Random(7)
    for _ in range(60):
        buf = bytearray(data)
        for _ in range(rnd.randint(0, 3)):
            buf[rnd.randrange(len(buf))] = rnd.randrange(256)
        buf = bytes(buf[: rnd.randint(0, len(buf))])
        assert fields(c_scan.scan(buf, 0, 200)) == fields(r_scan.scan(buf, 0, 200))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_scan_random_bytes_never_raises(b):
    assert fields(c_scan.scan(b, 0)) == fields(r_scan.scan(b, 0))


def test_fd_walks(tmp_path, scan_mod):
    data, positions = make_log(50, base=100, records_per_batch=3, value_size=500)
    p = tmp_path / "x.log"
    p.write_bytes(data + b"\x00\x01")   # trailing junk is not a batch
    fd = os.open(p, os.O_RDONLY)
    try:
        size = len(data) + 2
        assert scan_mod.search_offset(fd, 0, size, 100) == (100, 102, 0, positions[1])
        bo, last, pos, sz = scan_mod.search_offset(fd, 0, size, 131)
        assert (bo, last, pos) == (130, 132, positions[10])
        assert scan_mod.search_offset(fd, positions[20], size, 131) == (160, 162, positions[20], sz)
        assert scan_mod.search_offset(fd, 0, size, 250) is None
        assert scan_mod.search_timestamp(fd, 0, size, 1025, 0)[:3] == (175, 177, positions[25])
        assert scan_mod.search_timestamp(fd, 0, size, 1025, 190)[:3] == (190, 192, positions[30])
        assert scan_mod.scan_headers(fd, 0, size) == (250, 50, 1049, 249, 1000, len(data))
        assert scan_mod.scan_headers(fd, positions[49], size)[:2] == (250, 1)
    finally:
        os.close(fd)


def test_prepare_append(scan_mod):
    data, positions = make_log(5, value_size=2000)
    buf = bytearray(data)
    res = scan_mod.prepare_append(buf, 77, 4, 70, 1000, 3000, 4096, -1, -1, True)
    first, nxt, count, max_ts, off_max, first_ts, bsince, entries = res
    assert (first, nxt, count, max_ts, off_max, first_ts) == (77, 87, 5, 1004, 86, 1000)
    # bytes since last entry starts at 3000: entry before the 2nd batch (3000+size > 4096)
    assert entries[0] == (80, 1000 + positions[1], 1001, 80)
    for i, pos in enumerate(positions):
        assert struct.unpack_from(">qii", buf, pos)[0] == 77 + 2 * i
        assert struct.unpack_from(">i", buf, pos + 12)[0] == 4
    # offsets rewritten outside the CRC: batches still valid
    assert len(records.validate_batches(bytes(buf))) == 5
    with pytest.raises(CorruptRecordError):
        scan_mod.prepare_append(bytearray(data[:-1]), 0, -1, 0, 0, 0, 4096, -1, -1, True)
    with pytest.raises(CorruptRecordError):
        scan_mod.prepare_append(bytearray(), 0, -1, 0, 0, 0, 4096, -1, -1, True)
    with pytest.raises(ValueError):   # follower append below the log end
        scan_mod.prepare_append(bytearray(data), 5, -1, 0, 0, 0, 4096, -1, -1, False)
    with pytest.raises((BufferError, TypeError)):
        scan_mod.prepare_append(data, 0, -1, 0, 0, 0, 4096, -1, -1, True)


def test_prepare_append_twins_agree():
    data, _ = make_log(20, value_size=700)
    a, b = bytearray(data), bytearray(data)
    ra = c_scan.prepare_append(a, 10, -1, 0, 123, 4000, 4096, 1010, 3, True)
    rb = r_scan.prepare_append(b, 10, -1, 0, 123, 4000, 4096, 1010, 3, True)
    assert ra == rb and a == b


def _indexes(tmp_path, tag, base=0):
    from kbroker.kernels import offset_index, time_index
    oi = offset_index.OffsetIndex(str(tmp_path / f"{tag}.index"), base, 1 << 20, writable=True)
    ti = time_index.TimeIndex(str(tmp_path / f"{tag}.timeindex"), base, 1 << 20, writable=True)
    return oi, ti


def _append_all(mod, tmp_path, tag, data, chunks, seg_max=-1, seg_off=-1):
    """Append ``data`` cut at ``chunks`` through ``mod.append_batches``; the file,
    the results and the index entries."""
    oi, ti = _indexes(tmp_path, tag, base=100)
    fd = os.open(str(tmp_path / f"{tag}.log"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        pos, nxt, since, results = 0, 100, 0, []
        for lo, hi in zip(chunks, chunks[1:]):
            buf = bytearray(data[lo:hi])
            r = mod.append_batches(buf, fd, pos, nxt, 3, 100, since, 4096, seg_max, seg_off,
                                   (1 << 63) - 1, oi, ti, True, False)
            results.append(r)
            pos += len(buf)
            nxt, since, seg_max, seg_off = r[1], r[5], r[6], r[7]
        with open(str(tmp_path / f"{tag}.log"), "rb") as f:
            written = f.read()
        entries = ([oi.entry(i) for i in range(oi.entries)], [ti.entry(i) for i in range(ti.entries)])
        return written, results, entries
    finally:
        os.close(fd)
        oi.close()
        ti.close()


def test_append_batches_twins_agree_and_match_prepare_append(tmp_path):
    data, positions = make_log(30, value_size=900)
    cuts = [0, positions[1], positions[7], positions[8], positions[20], len(data)]
    c = _append_all(c_scan, tmp_path, "c", data, cuts, seg_max=1010, seg_off=100)
    r = _append_all(r_scan, tmp_path, "r", data, cuts, seg_max=1010, seg_off=100)
    assert c == r
    written, results, (offset_entries, time_entries) = c
    # the bytes are what prepare_append makes of the same batches, offsets from 100
    ref = bytearray(data)
    _, nxt, count, max_ts, off_max, _, _, entries = r_scan.prepare_append(
        ref, 100, 3, 100, 0, 0, 4096, 1010, 100, True)
    assert written == bytes(ref)
    assert results[-1][1] == nxt == 160 and sum(x[2] for x in results) == count == 30
    assert (results[-1][6], results[-1][7]) == (max_ts, off_max) == (1029, 159)
    assert offset_entries == [(o, p) for o, p, _, _ in entries]
    assert offset_entries and time_entries
    # the first chunk's own maxima (1000 < the segment's 1010) next to the segment's
    assert results[0][3:5] == (1000, 101) and results[0][6:8] == (1010, 100)


@pytest.mark.parametrize("roll_after,next_offset,base", [
    (1002, 0, 0),                       # a timestamp above the segment.ms limit
    ((1 << 63) - 1, (1 << 31) - 1, 0),  # last offset beyond the 32-bit relative range
    ((1 << 63) - 1, 0, 10),             # a last offset below the segment's base offset
])
def test_append_batches_returns_none_and_writes_nothing_when_the_segment_must_roll(
        scan_mod, tmp_path, roll_after, next_offset, base):
    data, _ = make_log(5)
    oi, ti = _indexes(tmp_path, "x", base=base)
    fd = os.open(str(tmp_path / "x.log"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        buf = bytearray(data)
        assert scan_mod.append_batches(buf, fd, 0, next_offset, -1, base, 0, 10, -1, -1,
                                       roll_after, oi, ti, True, False) is None
        assert os.fstat(fd).st_size == 0 and oi.entries == 0 and ti.entries == 0
    finally:
        os.close(fd)
        oi.close()
        ti.close()


def test_append_batches_write_error_truncates_and_raises(scan_mod, tmp_path):
    data, _ = make_log(3)
    oi, ti = _indexes(tmp_path, "e")
    path = str(tmp_path / "e.log")
    with open(path, "wb") as f:
        f.write(b"z" * 10)
    fd = os.open(path, os.O_RDONLY)       # writes fail with EBADF
    try:
        with pytest.raises(OSError):
            scan_mod.append_batches(bytearray(data), fd, 10, 0, -1, 0, 0, 4096, -1, -1,
                                    (1 << 63) - 1, oi, ti, True, True)
        assert oi.entries == 0
    finally:
        os.close(fd)
        oi.close()
        ti.close()
    oi, ti = _indexes(tmp_path, "f")
    try:
        with pytest.raises(CorruptRecordError):
            scan_mod.append_batches(bytearray(data[:-3]), -1, 0, 0, -1, 0, 0, 4096, -1, -1,
                                    (1 << 63) - 1, oi, ti, True, False)
    finally:
        oi.close()
        ti.close()


@pytest.mark.parametrize("room", ["offset", "time"])
def test_append_batches_needs_room_for_all_its_index_entries(scan_mod, tmp_path, room):
    """An append whose index entries would not all fit writes nothing (the caller
    rolls first), so no written batch is ever left unknown to its segment."""
    from kbroker.kernels import offset_index, time_index
    # ~1.9 KB batches, 5000 bytes since the last entry: entries before the 1st and 4th
    data, _ = make_log(6, value_size=900)
    # room for one entry: one offset slot, or two time slots (the last is kept free)
    oi = offset_index.OffsetIndex(str(tmp_path / "r.index"), 0, (1 if room == "offset" else 100) * 8,
                                  writable=True)
    ti = time_index.TimeIndex(str(tmp_path / "r.timeindex"), 0, (2 if room == "time" else 100) * 12,
                              writable=True)
    fd = os.open(str(tmp_path / "r.log"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        args = (0, 0, -1, 0, 5000, 4096, -1, -1, (1 << 63) - 1, oi, ti, True, False)
        assert scan_mod.append_batches(bytearray(data), fd, *args) is None   # 2 entries
        assert os.fstat(fd).st_size == 0 and oi.entries == 0 and ti.entries == 0
        one, _ = make_log(1, value_size=900)
        assert scan_mod.append_batches(bytearray(one), fd, *args) is not None  # 1 entry
        assert oi.entries == 1
    finally:
        os.close(fd)
        oi.close()
        ti.close()

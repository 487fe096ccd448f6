"""Offset and time index kernels: compiled and pure-Python twins, same tests."""
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

import kbroker._core.offset_index as c_oi
import kbroker._core.time_index as c_ti
import kbroker._core.ref.offset_index as r_oi
import kbroker._core.ref.time_index as r_ti
from kbroker._core.index_errors import CorruptIndexError, IndexFullError, InvalidOffsetError

IMPLS = [pytest.param((c_oi, c_ti), id="cython"), pytest.param((r_oi, r_ti), id="python")]


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


def test_offset_index_file_bytes_and_lookup(tmp_path, impl):
    oi_mod, _ = impl
    p = tmp_path / "00000000000000000100.index"
    idx = oi_mod.OffsetIndex(str(p), 100, 80)
    assert not idx.is_loaded and not p.exists()      # lazy: nothing opened yet
    assert idx.entries == 0 and idx.max_entries == 10
    assert p.stat().st_size == 80                      # pre-allocated
    idx.append(105, 0)
    idx.append(110, 4096)
    idx.append(200, 9000)
    assert idx.last_offset == 200
    assert idx.lookup(99) == (100, 0)
    assert idx.lookup(104) == (100, 0)
    assert idx.lookup(105) == (105, 0)
    assert idx.lookup(150) == (110, 4096)
    assert idx.lookup(10**12) == (200, 9000)
    assert idx.entry(1) == (110, 4096)
    with pytest.raises(IndexError):
        idx.entry(3)
    idx.close()
    # trimmed on close; big-endian (int32 relative offset, int32 position)
    assert p.read_bytes() == struct.pack(">ii", 5, 0) + struct.pack(">ii", 10, 4096) + struct.pack(">ii", 100, 9000)
    again = oi_mod.OffsetIndex(str(p), 100, 80)
    assert again.entries == 3 and again.last_offset == 200
    again.sanity_check()
    again.close_handler()


def test_offset_index_rejects_non_increasing_and_full(tmp_path, impl):
    oi_mod, _ = impl
    idx = oi_mod.OffsetIndex(str(tmp_path / "0.index"), 0, 16)
    idx.append(5, 10)
    with pytest.raises(InvalidOffsetError):
        idx.append(5, 20)
    with pytest.raises(InvalidOffsetError):
        idx.append(4, 20)
    idx.append(6, 20)
    assert idx.is_full
    with pytest.raises(IndexFullError):
        idx.append(7, 30)
    big = oi_mod.OffsetIndex(str(tmp_path / "1.index"), 0, 64)
    with pytest.raises(InvalidOffsetError):
        big.append(1 << 31, 0)   # relative offset must fit in int32
    idx.close(); big.close()


def test_offset_index_truncate_resize(tmp_path, impl):
    oi_mod, _ = impl
    idx = oi_mod.OffsetIndex(str(tmp_path / "0.index"), 1000, 8000)
    for i in range(1, 101):
        idx.append(1000 + i * 10, i * 100)
    idx.truncate_to(1500)           # removes entries with offset >= 1500
    assert idx.entries == 49 and idx.last_offset == 1490
    idx.truncate_to(1455)
    assert idx.entries == 45 and idx.last_offset == 1450
    idx.trim_to_valid_size()
    assert os.path.getsize(idx.path) == 45 * 8 and idx.is_full
    idx.resize(8000)
    assert idx.max_entries == 1000 and idx.entries == 45
    idx.append(1451, 99999)
    idx.truncate_to(0)
    assert idx.entries == 0 and idx.last_offset == 1000
    idx.reset()
    idx.close()


def test_offset_index_sanity(tmp_path, impl):
    oi_mod, _ = impl
    p = tmp_path / "00000000000000000050.index"
    p.write_bytes(b"\x00" * 12)     # not a multiple of 8
    with pytest.raises(CorruptIndexError):
        oi_mod.OffsetIndex(str(p), 50, 1024).sanity_check()
    p.write_bytes(struct.pack(">ii", -3, 0))   # last offset below base
    with pytest.raises(CorruptIndexError):
        oi_mod.OffsetIndex(str(p), 50, 1024).sanity_check()


def test_append_raw(tmp_path, impl):
    oi_mod, ti_mod = impl
    idx = oi_mod.OffsetIndex(str(tmp_path / "0.index"), 0, 80)
    idx.append_raw(struct.pack(">iiii", 1, 0, 5, 100))
    assert idx.entries == 2 and idx.last_offset == 5
    with pytest.raises(InvalidOffsetError):
        idx.append_raw(struct.pack(">ii", 5, 200))
    tix = ti_mod.TimeIndex(str(tmp_path / "0.timeindex"), 0, 120)
    tix.append_raw(struct.pack(">qiqi", 10, 1, 20, 5))
    assert tix.last_entry == (20, 5)
    with pytest.raises(InvalidOffsetError):
        tix.append_raw(struct.pack(">qi", 20, 6))
    idx.close(); tix.close()


def test_time_index_rules(tmp_path, impl):
    _, ti_mod = impl
    p = tmp_path / "00000000000000000010.timeindex"
    tix = ti_mod.TimeIndex(str(p), 10, 12 * 4)
    assert tix.last_entry == (-1, 10)
    assert tix.lookup(5) == (-1, 10)
    assert tix.maybe_append(100, 12)
    assert not tix.maybe_append(100, 13)      # same timestamp: no entry
    assert tix.maybe_append(200, 20)
    with pytest.raises(InvalidOffsetError):
        tix.maybe_append(300, 19)
    with pytest.raises(ValueError):
        tix.maybe_append(150, 25)
    assert tix.maybe_append(300, 30)
    assert tix.is_full                         # one slot stays free for the roll entry
    with pytest.raises(IndexFullError):
        tix.maybe_append(400, 40)
    assert tix.maybe_append(400, 40, skip_full_check=True)
    assert tix.lookup(99) == (-1, 10)
    assert tix.lookup(250) == (200, 20)
    assert tix.lookup(10**15) == (400, 40)
    tix.truncate_to(30)
    assert tix.entries == 2 and tix.last_entry == (200, 20)
    tix.close()
    assert p.read_bytes() == struct.pack(">qi", 100, 2) + struct.pack(">qi", 200, 10)


def test_time_index_sanity(tmp_path, impl):
    _, ti_mod = impl
    p = tmp_path / "0.timeindex"
    p.write_bytes(struct.pack(">qiqi", 500, 1, 100, 2))     # timestamps going down
    with pytest.raises(CorruptIndexError):
        ti_mod.TimeIndex(str(p), 0, 1200).sanity_check()
    p.write_bytes(b"\x00" * 13)
    with pytest.raises(CorruptIndexError):
        ti_mod.TimeIndex(str(p), 0, 1200).sanity_check()


def test_lazy_rename_delete(tmp_path, impl):
    oi_mod, _ = impl
    p = tmp_path / "0.index"
    idx = oi_mod.OffsetIndex(str(p), 0, 800)
    idx.append(3, 7)
    idx.rename_to(str(p) + ".deleted")
    assert os.path.exists(str(p) + ".deleted") and idx.lookup(3) == (3, 7)
    assert idx.delete_if_exists()
    assert not os.path.exists(str(p) + ".deleted")


def test_first_use_opens_creates_or_refuses(tmp_path, impl):
    """The first use maps an existing file at its length (entries = length / entry
    size, an empty file: none), creates a missing one at max size when writable, and
    refuses what cannot be opened with the errors callers handle."""
    oi_mod, ti_mod = impl
    missing = tmp_path / "00000000000000000000.index"
    with pytest.raises(FileNotFoundError):
        oi_mod.OffsetIndex(str(missing), 0, 80, writable=False).entries
    with pytest.raises(ValueError):
        oi_mod.OffsetIndex(str(missing), 0, 7).entries      # smaller than one entry
    with pytest.raises(FileNotFoundError):
        oi_mod.OffsetIndex(str(tmp_path / "no-such-dir" / "x.index"), 0, 80).entries
    assert not missing.exists()
    empty = tmp_path / "00000000000000000010.timeindex"
    empty.write_bytes(b"")
    ti = ti_mod.TimeIndex(str(empty), 10, 120)
    assert ti.entries == 0 and ti.length == 0 and ti.is_loaded
    exact = tmp_path / "00000000000000000020.index"
    exact.write_bytes(struct.pack(">ii", 1, 0) + struct.pack(">ii", 5, 4096))
    oi = oi_mod.OffsetIndex(str(exact), 20, 80)
    assert (oi.entries, oi.length, oi.lookup(30)) == (2, 16, (25, 4096))
    assert oi_mod.OffsetIndex(str(tmp_path / "new.index"), 0, 84).length == 80
    assert (tmp_path / "new.index").stat().st_size == 80


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1000), st.integers(1, 5000)), min_size=0, max_size=300),
       st.lists(st.integers(-10, 600_000), min_size=1, max_size=30))
def test_twins_agree_with_model(tmp_path_factory, steps, targets):
    d = tmp_path_factory.mktemp("idx")
    base = 1000
    idxs = [m.OffsetIndex(str(d / f"{i}.index"), base, 8 * 400) for i, m in enumerate((c_oi, r_oi))]
    model = []
    off, pos = base, 0
    for doff, dpos in steps:
        off += doff
        pos += dpos
        model.append((off, pos))
        for idx in idxs:
            idx.append(off, pos)
    for t in targets:
        t = base + t
        expect = max([e for e in model if e[0] <= t], default=(base, 0))
        assert [idx.lookup(t) for idx in idxs] == [expect, expect]
    assert idxs[0].raw_entries() == idxs[1].raw_entries()
    for idx in idxs:
        idx.close()


@pytest.mark.parametrize("kind", ["offset", "time"])
def test_lookups_race_remaps_truncation_and_close(tmp_path, impl, kind):
    """Lock-free readers look up while one writer appends, trims (remap smaller, as on
    roll), re-extends (remap larger), truncates and finally closes the index: every
    answer is an entry that was written, and a closed index raises IndexClosedError
    (never a read of an unmapped map)."""
    import threading
    import time

    from kbroker._core.index_errors import IndexClosedError
    oi_mod, ti_mod = impl
    base = 1000
    if kind == "offset":
        idx = oi_mod.OffsetIndex(str(tmp_path / "x.index"), base, 8 * 512)

        def add(k):
            idx.append(base + 2 * k, 100 * k)

        def check(k_target):
            off, pos = idx.lookup(base + 2 * k_target)
            assert (off, pos) == (base, 0) or (pos == 100 * ((off - base) // 2) and off <= base + 2 * k_target)

        def cut(k):
            idx.truncate_to(base + 2 * k)
    else:
        idx = ti_mod.TimeIndex(str(tmp_path / "x.timeindex"), base, 12 * 512)

        def add(k):
            idx.maybe_append(10_000 + k, base + k)

        def check(k_target):
            ts, off = idx.lookup(10_000 + k_target)
            assert (ts, off) == (-1, base) or (off == base + ts - 10_000 and ts <= 10_000 + k_target)

        def cut(k):
            idx.truncate_to(base + k)
    stop = threading.Event()
    errors = []
    counts = [0, 0]

    def reader():
        try:
            while not stop.is_set():
                try:
                    check(counts[0] % 600)
                    counts[1] += 1
                except IndexClosedError:
                    return
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    readers = [threading.Thread(target=reader, daemon=True) for _ in range(3)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 1.0
    k = 0
    while time.monotonic() < deadline and not errors:
        if idx.is_full:
            cut(k // 3)
            k = k // 3
        add(k)
        k += 1
        counts[0] = k
        if k % 50 == 0:
            idx.trim_to_valid_size()           # remap to the valid entries (roll)
            idx.resize(idx.entry_size * 512)   # and back (truncate_to makes it writable again)
    idx.close()
    for t in readers:
        t.join(10)
    stop.set()
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in readers)
    assert counts[1] > 100


@pytest.mark.parametrize("finish", ["flush", "trim", "close", "resize"])
def test_an_active_segments_new_index_is_memory_until_it_must_be_on_disk(tmp_path, impl, finish):
    """A growable (active segment's) index without a file maps anonymous memory on first
    use: appends and lookups create no file. flush writes the file at its mapped length,
    trim and close at exactly the valid entries, resize at the new length; the entries
    are then the file's and stay usable (both index kinds)."""
    oi_mod, ti_mod = impl
    p = tmp_path / "00000000000000000100.index"
    tp = tmp_path / "00000000000000000100.timeindex"
    idx = oi_mod.OffsetIndex(str(p), 100, 80)
    ti = ti_mod.TimeIndex(str(tp), 100, 120)
    idx.growable = ti.growable = True
    idx.append(105, 0)
    idx.append(110, 4096)
    ti.maybe_append(1000, 105, False)
    ti.maybe_append(2000, 110, False)
    assert idx.is_loaded and idx.entries == 2 and idx.lookup(150) == (110, 4096)
    assert ti.lookup(1500) == (1000, 105)
    assert not p.exists() and not tp.exists()           # nothing on disk yet
    want_oi = struct.pack(">iiii", 5, 0, 10, 4096)
    want_ti = struct.pack(">qiqi", 1000, 5, 2000, 10)
    for x in (idx, ti):
        if finish == "flush":
            x.flush()
        elif finish == "trim":
            assert x.trim_to_valid_size()
        elif finish == "close":
            x.close()
        else:
            x.resize(64)
    if finish == "flush":
        assert p.read_bytes() == want_oi + bytes(80 - 16) and tp.read_bytes() == want_ti + bytes(120 - 24)
    elif finish == "resize":
        assert p.read_bytes() == want_oi + bytes(64 - 16) and tp.read_bytes() == want_ti + bytes(60 - 24)
    else:
        assert p.read_bytes() == want_oi and tp.read_bytes() == want_ti
    if finish != "close":
        idx.append(120, 8000)
        assert idx.lookup(10**9) == (120, 8000) and idx.entries == 3
        idx.flush()
        assert p.read_bytes()[:24] == want_oi + struct.pack(">ii", 20, 8000)
        idx.close()
        ti.close()
    again = oi_mod.OffsetIndex(str(p), 100, 80)
    assert again.lookup(110) == (110, 4096)
    again.close()


def test_an_anonymous_index_renamed_or_deleted_leaves_no_file(tmp_path, impl):
    oi_mod, _ = impl
    p = tmp_path / "00000000000000000000.index"
    idx = oi_mod.OffsetIndex(str(p), 0, 80)
    idx.growable = True
    idx.append(3, 100)
    idx.rename_to(str(p) + ".deleted")
    assert not p.exists() and not os.path.exists(str(p) + ".deleted")
    idx.close()                                         # written under its new name
    assert open(str(p) + ".deleted", "rb").read() == struct.pack(">ii", 3, 100)
    q = tmp_path / "00000000000000000050.index"
    other = oi_mod.OffsetIndex(str(q), 50, 80)
    other.growable = True
    other.append(51, 0)
    assert other.delete_if_exists() is False and not q.exists()

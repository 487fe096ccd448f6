"""The log cleaner's offset map kernel: Cython vs twin, and against a pure-Python model."""
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbroker._core import offset_map as C
from kbroker._core import records as R
from kbroker._core.errors import CorruptRecordError
from kbroker._core.ref import offset_map as P

IMPLS = [pytest.param(C, id="cython"), pytest.param(P, id="python")]

# Known answers of MurmurHash3_x64_128, seed 0 (checked against the reference C++ via mmh3.hash64).
VECTORS = [
    (b"", (0x0000000000000000, 0x0000000000000000)),
    (b"hello", (0xCBD8A7B341BD9B02, 0x5B1E906A48AE1D19)),
    (b"kbroker", (0xD909CE47B26C67C1, 0x5A59BDEAEF80C125)),
    (b"The quick brown fox jumps over the lazy dog", (0xE34BBC7BBC071B6C, 0x7A433CA9C49A9347)),
    (bytes(range(33)), (0x7D41281BFABA4612, 0x55AC8073A7D6A30B)),
]


@pytest.mark.parametrize("m", IMPLS)
@pytest.mark.parametrize("key,expected", VECTORS)
def test_murmur3_known_answers(m, key, expected):
    assert m.murmur3_128(key) == expected


@given(st.binary(max_size=80))
@settings(max_examples=200, deadline=None)
def test_murmur3_twins_agree(key):
    assert C.murmur3_128(key) == P.murmur3_128(key)


@pytest.mark.parametrize("m", IMPLS)
def test_put_get_and_bounds(m):
    om = m.OffsetMap(24 * 10)
    assert (om.slots, om.max_entries, om.size, om.latest_offset) == (10, 9, 0, -1)
    om.put(b"a", 3)
    om.put(b"b", 4)
    om.put(b"a", 7)
    assert (om.get(b"a"), om.get(b"b"), om.get(b"zz"), om.size, om.latest_offset) == (7, 4, -1, 2, 7)
    for i in range(8):
        om.put(b"k%d" % i, 10 + i)
    assert om.size == 10 and om.get(b"k7") == 17 and om.get(b"nope") == -1
    with pytest.raises(ValueError):
        om.put(b"one-too-many", 99)
    om.put(b"a", 100)                      # an existing key still fits
    om.clear()
    assert (om.size, om.latest_offset, om.get(b"a")) == (0, -1, -1)
    with pytest.raises(ValueError):
        m.OffsetMap(10)


# -- random logs -----------------------------------------------------------------------------

def make_batches(rnd, n_batches, n_keys, first_offset=0, codecs=(0, 0, 1, 3, 4), ts0=1_000_000,
                 tombstone_p=0.2, keyless_p=0.0, pid=None):
    """Random v2 batches: returns (bytes, [(offset, key, value, timestamp)])."""
    buf = bytearray()
    recs_all = []
    off = first_offset
    for _ in range(n_batches):
        n = rnd.randint(1, 8)
        recs = []
        for i in range(n):
            key = None if rnd.random() < keyless_p else b"key-%d" % rnd.randrange(n_keys)
            value = None if rnd.random() < tombstone_p else b"value-%d-%s" % (off + i, b"x" * rnd.randrange(20))
            ts = ts0 + off + i + rnd.randrange(-5, 5)
            recs.append((ts, key, value, [("h", b"1")] if rnd.random() < 0.1 else []))
            recs_all.append((off + i, key, value, ts))
        p = pid if pid is not None else rnd.choice([-1, -1, 5])
        buf += R.encode_batch(recs, base_offset=off, compression=rnd.choice(codecs), producer_id=p,
                              producer_epoch=0 if p >= 0 else -1, base_sequence=off if p >= 0 else -1)
        off += n
    return bytes(buf), recs_all


def model_survivors(recs, latest, map_start=0, now=0, horizon=None):
    """Offsets that survive: past latest, or the last occurrence (>= map_start) of their key
    and a value or a live tombstone."""
    last = {}
    for off, key, value, _ in recs:
        if key is not None and map_start <= off <= latest:
            last[key] = off
    out = []
    for off, key, value, _ in recs:
        if off > latest:
            out.append(off)
        elif key is None:
            continue
        elif off >= last.get(key, -1):
            if value is not None or horizon is None or now < horizon:
                out.append(off)
    return out


def decoded(buf):
    return [(r.offset, r.key, r.value, r.timestamp) for b in R.decode_batches(buf) for r in b.records]


@given(seed=st.integers(0, 2**32 - 1), n_batches=st.integers(1, 30), n_keys=st.integers(1, 25),
       keyless=st.sampled_from([0.0, 0.1]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_build_and_filter_match_model_and_twin(seed, n_batches, n_keys, keyless):
    rnd = random.Random(seed)
    buf, recs = make_batches(rnd, n_batches, n_keys, keyless_p=keyless)
    results = []
    for m in (C, P):
        om = m.OffsetMap(24 * 4096)
        full, consumed, nread = om.build(buf, 0)
        assert (full, consumed, nread) == (False, len(buf), len(recs))
        out = m.filter_batches(buf, om, 5_000, 1_000)
        results.append((om.size, om.latest_offset, out))
    assert results[0] == results[1]
    size, latest, (out, consumed, nread, nkept) = results[0]
    assert latest == recs[-1][0] and consumed == len(buf) and nread == len(recs)
    survivors = model_survivors(recs, latest)
    got = decoded(out)
    assert [g[0] for g in got] == survivors and nkept == len(survivors)
    by_off = {r[0]: r for r in recs}
    for off, key, value, ts in got:          # records unchanged, original offsets and timestamps
        assert (off, key, value, ts) == by_off[off]
    # batches keep base offset and last offset delta: the offsets they span do not change
    orig = {b.base_offset: b for b in R.decode_batches(buf)}
    for b in R.decode_batches(out):
        o = orig[b.base_offset]
        assert (b.last_offset_delta, b.producer_id, b.base_sequence, b.compression) == \
               (o.last_offset_delta, o.producer_id, o.base_sequence, o.compression)


@pytest.mark.parametrize("m", IMPLS)
def test_tombstone_delete_horizon(m):
    recs = [(1000, b"a", b"1", []), (1001, b"a", None, []), (1002, b"b", b"2", [])]
    buf = R.encode_batch(recs, base_offset=10, compression=0)
    om = m.OffsetMap(24 * 100)
    om.build(buf, 0)
    out, _, _, kept = m.filter_batches(buf, om, now_ms=50_000, delete_retention_ms=100)
    (b,) = R.decode_batches(out)
    assert b.has_delete_horizon and b.base_timestamp == 50_100 and kept == 2
    assert [(r.offset, r.value, r.timestamp) for r in b.records] == [(11, None, 1001), (12, b"2", 1002)]
    assert (b.base_offset, b.last_offset_delta, b.max_timestamp) == (10, 2, 1002)
    # before the horizon: kept unchanged, byte for byte
    assert m.filter_batches(out, om, 50_099, 100)[0] == out
    # at the horizon: the tombstone goes, the horizon stays
    out2 = m.filter_batches(out, om, 50_100, 100)[0]
    (b2,) = R.decode_batches(out2)
    assert [(r.offset, r.value) for r in b2.records] == [(12, b"2")]
    assert b2.has_delete_horizon and b2.base_timestamp == 50_100 and b2.last_offset_delta == 2


@pytest.mark.parametrize("m", IMPLS)
def test_empty_batch_of_active_producer_keeps_header(m):
    old = R.encode_batch([(1000, b"k", b"old", [])], base_offset=0, producer_id=9, producer_epoch=3,
                         base_sequence=0)
    new = R.encode_batch([(1001, b"k", b"new", [])], base_offset=1, producer_id=8, producer_epoch=0,
                         base_sequence=0)
    buf = old + new
    om = m.OffsetMap(24 * 100)
    om.build(buf, 0)
    out = m.filter_batches(buf, om, 0, 0)[0]
    assert [b.base_offset for b in R.decode_batches(out)] == [1]
    out = m.filter_batches(buf, om, 0, 0, {9: 0})[0]
    b0, b1 = R.decode_batches(out)
    assert (b0.base_offset, b0.record_count, b0.producer_id, b0.producer_epoch, b0.base_sequence,
            b0.last_offset_delta, b0.base_timestamp, b0.max_timestamp) == (0, 0, 9, 3, 0, 0, -1, 1000)
    assert b0.is_valid()


@pytest.mark.parametrize("m", IMPLS)
def test_control_batches_are_kept(m):
    ctrl = R.encode_batch([(1000, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [])], base_offset=0,
                          producer_id=4, producer_epoch=0, is_transactional=True, is_control=True)
    data = R.encode_batch([(1000, b"k", b"v", [])], base_offset=1)
    om = m.OffsetMap(24 * 100)
    assert om.build(ctrl + data, 0)[0] is False and om.size == 1
    assert m.filter_batches(ctrl + data, om, 0, 0)[0] == ctrl + data


@pytest.mark.parametrize("m", IMPLS)
def test_map_full_stops_at_a_prefix(m):
    rnd = random.Random(3)
    buf, recs = make_batches(rnd, 40, 1000, tombstone_p=0.0)
    om = m.OffsetMap(24 * 20)                     # 18 keys fit
    full, consumed, _ = om.build(buf, 0)
    assert full and om.size == om.max_entries == 18
    distinct = []
    for off, key, _, _ in recs:
        if key not in distinct:
            distinct.append(key)
        if len(distinct) == 19:
            break
    # the map ends at the last record put: the one before the 19th distinct key
    assert om.latest_offset == off - 1
    assert consumed < len(buf)
    # survivors below latest are judged by the map; everything past it is kept
    out = m.filter_batches(buf, om, 0, 0)[0]
    assert [g[0] for g in decoded(out)] == model_survivors(recs, om.latest_offset)


@pytest.mark.parametrize("m", IMPLS)
def test_build_respects_start_offset_and_incomplete_tail(m):
    rnd = random.Random(5)
    buf, recs = make_batches(rnd, 10, 5, codecs=(0,))
    om = m.OffsetMap(24 * 100)
    start = recs[len(recs) // 2][0]
    full, consumed, _ = om.build(buf[:-3], start)
    assert not full and consumed < len(buf)
    om2 = m.OffsetMap(24 * 100)
    om2.build(buf, start)
    want = {}
    for off, key, _, _ in recs:
        if off >= start:
            want[key] = off
    assert {k: om2.get(k) for k in want} == want
    assert om2.get(b"key-never") == -1


@given(st.binary(min_size=0, max_size=300), st.integers(0, 10**6))
@settings(max_examples=200, deadline=None)
def test_bad_bytes_raise_only_corrupt_record_error(junk, seed):
    rnd = random.Random(seed)
    good, _ = make_batches(rnd, 3, 4, codecs=(0, 1))
    mutated = bytearray(good)
    if junk:
        pos = rnd.randrange(len(mutated))
        mutated[pos: pos + len(junk)] = junk
    for m in (C, P):
        for data in (bytes(junk), bytes(mutated)):
            om = m.OffsetMap(24 * 100)
            try:
                om.build(data, 0)
                m.filter_batches(data, om, 0, 0)
            except CorruptRecordError:
                pass


def test_corrupt_crc_is_rejected_not_rewritten():
    buf = bytearray(R.encode_batch([(1, b"k", b"v", []), (2, b"k", b"w", [])]))
    buf[-1] ^= 0xFF
    for m in (C, P):
        om = m.OffsetMap(24 * 100)
        with pytest.raises(CorruptRecordError):
            om.build(bytes(buf), 0)
        with pytest.raises(CorruptRecordError):
            m.filter_batches(bytes(buf), om, 0, 0)

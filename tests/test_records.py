"""Record batch kernel: the Cython module and its pure-Python twin, same tests.

Golden vectors come from tests/data/test-vectors.json (`recordBatchV2`,
`legacyMessageSet`); property tests check round trips and that both
implementations write identical bytes and raise the same error classes.
"""
import json
import mmap
import os
import random
import struct
import zlib

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbroker._core import compression
from kbroker._core.errors import (CorruptRecordError, InvalidRecordError,
                                  ProduceRecordsError, UnsupportedCompressionError)
from kbroker._core.compression import UnsupportedMagicError
from kbroker._core.ref import records as ref_records

try:
    from kbroker._core import records as c_records
except ImportError:  # pragma: no cover
    c_records = None

if os.environ.get("KBROKER_REQUIRE_EXTENSIONS") == "1":
    assert c_records is not None

IMPLS = [pytest.param(ref_records, id="python")]
if c_records is not None:
    IMPLS.insert(0, pytest.param(c_records, id="cython"))

DATA = os.path.join(os.path.dirname(__file__), "data", "test-vectors.json")
with open(DATA) as f:
    VECTORS = json.load(f)
V2 = VECTORS["recordBatchV2"]
LEGACY = VECTORS["legacyMessageSet"]

FIELD_MAP = {
    "baseOffset": "base_offset", "batchLength": "batch_length",
    "partitionLeaderEpoch": "partition_leader_epoch", "magic": "magic",
    "crc": "crc", "attributes": "attributes", "compression": "compression",
    "timestampType": "timestamp_type", "isTransactional": "is_transactional",
    "isControl": "is_control", "lastOffsetDelta": "last_offset_delta",
    "firstTimestamp": "base_timestamp", "maxTimestamp": "max_timestamp",
    "producerId": "producer_id", "producerEpoch": "producer_epoch",
    "baseSequence": "base_sequence", "recordCount": "record_count",
}


def _h(x):
    return None if x is None else bytes.fromhex(x)


def records_of(batch):
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch.records]


def batch_fields(b):
    return {name: getattr(b, name) for name in FIELD_MAP.values()}


# -- golden vectors -------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("vec", V2, ids=[v["name"] for v in V2])
def test_v2_golden_decode(impl, vec):
    raw = bytes.fromhex(vec["hex"])
    b = impl.decode_batch(raw)
    for key, name in FIELD_MAP.items():
        assert getattr(b, name) == vec["decoded"][key], name
    assert b.is_valid() is vec["decoded"]["crcValid"]
    assert b.size_in_bytes == len(raw)
    assert b.next_offset == b.base_offset + b.last_offset_delta + 1
    if "records" in vec:
        want = [(r["offset"], r["timestamp"], _h(r["keyHex"]), _h(r["valueHex"]),
                 [(k, _h(v)) for k, v in r["headers"]]) for r in vec["records"]]
        assert records_of(b) == want
    # iter/decode_batches agree, also with a trailing partial batch
    assert [records_of(x) for x in impl.decode_batches(raw + raw[:30])] == [records_of(b)]
    assert len(list(impl.iter_batches(raw + raw))) == 2


@pytest.mark.parametrize("impl", IMPLS)
def test_v2_golden_compressed_match_uncompressed(impl):
    by_name = {v["name"]: impl.decode_batch(bytes.fromhex(v["hex"])) for v in V2}
    plain = records_of(by_name["sarama-uncompressed-record"])
    for name in ("sarama-gzipped-record", "sarama-snappy-compressed-record",
                 "sarama-lz4-compressed-record"):
        assert records_of(by_name[name]) == plain


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("vec", V2, ids=[v["name"] for v in V2])
def test_v2_golden_validate(impl, vec):
    raw = bytes.fromhex(vec["hex"])
    d = vec["decoded"]
    if d["recordCount"] == 0:
        with pytest.raises(InvalidRecordError):
            impl.validate_batches(raw)
        return
    if d["producerId"] >= 0 and d["baseSequence"] < 0:  # pragma: no cover
        pytest.skip("not a client-valid batch")
    (info,) = impl.validate_batches(raw)
    assert info.position == 0
    assert info.size_in_bytes == len(raw)
    assert info.record_count == d["recordCount"]
    assert info.last_offset_delta == d["lastOffsetDelta"]
    assert info.base_timestamp == d["firstTimestamp"]
    assert info.max_timestamp == d["maxTimestamp"]
    assert info.compression == d["compression"]
    assert info.producer_id == d["producerId"]
    assert info.is_transactional == d["isTransactional"]
    assert info.partition_leader_epoch == d["partitionLeaderEpoch"]
    if "records" in vec:
        ts = [r["timestamp"] for r in vec["records"]]
        assert info.min_record_timestamp == min(ts)
        assert info.max_record_timestamp == max(ts)
        assert info.has_null_key == any(r["keyHex"] is None for r in vec["records"])


@pytest.mark.parametrize("impl", IMPLS)
def test_legacy_golden(impl):
    for vec in LEGACY:
        raw = bytes.fromhex(vec["hex"])
        (b,) = impl.decode_batches(raw)
        assert b.magic == vec["magic"]
        assert b.crc == vec["crc32"]
        assert b.attributes == vec["attributes"]
        assert b.is_valid()
        assert b.batch_length == vec["messageSize"]
        ts = -1 if vec["timestamp"] is None else vec["timestamp"]
        assert records_of(b) == [(vec["offset"], ts, _h(vec["keyHex"]), _h(vec["valueHex"]), [])]
        assert b.next_offset == vec["offset"] + 1
        assert b.producer_id == -1 and not b.is_control and not b.is_transactional
        with pytest.raises(UnsupportedMagicError) as ei:
            impl.validate_batches(raw)
        assert ei.value.magic == vec["magic"]
    # a whole message set (the four v0 messages) with a partial tail
    v0 = b"".join(bytes.fromhex(v["hex"]) for v in LEGACY[:4])
    batches = impl.decode_batches(v0 + v0[:20])
    assert [b.records[0].offset for b in batches] == [0, 1, 2, 3]


def _legacy_msg(offset, magic, attributes, timestamp, key, value):
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for x in (key, value):
        body += struct.pack(">i", -1) if x is None else struct.pack(">i", len(x)) + x
    crc = zlib.crc32(body) & 0xFFFFFFFF
    return struct.pack(">qiI", offset, len(body) + 4, crc) + body


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [1, 2, 3])
@pytest.mark.parametrize("log_append", [False, True])
def test_legacy_compressed_wrapper(impl, magic, codec, log_append):
    if log_append and magic == 0:
        pytest.skip("magic 0 has no timestamps")
    inner = b"".join(_legacy_msg(i if magic == 1 else 100 + i, magic, 0, 1000 + i,
                                 b"k%d" % i, b"v%d" % i) for i in range(3))
    attrs = codec | (0x08 if log_append else 0)
    wrapper = _legacy_msg(102, magic, attrs, 5000, None, compression.compress(codec, inner))
    (b,) = impl.decode_batches(wrapper)
    assert b.compression == codec
    assert [r.offset for r in b.records] == [100, 101, 102]
    assert b.last_offset == 102 and b.next_offset == 103 and b.base_offset == 100
    want_ts = [-1] * 3 if magic == 0 else ([5000] * 3 if log_append else [1000, 1001, 1002])
    assert [r.timestamp for r in b.records] == want_ts
    assert [r.value for r in b.records] == [b"v0", b"v1", b"v2"]


@pytest.mark.parametrize("impl", IMPLS)
def test_legacy_bad_crc(impl):
    raw = bytearray.fromhex(LEGACY[0]["hex"])
    raw[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        impl.decode_batches(bytes(raw))
    (b,) = impl.decode_batches(bytes(raw), check_crc=False)
    assert not b.is_valid()


# -- encode ---------------------------------------------------------------------

SAMPLE = [
    (1_700_000_000_000, b"key", b"value", [("h1", b"x"), ("h2", None), ("", b"")]),
    (1_699_999_999_000, None, b"", []),
    (1_700_000_000_500, b"", None, [("\u00e9\u4e2d", b"\x00\xff")]),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_encode_decode_sample(impl, codec):
    raw = impl.encode_batch(SAMPLE, base_offset=42, compression=codec,
                            producer_id=7, producer_epoch=3, base_sequence=11,
                            partition_leader_epoch=5, is_transactional=True)
    b = impl.decode_batch(raw)
    assert b.is_valid() and b.compression == codec and b.is_transactional
    assert (b.base_offset, b.producer_id, b.producer_epoch, b.base_sequence,
            b.partition_leader_epoch) == (42, 7, 3, 11, 5)
    assert b.base_timestamp == SAMPLE[0][0]
    assert b.max_timestamp == max(r[0] for r in SAMPLE)
    assert b.record_count == 3 and b.last_offset_delta == 2 and b.next_offset == 45
    assert records_of(b) == [(42 + i, t, k, v, list(h)) for i, (t, k, v, h) in enumerate(SAMPLE)]
    # null vs empty are distinct
    assert b.records[1].key is None and b.records[1].value == b""
    assert b.records[2].key == b"" and b.records[2].value is None
    assert b.records[0].headers[1] == ("h2", None) and b.records[0].headers[2] == ("", b"")
    (info,) = impl.validate_batches(raw)
    assert info.size_in_bytes == len(raw) and info.is_transactional


@pytest.mark.parametrize("impl", IMPLS)
def test_encode_options(impl):
    raw = impl.encode_batch(SAMPLE, base_timestamp=1_699_999_999_000,
                            timestamp_type=impl.TIMESTAMP_LOG_APPEND_TIME, is_control=True)
    b = impl.decode_batch(raw)
    assert b.base_timestamp == 1_699_999_999_000 and b.timestamp_type == 1 and b.is_control
    # LogAppendTime: every record reads the batch's max_timestamp
    assert {r.timestamp for r in b.records} == {b.max_timestamp}
    empty = impl.decode_batch(impl.encode_batch([]))
    assert empty.record_count == 0 and empty.records == [] and empty.size_in_bytes == 61
    assert empty.base_timestamp == -1 and empty.max_timestamp == -1
    assert impl.RECORD_BATCH_OVERHEAD == 61
    # bytes-like inputs
    raw2 = impl.encode_batch([(1, bytearray(b"k"), memoryview(b"v"), [("h", bytearray(b"x"))])])
    assert records_of(impl.decode_batch(raw2)) == [(0, 1, b"k", b"v", [("h", b"x")])]
    with pytest.raises(TypeError):
        impl.encode_batch([(1, "str key", b"v", [])])
    with pytest.raises(TypeError):
        impl.encode_batch([(1, b"k", b"v", [(b"bytes-key", b"v")])])
    with pytest.raises(UnsupportedCompressionError):
        impl.encode_batch(SAMPLE, compression=5)
    with pytest.raises(OverflowError):
        impl.encode_batch([(2**63, None, None, [])])
    with pytest.raises(OverflowError):
        impl.encode_batch([(-(2**63), None, None, []), (2**63 - 1, None, None, [])])


@pytest.mark.parametrize("impl", IMPLS)
def test_batch_builder(impl):
    b = impl.BatchBuilder(batch_size=300, compression=impl.LZ4)
    assert b.size_in_bytes() == 61
    n = 0
    while b.append(1000 + n, None, b"x" * 50, []):
        n += 1
        assert n < 100
    assert n == b.record_count and 61 + n * 57 <= 300 < 61 + (n + 1) * 57
    raw = b.build()
    dec = impl.decode_batch(raw)
    assert dec.record_count == n and dec.compression == impl.LZ4
    same = impl.encode_batch([(1000 + i, None, b"x" * 50, []) for i in range(n)], compression=impl.LZ4)
    assert raw == same
    # the first record is always accepted, however large
    big = impl.BatchBuilder(batch_size=10)
    assert big.append(1, None, b"y" * 100, [])
    assert not big.append(2, None, b"", [])


# -- twins agree ------------------------------------------------------------------

header_st = st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8)))
record_st = st.tuples(
    st.integers(min_value=-(2**40), max_value=2**41),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.one_of(st.none(), st.binary(max_size=200)),
    st.lists(header_st, max_size=4),
)


@pytest.mark.skipif(c_records is None, reason="Cython kernel not built (KBROKER_REQUIRE_EXTENSIONS=1 fails instead)")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record_st, max_size=20), codec=st.integers(0, 4),
       base_offset=st.integers(0, 2**62), txn=st.booleans(),
       pid=st.integers(-1, 2**40))
def test_roundtrip_and_twins_agree(records, codec, base_offset, txn, pid):
    kw = dict(base_offset=base_offset, compression=codec, is_transactional=txn,
              producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
              base_sequence=0 if pid >= 0 else -1)
    raw_c = c_records.encode_batch(records, **kw)
    raw_p = ref_records.encode_batch(records, **kw)
    assert raw_c == raw_p
    want = [(base_offset + i, t, k, v, list(h)) for i, (t, k, v, h) in enumerate(records)]
    for impl in (c_records, ref_records):
        b = impl.decode_batch(raw_c)
        assert records_of(b) == want
        assert b.record_count == len(records)
        if records:
            infos = impl.validate_batches(raw_c)
            assert len(infos) == 1 and infos[0].record_count == len(records)
            assert infos[0].min_record_timestamp == min(r[0] for r in records)
            assert infos[0].max_record_timestamp == max(r[0] for r in records)
            assert infos[0].has_null_key == any(r[1] is None for r in records)
    assert tuple(c_records.validate_batches(raw_c) if records else ()) == \
        tuple(ref_records.validate_batches(raw_c) if records else ())


def _outcome(fn, *args, **kw):
    try:
        r = fn(*args, **kw)
    except CorruptRecordError as e:
        return type(e)
    if isinstance(r, list):
        return [records_of(b) if hasattr(b, "records") else tuple(b) for b in r]
    return records_of(r)


def _both(fn_name, data, **kw):
    """Run fn on both twins; they must agree (value or error class)."""
    outs = [_outcome(getattr(impl, fn_name), data, **kw)
            for impl in (c_records, ref_records) if impl is not None]
    assert all(o == outs[0] for o in outs), (fn_name, data.hex(), outs)
    return outs[0]


BASE = ref_records.encode_batch(SAMPLE, producer_id=1, producer_epoch=0, base_sequence=0)
BASE_LZ4 = ref_records.encode_batch(SAMPLE, compression=3)


@pytest.mark.parametrize("raw", [BASE, BASE_LZ4], ids=["plain", "lz4"])
def test_truncated_at_every_length(raw):
    for n in range(len(raw)):
        cut = raw[:n]
        for fn in ("decode_batch", "validate_batches"):
            out = _both(fn, cut)
            assert isinstance(out, type) and issubclass(out, CorruptRecordError), (fn, n)
        # fetch path: the partial tail is ignored
        assert _both("decode_batches", cut) == []


@pytest.mark.parametrize("raw", [BASE, BASE_LZ4], ids=["plain", "lz4"])
def test_every_bit_flip(raw):
    for i in range(len(raw)):
        for bit in (0, 3, 7):
            bad = bytearray(raw)
            bad[i] ^= 1 << bit
            bad = bytes(bad)
            out = _both("validate_batches", bad)
            if i < 8 or 12 <= i < 16:
                # base_offset / partition_leader_epoch are outside the CRC
                assert not isinstance(out, type)
            else:
                assert isinstance(out, type) and issubclass(out, CorruptRecordError), (i, bit)
            _both("decode_batch", bad)
            _both("decode_batches", bad)


def _fix_crc(b):
    b = bytearray(b)
    from crc32c import crc32c
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    return bytes(b)


def test_structure_rules_after_crc_fix():
    """Corruptions with a correct CRC: INVALID_RECORD-class errors, both twins."""
    rnd = random.Random(1234)
    for _ in range(600):
        bad = bytearray(BASE)
        for _ in range(rnd.randint(1, 3)):
            bad[rnd.randrange(21, len(bad))] = rnd.randrange(256)
        bad = _fix_crc(bad)
        _both("validate_batches", bad)
        _both("decode_batch", bad)


def _mutated(field_offset, fmt, value, raw=BASE):
    b = bytearray(raw)
    struct.pack_into(fmt, b, field_offset, value)
    return _fix_crc(b)


@pytest.mark.parametrize("impl", IMPLS)
def test_validate_rules(impl):
    # absurd record count (against bytes left): no allocation, InvalidRecordError
    for count in (2**31 - 1, 10**6, -1, -(2**31)):
        with pytest.raises(InvalidRecordError):
            impl.validate_batches(_mutated(57, ">i", count))
        with pytest.raises(InvalidRecordError):
            impl.decode_batch(_mutated(57, ">i", count))
    with pytest.raises(InvalidRecordError):  # count one too many / few
        impl.validate_batches(_mutated(57, ">i", 4))
    with pytest.raises(InvalidRecordError):
        impl.validate_batches(_mutated(57, ">i", 2))
    with pytest.raises(InvalidRecordError):  # last_offset_delta
        impl.validate_batches(_mutated(23, ">i", 5))
    with pytest.raises(InvalidRecordError):  # control batch from a client
        impl.validate_batches(_mutated(21, ">h", 0x20))
    assert impl.validate_batches(_mutated(21, ">h", 0x20), allow_control=True)[0].is_control
    with pytest.raises(InvalidRecordError):  # producer id without a sequence
        impl.validate_batches(_mutated(53, ">i", -1))
    with pytest.raises(UnsupportedCompressionError):
        impl.validate_batches(_mutated(21, ">h", 5))
    with pytest.raises(CorruptRecordError):  # batch_length
        impl.validate_batches(_mutated(8, ">i", 48))
    with pytest.raises(CorruptRecordError):
        impl.validate_batches(_mutated(8, ">i", 2**31 - 1))
    with pytest.raises(CorruptRecordError):  # magic 3
        impl.validate_batches(bytes(BASE[:16]) + b"\x03" + bytes(BASE[17:]))
    with pytest.raises(CorruptRecordError):
        impl.validate_batches(b"")
    # offset deltas must be 0,1,2: rewrite record 1's delta (byte after its ts delta)
    recs = [(1000, None, b"a", []), (1000, None, b"b", [])]
    raw = bytearray(impl.encode_batch(recs))
    # record 0 = 61: len, attr, tsdelta(0), offdelta(0) at 64; record 1 starts at 61+1+len0
    len0 = raw[61] >> 1
    assert raw[61 + 1 + len0 + 3] == 2  # zigzag(1)
    raw[61 + 1 + len0 + 3] = 4          # delta 2
    with pytest.raises(InvalidRecordError):
        impl.validate_batches(_fix_crc(raw))
    # decode (fetch path) accepts gaps: compacted batches have them
    assert [r.offset for r in impl.decode_batch(_fix_crc(raw)).records] == [0, 2]


@pytest.mark.parametrize("impl", IMPLS)
def test_validate_several_batches_and_rewrite(impl):
    a = impl.encode_batch(SAMPLE)
    b = impl.encode_batch(SAMPLE[:1], compression=impl.GZIP)
    c = impl.encode_batch(SAMPLE[:2], compression=impl.ZSTD)
    buf = bytearray(a + b + c)
    infos = impl.validate_batches(buf)
    assert [i.position for i in infos] == [0, len(a), len(a) + len(b)]
    assert [i.record_count for i in infos] == [3, 1, 2]
    assert impl.assign_offsets(buf, infos, 1000, partition_leader_epoch=9) == 1006
    batches = impl.decode_batches(buf)
    assert [x.base_offset for x in batches] == [1000, 1003, 1004]
    assert all(x.partition_leader_epoch == 9 and x.is_valid() for x in batches)
    impl.set_log_append_time(buf, infos[1].position, 123456789)
    x = impl.decode_batches(buf)[1]
    assert x.is_valid() and x.timestamp_type == 1 and x.max_timestamp == 123456789
    assert x.records[0].timestamp == 123456789
    impl.set_max_timestamp(buf, 0, 0, 5)
    assert impl.decode_batch(buf).max_timestamp == 5
    impl.set_base_offset(buf, 0, 7)
    impl.set_partition_leader_epoch(buf, 0, 3)
    y = impl.decode_batch(buf)
    assert (y.base_offset, y.partition_leader_epoch) == (7, 3) and y.is_valid()
    # the same through a writable memoryview and an mmap
    mv = memoryview(buf)[len(a):]
    impl.set_base_offset(mv, 0, 77)
    assert impl.decode_batches(buf)[1].base_offset == 77
    with mmap.mmap(-1, len(buf)) as m:
        m[:] = buf
        impl.assign_offsets(m, impl.validate_batches(m), 500)
        assert [x.base_offset for x in impl.decode_batches(m[:])] == [500, 503, 504]
    with pytest.raises(TypeError):
        impl.set_base_offset(bytes(buf), 0, 1)
    with pytest.raises(ValueError):
        impl.set_base_offset(buf, len(buf) - 5, 1)
    with pytest.raises(CorruptRecordError):
        impl.set_base_offset(buf, 1, 1)  # no batch there


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data):
    for fn in ("decode_batch", "decode_batches", "validate_batches"):
        _both(fn, data)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(BASE) - 1), st.binary(min_size=1, max_size=8))
def test_fuzz_splice(pos, junk):
    bad = BASE[:pos] + junk + BASE[pos + len(junk):]
    for fn in ("decode_batch", "decode_batches", "validate_batches"):
        _both(fn, bad)
    _both("validate_batches", _fix_crc(bad) if len(bad) > 21 else bad)


# -- compression module -------------------------------------------------------------

def test_compression_codecs():
    data = os.urandom(5000) + b"\x00" * 70000
    for codec in range(5):
        assert compression.decompress(codec, compression.compress(codec, data)) == data
    x = compression.compress(compression.SNAPPY, data)
    assert x.startswith(b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01")
    # 75000 bytes -> three 32 KiB xerial chunks
    assert compression.decompress(2, bytes(cramjam.snappy.compress_raw(data))) == data
    assert compression.compress(compression.GZIP, data)[:2] == b"\x1f\x8b"
    assert compression.compress(compression.LZ4, data)[:4] == b"\x04\x22\x4d\x18"
    assert compression.compress(compression.ZSTD, data)[:4] == b"\x28\xb5\x2f\xfd"
    # two concatenated gzip members / lz4 frames decode as one stream
    assert compression.decompress(1, compression.compress(1, b"ab") + compression.compress(1, b"cd")) == b"abcd"
    assert compression.decompress(3, compression.compress(3, b"ab") + compression.compress(3, b"cd")) == b"abcd"
    with pytest.raises(UnsupportedCompressionError):
        compression.decompress(5, b"x")
    with pytest.raises(UnsupportedCompressionError):
        compression.compress(7, b"x")


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_decompression_bounded(codec):
    bomb = compression.compress(codec, b"\x00" * (4 << 20))
    with pytest.raises(CorruptRecordError):
        compression.decompress(codec, bomb, max_size=1 << 20)
    assert len(compression.decompress(codec, bomb, max_size=4 << 20)) == 4 << 20
    for cut in (1, 7, len(bomb) // 2, len(bomb) - 1):
        with pytest.raises(CorruptRecordError):
            compression.decompress(codec, bomb[:cut])
    with pytest.raises(CorruptRecordError):
        compression.decompress(codec, b"\x82SNAPPY\x00garbage-garbage-garbage")


# -- LogValidator record checks in validate_batches ---------------------------------------

NOW = 1_700_000_000_000
I64_MAX = (1 << 63) - 1


@pytest.mark.parametrize("codec", [0, 3])
@pytest.mark.parametrize("impl", IMPLS)
def test_record_checks_list_each_failing_record_in_order(impl, codec):
    """Kafka's LogValidator.validateRecord per record, in the validating walk: the key check
    first (compacted topics), then the timestamp window; -1 skips only its own record."""
    recs = [(NOW, b"k", b"v", []), (NOW - 10_000, None, b"v", []), (-1, b"k", b"v", []),
            (NOW + 50_000, b"k", None, []), (-1, None, None, []), (NOW - 4_000, b"k", b"v", [])]
    raw = impl.encode_batch(recs, compression=codec)
    (info,) = impl.validate_batches(raw)
    assert info.record_errors == ()  # no checks asked for
    kw = dict(timestamp_type=0, now_ms=NOW, timestamp_before_max_ms=5_000, timestamp_after_max_ms=5_000)
    (info,) = impl.validate_batches(raw, compacted=True, **kw)
    assert info.record_errors == ((1, impl.RECORD_ERROR_NO_KEY, NOW - 10_000),
                                  (3, impl.RECORD_ERROR_TIMESTAMP, NOW + 50_000),
                                  (4, impl.RECORD_ERROR_NO_KEY, -1))
    (info,) = impl.validate_batches(raw, **kw)
    assert [e[:2] for e in info.record_errors] == [(1, 2), (3, 2)]
    # the window's edges are inside; LogAppendTime topics check no timestamps
    assert impl.validate_batches(raw, timestamp_type=0, now_ms=NOW, timestamp_before_max_ms=10_000,
                                 timestamp_after_max_ms=50_000)[0].record_errors == ()
    assert impl.validate_batches(raw, timestamp_type=1, now_ms=NOW, timestamp_before_max_ms=0,
                                 timestamp_after_max_ms=0)[0].record_errors == ()
    # the record timestamps' max, whatever the header says, is what the broker writes back
    assert (info.max_timestamp, info.max_record_timestamp) == (NOW + 50_000, NOW + 50_000)


@pytest.mark.parametrize("impl", IMPLS)
def test_record_checks_java_long_arithmetic(impl):
    """now - ts and ts - now wrap as Java longs (LogValidator.recordHasInvalidTimestamp)."""
    recs = [(-(1 << 62), b"k", b"v", []), ((1 << 62), b"k", b"v", [])]
    raw = impl.encode_batch(recs, base_timestamp=0)
    for before, after in ((I64_MAX, I64_MAX), (0, 0), (1 << 62, 1 << 62)):
        got = [impl.validate_batches(raw, timestamp_type=0, now_ms=n, timestamp_before_max_ms=before,
                                     timestamp_after_max_ms=after)[0].record_errors
               for n in (0, I64_MAX, -I64_MAX - 1)]
        want = []
        for n in (0, I64_MAX, -I64_MAX - 1):
            errs = []
            for i, (ts, *_rest) in enumerate(recs):
                diff = ((n - ts + (1 << 63)) % (1 << 64)) - (1 << 63)
                neg = ((-diff + (1 << 63)) % (1 << 64)) - (1 << 63)
                if diff > before or neg > after:
                    errs.append((i, 2, ts))
            want.append(tuple(errs))
        assert got == want, (before, after)


@pytest.mark.parametrize("impl", IMPLS)
def test_record_checks_of_a_log_append_time_batch(impl):
    """A batch with the LogAppendTime bit: its records' timestamps are its max_timestamp;
    a LogAppendTime topic (or a -1 max_timestamp) fails every record (producers may not set
    the bit), a CreateTime topic checks the header's max_timestamp as each record's."""
    recs = [(NOW + i, b"k", b"v", []) for i in range(3)]
    raw = bytearray(impl.encode_batch(recs, timestamp_type=1))
    impl.set_max_timestamp(raw, 0, 1, NOW + 1_000)
    lat = impl.RECORD_ERROR_LOG_APPEND_TIME
    assert impl.validate_batches(raw, timestamp_type=1)[0].record_errors == tuple(
        (i, lat, NOW + 1_000) for i in range(3))
    assert impl.validate_batches(raw, timestamp_type=0, now_ms=NOW)[0].record_errors == ()
    assert impl.validate_batches(raw, timestamp_type=0, now_ms=NOW, timestamp_after_max_ms=999)[0] \
        .record_errors == tuple((i, impl.RECORD_ERROR_TIMESTAMP, NOW + 1_000) for i in range(3))
    impl.set_max_timestamp(raw, 0, 1, -1)
    assert impl.validate_batches(raw, timestamp_type=0, now_ms=NOW)[0].record_errors == tuple(
        (i, lat, -1) for i in range(3))


@pytest.mark.parametrize("impl", IMPLS)
def test_set_max_timestamp_keeps_only_known_attribute_bits(impl):
    """Kafka's setMaxTimestamp rewrites the attributes with computeAttributes: compression,
    timestamp type, transactional, control and delete-horizon bits; others are dropped."""
    raw = bytearray(impl.encode_batch([(NOW, b"k", b"v", [])], compression=3, is_transactional=True,
                                      producer_id=5, producer_epoch=0, base_sequence=0))
    struct.pack_into(">h", raw, 21, struct.unpack_from(">h", raw, 21)[0] | 0x0180)
    impl.set_max_timestamp(raw, 0, 0, NOW + 7)
    assert struct.unpack_from(">h", raw, 21)[0] == 0x13
    (b,) = impl.decode_batches(bytes(raw))
    assert b.max_timestamp == NOW + 7 and b.is_valid()


@pytest.mark.skipif(c_records is None, reason="Cython kernel not built (KBROKER_REQUIRE_EXTENSIONS=1 fails instead)")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(st.tuples(st.sampled_from([-1, -5, NOW - 10, NOW, NOW + 10, 0, I64_MAX]),
                                  st.one_of(st.none(), st.just(b"k")), st.just(b"v"), st.just([])),
                        min_size=1, max_size=12),
       codec=st.integers(0, 4), ts_bit=st.integers(0, 1), topic_type=st.integers(0, 1),
       compacted=st.booleans(), before=st.sampled_from([0, 5, I64_MAX]),
       after=st.sampled_from([0, 5, I64_MAX]))
def test_record_checks_twins_agree(records, codec, ts_bit, topic_type, compacted, before, after):
    raw = c_records.encode_batch(records, compression=codec, timestamp_type=ts_bit, base_timestamp=0)
    kw = dict(timestamp_type=topic_type, now_ms=NOW, timestamp_before_max_ms=before,
              timestamp_after_max_ms=after, compacted=compacted)
    assert c_records.validate_batches(raw, **kw) == ref_records.validate_batches(raw, **kw)


@pytest.mark.parametrize("codec,levels", [(1, (1, 9)), (3, (0, 12)), (4, (1, 19))])
def test_compression_level_twins_agree(codec, levels):
    """encode_batch/BatchBuilder's compression_level reaches the codec (the broker rebuilds
    batches at a topic's compression.<codec>.level); both twins write the same bytes."""
    text = b" ".join(b"r-%d-%s" % (i, b"xyz" * (i % 5)) for i in range(2000))
    recs = [(NOW, b"k", text, [("h", b"v")])]
    outs = {}
    for level in levels:
        raws = [impl.encode_batch(recs, compression=codec, compression_level=level)
                for impl in (c_records, ref_records) if impl is not None]
        assert all(r == raws[0] for r in raws)
        assert records_of(ref_records.decode_batch(raws[0]))[0][3] == text
        assert raws[0][61:] == compression.compress(codec, compression.decompress(codec, raws[0][61:]), level)
        outs[level] = raws[0]
    assert outs[levels[0]] != outs[levels[1]]


# -- Produce's request checks in the batch walk (validate_batches(produce_version=...)) -------

def _produce_outcome(impl, data, **kw):
    """validate_batches in produce mode: ("ok", n infos), ("refused", code, base_offset,
    size) or the batch error class."""
    try:
        return ("ok", len(impl.validate_batches(data, **kw)))
    except ProduceRecordsError as e:
        return ("refused", e.error_code, e.base_offset, e.size)
    except CorruptRecordError as e:
        return type(e)


def _with_base_offset(raw, base_offset):
    b = bytearray(raw)
    b[0:8] = struct.pack(">q", base_offset)
    return bytes(b)


_MAGIC = lambda b, m: b[:16] + bytes([m & 0xFF]) + b[17:]  # noqa: E731
# ProduceRequest.validateRecords' cases (Kafka's MemoryRecords.batches() walk) -> error code
_REQUEST_CASES = [
    (b"", 87), (BASE, 0), (BASE + BASE, 87),
    (BASE + b"\0" * 11, 0),                                   # less than a size field after the batch
    (BASE + struct.pack(">qi", 0, 1000) + b"\0\0\0\0\2", 0),  # a second batch cut short
    (BASE + struct.pack(">qi", 0, 3), 2),                     # size below the legacy minimum
    (_MAGIC(BASE, 1), 87), (_MAGIC(BASE, 0), 87), (_MAGIC(BASE, 3), 2), (_MAGIC(BASE, -1), 2),
    (BASE + _MAGIC(BASE, 3), 2), (BASE[:-1], 87), (BASE[:11], 87),
]


@pytest.mark.parametrize("impl", IMPLS)
def test_produce_records_error_walks_headers_as_kafka(impl):
    for data, want in _REQUEST_CASES:
        for wrap in (bytes, bytearray, memoryview):
            assert impl.produce_records_error(wrap(data), 11) == want, (data.hex(), want)
    assert impl.produce_records_error(None, 3) == 87
    zstd = impl.encode_batch([(1, b"k", b"v", [])], compression=impl.ZSTD)
    assert [impl.produce_records_error(zstd, v) for v in (3, 6, 7, 11)] == [76, 76, 0, 0]


@pytest.mark.parametrize("impl", IMPLS)
def test_produce_mode_answers_in_kafkas_order(impl):
    """Request checks, then the first batch's base offset, then its size, then the batch
    checks: each refusal comes from the first rule broken."""
    big = len(BASE) - 1
    for data, want in _REQUEST_CASES:
        if want:
            assert _produce_outcome(impl, data, produce_version=11, max_message_bytes=big) == \
                ("refused", want, None, None)
    # a second batch outranks a bad base offset; a bad base offset outranks the size
    moved = _with_base_offset(BASE, 5)
    assert _produce_outcome(impl, moved + BASE, produce_version=11) == ("refused", 87, None, None)
    assert _produce_outcome(impl, moved, produce_version=11, max_message_bytes=big) == ("refused", 87, 5, None)
    assert _produce_outcome(impl, BASE, produce_version=11, max_message_bytes=big) == \
        ("refused", 10, None, len(BASE))
    assert _produce_outcome(impl, BASE, produce_version=11, max_message_bytes=len(BASE)) == ("ok", 1)
    # the size outranks a bad CRC; the batch checks run once the request's pass
    bad_crc = BASE[:-1] + bytes([BASE[-1] ^ 1])
    assert _produce_outcome(impl, bad_crc, produce_version=11, max_message_bytes=big) == \
        ("refused", 10, None, len(BASE))
    assert _produce_outcome(impl, bad_crc, produce_version=11) is CorruptRecordError
    assert _produce_outcome(impl, BASE + b"\0" * 11, produce_version=11) is CorruptRecordError
    assert _produce_outcome(impl, None, produce_version=3) == ("refused", 87, None, None)
    # without produce_version nothing of this is checked
    assert _produce_outcome(impl, moved, max_message_bytes=big) == ("ok", 1)


def test_produce_mode_twins_agree_on_cuts_and_bit_flips():
    raw = BASE + BASE[:20]
    datas = [raw[:n] for n in range(len(raw) + 1)]
    for i in range(0, len(BASE) * 8, 3):
        b = bytearray(BASE)
        b[i // 8] ^= 1 << (i % 8)
        datas.append(bytes(b))
    for data in datas:
        for kw in ({"produce_version": 11}, {"produce_version": 5, "max_message_bytes": 80}):
            outs = [_produce_outcome(impl, data, **kw) for impl in (c_records, ref_records) if impl is not None]
            assert all(o == outs[0] for o in outs), (data.hex(), kw, outs)

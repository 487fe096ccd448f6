"""Kafka varints (ByteUtils): golden vectors, boundaries, bad input, twins.

Every test body runs on the compiled kernel (which is built on the inline
readers/writers of varint.pxd that the record kernels cimport) and on the
pure-Python twin.
"""
from __future__ import annotations

import importlib
import json
import os
import pathlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kbroker._core.errors import CorruptRecordError

DATA = json.loads((pathlib.Path(__file__).parent / "data" / "test-vectors.json").read_text())
REF = importlib.import_module("kbroker._core.ref.varint")
try:
    CY = importlib.import_module("kbroker._core.varint")
except ImportError:
    if os.environ.get("KBROKER_REQUIRE_EXTENSIONS") == "1":
        raise
    CY = None
needs_cy = pytest.mark.skipif(CY is None, reason="kbroker._core.varint is not compiled")
IMPLS = [pytest.param(CY, id="cython", marks=needs_cy), pytest.param(REF, id="python")]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT32_MAX = (1 << 32) - 1

ZIGZAG = [pytest.param(v["value"], bytes.fromhex(v["encodedHex"]), id=str(v["value"]))
          for v in DATA["varint_zigzag"]]


@pytest.mark.parametrize("value,encoded", ZIGZAG)
@pytest.mark.parametrize("mod", IMPLS)
def test_golden_zigzag_vectors(mod, value, encoded):
    assert mod.encode_varlong(value) == encoded
    assert mod.decode_varlong(encoded) == (value, len(encoded))
    assert mod.size_of_varlong(value) == len(encoded)
    if INT32_MIN <= value <= INT32_MAX:
        assert mod.encode_varint(value) == encoded
        assert mod.decode_varint(encoded) == (value, len(encoded))
        assert mod.size_of_varint(value) == len(encoded)
    else:
        with pytest.raises(ValueError):
            mod.encode_varint(value)


@pytest.mark.parametrize("mod", IMPLS)
def test_known_encodings(mod):
    # zigzag int32 extremes: 0xFFFFFFFE / 0xFFFFFFFF as 5 bytes
    assert mod.encode_varint(INT32_MAX) == bytes.fromhex("feffffff0f")
    assert mod.encode_varint(INT32_MIN) == bytes.fromhex("ffffffff0f")
    assert mod.encode_varlong(INT64_MAX) == bytes.fromhex("feffffffffffffffff01")
    assert mod.encode_varlong(INT64_MIN) == bytes.fromhex("ffffffffffffffffff01")
    # unsigned (compact lengths): 300 -> ac 02, no zigzag
    assert mod.encode_unsigned_varint(0) == b"\x00"
    assert mod.encode_unsigned_varint(1) == b"\x01"
    assert mod.encode_unsigned_varint(300) == b"\xac\x02"
    assert mod.encode_unsigned_varint(UINT32_MAX) == bytes.fromhex("ffffffff0f")
    assert mod.decode_unsigned_varint(b"\xac\x02") == (300, 2)


BOUNDARY_32 = [0, 1, -1, 63, -64, 64, -65, 8191, -8192, 8192, 1 << 20, -(1 << 20),
               INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1]
BOUNDARY_64 = BOUNDARY_32 + [1 << 31, -(1 << 31) - 1, 1 << 62, -(1 << 62), INT64_MAX, INT64_MIN,
                             INT64_MAX - 1, INT64_MIN + 1]
BOUNDARY_U32 = [0, 1, 127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21, (1 << 28) - 1, 1 << 28,
                INT32_MAX, 1 << 31, UINT32_MAX]


@pytest.mark.parametrize("mod", IMPLS)
def test_boundary_round_trips(mod):
    for v in BOUNDARY_32:
        enc = mod.encode_varint(v)
        assert len(enc) == mod.size_of_varint(v) <= 5
        assert mod.decode_varint(enc) == (v, len(enc))
    for v in BOUNDARY_64:
        enc = mod.encode_varlong(v)
        assert len(enc) == mod.size_of_varlong(v) <= 10
        assert mod.decode_varlong(enc) == (v, len(enc))
    for v in BOUNDARY_U32:
        enc = mod.encode_unsigned_varint(v)
        assert len(enc) == mod.size_of_unsigned_varint(v) <= 5
        assert mod.decode_unsigned_varint(enc) == (v, len(enc))


@pytest.mark.parametrize("mod", IMPLS)
def test_out_of_range_values_raise_value_error(mod):
    for bad in (INT32_MAX + 1, INT32_MIN - 1, 1 << 40):
        with pytest.raises(ValueError):
            mod.encode_varint(bad)
        with pytest.raises(ValueError):
            mod.size_of_varint(bad)
    for bad in (INT64_MAX + 1, INT64_MIN - 1, 1 << 100):
        with pytest.raises(ValueError):
            mod.encode_varlong(bad)
        with pytest.raises(ValueError):
            mod.size_of_varlong(bad)
    for bad in (-1, UINT32_MAX + 1):
        with pytest.raises(ValueError):
            mod.encode_unsigned_varint(bad)
        with pytest.raises(ValueError):
            mod.size_of_unsigned_varint(bad)
    for f in (mod.encode_varint, mod.encode_varlong, mod.encode_unsigned_varint):
        with pytest.raises(TypeError):
            f(1.0)
        with pytest.raises(TypeError):
            f("1")


DECODERS = [("decode_varint", 5), ("decode_varlong", 10), ("decode_unsigned_varint", 5)]


@pytest.mark.parametrize("name,max_bytes", DECODERS)
@pytest.mark.parametrize("mod", IMPLS)
def test_truncated_input_raises_corrupt_record(mod, name, max_bytes):
    decode = getattr(mod, name)
    encode = {"decode_varint": mod.encode_varint, "decode_varlong": mod.encode_varlong,
              "decode_unsigned_varint": mod.encode_unsigned_varint}[name]
    biggest = {"decode_varint": INT32_MIN, "decode_varlong": INT64_MIN,
               "decode_unsigned_varint": UINT32_MAX}[name]
    full = encode(biggest)
    assert len(full) == max_bytes
    for cut in range(len(full)):  # every proper prefix, including empty
        with pytest.raises(CorruptRecordError, match="truncated"):
            decode(full[:cut])
        with pytest.raises(CorruptRecordError, match="truncated"):
            decode(b"\x00" * 3 + full[:cut], 3)  # prefix at the end of a larger buffer
    with pytest.raises(CorruptRecordError):
        decode(b"\x01\x02", 2)  # pos == len
    with pytest.raises(CorruptRecordError):
        decode(b"\x01\x02", 7)  # pos > len


@pytest.mark.parametrize("name,max_bytes", DECODERS)
@pytest.mark.parametrize("mod", IMPLS)
def test_over_long_input_raises_corrupt_record(mod, name, max_bytes):
    decode = getattr(mod, name)
    # continuation bit still set on the last allowed byte, followed by a terminator
    with pytest.raises(CorruptRecordError, match="longer than"):
        decode(b"\x80" * max_bytes + b"\x00")
    with pytest.raises(CorruptRecordError, match="longer than"):
        decode(b"\xff" * (max_bytes + 5))
    # max_bytes - 1 continuation bytes + terminator is fine (zero-padded encoding of 0)
    assert decode(b"\x80" * (max_bytes - 1) + b"\x00")[0] == 0


@pytest.mark.parametrize("mod", IMPLS)
def test_high_bits_of_last_byte_are_dropped_like_java(mod):
    # Java's ByteUtils shifts the 5th byte by 28 (10th by 63) into an int (long):
    # bits that do not fit are lost, not rejected.
    assert mod.decode_unsigned_varint(b"\xff\xff\xff\xff\x7f") == (UINT32_MAX, 5)
    assert mod.decode_varint(b"\xfe\xff\xff\xff\x7f") == (INT32_MAX, 5)
    assert mod.decode_varlong(b"\xfe" + b"\xff" * 8 + b"\x7f") == (INT64_MAX, 10)


@pytest.mark.parametrize("mod", IMPLS)
def test_decoding_at_positions_in_buffer_types(mod):
    values = [0, -1, 300, INT32_MIN, INT32_MAX, 5, -8193]
    blob = b"\xaa\xbb" + b"".join(mod.encode_varint(v) for v in values)
    for buf in (blob, bytearray(blob), memoryview(blob), memoryview(b"zz" + blob)[2:]):
        pos = 2
        out = []
        for _ in values:
            v, pos = mod.decode_varint(buf, pos)
            out.append(v)
        assert out == values and pos == len(blob)
    with pytest.raises(ValueError):
        mod.decode_varint(blob, -1)
    with pytest.raises(TypeError):
        mod.decode_varint("not bytes")
    with pytest.raises(TypeError):
        mod.decode_varint(memoryview(blob)[::2])


@needs_cy
@settings(max_examples=300, deadline=None)
@given(st.integers(INT32_MIN, INT32_MAX))
def test_twins_agree_varint(v):
    enc = CY.encode_varint(v)
    assert enc == REF.encode_varint(v)
    assert CY.size_of_varint(v) == REF.size_of_varint(v) == len(enc)
    assert CY.decode_varint(enc) == REF.decode_varint(enc) == (v, len(enc))


@needs_cy
@settings(max_examples=300, deadline=None)
@given(st.integers(INT64_MIN, INT64_MAX))
@example(INT64_MIN)
@example(INT64_MAX)
def test_twins_agree_varlong(v):
    enc = CY.encode_varlong(v)
    assert enc == REF.encode_varlong(v)
    assert CY.size_of_varlong(v) == REF.size_of_varlong(v) == len(enc)
    assert CY.decode_varlong(enc) == REF.decode_varlong(enc) == (v, len(enc))


@needs_cy
@settings(max_examples=300, deadline=None)
@given(st.integers(0, UINT32_MAX))
def test_twins_agree_unsigned_varint(v):
    enc = CY.encode_unsigned_varint(v)
    assert enc == REF.encode_unsigned_varint(v)
    assert CY.size_of_unsigned_varint(v) == REF.size_of_unsigned_varint(v) == len(enc)
    assert CY.decode_unsigned_varint(enc) == REF.decode_unsigned_varint(enc) == (v, len(enc))


def _outcome(f, *args):
    try:
        return ("ok", f(*args))
    except CorruptRecordError as exc:
        return ("corrupt", str(exc))


@needs_cy
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=14), st.integers(0, 15))
@example(b"\x80\x80\x80\x80\x80", 0)
@example(b"\xff" * 11, 1)
def test_twins_agree_on_arbitrary_bytes(data, pos):
    """Random bytes: both decode the same value or both raise CorruptRecordError
    (with the same message); nothing else escapes."""
    for name, _ in DECODERS:
        assert _outcome(getattr(CY, name), data, pos) == _outcome(getattr(REF, name), data, pos)

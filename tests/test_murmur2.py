"""Kafka's murmur2 and default partition choice: golden vectors, bulk forms, twins."""
from __future__ import annotations

import importlib
import json
import os
import pathlib

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

DATA = json.loads((pathlib.Path(__file__).parent / "data" / "test-vectors.json").read_text())
REF = importlib.import_module("kbroker._core.ref.murmur2")
try:
    CY = importlib.import_module("kbroker._core.murmur2")
except ImportError:
    if os.environ.get("KBROKER_REQUIRE_EXTENSIONS") == "1":
        raise
    CY = None
needs_cy = pytest.mark.skipif(CY is None, reason="kbroker._core.murmur2 is not compiled")
IMPLS = [pytest.param(CY, id="cython", marks=needs_cy), pytest.param(REF, id="python")]

MURMUR = [pytest.param(v, id=f"{i}-{v.get('inputUtf8', v['inputHex'])[:16]}")
          for i, v in enumerate(DATA["murmur2"])]
PARTITION = [pytest.param(v, id=f"{v['keyHex'] or 'empty'}-{v['numPartitions']}")
             for v in DATA["partitioner"]]


@pytest.mark.parametrize("vec", MURMUR)
@pytest.mark.parametrize("mod", IMPLS)
def test_golden_murmur2(mod, vec):
    key = bytes.fromhex(vec["inputHex"])
    h = mod.murmur2(key)
    assert h == vec["murmur2"]
    assert h & 0xFFFFFFFF == vec["murmur2Unsigned"]
    assert h & 0x7FFFFFFF == vec["toPositive"]
    assert mod.partition_for_key(key, 0x7FFFFFFF) == vec["toPositive"] % 0x7FFFFFFF


@pytest.mark.parametrize("vec", PARTITION)
@pytest.mark.parametrize("mod", IMPLS)
def test_golden_partitioner(mod, vec):
    key = bytes.fromhex(vec["keyHex"])
    assert mod.partition_for_key(key, vec["numPartitions"]) == vec["expectedPartition"]
    out = mod.partitions_for_keys([key], vec["numPartitions"])
    assert out.dtype == numpy.int32 and out.tolist() == [vec["expectedPartition"]]


@pytest.mark.parametrize("mod", IMPLS)
def test_bulk_matches_scalar(mod):
    keys = [bytes.fromhex(v["inputHex"]) for v in DATA["murmur2"]]
    hashes = mod.murmur2_bulk(keys)
    assert isinstance(hashes, numpy.ndarray) and hashes.dtype == numpy.int32
    assert hashes.shape == (len(keys),)
    assert hashes.tolist() == [v["murmur2"] for v in DATA["murmur2"]]
    for n in (1, 3, 1000, 0x7FFFFFFF):
        parts = mod.partitions_for_keys(keys, n)
        assert parts.dtype == numpy.int32
        assert parts.tolist() == [mod.partition_for_key(k, n) for k in keys]
    # any iterable of bytes-like keys
    assert mod.murmur2_bulk(tuple(keys)).tolist() == hashes.tolist()
    assert mod.murmur2_bulk(iter(keys)).tolist() == hashes.tolist()
    assert mod.murmur2_bulk([bytearray(k) for k in keys]).tolist() == hashes.tolist()
    assert mod.murmur2_bulk([memoryview(b"..." + k)[3:] for k in keys]).tolist() == hashes.tolist()
    empty = mod.murmur2_bulk([])
    assert empty.dtype == numpy.int32 and empty.shape == (0,)
    assert mod.partitions_for_keys([], 5).shape == (0,)


@pytest.mark.parametrize("mod", IMPLS)
def test_buffer_types(mod):
    key = b"a-little-bit-long-string"
    expected = mod.murmur2(key)
    for buf in (bytearray(key), memoryview(key), memoryview(b"xx" + key + b"yy")[2:-2],
                numpy.frombuffer(key, dtype=numpy.uint8)):
        assert mod.murmur2(buf) == expected
        assert mod.partition_for_key(buf, 7) == (expected & 0x7FFFFFFF) % 7


@pytest.mark.parametrize("mod", IMPLS)
def test_bad_arguments(mod):
    for bad in (0, -1, 1 << 31):
        with pytest.raises(ValueError):
            mod.partition_for_key(b"k", bad)
        with pytest.raises(ValueError):
            mod.partitions_for_keys([b"k"], bad)
    with pytest.raises(TypeError):
        mod.partition_for_key(b"k", 2.0)
    for key in (None, "text", 5):
        with pytest.raises(TypeError):
            mod.murmur2(key)
        with pytest.raises(TypeError):
            mod.murmur2_bulk([b"ok", key])
    with pytest.raises(TypeError):
        mod.murmur2(memoryview(b"abcdef")[::2])


@needs_cy
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(1, 0x7FFFFFFF))
def test_twins_agree(key, n):
    h = CY.murmur2(key)
    assert h == REF.murmur2(key)
    assert -(1 << 31) <= h < (1 << 31)
    assert CY.partition_for_key(key, n) == REF.partition_for_key(key, n) == (h & 0x7FFFFFFF) % n


@needs_cy
@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=50), st.integers(1, 10_000))
def test_twins_agree_bulk(keys, n):
    assert CY.murmur2_bulk(keys).tolist() == REF.murmur2_bulk(keys).tolist()
    assert CY.partitions_for_keys(keys, n).tolist() == REF.partitions_for_keys(keys, n).tolist()

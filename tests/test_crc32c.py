"""CRC-32C kernel: golden vectors, buffer types, continuation, twins, reference package.

Every test body runs on the compiled kernel and on its pure-Python twin.
The PyPI ``crc32c`` package is the independent reference.
"""
from __future__ import annotations

import array
import importlib
import json
import mmap
import os
import pathlib
import subprocess
import sys
import threading

import numpy
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

DATA = json.loads((pathlib.Path(__file__).parent / "data" / "test-vectors.json").read_text())
REF = importlib.import_module("kbroker._core.ref.crc32c")
try:
    CY = importlib.import_module("kbroker._core.crc32c")
except ImportError:
    if os.environ.get("KBROKER_REQUIRE_EXTENSIONS") == "1":
        raise
    CY = None
needs_cy = pytest.mark.skipif(CY is None, reason="kbroker._core.crc32c is not compiled")

IMPLS = [pytest.param(CY, id="cython", marks=needs_cy), pytest.param(REF, id="python")]
# crc32c() and crc32c_sw() of both twins
FUNCS = [
    pytest.param("cython-dispatch", id="cython", marks=needs_cy),
    pytest.param("cython-sw", id="cython_sw", marks=needs_cy),
    pytest.param("python", id="python"),
]


def _func(which):
    return {"cython-dispatch": lambda: CY.crc32c, "cython-sw": lambda: CY.crc32c_sw,
            "python": lambda: REF.crc32c}[which]()


def _vector_input(vec) -> bytes:
    data = bytes.fromhex(vec["inputHex"]) if "inputHex" in vec else vec["inputAscii"].encode("ascii")
    assert len(data) == vec["inputLength"]
    return data


CRC_VECTORS = [pytest.param(v, id=v.get("name") or v["crc32cHex"]) for v in DATA["crc32c"]]


@pytest.mark.parametrize("vec", CRC_VECTORS)
@pytest.mark.parametrize("which", FUNCS)
def test_golden_vectors(which, vec):
    f = _func(which)
    data = _vector_input(vec)
    assert f(data) == vec["crc32c"] == int(vec["crc32cHex"], 16)


@pytest.mark.parametrize("vec", CRC_VECTORS)
@pytest.mark.parametrize("which", FUNCS)
def test_golden_vectors_continued_at_every_split(which, vec):
    f = _func(which)
    data = _vector_input(vec)
    step = max(1, len(data) // 40)  # the 843-byte vector: ~40 split points
    for cut in range(0, len(data) + 1, step):
        assert f(data[cut:], f(data[:cut])) == vec["crc32c"], cut


def test_recordbatch_crc_covers_attributes_to_end():
    """Kafka's RecordBatch v2 CRC field equals CRC-32C of bytes 21..end."""
    batches = DATA["recordBatchV2"]
    checked = 0
    for batch in batches:
        raw = bytes.fromhex(batch["hex"])
        if not batch["decoded"].get("crcValid"):
            continue
        for mod in [m for m in (CY, REF) if m is not None]:
            assert mod.crc32c(raw[21:]) == batch["decoded"]["crc"] == int.from_bytes(raw[17:21], "big")
        checked += 1
    assert checked > 0


def _buffer_variants(payload: bytes, tmp_path):
    """(name, buffer) pairs all holding `payload` bytes; views are released
    when the generator moves on, so the mmaps can close."""
    yield "bytes", payload
    yield "bytearray", bytearray(payload)
    yield "memoryview", memoryview(payload)
    padded = b"xyz" + payload + b"tail"
    yield "memoryview-slice", memoryview(padded)[3:3 + len(payload)]
    yield "memoryview-of-bytearray-slice", memoryview(bytearray(padded))[3:3 + len(payload)]
    if len(payload) % 4 == 0 and payload:
        yield "array-i", array.array("i", payload)  # 4-byte items: still raw bytes
    path = tmp_path / "data.bin"
    path.write_bytes(b"0123456" + payload + b"!")
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mm:
        yield "mmap-slice", mm[7:7 + len(payload)]  # a bytes copy of the slice
        with memoryview(mm) as view, view[7:7 + len(payload)] as part:
            yield "memoryview-of-mmap", part
    if payload:
        with open(path, "wb") as fh:
            fh.write(payload)
        with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield "mmap", mm


@pytest.mark.parametrize("size", [0, 1, 7, 8, 100, 1000, 5000, 70_000])
@pytest.mark.parametrize("mod", IMPLS)
def test_buffer_types(mod, size, tmp_path):
    payload = os.urandom(size)
    expected = mod.crc32c(payload)
    assert expected == REF.crc32c(payload)
    for name, buf in _buffer_variants(payload, tmp_path):
        assert mod.crc32c(buf) == expected, name
        assert mod.crc32c_sw(buf, 0xDEADBEEF) == mod.crc32c(payload, 0xDEADBEEF), name


@pytest.mark.parametrize("mod", IMPLS)
def test_rejects_non_buffers_and_non_contiguous(mod):
    with pytest.raises(TypeError):
        mod.crc32c("text is not bytes")
    with pytest.raises(TypeError):
        mod.crc32c(None)
    with pytest.raises(TypeError):
        mod.crc32c(memoryview(b"abcdefgh")[::2])
    with pytest.raises(TypeError):
        mod.crc32c(numpy.zeros((4, 4), dtype=numpy.uint8, order="F"))


@pytest.mark.parametrize("mod", IMPLS)
def test_numpy_arrays_are_read_as_raw_bytes(mod):
    arr = numpy.arange(64, dtype=numpy.int64).reshape(8, 8)
    assert mod.crc32c(arr) == mod.crc32c(arr.tobytes())


@pytest.mark.parametrize("mod", IMPLS)
def test_value_range(mod):
    assert mod.crc32c(b"", 0xFFFFFFFF) == 0xFFFFFFFF  # empty input: value passes through
    assert mod.crc32c(b"", 12345) == 12345
    for bad in (-1, 1 << 32):
        with pytest.raises(OverflowError):
            mod.crc32c(b"abc", bad)
    with pytest.raises(TypeError):
        mod.crc32c(b"abc", 1.0)


@needs_cy
@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 31, 1023, 1024, 1025, 2047, 4095, 4096, 4097,
                                  8191, 8192, 32767, 32768, 32769, 65535, 65536, 98_304 + 1029])
def test_hardware_and_software_agree_around_block_sizes(size):
    """The SSE4.2 path switches strategy at 8 bytes, 4x256 B and 4x8 KiB; check
    every boundary at every alignment against the table path."""
    raw = os.urandom(size + 8)
    for offset in range(8):
        view = memoryview(raw)[offset:offset + size]
        assert CY.crc32c(view) == CY.crc32c_sw(view), offset
        assert CY.crc32c(view, 0x12345678) == CY.crc32c_sw(view, 0x12345678), offset


@needs_cy
def test_hardware_path_is_selected_when_cpu_supports_it():
    """Guard against a silent fallback to the slow table path."""
    try:
        cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    has_sse42 = any(line.startswith("flags") and " sse4_2" in line for line in cpuinfo.splitlines())
    forced_sw = os.environ.get("KBROKER_CRC32C_SOFTWARE") == "1"
    assert CY.HARDWARE is (has_sse42 and not forced_sw)
    assert REF.HARDWARE is False


@needs_cy
def test_env_forces_software_path():
    code = (
        "import kbroker._core.crc32c as m;"
        "assert m.HARDWARE is False, m.HARDWARE;"
        "assert m.crc32c(b'123456789') == 0xE3069283;"
        "assert m.crc32c(bytes(range(256)) * 200) == m.crc32c_sw(bytes(range(256)) * 200)"
    )
    env = dict(os.environ, KBROKER_CRC32C_SOFTWARE="1")
    root = pathlib.Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root, timeout=60)


@needs_cy
def test_large_buffers_in_threads():
    """Above NOGIL_THRESHOLD the GIL is released; results must not mix up."""
    bufs = [os.urandom(CY.NOGIL_THRESHOLD * 4 + i) for i in range(4)]
    expected = [CY.crc32c_sw(b) for b in bufs]
    results: dict[int, list[int]] = {}

    def work(i):
        results[i] = [CY.crc32c(bytearray(bufs[i])) for _ in range(20)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    for i in range(4):
        assert results[i] == [expected[i]] * 20


@needs_cy
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 0xFFFFFFFF))
@example(b"", 0)
@example(b"\x00" * 1024, 0xFFFFFFFF)
def test_twins_agree(data, value):
    assert CY.crc32c(data, value) == CY.crc32c_sw(data, value) == REF.crc32c(data, value)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000), st.integers(0, 0xFFFFFFFF))
def test_twin_matches_reference_package(data, value):
    import crc32c as ref
    assert REF.crc32c(data, value) == ref.crc32c(data, value)


@needs_cy
@settings(max_examples=100, deadline=None)
@given(st.integers(0, 200_000), st.integers(0, 7), st.integers(0, 0xFFFFFFFF), st.randoms(use_true_random=False))
def test_matches_reference_package_on_large_buffers(size, offset, value, rnd):
    import crc32c as ref
    raw = rnd.randbytes(size + offset)
    view = memoryview(raw)[offset:]
    assert CY.crc32c(view, value) == ref.crc32c(view, value)
    assert CY.crc32c(bytearray(view), value) == ref.crc32c(bytes(view), value)


@pytest.mark.parametrize("mod", IMPLS)
@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=1500), cuts=st.lists(st.integers(0, 1500), max_size=4))
def test_incremental_continuation(mod, data, cuts):
    import crc32c as ref
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    crc = 0
    for start, end in zip(points, points[1:]):
        crc = mod.crc32c(memoryview(data)[start:end], crc)
    assert crc == mod.crc32c(data) == ref.crc32c(data)


_PROBE_PYX = """
# cython: language_level=3
from libc.stdint cimport int32_t
from kbroker._core.crc32c cimport crc32c_update
from kbroker._core.varint cimport read_varint, write_varint

def crc(bytes data, unsigned int value=0):
    cdef const unsigned char* p = <const unsigned char*><char*>data
    cdef size_t n = <size_t>len(data)
    cdef unsigned int out
    with nogil:
        out = crc32c_update(value, p, n)
    return out

def varint_round_trip(int32_t v):
    cdef unsigned char buf[5]
    cdef int32_t out = 0
    cdef int n = write_varint(buf, v)
    return read_varint(buf, 0, n, &out), out
"""


@needs_cy
@pytest.mark.slow
def test_cimport_from_another_extension(tmp_path):
    """Build a throwaway extension that cimports crc32c_update (and the varint.pxd
    helpers) the way the record kernels do, and check it against crc32c()."""
    import Cython  # noqa: F401
    root = pathlib.Path(__file__).resolve().parent.parent
    (tmp_path / "kb_probe.pyx").write_text(_PROBE_PYX)
    build = (
        "from setuptools import setup, Extension\n"
        "from Cython.Build import cythonize\n"
        f"setup(ext_modules=cythonize([Extension('kb_probe', ['kb_probe.pyx'])], include_path=[{str(root)!r}], quiet=True),"
        " script_args=['build_ext', '--inplace', '-q'])\n"
    )
    subprocess.run([sys.executable, "-c", build], cwd=tmp_path, check=True, timeout=240,
                   capture_output=True)
    check = (
        "import kb_probe, kbroker._core.crc32c as m\n"
        "data = bytes(range(256)) * 300\n"
        "assert kb_probe.crc(b'123456789') == 0xE3069283\n"
        "assert kb_probe.crc(data, 7) == m.crc32c(data, 7)\n"
        "assert kb_probe.varint_round_trip(-(2**31)) == (5, -(2**31))\n"
        "assert kb_probe.varint_round_trip(-65) == (2, -65)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]))
    subprocess.run([sys.executable, "-c", check], cwd=tmp_path, check=True, timeout=60, env=env)

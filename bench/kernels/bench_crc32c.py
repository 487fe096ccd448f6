"""CRC-32C: our kernel vs the PyPI ``crc32c`` package, side by side.

Targets: at least as fast as the package on 1 MiB; call overhead on 100 B no
worse. The package is each group's reference (ratio > 1: we are faster).
Inputs are generated once, outside the timed code.
"""
from __future__ import annotations

import random

import pytest

from kbroker._core import crc32c as ours
from kbroker._core.ref import crc32c as twin

import crc32c as pkg  # noqa: E402

_rnd = random.Random(20240601)
DATA = {
    "100B": _rnd.randbytes(100),
    "8KiB": _rnd.randbytes(8 * 1024),
    "1MiB": _rnd.randbytes(1 << 20),
}


@pytest.fixture(params=list(DATA))
def size(request):
    return request.param


def _run(benchmark, size, fn, role=None):
    data = DATA[size]
    benchmark.group = f"crc32c-{size}"
    if role:
        benchmark.extra_info["role"] = role
    result = benchmark(fn, data)
    assert result == pkg.crc32c(data)


def test_crc32c_package(benchmark, size):
    _run(benchmark, size, pkg.crc32c, role="reference")


def test_ours_dispatch(benchmark, size):
    benchmark.extra_info["hardware"] = ours.HARDWARE
    _run(benchmark, size, ours.crc32c)


def test_ours_software(benchmark, size):
    _run(benchmark, size, ours.crc32c_sw)


def test_ours_continued_value(benchmark, size):
    """The incremental form crc32c(data, value) as the record writer uses it."""
    data = DATA[size]
    benchmark.group = f"crc32c-{size}"
    prev = pkg.crc32c(b"prefix")
    assert benchmark(ours.crc32c, data, prev) == pkg.crc32c(b"prefix" + data)


def test_python_twin_100B(benchmark):
    _run(benchmark, "100B", twin.crc32c)

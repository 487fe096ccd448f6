"""Storage-engine throughput: appends, recovery scan, clean start.

    python -m pytest bench/kernels/bench_log.py --benchmark-only

References in the same run: a bare ``os.pwrite`` loop of the same buffers
(the ceiling for appends to the page cache) and the pure-Python twin for
the recovery scan.
"""
import mmap
import os
import shutil
import time

import pytest

import kbroker._core.log_scan as c_scan
import kbroker._core.ref.log_scan as r_scan
from kbroker.kernels import records
from kbroker.log import Log, LogConfig, LogManager


def _batch(size):
    """One v2 batch of about ``size`` bytes (4 records)."""
    per = max(1, (size - 61) // 4 - 10)
    return bytearray(records.encode_batch([(1_700_000_000_000, None, b"x" * per, [])] * 4))


def _append_run(dir, buf, n):
    shutil.rmtree(dir, ignore_errors=True)
    lg = Log.open(os.path.join(dir, "bench-0"), LogConfig(), had_clean_shutdown=True)
    append = lg.append
    t0 = time.perf_counter()
    for _ in range(n):
        append(buf)
    dt = time.perf_counter() - t0
    lg.close()
    return dt


def _pwrite_run(dir, buf, n):
    shutil.rmtree(dir, ignore_errors=True)
    os.makedirs(dir)
    fd = os.open(os.path.join(dir, "raw"), os.O_RDWR | os.O_CREAT)
    pos = 0
    t0 = time.perf_counter()
    for _ in range(n):
        pos += os.pwrite(fd, buf, pos)
    dt = time.perf_counter() - t0
    os.close(fd)
    return dt


@pytest.mark.parametrize("size,n", [(16 * 1024, 8000), (1024, 100_000)], ids=["16KiB", "1KiB"])
@pytest.mark.parametrize("kind", ["log_append", "raw_pwrite"])
def test_append(benchmark, tmp_path, size, n, kind):
    benchmark.group = f"append-{size}"
    buf = _batch(size)
    fn = _append_run if kind == "log_append" else _pwrite_run
    d = str(tmp_path / "a")
    dt = benchmark.pedantic(fn, args=(d, buf, n), rounds=3, iterations=1)
    best = benchmark.stats.stats.min
    benchmark.extra_info.update(batches_per_s=n / best, mb_per_s=n * len(buf) / best / 1e6,
                                batch_bytes=len(buf))
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def log_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("scan")
    p = d / "00000000000000000000.log"
    one = bytes(_batch(16 * 1024))
    n = (128 * 1024 * 1024) // len(one)
    buf = bytearray()
    for i in range(n):
        b = bytearray(one)
        b[0:8] = (i * 4).to_bytes(8, "big")
        buf += b
    p.write_bytes(buf)
    yield str(p), len(buf)


def _scan(mod, path, size, limit=None):
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as m:
            r = mod.scan(m, 0, 4096, True, 0, limit or size)
            assert r.error is None
            return r
    finally:
        os.close(fd)


@pytest.mark.benchmark(group="recovery-scan")
def test_scan_cython(benchmark, log_file):
    path, size = log_file
    benchmark.pedantic(_scan, args=(c_scan, path, size), rounds=5, iterations=1)
    benchmark.extra_info["mb_per_s"] = size / benchmark.stats.stats.min / 1e6


@pytest.mark.benchmark(group="recovery-scan")
def test_scan_python_twin(benchmark, log_file):
    path, size = log_file
    limit = 40 * len(_batch(16 * 1024))   # the twin's CRC is pure Python: scan 40 batches only
    benchmark.pedantic(_scan, args=(r_scan, path, size, limit), rounds=2, iterations=1)
    benchmark.extra_info["mb_per_s"] = limit / benchmark.stats.stats.min / 1e6


@pytest.fixture(scope="module")
def thousand(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("k1000") / "d")
    lm = LogManager([d], LogConfig(), background=False)
    lm.startup()
    b = _batch(1024)
    for p in range(1000):
        lm.get_or_create_log(("bench", p)).append(b)
    lm.shutdown()
    return d


def _clean_start(d):
    lm = LogManager([d], LogConfig(), background=False)
    lm.startup()
    assert len(lm.logs) == 1000
    lm.shutdown()   # writes the marker again for the next round


@pytest.mark.benchmark(group="clean-start")
def test_clean_start_1000_partitions(benchmark, thousand):
    benchmark.pedantic(_clean_start, args=(thousand,), rounds=3, iterations=1)

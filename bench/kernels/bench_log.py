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


class _AppendTarget:
    """One fresh destination per round, opened in the round's setup and closed in the
    next one, so a round times the append loop alone (not open, close or the rmtree
    of the previous round's files: closing a file with 100+ MB of dirty pages alone
    can take longer than the appends)."""

    def __init__(self, kind, dir, buf, n):
        self.kind, self.dir, self.buf, self.n = kind, dir, buf, n
        # validated once, as ReplicaManager does per request before Log.append
        self.infos = records.validate_batches(buf)
        self.handle = None
        self.times = []

    def _close(self):
        if self.handle is not None:
            if self.kind == "log_append":
                self.handle.close()
            else:
                os.close(self.handle)
            self.handle = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def setup(self):
        self._close()
        if self.kind == "log_append":
            self.handle = Log.open(os.path.join(self.dir, "bench-0"), LogConfig(), had_clean_shutdown=True)
        else:
            os.makedirs(self.dir)
            self.handle = os.open(os.path.join(self.dir, "raw"), os.O_RDWR | os.O_CREAT)
        return (), {}

    def run(self):
        buf, n = self.buf, self.n
        t0 = time.perf_counter()
        if self.kind == "log_append":
            append, infos = self.handle.append, self.infos
            for _ in range(n):
                append(buf, infos)
        else:
            fd, pos = self.handle, 0
            for _ in range(n):
                pos += os.pwrite(fd, buf, pos)
        self.times.append(time.perf_counter() - t0)


@pytest.mark.parametrize("size,n", [(16 * 1024, 8000), (1024, 100_000)], ids=["16KiB", "1KiB"])
@pytest.mark.parametrize("kind", ["log_append", "raw_pwrite"])
def test_append(benchmark, tmp_path, size, n, kind):
    """Appends of one validated batch as the broker makes them (``Log.append(buf, infos)``:
    framing walk, offset rewrite, index entries, pwrite) against a bare ``os.pwrite`` loop
    of the same bytes, the page-cache ceiling of this machine."""
    benchmark.group = f"append-{size}"
    buf = _batch(size)
    target = _AppendTarget(kind, str(tmp_path / "a"), buf, n)
    try:
        benchmark.pedantic(target.run, setup=target.setup, rounds=5, iterations=1)
    finally:
        target._close()
    best = min(target.times)
    benchmark.extra_info.update(batches_per_s=n / best, mb_per_s=n * len(buf) / best / 1e6,
                                batch_bytes=len(buf))


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

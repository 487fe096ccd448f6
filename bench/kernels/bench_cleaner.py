"""Log cleaner kernel: build the offset map + filter the batches, compiled vs the pure-Python twin.

    python -m pytest bench/kernels/bench_cleaner.py --benchmark-only

Data: 1M keyed records (100k distinct keys, 8% tombstones) in uncompressed
batches of 100, precomputed once. One round = clear + build the map over
all batches + filter all batches (what one cleaning does to a dirty section).
The twin runs the same work on a 100k-record prefix; ratios are per record.
"""
import random

import pytest

from kbroker._core import offset_map as C
from kbroker._core import records as R
from kbroker._core.ref import offset_map as P

RECORDS = 1_000_000
TWIN_RECORDS = 100_000
PER_BATCH = 100
KEYS = 100_000


@pytest.fixture(scope="module")
def data():
    rnd = random.Random(1)
    chunks = []
    off = 0
    for _ in range(RECORDS // PER_BATCH):
        recs = [(1_700_000_000_000 + off + i, b"key-%08d" % rnd.randrange(KEYS),
                 None if rnd.random() < 0.08 else b"v" * 40, []) for i in range(PER_BATCH)]
        chunks.append(R.encode_batch(recs, base_offset=off))
        off += PER_BATCH
    full = b"".join(chunks)
    prefix = b"".join(chunks[: TWIN_RECORDS // PER_BATCH])
    return full, prefix


def _round(mod, om, buf):
    om.clear()
    full, consumed, n = om.build(buf, 0)
    assert not full and consumed == len(buf)
    out, consumed, nread, nkept = mod.filter_batches(buf, om, 0, 86_400_000)
    assert consumed == len(buf)
    return nkept


@pytest.mark.benchmark(group="cleaner-per-100k-records")
def test_twin(benchmark, data):
    benchmark.extra_info["role"] = "reference"
    om = P.OffsetMap(16 << 20)
    benchmark.pedantic(_round, args=(P, om, data[1]), rounds=3, iterations=1)


@pytest.mark.benchmark(group="cleaner-per-100k-records")
def test_cython_100k(benchmark, data):
    om = C.OffsetMap(16 << 20)
    benchmark.pedantic(_round, args=(C, om, data[1]), rounds=10, iterations=1)


@pytest.mark.benchmark(group="cleaner-1M-records")
def test_cython_1m(benchmark, data):
    om = C.OffsetMap(128 << 20)
    kept = benchmark.pedantic(_round, args=(C, om, data[0]), rounds=5, iterations=1)
    assert kept > 0

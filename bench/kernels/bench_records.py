"""Record batch kernel benchmarks: ours (Cython, and the twin) vs aiokafka's
Cython record code and kafka-python's pure Python, side by side in one run.

    python -m pytest bench/kernels/bench_records.py --benchmark-only \
        --benchmark-group-by=group --benchmark-columns=min,median,ops

Inputs are precomputed; every benchmark decodes/encodes a 1,000-record
batch with 100-byte random values (no key, no headers), or validates and
assigns offsets of a ~16 KiB batch. The ratios (ours vs the others) are
what we report; absolute numbers depend on the machine.
"""
import os
import random

import pytest

from kbroker._core.ref import records as ref_records

import kbroker._core.records as c_records  # noqa: E402
import aiokafka.record.default_records as adr  # noqa: E402
import kafka.record.default_records as kdr  # noqa: E402

rnd = random.Random(42)
N = 1000
RECORDS = [(1_700_000_000_000 + i, None, rnd.randbytes(100), []) for i in range(N)]
CODECS = {"none": 0, "lz4": 3}
BATCHES = {name: c_records.encode_batch(RECORDS, compression=codec)
           for name, codec in CODECS.items()}
# ~16 KiB uncompressed batch for the broker fast path
SMALL = c_records.encode_batch(RECORDS[:140])
assert 15_000 < len(SMALL) < 17_000


def _ours_decode(mod, raw, check_crc=True):
    return mod.decode_batch(raw, check_crc=check_crc).records


def _aio_decode(raw):
    b = adr._DefaultRecordBatchCython(raw)
    return [r for r in b]


def _kpy_decode(raw):
    b = kdr.DefaultRecordBatch(bytearray(raw))
    return [r for r in b]


def _aio_encode(codec):
    b = adr._DefaultRecordBatchBuilderCython(2, codec, 0, -1, -1, -1, 1 << 30)
    for i, (t, k, v, h) in enumerate(RECORDS):
        b.append(i, t, k, v, h)
    return b.build()


def _kpy_encode(codec):
    b = kdr.DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 30)
    for i, (t, k, v, h) in enumerate(RECORDS):
        b.append(i, t, k, v, h)
    return b.build()


def _ours_builder(mod, codec):
    b = mod.BatchBuilder(compression=codec, batch_size=1 << 30)
    for t, k, v, h in RECORDS:
        b.append(t, k, v, h)
    return b.build()


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("impl", ["kbroker-cython", "kbroker-cython-nocrc", "kbroker-python",
                                  "aiokafka-cython", "kafka-python"])
def test_decode(benchmark, impl, codec):
    benchmark.group = f"decode-1000x100B-{codec}"
    raw = BATCHES[codec]
    fn = {
        "kbroker-cython": lambda: _ours_decode(c_records, raw),
        "kbroker-cython-nocrc": lambda: _ours_decode(c_records, raw, False),
        "kbroker-python": lambda: _ours_decode(ref_records, raw),
        "aiokafka-cython": lambda: _aio_decode(raw),
        "kafka-python": lambda: _kpy_decode(raw),
    }[impl]
    assert len(fn()) == N
    benchmark(fn)


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("impl", ["kbroker-cython", "kbroker-cython-builder", "kbroker-python",
                                  "aiokafka-cython", "kafka-python"])
def test_encode(benchmark, impl, codec):
    benchmark.group = f"encode-1000x100B-{codec}"
    c = CODECS[codec]
    fn = {
        "kbroker-cython": lambda: c_records.encode_batch(RECORDS, compression=c),
        "kbroker-cython-builder": lambda: _ours_builder(c_records, c),
        "kbroker-python": lambda: ref_records.encode_batch(RECORDS, compression=c),
        "aiokafka-cython": lambda: _aio_encode(c),
        "kafka-python": lambda: _kpy_encode(c),
    }[impl]
    assert len(fn()) > 61
    benchmark(fn)


#: the produce path's record checks (ReplicaManager): a compacted topic with a one-hour
#: timestamp window, so every record is tested (the default config skips the test)
CHECKS = dict(timestamp_type=0, now_ms=1_700_000_000_000, timestamp_before_max_ms=3_600_000,
              timestamp_after_max_ms=3_600_000, compacted=True)
SMALL_KEYED = c_records.encode_batch([(t, b"key", v, h) for t, _, v, h in RECORDS[:140]])


@pytest.mark.parametrize("impl", ["kbroker-cython", "kbroker-cython-checks", "kbroker-python"])
def test_validate_assign_16k(benchmark, impl):
    mod = ref_records if impl == "kbroker-python" else c_records
    checks = CHECKS if impl == "kbroker-cython-checks" else {}
    benchmark.group = "validate+assign_offsets-16KiB"
    buf = bytearray(SMALL_KEYED if checks else SMALL)

    def run():
        infos = mod.validate_batches(buf, **checks)
        assert not infos[0].record_errors
        return mod.assign_offsets(buf, infos, 1000)

    assert run() == 1140
    benchmark(run)
    stats = benchmark.stats.stats
    benchmark.extra_info["GB/s(median)"] = round(len(buf) / stats.median / 1e9, 3)
    benchmark.extra_info["GB/s(min)"] = round(len(buf) / stats.min / 1e9, 3)

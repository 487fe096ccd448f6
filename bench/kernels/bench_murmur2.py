"""murmur2 partitioning: the Cython kernel vs its pure-Python twin.

Target: the bulk form >= 20x the twin on 100k 16-byte keys. The twin is each
group's reference (ratio > 1: the kernel is faster). Keys are generated once,
outside the timed code.
"""
from __future__ import annotations

import random

from kbroker._core import murmur2 as cy
from kbroker._core.ref import murmur2 as twin

_rnd = random.Random(20240601)
KEYS_100K = [_rnd.randbytes(16) for _ in range(100_000)]
KEY = _rnd.randbytes(16)
NUM_PARTITIONS = 12
EXPECTED = twin.partitions_for_keys(KEYS_100K, NUM_PARTITIONS)


def test_bulk_partitions_twin(benchmark):
    benchmark.group = "murmur2-partitions_for_keys-100k-16B"
    benchmark.extra_info["role"] = "reference"
    out = benchmark.pedantic(twin.partitions_for_keys, (KEYS_100K, NUM_PARTITIONS),
                             rounds=3, iterations=1, warmup_rounds=0)
    assert (out == EXPECTED).all()


def test_bulk_partitions_cython(benchmark):
    benchmark.group = "murmur2-partitions_for_keys-100k-16B"
    out = benchmark(cy.partitions_for_keys, KEYS_100K, NUM_PARTITIONS)
    assert (out == EXPECTED).all()


def test_bulk_hash_twin(benchmark):
    benchmark.group = "murmur2-murmur2_bulk-100k-16B"
    benchmark.extra_info["role"] = "reference"
    benchmark.pedantic(twin.murmur2_bulk, (KEYS_100K,), rounds=3, iterations=1, warmup_rounds=0)


def test_bulk_hash_cython(benchmark):
    benchmark.group = "murmur2-murmur2_bulk-100k-16B"
    out = benchmark(cy.murmur2_bulk, KEYS_100K)
    assert out[0] == twin.murmur2(KEYS_100K[0])


def test_scalar_twin(benchmark):
    benchmark.group = "murmur2-partition_for_key-16B"
    benchmark.extra_info["role"] = "reference"
    benchmark(twin.partition_for_key, KEY, NUM_PARTITIONS)


def test_scalar_cython(benchmark):
    benchmark.group = "murmur2-partition_for_key-16B"
    assert benchmark(cy.partition_for_key, KEY, NUM_PARTITIONS) == twin.partition_for_key(KEY, NUM_PARTITIONS)

"""Offset/time index lookups on a full 10 MiB index: compiled kernel vs the pure-Python twin.

    python -m pytest bench/kernels/bench_index.py --benchmark-only
"""
import random

import pytest

import kbroker._core.offset_index as c_oi
import kbroker._core.ref.offset_index as r_oi
import kbroker._core.ref.time_index as r_ti
import kbroker._core.time_index as c_ti

SIZE = 10 * 1024 * 1024
LOOKUPS = 2000


def _full_offset_index(mod, path):
    idx = mod.OffsetIndex(path, 0, SIZE)
    n = SIZE // 8
    # positions must increase: use i * 1500 (fits int32 for 1.3M entries)
    raw = b"".join((i * 3 + 1).to_bytes(4, "big") + (i * 1500).to_bytes(4, "big") for i in range(n))
    idx.append_raw(raw)
    assert idx.is_full
    return idx


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    d = tmp_path_factory.mktemp("bidx")
    c = _full_offset_index(c_oi, str(d / "c.index"))
    r = _full_offset_index(r_oi, str(d / "r.index"))
    rnd = random.Random(1)
    targets = [rnd.randrange(0, (SIZE // 8) * 3) for _ in range(LOOKUPS)]
    yield c, r, targets
    c.close(); r.close()


def _run(idx, targets):
    lookup = idx.lookup
    for t in targets:
        lookup(t)


@pytest.mark.benchmark(group="offset-index-lookup")
def test_lookup_cython(benchmark, indexes):
    c, _, targets = indexes
    benchmark(_run, c, targets)
    benchmark.extra_info["per_lookup_us"] = benchmark.stats.stats.mean / LOOKUPS * 1e6


@pytest.mark.benchmark(group="offset-index-lookup")
def test_lookup_python_twin(benchmark, indexes):
    _, r, targets = indexes
    benchmark(_run, r, targets)
    benchmark.extra_info["per_lookup_us"] = benchmark.stats.stats.mean / LOOKUPS * 1e6


@pytest.fixture(scope="module")
def time_indexes(tmp_path_factory):
    d = tmp_path_factory.mktemp("btidx")
    n = SIZE // 12 - 1
    raw = b"".join((1_700_000_000_000 + i * 10).to_bytes(8, "big") + (i * 2).to_bytes(4, "big") for i in range(n))
    out = []
    for mod, name in ((c_ti, "c"), (r_ti, "r")):
        t = mod.TimeIndex(str(d / f"{name}.timeindex"), 0, SIZE)
        t.append_raw(raw)
        out.append(t)
    rnd = random.Random(2)
    targets = [1_700_000_000_000 + rnd.randrange(0, n * 10) for _ in range(LOOKUPS)]
    yield out[0], out[1], targets
    for t in out:
        t.close()


@pytest.mark.benchmark(group="time-index-lookup")
def test_time_lookup_cython(benchmark, time_indexes):
    c, _, targets = time_indexes
    benchmark(_run, c, targets)
    benchmark.extra_info["per_lookup_us"] = benchmark.stats.stats.mean / LOOKUPS * 1e6


@pytest.mark.benchmark(group="time-index-lookup")
def test_time_lookup_python_twin(benchmark, time_indexes):
    _, r, targets = time_indexes
    benchmark(_run, r, targets)
    benchmark.extra_info["per_lookup_us"] = benchmark.stats.stats.mean / LOOKUPS * 1e6


# -- first use: create the file at max size and map it (a new segment's first entry) ------------
FIRST_USES = 200


def _first_uses(mod, d, rnd, busy: bool):
    """Create and map FIRST_USES fresh indexes in new directories under ``d``; with
    ``busy`` a second Python thread spins meanwhile, as a request handler does while
    another appends (each GIL hand-over then waits for it)."""
    import os
    import threading
    paths = []
    for i in range(FIRST_USES):
        sub = os.path.join(d, f"{rnd}-{i}")
        os.mkdir(sub)
        paths.append(os.path.join(sub, "00000000000000000000.index"))
    stop = threading.Event()
    spinner = None
    if busy:
        def spin():
            while not stop.is_set():
                pass
        spinner = threading.Thread(target=spin, daemon=True)
        spinner.start()
    try:
        for p in paths:
            idx = mod.OffsetIndex(p, 0, SIZE)
            idx.entries
            idx.close_handler()
    finally:
        stop.set()
        if spinner is not None:
            spinner.join()


@pytest.mark.benchmark(group="offset-index-first-use")
@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "gil-contended"])
@pytest.mark.parametrize("mod", [c_oi, r_oi], ids=["cython", "python_twin"])
def test_first_use(benchmark, tmp_path, mod, busy):
    """Best on tmpfs (``--basetemp /dev/shm/...``): a journaled disk's file creation
    (0.4-0.7 ms) hides the CPU and GIL cost this measures."""
    rounds = iter(range(10**6))
    benchmark.pedantic(lambda: _first_uses(mod, str(tmp_path), next(rounds), busy), rounds=5, iterations=1)
    benchmark.extra_info["per_first_use_us"] = benchmark.stats.stats.mean / FIRST_USES * 1e6

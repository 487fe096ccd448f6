"""Timing wheel: compiled kernel vs pure-Python twin vs the heapq MockTimer.

Two workloads on 100k tasks with delays uniform in [1, 30 s):
- add-expire: add all, then advance the clock 10 ms at a time until every
  task has expired (every task is re-placed down the overflow wheels);
- add-cancel: add all, then cancel all (operations completing before their
  timeout, the purgatory's common case).
The heapq MockTimer is each group's reference (ratio > 1: faster than it).
Tasks and delays are made once, outside the timed code; each round gets a
fresh timer (setup, not timed).
"""
from __future__ import annotations

import random

import pytest

from kbroker._core import timing_wheel as ctw
from kbroker._core.ref import timing_wheel as rtw

N = 100_000
STEP_MS = 10
_rnd = random.Random(20240607)
DELAYS = [_rnd.randrange(1, 30_000) for _ in range(N)]
TASKS = {
    "cython": [ctw.TimerTask(d) for d in DELAYS],
    "python": [rtw.TimerTask(d) for d in DELAYS],
}
IMPLS = {
    "cython": (ctw.Timer, TASKS["cython"]),
    "python": (rtw.Timer, TASKS["python"]),
    "heapq": (rtw.MockTimer, TASKS["python"]),
}


def add_expire(timer, tasks):
    add = timer.add
    for t in tasks:
        add(t)
    expired = 0
    now = 0
    advance = timer.advance_clock
    while timer.size:
        now += STEP_MS
        expired += len(advance(now))
    return expired


def add_cancel(timer, tasks):
    add = timer.add
    cancel = timer.cancel
    for t in tasks:
        add(t)
    for t in tasks:
        cancel(t)
    return timer.size


@pytest.mark.parametrize("impl", list(IMPLS))
def test_add_expire_100k(benchmark, impl):
    timer_cls, tasks = IMPLS[impl]
    benchmark.group = "timing-wheel-add-expire-100k"
    if impl == "heapq":
        benchmark.extra_info["role"] = "reference"
    result = benchmark.pedantic(
        add_expire, setup=lambda: ((timer_cls(start_ms=0), tasks), {}),
        rounds=5 if impl != "cython" else 15, iterations=1)
    assert result == N


@pytest.mark.parametrize("impl", list(IMPLS))
def test_add_cancel_100k(benchmark, impl):
    timer_cls, tasks = IMPLS[impl]
    benchmark.group = "timing-wheel-add-cancel-100k"
    if impl == "heapq":
        benchmark.extra_info["role"] = "reference"
    result = benchmark.pedantic(
        add_cancel, setup=lambda: ((timer_cls(start_ms=0), tasks), {}),
        rounds=5 if impl != "cython" else 15, iterations=1)
    assert result == 0


def raw_heapq(tasks):
    """Lower bound for any heap of tasks: heappush/heappop of tuples, no
    cancel support, no interface: what a bare priority queue costs."""
    import heapq

    heap = []
    push = heapq.heappush
    for seq, t in enumerate(tasks):
        push(heap, (t.delay_ms, seq, t))
    expired = 0
    now = 0
    pop = heapq.heappop
    while heap:
        now += STEP_MS
        while heap and heap[0][0] <= now:
            pop(heap)
            expired += 1
    return expired


def test_add_expire_100k_raw_heapq(benchmark):
    benchmark.group = "timing-wheel-add-expire-100k"
    result = benchmark.pedantic(raw_heapq, args=(TASKS["python"],), rounds=5, iterations=1)
    assert result == N

"""CoordinatorRuntime: the partition table, loading, the append path and timers shared by
the group and transaction coordinators (kbroker/coordinator/runtime.py)."""
from __future__ import annotations

import threading
import time

from kbroker.coordinator.runtime import (
    ACTIVE, LOADING, CoordinatorRuntime, InMemoryCoordinatorLog, partition_for,
)
from kbroker.protocol import ErrorCode as E
from kbroker.server.timer import TimerTask


class KVShard:
    """A toy state machine: a key/value map per partition, replayed from the log."""

    def __init__(self) -> None:
        self.state: dict[int, dict[bytes, bytes]] = {}
        self.unloaded: list[int] = []
        self.gate: threading.Event | None = None

    def load(self, partition, records):
        if self.gate is not None:
            self.gate.wait(10)
        kv = {}
        for r in records:
            if r.value is None:
                kv.pop(bytes(r.key), None)
            else:
                kv[bytes(r.key)] = bytes(r.value)
        self.state[partition] = kv
        return len(kv)

    def unload(self, partition):
        self.state.pop(partition, None)
        self.unloaded.append(partition)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def make(num_partitions=3):
    log = InMemoryCoordinatorLog()
    shard = KVShard()
    clock = Clock()
    rt = CoordinatorRuntime("test", "__test", num_partitions, log, shard, time_ms=clock, reaper_enabled=False)
    return rt, log, shard, clock


def test_partition_errors_follow_the_table():
    rt, _, _, _ = make()
    assert rt.partition_error(0) == E.COORDINATOR_NOT_AVAILABLE  # not started
    rt.startup([0], background=False)
    assert rt.partition_error(0) is None
    assert rt.partition_error(1) == E.NOT_COORDINATOR
    assert rt.owns(0) and not rt.owns(1)
    rt.unload_partition(0)
    assert rt.partition_error(0) == E.NOT_COORDINATOR
    rt.shutdown()
    assert rt.partition_error(0) == E.COORDINATOR_NOT_AVAILABLE


def test_append_then_reload_replays_to_the_same_state_and_skips_control_batches():
    rt, log, shard, _ = make()
    rt.startup([1], background=False)
    results = []
    rt.append(1, [(b"a", b"1"), (b"b", b"2")], lambda code, base: results.append((code, base)))
    rt.append(1, [(b"a", None), (b"c", b"3")], lambda code, base: results.append((code, base)))
    assert results == [(0, 0), (0, 2)]
    rt.unload_partition(1)
    assert shard.unloaded == [1] and 1 not in shard.state
    assert rt.load_partition(1) == 2
    assert shard.state[1] == {b"b": b"2", b"c": b"3"}
    assert rt.partition_state(1) == ACTIVE


def test_append_failure_reaches_the_callback():
    rt, log, _, _ = make()
    rt.startup([0], background=False)
    log.fail_appends(E.NOT_LEADER_OR_FOLLOWER)
    got = []
    rt.append(0, [(b"k", b"v")], lambda code, base: got.append((code, base)))
    assert got == [(int(E.NOT_LEADER_OR_FOLLOWER), -1)]


def test_background_load_answers_load_in_progress_until_loaded():
    rt, _, shard, _ = make()
    shard.gate = threading.Event()
    rt.startup([0, 2], background=True)
    assert rt.partition_state(0) == LOADING
    assert rt.partition_error(0) == E.COORDINATOR_LOAD_IN_PROGRESS
    assert rt.any_loading()
    shard.gate.set()
    assert rt.wait_loaded(10)
    assert rt.partition_error(0) is None and rt.partition_error(2) is None
    assert rt.active_partitions() == [0, 2]
    rt.shutdown()


def test_unload_while_loading_drops_what_the_load_installed():
    rt, _, shard, _ = make()
    shard.gate = threading.Event()
    rt._active = True
    t = threading.Thread(target=rt.load_partition, args=(0,))
    t.start()
    deadline = time.monotonic() + 10
    while rt.partition_state(0) != LOADING and time.monotonic() < deadline:
        time.sleep(0.001)
    rt.unload_partition(0)
    shard.gate.set()
    t.join(10)
    assert rt.partition_state(0) is None
    assert 0 not in shard.state


def test_timers_run_on_the_runtime_clock():
    rt, _, _, clock = make()
    purgatory = rt.new_purgatory("P", "p-timer")
    fired = []

    class Task(TimerTask):
        def run(self):
            fired.append(clock.now)

    purgatory.timer.add(Task(500))
    rt.advance_timers()
    assert fired == []
    clock.now += 500
    rt.advance_timers()
    assert fired == [clock.now]
    rt.shutdown()


def test_partition_for_is_kafkas_abs_hashcode_modulo():
    # Java: "my-txn".hashCode() = -1068802765 -> abs % 50 = 15; "" hashes to 0
    assert partition_for("", 50) == 0
    h = 0
    for ch in "my-txn":
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    h = h - (1 << 32) if h & 0x80000000 else h
    assert partition_for("my-txn", 50) == abs(h) % 50

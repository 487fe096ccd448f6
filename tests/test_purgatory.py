"""SystemTimer and DelayedOperationPurgatory.

Most tests inject a fake clock and drive ``advance_clock(0)`` themselves;
the few real-time ones wait tens of ms (with a bounded safety timeout).
"""
import sys
import threading
import time

import pytest

from kbroker.server.purgatory import DelayedOperation, DelayedOperationPurgatory
from kbroker.server.timer import SystemTimer, SystemTimerReaper, TimerTask


class FakeClock:
    def __init__(self, ms=0):
        self.ms = ms

    def __call__(self):
        return self.ms


class Op(DelayedOperation):
    """Completes once ``ready`` is set; records every callback."""

    def __init__(self, delay_ms, ready=False, name=None):
        super().__init__(delay_ms)
        self.ready = ready
        self.name = name
        self.events = []  # list.append is atomic: safe to call from any thread
        self.done = threading.Event()

    def try_complete(self):
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self):
        self.events.append("complete")
        self.done.set()

    def on_expiration(self):
        self.events.append("expire")


class Task(TimerTask):
    def __init__(self, delay_ms, fn):
        super().__init__(delay_ms)
        self.fn = fn

    def run(self):
        self.fn()


def manual_purgatory(purge_interval=1000, start_ms=0):
    clock = FakeClock(start_ms)
    timer = SystemTimer("test", clock_ms=clock)
    return DelayedOperationPurgatory("test", timer, purge_interval=purge_interval,
                                     reaper_enabled=False), clock


# ------------------------------------------------------------- SystemTimer


def test_system_timer_fake_clock():
    clock = FakeClock(1000)
    timer = SystemTimer("t", clock_ms=clock)
    ran = []
    timer.add(Task(50, lambda: ran.append("a")))
    timer.add(Task(10, lambda: ran.append("b")))
    timer.add(Task(0, lambda: ran.append("now")))  # due: queued, not run by add
    assert ran == [] and timer.size == 2
    assert timer.next_expiration_ms() == 1000
    assert timer.advance_clock(0) is True and ran == ["now"]
    clock.ms = 1009
    assert timer.advance_clock(0) is False
    clock.ms = 1010
    assert timer.advance_clock(0) is True and ran == ["now", "b"]
    clock.ms = 5000
    timer.advance_clock(0)
    assert ran == ["now", "b", "a"] and timer.size == 0


def test_system_timer_cancel():
    clock = FakeClock(0)
    timer = SystemTimer("t", clock_ms=clock)
    ran = []
    later, due = Task(10, lambda: ran.append(1)), Task(0, lambda: ran.append(2))
    timer.add(later)
    timer.add(due)
    assert timer.cancel(later) and timer.cancel(due)
    assert not timer.cancel(later) and timer.size == 0
    clock.ms = 100
    assert timer.advance_clock(0) is False and ran == []


def test_system_timer_failing_task_does_not_stop_others(caplog):
    clock = FakeClock(0)
    timer = SystemTimer("t", clock_ms=clock)
    ran = []

    def boom():
        raise RuntimeError("boom")

    timer.add(Task(1, boom))
    timer.add(Task(1, lambda: ran.append(1)))
    clock.ms = 1
    assert timer.advance_clock(0) is True
    assert ran == [1] and "boom" in caplog.text


def test_reaper_woken_by_earlier_task():
    """A reaper sleeping until a far bucket (or its poll timeout) wakes for an earlier one."""
    timer = SystemTimer("t")
    reaper = SystemTimerReaper("reaper-t", timer, poll_timeout_ms=10_000)
    try:
        far = threading.Event()
        near = threading.Event()
        ran_on = []
        reaper.add(Task(5_000, far.set))
        time.sleep(0.01)  # let the reaper go to sleep on the far bucket
        t0 = time.monotonic()
        reaper.add(Task(20, lambda: (ran_on.append(threading.current_thread().name), near.set())))
        assert near.wait(2.0)
        elapsed = time.monotonic() - t0
        assert 0.018 <= elapsed < 1.0
        assert ran_on == ["reaper-t"]  # runs on the reaper thread
        assert not far.is_set() and reaper.size == 1
    finally:
        t0 = time.monotonic()
        reaper.close()
        assert time.monotonic() - t0 < 1.0


def test_due_task_runs_on_reaper_not_caller():
    timer = SystemTimer("t")
    reaper = SystemTimerReaper("reaper-due", timer, poll_timeout_ms=10_000)
    try:
        ran_on = []
        done = threading.Event()
        time.sleep(0.005)
        reaper.add(Task(0, lambda: (ran_on.append(threading.current_thread().name), done.set())))
        assert done.wait(2.0)
        assert ran_on == ["reaper-due"]
    finally:
        reaper.close()


def test_closed_timer_runs_nothing():
    clock = FakeClock(0)
    timer = SystemTimer("t", clock_ms=clock)
    ran = []
    timer.add(Task(0, lambda: ran.append(1)))
    timer.close()
    timer.add(Task(0, lambda: ran.append(2)))
    clock.ms = 10
    assert timer.advance_clock(0) is False and ran == []


# ------------------------------------------------------------- purgatory


def test_complete_without_watching():
    purgatory, _ = manual_purgatory()
    op = Op(100, ready=True)
    assert purgatory.try_complete_else_watch(op, [("t", 0)]) is True
    assert op.events == ["complete"]
    assert purgatory.watched() == 0 and purgatory.num_delayed() == 0


def test_empty_watch_keys_rejected():
    purgatory, _ = manual_purgatory()
    with pytest.raises(ValueError):
        purgatory.try_complete_else_watch(Op(10), [])


def test_check_and_complete():
    purgatory, _ = manual_purgatory()
    key = ("topic", 3)
    op = Op(100)
    assert purgatory.try_complete_else_watch(op, [key]) is False
    assert purgatory.watched() == 1 and purgatory.num_delayed() == 1
    assert purgatory.check_and_complete(key) == 0  # not ready yet
    op.ready = True
    assert purgatory.check_and_complete(key) == 1
    assert op.events == ["complete"] and op.is_completed
    assert purgatory.num_delayed() == 0  # force_complete cancelled its timeout
    assert purgatory.watched() == 0 and purgatory.watched_keys() == 0
    assert purgatory.check_and_complete(key) == 0
    assert purgatory.check_and_complete(("other", 0)) == 0


def test_expiration_completes_once():
    purgatory, clock = manual_purgatory(start_ms=10_000)
    op = Op(100)
    assert not purgatory.try_complete_else_watch(op, ["group-a"])
    clock.ms = 10_099
    purgatory.advance_clock(0)
    assert op.events == []
    clock.ms = 10_100
    purgatory.advance_clock(0)
    # Kafka's order: forceComplete() (on_complete) then on_expiration().
    assert op.events == ["complete", "expire"]
    op.ready = True
    assert purgatory.check_and_complete("group-a") == 0
    assert op.force_complete() is False
    clock.ms = 20_000
    purgatory.advance_clock(0)
    assert op.events == ["complete", "expire"]
    assert purgatory.num_delayed() == 0 and purgatory.watched() == 0


def test_watch_key_fan_out():
    purgatory, _ = manual_purgatory()
    keys = [("t", 0), ("t", 1), "txn-id", 42]
    op = Op(1000)
    other = Op(1000)
    assert not purgatory.try_complete_else_watch(op, keys)
    assert not purgatory.try_complete_else_watch(other, [("t", 1)])
    assert purgatory.watched() == 5 and purgatory.watched_keys() == 4
    assert purgatory.num_delayed() == 2
    op.ready = True
    assert purgatory.check_and_complete("txn-id") == 1
    # Stale entries stay under the other keys until checked or purged.
    assert purgatory.watched() == 4
    assert purgatory.check_and_complete(("t", 0)) == 0  # removes the stale entry
    assert purgatory.watched() == 3
    assert purgatory.purge_completed() == 2  # ("t", 1) and 42
    assert purgatory.watched() == 1 and purgatory.watched_keys() == 1
    assert op.events == ["complete"] and other.events == []
    other.ready = True
    assert purgatory.check_and_complete(("t", 1)) == 1
    assert purgatory.watched() == 0 and purgatory.num_delayed() == 0


def test_completed_while_being_watched_is_not_timed():
    """Completes on the second check (after watching): the caller completed it."""

    class SecondTime(Op):
        calls = 0

        def try_complete(self):
            self.calls += 1
            return self.force_complete() if self.calls >= 2 else False

    purgatory, _ = manual_purgatory()
    op = SecondTime(1000)
    assert purgatory.try_complete_else_watch(op, ["a", "b"]) is True
    assert op.events == ["complete"]
    assert purgatory.num_delayed() == 0
    assert purgatory.watched() == 2  # stale; purged later
    assert purgatory.purge_completed() == 2


def test_purge_after_interval():
    purgatory, clock = manual_purgatory(purge_interval=10)
    ops = [Op(1_000) for _ in range(25)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [("t", i % 5), ("u", i)])
    assert purgatory.watched() == 50
    for op in ops[:5]:
        op.force_complete()  # not through check_and_complete: stays in watch lists
    purgatory.advance_clock(0)
    assert purgatory.watched() == 50  # 25 - 20 delayed = 5 <= 10: no purge yet
    for op in ops[5:20]:
        op.force_complete()
    purgatory.advance_clock(0)  # 25 - 5 delayed = 20 > 10: purge
    assert purgatory.watched() == 10 and purgatory.num_delayed() == 5
    clock.ms = 1_000
    purgatory.advance_clock(0)
    assert all(op.events == ["complete", "expire"] for op in ops[20:])
    assert all(op.events == ["complete"] for op in ops[:20])


def test_cancel_for_key():
    purgatory, clock = manual_purgatory()
    a, b = Op(100), Op(100)
    purgatory.try_complete_else_watch(a, ["k"])
    purgatory.try_complete_else_watch(b, ["k", "other"])
    cancelled = purgatory.cancel_for_key("k")
    assert set(map(id, cancelled)) == {id(a), id(b)}
    assert purgatory.num_delayed() == 0 and not a.is_completed
    assert purgatory.cancel_for_key("k") == []
    clock.ms = 1000
    purgatory.advance_clock(0)
    assert a.events == [] and b.events == []


def test_concurrent_check_and_complete_exactly_once(tiny_switch_interval):
    purgatory, _ = manual_purgatory()
    key = ("t", 0)
    rounds, n_ops, n_threads = 5, 40, 4
    for _ in range(rounds):
        ops = [Op(60_000) for _ in range(n_ops)]
        for op in ops:
            assert not purgatory.try_complete_else_watch(op, [key, ("all", 0)])
        for op in ops:
            op.ready = True
        barrier = threading.Barrier(n_threads)
        counts = []

        def worker(k):
            barrier.wait()
            counts.append(purgatory.check_and_complete(k))

        threads = [threading.Thread(target=worker, args=([key, ("all", 0)][i % 2],))
                   for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sum(counts) == n_ops
        assert all(op.events == ["complete"] for op in ops)
        assert purgatory.num_delayed() == 0
        # A checker that deferred to the lock holder may leave a stale entry
        # (completed, still listed) under its key: purged, never completed twice.
        assert purgatory.watched() <= n_ops
        purgatory.purge_completed()
        assert purgatory.watched() == 0


@pytest.fixture
def tiny_switch_interval():
    """Switch threads every ~1 us so check-then-set races actually interleave."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_force_complete_race_exactly_once(tiny_switch_interval):
    n_ops, n_threads = 2000, 4
    ops = [Op(60_000) for _ in range(n_ops)]
    barrier = threading.Barrier(n_threads)
    wins = []

    def worker():
        barrier.wait()
        wins.append(sum(op.force_complete() for op in ops))

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(wins) == n_ops
    assert all(op.events == ["complete"] for op in ops)


def test_check_and_complete_never_blocks_and_no_completion_is_lost():
    """A check that finds the op locked defers to the holder, which re-checks."""

    class Slow(Op):
        def __init__(self):
            super().__init__(60_000)
            self.calls = 0
            self.entered = threading.Event()
            self.gate = threading.Event()

        def try_complete(self):
            self.calls += 1
            ready = self.ready  # read the state, then stall (as if doing work)
            if self.calls == 2:
                self.entered.set()
                assert self.gate.wait(5)
            return self.force_complete() if ready else False

    purgatory, _ = manual_purgatory()
    op = Slow()
    result = []
    parker = threading.Thread(target=lambda: result.append(
        purgatory.try_complete_else_watch(op, ["k"])))
    parker.start()
    assert op.entered.wait(5)  # parker holds op.lock, watched, in its last check
    op.ready = True
    t0 = time.monotonic()
    assert purgatory.check_and_complete("k") == 0  # lock busy: deferred
    assert time.monotonic() - t0 < 0.5 and not op.is_completed
    op.gate.set()
    parker.join(5)
    assert result == [True]  # the parker's re-check completed it
    assert op.events == ["complete"] and purgatory.num_delayed() == 0


def test_expiry_racing_check_and_complete():
    """Real reaper expiring ops while threads complete them: once each."""
    purgatory = DelayedOperationPurgatory("race", SystemTimer("race"), reaper_poll_ms=5)
    try:
        ops = [Op(i % 3) for i in range(300)]
        for i, op in enumerate(ops):
            purgatory.try_complete_else_watch(op, [i % 7])
        for op in ops:
            op.ready = True

        def worker():
            for k in range(7):
                purgatory.check_and_complete(k)

        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for op in ops:
            assert op.done.wait(2.0)
        for op in ops:
            assert op.events in (["complete"], ["complete", "expire"])
    finally:
        purgatory.shutdown()


def test_real_reaper_expires_and_shuts_down_fast():
    purgatory = DelayedOperationPurgatory("real", reaper_poll_ms=10_000)
    op = Op(20)
    t0 = time.monotonic()
    assert not purgatory.try_complete_else_watch(op, [("t", 0)])
    assert op.done.wait(2.0)
    elapsed = time.monotonic() - t0
    assert 0.018 <= elapsed < 1.0
    deadline = time.monotonic() + 1.0
    while op.events != ["complete", "expire"] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert op.events == ["complete", "expire"]
    t0 = time.monotonic()
    purgatory.shutdown()
    assert time.monotonic() - t0 < 1.0
    assert purgatory.timer.closed


class CountingClock:
    """The monotonic clock, counting reads: each reaper round reads it."""

    def __init__(self):
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return time.monotonic_ns() // 1_000_000


def test_idle_purgatory_reaper_sleeps_until_an_operation_is_added():
    """An empty purgatory's reaper does not wake every reaper_poll_ms (an idle broker has
    five of them); the first watched operation wakes it and still expires on time."""
    clock = CountingClock()
    purgatory = DelayedOperationPurgatory("idle", SystemTimer("idle", clock_ms=clock), reaper_poll_ms=20)
    try:
        time.sleep(0.05)
        before = clock.reads
        time.sleep(0.5)
        assert clock.reads - before <= 2, f"{clock.reads - before} clock reads: the reaper polled"
        op = Op(30)
        t0 = time.monotonic()
        assert not purgatory.try_complete_else_watch(op, [("t", 0)])
        assert op.done.wait(2.0)
        assert 0.028 <= time.monotonic() - t0 < 1.0
        assert op.events[-1] == "expire" or op.events == ["complete"]
    finally:
        t0 = time.monotonic()
        purgatory.shutdown()
        assert time.monotonic() - t0 < 1.0


def test_idle_reaper_sleeps_until_a_far_task_not_its_poll_timeout():
    """A timer holding only a far task (a coordinator's periodic check) is not polled every
    poll_timeout_ms; an earlier task added meanwhile still runs on time."""
    clock = CountingClock()
    reaper = SystemTimerReaper("reaper-far", SystemTimer("far", clock_ms=clock), poll_timeout_ms=20)
    try:
        reaper.add(Task(60_000, lambda: None))
        time.sleep(0.05)
        before = clock.reads
        time.sleep(0.5)
        assert clock.reads - before <= 3, f"{clock.reads - before} clock reads: the reaper polled"
        near = threading.Event()
        t0 = time.monotonic()
        reaper.add(Task(30, near.set))
        assert near.wait(2.0)
        assert 0.028 <= time.monotonic() - t0 < 1.0
    finally:
        t0 = time.monotonic()
        reaper.close()
        assert time.monotonic() - t0 < 1.0

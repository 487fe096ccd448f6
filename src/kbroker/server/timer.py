"""The broker's timer: a lock and a monotonic clock around the timing wheel.

Kafka: ``server-common/.../server/util/timer/SystemTimer.java`` and
``SystemTimerReaper.java``. The wheel itself (``kbroker.kernels.timing_wheel``,
compiled or twin) is single-threaded and never reads a clock; this module
adds both.

Threads. Any thread may ``add`` / ``cancel``. One reaper thread at a time
calls ``advance_clock(timeout_ms)``: it sleeps on a Condition until the
earliest bucket is due (or the timeout passes, or an ``add`` queues an
earlier bucket and wakes it), advances the wheel to the clock's now and runs
the due tasks *on the reaper thread*, outside the lock, as Kafka's single
``executor-<name>`` thread does. Tasks already due when added are queued and
run by the next ``advance_clock`` (the waiting reaper is woken), never on the
adding thread, so a handler thread never runs a task.

Clock. ``clock_ms`` returns integer ms >= 0 (default: ``time.monotonic_ns()
// 10**6``). Tests inject a fake clock and call ``advance_clock(0)``
themselves: with ``timeout_ms == 0`` nothing waits on real time.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from kbroker.kernels import timing_wheel as _tw

log = logging.getLogger(__name__)

#: The task base class matching the selected wheel (compiled or twin).
TimerTask = _tw.TimerTask

__all__ = ["SystemTimer", "SystemTimerReaper", "TimerTask", "monotonic_ms"]


#: the wait deadline of a reaper sleeping on an empty timer (advance_clock(idle=True))
_IDLE_DEADLINE_MS = 1 << 62
#: the longest an idle reaper sleeps while tasks wait (a purgatory purges on its rounds)
IDLE_MAX_WAIT_MS = 5000


def monotonic_ms() -> int:
    """Milliseconds of the monotonic clock (the default timer clock)."""
    return time.monotonic_ns() // 1_000_000


class SystemTimer:
    """Thread-safe timer: the timing wheel behind one lock.

    Invariants: the wheel and ``_ready`` are touched only with ``_lock``
    held; task ``run()`` is never called with it held (tasks may add or
    cancel). After ``close()`` no task runs; ``add`` still records the task
    (harmless, it will never fire).
    """

    def __init__(
        self,
        executor_name: str = "timer",
        tick_ms: int = 1,
        wheel_size: int = 20,
        clock_ms: Callable[[], int] = monotonic_ms,
        start_ms: int | None = None,
    ) -> None:
        self.executor_name = executor_name
        self._clock_ms = clock_ms
        self._wheel = _tw.Timer(tick_ms, wheel_size, clock_ms() if start_ms is None else start_ms)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ready: list = []  # due when added; run by the next advance_clock
        self._wait_deadline_ms: int | None = None  # set while a reaper sleeps
        self._wakeup_pending = False  # wakeup() before the reaper slept: don't sleep
        self._closed = False

    @property
    def size(self) -> int:
        """Tasks waiting in the wheel (Kafka's ``size()``, NumDelayedOperations)."""
        return self._wheel.size

    @property
    def closed(self) -> bool:
        return self._closed

    def clock_ms(self) -> int:
        return self._clock_ms()

    def add(self, task: TimerTask) -> None:
        """Schedule ``task.run()`` in ``task.delay_ms`` ms (<= 0: as soon as possible)."""
        with self._lock:
            if self._wheel.add(task, self._clock_ms()):
                deadline = self._wait_deadline_ms
                if deadline is not None and self._wheel.next_expiration_ms() < deadline:
                    self._cond.notify_all()
            else:
                self._ready.append(task)
                if self._wait_deadline_ms is not None:
                    self._cond.notify_all()

    def cancel(self, task: TimerTask) -> bool:
        """Unschedule ``task`` (O(1)); False if it was not waiting here."""
        with self._lock:
            if self._wheel.cancel(task):
                return True
            for i, ready in enumerate(self._ready):
                if ready is task:
                    del self._ready[i]
                    return True
            return False

    def next_expiration_ms(self) -> int | None:
        """Earliest queued bucket (a lower bound on the next task), or None."""
        with self._lock:
            if self._ready:
                return self._wheel.current_ms
            return self._wheel.next_expiration_ms()

    def advance_clock(self, timeout_ms: int, idle: bool = False) -> bool:
        """Wait up to ``timeout_ms`` for a due bucket, then run what is due.

        ``idle=True``: wait for the next due bucket up to IDLE_MAX_WAIT_MS, and with no
        task at all until an ``add``, ``wakeup`` or ``close`` (an idle broker's reapers
        do not wake every ``timeout_ms``; an ``add`` of an earlier task still wakes them).
        Returns True iff any task ran. Called by one reaper thread at a time.
        """
        with self._cond:
            if self._closed:
                return False
            if self._wakeup_pending:
                self._wakeup_pending = False
            elif not self._ready and timeout_ms > 0:
                now = self._clock_ms()
                nxt = self._wheel.next_expiration_ms()
                if nxt is None and idle:
                    self._wait_deadline_ms = _IDLE_DEADLINE_MS     # any add wakes it
                    try:
                        self._cond.wait()
                    finally:
                        self._wait_deadline_ms = None
                        self._wakeup_pending = False
                    if self._closed:
                        return False
                elif nxt is None or nxt > now:
                    cap = now + (max(timeout_ms, IDLE_MAX_WAIT_MS) if idle else timeout_ms)
                    deadline = cap if nxt is None else min(nxt, cap)
                    self._wait_deadline_ms = deadline
                    try:
                        self._cond.wait((deadline - now) / 1000.0)
                    finally:
                        self._wait_deadline_ms = None
                        self._wakeup_pending = False
                    if self._closed:
                        return False
            expired = self._wheel.advance_clock(self._clock_ms())
            if self._ready:
                expired = self._ready + expired
                self._ready = []
        for task in expired:
            try:
                task.run()
            except Exception:  # a failing task must not kill the reaper
                log.exception("timer %s: task %r failed", self.executor_name, task)
        return bool(expired)

    def wakeup(self) -> None:
        """Wake a reaper sleeping in advance_clock (e.g. to notice shutdown).

        Sticky: if no reaper sleeps yet, its next advance_clock does not sleep.
        """
        with self._cond:
            self._wakeup_pending = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop running tasks; wakes a sleeping reaper. Idempotent."""
        with self._cond:
            self._closed = True
            self._ready = []
            self._cond.notify_all()

    def __enter__(self) -> "SystemTimer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SystemTimerReaper:
    """A SystemTimer with its own reaper thread (Kafka's SystemTimerReaper).

    For users without a purgatory (the purgatory runs its own reaper, which
    also purges watch lists). ``close()`` stops and joins the thread.
    """

    def __init__(self, reaper_name: str, timer: SystemTimer, poll_timeout_ms: int = 200) -> None:
        self.timer = timer
        self._poll_timeout_ms = poll_timeout_ms
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=reaper_name, daemon=True)
        self._thread.start()

    @property
    def size(self) -> int:
        return self.timer.size

    def add(self, task: TimerTask) -> None:
        self.timer.add(task)

    def cancel(self, task: TimerTask) -> bool:
        return self.timer.cancel(task)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.timer.advance_clock(self._poll_timeout_ms, idle=True)
            except Exception:
                log.exception("timer reaper %s failed", self._thread.name)

    def close(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self.timer.wakeup()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        self.timer.close()

"""Pure-Python twin of :mod:`kbroker._core.timing_wheel`, plus ``MockTimer``.

``Timer`` / ``TimerTask`` here have the compiled kernel's API and run the same
algorithm (same bucket placement, same delay-queue tie-break), so the two
return the same expired tasks in the same order. Buckets are insertion-ordered
dicts keyed by ``id(task)`` instead of linked lists: O(1) add and remove, and
faster than a linked list in pure Python.

``MockTimer`` is the reference model (Kafka's test ``MockTimer``): a heapq of
tasks, not buckets, behind the same interface and the same due rule
(a task expiring at E is due once ``now_ms >= E - E % tick_ms``). It knows
nothing about wheels; tests check both Timers against it. Its
``next_expiration_ms`` is the exact earliest due time, whereas a Timer's is
a lower bound (an overflow or emptied bucket).

Not thread-safe, none of them; see the compiled module's docstring for the
clock and due-rule contract.
"""
from __future__ import annotations

import heapq
from typing import Any

MAX_EXPIRATION_MS = 1 << 62
_INT64_MAX = (1 << 63) - 1
_MAX_WHEEL_SIZE = 1 << 20

__all__ = ["MAX_EXPIRATION_MS", "MockTimer", "Timer", "TimerTask"]


def _check_time(name: str, value: int) -> int:
    if value > _INT64_MAX or value < -_INT64_MAX - 1:
        raise OverflowError(f"{name} does not fit in int64: {value}")
    if not 0 <= value <= MAX_EXPIRATION_MS:
        raise ValueError(f"{name} out of range: {value}")
    return value


class TimerTask:
    """A task to run ``delay_ms`` after it is added to a :class:`Timer`.

    Subclass it and override :meth:`run`. The ``_tw_*`` slots belong to the
    timer holding the task (names chosen not to collide with subclasses).
    """

    __slots__ = ("delay_ms", "_tw_expiration_ms", "_tw_bucket", "_tw_timer")

    def __init__(self, delay_ms: int = 0) -> None:
        if delay_ms > _INT64_MAX or delay_ms < -_INT64_MAX - 1:
            raise OverflowError(f"delay_ms does not fit in int64: {delay_ms}")
        self.delay_ms = delay_ms

    def __new__(cls, *args: Any, **kwargs: Any) -> "TimerTask":
        self = super().__new__(cls)
        self.delay_ms = 0
        self._tw_expiration_ms = -1
        self._tw_bucket = None
        self._tw_timer = None
        return self

    @property
    def expiration_ms(self) -> int:
        """Absolute expiration set by the last add, -1 if never added."""
        return self._tw_expiration_ms

    @property
    def scheduled(self) -> bool:
        """True while the task waits in a timer (added, not due, not cancelled)."""
        return self._tw_bucket is not None

    def run(self) -> None:
        """The work to do once the task is due; subclasses override."""
        raise NotImplementedError


class _Bucket:
    """Kafka's TimerTaskList: tasks by id(task), in insertion order."""

    __slots__ = ("tasks", "expiration_ms")

    def __init__(self) -> None:
        self.tasks: dict[int, TimerTask] = {}
        self.expiration_ms = -1


class _Wheel:
    __slots__ = ("tick_ms", "wheel_size", "interval_ms", "current_ms", "buckets", "overflow")

    def __init__(self, tick_ms: int, wheel_size: int, start_ms: int) -> None:
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval_ms = min(tick_ms * wheel_size, _INT64_MAX)
        self.current_ms = start_ms - start_ms % tick_ms
        self.buckets = [_Bucket() for _ in range(wheel_size)]
        self.overflow: _Wheel | None = None

    def advance(self, time_ms: int) -> None:
        w: _Wheel | None = self
        while w is not None and time_ms - w.current_ms >= w.tick_ms:
            w.current_ms = time_ms - time_ms % w.tick_ms
            time_ms = w.current_ms
            w = w.overflow


class Timer:
    """The wheels plus the delay queue of buckets; same API as the kernel's."""

    def __init__(self, tick_ms: int = 1, wheel_size: int = 20, start_ms: int = 0) -> None:
        if not 1 <= tick_ms <= MAX_EXPIRATION_MS:
            raise ValueError(f"tick_ms out of range: {tick_ms}")
        if not 2 <= wheel_size <= _MAX_WHEEL_SIZE:
            raise ValueError(f"wheel_size out of range: {wheel_size}")
        if not 0 <= start_ms <= MAX_EXPIRATION_MS:
            raise ValueError(f"start_ms out of range: {start_ms}")
        self._wheel = _Wheel(tick_ms, wheel_size, start_ms)
        self._queue: list[tuple[int, int, _Bucket]] = []
        self._size = 0
        self._seq = 0
        self._current_ms = start_ms
        self._levels = 1

    @property
    def tick_ms(self) -> int:
        return self._wheel.tick_ms

    @property
    def wheel_size(self) -> int:
        return self._wheel.wheel_size

    @property
    def current_ms(self) -> int:
        """The latest time passed to advance_clock (or start_ms)."""
        return self._current_ms

    @property
    def size(self) -> int:
        """Number of scheduled tasks."""
        return self._size

    def __len__(self) -> int:
        return self._size

    @property
    def levels(self) -> int:
        """Number of wheels created so far (1 + lazily created overflow wheels)."""
        return self._levels

    @property
    def queue_len(self) -> int:
        """Buckets in the delay queue; at most levels * wheel_size."""
        return len(self._queue)

    def next_expiration_ms(self) -> int | None:
        """Expiration of the earliest queued bucket, or None (a lower bound)."""
        return self._queue[0][0] if self._queue else None

    def _place(self, task: TimerTask) -> bool:
        expiration = task._tw_expiration_ms
        w = self._wheel
        if expiration - w.current_ms < w.tick_ms:
            return False
        while True:
            if expiration - w.current_ms < w.interval_ms:
                virtual_id = expiration // w.tick_ms
                bucket = w.buckets[virtual_id % w.wheel_size]
                bucket.tasks[id(task)] = task
                task._tw_bucket = bucket
                task._tw_timer = self
                self._size += 1
                bucket_start = virtual_id * w.tick_ms
                if bucket.expiration_ms != bucket_start:
                    bucket.expiration_ms = bucket_start
                    heapq.heappush(self._queue, (bucket_start, self._seq, bucket))
                    self._seq += 1
                return True
            if w.overflow is None:
                w.overflow = _Wheel(w.interval_ms, w.wheel_size, w.current_ms)
                self._levels += 1
            w = w.overflow

    def add(self, task: TimerTask, now_ms: int | None = None) -> bool:
        """Schedule ``task`` at ``now_ms + delay_ms``; False if already due."""
        if not isinstance(task, TimerTask):
            raise TypeError(f"expected TimerTask, got {type(task).__name__}")
        if now_ms is None:
            base = self._current_ms
        else:
            if not 0 <= now_ms <= MAX_EXPIRATION_MS:
                raise ValueError(f"now_ms out of range: {now_ms}")
            base = now_ms
        delay = task.delay_ms
        if delay < 0:
            delay = 0
        if delay > MAX_EXPIRATION_MS - base:
            raise ValueError(f"expiration {base} + {task.delay_ms} beyond MAX_EXPIRATION_MS")
        bucket = task._tw_bucket
        if bucket is not None:
            if task._tw_timer is not self:
                raise ValueError("task is scheduled on another timer")
            del bucket.tasks[id(task)]
            task._tw_bucket = None
            task._tw_timer = None
            self._size -= 1
        task._tw_expiration_ms = base + delay
        return self._place(task)

    def cancel(self, task: TimerTask) -> bool:
        """Unschedule ``task`` in O(1); False if it was not scheduled here."""
        if not isinstance(task, TimerTask):
            raise TypeError(f"expected TimerTask, got {type(task).__name__}")
        bucket = task._tw_bucket
        if bucket is None or task._tw_timer is not self:
            return False
        del bucket.tasks[id(task)]
        task._tw_bucket = None
        task._tw_timer = None
        self._size -= 1
        return True

    def advance_clock(self, now_ms: int) -> list[TimerTask]:
        """Move the clock to ``now_ms``; return the tasks that became due."""
        _check_time("now_ms", now_ms)
        expired: list[TimerTask] = []
        queue = self._queue
        wheel = self._wheel
        while queue and queue[0][0] <= now_ms:
            bucket_start, _, bucket = heapq.heappop(queue)
            wheel.advance(bucket_start)
            bucket.expiration_ms = -1
            tasks = bucket.tasks
            if not tasks:
                continue
            bucket.tasks = {}
            for task in tasks.values():
                task._tw_bucket = None
                task._tw_timer = None
                self._size -= 1
                if not self._place(task):
                    expired.append(task)
        if now_ms > self._current_ms:
            self._current_ms = now_ms
            wheel.advance(now_ms)
        return expired


class MockTimer:
    """Reference model: a priority queue of tasks behind the Timer interface.

    Works with any object that has ``delay_ms`` (compiled or twin TimerTask).
    Cancel is lazy (a stale heap entry is skipped when popped); ``size``
    counts live entries only. Expired tasks come out ordered by due time,
    then by add order.
    """

    def __init__(self, tick_ms: int = 1, wheel_size: int = 20, start_ms: int = 0) -> None:
        if not 1 <= tick_ms <= MAX_EXPIRATION_MS:
            raise ValueError(f"tick_ms out of range: {tick_ms}")
        if not 2 <= wheel_size <= _MAX_WHEEL_SIZE:
            raise ValueError(f"wheel_size out of range: {wheel_size}")
        if not 0 <= start_ms <= MAX_EXPIRATION_MS:
            raise ValueError(f"start_ms out of range: {start_ms}")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self._current_ms = start_ms
        self._heap: list[tuple[int, int, Any]] = []
        self._live: dict[int, int] = {}  # id(task) -> seq of its current entry
        self._seq = 0

    @property
    def current_ms(self) -> int:
        return self._current_ms

    @property
    def size(self) -> int:
        return len(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def next_expiration_ms(self) -> int | None:
        """Exact earliest due time among scheduled tasks, or None."""
        heap, live = self._heap, self._live
        while heap and live.get(id(heap[0][2])) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def add(self, task: Any, now_ms: int | None = None) -> bool:
        if now_ms is None:
            base = self._current_ms
        else:
            if not 0 <= now_ms <= MAX_EXPIRATION_MS:
                raise ValueError(f"now_ms out of range: {now_ms}")
            base = now_ms
        delay = max(task.delay_ms, 0)
        if delay > MAX_EXPIRATION_MS - base:
            raise ValueError(f"expiration {base} + {task.delay_ms} beyond MAX_EXPIRATION_MS")
        self._live.pop(id(task), None)
        expiration = base + delay
        due_ms = expiration - expiration % self.tick_ms
        if due_ms <= self._current_ms:
            return False
        seq = self._seq
        self._seq += 1
        self._live[id(task)] = seq
        heapq.heappush(self._heap, (due_ms, seq, task))
        return True

    def cancel(self, task: Any) -> bool:
        return self._live.pop(id(task), None) is not None

    def advance_clock(self, now_ms: int) -> list[Any]:
        _check_time("now_ms", now_ms)
        expired = []
        heap, live = self._heap, self._live
        while heap and heap[0][0] <= now_ms:
            _, seq, task = heapq.heappop(heap)
            if live.get(id(task)) == seq:
                del live[id(task)]
                expired.append(task)
        if now_ms > self._current_ms:
            self._current_ms = now_ms
        return expired

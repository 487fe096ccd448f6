# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Hierarchical timing wheel: the kernel under the broker's purgatory.

Kafka: ``server-common/.../server/util/timer/`` (``TimingWheel``,
``TimerTaskList``, ``TimerTask``, ``TimerTaskEntry``); the pure-Python twin
is :mod:`kbroker._core.ref.timing_wheel`, which also holds ``MockTimer``, the
heapq reference model the tests cross-check against.

Shape. A wheel of ``wheel_size`` buckets, each ``tick_ms`` wide, covers
``interval_ms = tick_ms * wheel_size`` from its clock. A task that falls
beyond goes to the overflow wheel (created on first use) whose tick is the
lower wheel's interval, and so on up. Example, tick 1, size 3, clock c::

    level  buckets
    0      [c,c]    [c+1,c+1]   [c+2,c+2]
    1      [c,c+2]  [c+3,c+5]   [c+6,c+8]
    2      [c,c+8]  [c+9,c+17]  [c+18,c+26]

A bucket's expiration is the start of its range. Buckets (not tasks) sit in
a delay queue, a binary heap keyed by (expiration, sequence); a bucket is
queued when its expiration is set and leaves the queue when it expires.
``advance_clock(now)`` pops every bucket with expiration <= now, moves the
wheels' clocks to it and re-adds its tasks: tasks of an overflow bucket fall
into finer wheels, tasks of a level-0 bucket are due. So insert is O(levels),
cancel is O(1) (unlink from the bucket's doubly linked list), and the heap
never holds more than levels * wheel_size buckets however many tasks wait.

Kafka's TimerTaskEntry is folded into TimerTask: a task is in at most one
bucket of one timer, so its list links live on the task itself.

Due rule (tick granularity). A task with expiration ``E = now +
max(delay_ms, 0)`` is due at the first ``advance_clock(now_ms)`` with ``now_ms >= E - E %
tick_ms``: the start of its tick, up to ``tick_ms - 1`` ms early, as in
Kafka's wheel. With the default tick of 1 ms that is exactly ``now_ms >= E``
(Kafka's test MockTimer fires at ``now > E``; ours follows the wheel).
``add`` of a task already due by the timer's clock schedules nothing and
returns False; the caller runs it.

Clock. Injected: the kernel never reads the system time. ``current_ms`` only
moves forward, via ``advance_clock``. ``add(task, now_ms)`` may name a time
ahead of ``current_ms`` (a reaper that has not woken yet), never behind 0.
Times are ms >= 0 and expirations at most ``MAX_EXPIRATION_MS`` (2**62).

Thread-safety: none. One owner serialises all calls on a Timer and on the
tasks it holds (kbroker.server.timer.SystemTimer holds a lock). Tasks handed
back by ``advance_clock`` are no longer scheduled and may be re-added.
"""
from libc.stdint cimport int64_t, uint64_t

cdef int64_t _MAX_EXPIRATION_MS = 4611686018427387904  # 2**62
cdef int64_t _INT64_MAX = 9223372036854775807
cdef Py_ssize_t _MAX_WHEEL_SIZE = 1 << 20

MAX_EXPIRATION_MS = 4611686018427387904

__all__ = ["MAX_EXPIRATION_MS", "Timer", "TimerTask"]


cdef class TimerTask:
    """A task to run ``delay_ms`` after it is added to a :class:`Timer`.

    Subclass it and override :meth:`run` (the timer never calls it: whoever
    drives ``advance_clock`` does). A task is in at most one bucket of at
    most one timer; adding it again reschedules it (the last add wins).
    """

    def __init__(self, delay_ms=0):
        self.delay_ms = delay_ms
        self._expiration_ms = -1

    def __cinit__(self, *args, **kwargs):
        self._expiration_ms = -1

    @property
    def expiration_ms(self):
        """Absolute expiration set by the last add, -1 if never added."""
        return self._expiration_ms

    @property
    def scheduled(self):
        """True while the task waits in a timer (added, not due, not cancelled)."""
        return self._list is not None

    def run(self):
        """The work to do once the task is due; subclasses override."""
        raise NotImplementedError


cdef inline void _unlink(TimerTask task) noexcept:
    task._prev._next = task._next
    task._next._prev = task._prev
    task._prev = None
    task._next = None
    task._list = None
    task._timer = None


cdef class TimerTaskList:
    """One bucket: a doubly linked cyclic list of tasks behind a sentinel."""

    def __cinit__(self):
        cdef TimerTask root = TimerTask.__new__(TimerTask)
        root._prev = root
        root._next = root
        self._root = root
        self._expiration_ms = -1


cdef inline void _append(TimerTaskList bucket, TimerTask task) noexcept:
    cdef TimerTask root = bucket._root
    cdef TimerTask tail = root._prev
    task._next = root
    task._prev = tail
    tail._next = task
    root._prev = task
    task._list = bucket


cdef inline bint _before(TimerTaskList a, TimerTaskList b) noexcept:
    return a._expiration_ms < b._expiration_ms or (
        a._expiration_ms == b._expiration_ms and a._seq < b._seq)


cdef class TimingWheel:
    """One level: ``wheel_size`` buckets of ``tick_ms`` from ``current_ms``.

    ``current_ms`` is a multiple of ``tick_ms`` and only moves forward.
    """

    def __cinit__(self, int64_t tick_ms, Py_ssize_t wheel_size, int64_t start_ms):
        cdef Py_ssize_t i
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        if tick_ms > _INT64_MAX // wheel_size:
            # Only reachable far above MAX_EXPIRATION_MS: this wheel then
            # holds everything and never needs an overflow wheel.
            self.interval_ms = _INT64_MAX
        else:
            self.interval_ms = tick_ms * wheel_size
        self.current_ms = start_ms - start_ms % tick_ms
        self.buckets = [TimerTaskList() for i in range(wheel_size)]
        self.overflow = None

    cdef void advance(self, int64_t time_ms) noexcept:
        cdef TimingWheel w = self
        # Differences, not sums: current_ms + tick_ms may exceed int64 at the top.
        while w is not None and time_ms - w.current_ms >= w.tick_ms:
            w.current_ms = time_ms - time_ms % w.tick_ms
            time_ms = w.current_ms
            w = w.overflow


cdef class Timer:
    """The wheels plus the delay queue of buckets (Kafka's SystemTimer core).

    ``size`` counts scheduled tasks; cancelled and due tasks are not counted.
    Not thread-safe (see the module docstring).
    """

    def __init__(self, tick_ms=1, wheel_size=20, start_ms=0):
        if not 1 <= tick_ms <= _MAX_EXPIRATION_MS:
            raise ValueError(f"tick_ms out of range: {tick_ms}")
        if not 2 <= wheel_size <= _MAX_WHEEL_SIZE:
            raise ValueError(f"wheel_size out of range: {wheel_size}")
        if not 0 <= start_ms <= _MAX_EXPIRATION_MS:
            raise ValueError(f"start_ms out of range: {start_ms}")
        self._wheel = TimingWheel(tick_ms, wheel_size, start_ms)
        self._queue = []
        self._size = 0
        self._seq = 0
        self._current_ms = start_ms
        self._levels = 1

    @property
    def tick_ms(self):
        return self._wheel.tick_ms

    @property
    def wheel_size(self):
        return self._wheel.wheel_size

    @property
    def current_ms(self):
        """The latest time passed to advance_clock (or start_ms)."""
        return self._current_ms

    @property
    def size(self):
        """Number of scheduled tasks."""
        return self._size

    def __len__(self):
        return self._size

    @property
    def levels(self):
        """Number of wheels created so far (1 + lazily created overflow wheels)."""
        return self._levels

    @property
    def queue_len(self):
        """Buckets in the delay queue; at most levels * wheel_size."""
        return len(self._queue)

    def next_expiration_ms(self):
        """Expiration of the earliest queued bucket, or None if none.

        A wake-up hint for a reaper: no task is due before it, but it may be
        an overflow bucket (its tasks move down) or a bucket emptied by cancel.
        """
        if not self._queue:
            return None
        return (<TimerTaskList>self._queue[0])._expiration_ms

    cdef int _push(self, TimerTaskList bucket) except -1:
        cdef list q = self._queue
        cdef Py_ssize_t i, parent
        cdef TimerTaskList p
        bucket._seq = self._seq
        self._seq += 1
        q.append(bucket)
        i = len(q) - 1
        while i > 0:
            parent = (i - 1) >> 1
            p = <TimerTaskList>q[parent]
            if not _before(bucket, p):
                break
            q[i] = p
            i = parent
        q[i] = bucket
        return 0

    cdef TimerTaskList _pop(self):
        cdef list q = self._queue
        cdef TimerTaskList top = <TimerTaskList>q[0]
        cdef TimerTaskList last = <TimerTaskList>q.pop()
        cdef Py_ssize_t n = len(q)
        cdef Py_ssize_t i = 0, c
        cdef TimerTaskList child, other
        if n == 0:
            return top
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            child = <TimerTaskList>q[c]
            if c + 1 < n:
                other = <TimerTaskList>q[c + 1]
                if _before(other, child):
                    c += 1
                    child = other
            if not _before(child, last):
                break
            q[i] = child
            i = c
        q[i] = last
        return top

    cdef bint _place(self, TimerTask task) except -1:
        # Kafka's TimingWheel.add, walked iteratively up the levels.
        cdef int64_t expiration = task._expiration_ms
        cdef int64_t virtual_id, bucket_start
        cdef TimingWheel w = self._wheel
        cdef TimerTaskList bucket
        if expiration - w.current_ms < w.tick_ms:
            return False  # due: in the tick the clock is in, or earlier
        while True:
            if expiration - w.current_ms < w.interval_ms:
                virtual_id = expiration // w.tick_ms
                bucket = <TimerTaskList>w.buckets[virtual_id % w.wheel_size]
                _append(bucket, task)
                task._timer = self
                self._size += 1
                bucket_start = virtual_id * w.tick_ms
                if bucket._expiration_ms != bucket_start:
                    # A bucket re-used for a later round of its wheel: queue
                    # it. Same round: it is queued already.
                    bucket._expiration_ms = bucket_start
                    self._push(bucket)
                return True
            if w.overflow is None:
                w.overflow = TimingWheel(w.interval_ms, w.wheel_size, w.current_ms)
                self._levels += 1
            w = w.overflow

    cpdef bint add(self, TimerTask task, object now_ms=None) except -1:
        """Schedule ``task`` at ``now_ms + delay_ms`` (now_ms defaults to current_ms).

        Returns True if scheduled, False if already due by the timer's clock
        (then nothing is scheduled and the caller runs the task). A task
        scheduled here before is rescheduled.
        """
        cdef int64_t base, delay, expiration
        if task is None:
            raise TypeError("expected TimerTask, got NoneType")
        if now_ms is None:
            base = self._current_ms
        else:
            if not 0 <= now_ms <= _MAX_EXPIRATION_MS:
                raise ValueError(f"now_ms out of range: {now_ms}")
            base = now_ms
        delay = task.delay_ms
        if delay < 0:
            delay = 0
        if delay > _MAX_EXPIRATION_MS - base:
            raise ValueError(
                f"expiration {base} + {task.delay_ms} beyond MAX_EXPIRATION_MS")
        expiration = base + delay
        if task._list is not None:
            if task._timer is not self:
                raise ValueError("task is scheduled on another timer")
            _unlink(task)
            self._size -= 1
        task._expiration_ms = expiration
        return self._place(task)

    cpdef bint cancel(self, TimerTask task) except -1:
        """Unschedule ``task`` in O(1); False if it was not scheduled here."""
        if task is None:
            raise TypeError("expected TimerTask, got NoneType")
        if task._list is None or task._timer is not self:
            return False
        _unlink(task)
        self._size -= 1
        return True

    cpdef list advance_clock(self, int64_t now_ms):
        """Move the clock to ``now_ms``; return the tasks that became due.

        Order: by bucket expiration, then insertion order within a bucket.
        Returned tasks are unscheduled. A ``now_ms`` behind the clock is a no-op.
        """
        cdef list expired = []
        cdef TimerTaskList bucket
        cdef TimerTask root, task, nxt
        if now_ms < 0 or now_ms > _MAX_EXPIRATION_MS:
            raise ValueError(f"now_ms out of range: {now_ms}")
        while self._queue and (<TimerTaskList>self._queue[0])._expiration_ms <= now_ms:
            bucket = self._pop()
            self._wheel.advance(bucket._expiration_ms)
            bucket._expiration_ms = -1
            # Flush: detach the whole chain first, then re-add task by task.
            root = bucket._root
            task = root._next
            if task is root:
                continue
            root._prev._next = None
            root._next = root
            root._prev = root
            while task is not None:
                nxt = task._next
                task._prev = None
                task._next = None
                task._list = None
                task._timer = None
                self._size -= 1
                if not self._place(task):
                    expired.append(task)
                task = nxt
        if now_ms > self._current_ms:
            self._current_ms = now_ms
            self._wheel.advance(now_ms)
        return expired

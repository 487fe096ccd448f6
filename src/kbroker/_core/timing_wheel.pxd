# Hierarchical timing wheel (Kafka's server-common util/timer package) for
# other kernels to cimport:
#     from kbroker._core.timing_wheel cimport TimerTask, Timer
# Not thread-safe: the caller serialises every call on one Timer
# (kbroker/server/timer.py SystemTimer holds a lock around it).
from libc.stdint cimport int64_t, uint64_t


cdef class TimerTask:
    # Delay from the moment of add(); negative counts as 0.
    cdef public int64_t delay_ms
    # Absolute expiration of the last add(), -1 before the first one.
    cdef int64_t _expiration_ms
    # Links in the bucket's cyclic list; None when not scheduled.
    cdef TimerTask _prev
    cdef TimerTask _next
    # The TimerTaskList / Timer holding the task; None when not scheduled.
    cdef object _list
    cdef object _timer


cdef class TimerTaskList:
    # Sentinel of the doubly linked cyclic list: _root._next is the head.
    cdef TimerTask _root
    # Start of the bucket's time range; -1 while the bucket is not queued.
    cdef int64_t _expiration_ms
    # Tie-break in the delay queue, assigned when (re)queued.
    cdef uint64_t _seq


cdef class TimingWheel:
    cdef int64_t tick_ms
    cdef int64_t interval_ms
    cdef int64_t current_ms
    cdef Py_ssize_t wheel_size
    cdef list buckets
    cdef TimingWheel overflow
    cdef void advance(self, int64_t time_ms) noexcept


cdef class Timer:
    cdef TimingWheel _wheel
    cdef list _queue
    cdef Py_ssize_t _size
    cdef uint64_t _seq
    cdef int64_t _current_ms
    cdef int _levels

    cdef bint _place(self, TimerTask task) except -1
    cdef int _push(self, TimerTaskList bucket) except -1
    cdef TimerTaskList _pop(self)
    cpdef bint add(self, TimerTask task, object now_ms=*) except -1
    cpdef bint cancel(self, TimerTask task) except -1
    cpdef list advance_clock(self, int64_t now_ms)

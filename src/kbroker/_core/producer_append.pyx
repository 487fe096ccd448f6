# cython: boundscheck=False, wraparound=False, initializedcheck=False, language_level=3
"""The producer's per-record append path (Kafka's RecordAccumulator.tryAppend) and the
delivery-callback run of a completed batch.

``OpenBatch`` wraps one producer batch's BatchBuilder while the application may still
append to it. ``try_append`` appends one record and returns its future, a tuple
``(result, offset_delta, timestamp, key_size, value_size)`` of the caller's
``future_type`` (a tuple subclass), or None when the batch is closed or full (the
caller then opens a new batch under its lock). ``close`` stops further appends; the
sender calls it when it drains the batch, before building it.

``append(open_batches, tp, ..., callback)`` looks up the partition's open batch in a
dict, ``try_append``s to it and registers the delivery callback: the accumulator's
lock-free path. ``SendPath.send`` is the common case of ``Producer.send`` in one call:
bytes key and value, no headers, a topic with metadata; it picks the partition
(murmur2 for a key, else the topic's sticky partition), stamps the time, appends, and
accounts the sticky partition's bytes. It returns None, having changed nothing, when
the record needs the general path (anything else, or a new batch).

The batch's ``result`` is the caller's object with ``done`` (bool, set once),
``callbacks`` (a flat list of (future, callback, untracked) triples while not done;
None after) and ``add_callback(fut, fn) -> bool``; a future has ``_run(fn)``. A
callback is registered by checking ``done`` and appending to ``callbacks`` with no
Python code and no GC-tracked allocation in between, so under the GIL that step is atomic with respect to the
completing thread, which sets ``done`` before it takes the list: the callback either
lands in the list the completer runs, or sees ``done`` and runs at once (in the caller's
thread, as ``add_callback`` does).

Thread-safety: ``try_append`` and ``close`` are atomic with respect to each other
because they run entirely under the GIL without calling back into Python code that
could switch threads (bytes-only key/value, list/tuple headers; the builder's append
is C). The record count is bumped before the future is allocated, so even a garbage
collection during that allocation sees a consistent batch. The twin
(kbroker/_core/ref/producer_append.py) gets the same guarantees from locks.

Futures are not tracked by the cyclic garbage collector (CPython does the same for
tuples of atomic values). A record in flight is otherwise promoted to the oldest
generation, and at a full producer buffer that made full collections, which scan every
record in flight, cost a third of the producer's time. The only cycle through a future
(result -> callbacks -> future -> result) is broken when the batch completes, and every
batch completes (delivered, failed, expired or aborted at close).

For the same reason a delivery callback is taken off the collector's lists while its
batch holds it (``untracked`` is True when this module did that) and put back on them
before it runs, or before the list lets go of it. With one callback object per record
(a closure or partial holding the send time, as a benchmark or an application
measuring latency makes) the records
in flight were otherwise most of the heap, each promoted to the oldest generation, and
full collections took ~30% of the producer's time. This is safe because the batch
holds a strong reference the whole time: an untracked object is never freed by the
collector, and the objects it references count as reachable (its references are not
subtracted), so nothing is freed early; once the callback is tracked again and the
batch drops it, cycles through it are collected as usual. It must never be dropped while
untracked: a function's dealloc unlinks it from the collector's list unconditionally and
would crash. So only a ``CallbackList`` (this module's list subclass, which
``result.callbacks`` must be for untracking to happen) gets untracked entries, and its
dealloc tracks every entry still marked untracked before releasing it, whatever path
drops the list (completion, an abandoned batch, a run_callbacks that raised). The
twin's CallbackList is a plain list subclass and nothing is untracked there.

``run_callbacks(callbacks, result, metadata_type, on_error)`` runs a completed batch's
callbacks in order: ``fn(None, metadata)`` with a ``metadata_type`` tuple (topic,
partition, offset, timestamp, key_size, value_size) built without calling its
``__new__``, or on failure ``fn(error, metadata)`` with the topic and partition and -1
in every other field (Java's Callback contract: metadata is never null); a callback
that raises is reported through ``on_error()`` (called inside the except block) and the
rest still run.
"""
cimport cython
from cpython.object cimport PyObject, PyTypeObject
from cpython.dict cimport PyDict_GetItem
from cpython.bytes cimport PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.list cimport PyList_Append, PyList_GET_SIZE, PyList_GET_ITEM, PyList_SET_ITEM, PyList_Check
from cpython.ref cimport Py_INCREF, Py_DECREF
from cpython.tuple cimport PyTuple_SET_ITEM, PyTuple_GET_ITEM, PyTuple_Check, PyTuple_GET_SIZE
from cpython.long cimport PyLong_CheckExact
from cpython.unicode cimport PyUnicode_CheckExact
from libc.stdint cimport int64_t
from posix.time cimport clock_gettime, timespec, CLOCK_REALTIME


cdef extern from "Python.h":
    # tp_alloc of a tuple subclass: a zeroed, GC-tracked tuple of nitems (new reference)
    object PyType_GenericAlloc(PyTypeObject* tp, Py_ssize_t nitems)
    void PyObject_GC_UnTrack(void* op)
    void PyObject_GC_Track(void* op)
    int PyObject_IS_GC(object op)
    int PyObject_GC_IsTracked(object op)


cdef inline Py_ssize_t _size(object b):
    if b is None:
        return -1
    if PyBytes_CheckExact(b):
        return PyBytes_GET_SIZE(b)
    return len(b)


cdef inline void _set(object t, Py_ssize_t i, object v):
    Py_INCREF(v)
    PyTuple_SET_ITEM(t, i, v)


cdef int _check_tuple_type(object tp, str what) except -1:
    """tp must be a tuple subclass without instance dict/slots (safe to tp_alloc)."""
    if (not isinstance(tp, type) or not issubclass(tp, tuple)
            or (<PyTypeObject*>tp).tp_itemsize != (<PyTypeObject*>tuple).tp_itemsize
            or (<PyTypeObject*>tp).tp_basicsize != (<PyTypeObject*>tuple).tp_basicsize):
        raise TypeError(f"{what} must be a plain tuple subclass (__slots__ = ())")
    return 0


cdef inline void _retrack(object items) noexcept:
    """Track again every callback of ``items`` (a list) marked untracked; clear the mark."""
    cdef Py_ssize_t i, n = PyList_GET_SIZE(items)
    cdef object fn
    for i in range(2, n, 3):
        if <object>PyList_GET_ITEM(items, i) is True:
            fn = <object>PyList_GET_ITEM(items, i - 1)
            if not PyObject_GC_IsTracked(fn):
                PyObject_GC_Track(<void*>fn)
            Py_INCREF(False)
            Py_DECREF(<object>PyList_GET_ITEM(items, i))
            PyList_SET_ITEM(items, i, False)


@cython.no_gc_clear
cdef class CallbackList(list):
    """A batch's (future, callback, untracked) triples (module docstring); on dealloc
    every callback still marked untracked is tracked again before it is released. No
    tp_clear: the cyclic GC must not release an untracked callback; it breaks a cycle
    through this list at another member, and this dealloc then runs."""

    def __dealloc__(self):
        _retrack(self)


cdef class OpenBatch:
    """The appendable side of one producer batch (see the module docstring)."""

    cdef readonly object builder
    cdef readonly object result
    cdef readonly Py_ssize_t record_count
    cdef readonly bint closed
    cdef object _append
    cdef PyTypeObject* _ftype
    cdef object _future_type

    def __init__(self, builder, result, future_type):
        _check_tuple_type(future_type, "future_type")
        if future_type.__new__ is not tuple.__new__:
            raise TypeError("future_type must be a plain tuple subclass (no __new__, __slots__ = ())")
        self.builder = builder
        self.result = result
        self.record_count = 0
        self.closed = False
        self._append = builder.append
        self._future_type = future_type
        self._ftype = <PyTypeObject*>future_type

    cdef object _future(self, Py_ssize_t delta, int64_t timestamp, Py_ssize_t ks, Py_ssize_t vs):
        cdef object t = PyType_GenericAlloc(self._ftype, 5)
        _set(t, 0, self.result)
        _set(t, 1, delta)
        _set(t, 2, timestamp)
        _set(t, 3, ks)
        _set(t, 4, vs)
        PyObject_GC_UnTrack(<void*>t)
        return t

    cpdef object try_append(self, int64_t timestamp, object key, object value, object headers,
                            object callback=None):
        """The record's future, or None if the batch is closed or this record does not
        fit (the batch is then closed: it is full). ``callback`` (if not None) is
        registered on the batch's result, or run now if the result is already done."""
        cdef Py_ssize_t n
        cdef object fut, cbs
        if self.closed:
            return None
        if not self._append(timestamp, key, value, headers):
            self.closed = True
            return None
        n = self.record_count
        self.record_count = n + 1
        fut = self._future(n, timestamp, _size(key), _size(value))
        if callback is not None:
            # atomic under the GIL: attribute reads of a slotted object and a list
            # append run no Python code and allocate nothing the GC tracks
            if not self.result.done:
                cbs = self.result.callbacks
                PyList_Append(cbs, fut)
                PyList_Append(cbs, callback)
                if (type(cbs) is CallbackList and PyObject_IS_GC(callback)
                        and PyObject_GC_IsTracked(callback)):
                    PyObject_GC_UnTrack(<void*>callback)
                    PyList_Append(cbs, True)
                else:
                    PyList_Append(cbs, False)
            else:
                fut._run(callback)
        return fut

    def close(self):
        """No appends from now on (idempotent)."""
        self.closed = True


cdef inline object _append_open(dict open_batches, object tp, int64_t timestamp, object key,
                                object value, object headers, object callback):
    cdef PyObject* b = PyDict_GetItem(open_batches, tp)
    if b == NULL:
        return None
    return (<OpenBatch>b).try_append(timestamp, key, value, headers, callback)


def append(dict open_batches, object tp, int64_t timestamp, object key, object value,
           object headers, object callback=None):
    """``open_batches[tp].try_append(...)``, or None if tp has no open batch."""
    return _append_open(open_batches, tp, timestamp, key, value, headers, callback)


def run_callbacks(object callbacks, object result, type metadata_type, object on_error):
    """Run a completed batch's (future, callback, untracked) triples in order (module
    docstring); every callback this module untracked is tracked again first."""
    if not PyList_Check(callbacks):
        raise TypeError("callbacks must be a list")
    _retrack(callbacks)
    _check_tuple_type(metadata_type, "metadata_type")
    cdef Py_ssize_t i, n = PyList_GET_SIZE(callbacks)
    if n % 3:
        raise ValueError("callbacks must be (future, callback, untracked) triples")
    cdef object fut, fn, md, ts
    for i in range(0, n, 3):
        fut = <object>PyList_GET_ITEM(callbacks, i)
        if not PyTuple_Check(fut) or PyTuple_GET_SIZE(fut) < 5:
            raise TypeError("a future is a 5-tuple (result, delta, timestamp, key_size, value_size)")
    cdef object err = result.error
    cdef object topic = result.topic, partition = result.partition
    cdef int64_t base = result.base_offset
    cdef int64_t append_time = result.log_append_time
    cdef int64_t delta
    cdef PyTypeObject* mdt = <PyTypeObject*>metadata_type
    cdef object failed_md = None
    if err is not None:
        failed_md = PyType_GenericAlloc(mdt, 6)
        _set(failed_md, 0, topic)
        _set(failed_md, 1, partition)
        for i in range(2, 6):
            _set(failed_md, i, -1)
    for i in range(0, n, 3):
        fut = <object>PyList_GET_ITEM(callbacks, i)
        fn = <object>PyList_GET_ITEM(callbacks, i + 1)
        try:
            if err is not None:
                fn(err, failed_md)
                continue
            md = PyType_GenericAlloc(mdt, 6)
            _set(md, 0, topic)
            _set(md, 1, partition)
            delta = <object>PyTuple_GET_ITEM(fut, 1)
            _set(md, 2, base + delta if base >= 0 else -1)
            ts = append_time if append_time >= 0 else <object>PyTuple_GET_ITEM(fut, 2)
            _set(md, 3, ts)
            _set(md, 4, <object>PyTuple_GET_ITEM(fut, 3))
            _set(md, 5, <object>PyTuple_GET_ITEM(fut, 4))
            fn(None, md)
        except Exception:
            on_error()


cdef inline int64_t _now_ms() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef class SendPath:
    """``Producer.send``'s common case (module docstring).

    metadata.cluster.topics maps topic -> partitions list (replaced, never mutated, on
    a refresh); ``sticky`` maps topic -> the partitioner's state object with
    ``partition`` and ``produced_bytes``, shared with the Python partitioner, which
    creates entries and switches partitions: ``on_sticky_full(topic, partition, 0,
    cluster, False)`` is called once a sticky partition got ``sticky_batch_size`` bytes.
    ``partition_for_key(key, n)`` is the murmur2 partitioner."""

    cdef object metadata
    cdef dict open_batches
    cdef dict sticky
    cdef Py_ssize_t sticky_batch_size
    cdef bint ignore_keys
    cdef object partition_for_key
    cdef object on_sticky_full

    def __init__(self, metadata, dict open_batches, dict sticky, Py_ssize_t sticky_batch_size,
                 bint ignore_keys, partition_for_key, on_sticky_full):
        self.metadata = metadata
        self.open_batches = open_batches
        self.sticky = sticky
        self.sticky_batch_size = sticky_batch_size
        self.ignore_keys = ignore_keys
        self.partition_for_key = partition_for_key
        self.on_sticky_full = on_sticky_full

    def send(self, object topic, object value, object key, object partition,
             object timestamp_ms, object callback):
        """The record's future, or None (nothing done) if it needs the general path."""
        if ((value is not None and not PyBytes_CheckExact(value))
                or (key is not None and not PyBytes_CheckExact(key))
                or not PyUnicode_CheckExact(topic)
                or (timestamp_ms is not None and not PyLong_CheckExact(timestamp_ms))):
            return None
        cdef object cluster = self.metadata.cluster
        cdef object parts = cluster.topics.get(topic)
        if parts is None:
            return None
        cdef Py_ssize_t nparts = len(parts)
        cdef object st = None
        if partition is None:
            if key is not None and not self.ignore_keys:
                partition = self.partition_for_key(key, nparts)
            else:
                st = self.sticky.get(topic)
                if st is None:
                    return None
                partition = st.partition
                if not PyLong_CheckExact(partition):
                    return None
        elif not PyLong_CheckExact(partition):
            return None
        if partition < 0 or partition >= nparts:
            return None
        cdef int64_t ts
        if timestamp_ms is None:
            ts = _now_ms()
        else:
            ts = timestamp_ms
        fut = _append_open(self.open_batches, (topic, partition), ts, key, value, (), callback)
        if fut is not None and st is not None:
            produced = st.produced_bytes + (PyBytes_GET_SIZE(value) if value is not None else 0) + 20
            st.produced_bytes = produced
            if produced >= self.sticky_batch_size:
                self.on_sticky_full(topic, partition, 0, cluster, False)
        return fut

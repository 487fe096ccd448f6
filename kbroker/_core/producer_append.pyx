# cython: boundscheck=False, wraparound=False, initializedcheck=False, language_level=3
"""The producer's per-record append path (Kafka's RecordAccumulator.tryAppend).

``OpenBatch`` wraps one producer batch's BatchBuilder while the application may still
append to it. ``try_append`` appends one record and returns its future, a tuple
``(result, offset_delta, timestamp, key_size, value_size)`` of the caller's
``future_type`` (a tuple subclass), or None when the batch is closed or full (the
caller then opens a new batch under its lock). ``close`` stops further appends; the
sender calls it when it drains the batch, before building it.

``append(open_batches, tp, ...)`` is the whole fast path of ``Producer.send`` in one C
call: look up the partition's open batch in a dict and ``try_append`` to it.

Thread-safety: ``try_append`` and ``close`` are atomic with respect to each other
because they run entirely under the GIL without calling back into Python code that
could switch threads (bytes-only key/value, list/tuple headers; the builder's append
is C). The record count is bumped before the future is allocated, so even a garbage
collection during that allocation sees a consistent batch. The twin
(kbroker/_core/ref/producer_append.py) gets the same guarantee from a lock.
"""
from cpython.object cimport PyObject, PyTypeObject
from cpython.dict cimport PyDict_GetItem
from cpython.bytes cimport PyBytes_GET_SIZE, PyBytes_CheckExact
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM
from libc.stdint cimport int64_t


cdef extern from "Python.h":
    # tp_alloc of a tuple subclass: a zeroed, GC-tracked tuple of nitems (new reference)
    object PyType_GenericAlloc(PyTypeObject* tp, Py_ssize_t nitems)


cdef inline Py_ssize_t _size(object b):
    if b is None:
        return -1
    if PyBytes_CheckExact(b):
        return PyBytes_GET_SIZE(b)
    return len(b)


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
        if (not isinstance(future_type, type) or not issubclass(future_type, tuple)
                or future_type.__new__ is not tuple.__new__
                or (<PyTypeObject*>future_type).tp_itemsize != (<PyTypeObject*>tuple).tp_itemsize):
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
        cdef object r = self.result
        Py_INCREF(r)
        PyTuple_SET_ITEM(t, 0, r)
        cdef object o = delta
        Py_INCREF(o)
        PyTuple_SET_ITEM(t, 1, o)
        o = timestamp
        Py_INCREF(o)
        PyTuple_SET_ITEM(t, 2, o)
        o = ks
        Py_INCREF(o)
        PyTuple_SET_ITEM(t, 3, o)
        o = vs
        Py_INCREF(o)
        PyTuple_SET_ITEM(t, 4, o)
        return t

    cpdef object try_append(self, int64_t timestamp, object key, object value, object headers):
        """The record's future, or None if the batch is closed or this record does not
        fit (the batch is then closed: it is full)."""
        cdef Py_ssize_t n
        if self.closed:
            return None
        if not self._append(timestamp, key, value, headers):
            self.closed = True
            return None
        n = self.record_count
        self.record_count = n + 1
        return self._future(n, timestamp, _size(key), _size(value))

    def close(self):
        """No appends from now on (idempotent)."""
        self.closed = True


def append(dict open_batches, object tp, int64_t timestamp, object key, object value,
           object headers):
    """``open_batches[tp].try_append(...)``, or None if tp has no open batch."""
    cdef PyObject* b = PyDict_GetItem(open_batches, tp)
    if b == NULL:
        return None
    return (<OpenBatch>b).try_append(timestamp, key, value, headers)

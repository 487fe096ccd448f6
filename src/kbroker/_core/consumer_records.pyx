# cython: boundscheck=False, wraparound=False, initializedcheck=False, language_level=3
"""The consumer's per-record hand-out path: decoded records -> ConsumerRecord tuples.

``build(record_type, recs, start, stop, topic, partition, timestamp_type, leader_epoch)``
returns ``[record_type(topic, partition, r.offset, r.timestamp, timestamp_type, r.key,
r.value, r.headers, leader_epoch) for r in recs[start:stop]]`` where ``record_type`` is a
plain 9-field tuple subclass (a NamedTuple such as kbroker.client's ConsumerRecord) and
``recs`` a list of records.Record. Each tuple is allocated and filled in C: no Python
frame, no argument tuple, no per-field Python bytecode (the pure-Python list
comprehension costs about 4x more per record).
"""
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_SET_ITEM


cdef extern from "Python.h":
    object PyType_GenericAlloc(PyTypeObject* tp, Py_ssize_t nitems)


cdef inline void _set(object t, Py_ssize_t i, object o):
    Py_INCREF(o)
    PyTuple_SET_ITEM(t, i, o)


def build(object record_type, list recs, Py_ssize_t start, Py_ssize_t stop, object topic,
          object partition, object timestamp_type, object leader_epoch):
    cdef Py_ssize_t n = PyList_GET_SIZE(recs)
    cdef Py_ssize_t i
    cdef PyTypeObject* tp
    cdef object t, r
    if (not isinstance(record_type, type) or not issubclass(record_type, tuple)
            or (<PyTypeObject*>record_type).tp_itemsize != (<PyTypeObject*>tuple).tp_itemsize):
        raise TypeError("record_type must be a tuple subclass")
    tp = <PyTypeObject*>record_type
    if start < 0:
        start = 0
    if stop > n:
        stop = n
    if stop < start:
        stop = start
    cdef list out = PyList_New(stop - start)
    for i in range(start, stop):
        r = <object>PyList_GET_ITEM(recs, i)
        t = PyType_GenericAlloc(tp, 9)
        _set(t, 0, topic)
        _set(t, 1, partition)
        _set(t, 2, r.offset)
        _set(t, 3, r.timestamp)
        _set(t, 4, timestamp_type)
        _set(t, 5, r.key)
        _set(t, 6, r.value)
        _set(t, 7, r.headers)
        _set(t, 8, leader_epoch)
        Py_INCREF(t)
        PyList_SET_ITEM(out, i - start, t)
    return out

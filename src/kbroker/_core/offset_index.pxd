# Memory-mapped index files: the shared base (MmapIndex) and the offset index.
# time_index.pyx subclasses MmapIndex via this declaration.
from libc.stdint cimport int32_t, int64_t
from cpython.pythread cimport PyThread_type_lock


cdef Py_ssize_t largest_lower_bound_slot(const unsigned char* m, Py_ssize_t entries,
                                         Py_ssize_t entry_size, Py_ssize_t key_pos,
                                         bint key64, int64_t target) noexcept nogil


cdef class MmapIndex:
    cdef object _path
    cdef readonly int64_t base_offset
    cdef readonly Py_ssize_t max_index_size
    cdef readonly bint writable
    cdef public bint growable
    cdef unsigned char* _map
    cdef Py_ssize_t _length
    cdef Py_ssize_t _entries
    cdef Py_ssize_t _max_entries
    cdef Py_ssize_t _entry_size
    cdef bint _loaded
    cdef bint _closed
    cdef bint _anon
    cdef PyThread_type_lock _mutex

    cdef int _lock(self) except -1
    cdef void _unlock(self) noexcept
    cdef int _ensure(self) except -1
    cdef int _remap(self, Py_ssize_t new_length) except -1
    cdef int _materialize(self, Py_ssize_t new_length) except -1
    cdef void _unmap(self) noexcept
    cdef int _after_load(self) except -1
    cdef int _check_capacity(self, bint skip_full_check) except -1
    cdef int _resize(self, Py_ssize_t new_size) except -1
    cdef void _close_handler(self) noexcept
    cpdef Py_ssize_t free_slots(self, Py_ssize_t reserve) except -1
    cdef int _reserve(self, Py_ssize_t n, bint exact) except -1
    cdef Py_ssize_t _capacity(self) noexcept


cdef class OffsetIndex(MmapIndex):
    cdef int64_t _last_offset

    cdef int _append(self, int64_t offset, int64_t position) except -1

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Memory-mapped sparse time index (Kafka's ``TimeIndex``).

File format (``<base_offset:020d>.timeindex``), big-endian, 12 bytes per entry::

    +-----------------+-----------------------+
    | timestamp int64 | relative_offset int32 |
    +-----------------+-----------------------+

An entry (T, O) means: every record with timestamp > T has offset > O — T
is the largest timestamp seen in the segment up to and including offset O.
Both fields are non-decreasing; an entry is only added when the segment's
max timestamp so far *increases* (``maybe_append``), so the index stays
small even with wildly out-of-order producer timestamps.

``is_full`` keeps one slot free (``entries >= max_entries - 1``): the
segment writes a final entry for its max timestamp when it becomes
inactive, with ``skip_full_check=True``.

Lazy mapping, pre-allocation and trimming as for the offset index
(``kbroker._core.offset_index``); so is the locking: every method takes
the index's own lock (lock-free readers vs. the writer's remaps).
"""
from libc.stdint cimport int32_t, int64_t

from kbroker._core.hton cimport load_i32, load_i64, store_i32, store_i64
from kbroker._core.offset_index cimport MmapIndex, largest_lower_bound_slot
from kbroker._core.index_errors import CorruptIndexError, InvalidOffsetError, IndexFullError
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.string cimport memcpy

cdef enum:
    ENTRY_SIZE = 12

#: RecordBatch.NO_TIMESTAMP
NO_TIMESTAMP = -1


cdef class TimeIndex(MmapIndex):
    """Sparse timestamp → offset index of one segment (see module docstring).

    Invariants: timestamps strictly increasing between entries, offsets
    non-decreasing; ``last_entry`` is ``(-1, base_offset)`` when empty.
    """
    cdef int64_t _last_ts
    cdef int64_t _last_offset

    def __init__(self, path, int64_t base_offset, Py_ssize_t max_index_size=-1, bint writable=True):
        self._entry_size = ENTRY_SIZE
        MmapIndex.__init__(self, path, base_offset, max_index_size, writable)
        self._last_ts = -1
        self._last_offset = base_offset

    cdef int _after_load(self) except -1:
        cdef const unsigned char* p
        if self._entries == 0:
            self._last_ts = -1
            self._last_offset = self.base_offset
        else:
            p = self._map + (self._entries - 1) * ENTRY_SIZE
            self._last_ts = load_i64(p)
            self._last_offset = self.base_offset + load_i32(p + 8)
        return 0

    @property
    def is_full(self):
        self._lock()
        try:
            self._ensure()
            return self._entries >= self._capacity() - 1
        finally:
            self._unlock()

    @property
    def last_entry(self):
        """(timestamp, offset) of the last entry, (-1, base_offset) if empty."""
        self._lock()
        try:
            self._ensure()
            return (self._last_ts, self._last_offset)
        finally:
            self._unlock()

    def sanity_check(self):
        self._lock()
        try:
            self._ensure()
            if self._length % ENTRY_SIZE != 0:
                raise CorruptIndexError(
                    f"Time index file {self._path} is corrupt, found {self._length} bytes which is "
                    f"neither positive nor a multiple of {ENTRY_SIZE}.")
            if self._entries != 0:
                if self._last_ts < load_i64(self._map):
                    raise CorruptIndexError(
                        f"Corrupt time index found, time index file ({self._path}) has non-zero size "
                        f"but the last timestamp is {self._last_ts} which is less than the first "
                        f"timestamp {load_i64(self._map)}")
                if self._last_offset < self.base_offset:
                    raise CorruptIndexError(
                        f"Corrupt time index found, time index file ({self._path}) has non-zero size "
                        f"but the last offset is {self._last_offset} which is less than the base "
                        f"offset {self.base_offset}")
        finally:
            self._unlock()

    def entry(self, Py_ssize_t n):
        cdef const unsigned char* p
        cdef int64_t ts, off
        self._lock()
        try:
            self._ensure()
            if n < 0 or n >= self._entries:
                raise IndexError(f"attempt to fetch the {n}th entry from time index {self._path}, "
                                 f"which has size {self._entries}")
            p = self._map + n * ENTRY_SIZE
            ts = load_i64(p)
            off = self.base_offset + load_i32(p + 8)
        finally:
            self._unlock()
        return (ts, off)

    def lookup(self, int64_t target_timestamp):
        """(timestamp, offset) of the largest entry with timestamp <= target,
        or (-1, base_offset) if there is none."""
        cdef Py_ssize_t slot
        cdef const unsigned char* p
        cdef int64_t ts, off
        self._lock()
        try:
            self._ensure()
            slot = largest_lower_bound_slot(self._map, self._entries, ENTRY_SIZE, 0, True, target_timestamp)
            if slot < 0:
                ts = -1
                off = self.base_offset
            else:
                p = self._map + slot * ENTRY_SIZE
                ts = load_i64(p)
                off = self.base_offset + load_i32(p + 8)
        finally:
            self._unlock()
        return (ts, off)

    def maybe_append(self, int64_t timestamp, int64_t offset, bint skip_full_check=False):
        """Add (timestamp, offset) if timestamp exceeds the last entry's.

        Raises InvalidOffsetError if offset is below the last entry's offset,
        ValueError if timestamp is below the last entry's (the segment passes
        its running maximum, which never decreases).
        """
        cdef int64_t rel
        cdef unsigned char* p
        self._lock()
        try:
            self._ensure()
            if not skip_full_check:
                self._reserve(2, False)
                if self._entries >= self._max_entries - 1:
                    raise IndexFullError(f"Attempt to append to a full time index (size = {self._entries}).")
            if self._entries != 0 and offset < self._last_offset:
                raise InvalidOffsetError(
                    f"Attempt to append an offset ({offset}) to slot {self._entries} no larger than "
                    f"the last offset appended ({self._last_offset}) to {self._path}.")
            if self._entries != 0 and timestamp < self._last_ts:
                raise ValueError(
                    f"Attempt to append a timestamp ({timestamp}) to slot {self._entries} no larger "
                    f"than the last timestamp appended ({self._last_ts}) to {self._path}.")
            if timestamp <= self._last_ts:
                return False
            rel = offset - self.base_offset
            if rel < 0 or rel > 0x7FFFFFFF:
                raise InvalidOffsetError(f"offset {offset} does not fit in time index {self._path} "
                                         f"with base offset {self.base_offset}")
            if not self.writable:
                raise ValueError(f"time index {self._path} is read-only")
            self._reserve(1, skip_full_check)
            if self._entries >= self._max_entries:
                raise IndexFullError(f"time index {self._path} has no free slot")
            p = self._map + self._entries * ENTRY_SIZE
            store_i64(p, timestamp)
            store_i32(p + 8, <int32_t>rel)
            self._entries += 1
            self._last_ts = timestamp
            self._last_offset = offset
            return True
        finally:
            self._unlock()

    def append_raw(self, data):
        """Append entries in on-disk format (from the log_scan kernel),
        checking capacity (one slot stays free) and strict timestamp increase."""
        cdef Py_buffer view
        cdef Py_ssize_t i, n
        cdef const unsigned char* p
        cdef int64_t prev_ts, prev_rel, ts, rel
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        self._lock()
        try:
            self._ensure()
            if view.len % ENTRY_SIZE != 0:
                raise InvalidOffsetError("raw time index data is not a whole number of entries")
            n = view.len // ENTRY_SIZE
            if n == 0:
                return
            if not self.writable:
                raise ValueError(f"time index {self._path} is read-only")
            self._reserve(n + 1, False)
            if self._entries + n > self._max_entries - 1:
                raise IndexFullError(f"{n} entries do not fit in time index {self._path}")
            p = <const unsigned char*>view.buf
            prev_ts = self._last_ts
            prev_rel = self._last_offset - self.base_offset if self._entries else -1
            for i in range(n):
                ts = load_i64(p + i * ENTRY_SIZE)
                rel = load_i32(p + i * ENTRY_SIZE + 8)
                if ts <= prev_ts or rel < prev_rel or rel < 0:
                    raise InvalidOffsetError(f"raw time index entry {i} is not increasing")
                prev_ts = ts
                prev_rel = rel
            memcpy(self._map + self._entries * ENTRY_SIZE, p, n * ENTRY_SIZE)
            self._entries += n
            self._after_load()
        finally:
            self._unlock()
            PyBuffer_Release(&view)

    def truncate_to(self, int64_t offset):
        """Remove every entry with offset >= ``offset``."""
        cdef int64_t rel = offset - self.base_offset
        cdef Py_ssize_t slot, new_entries
        self._lock()
        try:
            self._ensure()
            if rel < 0:
                new_entries = 0
            else:
                if rel > 0x7FFFFFFF:
                    rel = 0x7FFFFFFF
                # Offsets are non-decreasing: find the largest slot with offset <= rel.
                slot = largest_lower_bound_slot(self._map, self._entries, ENTRY_SIZE, 8, False, rel)
                if slot < 0:
                    new_entries = 0
                elif load_i32(self._map + slot * ENTRY_SIZE + 8) == rel:
                    new_entries = slot
                else:
                    new_entries = slot + 1
            self._entries = new_entries
            self._after_load()
        finally:
            self._unlock()

    def __repr__(self):
        return f"TimeIndex({self._path!r}, base_offset={self.base_offset})"

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Memory-mapped sparse offset index (Kafka's ``OffsetIndex`` / ``AbstractIndex``).

File format (``<base_offset:020d>.index``), big-endian, 8 bytes per entry::

    +-----------------------+------------------------+
    | relative_offset int32 | physical_position int32|
    +-----------------------+------------------------+

``relative_offset = offset - base_offset``; ``physical_position`` is the byte
position in the segment's ``.log`` of a batch whose *last* offset is
``offset``. Entries are strictly increasing in both fields. The index is
sparse: the segment adds an entry each ``index.interval.bytes`` of log.

A writable index is pre-allocated to ``max_index_size`` rounded down to the
entry size (the tail is zeros); ``entries`` is the number of valid slots.
``trim_to_valid_size`` shrinks the file to the valid entries when the
segment rolls or the log closes, so a reopened index has
``entries == file_size / entry_size``.

Lazy: nothing is opened or mapped until the first call that needs the data
(Kafka's LazyIndex), so thousands of idle segments cost no fds and no
address space. The file descriptor is closed right after mmap(): a mapped
index holds no fd at all. Mappings are ``MADV_RANDOM``: a page fault reads in
only that page, not a read-ahead window of the (sparse, pre-allocated) file.

An active segment's index (``growable``) that has no file yet is first mapped as
anonymous memory, not a new file: its file is created (*materialized*: exactly the
mapped length, the valid entries written, then mapped) only when it must be on disk:
``flush`` (before the recovery point moves past it), a trim or resize (roll, close).
So no file is created on the append path (creating one costs 0.4-1.3 ms on a busy
ext4 without a journal, twice per partition). A crash loses only entries of a segment
above the recovery point, which recovery rebuilds from the log, as for any index file
that is missing or short (Kafka's recovery of unflushed segments).

Thread-safety (Kafka's ``AbstractIndex.lock``): every method takes the
index's own lock, so lock-free readers (lookups of a ``Log.read`` or a
timestamp search) never touch a map while a writer remaps it (trim on roll,
resize, truncate) or unmaps it (close, delete): after ``close_handler`` any
use raises IndexClosedError. Appends come from one writer at a time (the
log's append lock); the lock makes each append atomic for readers, who see
``entries`` valid slots. The lock is a plain ``PyThread`` lock, taken without
the GIL when contended, and is never held while taking another lock.
"""
import os

from libc.stdint cimport int32_t, int64_t, uint32_t
from libc.string cimport memcpy
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from posix.mman cimport (
    mmap, munmap, msync, madvise, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS,
    MAP_FAILED, MS_SYNC, MADV_RANDOM,
)
from cpython.pythread cimport (
    PyThread_allocate_lock, PyThread_free_lock, PyThread_acquire_lock, PyThread_release_lock, WAIT_LOCK, NOWAIT_LOCK,
)

from kbroker._core.hton cimport load_i32, load_i64, store_i32
from kbroker._core.index_errors import CorruptIndexError, IndexClosedError, InvalidOffsetError, IndexFullError

cdef enum:
    ENTRY_SIZE = 8
    # Kafka's warm section: the last 8 KiB of entries (one or two pages) are
    # what appends and follower/consumer lookups at the tail touch. Searching
    # them first keeps lookups on pages that are surely resident instead of
    # walking a binary search through cold pages of a 10 MiB index.
    WARM_BYTES = 8192


cdef Py_ssize_t largest_lower_bound_slot(const unsigned char* m, Py_ssize_t entries,
                                         Py_ssize_t entry_size, Py_ssize_t key_pos,
                                         bint key64, int64_t target) noexcept nogil:
    """Slot of the largest entry whose key <= target, or -1 (Kafka's
    largestLowerBoundSlotFor). Keys are strictly increasing."""
    cdef Py_ssize_t lo, hi, mid, first_hot
    cdef int64_t k
    if entries == 0:
        return -1
    first_hot = entries - 1 - WARM_BYTES // entry_size
    if first_hot < 0:
        first_hot = 0
    if key64:
        k = load_i64(m + first_hot * entry_size + key_pos)
    else:
        k = load_i32(m + first_hot * entry_size + key_pos)
    if k < target:
        lo = first_hot
        hi = entries - 1
    else:
        if key64:
            k = load_i64(m + key_pos)
        else:
            k = load_i32(m + key_pos)
        if k > target:
            return -1
        lo = 0
        hi = first_hot
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if key64:
            k = load_i64(m + mid * entry_size + key_pos)
        else:
            k = load_i32(m + mid * entry_size + key_pos)
        if k > target:
            hi = mid - 1
        elif k < target:
            lo = mid
        else:
            return mid
    return lo


cdef inline Py_ssize_t round_down(Py_ssize_t n, Py_ssize_t m) noexcept:
    return n - n % m


cdef class MmapIndex:
    """Base of the offset and time index: owns the mapping, the entry count,
    the file and the index lock. See the module docstring for the laziness and
    locking rules. Methods named ``_x`` expect the lock held; the others take it."""

    def __cinit__(self):
        self._map = NULL
        self._length = 0
        self._entries = 0
        self._max_entries = 0
        self._loaded = False
        self._closed = False
        self.growable = False
        self._mutex = PyThread_allocate_lock()
        if self._mutex == NULL:
            raise MemoryError()

    def __init__(self, path, int64_t base_offset, Py_ssize_t max_index_size=-1, bint writable=True):
        self._path = os.fspath(path)
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        self.writable = writable

    def __dealloc__(self):
        self._unmap()
        if self._mutex != NULL:
            PyThread_free_lock(self._mutex)
            self._mutex = NULL

    # -- locking -------------------------------------------------------------
    cdef int _lock(self) except -1:
        if not PyThread_acquire_lock(self._mutex, NOWAIT_LOCK):
            with nogil:    # contended: let the holder run (it may need the GIL)
                PyThread_acquire_lock(self._mutex, WAIT_LOCK)
        return 0

    cdef void _unlock(self) noexcept:
        PyThread_release_lock(self._mutex)

    # -- mapping -----------------------------------------------------------
    cdef int _ensure(self) except -1:
        if self._loaded:
            return 0
        if self._closed:
            raise IndexClosedError(f"index {self._path} is closed")
        cdef bint created = False
        cdef Py_ssize_t length
        cdef void* p
        if not os.path.exists(self._path):
            if not self.writable:
                raise FileNotFoundError(self._path)
            if self.max_index_size < self._entry_size:
                raise ValueError(f"invalid max index size {self.max_index_size}")
            created = True
            length = round_down(self.max_index_size, self._entry_size)
            if self.growable and self.writable:
                # an active segment's new index: anonymous memory until it must be on disk
                self._unmap()
                with nogil:
                    p = mmap(NULL, <size_t>length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                if p == MAP_FAILED:
                    raise OSError(f"anonymous mmap for {self._path} ({length} bytes) failed")
                self._map = <unsigned char*>p
                self._anon = True
                self._length = length
                self._max_entries = length // self._entry_size
                self._entries = 0
                self._loaded = True
                self._after_load()
                return 0
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                os.ftruncate(fd, length)
            finally:
                os.close(fd)
        else:
            length = os.stat(self._path).st_size
        self._remap(length)
        self._entries = 0 if created else self._length // self._entry_size
        self._loaded = True
        self._after_load()
        return 0

    cdef int _materialize(self, Py_ssize_t new_length) except -1:
        """An anonymous index gets its file: ``new_length`` bytes, the valid entries
        that fit written, then mapped in place of the memory (lock held)."""
        cdef Py_ssize_t valid = self._entries * self._entry_size
        if valid > new_length:
            valid = new_length
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, new_length)
            if valid > 0:
                data = (<char*>self._map)[:valid]
                done = 0
                while done < valid:
                    done += os.pwrite(fd, data[done:], done)
        finally:
            os.close(fd)
        self._unmap()
        self._anon = False
        return 0

    cdef int _remap(self, Py_ssize_t new_length) except -1:
        """Set the file length to ``new_length`` (writable only) and map it."""
        cdef void* p
        cdef int fd
        if self._anon:
            self._materialize(new_length)
        self._unmap()
        flags = os.O_RDWR if self.writable else os.O_RDONLY
        fd = os.open(self._path, flags)
        try:
            if self.writable and os.fstat(fd).st_size != new_length:
                os.ftruncate(fd, new_length)
            if new_length > 0:
                with nogil:
                    p = mmap(NULL, <size_t>new_length,
                             PROT_READ | PROT_WRITE if self.writable else PROT_READ,
                             MAP_SHARED, fd, 0)
                if p == MAP_FAILED:
                    raise OSError(f"mmap of {self._path} ({new_length} bytes) failed")
                # Index access is random (binary search, one append slot): without this
                # the first touch of a page faults in a read-around window
                # (read_ahead_kb, 8 MiB on some disks) of a mostly sparse file: ~4 ms
                # of kernel time and megabytes of page cache per fresh index.
                madvise(p, <size_t>new_length, MADV_RANDOM)
                self._map = <unsigned char*>p
        finally:
            os.close(fd)
        self._length = new_length
        self._max_entries = new_length // self._entry_size
        if self._entries > self._max_entries:
            self._entries = self._max_entries
        return 0

    cdef void _unmap(self) noexcept:
        if self._map != NULL:
            munmap(self._map, <size_t>self._length)
            self._map = NULL
        self._anon = False

    cdef int _after_load(self) except -1:
        return 0

    cdef Py_ssize_t _capacity(self) noexcept:
        """Entries the index can hold: its mapping's, or max_index_size's if growable."""
        cdef Py_ssize_t grown
        if self.growable and self.writable:
            grown = round_down(self.max_index_size, self._entry_size) // self._entry_size
            if grown > self._max_entries:
                return grown
        return self._max_entries

    cdef int _reserve(self, Py_ssize_t n, bint exact) except -1:
        """Room for ``n`` more entries: a growable index whose mapping lacks it is
        extended (to max_index_size, or with ``exact`` to just those entries, for the
        final time-index entry of a segment about to be trimmed). Lock held, loaded."""
        cdef Py_ssize_t want
        if not self.growable or not self.writable or self._entries + n <= self._max_entries:
            return 0
        if exact:
            want = (self._entries + n) * self._entry_size
        else:
            want = round_down(self.max_index_size, self._entry_size)
        if want > self._length:
            self._remap(want)
        return 0

    cdef int _check_capacity(self, bint skip_full_check) except -1:
        if not self.writable:
            raise ValueError(f"index {self._path} is read-only")
        self._reserve(1, False)
        if self._entries >= self._max_entries:
            raise IndexFullError(f"attempt to append to a full index (size = {self._entries}) {self._path}")
        return 0

    cdef int _resize(self, Py_ssize_t new_size) except -1:
        self._ensure()
        cdef Py_ssize_t rounded = round_down(new_size, self._entry_size)
        if rounded == self._length:
            if self._anon:
                self._remap(rounded)        # same length, but now on disk
            return 0
        self._remap(rounded)
        return 1

    cdef void _close_handler(self) noexcept:
        self._unmap()
        self._loaded = False
        self._closed = True

    cpdef Py_ssize_t free_slots(self, Py_ssize_t reserve) except -1:
        """Slots still free for appends, ``reserve`` of them kept back (the writer's check)."""
        self._lock()
        try:
            self._ensure()
            if self._capacity() > self._max_entries:      # an entry is coming: grow now
                self._reserve(self._capacity() - self._entries, False)
            return self._max_entries - reserve - self._entries
        finally:
            self._unlock()

    # -- properties --------------------------------------------------------
    @property
    def path(self):
        return self._path

    @property
    def entry_size(self):
        return self._entry_size

    @property
    def is_loaded(self):
        return self._loaded

    @property
    def entries(self):
        self._lock()
        try:
            self._ensure()
            return self._entries
        finally:
            self._unlock()

    @property
    def max_entries(self):
        self._lock()
        try:
            self._ensure()
            return self._max_entries
        finally:
            self._unlock()

    @property
    def length(self):
        """Current file (and mapping) length in bytes, including pre-allocated slots."""
        self._lock()
        try:
            self._ensure()
            return self._length
        finally:
            self._unlock()

    @property
    def size_in_bytes(self):
        """Bytes of valid entries."""
        self._lock()
        try:
            self._ensure()
            return self._entries * self._entry_size
        finally:
            self._unlock()

    @property
    def is_full(self):
        self._lock()
        try:
            self._ensure()
            return self._entries >= self._capacity()
        finally:
            self._unlock()

    # -- maintenance ---------------------------------------------------------
    def resize(self, Py_ssize_t new_size):
        """Set the file length to ``new_size`` rounded down to the entry size,
        keeping valid entries that still fit. Returns True if the length changed."""
        self._lock()
        try:
            return self._resize(new_size) == 1
        finally:
            self._unlock()

    def trim_to_valid_size(self):
        """Shrink the file to exactly the valid entries (segment roll / close)."""
        self._lock()
        try:
            if not self._loaded:
                return False  # never mapped: the file already has its trimmed size
            return self._resize(self._entries * self._entry_size) == 1
        finally:
            self._unlock()

    def truncate(self):
        """Drop all entries (length unchanged)."""
        self._lock()
        try:
            self._ensure()
            self._entries = 0
            self._after_load()
        finally:
            self._unlock()

    def reset(self):
        """Drop all entries and re-extend the file to ``max_index_size``."""
        self._lock()
        try:
            self._ensure()
            self._entries = 0
            self._after_load()
            self._resize(self.max_index_size)
        finally:
            self._unlock()

    def flush(self):
        """msync the valid part of the mapping to disk."""
        self._lock()
        try:
            if self._anon:
                self._remap(self._length)   # the file, as it would have been
            if self._loaded and self._map != NULL and self.writable:
                with nogil:
                    msync(self._map, <size_t>self._length, MS_SYNC)
        finally:
            self._unlock()

    def close(self):
        """Trim (if writable and loaded) and unmap. Idempotent."""
        self._lock()
        try:
            if self._loaded and self.writable and (self._anon or os.path.exists(self._path)):
                self._resize(self._entries * self._entry_size)
            self._close_handler()
        finally:
            self._unlock()

    def close_handler(self):
        """Unmap without trimming; the object cannot be used again."""
        self._lock()
        self._close_handler()
        self._unlock()

    def rename_to(self, new_path):
        """Rename the file (the mapping stays valid)."""
        new_path = os.fspath(new_path)
        self._lock()
        try:
            if os.path.exists(self._path):
                os.replace(self._path, new_path)
            self._path = new_path
        finally:
            self._unlock()

    def delete_if_exists(self):
        """Unmap and unlink the file. Returns True if a file was deleted."""
        self._lock()
        try:
            self._close_handler()
            try:
                os.unlink(self._path)
                return True
            except FileNotFoundError:
                return False
        finally:
            self._unlock()

    def raw_entries(self):
        """A copy of the valid entries in on-disk format."""
        self._lock()
        try:
            self._ensure()
            if self._entries == 0:
                return b""
            return (<char*>self._map)[:self._entries * self._entry_size]
        finally:
            self._unlock()


cdef class OffsetIndex(MmapIndex):
    """Sparse offset → position index of one segment (see module docstring).

    Invariants: entries strictly increasing in offset; every relative offset
    fits in int32 and is >= 0; ``last_offset`` is ``base_offset`` when empty.
    """

    def __init__(self, path, int64_t base_offset, Py_ssize_t max_index_size=-1, bint writable=True):
        self._entry_size = ENTRY_SIZE
        MmapIndex.__init__(self, path, base_offset, max_index_size, writable)
        self._last_offset = base_offset

    cdef int _after_load(self) except -1:
        if self._entries == 0:
            self._last_offset = self.base_offset
        else:
            self._last_offset = self.base_offset + load_i32(self._map + (self._entries - 1) * ENTRY_SIZE)
        return 0

    @property
    def last_offset(self):
        self._lock()
        try:
            self._ensure()
            return self._last_offset
        finally:
            self._unlock()

    def sanity_check(self):
        """Raise CorruptIndexError if the file cannot be a valid offset index."""
        self._lock()
        try:
            self._ensure()
            if self._length % ENTRY_SIZE != 0:
                raise CorruptIndexError(
                    f"Index file {self._path} is corrupt, found {self._length} bytes which is "
                    f"neither positive nor a multiple of {ENTRY_SIZE}.")
            if self._entries != 0 and self._last_offset < self.base_offset:
                raise CorruptIndexError(
                    f"Corrupt index found, index file ({self._path}) has non-zero size but the last "
                    f"offset is {self._last_offset} which is less than the base offset {self.base_offset}.")
        finally:
            self._unlock()

    def lookup(self, int64_t target_offset):
        """(offset, position) of the largest entry with offset <= target_offset,
        or (base_offset, 0) if there is none."""
        cdef int64_t rel = target_offset - self.base_offset
        cdef Py_ssize_t slot
        cdef const unsigned char* p
        cdef int64_t off, pos
        if rel < 0:
            return (self.base_offset, 0)
        if rel > 0x7FFFFFFF:
            rel = 0x7FFFFFFF
        self._lock()
        try:
            self._ensure()
            slot = largest_lower_bound_slot(self._map, self._entries, ENTRY_SIZE, 0, False, rel)
            if slot < 0:
                off = self.base_offset
                pos = 0
            else:
                p = self._map + slot * ENTRY_SIZE
                off = self.base_offset + load_i32(p)
                pos = load_i32(p + 4)
        finally:
            self._unlock()
        return (off, pos)

    def entry(self, Py_ssize_t n):
        """(offset, position) of slot n."""
        cdef const unsigned char* p
        cdef int64_t off, pos
        self._lock()
        try:
            self._ensure()
            if n < 0 or n >= self._entries:
                raise IndexError(f"attempt to fetch the {n}th entry from index {self._path}, "
                                 f"which has size {self._entries}")
            p = self._map + n * ENTRY_SIZE
            off = self.base_offset + load_i32(p)
            pos = load_i32(p + 4)
        finally:
            self._unlock()
        return (off, pos)

    cdef int _append(self, int64_t offset, int64_t position) except -1:
        cdef int64_t rel = offset - self.base_offset
        if self._entries != 0 and offset <= self._last_offset:
            raise InvalidOffsetError(
                f"Attempt to append an offset ({offset}) to position {self._entries} no larger "
                f"than the last offset appended ({self._last_offset}) to {self._path}.")
        if rel < 0 or rel > 0x7FFFFFFF:
            raise InvalidOffsetError(f"offset {offset} does not fit in index {self._path} "
                                     f"with base offset {self.base_offset}")
        if position < 0 or position > 0x7FFFFFFF:
            raise InvalidOffsetError(f"position {position} out of int32 range")
        cdef unsigned char* p = self._map + self._entries * ENTRY_SIZE
        store_i32(p, <int32_t>rel)
        store_i32(p + 4, <int32_t>position)
        self._entries += 1
        self._last_offset = offset
        return 0

    def append(self, int64_t offset, int64_t position):
        """Add (offset, position); offset must exceed the last entry's."""
        self._lock()
        try:
            self._ensure()
            self._check_capacity(False)
            self._append(offset, position)
        finally:
            self._unlock()

    def append_raw(self, data):
        """Append entries given in on-disk format (from the log_scan kernel),
        checking capacity and strictly increasing offsets and positions."""
        cdef Py_buffer view
        cdef Py_ssize_t i, n
        cdef const unsigned char* p
        cdef int64_t prev_rel, prev_pos, rel, pos
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        self._lock()
        try:
            self._ensure()
            if view.len % ENTRY_SIZE != 0:
                raise InvalidOffsetError("raw index data is not a whole number of entries")
            n = view.len // ENTRY_SIZE
            if n == 0:
                return
            if not self.writable:
                raise ValueError(f"index {self._path} is read-only")
            self._reserve(n, False)
            if self._entries + n > self._max_entries:
                raise IndexFullError(f"{n} entries do not fit in index {self._path}")
            p = <const unsigned char*>view.buf
            if self._entries == 0:
                prev_rel = -1
                prev_pos = -1
            else:
                prev_rel = self._last_offset - self.base_offset
                prev_pos = load_i32(self._map + (self._entries - 1) * ENTRY_SIZE + 4)
            for i in range(n):
                rel = load_i32(p + i * ENTRY_SIZE)
                pos = load_i32(p + i * ENTRY_SIZE + 4)
                if rel <= prev_rel or pos <= prev_pos:
                    raise InvalidOffsetError(f"raw index entry {i} is not increasing")
                prev_rel = rel
                prev_pos = pos
            memcpy(self._map + self._entries * ENTRY_SIZE, p, n * ENTRY_SIZE)
            self._entries += n
            self._last_offset = self.base_offset + prev_rel
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
                slot = largest_lower_bound_slot(self._map, self._entries, ENTRY_SIZE, 0, False, rel)
                if slot < 0:
                    new_entries = 0
                elif load_i32(self._map + slot * ENTRY_SIZE) == rel:
                    new_entries = slot
                else:
                    new_entries = slot + 1
            self._entries = new_entries
            self._after_load()
        finally:
            self._unlock()

    def __repr__(self):
        return f"OffsetIndex({self._path!r}, base_offset={self.base_offset})"

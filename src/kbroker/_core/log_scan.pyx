# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Structure scans of a segment's ``.log``: recovery, offset search, append prep.

Parses only the fixed 61-byte RecordBatch v2 header (Kafka's
``DefaultRecordBatch``); records are never decoded here. Layout (big-endian)::

    off  size  field
      0     8  base_offset
      8     4  batch_length        (bytes after this field; batch size = 12 + batch_length)
     12     4  partition_leader_epoch      (not covered by the CRC)
     16     1  magic (= 2)
     17     4  crc (uint32, CRC-32C of bytes 21 .. end of batch)
     21     2  attributes
     23     4  last_offset_delta
     27     8  base_timestamp
     35     8  max_timestamp
     43     8  producer_id
     51     2  producer_epoch
     53     4  base_sequence
     57     4  records_count
     61     -  records

Functions:

* ``scan(buf, base_offset, ...)`` — recovery (Kafka's ``LogSegment.recover``):
  walks the batches of a buffer (an mmap of the ``.log``), checks structure
  and CRC, stops at the first invalid byte and reports the valid length plus
  the index entries Kafka's rules would have written. No copies.
* ``search_offset / search_timestamp / scan_headers(fd, ...)`` — header walks
  straight on the file with pread() into a 16 KiB window (the read path;
  Kafka's ``FileRecords.searchForOffsetWithSize`` / ``searchForTimestamp``).
* ``prepare_append(buf, ...)`` — the append path: checks the batch framing
  of validated batches, rewrites ``base_offset`` (and optionally
  ``partition_leader_epoch``) in place — neither is covered by the CRC — and
  computes the index entries the segment must add.
* ``append_batches(buf, fd, ...)`` — the whole append to the active segment in
  one call: ``prepare_append``, the roll conditions that depend on the
  batches, ``pwrite`` (GIL released, optional ``fdatasync``) and the index
  entries; nothing is written when the segment must roll first.

Not thread-safe with respect to the buffers passed in; holds no state.
"""
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int32_t, int64_t, uint32_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, strerror
from posix.types cimport off_t
from libc.errno cimport errno, EINTR
from posix.unistd cimport pread, pwrite, ftruncate, fdatasync

from kbroker._core.hton cimport load_i32, load_i64, load_u32, store_i32, store_i64
from kbroker._core.crc32c cimport crc32c_update
from kbroker._core.offset_index cimport MmapIndex
from kbroker._core.errors import CorruptRecordError

cdef enum:
    HEADER_SIZE = 61            # RECORD_BATCH_OVERHEAD
    LOG_OVERHEAD = 12           # base_offset + batch_length
    HEADER_UP_TO_MAGIC = 17
    MIN_BATCH_LENGTH = 49       # HEADER_SIZE - LOG_OVERHEAD
    CRC_START = 21
    WINDOW = 16384

cdef int64_t INT32_MAX = 0x7FFFFFFF

RECORD_BATCH_OVERHEAD = HEADER_SIZE


class ScanResult:
    """Outcome of ``scan``.

    valid_bytes: absolute end position of the last valid batch (== start if none);
    batch_count; first_offset / next_offset (-1 if no batch);
    max_timestamp / offset_of_max_timestamp (-1 if none);
    first_batch_max_timestamp (-1 if none);
    error: None if the scan ended exactly at ``end``, else why it stopped;
    offset_index_entries / time_index_entries: on-disk index entries
    (relative to base_offset) Kafka's recovery would write;
    epochs: [(leader_epoch, start_offset)] where the epoch increases.
    """
    __slots__ = ("valid_bytes", "batch_count", "first_offset", "next_offset", "max_timestamp",
                 "offset_of_max_timestamp", "first_batch_max_timestamp", "error",
                 "offset_index_entries", "time_index_entries", "epochs")

    def __repr__(self):
        return (f"ScanResult(valid_bytes={self.valid_bytes}, batch_count={self.batch_count}, "
                f"first_offset={self.first_offset}, next_offset={self.next_offset}, "
                f"max_timestamp={self.max_timestamp}, error={self.error!r})")


cdef struct Growable:
    unsigned char* data
    Py_ssize_t size
    Py_ssize_t cap


cdef int grow_put(Growable* g, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t cap
    cdef unsigned char* p
    if g.size + n > g.cap:
        cap = g.cap * 2 if g.cap else 1024
        while cap < g.size + n:
            cap *= 2
        p = <unsigned char*>realloc(g.data, cap)
        if p == NULL:
            return -1
        g.data = p
        g.cap = cap
    return 0


cdef enum ScanStop:
    STOP_END = 0
    STOP_SHORT_HEADER = 1
    STOP_SMALL_BATCH = 2
    STOP_PARTIAL = 3
    STOP_MAGIC = 4
    STOP_CRC = 5
    STOP_BAD_DELTA = 6
    STOP_OFFSET_ORDER = 7
    STOP_OFFSET_RANGE = 8
    STOP_BIG_BATCH = 9
    STOP_NOMEM = 10
    STOP_COUNT = 11

_STOP_MESSAGES = {
    STOP_SHORT_HEADER: "truncated batch header",
    STOP_SMALL_BATCH: "batch size below the v2 header size",
    STOP_PARTIAL: "batch extends past the end of the log (torn write)",
    STOP_MAGIC: "unsupported magic byte",
    STOP_CRC: "CRC mismatch",
    STOP_BAD_DELTA: "negative last_offset_delta",
    STOP_OFFSET_ORDER: "base offset not above the previous batch",
    STOP_OFFSET_RANGE: "offset outside the segment's 32-bit relative range",
    STOP_BIG_BATCH: "batch larger than the maximum batch size",
    STOP_NOMEM: "out of memory",
    STOP_COUNT: "negative record count",
}


def scan(buf, int64_t base_offset, Py_ssize_t index_interval_bytes=4096, bint verify_crc=True,
         Py_ssize_t start=0, Py_ssize_t end=-1, int64_t max_batch_size=0x7FFFFFFF,
         int64_t expected_next_offset=-1):
    """Walk the batches of ``buf[start:end]`` (see ScanResult).

    ``index_interval_bytes < 0`` disables index-entry generation.
    ``expected_next_offset``: the first batch's base offset must be >= this
    (default: ``base_offset``). Positions are absolute within ``buf``.
    """
    cdef Py_buffer view
    cdef Growable oi, ti
    cdef const unsigned char* p
    cdef const unsigned char* b
    cdef Py_ssize_t pos, remaining, size, last_index_pos
    cdef int64_t batch_length, bo, last, ts, rel, max_ts = -1, off_max_ts = -1
    cdef int64_t first_offset = -1, next_offset = -1, first_batch_max_ts = -1
    cdef int64_t floor_offset, last_time_entry_ts = -1, batch_count = 0
    cdef int32_t ple, last_epoch = -1
    cdef int stop = STOP_END
    cdef uint32_t crc
    epochs = []
    oi.data = NULL; oi.size = 0; oi.cap = 0
    ti.data = NULL; ti.size = 0; ti.cap = 0
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if end < 0 or end > view.len:
            end = view.len
        if start < 0 or start > end:
            raise ValueError(f"invalid scan range [{start}, {end}) of {view.len} bytes")
        p = <const unsigned char*>view.buf
        pos = start
        last_index_pos = start
        floor_offset = expected_next_offset if expected_next_offset >= 0 else base_offset
        # Epoch changes are rare: collect them with the GIL held, but run the
        # CRC-heavy loop without it.
        while True:
            with nogil:
                while True:
                    remaining = end - pos
                    if remaining == 0:
                        stop = STOP_END
                        break
                    if remaining < HEADER_UP_TO_MAGIC:
                        stop = STOP_SHORT_HEADER
                        break
                    b = p + pos
                    batch_length = load_i32(b + 8)
                    if batch_length < MIN_BATCH_LENGTH:
                        # Covers a torn header too: a short header cannot hold
                        # the magic, and zeros (pre-allocated tail) land here.
                        stop = STOP_SMALL_BATCH
                        break
                    size = LOG_OVERHEAD + batch_length
                    if batch_length > max_batch_size:
                        stop = STOP_BIG_BATCH
                        break
                    if size > remaining:
                        stop = STOP_PARTIAL
                        break
                    if b[16] != 2:
                        stop = STOP_MAGIC
                        break
                    if verify_crc:
                        crc = crc32c_update(0, b + CRC_START, <size_t>(size - CRC_START))
                        if crc != load_u32(b + 17):
                            stop = STOP_CRC
                            break
                    rel = load_i32(b + 23)
                    if rel < 0:
                        stop = STOP_BAD_DELTA
                        break
                    if load_i32(b + 57) < 0:
                        stop = STOP_COUNT
                        break
                    bo = load_i64(b)
                    last = bo + rel
                    if bo < floor_offset:
                        stop = STOP_OFFSET_ORDER
                        break
                    if last - base_offset > INT32_MAX:
                        stop = STOP_OFFSET_RANGE
                        break
                    ts = load_i64(b + 35)
                    if batch_count == 0:
                        first_offset = bo
                        first_batch_max_ts = ts
                    if ts > max_ts:
                        max_ts = ts
                        off_max_ts = last
                    if index_interval_bytes >= 0 and pos - last_index_pos > index_interval_bytes:
                        if grow_put(&oi, 8) < 0 or grow_put(&ti, 12) < 0:
                            stop = STOP_NOMEM
                            break
                        store_i32(oi.data + oi.size, <int32_t>(last - base_offset))
                        store_i32(oi.data + oi.size + 4, <int32_t>pos)
                        oi.size += 8
                        if max_ts > last_time_entry_ts:
                            store_i64(ti.data + ti.size, max_ts)
                            store_i32(ti.data + ti.size + 8, <int32_t>(off_max_ts - base_offset))
                            ti.size += 12
                            last_time_entry_ts = max_ts
                        last_index_pos = pos
                    floor_offset = last + 1
                    next_offset = last + 1
                    batch_count += 1
                    ple = load_i32(b + 12)
                    pos += size
                    if ple >= 0 and ple > last_epoch:
                        last_epoch = ple
                        stop = -1       # report the epoch change with the GIL
                        break
            if stop == -1:
                epochs.append((last_epoch, bo))
                continue
            break
        if stop == STOP_NOMEM:
            raise MemoryError()
        r = ScanResult()
        r.valid_bytes = pos
        r.batch_count = batch_count
        r.first_offset = first_offset
        r.next_offset = next_offset
        r.max_timestamp = max_ts
        r.offset_of_max_timestamp = off_max_ts
        r.first_batch_max_timestamp = first_batch_max_ts
        r.error = None if stop == STOP_END else f"{_STOP_MESSAGES[stop]} at position {pos}"
        r.offset_index_entries = PyBytes_FromStringAndSize(<char*>oi.data, oi.size) if oi.size else b""
        r.time_index_entries = PyBytes_FromStringAndSize(<char*>ti.data, ti.size) if ti.size else b""
        r.epochs = epochs
        return r
    finally:
        free(oi.data)
        free(ti.data)
        PyBuffer_Release(&view)


# -- header walks on a file descriptor -----------------------------------------

cdef struct Reader:
    int fd
    Py_ssize_t end
    Py_ssize_t win_start
    Py_ssize_t win_len
    unsigned char* win


cdef const unsigned char* reader_header(Reader* r, Py_ssize_t pos) noexcept nogil:
    """Pointer to the 61-byte header at ``pos``, or NULL if fewer than 61
    bytes of the file lie before ``end`` (or the read fails)."""
    cdef Py_ssize_t want, got
    if pos + HEADER_SIZE > r.end:
        return NULL
    if pos >= r.win_start and pos + HEADER_SIZE <= r.win_start + r.win_len:
        return r.win + (pos - r.win_start)
    want = r.end - pos
    if want > WINDOW:
        want = WINDOW
    got = pread(r.fd, r.win, <size_t>want, pos)
    if got < HEADER_SIZE:
        r.win_len = 0
        return NULL
    r.win_start = pos
    r.win_len = got
    return r.win


cdef inline bint header_ok(const unsigned char* h) noexcept nogil:
    return load_i32(h + 8) >= MIN_BATCH_LENGTH and h[16] == 2 and load_i32(h + 23) >= 0


def search_offset(int fd, Py_ssize_t start, Py_ssize_t end, int64_t target_offset):
    """First batch at/after byte ``start`` (before ``end``) whose last offset
    is >= target_offset: ``(base_offset, last_offset, position, size)`` or None."""
    cdef unsigned char win[WINDOW]
    cdef Reader r
    cdef const unsigned char* h
    cdef Py_ssize_t pos = start, size
    cdef int64_t bo, last
    cdef bint found = False
    r.fd = fd; r.end = end; r.win_start = 0; r.win_len = 0; r.win = win
    with nogil:
        while True:
            h = reader_header(&r, pos)
            if h == NULL or not header_ok(h):
                break
            size = LOG_OVERHEAD + load_i32(h + 8)
            if pos + size > end:
                break
            bo = load_i64(h)
            last = bo + load_i32(h + 23)
            if last >= target_offset:
                found = True
                break
            pos += size
    if found:
        return (bo, last, pos, size)
    return None


def search_timestamp(int fd, Py_ssize_t start, Py_ssize_t end, int64_t target_timestamp,
                     int64_t starting_offset):
    """First batch at/after ``start`` with max_timestamp >= target and last
    offset >= starting_offset: ``(base_offset, last_offset, position, size,
    max_timestamp)`` or None."""
    cdef unsigned char win[WINDOW]
    cdef Reader r
    cdef const unsigned char* h
    cdef Py_ssize_t pos = start, size
    cdef int64_t bo, last, ts
    cdef bint found = False
    r.fd = fd; r.end = end; r.win_start = 0; r.win_len = 0; r.win = win
    with nogil:
        while True:
            h = reader_header(&r, pos)
            if h == NULL or not header_ok(h):
                break
            size = LOG_OVERHEAD + load_i32(h + 8)
            if pos + size > end:
                break
            bo = load_i64(h)
            last = bo + load_i32(h + 23)
            ts = load_i64(h + 35)
            if ts >= target_timestamp and last >= starting_offset:
                found = True
                break
            pos += size
    if found:
        return (bo, last, pos, size, ts)
    return None


def scan_headers(int fd, Py_ssize_t start, Py_ssize_t end):
    """Walk headers from ``start`` to ``end`` without CRC checks.

    Returns ``(next_offset, batch_count, max_timestamp, offset_of_max_timestamp,
    first_batch_max_timestamp, valid_end)``; next_offset is -1 without batches.
    """
    cdef unsigned char win[WINDOW]
    cdef Reader r
    cdef const unsigned char* h
    cdef Py_ssize_t pos = start, size
    cdef int64_t last, ts, next_offset = -1, count = 0, max_ts = -1, off_max = -1, first_ts = -1
    r.fd = fd; r.end = end; r.win_start = 0; r.win_len = 0; r.win = win
    with nogil:
        while True:
            h = reader_header(&r, pos)
            if h == NULL or not header_ok(h):
                break
            size = LOG_OVERHEAD + load_i32(h + 8)
            if pos + size > end:
                break
            last = load_i64(h) + load_i32(h + 23)
            ts = load_i64(h + 35)
            if count == 0:
                first_ts = ts
            if ts > max_ts:
                max_ts = ts
                off_max = last
            next_offset = last + 1
            count += 1
            pos += size
    return (next_offset, count, max_ts, off_max, first_ts, pos)


# -- append path ----------------------------------------------------------------

def prepare_append(buf, int64_t next_offset, int32_t leader_epoch, int64_t segment_base_offset,
                   int64_t segment_position, int64_t bytes_since_last_index_entry,
                   int64_t index_interval_bytes, int64_t max_timestamp_so_far,
                   int64_t offset_of_max_timestamp_so_far, bint assign_offsets=True):
    """Prepare ``buf`` (whole v2 batches, already validated) for appending at
    ``segment_position`` of a segment.

    If ``assign_offsets``: rewrite each batch's base_offset so offsets run
    on from ``next_offset`` without gaps; else require base offsets >=
    next_offset (follower / recovery appends). If ``leader_epoch >= 0`` it is
    written into each batch's partition_leader_epoch. Both fields lie outside
    the CRC, so the batches stay valid. Raises CorruptRecordError if the
    framing is wrong (no partial batch, magic 2, sane lengths) and ValueError
    for a non-assigning append below ``next_offset``. Whether the offsets fit
    the segment's 32-bit relative range is the caller's roll decision.

    Returns ``(first_offset, next_offset, batch_count, max_timestamp,
    offset_of_max_timestamp, first_batch_max_timestamp,
    bytes_since_last_index_entry, entries)`` where max_timestamp /
    offset_of_max_timestamp are the segment's running maximum after the
    append and ``entries`` is None or a list of
    ``(offset, position, max_timestamp_so_far, offset_of_max_timestamp_so_far)``
    index entries to add (Kafka's per-batch rule in ``LogSegment.append``).
    """
    cdef Py_buffer view
    cdef unsigned char* p
    cdef unsigned char* b
    cdef Py_ssize_t pos = 0, n, size
    cdef int64_t batch_length, bo, last, ts, rel, first_offset = -1, count = 0, first_ts = -1
    cdef int64_t seg_pos = segment_position
    entries = None
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE | PyBUF_WRITABLE if assign_offsets or leader_epoch >= 0 else PyBUF_SIMPLE)
    try:
        p = <unsigned char*>view.buf
        n = view.len
        if n == 0:
            raise CorruptRecordError("empty append")
        while pos < n:
            if n - pos < HEADER_SIZE:
                raise CorruptRecordError(f"partial batch header at byte {pos} of {n}")
            b = p + pos
            batch_length = load_i32(b + 8)
            if batch_length < MIN_BATCH_LENGTH:
                raise CorruptRecordError(f"batch length {batch_length} below the v2 minimum at byte {pos}")
            size = LOG_OVERHEAD + batch_length
            if size > n - pos:
                raise CorruptRecordError(f"batch at byte {pos} of size {size} overruns the buffer ({n})")
            if b[16] != 2:
                raise CorruptRecordError(f"unsupported magic {b[16]} at byte {pos}")
            rel = load_i32(b + 23)
            if rel < 0:
                raise CorruptRecordError(f"negative last_offset_delta at byte {pos}")
            if assign_offsets:
                bo = next_offset
                store_i64(b, bo)
            else:
                bo = load_i64(b)
                if bo < next_offset:
                    raise ValueError(f"out of order offsets: batch base offset {bo} < next offset {next_offset}")
            last = bo + rel
            if leader_epoch >= 0:
                store_i32(b + 12, leader_epoch)
            ts = load_i64(b + 35)
            if count == 0:
                first_offset = bo
                first_ts = ts
            if ts > max_timestamp_so_far:
                max_timestamp_so_far = ts
                offset_of_max_timestamp_so_far = last
            if bytes_since_last_index_entry > index_interval_bytes:
                if entries is None:
                    entries = []
                entries.append((last, seg_pos, max_timestamp_so_far, offset_of_max_timestamp_so_far))
                bytes_since_last_index_entry = 0
            seg_pos += size
            bytes_since_last_index_entry += size
            next_offset = last + 1
            count += 1
            pos += size
        return (first_offset, next_offset, count, max_timestamp_so_far, offset_of_max_timestamp_so_far,
                first_ts, bytes_since_last_index_entry, entries)
    finally:
        PyBuffer_Release(&view)


def append_batches(buf, int fd, int64_t position, int64_t next_offset, int32_t leader_epoch,
                   int64_t segment_base_offset, int64_t bytes_since_last_index_entry,
                   int64_t index_interval_bytes, int64_t segment_max_timestamp,
                   int64_t segment_offset_of_max_timestamp, int64_t roll_after_timestamp,
                   MmapIndex offset_index not None, MmapIndex time_index not None,
                   bint assign_offsets=True, bint fsync=False):
    """Append whole v2 batches (already validated) at ``position`` of the active
    segment's ``.log`` (file descriptor ``fd``), in one call.

    Prepares the batches as :func:`prepare_append` does (offsets assigned from
    ``next_offset``, or checked; leader epoch stamped), then decides the roll
    conditions that depend on them (Kafka's ``LogSegment.shouldRoll``): the
    largest timestamp is above ``roll_after_timestamp`` (segment.ms counted from
    the segment's rolling timestamp; the caller checks size, age without
    timestamps and full indexes), or the last offset does not fit the segment's
    32-bit relative range, or an index has no room for this append's entries
    (the time index keeps its last slot, as Kafka's ``TimeIndex.isFull``). If
    so, returns None and writes nothing (the buffer's offsets may already be
    rewritten: preparing again gives the same bytes). So once the bytes are
    written, nothing can fail before the segment learns of them.

    Else ``pwrite`` s the bytes with the GIL released (``fdatasync`` after when
    ``fsync``) and adds the index entries to ``offset_index`` / ``time_index``
    (time entries carry the segment's running maximum, seeded with
    ``segment_max_timestamp`` / ``segment_offset_of_max_timestamp``). A failed
    write truncates the file back to ``position`` and raises OSError.

    Returns ``(first_offset, next_offset, batch_count, max_timestamp,
    offset_of_max_timestamp, bytes_since_last_index_entry,
    segment_max_timestamp, segment_offset_of_max_timestamp)``: the maxima of
    these batches alone, then the segment's running maxima after the append.
    """
    cdef Py_buffer view
    cdef unsigned char* p
    cdef unsigned char* b
    cdef Py_ssize_t pos = 0, n, size, done
    cdef ssize_t w
    cdef int64_t batch_length, bo, last, ts, rel, first_offset = -1, count = 0
    cdef int64_t seg_pos = position, max_ts = -1, off_max = -1
    cdef int64_t seg_max = segment_max_timestamp, seg_off = segment_offset_of_max_timestamp
    cdef int err = 0, i, n_entries = 0
    # index entries: (last offset, position, segment max ts, its offset); few per call
    cdef int64_t small[4][4]
    cdef int64_t* ent = &small[0][0]
    cdef int cap = 4
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE | PyBUF_WRITABLE if assign_offsets or leader_epoch >= 0 else PyBUF_SIMPLE)
    try:
        p = <unsigned char*>view.buf
        n = view.len
        if n == 0:
            raise CorruptRecordError("empty append")
        while pos < n:
            if n - pos < HEADER_SIZE:
                raise CorruptRecordError(f"partial batch header at byte {pos} of {n}")
            b = p + pos
            batch_length = load_i32(b + 8)
            if batch_length < MIN_BATCH_LENGTH:
                raise CorruptRecordError(f"batch length {batch_length} below the v2 minimum at byte {pos}")
            size = LOG_OVERHEAD + batch_length
            if size > n - pos:
                raise CorruptRecordError(f"batch at byte {pos} of size {size} overruns the buffer ({n})")
            if b[16] != 2:
                raise CorruptRecordError(f"unsupported magic {b[16]} at byte {pos}")
            rel = load_i32(b + 23)
            if rel < 0:
                raise CorruptRecordError(f"negative last_offset_delta at byte {pos}")
            if assign_offsets:
                bo = next_offset
                store_i64(b, bo)
            else:
                bo = load_i64(b)
                if bo < next_offset:
                    raise ValueError(f"out of order offsets: batch base offset {bo} < next offset {next_offset}")
            last = bo + rel
            if leader_epoch >= 0:
                store_i32(b + 12, leader_epoch)
            ts = load_i64(b + 35)
            if count == 0:
                first_offset = bo
            if ts > max_ts:
                max_ts = ts
                off_max = last
            if ts > seg_max:
                seg_max = ts
                seg_off = last
            if bytes_since_last_index_entry > index_interval_bytes:
                if n_entries == cap:
                    if ent == &small[0][0]:
                        ent = <int64_t*>malloc(cap * 2 * 4 * sizeof(int64_t))
                        if ent == NULL:
                            ent = &small[0][0]
                            raise MemoryError()
                        memcpy(ent, &small[0][0], cap * 4 * sizeof(int64_t))
                    else:
                        b = <unsigned char*>realloc(ent, cap * 2 * 4 * sizeof(int64_t))
                        if b == NULL:
                            raise MemoryError()
                        ent = <int64_t*>b
                    cap *= 2
                ent[n_entries * 4] = last
                ent[n_entries * 4 + 1] = seg_pos
                ent[n_entries * 4 + 2] = seg_max
                ent[n_entries * 4 + 3] = seg_off
                n_entries += 1
                bytes_since_last_index_entry = 0
            seg_pos += size
            bytes_since_last_index_entry += size
            next_offset = last + 1
            count += 1
            pos += size
        if (max_ts > roll_after_timestamp or next_offset - 1 - segment_base_offset > INT32_MAX
                or next_offset - 1 < segment_base_offset):
            return None
        if n_entries:
            # under each index's own lock (readers may be looking up concurrently)
            if offset_index.free_slots(0) < n_entries or time_index.free_slots(1) < n_entries:
                return None
        with nogil:
            done = 0
            while done < n:
                w = pwrite(fd, p + done, <size_t>(n - done), <off_t>(position + done))
                if w < 0:
                    if errno == EINTR:
                        continue
                    err = errno
                    break
                done += w
            if err == 0 and fsync and fdatasync(fd) != 0:
                err = errno
            if err != 0:
                ftruncate(fd, <off_t>position)
        if err != 0:
            raise OSError(err, strerror(err))
        for i in range(n_entries):
            offset_index.append(ent[i * 4], ent[i * 4 + 1])
            if ent[i * 4 + 2] >= 0:
                time_index.maybe_append(ent[i * 4 + 2], ent[i * 4 + 3])
        return (first_offset, next_offset, count, max_ts, off_max, bytes_since_last_index_entry,
                seg_max, seg_off)
    finally:
        if ent != &small[0][0]:
            free(ent)
        PyBuffer_Release(&view)

# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The log cleaner's offset map and record filter (Kafka's ``SkimpyOffsetMap``
and the ``MemoryRecords.filterTo`` work of ``LogCleaner.cleanInto``).

Cython kernel; the pure-Python twin ``kbroker/_core/ref/offset_map.py`` has
the same API, the same hash, the same probe sequence and writes the same bytes.

OffsetMap — key -> latest offset over the dirty section of a log, in a fixed
amount of memory::

    slot (24 bytes): uint64 h1 | uint64 h2 | int64 offset      (offset -1 = empty)
    slots = memory // 24; open addressing, linear probing from h1 % slots

``(h1, h2)`` is MurmurHash3_x64_128 (seed 0) of the key bytes. Keys are not
stored: two keys with the same 128-bit hash are one key to the map (Kafka
makes the same trade with a 16-byte MD5). For n distinct keys the chance of
any collision is about n^2 / 2^129 — for 10^9 keys, 1.5e-21. A collision can
only make the cleaner drop the older record of one of the two keys.

The map holds at most ``max_entries = int(slots * load_factor)`` keys (Kafka's
``log.cleaner.io.buffer.load.factor``, 0.9): ``build`` stops when it is full,
and the cleaner then cleans only the prefix it mapped (``latest_offset``).
At a 0.9 load, linear probing costs ~5.5 slot reads per hit and ~50 per miss,
but they are consecutive 24-byte slots (a few cache lines).

Record batch v2 header (Kafka's ``DefaultRecordBatch``), big-endian::

    off size field                     off size field
      0    8 base_offset                27    8 base_timestamp
      8    4 batch_length               35    8 max_timestamp
     12    4 partition_leader_epoch     43    8 producer_id
     16    1 magic (= 2)                51    2 producer_epoch
     17    4 crc (CRC-32C of 21..end)   53    4 base_sequence
     21    2 attributes                 57    4 records_count
     23    4 last_offset_delta          61    - records (maybe compressed)

attributes: bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control,
6 has delete horizon (KIP-534: base_timestamp then holds the delete horizon).

Record: varint length | int8 attributes | varlong timestamp_delta |
varint offset_delta | varint key_len | key | varint value_len | value |
varint header_count | headers. A null value (value_len -1) is a tombstone.

Every read is bounds-checked against its enclosing batch / record; CRCs are
verified before a batch is used (a rewritten batch gets a fresh CRC, so the
cleaner must never rewrite a corrupt one). Bad bytes raise CorruptRecordError.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport INT64_MAX, INT64_MIN, int16_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset

from kbroker._core.crc32c cimport crc32c_update
from kbroker._core.hton cimport load_i16, load_i32, load_i64, load_u32, store_i16, store_i32, store_i64, store_u32
from kbroker._core.varint cimport read_varint, read_varlong, size_of_varint, size_of_varlong, write_varint, write_varlong

from kbroker._core import compression as _compression
from kbroker._core.errors import CorruptRecordError

__all__ = ["OffsetMap", "filter_batches", "murmur3_128", "BYTES_PER_ENTRY", "DEFAULT_LOAD_FACTOR"]

cdef enum:
    ENTRY_SIZE = 24
    OVERHEAD = 61
    LOG_OVERHEAD = 12
    MIN_BATCH_LENGTH = 49
    PLE_OFFSET = 12
    MAGIC_OFFSET = 16
    CRC_OFFSET = 17
    ATTRIBUTES_OFFSET = 21
    LAST_OFFSET_DELTA_OFFSET = 23
    BASE_TIMESTAMP_OFFSET = 27
    MAX_TIMESTAMP_OFFSET = 35
    PRODUCER_ID_OFFSET = 43
    RECORD_COUNT_OFFSET = 57
    COMPRESSION_MASK = 0x07
    TIMESTAMP_TYPE_MASK = 0x08
    TRANSACTIONAL_MASK = 0x10
    CONTROL_MASK = 0x20
    DELETE_HORIZON_MASK = 0x40
    MIN_RECORD_SIZE = 7

BYTES_PER_ENTRY = ENTRY_SIZE
DEFAULT_LOAD_FACTOR = 0.9


# -- MurmurHash3_x64_128 (Austin Appleby, public domain), seed 0 -------------------

cdef inline uint64_t _rotl64(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t _fmix64(uint64_t k) noexcept nogil:
    k ^= k >> 33
    k *= 0xff51afd7ed558ccdULL
    k ^= k >> 33
    k *= 0xc4ceb9fe1a85ec53ULL
    k ^= k >> 33
    return k


cdef inline uint64_t _load_le64(const unsigned char* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(7, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef void _murmur3_128(const unsigned char* data, Py_ssize_t n, uint64_t* out1, uint64_t* out2) noexcept nogil:
    cdef uint64_t c1 = 0x87c37b91114253d5ULL
    cdef uint64_t c2 = 0x4cf5ad432745937fULL
    cdef uint64_t h1 = 0, h2 = 0, k1, k2
    cdef Py_ssize_t nblocks = n // 16, i
    cdef const unsigned char* tail
    cdef int rem, j
    for i in range(nblocks):
        k1 = _load_le64(data + i * 16)
        k2 = _load_le64(data + i * 16 + 8)
        k1 *= c1
        k1 = _rotl64(k1, 31)
        k1 *= c2
        h1 ^= k1
        h1 = _rotl64(h1, 27)
        h1 += h2
        h1 = h1 * 5 + 0x52dce729
        k2 *= c2
        k2 = _rotl64(k2, 33)
        k2 *= c1
        h2 ^= k2
        h2 = _rotl64(h2, 31)
        h2 += h1
        h2 = h2 * 5 + 0x38495ab5
    tail = data + nblocks * 16
    rem = <int>(n & 15)
    k1 = 0
    k2 = 0
    if rem > 8:
        for j in range(rem - 1, 7, -1):
            k2 ^= (<uint64_t>tail[j]) << ((j - 8) * 8)
        k2 *= c2
        k2 = _rotl64(k2, 33)
        k2 *= c1
        h2 ^= k2
    if rem > 0:
        for j in range((rem if rem < 8 else 8) - 1, -1, -1):
            k1 ^= (<uint64_t>tail[j]) << (j * 8)
        k1 *= c1
        k1 = _rotl64(k1, 31)
        k1 *= c2
        h1 ^= k1
    h1 ^= <uint64_t>n
    h2 ^= <uint64_t>n
    h1 += h2
    h2 += h1
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 += h2
    h2 += h1
    out1[0] = h1
    out2[0] = h2


def murmur3_128(key) -> tuple:
    """(h1, h2) of MurmurHash3_x64_128(key, seed 0) as unsigned 64-bit ints."""
    cdef Py_buffer view
    cdef uint64_t h1, h2
    PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
    try:
        _murmur3_128(<const unsigned char*>view.buf, view.len, &h1, &h2)
    finally:
        PyBuffer_Release(&view)
    return (h1, h2)


# -- the map ------------------------------------------------------------------------

cdef struct Slot:
    uint64_t h1
    uint64_t h2
    int64_t offset


@cython.final
cdef class OffsetMap:
    """Key hash -> latest offset in ``memory`` bytes (see the module docstring).

    Not thread-safe: one per cleaner thread. ``latest_offset`` is the last
    offset put or set by ``update_latest_offset`` (-1 after ``clear``): the
    end (inclusive) of the log prefix the map describes.
    """
    cdef Slot* _slots
    cdef Py_ssize_t _n
    cdef Py_ssize_t _entries
    cdef Py_ssize_t _max_entries
    cdef int64_t _latest
    cdef readonly double load_factor
    cdef readonly uint64_t lookups
    cdef readonly uint64_t probes

    def __cinit__(self, Py_ssize_t memory, double load_factor=0.9):
        if memory < ENTRY_SIZE:
            raise ValueError(f"offset map memory {memory} is below one {ENTRY_SIZE}-byte slot")
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load factor {load_factor} must be in (0, 1]")
        self._n = memory // ENTRY_SIZE
        self._slots = <Slot*>PyMem_Malloc(self._n * sizeof(Slot))
        if self._slots == NULL:
            raise MemoryError(f"cannot allocate an offset map of {memory} bytes")
        self.load_factor = load_factor
        self._max_entries = <Py_ssize_t>(self._n * load_factor)
        self.clear()

    def __dealloc__(self):
        PyMem_Free(self._slots)

    def clear(self) -> None:
        """Forget every key; latest_offset becomes -1."""
        memset(self._slots, 0xFF, self._n * sizeof(Slot))   # offset -1 = empty
        self._entries = 0
        self._latest = -1
        self.lookups = 0
        self.probes = 0

    @property
    def slots(self) -> int:
        return self._n

    @property
    def size(self) -> int:
        """Distinct keys (hashes) held."""
        return self._entries

    def __len__(self):
        return self._entries

    @property
    def max_entries(self) -> int:
        """Keys ``build`` will put before reporting the map full (slots * load_factor)."""
        return self._max_entries

    @property
    def is_full(self) -> bool:
        return self._entries >= self._max_entries

    @property
    def utilization(self) -> float:
        return self._entries / <double>self._n

    @property
    def latest_offset(self) -> int:
        return self._latest

    def update_latest_offset(self, int64_t offset) -> None:
        self._latest = offset

    cdef inline Slot* _find(self, uint64_t h1, uint64_t h2) noexcept nogil:
        """The slot holding (h1, h2), or the empty slot where it would go
        (NULL only if the table is full and the hash is absent)."""
        cdef Py_ssize_t i = <Py_ssize_t>(h1 % <uint64_t>self._n)
        cdef Py_ssize_t tries = 0
        cdef Slot* s
        self.lookups += 1
        while tries < self._n:
            s = &self._slots[i]
            self.probes += 1
            if s.offset < 0 or (s.h1 == h1 and s.h2 == h2):
                return s
            i += 1
            if i == self._n:
                i = 0
            tries += 1
        return NULL

    cdef inline int _put_hash(self, uint64_t h1, uint64_t h2, int64_t offset) except -1:
        cdef Slot* s = self._find(h1, h2)
        if s == NULL:
            raise ValueError("Attempt to add a new entry to a full offset map.")
        if s.offset < 0:
            s.h1 = h1
            s.h2 = h2
            self._entries += 1
        s.offset = offset
        self._latest = offset
        return 0

    cdef inline int64_t _get_hash(self, uint64_t h1, uint64_t h2) noexcept nogil:
        cdef Slot* s = self._find(h1, h2)
        if s == NULL:
            return -1
        return s.offset

    def put(self, key, int64_t offset) -> None:
        """Map ``key`` (bytes-like) to ``offset`` and make it latest_offset.
        ValueError if the key is new and every slot is taken."""
        cdef uint64_t h1, h2
        if offset < 0:
            raise ValueError(f"offset {offset} must be >= 0")
        cdef Py_buffer view
        PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
        try:
            _murmur3_128(<const unsigned char*>view.buf, view.len, &h1, &h2)
        finally:
            PyBuffer_Release(&view)
        self._put_hash(h1, h2, offset)

    def get(self, key) -> int:
        """The offset mapped to ``key``, or -1."""
        cdef uint64_t h1, h2
        cdef Py_buffer view
        PyObject_GetBuffer(key, &view, PyBUF_SIMPLE)
        try:
            _murmur3_128(<const unsigned char*>view.buf, view.len, &h1, &h2)
        finally:
            PyBuffer_Release(&view)
        return self._get_hash(h1, h2)

    def build(self, buf, int64_t start_offset) -> tuple:
        """Put the keys of the complete batches in ``buf`` (whole v2 batches
        from position 0, as read from a segment) — Kafka's buildOffsetMapForSegment.

        Records with a key and offset >= ``start_offset`` are put in log
        order; control batches are skipped; after each batch whose last
        offset is >= start_offset, latest_offset becomes that last offset.
        Stops before putting a key into a full map. An incomplete batch at
        the end is left for the next call.

        Returns ``(full, bytes_consumed, records_read)``; when full,
        bytes_consumed is the position of the batch that did not fit and
        latest_offset the last offset put.
        """
        cdef _View v = _View(buf)
        cdef const unsigned char* p = v.ptr
        cdef Py_ssize_t n = v.size, pos = 0, size, rpos, rend, kpos
        cdef int64_t base, last, off
        cdef int32_t count, i, klen
        cdef int16_t attrs
        cdef uint64_t h1, h2
        cdef Py_ssize_t records_read = 0
        cdef RecordView r
        cdef object data
        cdef const unsigned char* sec
        while True:
            size = _batch_size(p, pos, n)
            if size == 0:
                break
            base = load_i64(p + pos)
            last = base + load_i32(p + pos + LAST_OFFSET_DELTA_OFFSET)
            if last < start_offset:
                pos += size
                continue
            attrs = load_i16(p + pos + ATTRIBUTES_OFFSET)
            if not (attrs & CONTROL_MASK):
                data = _records_section(p, pos, size, attrs)
                if data is None:
                    rpos = pos + OVERHEAD
                    rend = pos + size
                    sec = p
                else:
                    rpos = 0
                    rend = PyBytes_GET_SIZE(data)
                    sec = <const unsigned char*>PyBytes_AS_STRING(data)
                count = load_i32(p + pos + RECORD_COUNT_OFFSET)
                _check_count(count, rend - rpos)
                for i in range(count):
                    rpos = _read_record(sec, rpos, rend, &r)
                    if rpos < 0:
                        raise CorruptRecordError(f"invalid record {i} in the batch at offset {base}")
                    records_read += 1
                    off = base + r.offset_delta
                    if r.key_len >= 0 and off >= start_offset:
                        if self._entries >= self._max_entries:
                            return (True, pos, records_read - 1)
                        _murmur3_128(sec + r.key_pos, r.key_len, &h1, &h2)
                        self._put_hash(h1, h2, off)
                if rpos != rend:
                    raise CorruptRecordError(f"bytes left after the records of the batch at offset {base}")
            self._latest = last
            pos += size
        return (False, pos, records_read)


# -- raw buffer helpers -------------------------------------------------------------

@cython.final
cdef class _View:
    cdef Py_buffer view
    cdef const unsigned char* ptr
    cdef Py_ssize_t size
    cdef bint acquired

    def __cinit__(self, object obj):
        PyObject_GetBuffer(obj, &self.view, PyBUF_SIMPLE)
        self.acquired = True
        self.ptr = <const unsigned char*>self.view.buf
        self.size = self.view.len

    def __dealloc__(self):
        if self.acquired:
            PyBuffer_Release(&self.view)


cdef Py_ssize_t _batch_size(const unsigned char* p, Py_ssize_t pos, Py_ssize_t n) except -1:
    """Size of the complete batch at ``pos``, 0 if the buffer ends first
    (an incomplete batch). Checks magic and CRC."""
    cdef int32_t blen
    cdef Py_ssize_t size
    if n - pos < LOG_OVERHEAD:
        return 0
    blen = load_i32(p + pos + 8)
    if blen < MIN_BATCH_LENGTH:
        raise CorruptRecordError(f"record batch length {blen} is too small at position {pos}")
    size = LOG_OVERHEAD + <Py_ssize_t>blen
    if size > n - pos:
        return 0
    if p[pos + MAGIC_OFFSET] != 2:
        raise CorruptRecordError(f"unsupported magic {p[pos + MAGIC_OFFSET]} at position {pos}")
    if load_i32(p + pos + LAST_OFFSET_DELTA_OFFSET) < 0:
        raise CorruptRecordError(f"negative last_offset_delta at position {pos}")
    if crc32c_update(0, p + pos + ATTRIBUTES_OFFSET, <size_t>(size - ATTRIBUTES_OFFSET)) != load_u32(p + pos + CRC_OFFSET):
        raise CorruptRecordError(f"record batch at offset {load_i64(p + pos)} has a bad CRC")
    return size


cdef object _records_section(const unsigned char* p, Py_ssize_t pos, Py_ssize_t size, int16_t attrs):
    """None if the records are in place, else the decompressed records (bytes)."""
    cdef int codec = attrs & COMPRESSION_MASK
    if codec == 0:
        return None
    return _compression.decompress(codec, PyBytes_FromStringAndSize(<const char*>p + pos + OVERHEAD,
                                                                   size - OVERHEAD))


cdef int _check_count(int32_t count, Py_ssize_t nbytes) except -1:
    if count < 0 or count > nbytes // MIN_RECORD_SIZE:
        raise CorruptRecordError(f"record count {count} does not fit in {nbytes} bytes")
    return 0


cdef struct RecordView:
    Py_ssize_t start       # position of the length varint
    Py_ssize_t ts_pos      # position of the timestamp delta
    Py_ssize_t after_ts    # position after the timestamp delta
    int64_t ts_delta
    int32_t offset_delta
    Py_ssize_t key_pos
    int32_t key_len        # -1: null key
    bint null_value


cdef Py_ssize_t _read_record(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end,
                             RecordView* r) noexcept nogil:
    """Parse the record at ``pos`` up to its value length; returns the
    position after the record (from its length), -1 if malformed."""
    cdef int32_t length, vlen
    cdef Py_ssize_t rend
    r.start = pos
    pos = read_varint(buf, pos, end, &length)
    if pos < 0 or length < 6 or length > end - pos:
        return -1
    rend = pos + length
    pos += 1                                          # attributes
    r.ts_pos = pos
    pos = read_varlong(buf, pos, rend, &r.ts_delta)
    if pos < 0:
        return -1
    r.after_ts = pos
    pos = read_varint(buf, pos, rend, &r.offset_delta)
    if pos < 0 or r.offset_delta < 0:
        return -1
    pos = read_varint(buf, pos, rend, &r.key_len)
    if pos < 0 or r.key_len < -1 or r.key_len > rend - pos:
        return -1
    r.key_pos = pos
    if r.key_len > 0:
        pos += r.key_len
    pos = read_varint(buf, pos, rend, &vlen)
    if pos < 0 or vlen < -1 or vlen > rend - pos:
        return -1
    r.null_value = vlen < 0
    return rend


# -- growable output ------------------------------------------------------------------

cdef struct OutBuf:
    unsigned char* data
    Py_ssize_t len
    Py_ssize_t cap


cdef int _reserve(OutBuf* o, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap
    cdef unsigned char* d
    if o.len + extra <= o.cap:
        return 0
    cap = o.cap * 2 if o.cap else 65536
    while cap < o.len + extra:
        cap *= 2
    d = <unsigned char*>PyMem_Realloc(o.data, cap)
    if d == NULL:
        raise MemoryError()
    o.data = d
    o.cap = cap
    return 0


cdef int _append(OutBuf* o, const unsigned char* src, Py_ssize_t n) except -1:
    _reserve(o, n)
    memcpy(o.data + o.len, src, n)
    o.len += n
    return 0


cdef int _write_record(OutBuf* o, const unsigned char* sec, RecordView* r, Py_ssize_t rend,
                       int64_t ts_shift) except -1:
    """Copy one record; with ts_shift != 0 re-encode its timestamp delta as
    ts_delta + ts_shift (and its length)."""
    cdef int64_t nd
    cdef int32_t body
    if ts_shift == 0:
        return _append(o, sec + r.start, rend - r.start)
    nd = <int64_t>(<uint64_t>r.ts_delta + <uint64_t>ts_shift)   # wraps like Java's long
    body = <int32_t>(1 + size_of_varlong(nd) + (rend - r.after_ts))
    _reserve(o, 5 + body)
    o.len += write_varint(o.data + o.len, body)
    o.data[o.len] = sec[r.ts_pos - 1]                  # record attributes
    o.len += 1
    o.len += write_varlong(o.data + o.len, nd)
    memcpy(o.data + o.len, sec + r.after_ts, rend - r.after_ts)
    o.len += rend - r.after_ts
    return 0


cdef inline int64_t _sat_add(int64_t a, int64_t b) noexcept nogil:
    if b > 0 and a > INT64_MAX - b:
        return INT64_MAX
    return a + b


def filter_batches(buf, OffsetMap offset_map, int64_t now_ms, int64_t delete_retention_ms,
                   retain_empty=None) -> tuple:
    """Copy what survives compaction of the complete batches in ``buf`` (Kafka's
    cleanInto / MemoryRecords.filterTo with the cleaner's RecordFilter).

    A record survives if its offset is past ``offset_map.latest_offset``, or
    it has a key whose mapped offset is not above its own and it has a value
    or is a tombstone still inside its batch's delete horizon. Keyless
    records at or below latest_offset are dropped. Control batches are kept
    whole (transactions: seam).

    Surviving batches keep base_offset, last_offset_delta (so the batch's
    next offset, and the producer's last sequence, stay), producer
    id/epoch, base_sequence, leader epoch, codec; each record keeps its
    offset delta. A batch that keeps every record and needs no new delete
    horizon is copied byte for byte. The first time a batch keeps a
    tombstone it gets the delete horizon ``now_ms + delete_retention_ms``
    (attribute bit 6, stored as base_timestamp; record timestamp deltas are
    re-encoded). A CreateTime batch's max_timestamp becomes the max of the
    kept records. A batch left empty is dropped, unless ``retain_empty``
    ({producer_id: last data offset of an active producer}) says it is that
    producer's last batch: then its 61-byte header stays with 0 records.

    Returns ``(output bytes, bytes_consumed, records_read, records_kept)``;
    an incomplete batch at the end of ``buf`` is left unconsumed.
    """
    cdef _View v = _View(buf)
    cdef const unsigned char* p = v.ptr
    cdef const unsigned char* sec
    cdef const unsigned char* h
    cdef Py_ssize_t n = v.size, pos = 0, size, rpos, rend, sec_start, sec_end, hdr
    cdef int64_t base, last, off, latest = offset_map._latest, found, horizon, base_ts, shift
    cdef int64_t max_ts, ts, pid
    cdef int32_t count, i, kept
    cdef int16_t attrs, new_attrs
    cdef int codec
    cdef bint has_horizon, need_horizon, keep, lat
    cdef uint64_t h1, h2
    cdef Py_ssize_t records_read = 0, records_kept = 0
    cdef RecordView r
    cdef OutBuf out
    cdef OutBuf tmp
    cdef OutBuf* dst
    cdef unsigned char* hb
    cdef unsigned char* flags = NULL
    cdef Py_ssize_t flags_cap = 0
    cdef object data, packed, want
    out.data = NULL; out.len = 0; out.cap = 0
    tmp.data = NULL; tmp.len = 0; tmp.cap = 0
    try:
        while True:
            size = _batch_size(p, pos, n)
            if size == 0:
                break
            h = p + pos
            attrs = load_i16(h + ATTRIBUTES_OFFSET)
            if attrs & CONTROL_MASK:
                _append(&out, h, size)
                pos += size
                continue
            base = load_i64(h)
            last = base + load_i32(h + LAST_OFFSET_DELTA_OFFSET)
            count = load_i32(h + RECORD_COUNT_OFFSET)
            base_ts = load_i64(h + BASE_TIMESTAMP_OFFSET)
            has_horizon = (attrs & DELETE_HORIZON_MASK) != 0
            lat = (attrs & TIMESTAMP_TYPE_MASK) != 0
            codec = attrs & COMPRESSION_MASK
            data = _records_section(p, pos, size, attrs)
            if data is None:
                sec = p
                sec_start = pos + OVERHEAD
                sec_end = pos + size
            else:
                sec = <const unsigned char*>PyBytes_AS_STRING(data)
                sec_start = 0
                sec_end = PyBytes_GET_SIZE(data)
            _check_count(count, sec_end - sec_start)
            if count > flags_cap:
                PyMem_Free(flags)
                flags = <unsigned char*>PyMem_Malloc(count)
                if flags == NULL:
                    flags_cap = 0
                    raise MemoryError()
                flags_cap = count
            # pass 1: decide
            kept = 0
            need_horizon = False
            rpos = sec_start
            for i in range(count):
                rpos = _read_record(sec, rpos, sec_end, &r)
                if rpos < 0:
                    raise CorruptRecordError(f"invalid record {i} in the batch at offset {base}")
                off = base + r.offset_delta
                if off > latest:
                    keep = True
                elif r.key_len < 0:
                    keep = False
                else:
                    _murmur3_128(sec + r.key_pos, r.key_len, &h1, &h2)
                    found = offset_map._get_hash(h1, h2)
                    keep = off >= found and (not r.null_value or not has_horizon or now_ms < base_ts)
                if keep:
                    kept += 1
                    if r.null_value:
                        need_horizon = True
                flags[i] = keep
            if rpos != sec_end:
                raise CorruptRecordError(f"bytes left after the records of the batch at offset {base}")
            records_read += count
            records_kept += kept
            need_horizon = need_horizon and not has_horizon
            if kept == count and not need_horizon:
                _append(&out, h, size)
            elif kept > 0:
                if need_horizon:
                    horizon = _sat_add(now_ms, delete_retention_ms)
                    shift = <int64_t>(<uint64_t>base_ts - <uint64_t>horizon)
                    new_attrs = attrs | DELETE_HORIZON_MASK
                else:
                    horizon = base_ts
                    shift = 0
                    new_attrs = attrs
                hdr = out.len
                _reserve(&out, OVERHEAD)
                memcpy(out.data + hdr, h, OVERHEAD)
                out.len += OVERHEAD
                if codec == 0:
                    dst = &out
                else:
                    tmp.len = 0
                    dst = &tmp
                max_ts = INT64_MIN
                rpos = sec_start
                for i in range(count):
                    rend = _read_record(sec, rpos, sec_end, &r)
                    if flags[i]:
                        _write_record(dst, sec, &r, rend, shift)
                        ts = <int64_t>(<uint64_t>base_ts + <uint64_t>r.ts_delta)
                        if ts > max_ts:
                            max_ts = ts
                    rpos = rend
                if codec != 0:
                    packed = _compression.compress(codec, PyBytes_FromStringAndSize(<const char*>tmp.data, tmp.len))
                    _append(&out, <const unsigned char*>PyBytes_AS_STRING(packed), PyBytes_GET_SIZE(packed))
                hb = out.data + hdr
                store_i32(hb + 8, <int32_t>(out.len - hdr - LOG_OVERHEAD))
                store_i16(hb + ATTRIBUTES_OFFSET, new_attrs)
                store_i64(hb + BASE_TIMESTAMP_OFFSET, horizon)
                if not lat:
                    store_i64(hb + MAX_TIMESTAMP_OFFSET, max_ts)
                store_i32(hb + RECORD_COUNT_OFFSET, kept)
                store_u32(hb + CRC_OFFSET, crc32c_update(0, hb + ATTRIBUTES_OFFSET,
                                                         <size_t>(out.len - hdr - ATTRIBUTES_OFFSET)))
            else:
                pid = load_i64(h + PRODUCER_ID_OFFSET)
                if pid >= 0 and retain_empty is not None:
                    want = retain_empty.get(pid)
                    if want is not None and want == last:
                        _write_empty_header(&out, h, attrs)
            pos += size
        result = PyBytes_FromStringAndSize(<const char*>out.data, out.len) if out.len else b""
        return (result, pos, records_read, records_kept)
    finally:
        PyMem_Free(out.data)
        PyMem_Free(tmp.data)
        PyMem_Free(flags)


cdef int _write_empty_header(OutBuf* o, const unsigned char* h, int16_t attrs) except -1:
    """Kafka's DefaultRecordBatch.writeEmptyHeader: same base offset, last
    offset delta, producer id/epoch/sequence, leader epoch, max timestamp;
    no codec, no delete horizon, base_timestamp -1, 0 records."""
    cdef Py_ssize_t hdr = o.len
    cdef unsigned char* hb
    _reserve(o, OVERHEAD)
    memcpy(o.data + hdr, h, OVERHEAD)
    o.len += OVERHEAD
    hb = o.data + hdr
    store_i32(hb + 8, MIN_BATCH_LENGTH)
    store_i16(hb + ATTRIBUTES_OFFSET, <int16_t>(attrs & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK)))
    store_i64(hb + BASE_TIMESTAMP_OFFSET, -1)
    store_i32(hb + RECORD_COUNT_OFFSET, 0)
    store_u32(hb + CRC_OFFSET, crc32c_update(0, hb + ATTRIBUTES_OFFSET, OVERHEAD - ATTRIBUTES_OFFSET))
    return 0

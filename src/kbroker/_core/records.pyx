# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Kafka record batches (magic 2) and legacy message sets (magic 0/1).

Cython kernel; the pure-Python twin ``kbroker/_core/ref/records.py`` has the
same API, writes the same bytes and raises the same error classes. The
wire layouts (record batch v2 header table, record, legacy message) are
documented at the top of the twin; Kafka's classes are
``org.apache.kafka.common.record.DefaultRecordBatch``, ``DefaultRecord`` and
``LegacyRecord``.

Every read from a buffer is bounds-checked against the end of its enclosing
structure (batch, record) first; counts from the wire are checked against
the bytes left before anything is allocated for them.
"""
cimport cython
from cpython.buffer cimport (PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release,
                             PyObject_GetBuffer)
from cpython.bytes cimport (PyBytes_AS_STRING, PyBytes_CheckExact,
                            PyBytes_FromStringAndSize, PyBytes_GET_SIZE)
from cpython.list cimport PyList_Append, PyList_New
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.ref cimport Py_INCREF
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport (INT32_MAX, INT64_MAX, INT64_MIN, int8_t, int16_t,
                          int32_t, int64_t, uint32_t, uint64_t)
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset

from kbroker._core.crc32c cimport crc32c_update
from kbroker._core.hton cimport (load_i16, load_i32, load_i64, load_u32,
                                 store_i16, store_i32, store_i64, store_u32)
from kbroker._core.varint cimport (read_varint, read_varlong, size_of_varint,
                                   size_of_varlong, write_varint,
                                   write_varlong)

import zlib
from collections import namedtuple

from kbroker._core import compression as _compression
from kbroker._core.errors import UnsupportedMagicError
from kbroker._core.errors import (CorruptRecordError, InvalidRecordError,
                                  ProduceRecordsError, UnsupportedCompressionError)

cdef extern from "Python.h":
    # steals a reference to the item; the slot must be empty (NULL)
    void PyList_SET_ITEM(object, Py_ssize_t, object)

__all__ = [
    "NO_COMPRESSION", "GZIP", "SNAPPY", "LZ4", "ZSTD",
    "TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME", "NO_TIMESTAMP",
    "RECORD_BATCH_OVERHEAD", "NO_PRODUCER_ID", "NO_PRODUCER_EPOCH",
    "NO_SEQUENCE", "NO_PARTITION_LEADER_EPOCH",
    "RECORD_ERROR_NO_KEY", "RECORD_ERROR_TIMESTAMP", "RECORD_ERROR_LOG_APPEND_TIME",
    "RECORD_ERROR_KEY_SCHEMA", "RECORD_ERROR_VALUE_SCHEMA", "SCHEMA_KEY", "SCHEMA_VALUE",
    "CorruptRecordError", "InvalidRecordError", "UnsupportedCompressionError",
    "UnsupportedMagicError", "ProduceRecordsError",
    "Record", "RecordBatch", "LegacyBatch", "BatchInfo", "BatchBuilder",
    "encode_batch", "decode_batch", "decode_batches", "iter_batches",
    "validate_batches", "produce_records_error", "set_base_offset", "set_partition_leader_epoch",
    "set_log_append_time", "set_max_timestamp", "assign_offsets",
]

NO_COMPRESSION = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4
TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1
NO_TIMESTAMP = -1
RECORD_BATCH_OVERHEAD = 61
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

cdef enum:
    OVERHEAD = 61
    LOG_OVERHEAD = 12
    LENGTH_OFFSET = 8
    PLE_OFFSET = 12
    MAGIC_OFFSET = 16
    CRC_OFFSET = 17
    ATTRIBUTES_OFFSET = 21
    LAST_OFFSET_DELTA_OFFSET = 23
    BASE_TIMESTAMP_OFFSET = 27
    MAX_TIMESTAMP_OFFSET = 35
    PRODUCER_ID_OFFSET = 43
    PRODUCER_EPOCH_OFFSET = 51
    BASE_SEQUENCE_OFFSET = 53
    RECORD_COUNT_OFFSET = 57
    MIN_RECORD_SIZE = 7
    LEGACY_HEADER_V0 = 14
    LEGACY_HEADER_V1 = 22
    COMPRESSION_MASK = 0x07
    TIMESTAMP_TYPE_MASK = 0x08
    TRANSACTIONAL_MASK = 0x10
    CONTROL_MASK = 0x20
    DELETE_HORIZON_MASK = 0x40

# record error kinds (validate_batches' BatchInfo.record_errors)
cdef enum:
    RECORD_NO_KEY = 1
    RECORD_TIMESTAMP_OUT_OF_RANGE = 2
    RECORD_LOG_APPEND_TIME_SET = 3
    RECORD_KEY_NO_SCHEMA = 4
    RECORD_VALUE_NO_SCHEMA = 5

RECORD_ERROR_NO_KEY = RECORD_NO_KEY
RECORD_ERROR_TIMESTAMP = RECORD_TIMESTAMP_OUT_OF_RANGE
RECORD_ERROR_LOG_APPEND_TIME = RECORD_LOG_APPEND_TIME_SET
RECORD_ERROR_KEY_SCHEMA = RECORD_KEY_NO_SCHEMA
RECORD_ERROR_VALUE_SCHEMA = RECORD_VALUE_NO_SCHEMA
SCHEMA_KEY = 0      # BatchInfo.schema_ids kinds
SCHEMA_VALUE = 1

# record walk results
cdef enum:
    W_OK = 0
    W_VARINT
    W_REC_SIZE
    W_OFFSET_DELTA
    W_KEY_LEN
    W_VALUE_LEN
    W_HDR_COUNT
    W_HDR_KEY_LEN
    W_HDR_VALUE_LEN
    W_REC_MISMATCH
    W_TRAILING
    W_UTF8
    W_NOMEM

cdef tuple _WALK_MESSAGES = (
    "ok", "truncated or over-long varint in record", "invalid record size",
    "record offset delta not contiguous", "invalid key length",
    "invalid value length", "invalid header count", "invalid header key length",
    "invalid header value length", "record length does not match its fields",
    "bytes left after the batch's records", "header key is not valid UTF-8", "out of memory",
)

BatchInfo = namedtuple("BatchInfo", [
    "position", "size_in_bytes", "last_offset_delta", "record_count",
    "base_timestamp", "max_timestamp", "timestamp_type", "compression",
    "producer_id", "producer_epoch", "base_sequence", "is_transactional",
    "is_control", "partition_leader_epoch",
    "min_record_timestamp", "max_record_timestamp", "has_null_key",
    "record_errors", "schema_ids",
])
BatchInfo.__doc__ = """What ``validate_batches`` learned about one v2 batch
(see the twin, kbroker._core.ref.records.BatchInfo)."""
_tuple_new = tuple.__new__


cdef inline uint32_t _crc32c(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    return crc32c_update(0, p, <size_t>n)


cdef inline int64_t _wrap_add(int64_t a, int64_t b) noexcept nogil:
    # two's complement wrap-around, as Java's long arithmetic
    return <int64_t>(<uint64_t>a + <uint64_t>b)


@cython.final
cdef class _Buf:
    """Holds a buffer export for its lifetime (released on dealloc)."""
    cdef Py_buffer view
    cdef const unsigned char* ptr
    cdef Py_ssize_t size
    cdef bint acquired

    def __cinit__(self, object obj, bint writable=False):
        PyObject_GetBuffer(obj, &self.view,
                           PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
        self.acquired = True
        self.ptr = <const unsigned char*>self.view.buf
        self.size = self.view.len

    def __dealloc__(self):
        if self.acquired:
            PyBuffer_Release(&self.view)


cdef _Buf _get_buf(object obj):
    return _Buf(obj, False)


cdef _Buf _get_writable(object obj):
    try:
        return _Buf(obj, True)
    except BufferError as e:
        raise TypeError(f"buffer is read-only: {e}") from None


# -- value objects ------------------------------------------------------------

@cython.final
@cython.freelist(512)
@cython.no_gc
cdef class Record:
    """One decoded record. ``offset`` is absolute (base_offset + delta);
    ``timestamp`` is absolute ms (the batch's max_timestamp for LogAppendTime
    batches, -1 for magic 0); key/value are bytes or None; headers is a list
    of (str, bytes | None).

    Not tracked by the cyclic GC (it holds only bytes, ints and a list of
    (str, bytes) pairs): decoding 1,000 records would otherwise trigger a
    gen-0 collection. A record with no headers stores None and hands out a
    fresh empty list, saving one list per record on the common path.
    """

    cdef readonly int64_t offset
    cdef readonly int64_t timestamp
    cdef readonly object key
    cdef readonly object value
    cdef list _headers

    def __init__(self, int64_t offset, int64_t timestamp, key, value, list headers):
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self._headers = headers if headers else None

    @property
    def headers(self):
        if self._headers is None:
            return []
        return self._headers

    def _astuple(self):
        return (self.offset, self.timestamp, self.key, self.value, self.headers)

    def __richcmp__(self, other, int op):
        if op not in (2, 3):
            return NotImplemented
        if not hasattr(other, "headers") or not hasattr(other, "offset"):
            return NotImplemented
        eq = self._astuple() == (other.offset, other.timestamp, other.key,
                                 other.value, other.headers)
        return eq if op == 2 else not eq

    __hash__ = None

    def __repr__(self):
        return (f"Record(offset={self.offset!r}, timestamp={self.timestamp!r}, "
                f"key={self.key!r}, value={self.value!r}, headers={self.headers!r})")


cdef class _BatchBase:
    cdef readonly int64_t base_offset
    cdef readonly int32_t batch_length
    cdef readonly int8_t magic
    cdef readonly uint32_t crc
    cdef readonly int16_t attributes
    cdef readonly list records
    cdef bint _crc_valid

    @property
    def size_in_bytes(self):
        return self.batch_length + LOG_OVERHEAD

    @property
    def compression(self):
        return self.attributes & COMPRESSION_MASK

    def is_valid(self):
        """True if the stored CRC matches the batch bytes."""
        return self._crc_valid

    def validate(self):
        """Raise CorruptRecordError unless the stored CRC matches."""
        if not self._crc_valid:
            raise CorruptRecordError(
                f"record batch at offset {self.base_offset} has a bad CRC")

    def __iter__(self):
        return iter(self.records)

    def __len__(self):
        return len(self.records)


@cython.final
cdef class RecordBatch(_BatchBase):
    """A decoded record batch v2 (magic 2). Immutable after decode; the
    records are decoded (and decompressed) eagerly by ``decode_batch``."""

    cdef readonly int32_t partition_leader_epoch
    cdef readonly int32_t last_offset_delta
    cdef readonly int64_t base_timestamp
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t producer_id
    cdef readonly int16_t producer_epoch
    cdef readonly int32_t base_sequence
    cdef readonly int32_t record_count

    @property
    def timestamp_type(self):
        return (self.attributes >> 3) & 1

    @property
    def is_transactional(self):
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self):
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self):
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def last_offset(self):
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self):
        return self.base_offset + self.last_offset_delta + 1

    def __repr__(self):
        return (f"RecordBatch(base_offset={self.base_offset}, "
                f"record_count={self.record_count}, "
                f"compression={self.compression}, size={self.size_in_bytes})")


@cython.final
cdef class LegacyBatch(_BatchBase):
    """One top-level magic 0/1 message: a plain message (one record) or a
    compressed wrapper whose value holds an inner message set. Offers the
    same attributes as RecordBatch (producer fields are -1, not
    transactional, not control)."""

    cdef readonly int64_t timestamp
    cdef int64_t _last_offset

    partition_leader_epoch = NO_PARTITION_LEADER_EPOCH
    producer_id = NO_PRODUCER_ID
    producer_epoch = NO_PRODUCER_EPOCH
    base_sequence = NO_SEQUENCE
    is_transactional = False
    is_control = False

    @property
    def timestamp_type(self):
        return (self.attributes >> 3) & 1 if self.magic > 0 else -1

    @property
    def record_count(self):
        return len(self.records)

    @property
    def base_timestamp(self):
        return self.timestamp

    @property
    def max_timestamp(self):
        return self.timestamp

    @property
    def last_offset_delta(self):
        return self._last_offset - self.base_offset

    @property
    def last_offset(self):
        return self._last_offset

    @property
    def next_offset(self):
        return self._last_offset + 1

    def __repr__(self):
        return (f"LegacyBatch(magic={self.magic}, offset={self._last_offset}, "
                f"record_count={len(self.records)}, compression={self.compression})")


# -- record walking -------------------------------------------------------------

cdef struct WalkStats:
    int64_t min_delta
    int64_t max_delta
    bint has_null_key
    int32_t n_errors       # records that fail the RecordChecks


cdef struct IdSet


cdef struct RecordChecks:
    # Kafka's LogValidator.validateRecord for one batch: enabled only on a leader append
    bint enabled
    bint compacted         # a record without a key is an error
    bint create_time       # the topic's message.timestamp.type is CreateTime
    bint batch_log_append  # the batch's timestamp type bit: records carry its max_timestamp
    int64_t base_ts
    int64_t header_max_ts
    int64_t now
    int64_t before_max
    int64_t after_max
    bint key_schema        # non-null keys must carry the schema-registry header (ids into *ids)
    bint value_schema      # likewise for values
    IdSet* ids


# -- schema-registry framing (kbroker.key/value.schema.validation) ---------------

cdef enum:
    IDSET_INLINE = 16

cdef struct IdSet:
    # the distinct (kind << 32 | id) + 1 codes seen in one batch: open addressing, 0 = empty
    uint64_t* slots
    Py_ssize_t cap         # a power of two; kept under half full
    Py_ssize_t n
    uint64_t last          # the last key added: most batches carry one id
    uint64_t inline_slots[IDSET_INLINE]


@cython.final
cdef class _IdSet:
    """Owns an IdSet (its grown table is freed on dealloc)."""
    cdef IdSet s

    def __cinit__(self):
        self.s.slots = self.s.inline_slots
        self.reset()

    cdef void reset(self) noexcept:
        if self.s.slots != self.s.inline_slots:
            free(self.s.slots)
            self.s.slots = self.s.inline_slots
        memset(self.s.inline_slots, 0, sizeof(self.s.inline_slots))
        self.s.cap = IDSET_INLINE
        self.s.n = 0
        self.s.last = 0

    cdef tuple items(self):
        """((kind, schema id), ...) sorted."""
        cdef Py_ssize_t i
        cdef uint64_t k
        out = []
        for i in range(self.s.cap):
            k = self.s.slots[i]
            if k:
                k -= 1
                out.append((<int>(k >> 32), <int32_t><uint32_t>(k & 0xFFFFFFFFu)))
        out.sort()
        return tuple(out)

    def __dealloc__(self):
        if self.s.slots != self.s.inline_slots:
            free(self.s.slots)


cdef inline Py_ssize_t _idset_slot(const uint64_t* slots, Py_ssize_t mask, uint64_t key) noexcept nogil:
    cdef Py_ssize_t i = <Py_ssize_t>((key * <uint64_t>0x9E3779B97F4A7C15u) >> 40) & mask
    while slots[i] != 0 and slots[i] != key:
        i = (i + 1) & mask
    return i


cdef int _idset_add(IdSet* s, uint64_t code) noexcept nogil:
    """Add ``code`` (kind << 32 | id); -1 when the table cannot grow."""
    cdef uint64_t key = code + 1
    cdef Py_ssize_t i, j
    cdef uint64_t* grown
    if key == s.last:
        return 0
    s.last = key
    i = _idset_slot(s.slots, s.cap - 1, key)
    if s.slots[i] == key:
        return 0
    s.slots[i] = key
    s.n += 1
    if s.n * 2 > s.cap:
        grown = <uint64_t*>calloc(s.cap * 2, sizeof(uint64_t))
        if grown == NULL:
            return -1
        for j in range(s.cap):
            if s.slots[j]:
                grown[_idset_slot(grown, s.cap * 2 - 1, s.slots[j])] = s.slots[j]
        if s.slots != s.inline_slots:
            free(s.slots)
        s.slots = grown
        s.cap *= 2
    return 0


cdef inline int64_t _schema_header(const unsigned char* p, int32_t n, int32_t* sid) noexcept nogil:
    """Confluent's wire format: magic byte 0, then the schema id (4 bytes, big-endian).
    -1 when ``p[:n]`` starts with it (the id in ``sid``), else what is wrong: the first
    byte (1..255) or 256 + n when fewer than 5 bytes."""
    if n < 5:
        return 256 + n
    if p[0] != 0:
        return p[0]
    sid[0] = load_i32(p + 1)
    return -1


cdef inline int _record_error(const RecordChecks* ck, bint null_key,
                              int64_t ts) noexcept nogil:
    """The RECORD_* error kind of one record, 0 if it passes (key first, then
    timestamp, as LogValidator.validateRecord; Java long arithmetic wraps)."""
    cdef int64_t diff
    if ck.compacted and null_key:
        return RECORD_NO_KEY
    if ck.create_time and ts != -1:
        diff = <int64_t>(<uint64_t>ck.now - <uint64_t>ts)
        if diff > ck.before_max or <int64_t>(0 - <uint64_t>diff) > ck.after_max:
            return RECORD_TIMESTAMP_OUT_OF_RANGE
    elif ck.batch_log_append:
        return RECORD_LOG_APPEND_TIME_SET
    return 0


cdef int _scan_records(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end,
                       int32_t count, WalkStats* st, const RecordChecks* ck,
                       int32_t* err_index, int8_t* err_kind, int64_t* err_ts) noexcept nogil:
    """Check the framing of ``count`` records in buf[pos:end] and that their
    offset deltas are 0,1,2..; no objects built. Returns a W_* code. With
    ``ck.enabled``, also applies ``ck`` to each record as it is walked (the
    same single pass) and counts failures in ``st.n_errors``; when
    ``err_index``/``err_kind``/``err_ts`` are given (room for every failure),
    the failing records' indexes, kinds and timestamps are stored there too
    (a schema-header failure stores what is wrong instead of the timestamp, see
    ``_schema_header``). With ``ck.key_schema``/``ck.value_schema``, each non-null
    key/value's schema-registry header is checked and its id added to ``ck.ids``."""
    cdef int32_t i, length, off_delta, klen, vlen, nh, hklen, hvlen, j
    cdef int64_t ts_delta
    cdef Py_ssize_t rend
    cdef int kind
    cdef int64_t ts, kbad, vbad
    cdef int32_t sid
    st.min_delta = INT64_MAX
    st.max_delta = INT64_MIN
    st.has_null_key = False
    st.n_errors = 0
    for i in range(count):
        pos = read_varint(buf, pos, end, &length)
        if pos < 0:
            return W_VARINT
        if length < 6 or length > end - pos:
            return W_REC_SIZE
        rend = pos + length
        pos += 1  # attributes (unused)
        pos = read_varlong(buf, pos, rend, &ts_delta)
        if pos < 0:
            return W_VARINT
        pos = read_varint(buf, pos, rend, &off_delta)
        if pos < 0:
            return W_VARINT
        if off_delta != i:
            return W_OFFSET_DELTA
        kbad = vbad = -1
        pos = read_varint(buf, pos, rend, &klen)
        if pos < 0:
            return W_VARINT
        if klen < 0:
            if klen != -1:
                return W_KEY_LEN
            st.has_null_key = True
        else:
            if klen > rend - pos:
                return W_KEY_LEN
            if ck.key_schema:
                kbad = _schema_header(buf + pos, klen, &sid)
                if kbad < 0 and _idset_add(ck.ids, <uint32_t>sid) < 0:
                    return W_NOMEM
            pos += klen
        pos = read_varint(buf, pos, rend, &vlen)
        if pos < 0:
            return W_VARINT
        if vlen < 0:
            if vlen != -1:
                return W_VALUE_LEN
        else:
            if vlen > rend - pos:
                return W_VALUE_LEN
            if ck.value_schema:
                vbad = _schema_header(buf + pos, vlen, &sid)
                if vbad < 0 and _idset_add(ck.ids, (<uint64_t>1 << 32) | <uint32_t>sid) < 0:
                    return W_NOMEM
            pos += vlen
        pos = read_varint(buf, pos, rend, &nh)
        if pos < 0:
            return W_VARINT
        if nh < 0 or nh > (rend - pos) // 2:
            return W_HDR_COUNT
        for j in range(nh):
            pos = read_varint(buf, pos, rend, &hklen)
            if pos < 0:
                return W_VARINT
            if hklen < 0 or hklen > rend - pos:
                return W_HDR_KEY_LEN
            pos += hklen
            pos = read_varint(buf, pos, rend, &hvlen)
            if pos < 0:
                return W_VARINT
            if hvlen < 0:
                if hvlen != -1:
                    return W_HDR_VALUE_LEN
            else:
                if hvlen > rend - pos:
                    return W_HDR_VALUE_LEN
                pos += hvlen
        if pos != rend:
            return W_REC_MISMATCH
        if ts_delta < st.min_delta:
            st.min_delta = ts_delta
        if ts_delta > st.max_delta:
            st.max_delta = ts_delta
        if ck.enabled:
            ts = ck.header_max_ts if ck.batch_log_append else _wrap_add(ck.base_ts, ts_delta)
            kind = _record_error(ck, klen < 0, ts)
            if kind == 0 and kbad >= 0:
                kind, ts = RECORD_KEY_NO_SCHEMA, kbad
            elif kind == 0 and vbad >= 0:
                kind, ts = RECORD_VALUE_NO_SCHEMA, vbad
            if kind:
                if err_index != NULL:
                    err_index[st.n_errors] = i
                    err_kind[st.n_errors] = <int8_t>kind
                    err_ts[st.n_errors] = ts
                st.n_errors += 1
    if pos != end:
        return W_TRAILING
    return W_OK


cdef inline object _take_bytes(const unsigned char* buf, Py_ssize_t pos, int32_t n):
    return PyBytes_FromStringAndSize(<const char*>buf + pos, n)


cdef int _decode_records(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end,
                         int32_t count, int64_t base_offset, int64_t base_ts,
                         bint log_append, int64_t max_ts, list out) except -1:
    """Decode ``count`` records in buf[pos:end] into ``out``, a fresh
    PyList_New(count) whose slots are all empty; on error the unfilled slots
    get None before raising. Offset deltas may have gaps (compacted
    batches)."""
    cdef int32_t i, length, off_delta, klen, vlen, nh, hklen, hvlen, j
    cdef int64_t ts_delta
    cdef Py_ssize_t rend
    cdef int err = W_OK
    cdef int32_t filled = 0
    cdef Record rec
    cdef object key, value, hkey, hval
    cdef list headers
    for i in range(count):
        pos = read_varint(buf, pos, end, &length)
        if pos < 0:
            err = W_VARINT; break
        if length < 6 or length > end - pos:
            err = W_REC_SIZE; break
        rend = pos + length
        pos += 1
        pos = read_varlong(buf, pos, rend, &ts_delta)
        if pos < 0:
            err = W_VARINT; break
        pos = read_varint(buf, pos, rend, &off_delta)
        if pos < 0:
            err = W_VARINT; break
        pos = read_varint(buf, pos, rend, &klen)
        if pos < 0:
            err = W_VARINT; break
        if klen < 0:
            if klen != -1:
                err = W_KEY_LEN; break
            key = None
        else:
            if klen > rend - pos:
                err = W_KEY_LEN; break
            key = _take_bytes(buf, pos, klen)
            pos += klen
        pos = read_varint(buf, pos, rend, &vlen)
        if pos < 0:
            err = W_VARINT; break
        if vlen < 0:
            if vlen != -1:
                err = W_VALUE_LEN; break
            value = None
        else:
            if vlen > rend - pos:
                err = W_VALUE_LEN; break
            value = _take_bytes(buf, pos, vlen)
            pos += vlen
        pos = read_varint(buf, pos, rend, &nh)
        if pos < 0:
            err = W_VARINT; break
        if nh < 0 or nh > (rend - pos) // 2:
            err = W_HDR_COUNT; break
        headers = PyList_New(0) if nh else None
        for j in range(nh):
            pos = read_varint(buf, pos, rend, &hklen)
            if pos < 0:
                err = W_VARINT; break
            if hklen < 0 or hklen > rend - pos:
                err = W_HDR_KEY_LEN; break
            try:
                hkey = PyUnicode_DecodeUTF8(<const char*>buf + pos, hklen, NULL)
            except UnicodeDecodeError:
                err = W_UTF8; break
            pos += hklen
            pos = read_varint(buf, pos, rend, &hvlen)
            if pos < 0:
                err = W_VARINT; break
            if hvlen < 0:
                if hvlen != -1:
                    err = W_HDR_VALUE_LEN; break
                hval = None
            else:
                if hvlen > rend - pos:
                    err = W_HDR_VALUE_LEN; break
                hval = _take_bytes(buf, pos, hvlen)
                pos += hvlen
            PyList_Append(headers, (hkey, hval))
        if err != W_OK:
            break
        if pos != rend:
            err = W_REC_MISMATCH; break
        rec = Record.__new__(Record)
        rec.offset = _wrap_add(base_offset, off_delta)
        rec.timestamp = max_ts if log_append else _wrap_add(base_ts, ts_delta)
        rec.key = key
        rec.value = value
        rec._headers = headers
        Py_INCREF(rec)  # PyList_SET_ITEM steals a reference
        PyList_SET_ITEM(out, i, rec)
        filled += 1
    if err != W_OK:
        # slots filled..count-1 are still NULL: fill them so the list is valid
        for j in range(filled, count):
            Py_INCREF(None)
            PyList_SET_ITEM(out, j, None)
        raise InvalidRecordError(_WALK_MESSAGES[err])
    if pos != end:
        raise InvalidRecordError(_WALK_MESSAGES[W_TRAILING])
    return 0


cdef object _records_section(const unsigned char* buf, Py_ssize_t pos,
                             Py_ssize_t batch_end, int16_t attributes,
                             int32_t count):
    """None for an uncompressed batch (records are in place), else the
    decompressed records as bytes. Checks ``count`` against the bytes."""
    cdef int codec = attributes & COMPRESSION_MASK
    cdef Py_ssize_t start = pos + OVERHEAD
    cdef object data = None
    cdef Py_ssize_t n
    if codec == 0:
        n = batch_end - start
    else:
        if codec > 4:
            raise UnsupportedCompressionError(f"unknown compression codec id {codec}")
        data = _compression.decompress(
            codec, PyBytes_FromStringAndSize(<const char*>buf + start, batch_end - start))
        n = len(data)
    if count < 0 or count > n // MIN_RECORD_SIZE:
        raise InvalidRecordError(f"record count {count} does not fit in {n} bytes")
    return data


cdef int _check_v2_frame(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end) except -1:
    cdef int32_t batch_length
    if end - pos < OVERHEAD:
        raise CorruptRecordError(
            f"record batch truncated: {end - pos} bytes at position {pos}")
    batch_length = load_i32(buf + pos + LENGTH_OFFSET)
    if batch_length < OVERHEAD - LOG_OVERHEAD:
        raise CorruptRecordError(f"record batch length {batch_length} is too small")
    if batch_length > end - pos - LOG_OVERHEAD:
        raise CorruptRecordError(
            f"record batch length {batch_length} beyond the {end - pos} bytes left")
    return 0


cdef RecordBatch _decode_v2(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end,
                            bint check_crc):
    _check_v2_frame(buf, pos, end)
    cdef const unsigned char* p = buf + pos
    cdef RecordBatch b = RecordBatch.__new__(RecordBatch)
    b.base_offset = load_i64(p)
    b.batch_length = load_i32(p + LENGTH_OFFSET)
    b.partition_leader_epoch = load_i32(p + PLE_OFFSET)
    b.magic = <int8_t>p[MAGIC_OFFSET]
    b.crc = load_u32(p + CRC_OFFSET)
    b.attributes = load_i16(p + ATTRIBUTES_OFFSET)
    b.last_offset_delta = load_i32(p + LAST_OFFSET_DELTA_OFFSET)
    b.base_timestamp = load_i64(p + BASE_TIMESTAMP_OFFSET)
    b.max_timestamp = load_i64(p + MAX_TIMESTAMP_OFFSET)
    b.producer_id = load_i64(p + PRODUCER_ID_OFFSET)
    b.producer_epoch = load_i16(p + PRODUCER_EPOCH_OFFSET)
    b.base_sequence = load_i32(p + BASE_SEQUENCE_OFFSET)
    b.record_count = load_i32(p + RECORD_COUNT_OFFSET)
    cdef Py_ssize_t batch_end = pos + LOG_OVERHEAD + b.batch_length
    b._crc_valid = _crc32c(p + ATTRIBUTES_OFFSET,
                           b.batch_length + LOG_OVERHEAD - ATTRIBUTES_OFFSET) == b.crc
    if check_crc and not b._crc_valid:
        raise CorruptRecordError(
            f"record batch at offset {b.base_offset} has a bad CRC")
    data = _records_section(buf, pos, batch_end, b.attributes, b.record_count)
    cdef list out = PyList_New(b.record_count)
    cdef bint lat = (b.attributes & TIMESTAMP_TYPE_MASK) != 0
    if data is None:
        _decode_records(buf, pos + OVERHEAD, batch_end, b.record_count,
                        b.base_offset, b.base_timestamp, lat, b.max_timestamp, out)
    else:
        _decode_records(<const unsigned char*>PyBytes_AS_STRING(data), 0,
                        PyBytes_GET_SIZE(data), b.record_count,
                        b.base_offset, b.base_timestamp, lat, b.max_timestamp, out)
    b.records = out
    return b


def decode_batch(buf, *, bint check_crc=True):
    """Decode the single record batch v2 at the start of ``buf`` (bytes-like;
    bytes after the batch are ignored). Decompresses and decodes all records.
    Raises CorruptRecordError (or a subclass) on bad input."""
    cdef _Buf b = _get_buf(buf)
    if b.size >= MAGIC_OFFSET + 1 and b.ptr[MAGIC_OFFSET] != 2:
        raise CorruptRecordError(
            f"decode_batch wants magic 2, found {b.ptr[MAGIC_OFFSET]}")
    return _decode_v2(b.ptr, 0, b.size, check_crc)


# -- legacy ---------------------------------------------------------------------

cdef tuple _legacy_message(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end,
                           bint check_crc):
    """(offset, size, crc, magic, attributes, timestamp, key, value, crc_valid)
    of the magic 0/1 message at ``pos``."""
    cdef int64_t offset, timestamp
    cdef int32_t size, n
    cdef uint32_t crc
    cdef int magic, attributes, header
    cdef Py_ssize_t mend, p
    cdef bint valid
    if end - pos < LOG_OVERHEAD + LEGACY_HEADER_V0:
        raise CorruptRecordError("legacy message truncated")
    offset = load_i64(buf + pos)
    size = load_i32(buf + pos + 8)
    crc = load_u32(buf + pos + 12)
    magic = <int8_t>buf[pos + 16]
    attributes = <int8_t>buf[pos + 17]
    if magic != 0 and magic != 1:
        raise CorruptRecordError(f"invalid magic {magic} in legacy message")
    header = LEGACY_HEADER_V0 if magic == 0 else LEGACY_HEADER_V1
    if size < header or size > end - pos - LOG_OVERHEAD:
        raise CorruptRecordError(f"invalid legacy message size {size}")
    mend = pos + LOG_OVERHEAD + size
    valid = (zlib.crc32(PyBytes_FromStringAndSize(
        <const char*>buf + pos + MAGIC_OFFSET, mend - pos - MAGIC_OFFSET)) & 0xFFFFFFFF) == crc
    if check_crc and not valid:
        raise CorruptRecordError(f"legacy message at offset {offset} has a bad CRC")
    p = pos + 18
    if magic == 1:
        timestamp = load_i64(buf + p)
        p += 8
    else:
        timestamp = -1
    fields = []
    for what in ("key", "value"):
        if mend - p < 4:
            raise CorruptRecordError(f"legacy message {what} length truncated")
        n = load_i32(buf + p)
        p += 4
        if n < 0:
            if n != -1:
                raise CorruptRecordError(f"invalid legacy {what} length {n}")
            fields.append(None)
        else:
            if n > mend - p:
                raise CorruptRecordError(f"legacy {what} length {n} beyond message")
            fields.append(_take_bytes(buf, p, n))
            p += n
    if p != mend:
        raise CorruptRecordError("legacy message size does not match its fields")
    return (offset, size, crc, magic, attributes, timestamp, fields[0], fields[1], valid)


cdef LegacyBatch _decode_legacy(const unsigned char* buf, Py_ssize_t pos,
                                Py_ssize_t end, bint check_crc):
    m = _legacy_message(buf, pos, end, check_crc)
    offset, size, crc, magic, attributes, timestamp, key, value, valid = m
    cdef int codec = attributes & COMPRESSION_MASK
    log_append = magic == 1 and (attributes & TIMESTAMP_TYPE_MASK)
    records = []
    last_offset = offset
    cdef Py_ssize_t ipos, iend
    cdef _Buf ib
    if codec == 0:
        records.append(Record(offset, timestamp, key, value, []))
        base = offset
    else:
        if codec > 3:
            raise UnsupportedCompressionError(
                f"codec id {codec} is not valid for magic {magic}")
        if value is None:
            raise CorruptRecordError("compressed legacy wrapper has a null value")
        inner = _compression.decompress(codec, value)
        ib = _get_buf(inner)
        ipos = 0
        iend = ib.size
        entries = []
        while ipos < iend:
            im = _legacy_message(ib.ptr, ipos, iend, check_crc)
            if im[4] & COMPRESSION_MASK:
                raise CorruptRecordError("nested compressed legacy message")
            if im[3] != magic:
                raise CorruptRecordError("inner message magic differs from the wrapper's")
            entries.append(im)
            ipos += LOG_OVERHEAD + <int32_t>im[1]
        if not entries:
            raise CorruptRecordError("compressed legacy wrapper with no messages")
        # (a wrapper offset of 0 is produce data not yet given offsets by a
        # broker: inner offsets are then used as they are, as Kafka does)
        shift = offset - entries[len(entries) - 1][0] if magic == 1 and offset != 0 else 0
        for im in entries:
            ts = timestamp if log_append else im[5]
            records.append(Record(im[0] + shift, ts, im[6], im[7], []))
        base = records[0].offset
        last_offset = records[len(records) - 1].offset if magic == 1 else offset
    cdef LegacyBatch b = LegacyBatch.__new__(LegacyBatch)
    b.base_offset = base
    b.batch_length = size
    b.magic = magic
    b.crc = crc
    b.attributes = attributes
    b.timestamp = timestamp
    b.records = records
    b._crc_valid = valid
    b._last_offset = last_offset
    return b


cdef list _decode_all(object buf, bint check_crc):
    cdef _Buf b = _get_buf(buf)
    cdef Py_ssize_t pos = 0, end = b.size
    cdef int32_t size
    cdef int magic
    cdef list out = []
    while end - pos >= MAGIC_OFFSET + 1:
        size = load_i32(b.ptr + pos + LENGTH_OFFSET)
        if size < LEGACY_HEADER_V0:
            raise CorruptRecordError(f"record size {size} is smaller than the minimum")
        if size > end - pos - LOG_OVERHEAD:
            break  # trailing partial batch
        magic = b.ptr[pos + MAGIC_OFFSET]
        if magic == 2:
            out.append(_decode_v2(b.ptr, pos, end, check_crc))
        elif magic < 2:
            out.append(_decode_legacy(b.ptr, pos, end, check_crc))
        else:
            raise CorruptRecordError(f"invalid magic {magic}")
        pos += LOG_OVERHEAD + size
    return out


def decode_batches(buf, *, bint check_crc=True):
    """List of every batch (RecordBatch or LegacyBatch) in a records blob,
    e.g. a FetchResponse partition's records. A partial batch at the end is
    ignored, as Kafka clients do; damage anywhere else raises."""
    return _decode_all(buf, check_crc)


def iter_batches(buf, *, bint check_crc=True):
    """Yield RecordBatch / LegacyBatch for each batch in a records blob
    (e.g. a FetchResponse partition's records). A partial batch at the end
    is ignored, as Kafka clients do; damage anywhere else raises."""
    cdef _Buf b = _get_buf(buf)
    cdef Py_ssize_t pos = 0
    cdef int32_t size
    cdef int magic
    while b.size - pos >= MAGIC_OFFSET + 1:
        size = load_i32(b.ptr + pos + LENGTH_OFFSET)
        if size < LEGACY_HEADER_V0:
            raise CorruptRecordError(f"record size {size} is smaller than the minimum")
        if size > b.size - pos - LOG_OVERHEAD:
            return  # trailing partial batch
        magic = b.ptr[pos + MAGIC_OFFSET]
        if magic == 2:
            batch = _decode_v2(b.ptr, pos, b.size, check_crc)
        elif magic < 2:
            batch = _decode_legacy(b.ptr, pos, b.size, check_crc)
        else:
            raise CorruptRecordError(f"invalid magic {magic}")
        yield batch
        pos += LOG_OVERHEAD + size


# -- encode ---------------------------------------------------------------------

cdef object _as_bytes(object v, str what):
    if v is None or PyBytes_CheckExact(v):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes-like or None, not {type(v).__name__}")


@cython.final
cdef class BatchBuilder:
    """Accumulates records into one record batch v2 (the producer hot path,
    like aiokafka's DefaultRecordBatchBuilder).

    ``append`` returns False once adding the record would take the
    uncompressed batch beyond ``batch_size`` bytes; the first record is
    always accepted. Offset deltas are 0..n-1, ``base_timestamp`` is the
    first record's timestamp. Not thread-safe; one owner appends and builds.
    """

    cdef unsigned char* _buf
    cdef Py_ssize_t _len
    cdef Py_ssize_t _cap
    cdef Py_ssize_t _batch_size
    cdef int _compression
    cdef object _level
    cdef int16_t _attributes
    cdef int64_t _base_offset
    cdef bint _has_base_ts
    cdef int64_t _base_ts
    cdef bint _has_max_ts
    cdef int64_t _max_ts
    cdef int64_t _producer_id
    cdef int16_t _producer_epoch
    cdef int32_t _base_sequence
    cdef int32_t _ple
    cdef int32_t _count

    def __cinit__(self):
        self._buf = NULL

    def __init__(self, *, int compression=NO_COMPRESSION, batch_size=16384,
                 int timestamp_type=TIMESTAMP_CREATE_TIME, base_timestamp=None,
                 int64_t producer_id=NO_PRODUCER_ID,
                 int16_t producer_epoch=NO_PRODUCER_EPOCH,
                 int32_t base_sequence=NO_SEQUENCE,
                 int32_t partition_leader_epoch=NO_PARTITION_LEADER_EPOCH,
                 bint is_transactional=False, bint is_control=False,
                 int64_t base_offset=0, compression_level=None):
        if not 0 <= compression <= 4:
            raise UnsupportedCompressionError(
                f"unknown compression codec id {compression}")
        if timestamp_type != 0 and timestamp_type != 1:
            raise ValueError(f"bad timestamp_type {timestamp_type}")
        self._compression = compression
        self._level = compression_level
        self._batch_size = min(batch_size, 1 << 62)
        self._attributes = (compression | (timestamp_type << 3)
                            | (TRANSACTIONAL_MASK if is_transactional else 0)
                            | (CONTROL_MASK if is_control else 0))
        self._base_offset = base_offset
        self._has_base_ts = base_timestamp is not None
        self._base_ts = base_timestamp if base_timestamp is not None else 0
        self._has_max_ts = False
        self._max_ts = 0
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._ple = partition_leader_epoch
        self._count = 0
        if self._buf == NULL:
            self._cap = 1024
            self._buf = <unsigned char*>PyMem_Malloc(self._cap)
            if self._buf == NULL:
                raise MemoryError()
        self._len = OVERHEAD

    def __dealloc__(self):
        if self._buf != NULL:
            PyMem_Free(self._buf)
            self._buf = NULL

    cdef int _reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t need = self._len + extra
        cdef Py_ssize_t cap = self._cap
        cdef unsigned char* nb
        if need <= cap:
            return 0
        while cap < need:
            cap *= 2
        nb = <unsigned char*>PyMem_Realloc(self._buf, cap)
        if nb == NULL:
            raise MemoryError()
        self._buf = nb
        self._cap = cap
        return 0

    cdef int _append(self, int64_t ts, object key, object value, object headers) except -1:
        """1 appended, 0 full."""
        cdef int64_t delta
        cdef const char* kp = NULL
        cdef const char* vp = NULL
        cdef const char* hp
        cdef Py_ssize_t kn = -1, vn = -1, hn, body, nh, i
        cdef unsigned char* w
        cdef int prefix
        if key is not None:
            if not PyBytes_CheckExact(key):
                key = _as_bytes(key, "key")
            kp = PyBytes_AS_STRING(key)
            kn = PyBytes_GET_SIZE(key)
        if value is not None:
            if not PyBytes_CheckExact(value):
                value = _as_bytes(value, "value")
            vp = PyBytes_AS_STRING(value)
            vn = PyBytes_GET_SIZE(value)
        if self._count == INT32_MAX:
            return 0
        if not self._has_base_ts:
            self._has_base_ts = True
            self._base_ts = ts
        if ((self._base_ts > 0 and ts < INT64_MIN + self._base_ts)
                or (self._base_ts < 0 and ts > INT64_MAX + self._base_ts)):
            raise OverflowError("timestamp delta out of int64 range")
        delta = ts - self._base_ts
        if type(headers) is not list and type(headers) is not tuple:
            headers = list(headers)
        nh = len(headers)
        # pass 1: body size (normalizing header values to bytes if needed)
        body = 1 + size_of_varlong(delta) + size_of_varint(self._count)
        body += 1 if kn < 0 else size_of_varint(<int32_t>kn) + kn
        body += 1 if vn < 0 else size_of_varint(<int32_t>vn) + vn
        if kn > INT32_MAX or vn > INT32_MAX or nh > INT32_MAX:
            raise OverflowError("record too large")
        body += size_of_varint(<int32_t>nh)
        for i in range(nh):
            h = headers[i]
            h_key, h_value = h
            if not isinstance(h_key, str):
                raise TypeError(f"header key must be str, not {type(h_key).__name__}")
            PyUnicode_AsUTF8AndSize(h_key, &hn)
            body += size_of_varint(<int32_t>hn) + hn
            if h_value is None:
                body += 1
            else:
                if not PyBytes_CheckExact(h_value):
                    if type(headers) is not list:
                        headers = list(headers)
                    h_value = _as_bytes(h_value, "header value")
                    headers[i] = (h_key, h_value)
                hn = PyBytes_GET_SIZE(h_value)
                body += size_of_varint(<int32_t>hn) + hn
        if body > INT32_MAX:
            raise OverflowError("record too large")
        prefix = size_of_varint(<int32_t>body)
        if self._count and self._len + prefix + body > self._batch_size:
            return 0
        self._reserve(prefix + body)
        w = self._buf + self._len
        w += write_varint(w, <int32_t>body)
        w[0] = 0
        w += 1
        w += write_varlong(w, delta)
        w += write_varint(w, self._count)
        if kn < 0:
            w[0] = 1
            w += 1
        else:
            w += write_varint(w, <int32_t>kn)
            memcpy(w, kp, kn)
            w += kn
        if vn < 0:
            w[0] = 1
            w += 1
        else:
            w += write_varint(w, <int32_t>vn)
            memcpy(w, vp, vn)
            w += vn
        w += write_varint(w, <int32_t>nh)
        for i in range(nh):
            h_key, h_value = headers[i]
            hp = PyUnicode_AsUTF8AndSize(h_key, &hn)
            w += write_varint(w, <int32_t>hn)
            memcpy(w, hp, hn)
            w += hn
            if h_value is None:
                w[0] = 1
                w += 1
            else:
                hn = PyBytes_GET_SIZE(h_value)
                w += write_varint(w, <int32_t>hn)
                memcpy(w, PyBytes_AS_STRING(h_value), hn)
                w += hn
        self._len += prefix + body
        self._count += 1
        if not self._has_max_ts or ts > self._max_ts:
            self._has_max_ts = True
            self._max_ts = ts
        return 1

    def append(self, int64_t timestamp_ms, key, value, headers=()):
        """Add one record; False (and nothing added) if the batch is full."""
        return self._append(timestamp_ms, key, value, headers) == 1

    @property
    def record_count(self):
        return self._count

    def size_in_bytes(self):
        """Bytes so far, uncompressed, header included."""
        return self._len

    def build(self):
        """The finished batch as bytes (compressed if asked). The builder
        may be built again; records appended later extend the batch."""
        cdef object out
        cdef unsigned char* p
        cdef Py_ssize_t total
        cdef int64_t base_ts = self._base_ts if self._has_base_ts else -1
        cdef int64_t max_ts = self._max_ts if self._has_max_ts else -1
        if self._count == 0:
            base_ts = max_ts = -1
        if self._compression:
            payload = _compression.compress(
                self._compression,
                PyBytes_FromStringAndSize(<const char*>self._buf + OVERHEAD,
                                          self._len - OVERHEAD), self._level)
            total = OVERHEAD + len(payload)
            if total - LOG_OVERHEAD > INT32_MAX:
                raise OverflowError("record batch too large")
            out = PyBytes_FromStringAndSize(NULL, total)
            p = <unsigned char*>PyBytes_AS_STRING(out)
            memcpy(p + OVERHEAD, PyBytes_AS_STRING(payload), total - OVERHEAD)
        else:
            total = self._len
            if total - LOG_OVERHEAD > INT32_MAX:
                raise OverflowError("record batch too large")
            out = PyBytes_FromStringAndSize(NULL, total)
            p = <unsigned char*>PyBytes_AS_STRING(out)
            memcpy(p + OVERHEAD, self._buf + OVERHEAD, total - OVERHEAD)
        store_i64(p, self._base_offset)
        store_i32(p + LENGTH_OFFSET, <int32_t>(total - LOG_OVERHEAD))
        store_i32(p + PLE_OFFSET, self._ple)
        p[MAGIC_OFFSET] = 2
        store_i16(p + ATTRIBUTES_OFFSET, self._attributes)
        store_i32(p + LAST_OFFSET_DELTA_OFFSET, self._count - 1 if self._count > 0 else 0)
        store_i64(p + BASE_TIMESTAMP_OFFSET, base_ts)
        store_i64(p + MAX_TIMESTAMP_OFFSET, max_ts)
        store_i64(p + PRODUCER_ID_OFFSET, self._producer_id)
        store_i16(p + PRODUCER_EPOCH_OFFSET, self._producer_epoch)
        store_i32(p + BASE_SEQUENCE_OFFSET, self._base_sequence)
        store_i32(p + RECORD_COUNT_OFFSET, self._count)
        store_u32(p + CRC_OFFSET, _crc32c(p + ATTRIBUTES_OFFSET, total - ATTRIBUTES_OFFSET))
        return out


def encode_batch(records, *, int64_t base_offset=0, int compression=NO_COMPRESSION,
                 int timestamp_type=TIMESTAMP_CREATE_TIME, base_timestamp=None,
                 int64_t producer_id=NO_PRODUCER_ID,
                 int16_t producer_epoch=NO_PRODUCER_EPOCH,
                 int32_t base_sequence=NO_SEQUENCE,
                 int32_t partition_leader_epoch=NO_PARTITION_LEADER_EPOCH,
                 bint is_transactional=False, bint is_control=False, compression_level=None):
    """Encode ``records`` — a sequence of (timestamp_ms, key, value, headers)
    — as one record batch v2. Offset deltas are 0..n-1; base_timestamp
    defaults to the first record's timestamp; max_timestamp is the largest
    record timestamp (the caller passes the append time as the records'
    timestamps for LogAppendTime, or rewrites it with set_log_append_time).
    An empty ``records`` gives a header-only batch with timestamps -1.
    ``compression_level``: the codec's level (None: kbroker's default for it)."""
    cdef BatchBuilder b = BatchBuilder(
        compression=compression, batch_size=1 << 62,
        timestamp_type=timestamp_type, base_timestamp=base_timestamp,
        producer_id=producer_id, producer_epoch=producer_epoch,
        base_sequence=base_sequence, partition_leader_epoch=partition_leader_epoch,
        is_transactional=is_transactional, is_control=is_control,
        base_offset=base_offset, compression_level=compression_level)
    cdef int64_t ts
    for r in records:
        ts_obj, key, value, headers = r
        ts = ts_obj
        b._append(ts, key, value, headers)
    return b.build()


# -- broker fast path -------------------------------------------------------------

# Kafka error codes of the Produce checks (ProduceRecordsError's)
cdef enum:
    E_NONE = 0
    E_CORRUPT_MESSAGE = 2
    E_MESSAGE_TOO_LARGE = 10
    E_UNSUPPORTED_COMPRESSION_TYPE = 76
    E_INVALID_RECORD = 87
    C_ZSTD = 4


cdef inline Py_ssize_t _next_batch_end(const unsigned char* b, Py_ssize_t pos, Py_ssize_t n) noexcept nogil:
    """Kafka's ByteBufferLogInputStream.nextBatch at ``pos``: the end of the batch there,
    -2 when no complete batch is left, -1 when its size or magic is corrupt."""
    cdef Py_ssize_t left = n - pos
    cdef int32_t size
    cdef int8_t magic
    if left < LOG_OVERHEAD:
        return -2
    size = load_i32(b + pos + LENGTH_OFFSET)
    if size < LEGACY_HEADER_V0:
        return -1
    if left < MAGIC_OFFSET + 1:
        return -2
    magic = <int8_t>b[pos + MAGIC_OFFSET]
    if magic < 0 or magic > 2:
        return -1
    if left < LOG_OVERHEAD + <Py_ssize_t>size:
        return -2
    return pos + LOG_OVERHEAD + size


cdef int _produce_records_error(const unsigned char* b, Py_ssize_t n, int version) noexcept nogil:
    """Kafka's ProduceRequest.validateRecords (v3+) over ``n`` bytes: E_NONE or the error
    code (see the twin's produce_records_error)."""
    cdef Py_ssize_t first = _next_batch_end(b, 0, n), second
    if first == -2:
        return E_INVALID_RECORD          # "must have at least one record batch per partition"
    if first == -1:
        return E_CORRUPT_MESSAGE
    if b[MAGIC_OFFSET] != 2:
        return E_INVALID_RECORD          # "only ... record batches with magic version 2"
    if version < 7 and (load_i16(b + ATTRIBUTES_OFFSET) & COMPRESSION_MASK) == C_ZSTD:
        return E_UNSUPPORTED_COMPRESSION_TYPE
    if first == n:
        return E_NONE
    second = _next_batch_end(b, first, n)
    if second == -2:
        return E_NONE
    if second == -1:
        return E_CORRUPT_MESSAGE
    return E_INVALID_RECORD              # "only ... exactly one record batch per partition"


def produce_records_error(buf, int version):
    """Kafka's ProduceRequest.validateRecords for one partition's records (None is no
    records): 0, or the Kafka error code (see the twin)."""
    cdef _Buf b
    if buf is None:
        return E_INVALID_RECORD
    b = _get_buf(buf)
    return _produce_records_error(b.ptr, b.size, version)


def validate_batches(buf, *, bint allow_control=False, int timestamp_type=-1,
                     int64_t now_ms=0, int64_t timestamp_before_max_ms=INT64_MAX,
                     int64_t timestamp_after_max_ms=INT64_MAX, bint compacted=False,
                     int produce_version=-1, int64_t max_message_bytes=INT64_MAX,
                     bint key_schema=False, bint value_schema=False):
    """Validate a ProduceRequest partition's records without building Record
    objects; return one BatchInfo per batch. See the twin's docstring for the
    full list of checks, the record checks ``timestamp_type`` >= 0 turns on,
    the request checks ``produce_version`` >= 0 turns on and the error class
    each failure raises."""
    cdef _Buf b = _get_buf(b"" if buf is None else buf)
    cdef int code
    cdef int64_t first_size
    cdef const unsigned char* base = b.ptr
    cdef const unsigned char* p
    cdef const unsigned char* rbuf
    cdef Py_ssize_t pos = 0, end = b.size, batch_end, rpos, rend
    cdef int magic, rc
    cdef int32_t batch_length, lod, count, ple, bseq
    cdef int16_t attributes, pepoch
    cdef int64_t base_ts, max_ts, pid
    cdef uint32_t crc
    cdef WalkStats st
    cdef RecordChecks ck
    cdef bint checks = timestamp_type >= 0
    cdef bint window = (timestamp_type == TIMESTAMP_CREATE_TIME
                        and (timestamp_before_max_ms != INT64_MAX or timestamp_after_max_ms != INT64_MAX))
    cdef object data
    cdef object errors
    cdef list infos = []
    cdef _IdSet ids = _IdSet() if checks and (key_schema or value_schema) else None
    if timestamp_type > 1:
        raise ValueError(f"bad timestamp_type {timestamp_type}")
    ck.compacted = compacted
    ck.create_time = timestamp_type == TIMESTAMP_CREATE_TIME
    ck.now = now_ms
    ck.before_max = timestamp_before_max_ms
    ck.after_max = timestamp_after_max_ms
    ck.key_schema = ids is not None and key_schema
    ck.value_schema = ids is not None and value_schema
    ck.ids = &ids.s if ids is not None else NULL
    if produce_version >= 0:
        # one walk: the request's checks, the first batch's base offset and size, then the batches
        code = _produce_records_error(b.ptr, b.size, produce_version)
        if code != E_NONE:
            raise ProduceRecordsError(code)
        if load_i64(b.ptr) != 0:
            raise ProduceRecordsError(E_INVALID_RECORD, base_offset=load_i64(b.ptr))
        first_size = LOG_OVERHEAD + <int64_t>load_i32(b.ptr + LENGTH_OFFSET)
        if first_size > max_message_bytes:
            raise ProduceRecordsError(E_MESSAGE_TOO_LARGE, size=first_size)
    if end == 0:
        raise CorruptRecordError("empty records")
    while pos < end:
        if end - pos < MAGIC_OFFSET + 1:
            raise CorruptRecordError(f"record batch truncated at position {pos}")
        magic = base[pos + MAGIC_OFFSET]
        if magic != 2:
            if magic == 0 or magic == 1:
                raise UnsupportedMagicError(
                    f"record batch magic {magic}: produce needs magic 2", magic)
            raise CorruptRecordError(f"invalid magic {magic}")
        _check_v2_frame(base, pos, end)
        p = base + pos
        batch_length = load_i32(p + LENGTH_OFFSET)
        ple = load_i32(p + PLE_OFFSET)
        crc = load_u32(p + CRC_OFFSET)
        attributes = load_i16(p + ATTRIBUTES_OFFSET)
        lod = load_i32(p + LAST_OFFSET_DELTA_OFFSET)
        base_ts = load_i64(p + BASE_TIMESTAMP_OFFSET)
        max_ts = load_i64(p + MAX_TIMESTAMP_OFFSET)
        pid = load_i64(p + PRODUCER_ID_OFFSET)
        pepoch = load_i16(p + PRODUCER_EPOCH_OFFSET)
        bseq = load_i32(p + BASE_SEQUENCE_OFFSET)
        count = load_i32(p + RECORD_COUNT_OFFSET)
        batch_end = pos + LOG_OVERHEAD + batch_length
        if _crc32c(p + ATTRIBUTES_OFFSET, batch_end - pos - ATTRIBUTES_OFFSET) != crc:
            raise CorruptRecordError(f"record batch at position {pos} has a bad CRC")
        if count <= 0:
            raise InvalidRecordError(f"invalid record count {count}")
        if lod != count - 1:
            raise InvalidRecordError(
                f"last_offset_delta {lod} does not match record count {count}")
        if (attributes & CONTROL_MASK) and not allow_control:
            raise InvalidRecordError("clients may not write control batches")
        if pid >= 0 and bseq < 0:
            raise InvalidRecordError(f"invalid sequence number {bseq}")
        data = _records_section(base, pos, batch_end, attributes, count)
        if data is None:
            rbuf, rpos, rend = base, pos + OVERHEAD, batch_end
        else:
            rbuf, rpos, rend = <const unsigned char*>PyBytes_AS_STRING(data), 0, PyBytes_GET_SIZE(data)
        ck.batch_log_append = (attributes & TIMESTAMP_TYPE_MASK) != 0
        # no record can fail when no check applies (the defaults: unbounded window, not
        # compacted, no LogAppendTime bit): the walk then skips the per-record test
        ck.enabled = checks and (compacted or window or ck.batch_log_append or ids is not None)
        if ids is not None:
            ids.reset()
        ck.base_ts = base_ts
        ck.header_max_ts = max_ts
        rc = _scan_records(rbuf, rpos, rend, count, &st, &ck, NULL, NULL, NULL)
        if rc == W_NOMEM:
            raise MemoryError()
        if rc != W_OK:
            raise InvalidRecordError(_WALK_MESSAGES[rc])
        errors = ()
        if st.n_errors:
            errors = _record_errors(rbuf, rpos, rend, count, &ck, st.n_errors)
        # tuple.__new__: the namedtuple without its Python-level __new__ (one per batch)
        infos.append(_tuple_new(BatchInfo, (
            pos, batch_length + LOG_OVERHEAD, lod, count, base_ts, max_ts,
            (attributes >> 3) & 1, attributes & COMPRESSION_MASK, pid, pepoch,
            bseq, (attributes & TRANSACTIONAL_MASK) != 0,
            (attributes & CONTROL_MASK) != 0, ple,
            _wrap_add(base_ts, st.min_delta), _wrap_add(base_ts, st.max_delta),
            <bint>st.has_null_key, errors, ids.items() if ids is not None else ())))
        pos = batch_end
    return infos


cdef tuple _record_errors(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end,
                          int32_t count, const RecordChecks* ck, int32_t n_errors):
    """The failing records of a batch whose first walk counted ``n_errors``:
    walk it again, storing them, and return ((index, kind, timestamp), ...) in
    record order. Only on the error path."""
    cdef WalkStats st
    cdef int32_t k
    cdef int32_t* idx = <int32_t*>PyMem_Malloc(n_errors * sizeof(int32_t))
    cdef int8_t* kinds = <int8_t*>PyMem_Malloc(n_errors * sizeof(int8_t))
    cdef int64_t* tss = <int64_t*>PyMem_Malloc(n_errors * sizeof(int64_t))
    try:
        if idx == NULL or kinds == NULL or tss == NULL:
            raise MemoryError()
        if _scan_records(buf, pos, end, count, &st, ck, idx, kinds, tss) != W_OK or st.n_errors != n_errors:
            raise AssertionError("second record walk disagrees with the first")
        return tuple([(idx[k], kinds[k], tss[k]) for k in range(n_errors)])
    finally:
        PyMem_Free(idx)
        PyMem_Free(kinds)
        PyMem_Free(tss)


cdef unsigned char* _writable_at(_Buf b, Py_ssize_t position, Py_ssize_t size) except NULL:
    if position < 0 or size > b.size - position:
        raise ValueError(f"position {position} outside the buffer")
    if b.ptr[position + MAGIC_OFFSET] != 2:
        raise CorruptRecordError(f"no magic 2 batch at position {position}")
    return <unsigned char*>b.ptr + position


def set_base_offset(buf, Py_ssize_t position, int64_t base_offset):
    """Write base_offset of the batch at ``position`` (outside the CRC)."""
    cdef _Buf b = _get_writable(buf)
    store_i64(_writable_at(b, position, MAGIC_OFFSET + 1), base_offset)


def set_partition_leader_epoch(buf, Py_ssize_t position, int32_t epoch):
    """Write partition_leader_epoch of the batch at ``position`` (outside the CRC)."""
    cdef _Buf b = _get_writable(buf)
    store_i32(_writable_at(b, position, MAGIC_OFFSET + 1) + PLE_OFFSET, epoch)


def set_max_timestamp(buf, Py_ssize_t position, int timestamp_type, int64_t max_timestamp):
    """Set the timestamp type bit and max_timestamp of the batch at
    ``position`` and recompute its CRC (Kafka's setMaxTimestamp; a no-op when
    both already hold these values)."""
    if timestamp_type != 0 and timestamp_type != 1:
        raise ValueError(f"bad timestamp_type {timestamp_type}")
    cdef _Buf b = _get_writable(buf)
    cdef unsigned char* p = _writable_at(b, position, OVERHEAD)
    cdef int16_t attributes = load_i16(p + ATTRIBUTES_OFFSET)
    cdef int32_t batch_length
    if ((attributes >> 3) & 1) == timestamp_type and load_i64(p + MAX_TIMESTAMP_OFFSET) == max_timestamp:
        return
    batch_length = load_i32(p + LENGTH_OFFSET)
    if batch_length < OVERHEAD - LOG_OVERHEAD or batch_length > b.size - position - LOG_OVERHEAD:
        raise CorruptRecordError(f"bad batch length {batch_length}")
    # Kafka's DefaultRecordBatch.computeAttributes: only the known bits survive
    attributes = <int16_t>((attributes & (COMPRESSION_MASK | TRANSACTIONAL_MASK | CONTROL_MASK
                                          | DELETE_HORIZON_MASK)) | (timestamp_type << 3))
    store_i16(p + ATTRIBUTES_OFFSET, attributes)
    store_i64(p + MAX_TIMESTAMP_OFFSET, max_timestamp)
    store_u32(p + CRC_OFFSET, _crc32c(p + ATTRIBUTES_OFFSET,
                                      batch_length + LOG_OVERHEAD - ATTRIBUTES_OFFSET))


def set_log_append_time(buf, Py_ssize_t position, int64_t timestamp_ms):
    """Mark the batch at ``position`` LogAppendTime with max_timestamp
    ``timestamp_ms``; recomputes the CRC."""
    set_max_timestamp(buf, position, TIMESTAMP_LOG_APPEND_TIME, timestamp_ms)


def assign_offsets(buf, infos, int64_t base_offset, *, partition_leader_epoch=None):
    """Give the validated batches ``infos`` consecutive offsets from
    ``base_offset`` (and the leader epoch, if given); returns the next offset."""
    cdef _Buf b = _get_writable(buf)
    cdef int64_t offset = base_offset
    cdef bint set_ple = partition_leader_epoch is not None
    cdef int32_t ple = partition_leader_epoch if set_ple else 0
    cdef unsigned char* p
    for info in infos:
        p = _writable_at(b, info.position, MAGIC_OFFSET + 1)
        store_i64(p, offset)
        if set_ple:
            store_i32(p + PLE_OFFSET, ple)
        offset += <int64_t>info.last_offset_delta + 1
    return offset

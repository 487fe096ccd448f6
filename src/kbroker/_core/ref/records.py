"""Kafka record batches (magic 2) and legacy message sets (magic 0/1).

Pure-Python twin of ``kbroker/_core/records.pyx``: same public API, same
bytes out, same error classes on bad input. Wire layouts follow Kafka's
``DefaultRecordBatch``/``DefaultRecord`` and ``LegacyRecord``
(clients/src/main/java/org/apache/kafka/common/record/).

Record batch v2 (RECORD_BATCH_OVERHEAD = 61 bytes of header)::

    off  size  field
    0    8     base_offset            int64
    8    4     batch_length           int32, bytes after this field
    12   4     partition_leader_epoch int32    (not covered by the CRC)
    16   1     magic                  int8 = 2
    17   4     crc                    uint32, CRC-32C of bytes 21..end
    21   2     attributes             int16: bits 0-2 compression,
                                      3 timestamp type (1 = LogAppendTime),
                                      4 transactional, 5 control,
                                      6 has delete horizon
    23   4     last_offset_delta      int32
    27   8     base_timestamp         int64
    35   8     max_timestamp          int64
    43   8     producer_id            int64
    51   2     producer_epoch         int16
    53   4     base_sequence          int32
    57   4     record count           int32
    61   ...   records (one compressed block when compression != 0)

Record (varint = zig-zag, -1 length = null)::

    length varint | attributes int8 | timestamp_delta varlong |
    offset_delta varint | key_length varint | key | value_length varint |
    value | header count varint | [key_length varint | key (utf-8) |
    value_length varint | value] ...

Legacy message (magic 0/1; CRC-32 IEEE over magic..end)::

    offset int64 | message_size int32 | crc uint32 | magic int8 |
    attributes int8 | [timestamp int64, magic 1 only] |
    key_length int32 | key | value_length int32 | value

Errors: CorruptRecordError for batch-level damage (sizes, truncation, CRC;
Kafka's CORRUPT_MESSAGE), InvalidRecordError for a batch whose CRC is right
but whose records break the format rules (Kafka's INVALID_RECORD),
UnsupportedMagicError (an InvalidRecordError) from ``validate_batches`` on a
magic 0/1 message set, UnsupportedCompressionError for codec ids > 4.
"""
from __future__ import annotations

import struct
import zlib
from collections import namedtuple

from kbroker._core import compression as _compression
from kbroker._core.errors import UnsupportedMagicError
from kbroker._core.errors import (
    CorruptRecordError,
    InvalidRecordError,
    ProduceRecordsError,
    UnsupportedCompressionError,
)

try:
    from kbroker._core.ref.crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - until the crc32c twin lands
    from crc32c import crc32c as _crc32c

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
#: BatchInfo.record_errors kinds (Kafka's LogValidator.validateRecord failures)
RECORD_ERROR_NO_KEY = 1            # compacted topic, null key: INVALID_RECORD
RECORD_ERROR_TIMESTAMP = 2         # outside message.timestamp.before/after.max.ms: INVALID_TIMESTAMP
RECORD_ERROR_LOG_APPEND_TIME = 3   # producer set LogAppendTime: INVALID_TIMESTAMP
#: a non-null key/value without the schema-registry header (magic byte 0, 4-byte schema id) on a
#: topic with kbroker.key/value.schema.validation; the error's third item says what is wrong
#: instead of the timestamp: the first byte (1..255), or 256 + length when shorter than 5 bytes
RECORD_ERROR_KEY_SCHEMA = 4
RECORD_ERROR_VALUE_SCHEMA = 5
SCHEMA_KEY = 0                     # BatchInfo.schema_ids kinds
SCHEMA_VALUE = 1

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

# field offsets inside a batch
_LENGTH_OFFSET = 8
_PLE_OFFSET = 12
_MAGIC_OFFSET = 16
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
_MAX_TIMESTAMP_OFFSET = 35
_LOG_OVERHEAD = 12                # base_offset + batch_length
_INT64_MAX = (1 << 63) - 1
_MIN_RECORD_SIZE = 7              # a record's smallest encoding, length byte included
_LEGACY_HEADER_V0 = 14            # crc .. value length, magic 0 (after LOG_OVERHEAD)
_LEGACY_HEADER_V1 = 22

_HEADER = struct.Struct(">qiibIhiqqqhii")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_II = struct.Struct(">I")
_QI = struct.Struct(">qi")
_LEGACY = struct.Struct(">qiIbb")

BatchInfo = namedtuple("BatchInfo", [
    "position", "size_in_bytes", "last_offset_delta", "record_count",
    "base_timestamp", "max_timestamp", "timestamp_type", "compression",
    "producer_id", "producer_epoch", "base_sequence", "is_transactional",
    "is_control", "partition_leader_epoch",
    "min_record_timestamp", "max_record_timestamp", "has_null_key",
    "record_errors", "schema_ids",
])
BatchInfo.__doc__ = """What ``validate_batches`` learned about one v2 batch.

``position`` is the batch's offset in the validated buffer, ``size_in_bytes``
its full size (``batch_length + 12``). Header fields are as sent;
``min_record_timestamp``/``max_record_timestamp`` are computed from the
records (base_timestamp + deltas; what Kafka's LogValidator checks against
message.timestamp.*.max.ms and writes back as maxTimestamp for CreateTime),
``has_null_key`` is True if any record has a null key (compacted topics
reject those). ``record_errors``: with record checks on (``validate_batches``'
``timestamp_type`` >= 0), the records that fail Kafka's
LogValidator.validateRecord, as ((index in the batch, RECORD_ERROR_* kind,
the record's timestamp), ...) in record order; else (). ``schema_ids``: with
``key_schema``/``value_schema`` (and record checks on), the distinct schema ids
the batch's keys/values carry, ((SCHEMA_KEY or SCHEMA_VALUE, id), ...) sorted;
else ()."""


class Record:
    """One decoded record. ``offset`` is absolute (base_offset + delta);
    ``timestamp`` is absolute ms (the batch's max_timestamp for LogAppendTime
    batches, -1 for magic 0); key/value are bytes or None; headers is a list
    of (str, bytes | None)."""

    __slots__ = ("offset", "timestamp", "key", "value", "headers")

    def __init__(self, offset, timestamp, key, value, headers):
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def _astuple(self):
        return (self.offset, self.timestamp, self.key, self.value, self.headers)

    def __eq__(self, other):
        if not hasattr(other, "headers") or not hasattr(other, "offset"):
            return NotImplemented
        return self._astuple() == (other.offset, other.timestamp, other.key,
                                   other.value, other.headers)

    __hash__ = None

    def __repr__(self):
        return (f"Record(offset={self.offset!r}, timestamp={self.timestamp!r}, "
                f"key={self.key!r}, value={self.value!r}, headers={self.headers!r})")


class _BatchBase:
    __slots__ = ()

    @property
    def last_offset(self):
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self):
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size_in_bytes(self):
        return self.batch_length + _LOG_OVERHEAD

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


class RecordBatch(_BatchBase):
    """A decoded record batch v2 (magic 2). Immutable after decode; the
    records are decoded (and decompressed) eagerly by ``decode_batch``."""

    __slots__ = ("base_offset", "batch_length", "partition_leader_epoch",
                 "magic", "crc", "attributes", "last_offset_delta",
                 "base_timestamp", "max_timestamp", "producer_id",
                 "producer_epoch", "base_sequence", "record_count",
                 "records", "_crc_valid")

    compression = property(lambda self: self.attributes & COMPRESSION_MASK)
    timestamp_type = property(lambda self: (self.attributes >> 3) & 1)
    is_transactional = property(lambda self: bool(self.attributes & TRANSACTIONAL_MASK))
    is_control = property(lambda self: bool(self.attributes & CONTROL_MASK))
    has_delete_horizon = property(lambda self: bool(self.attributes & DELETE_HORIZON_MASK))

    def __repr__(self):
        return (f"RecordBatch(base_offset={self.base_offset}, "
                f"record_count={self.record_count}, "
                f"compression={self.compression}, size={self.size_in_bytes})")


class LegacyBatch(_BatchBase):
    """One top-level magic 0/1 message: a plain message (one record) or a
    compressed wrapper whose value holds an inner message set. Offers the
    same attributes as RecordBatch (producer fields are -1, not
    transactional, not control)."""

    __slots__ = ("base_offset", "batch_length", "magic", "crc", "attributes",
                 "timestamp", "records", "_crc_valid", "_last_offset")

    partition_leader_epoch = NO_PARTITION_LEADER_EPOCH
    producer_id = NO_PRODUCER_ID
    producer_epoch = NO_PRODUCER_EPOCH
    base_sequence = NO_SEQUENCE
    is_transactional = False
    is_control = False
    compression = property(lambda self: self.attributes & COMPRESSION_MASK)
    timestamp_type = property(
        lambda self: (self.attributes >> 3) & 1 if self.magic > 0 else -1)
    record_count = property(lambda self: len(self.records))
    base_timestamp = property(lambda self: self.timestamp)
    max_timestamp = property(lambda self: self.timestamp)

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


# -- varints ----------------------------------------------------------------

def _read_varint(buf, pos, end, max_bytes, mask):
    """Zig-zag varint at buf[pos:end]; returns (value, new_pos) or raises."""
    raw = 0
    shift = 0
    limit = pos + max_bytes
    while True:
        if pos >= end or pos >= limit:
            raise InvalidRecordError("truncated or over-long varint in record")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            raw &= mask
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def _write_uvarint(out, v):
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _write_varint(out, v):
    _write_uvarint(out, ((v << 1) ^ (v >> 31)) & 0xFFFFFFFF)


def _write_varlong(out, v):
    _write_uvarint(out, ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF)


def _check_i32(v, what):
    if not -0x80000000 <= v <= 0x7FFFFFFF:
        raise OverflowError(f"{what} {v} out of int32 range")


def _check_i64(v, what):
    if not -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF:
        raise OverflowError(f"{what} {v} out of int64 range")


# -- encode -----------------------------------------------------------------

def _as_bytes(v, what):
    if v is None or type(v) is bytes:
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, bytes):
        return bytes(v)
    raise TypeError(f"{what} must be bytes-like or None, not {type(v).__name__}")


class BatchBuilder:
    """Accumulates records into one record batch v2 (the producer hot path,
    like aiokafka's DefaultRecordBatchBuilder).

    ``append`` returns False once adding the record would take the
    uncompressed batch beyond ``batch_size`` bytes; the first record is
    always accepted. Offset deltas are 0..n-1, ``base_timestamp`` is the
    first record's timestamp. Not thread-safe; one owner appends and builds.
    """

    def __init__(self, *, compression=NO_COMPRESSION, batch_size=16384,
                 timestamp_type=TIMESTAMP_CREATE_TIME, base_timestamp=None,
                 producer_id=NO_PRODUCER_ID, producer_epoch=NO_PRODUCER_EPOCH,
                 base_sequence=NO_SEQUENCE,
                 partition_leader_epoch=NO_PARTITION_LEADER_EPOCH,
                 is_transactional=False, is_control=False, base_offset=0,
                 compression_level=None):
        if not 0 <= compression <= 4:
            raise UnsupportedCompressionError(
                f"unknown compression codec id {compression}")
        if timestamp_type not in (0, 1):
            raise ValueError(f"bad timestamp_type {timestamp_type}")
        _check_i64(base_offset, "base_offset")
        _check_i64(producer_id, "producer_id")
        if not -0x8000 <= producer_epoch <= 0x7FFF:
            raise OverflowError(f"producer_epoch {producer_epoch} out of int16 range")
        _check_i32(base_sequence, "base_sequence")
        _check_i32(partition_leader_epoch, "partition_leader_epoch")
        if base_timestamp is not None:
            _check_i64(base_timestamp, "base_timestamp")
        self._compression = compression
        self._level = compression_level
        self._batch_size = batch_size
        self._attributes = (compression | (timestamp_type << 3)
                            | (TRANSACTIONAL_MASK if is_transactional else 0)
                            | (CONTROL_MASK if is_control else 0))
        self._base_offset = base_offset
        self._base_timestamp = base_timestamp
        self._max_timestamp = None
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._ple = partition_leader_epoch
        self._count = 0
        self._buf = bytearray(RECORD_BATCH_OVERHEAD)

    def append(self, timestamp_ms, key, value, headers=()):
        """Add one record; False (and nothing added) if the batch is full."""
        key = _as_bytes(key, "key")
        value = _as_bytes(value, "value")
        _check_i64(timestamp_ms, "timestamp")
        if self._count == 0x7FFFFFFF:
            return False
        if self._base_timestamp is None:
            self._base_timestamp = timestamp_ms
        delta = timestamp_ms - self._base_timestamp
        _check_i64(delta, "timestamp delta")
        body = bytearray(b"\x00")
        _write_varlong(body, delta)
        _write_varint(body, self._count)
        if key is None:
            body.append(1)
        else:
            _write_varint(body, len(key))
            body += key
        if value is None:
            body.append(1)
        else:
            _write_varint(body, len(value))
            body += value
        _write_varint(body, len(headers))
        for h_key, h_value in headers:
            if not isinstance(h_key, str):
                raise TypeError(f"header key must be str, not {type(h_key).__name__}")
            kb = h_key.encode("utf-8")
            _write_varint(body, len(kb))
            body += kb
            h_value = _as_bytes(h_value, "header value")
            if h_value is None:
                body.append(1)
            else:
                _write_varint(body, len(h_value))
                body += h_value
        if len(body) > 0x7FFFFFFF:
            raise OverflowError("record too large")
        buf = self._buf
        prefix = bytearray()
        _write_varint(prefix, len(body))
        if self._count and len(buf) + len(prefix) + len(body) > self._batch_size:
            return False
        buf += prefix
        buf += body
        self._count += 1
        if self._max_timestamp is None or timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms
        return True

    @property
    def record_count(self):
        return self._count

    def size_in_bytes(self):
        """Bytes so far, uncompressed, header included."""
        return len(self._buf)

    def build(self):
        """The finished batch as bytes (compressed if asked). The builder
        may be built again; records appended later extend the batch."""
        records = self._buf
        if self._compression:
            payload = _compression.compress(
                self._compression, memoryview(records)[RECORD_BATCH_OVERHEAD:], self._level)
            out = bytearray(RECORD_BATCH_OVERHEAD)
            out += payload
        else:
            out = bytearray(records)
        if len(out) - _LOG_OVERHEAD > 0x7FFFFFFF:
            raise OverflowError("record batch too large")
        base_ts = self._base_timestamp if self._base_timestamp is not None else NO_TIMESTAMP
        max_ts = self._max_timestamp if self._max_timestamp is not None else NO_TIMESTAMP
        if self._count == 0:
            base_ts = max_ts = NO_TIMESTAMP
        _HEADER.pack_into(
            out, 0, self._base_offset, len(out) - _LOG_OVERHEAD, self._ple, 2, 0,
            self._attributes, max(self._count - 1, 0), base_ts, max_ts,
            self._producer_id, self._producer_epoch, self._base_sequence,
            self._count)
        _II.pack_into(out, _CRC_OFFSET,
                      _crc32c(memoryview(out)[_ATTRIBUTES_OFFSET:]))
        return bytes(out)


def encode_batch(records, *, base_offset=0, compression=NO_COMPRESSION,
                 timestamp_type=TIMESTAMP_CREATE_TIME, base_timestamp=None,
                 producer_id=NO_PRODUCER_ID, producer_epoch=NO_PRODUCER_EPOCH,
                 base_sequence=NO_SEQUENCE,
                 partition_leader_epoch=NO_PARTITION_LEADER_EPOCH,
                 is_transactional=False, is_control=False, compression_level=None):
    """Encode ``records`` — a sequence of (timestamp_ms, key, value, headers)
    — as one record batch v2. Offset deltas are 0..n-1; base_timestamp
    defaults to the first record's timestamp; max_timestamp is the largest
    record timestamp (the caller passes the append time as the records'
    timestamps for LogAppendTime, or rewrites it with set_log_append_time).
    An empty ``records`` gives a header-only batch with timestamps -1.
    ``compression_level``: the codec's level (None: kbroker's default for it)."""
    b = BatchBuilder(compression=compression, batch_size=1 << 62,
                     timestamp_type=timestamp_type, base_timestamp=base_timestamp,
                     producer_id=producer_id, producer_epoch=producer_epoch,
                     base_sequence=base_sequence,
                     partition_leader_epoch=partition_leader_epoch,
                     is_transactional=is_transactional, is_control=is_control,
                     base_offset=base_offset, compression_level=compression_level)
    for r in records:
        timestamp_ms, key, value, headers = r
        b.append(timestamp_ms, key, value, headers)
    return b.build()


# -- decode / walk ----------------------------------------------------------

def _walk_records(buf, pos, end, count, base_offset, base_timestamp,
                  log_append_ts, out, check=None, errors=None, schema=None):
    """Walk ``count`` records in buf[pos:end]. If ``out`` is a list, append
    Record objects to it (decode); if None, also require offset deltas
    0,1,2.. (validate). Returns (min_ts_delta, max_ts_delta, has_null_key).
    Raises InvalidRecordError on any framing error. ``check(null_key, ts)``,
    if given, is applied to each record as it is walked (``ts`` as Kafka's
    Record.timestamp()); its non-zero results go to ``errors`` as
    (index, kind, ts). ``schema``: (key_schema, value_schema, ids) with a set
    ``ids``: non-null keys/values must carry the schema-registry header (a
    record that passes ``check`` but not this gets RECORD_ERROR_KEY/VALUE_SCHEMA);
    the (kind, id) of every valid header go to ``ids``."""
    rv = _read_varint
    M32 = 0xFFFFFFFF
    M64 = 0xFFFFFFFFFFFFFFFF
    min_delta = max_delta = None
    has_null_key = False
    for i in range(count):
        length, pos = rv(buf, pos, end, 5, M32)
        if length < 6 or length > end - pos:
            raise InvalidRecordError(f"invalid record size {length}")
        rend = pos + length
        pos += 1  # attributes (unused)
        ts_delta, pos = rv(buf, pos, rend, 10, M64)
        off_delta, pos = rv(buf, pos, rend, 5, M32)
        if off_delta != i and out is None:
            # produce path only: compacted batches in a fetch have gaps
            raise InvalidRecordError(
                f"record offset delta {off_delta} where {i} was expected")
        klen, pos = rv(buf, pos, rend, 5, M32)
        kbad = vbad = None
        if klen < 0:
            if klen != -1:
                raise InvalidRecordError(f"invalid key length {klen}")
            key = None
            has_null_key = True
        else:
            if klen > rend - pos:
                raise InvalidRecordError(f"key length {klen} beyond record")
            key = bytes(buf[pos:pos + klen]) if out is not None else None
            if schema is not None and schema[0]:
                kbad = _schema_header(buf, pos, klen, SCHEMA_KEY, schema[2])
            pos += klen
        vlen, pos = rv(buf, pos, rend, 5, M32)
        if vlen < 0:
            if vlen != -1:
                raise InvalidRecordError(f"invalid value length {vlen}")
            value = None
        else:
            if vlen > rend - pos:
                raise InvalidRecordError(f"value length {vlen} beyond record")
            value = bytes(buf[pos:pos + vlen]) if out is not None else None
            if schema is not None and schema[1]:
                vbad = _schema_header(buf, pos, vlen, SCHEMA_VALUE, schema[2])
            pos += vlen
        nh, pos = rv(buf, pos, rend, 5, M32)
        if nh < 0 or nh > (rend - pos) // 2:
            raise InvalidRecordError(f"invalid header count {nh}")
        headers = []
        for _ in range(nh):
            hklen, pos = rv(buf, pos, rend, 5, M32)
            if hklen < 0 or hklen > rend - pos:
                raise InvalidRecordError(f"invalid header key length {hklen}")
            if out is not None:
                try:
                    hkey = bytes(buf[pos:pos + hklen]).decode("utf-8")
                except UnicodeDecodeError:
                    raise InvalidRecordError("header key is not valid UTF-8") from None
            pos += hklen
            hvlen, pos = rv(buf, pos, rend, 5, M32)
            if hvlen < 0:
                if hvlen != -1:
                    raise InvalidRecordError(f"invalid header value length {hvlen}")
                hval = None
            else:
                if hvlen > rend - pos:
                    raise InvalidRecordError(f"header value length {hvlen} beyond record")
                hval = bytes(buf[pos:pos + hvlen]) if out is not None else None
                pos += hvlen
            if out is not None:
                headers.append((hkey, hval))
        if pos != rend:
            raise InvalidRecordError(
                f"record declared {length} bytes but its fields use {length - (rend - pos)}")
        if min_delta is None or ts_delta < min_delta:
            min_delta = ts_delta
        if max_delta is None or ts_delta > max_delta:
            max_delta = ts_delta
        if check is not None:
            ts = log_append_ts if log_append_ts is not None else _wrap64(base_timestamp + ts_delta)
            kind = check(klen < 0, ts)
            if not kind and kbad is not None:
                kind, ts = RECORD_ERROR_KEY_SCHEMA, kbad
            elif not kind and vbad is not None:
                kind, ts = RECORD_ERROR_VALUE_SCHEMA, vbad
            if kind:
                errors.append((i, kind, ts))
        if out is not None:
            ts = log_append_ts if log_append_ts is not None else (
                (base_timestamp + ts_delta + 0x8000000000000000) % (1 << 64)
                - 0x8000000000000000)
            out.append(Record(base_offset + off_delta, ts, key, value, headers))
    if pos != end:
        raise InvalidRecordError(
            f"{end - pos} bytes left after the batch's {count} records")
    return min_delta, max_delta, has_null_key


def _schema_header(buf, pos, n, kind, ids):
    """Confluent's wire format at buf[pos:pos + n]: magic byte 0, then the schema id
    (4 bytes, big-endian). None when present ((kind, id) added to ``ids``), else what
    is wrong: the first byte (1..255) or 256 + n when fewer than 5 bytes."""
    if n < 5:
        return 256 + n
    if buf[pos] != 0:
        return buf[pos]
    ids.add((kind, _I.unpack_from(buf, pos + 1)[0]))
    return None


def _batch_records_section(buf, pos, batch_end, attributes, count):
    """(buffer, start, end) of the uncompressed records of the batch."""
    codec = attributes & COMPRESSION_MASK
    start = pos + RECORD_BATCH_OVERHEAD
    if codec == 0:
        data, rpos, rend = buf, start, batch_end
    else:
        if codec > 4:
            raise UnsupportedCompressionError(f"unknown compression codec id {codec}")
        data = _compression.decompress(codec, buf[start:batch_end])
        rpos, rend = 0, len(data)
    if count < 0 or count > (rend - rpos) // _MIN_RECORD_SIZE:
        raise InvalidRecordError(
            f"record count {count} does not fit in {rend - rpos} bytes")
    return data, rpos, rend


def _v2_header(buf, pos, end):
    """Check the frame of the v2 batch at ``pos`` and unpack its header."""
    if end - pos < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(
            f"record batch truncated: {end - pos} bytes at position {pos}")
    h = _HEADER.unpack_from(buf, pos)
    batch_length = h[1]
    if batch_length < RECORD_BATCH_OVERHEAD - _LOG_OVERHEAD:
        raise CorruptRecordError(f"record batch length {batch_length} is too small")
    if batch_length > end - pos - _LOG_OVERHEAD:
        raise CorruptRecordError(
            f"record batch length {batch_length} beyond the {end - pos} bytes left")
    return h


def _decode_v2(buf, pos, end, check_crc):
    h = _v2_header(buf, pos, end)
    (base_offset, batch_length, ple, magic, crc, attributes, lod, base_ts,
     max_ts, pid, pepoch, bseq, count) = h
    batch_end = pos + _LOG_OVERHEAD + batch_length
    valid = _crc32c(buf[pos + _ATTRIBUTES_OFFSET:batch_end]) == crc
    if check_crc and not valid:
        raise CorruptRecordError(
            f"record batch at offset {base_offset} has a bad CRC")
    data, rpos, rend = _batch_records_section(buf, pos, batch_end, attributes, count)
    records = []
    lat = max_ts if attributes & TIMESTAMP_TYPE_MASK else None
    _walk_records(data, rpos, rend, count, base_offset, base_ts, lat, records)
    b = RecordBatch.__new__(RecordBatch)
    b.base_offset = base_offset
    b.batch_length = batch_length
    b.partition_leader_epoch = ple
    b.magic = magic
    b.crc = crc
    b.attributes = attributes
    b.last_offset_delta = lod
    b.base_timestamp = base_ts
    b.max_timestamp = max_ts
    b.producer_id = pid
    b.producer_epoch = pepoch
    b.base_sequence = bseq
    b.record_count = count
    b.records = records
    b._crc_valid = valid
    return b


def decode_batch(buf, *, check_crc=True):
    """Decode the single record batch v2 at the start of ``buf`` (bytes-like;
    bytes after the batch are ignored). Decompresses and decodes all records.
    Raises CorruptRecordError (or a subclass) on bad input."""
    mv = memoryview(buf).cast("B")
    if len(mv) >= _MAGIC_OFFSET + 1 and mv[_MAGIC_OFFSET] != 2:
        raise CorruptRecordError(
            f"decode_batch wants magic 2, found {mv[_MAGIC_OFFSET]}")
    return _decode_v2(mv, 0, len(mv), check_crc)


# -- legacy -----------------------------------------------------------------

def _legacy_message(buf, pos, end, check_crc):
    """Parse the magic 0/1 message at ``pos``; returns a tuple
    (offset, size, crc, magic, attributes, timestamp, key, value, crc_valid)."""
    if end - pos < _LOG_OVERHEAD + _LEGACY_HEADER_V0:
        raise CorruptRecordError("legacy message truncated")
    offset, size, crc, magic, attributes = _LEGACY.unpack_from(buf, pos)
    if magic not in (0, 1):
        raise CorruptRecordError(f"invalid magic {magic} in legacy message")
    header = _LEGACY_HEADER_V0 if magic == 0 else _LEGACY_HEADER_V1
    if size < header or size > end - pos - _LOG_OVERHEAD:
        raise CorruptRecordError(f"invalid legacy message size {size}")
    mend = pos + _LOG_OVERHEAD + size
    valid = (zlib.crc32(buf[pos + _MAGIC_OFFSET:mend]) & 0xFFFFFFFF) == crc
    if check_crc and not valid:
        raise CorruptRecordError(f"legacy message at offset {offset} has a bad CRC")
    p = pos + 18
    if magic == 1:
        (timestamp,) = _Q.unpack_from(buf, p)
        p += 8
    else:
        timestamp = NO_TIMESTAMP
    fields = []
    for what in ("key", "value"):
        if mend - p < 4:
            raise CorruptRecordError(f"legacy message {what} length truncated")
        (n,) = _I.unpack_from(buf, p)
        p += 4
        if n < 0:
            if n != -1:
                raise CorruptRecordError(f"invalid legacy {what} length {n}")
            fields.append(None)
        else:
            if n > mend - p:
                raise CorruptRecordError(f"legacy {what} length {n} beyond message")
            fields.append(bytes(buf[p:p + n]))
            p += n
    if p != mend:
        raise CorruptRecordError("legacy message size does not match its fields")
    return offset, size, crc, magic, attributes, timestamp, fields[0], fields[1], valid


def _decode_legacy(buf, pos, end, check_crc):
    (offset, size, crc, magic, attributes, timestamp, key, value,
     valid) = _legacy_message(buf, pos, end, check_crc)
    codec = attributes & COMPRESSION_MASK
    log_append = magic == 1 and attributes & TIMESTAMP_TYPE_MASK
    records = []
    last_offset = offset
    if codec == 0:
        records.append(Record(offset, timestamp, key, value, []))
        base = offset
    else:
        if codec > 3:
            raise UnsupportedCompressionError(
                f"codec id {codec} is not valid for magic {magic}")
        if value is None:
            raise CorruptRecordError("compressed legacy wrapper has a null value")
        inner = memoryview(_compression.decompress(codec, value))
        ipos, iend = 0, len(inner)
        entries = []
        while ipos < iend:
            m = _legacy_message(inner, ipos, iend, check_crc)
            if m[4] & COMPRESSION_MASK:
                raise CorruptRecordError("nested compressed legacy message")
            if m[3] != magic:
                raise CorruptRecordError("inner message magic differs from the wrapper's")
            entries.append(m)
            ipos += _LOG_OVERHEAD + m[1]
        if not entries:
            raise CorruptRecordError("compressed legacy wrapper with no messages")
        # magic 1 inner offsets are relative: the wrapper carries the last one
        # (a wrapper offset of 0 is produce data not yet given offsets by a
        # broker: inner offsets are then used as they are, as Kafka does)
        shift = offset - entries[-1][0] if magic == 1 and offset != 0 else 0
        for m in entries:
            ts = timestamp if log_append else m[5]
            records.append(Record(m[0] + shift, ts, m[6], m[7], []))
        base = records[0].offset
        last_offset = records[-1].offset if magic == 1 else offset
    b = LegacyBatch.__new__(LegacyBatch)
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


def iter_batches(buf, *, check_crc=True):
    """Yield RecordBatch / LegacyBatch for each batch in a records blob
    (e.g. a FetchResponse partition's records). A partial batch at the end
    is ignored, as Kafka clients do; damage anywhere else raises."""
    mv = memoryview(buf).cast("B")
    pos = 0
    end = len(mv)
    while end - pos >= _MAGIC_OFFSET + 1:
        (size,) = _I.unpack_from(mv, pos + _LENGTH_OFFSET)
        if size < _LEGACY_HEADER_V0:
            raise CorruptRecordError(f"record size {size} is smaller than the minimum")
        if size > end - pos - _LOG_OVERHEAD:
            return  # trailing partial batch
        magic = mv[pos + _MAGIC_OFFSET]
        if magic == 2:
            b = _decode_v2(mv, pos, end, check_crc)
        elif magic < 2:
            b = _decode_legacy(mv, pos, end, check_crc)
        else:
            raise CorruptRecordError(f"invalid magic {magic}")
        yield b
        pos += _LOG_OVERHEAD + size


def decode_batches(buf, *, check_crc=True):
    """List of every batch in ``buf`` (see iter_batches)."""
    return list(iter_batches(buf, check_crc=check_crc))


# -- broker fast path ---------------------------------------------------------

def _next_batch_end(mv, pos, n):
    """Kafka's ByteBufferLogInputStream.nextBatch at ``pos`` of ``mv`` (``n`` bytes): the
    end of the batch there, -2 when no complete batch is left, -1 when its size or magic
    is corrupt."""
    left = n - pos
    if left < _LOG_OVERHEAD:
        return -2
    size = _I.unpack_from(mv, pos + _LENGTH_OFFSET)[0]
    if size < _LEGACY_HEADER_V0:
        return -1
    if left < _MAGIC_OFFSET + 1:
        return -2
    if not 0 <= _b(mv[pos + _MAGIC_OFFSET]) <= 2:
        return -1
    if left < _LOG_OVERHEAD + size:
        return -2
    return pos + _LOG_OVERHEAD + size


def _b(v):
    return v - 256 if v > 127 else v


def produce_records_error(buf, version):
    """Kafka's ProduceRequest.validateRecords (v3+) for one partition's records: 0 when
    they may go on to the log, else Kafka's error code (ProduceRecordsError's constants).
    Walks batch headers as MemoryRecords.batches() does (a batch cut short ends the
    walk): no complete batch (None, empty), or a first batch not of magic 2, is
    INVALID_RECORD; zstd before v7 is UNSUPPORTED_COMPRESSION_TYPE; a second batch is
    INVALID_RECORD ("exactly one record batch per partition"). A batch size below the
    legacy minimum or a magic outside 0..2 in a header read is CORRUPT_MESSAGE (the
    iterator's CorruptRecordException)."""
    E = ProduceRecordsError
    if buf is None:
        return E.INVALID_RECORD
    mv = memoryview(buf).cast("B")
    n = len(mv)
    first = _next_batch_end(mv, 0, n)
    if first == -2:
        return E.INVALID_RECORD
    if first == -1:
        return E.CORRUPT_MESSAGE
    if mv[_MAGIC_OFFSET] != 2:
        return E.INVALID_RECORD
    if version < 7 and mv[_ATTRIBUTES_OFFSET + 1] & COMPRESSION_MASK == ZSTD:
        return E.UNSUPPORTED_COMPRESSION_TYPE
    if first == n:
        return 0
    second = _next_batch_end(mv, first, n)
    if second == -2:
        return 0
    if second == -1:
        return E.CORRUPT_MESSAGE
    return E.INVALID_RECORD


def validate_batches(buf, *, allow_control=False, timestamp_type=-1, now_ms=0,
                     timestamp_before_max_ms=_INT64_MAX, timestamp_after_max_ms=_INT64_MAX,
                     compacted=False, produce_version=-1, max_message_bytes=_INT64_MAX,
                     key_schema=False, value_schema=False):
    """Validate a ProduceRequest partition's records without building Record
    objects; return one BatchInfo per batch.

    With ``produce_version`` >= 0 (a client's Produce of that version), the
    walk first does what comes before the batch checks, raising
    ProduceRecordsError: :func:`produce_records_error` (None counts as no
    records), then a first batch whose base offset is not 0
    (``base_offset`` set) or whose size is above ``max_message_bytes``
    (``size`` set). Kafka: ProduceRequest.validateRecords, then
    UnifiedLog.analyzeAndValidateRecords.

    Checks, per batch (Kafka's DefaultRecordBatch.ensureValid and
    LogValidator.validateBatch for client-origin appends):
    CorruptRecordError: truncated/inconsistent batch_length, bad CRC,
    magic other than 0/1/2. UnsupportedMagicError: magic 0/1.
    UnsupportedCompressionError: codec id > 4. InvalidRecordError: record
    count <= 0 or not matching the records walked, last_offset_delta !=
    count - 1, offset deltas not 0,1,2.., any record's framing (lengths,
    varints, key/value/header bounds), control batch unless
    ``allow_control``, producer_id >= 0 with base_sequence < 0.

    Record checks (Kafka's LogValidator.validateRecord), in the same walk,
    when ``timestamp_type`` (the topic's: 0 CreateTime, 1 LogAppendTime) is
    given: a record fails, in this order, if ``compacted`` and its key is
    null (RECORD_ERROR_NO_KEY); else, for a CreateTime topic and a timestamp
    other than -1, if ``now_ms - ts > timestamp_before_max_ms`` or
    ``ts - now_ms > timestamp_after_max_ms`` (RECORD_ERROR_TIMESTAMP, Java
    long arithmetic); else if the batch has the LogAppendTime bit set
    (RECORD_ERROR_LOG_APPEND_TIME: producers may not set it). A record's
    timestamp is base_timestamp + delta, or the batch's max_timestamp when
    its LogAppendTime bit is set. Failures do not raise: they are listed in
    BatchInfo.record_errors.

    Schema-registry framing (kbroker.key/value.schema.validation), in the same
    walk and only with record checks on: with ``key_schema``/``value_schema``,
    a record that passes the checks above fails if its key (then its value) is
    not null and does not start with magic byte 0 and a 4-byte schema id
    (RECORD_ERROR_KEY_SCHEMA / RECORD_ERROR_VALUE_SCHEMA; null passes, as in
    Confluent Server); the distinct ids seen go to BatchInfo.schema_ids.
    """
    if timestamp_type > 1:
        raise ValueError(f"bad timestamp_type {timestamp_type}")
    _check_i64(now_ms, "now_ms")
    _check_i64(timestamp_before_max_ms, "timestamp_before_max_ms")
    _check_i64(timestamp_after_max_ms, "timestamp_after_max_ms")
    mv = memoryview(b"" if buf is None else buf).cast("B")
    end = len(mv)
    if produce_version >= 0:
        code = produce_records_error(mv, produce_version)
        if code:
            raise ProduceRecordsError(code)
        base_offset, length = _QI.unpack_from(mv, 0)
        if base_offset != 0:
            raise ProduceRecordsError(ProduceRecordsError.INVALID_RECORD, base_offset=base_offset)
        if _LOG_OVERHEAD + length > max_message_bytes:
            raise ProduceRecordsError(ProduceRecordsError.MESSAGE_TOO_LARGE, size=_LOG_OVERHEAD + length)
    if end == 0:
        raise CorruptRecordError("empty records")
    pos = 0
    infos = []
    while pos < end:
        if end - pos < _MAGIC_OFFSET + 1:
            raise CorruptRecordError(f"record batch truncated at position {pos}")
        magic = mv[pos + _MAGIC_OFFSET]
        if magic != 2:
            if magic in (0, 1):
                raise UnsupportedMagicError(
                    f"record batch magic {magic}: produce needs magic 2", magic)
            raise CorruptRecordError(f"invalid magic {magic}")
        h = _v2_header(mv, pos, end)
        (_, batch_length, ple, _, crc, attributes, lod, base_ts, max_ts, pid,
         pepoch, bseq, count) = h
        batch_end = pos + _LOG_OVERHEAD + batch_length
        if _crc32c(mv[pos + _ATTRIBUTES_OFFSET:batch_end]) != crc:
            raise CorruptRecordError(f"record batch at position {pos} has a bad CRC")
        if count <= 0:
            raise InvalidRecordError(f"invalid record count {count}")
        if lod != count - 1:
            raise InvalidRecordError(
                f"last_offset_delta {lod} does not match record count {count}")
        if attributes & CONTROL_MASK and not allow_control:
            raise InvalidRecordError("clients may not write control batches")
        if pid >= 0 and bseq < 0:
            raise InvalidRecordError(f"invalid sequence number {bseq}")
        data, rpos, rend = _batch_records_section(mv, pos, batch_end, attributes, count)
        log_append = bool(attributes & TIMESTAMP_TYPE_MASK)
        check = errors = schema = None
        if timestamp_type >= 0:
            check = _record_check(compacted, timestamp_type == TIMESTAMP_CREATE_TIME, log_append,
                                  now_ms, timestamp_before_max_ms, timestamp_after_max_ms)
            errors = []
            if key_schema or value_schema:
                schema = (key_schema, value_schema, set())
        min_d, max_d, null_key = _walk_records(
            data, rpos, rend, count, 0, base_ts, max_ts if log_append else None,
            None, check, errors, schema)
        infos.append(BatchInfo(
            pos, batch_length + _LOG_OVERHEAD, lod, count, base_ts, max_ts,
            (attributes >> 3) & 1, attributes & COMPRESSION_MASK, pid, pepoch,
            bseq, bool(attributes & TRANSACTIONAL_MASK),
            bool(attributes & CONTROL_MASK), ple,
            _wrap64(base_ts + min_d), _wrap64(base_ts + max_d), null_key,
            tuple(errors) if errors else (), tuple(sorted(schema[2])) if schema else ()))
        pos = batch_end
    return infos


def _record_check(compacted, create_time, batch_log_append, now, before_max, after_max):
    """Kafka's LogValidator.validateKey then validateTimestamp for one batch, as
    check(null_key, ts) -> RECORD_ERROR_* kind or 0."""
    def check(null_key, ts):
        if compacted and null_key:
            return RECORD_ERROR_NO_KEY
        if create_time and ts != NO_TIMESTAMP:
            diff = _wrap64(now - ts)
            if diff > before_max or _wrap64(-diff) > after_max:
                return RECORD_ERROR_TIMESTAMP
        elif batch_log_append:
            return RECORD_ERROR_LOG_APPEND_TIME
        return 0
    return check


def _wrap64(v):
    return ((v + 0x8000000000000000) % (1 << 64)) - 0x8000000000000000


def _writable(buf, position, size):
    mv = memoryview(buf).cast("B")
    if mv.readonly:
        raise TypeError("buffer is read-only")
    if position < 0 or size > len(mv) - position:
        raise ValueError(f"position {position} outside the buffer")
    if mv[position + _MAGIC_OFFSET] != 2:
        raise CorruptRecordError(f"no magic 2 batch at position {position}")
    return mv


def set_base_offset(buf, position, base_offset):
    """Write base_offset of the batch at ``position`` (outside the CRC)."""
    _check_i64(base_offset, "base_offset")
    mv = _writable(buf, position, _MAGIC_OFFSET + 1)
    _Q.pack_into(mv, position, base_offset)


def set_partition_leader_epoch(buf, position, epoch):
    """Write partition_leader_epoch of the batch at ``position`` (outside the CRC)."""
    _check_i32(epoch, "partition_leader_epoch")
    mv = _writable(buf, position, _MAGIC_OFFSET + 1)
    _I.pack_into(mv, position + _PLE_OFFSET, epoch)


def _rewrite_crc(mv, position):
    (batch_length,) = _I.unpack_from(mv, position + _LENGTH_OFFSET)
    end = position + _LOG_OVERHEAD + batch_length
    if batch_length < RECORD_BATCH_OVERHEAD - _LOG_OVERHEAD or end > len(mv):
        raise CorruptRecordError(f"bad batch length {batch_length}")
    _II.pack_into(mv, position + _CRC_OFFSET,
                  _crc32c(mv[position + _ATTRIBUTES_OFFSET:end]))


def set_max_timestamp(buf, position, timestamp_type, max_timestamp):
    """Set the timestamp type bit and max_timestamp of the batch at
    ``position`` and recompute its CRC (Kafka's setMaxTimestamp; a no-op when
    both already hold these values)."""
    if timestamp_type not in (0, 1):
        raise ValueError(f"bad timestamp_type {timestamp_type}")
    _check_i64(max_timestamp, "max_timestamp")
    mv = _writable(buf, position, RECORD_BATCH_OVERHEAD)
    (attributes,) = struct.unpack_from(">h", mv, position + _ATTRIBUTES_OFFSET)
    (current,) = _Q.unpack_from(mv, position + _MAX_TIMESTAMP_OFFSET)
    if (attributes >> 3) & 1 == timestamp_type and current == max_timestamp:
        return
    # Kafka's DefaultRecordBatch.computeAttributes: only the known bits survive
    attributes = ((attributes & (COMPRESSION_MASK | TRANSACTIONAL_MASK | CONTROL_MASK
                                 | DELETE_HORIZON_MASK)) | (timestamp_type << 3))
    struct.pack_into(">h", mv, position + _ATTRIBUTES_OFFSET, attributes)
    _Q.pack_into(mv, position + _MAX_TIMESTAMP_OFFSET, max_timestamp)
    _rewrite_crc(mv, position)


def set_log_append_time(buf, position, timestamp_ms):
    """Mark the batch at ``position`` LogAppendTime with max_timestamp
    ``timestamp_ms``; recomputes the CRC."""
    set_max_timestamp(buf, position, TIMESTAMP_LOG_APPEND_TIME, timestamp_ms)


def assign_offsets(buf, infos, base_offset, *, partition_leader_epoch=None):
    """Give the validated batches ``infos`` consecutive offsets from
    ``base_offset`` (and the leader epoch, if given); returns the next offset."""
    offset = base_offset
    for info in infos:
        set_base_offset(buf, info.position, offset)
        if partition_leader_epoch is not None:
            set_partition_leader_epoch(buf, info.position, partition_leader_epoch)
        offset += info.last_offset_delta + 1
    return offset

"""What Kafka's LogValidator does to a leader append once its records are validated.

Kafka: ``storage/.../internals/log/LogValidator.java`` (3.9). The per-record checks
themselves run in the records kernel (``kernels.records.validate_batches`` with
``timestamp_type`` >= 0, one walk over the records, results in
``BatchInfo.record_errors``); this module turns their results into Kafka's answer and
rewrites the batches as Kafka does before they reach ``Log.append``:

- ``record_validation_error``: the RecordValidationException answer (one RecordError per
  failing record, indexed inside its batch, with Kafka's messages; and kbroker's for a
  missing schema-registry header, see schema_validation.py);
- ``set_max_timestamps``: ``batch.setMaxTimestamp`` in place (uncompressed, or compressed
  with the topic's compression.type): a LogAppendTime topic stamps the append time, a
  CreateTime topic the records' own largest timestamp, whatever the header claimed;
- ``target_compression`` / ``recompress``: a topic whose compression.type is a codec
  other than the batch's gets the records rebuilt into a batch of that codec, at the
  topic's compression.*.level (LogValidator.buildRecordsAndAssignOffsets).

Stateless; called on request-handler threads without locks.
"""
from __future__ import annotations

from kbroker.kernels import records as _records
from kbroker.protocol import ErrorCode

CREATE_TIME = _records.TIMESTAMP_CREATE_TIME
LOG_APPEND_TIME = _records.TIMESTAMP_LOG_APPEND_TIME
_INT64 = 1 << 64

#: compression.type -> codec id (Kafka's BrokerCompressionType; "producer" keeps the batch's)
CODECS = {"uncompressed": _records.NO_COMPRESSION, "gzip": _records.GZIP, "snappy": _records.SNAPPY,
          "lz4": _records.LZ4, "zstd": _records.ZSTD}
#: codec id -> its compression.<name>.level config (snappy has none)
_LEVEL_CONFIGS = {_records.GZIP: "compression.gzip.level", _records.LZ4: "compression.lz4.level",
                  _records.ZSTD: "compression.zstd.level"}


class RecordValidationError(Exception):
    """Kafka's RecordValidationException: the partition's error code and message, and
    ``record_errors`` [(index in the batch, message)] in record order."""

    def __init__(self, code: int, message: str, record_errors: list[tuple[int, str]]):
        super().__init__(message)
        self.code = code
        self.message = message
        self.record_errors = record_errors


def wrap64(v: int) -> int:
    """Java long arithmetic (Kafka's messages print wrapped bounds)."""
    return (v + (1 << 63)) % _INT64 - (1 << 63)


def record_validation_error(tp, cfg, buf, info, now: int) -> RecordValidationError:
    """The answer to a batch with failing records (``info.record_errors``):
    LogValidator.processRecordErrors — INVALID_TIMESTAMP if any failure is a timestamp
    one, else INVALID_RECORD, with validateKey/validateTimestamp's messages."""
    before, after = cfg.timestamp_before_max_ms, cfg.timestamp_after_max_ms
    records = None
    errors = []
    timestamp_error = False
    for index, kind, ts in info.record_errors:
        if kind == _records.RECORD_ERROR_NO_KEY:
            msg = f"Compacted topic cannot accept message without key in topic partition {tp[0]}-{tp[1]}"
        elif kind == _records.RECORD_ERROR_TIMESTAMP:
            timestamp_error = True
            # the record's offset before offsets are assigned: the client's base offset (0) + delta
            msg = (f"Timestamp {ts} of message with offset {index} is out of range. The timestamp should be "
                   f"within [{wrap64(now - before)}, {wrap64(now + after)}]")
        elif kind == _records.RECORD_ERROR_KEY_SCHEMA or kind == _records.RECORD_ERROR_VALUE_SCHEMA:
            what = "key" if kind == _records.RECORD_ERROR_KEY_SCHEMA else "value"
            why = (f"it is {ts - 256} bytes, shorter than the 5-byte header" if ts >= 256
                   else f"its first byte is 0x{ts:02x}, not the magic byte 0")
            msg = f"Record {index}: {what} has no schema-registry header ({why})"
        else:
            timestamp_error = True
            if records is None:  # only this message shows a record's key and value sizes
                records = _decode(buf, info).records
            r = records[index]
            msg = (f"Invalid timestamp type in message DefaultRecord(offset={r.offset}, timestamp={r.timestamp}, "
                   f"key={0 if r.key is None else len(r.key)} bytes, "
                   f"value={0 if r.value is None else len(r.value)} bytes). "
                   "Producer should not set timestamp type to LogAppendTime.")
        errors.append((index, msg))
    if timestamp_error:
        return RecordValidationError(ErrorCode.INVALID_TIMESTAMP,
                                     "One or more records have been rejected due to invalid timestamp", errors)
    return invalid_record_error(errors)


def invalid_record_error(errors: list[tuple[int, str]]) -> RecordValidationError:
    """INVALID_RECORD for ``errors`` [(index in the batch, message)], with the message of
    Kafka's RecordValidationException (the first three errors shown)."""
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    return RecordValidationError(
        ErrorCode.INVALID_RECORD,
        f"One or more records have been rejected due to {len(errors)} record errors in total, "
        f"and only showing the first three errors at most: [{shown}]", errors)


def batch_max_timestamp(info) -> int:
    """LogValidator's maxBatchTimestamp: the largest record timestamp, -1 when none is
    above -1; a LogAppendTime batch's records all carry its header max_timestamp."""
    ts = info.max_timestamp if info.timestamp_type == LOG_APPEND_TIME else info.max_record_timestamp
    return ts if ts > -1 else -1


def set_max_timestamps(buf, infos, log_append_time: bool, now: int):
    """``batch.setMaxTimestamp`` for every batch: LogAppendTime with ``now`` on a
    LogAppendTime topic, else CreateTime with :func:`batch_max_timestamp`. The CRC is
    recomputed only for a batch that changes. Returns the buffer to append (a writable
    copy when ``buf`` is read-only and a header changes)."""
    writable = None
    for info in infos:
        if log_append_time:
            ts_type, max_ts = LOG_APPEND_TIME, now
        elif info.timestamp_type == LOG_APPEND_TIME:     # batch_max_timestamp, inline
            ts_type, max_ts = CREATE_TIME, info.max_timestamp if info.max_timestamp > -1 else -1
        else:
            ts_type, max_ts = CREATE_TIME, info.max_record_timestamp if info.max_record_timestamp > -1 else -1
        if info.timestamp_type == ts_type and info.max_timestamp == max_ts:
            continue
        if writable is None:
            writable = buf if isinstance(buf, bytearray) or (
                isinstance(buf, memoryview) and not buf.readonly) else bytearray(buf)
        _records.set_max_timestamp(writable, info.position, ts_type, max_ts)
    return buf if writable is None else writable


def target_compression(cfg) -> tuple[int, int | None] | None:
    """(codec id, level) the topic's compression.type asks for (Kafka's
    BrokerCompressionType.targetCompression), None for "producer" (keep the batch's)."""
    name = cfg.compression_type.lower()
    if name == "producer":
        return None
    codec = CODECS[name]
    key = _LEVEL_CONFIGS.get(codec)
    level = cfg.get(key) if key is not None else None
    if codec == _records.GZIP and level == -1:
        level = None  # Deflater.DEFAULT_COMPRESSION
    return codec, level


def recompress(buf, infos, codec: int, level: int | None, log_append_time: bool, now: int) -> bytes:
    """LogValidator.buildRecordsAndAssignOffsets: each batch's records rebuilt into a batch
    compressed with ``codec`` at ``level`` (producer id, epoch, sequence and transactional
    flag kept; records keep their timestamps, keys, values and headers; the header's
    max_timestamp as :func:`set_max_timestamps` would set it)."""
    out = []
    for info in infos:
        b = _decode(buf, info)
        raw = bytearray(_records.encode_batch(
            [(r.timestamp, r.key, r.value, r.headers) for r in b.records], compression=codec,
            compression_level=level, timestamp_type=LOG_APPEND_TIME if log_append_time else CREATE_TIME,
            producer_id=b.producer_id, producer_epoch=b.producer_epoch, base_sequence=b.base_sequence,
            is_transactional=b.is_transactional))
        _records.set_max_timestamp(raw, 0, LOG_APPEND_TIME if log_append_time else CREATE_TIME,
                                   now if log_append_time else batch_max_timestamp(info))
        out.append(raw)
    return bytearray(b"".join(out)) if len(out) > 1 else out[0]


def _decode(buf, info):
    mv = memoryview(buf).cast("B")[info.position:info.position + info.size_in_bytes]
    return _records.decode_batch(mv)

"""Produce: acks 0/1/all, per-partition errors, answered now or from the produce purgatory.

Only record batch v2 is stored, so Produce v3+ is implemented (Kafka 4.0 also
dropped v0-v2, KIP-896): each partition's records must be exactly one v2 batch
(``validate_records``, Kafka's ProduceRequest.validateRecords); the replica
manager then applies LogValidator's checks (replica_manager.py). With acks=0 there is no response; an error then closes
the connection so the client notices (Kafka's behaviour).
"""
from __future__ import annotations

import logging
import struct

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.produce import (
    BatchIndexAndErrorMessage, PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.replica_manager import ProducePartitionResult

log = logging.getLogger(__name__)


def handle_produce(broker, ctx, req) -> None:
    v = ctx.api_version
    acks = req.acks
    if acks not in (-1, 0, 1):
        results = {(t.name, p.index): ErrorCode.INVALID_REQUIRED_ACKS
                   for t in req.topic_data for p in t.partition_data}
        _respond_errors(ctx, req, results)
        return
    if req.transactional_id is not None and v >= 3:
        # transactions are not implemented yet (no coordinator can have begun one)
        results = {(t.name, p.index): ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                   for t in req.topic_data for p in t.partition_data}
        _respond_errors(ctx, req, results)
        return
    # KafkaApis.handleProduceRequest: an unknown partition, then records that break
    # ProduceRequest.validateRecords, are answered without reaching the replica manager
    rm = broker.replica_manager
    entries = {}
    order = []
    early = {}
    for t in req.topic_data:
        name = t.name
        for p in t.partition_data:
            tp = (name, p.index)
            order.append(tp)
            if rm.get_partition(tp) is None:
                early[tp] = ProducePartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            err = validate_records(v, p.records)
            if err != ErrorCode.NONE:
                early[tp] = ProducePartitionResult(err)
            else:
                entries[tp] = p.records

    def respond(results) -> None:
        if early:
            results = {**results, **early}
        if acks == 0:
            if any(r.error != ErrorCode.NONE for r in results.values()):
                bad = {f"{tp[0]}-{tp[1]}": ErrorCode(r.error).name for tp, r in results.items()
                       if r.error != ErrorCode.NONE}
                log.info("closing connection %s after acks=0 produce errors: %s", ctx.connection_id, bad)
                ctx.close_connection()
            else:
                ctx.respond_no_op()
            return
        topics: dict[str, list] = {}
        for tp in order:
            r = results[tp]
            pr = PartitionProduceResponse(index=tp[1], error_code=r.error, base_offset=r.base_offset,
                                          log_append_time_ms=r.log_append_time_ms,
                                          log_start_offset=r.log_start_offset)
            if v >= 8:
                if r.record_errors:
                    pr.record_errors = [BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                                        for i, m in r.record_errors]
                if r.error != ErrorCode.NONE:
                    pr.error_message = r.error_message
            ps = topics.get(tp[0])
            if ps is None:
                topics[tp[0]] = [pr]
            else:
                ps.append(pr)
        ctx.respond(ProduceResponse(
            responses=[TopicProduceResponse(name=n, partition_responses=ps) for n, ps in topics.items()],
            throttle_time_ms=0))

    broker.replica_manager.append_records(req.timeout_ms, acks, entries, respond, produce_version=v)


def validate_records(version: int, records) -> int:
    """Kafka's ProduceRequest.validateRecords (v3+): the error code for a partition's
    records, NONE when they may go on to the log. Walks batch headers as Kafka's
    MemoryRecords.batches() does (a batch cut short ends the walk): no complete batch,
    or a first batch not of magic 2, is INVALID_RECORD; zstd before v7 is
    UNSUPPORTED_COMPRESSION_TYPE; a second batch is INVALID_RECORD ("exactly one record
    batch per partition"). A batch size below the legacy minimum or a magic outside 0..2
    is CORRUPT_MESSAGE (the iterator's CorruptRecordException)."""
    if records is None:
        return ErrorCode.INVALID_RECORD
    n = len(records)
    first = _next_batch(records, 0, n)
    if first is None:
        return ErrorCode.INVALID_RECORD      # "must have at least one record batch per partition"
    if first < 0:
        return ErrorCode.CORRUPT_MESSAGE
    if _i8(records, _MAGIC_OFFSET)[0] != 2:
        return ErrorCode.INVALID_RECORD      # "only allowed to contain record batches with magic version 2"
    if version < 7 and _i16(records, _ATTRIBUTES_OFFSET)[0] & _COMPRESSION_MASK == _ZSTD:
        return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    if first == n:
        return ErrorCode.NONE
    second = _next_batch(records, first, n)
    if second is None:
        return ErrorCode.NONE
    if second < 0:
        return ErrorCode.CORRUPT_MESSAGE
    return ErrorCode.INVALID_RECORD          # "only allowed to contain exactly one record batch per partition"


_LENGTH_OFFSET = 8
_MAGIC_OFFSET = 16
_ATTRIBUTES_OFFSET = 21
_COMPRESSION_MASK = 0x07
_ZSTD = 4
_LOG_OVERHEAD = 12
_LEGACY_RECORD_OVERHEAD_V0 = 14
_i8 = struct.Struct(">b").unpack_from
_i16 = struct.Struct(">h").unpack_from
_i32 = struct.Struct(">i").unpack_from


def _next_batch(buf, pos: int, n: int) -> int | None:
    """Kafka's ByteBufferLogInputStream.nextBatch(Size) at ``pos`` of ``buf`` (``n`` bytes):
    the end of the batch there, None when no complete batch is left, -1 when its size or
    magic is corrupt."""
    left = n - pos
    if left < _LOG_OVERHEAD:
        return None
    size = _i32(buf, pos + _LENGTH_OFFSET)[0]
    if size < _LEGACY_RECORD_OVERHEAD_V0:
        return -1
    if left < _MAGIC_OFFSET + 1:
        return None
    if not 0 <= _i8(buf, pos + _MAGIC_OFFSET)[0] <= 2:
        return -1
    if left < _LOG_OVERHEAD + size:
        return None
    return pos + _LOG_OVERHEAD + size


def _respond_errors(ctx, req, codes) -> None:
    if req.acks == 0:
        ctx.close_connection()
        return
    ctx.respond(ProduceResponse(responses=[
        TopicProduceResponse(name=t.name, partition_responses=[
            PartitionProduceResponse(index=p.index, error_code=codes[(t.name, p.index)])
            for p in t.partition_data]) for t in req.topic_data], throttle_time_ms=0))


HANDLERS = {ApiKey.PRODUCE: ApiHandler(3, 11, handle_produce)}

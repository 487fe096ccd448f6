"""Produce: acks 0/1/all, per-partition errors, answered now or from the produce purgatory.

Only record batch v2 is stored, so Produce v3+ is implemented (Kafka 4.0 also
dropped v0-v2, KIP-896): each partition's records must be exactly one v2 batch
(Kafka's ProduceRequest.validateRecords); the replica manager then applies
LogValidator's checks (replica_manager.py). Per partition, the records' headers are
walked once, in the records kernel (``validate_batches(produce_version=...)``: the
request's checks, then the base offset and size, then the batches); an unknown
partition is answered here first, and the replica manager keeps Kafka's order of
answers where its own checks (min.insync.replicas, internal topics) come between.
With acks=0 there is no response; an error then closes the connection so the client
notices (Kafka's behaviour).

With an authorizer (kbroker.server.authz): WRITE on each topic (else TOPIC_AUTHORIZATION_FAILED
for its partitions) and, for transactional batches, WRITE on the transactional id (else every
partition answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED), as KafkaApis checks.

Transactional batches need the request's ``transactional_id`` (else every partition
answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED, Kafka's check before its ACL) and a
producer id and epoch (else INVALID_RECORD); the log then applies Kafka's producer
rules (INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE for a plain batch inside the
producer's open transaction) and starts or extends its ongoing transaction. KIP-890's
verification with the transaction coordinator happens in the replica manager first
(:mod:`kbroker.server.txn_verification`).
"""
from __future__ import annotations

import logging

from kbroker.kernels import records as _records
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.produce import (
    BatchIndexAndErrorMessage, LeaderIdAndEpoch, NodeEndpoint, PartitionProduceResponse, ProduceResponse,
    TopicProduceResponse,
)
from kbroker.server.apis.produce_response import EncodedBody, encode_success_response
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import TOPIC, TRANSACTIONAL_ID, WRITE, authz
from kbroker.server.replica_manager import ProducePartitionResult

log = logging.getLogger(__name__)

_NONE = int(ErrorCode.NONE)                                        # plain ints: no enum lookups per partition
_NOT_LEADER_OR_FOLLOWER = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)


def handle_produce(broker, ctx, req) -> None:
    v = ctx.api_version
    acks = req.acks
    if acks not in (-1, 0, 1):
        results = {(t.name, p.index): ErrorCode.INVALID_REQUIRED_ACKS
                   for t in req.topic_data for p in t.partition_data}
        _respond_errors(ctx, req, results)
        return
    if req.transactional_id is None and _has_transactional_records(req):
        # KafkaApis: transactional records need a transactional id (the ACL's resource)
        results = {(t.name, p.index): ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                   for t in req.topic_data for p in t.partition_data}
        _respond_errors(ctx, req, results)
        return
    q = ctx.quotas
    if q is not None and q.produce.enabled:
        # the request's bytes count against producer_byte_rate (Kafka: request.sizeInBytes)
        ctx.bandwidth_throttle_ms = q.produce.record_and_get_throttle_ms(
            ctx.user, ctx.client_id or "", len(ctx.request.payload))
    auth = authz(broker, ctx)
    if (auth is not None and req.transactional_id is not None and _has_transactional_records(req)
            and not auth.allowed(WRITE, TRANSACTIONAL_ID, req.transactional_id)):
        _respond_errors(ctx, req, {(t.name, p.index): ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                                   for t in req.topic_data for p in t.partition_data})
        return
    # KafkaApis.handleProduceRequest: an unauthorized topic, an unknown partition, then records that break
    # ProduceRequest.validateRecords, are answered without reaching the replica manager
    rm = broker.replica_manager
    partitions = rm.partitions
    entries = {}
    by_topic: dict[str, list] = {}      # the answer's order: topics as first named, partitions in request order
    early = {}
    for t in req.topic_data:
        name = t.name
        tps = by_topic.get(name)
        if tps is None:
            tps = by_topic[name] = []
        if auth is not None and not auth.allowed(WRITE, TOPIC, name):
            for p in t.partition_data:
                tp = (name, p.index)
                tps.append(tp)
                early[tp] = ProducePartitionResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            continue
        for p in t.partition_data:
            tp = (name, p.index)
            tps.append(tp)
            part = partitions.get(tp)
            if part is not None and part.is_leader:
                entries[tp] = p.records      # ProduceRequest.validateRecords: in the replica manager
            else:
                early[tp] = ProducePartitionResult(rm.partition_error(tp))

    def respond(results) -> None:
        if early:
            results = {**results, **early}
        if acks == 0:
            if any(r.error != _NONE for r in results.values()):
                bad = {f"{tp[0]}-{tp[1]}": ErrorCode(r.error).name for tp, r in results.items()
                       if r.error != _NONE}
                log.info("closing connection %s after acks=0 produce errors: %s", ctx.connection_id, bad)
                ctx.close_connection()
            else:
                ctx.respond_no_op()
            return
        if ctx.quotas is None and not ctx.bandwidth_throttle_ms and getattr(ctx, "on_response", None) is None:
            # no throttle time to write and nobody to hand the response object to
            body = encode_success_response(v, by_topic, results)
            if body is not None:
                ctx.respond(EncodedBody(body))
                return
        ctx.respond(_response(broker, ctx, v, by_topic, results))

    rm.append_records(req.timeout_ms, acks, entries, respond, produce_version=v, transactional_id=req.transactional_id)


def _response(broker, ctx, v: int, by_topic: dict, results: dict) -> ProduceResponse:
    """The ProduceResponse: one PartitionProduceResponse per partition, in request order,
    grouped by topic name (a topic named twice in the request answers once, as Kafka's
    response map does)."""
    node_endpoints: dict = {}
    flexible_errors = v >= 8
    leaders = v >= 10
    responses = []
    for name, tps in by_topic.items():
        ps = []
        for tp in tps:
            r = results[tp]
            err = r.error
            pr = PartitionProduceResponse(index=tp[1], error_code=err, base_offset=r.base_offset,
                                          log_append_time_ms=r.log_append_time_ms,
                                          log_start_offset=r.log_start_offset)
            if flexible_errors and r.record_errors:
                pr.record_errors = [BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                                    for i, m in r.record_errors]
            if err != _NONE:
                if flexible_errors:
                    pr.error_message = r.error_message
                if err == _NOT_LEADER_OR_FOLLOWER and leaders:
                    _current_leader(broker, ctx, tp, pr, node_endpoints)
            ps.append(pr)
        responses.append(TopicProduceResponse(name=name, partition_responses=ps))
    resp = ProduceResponse(responses=responses, throttle_time_ms=0)
    if node_endpoints:
        resp.node_endpoints = list(node_endpoints.values())
    return resp


def _current_leader(broker, ctx, tp, pr, node_endpoints) -> None:
    """KIP-951: name the partition's leader (and its endpoint) in a NOT_LEADER_OR_FOLLOWER answer."""
    leader = broker.metadata_cache.leader_of(tp[0], tp[1])
    if leader is None or leader[0] < 0:
        return
    pr.current_leader = LeaderIdAndEpoch(leader_id=leader[0], leader_epoch=leader[1])
    if leader[0] not in node_endpoints:
        listener = getattr(ctx.request, "listener_name", None)
        ep = broker.metadata_cache.endpoint(leader[0], listener)
        if ep is not None:
            rack = next((r for i, _h, _p, r in broker.metadata_cache.alive_brokers(listener) if i == leader[0]), None)
            node_endpoints[leader[0]] = NodeEndpoint(node_id=leader[0], host=ep[0], port=ep[1], rack=rack)


def _has_transactional_records(req) -> bool:
    """Kafka's ProduceRequest.hasTransactionalRecords: a partition's (first) batch has the
    transactional attribute (byte 22 of a v2 batch, bit 0x10). Malformed records are
    left to the records kernel."""
    for t in req.topic_data:
        for p in t.partition_data:
            r = p.records
            if r is not None and len(r) > 22 and r[16] == 2 and r[22] & 0x10:
                return True
    return False


def validate_records(version: int, records) -> int:
    """Kafka's ProduceRequest.validateRecords (v3+): the error code for a partition's
    records, NONE when they may go on to the log (``kernels.records.produce_records_error``;
    the replica manager runs the same walk inside ``validate_batches``, see the module
    docstring)."""
    return _records.produce_records_error(records, version)


def _respond_errors(ctx, req, codes) -> None:
    if req.acks == 0:
        ctx.close_connection()
        return
    ctx.respond(ProduceResponse(responses=[
        TopicProduceResponse(name=t.name, partition_responses=[
            PartitionProduceResponse(index=p.index, error_code=codes[(t.name, p.index)])
            for p in t.partition_data]) for t in req.topic_data], throttle_time_ms=0))


HANDLERS = {ApiKey.PRODUCE: ApiHandler(3, 12, handle_produce)}

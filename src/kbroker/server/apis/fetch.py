"""Fetch: full and incremental (KIP-227) fetches, long polling in the fetch purgatory,
record data sent as FileRegions (sendfile, zero copy)."""
from __future__ import annotations

import uuid
from collections import OrderedDict

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.fetch import FetchableTopicResponse, FetchResponse, PartitionData
from kbroker.server.apis import ApiHandler
from kbroker.server.delayed import FetchPartitionStatus
from kbroker.server.fetch_session import CachedPartition, FetchSessionError
from kbroker.server.replica_manager import region_size as _region_size

ZERO_UUID = uuid.UUID(int=0)


def handle_fetch(broker, ctx, req) -> None:
    v = ctx.api_version
    image = broker.metadata.image
    replica_id = req.replica_id if v <= 14 else req.replica_state.replica_id
    if replica_id >= 0:
        # no followers on a single node yet
        ctx.respond(FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                  session_id=0, responses=[]))
        return
    requested: OrderedDict = OrderedDict()
    unknown_ids: list[tuple] = []  # (topic_id, partition) not resolvable (v13+)
    for t in req.topics:
        if v >= 13:
            ti = image.topics_by_id.get(t.topic_id)
            if ti is None:
                unknown_ids.extend((t.topic_id, p.partition) for p in t.partitions)
                continue
            name = ti.name
        else:
            name = t.topic
        for p in t.partitions:
            requested[(name, p.partition)] = CachedPartition(
                p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch,
                p.log_start_offset, p.last_fetched_epoch,
                topic_id=t.topic_id if v >= 13 else None)
    forgotten = []
    for f in req.forgotten_topics_data if v >= 7 else ():
        if v >= 13:
            ti = image.topics_by_id.get(f.topic_id)
            if ti is None:
                continue
            forgotten.extend((ti.name, p) for p in f.partitions)
        else:
            forgotten.extend((f.topic, p) for p in f.partitions)
    try:
        fctx = broker.fetch_sessions.new_context(req.session_id if v >= 7 else 0,
                                                 req.session_epoch if v >= 7 else -1,
                                                 requested, forgotten, False)
    except FetchSessionError as e:
        ctx.respond(FetchResponse(throttle_time_ms=0, error_code=e.code, session_id=0, responses=[]))
        return
    fetch_list = fctx.fetch_list()
    infos = [(tp, FetchPartitionStatus(cp.fetch_offset, cp.max_bytes, cp.current_leader_epoch,
                                       cp.log_start_offset, cp.last_fetched_epoch)) for tp, cp in fetch_list]
    max_bytes = min(req.max_bytes if v >= 3 else 2**31 - 1, broker.config["fetch.max.bytes"])
    isolation = req.isolation_level if v >= 4 else 0

    def respond(results: dict) -> None:
        topics: "OrderedDict[str, list]" = OrderedDict()
        ids = {}
        for tp, cp in fetch_list:
            r = results[tp]
            has_records = _region_size(r.records) > 0
            if not fctx.include(tp, cp, r.error, r.high_watermark, r.last_stable_offset,
                                r.log_start_offset, has_records):
                continue
            topics.setdefault(tp[0], []).append(PartitionData(
                partition_index=tp[1], error_code=r.error, high_watermark=r.high_watermark,
                last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset,
                aborted_transactions=None if isolation == 0 else [],
                preferred_read_replica=-1, records=r.records if has_records else b""))
            ids[tp[0]] = cp.topic_id
        responses = []
        for name, parts in topics.items():
            if v >= 13:
                responses.append(FetchableTopicResponse(topic_id=ids[name] or ZERO_UUID, partitions=parts))
            else:
                responses.append(FetchableTopicResponse(topic=name, partitions=parts))
        for topic_id, p in unknown_ids:
            responses.append(FetchableTopicResponse(topic_id=topic_id, partitions=[PartitionData(
                partition_index=p, error_code=ErrorCode.UNKNOWN_TOPIC_ID, high_watermark=-1,
                last_stable_offset=-1, log_start_offset=-1, records=b"")]))
        ctx.respond(FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                  session_id=fctx.session_id, responses=responses))

    broker.replica_manager.fetch_messages(req.max_wait_ms, req.min_bytes, max_bytes, isolation, infos, respond,
                                          replica_id)


HANDLERS = {ApiKey.FETCH: ApiHandler(4, 16, handle_fetch)}

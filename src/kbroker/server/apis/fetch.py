"""Fetch: full and incremental (KIP-227) fetches, long polling in the fetch purgatory,
record data sent as FileRegions (sendfile, zero copy). ``isolation_level=1``
(read_committed): records below the last stable offset only, with the aborted
transactions (producer id, first offset) that overlap them, from the ``.txnindex``."""
from __future__ import annotations

from collections import OrderedDict

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.fetch import (
    AbortedTransaction, EpochEndOffset, FetchableTopicResponse, FetchResponse, LeaderIdAndEpoch, NodeEndpoint,
    PartitionData,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import CLUSTER, CLUSTER_ACTION, READ, TOPIC, allowed, authz
from kbroker.server.delayed import FetchPartitionStatus
from kbroker.server.fetch_session import CachedPartition, FetchSessionError
from kbroker.server.replica_manager import FetchPartitionResult, region_size as _region_size


def _topic_id_error(image, cp: CachedPartition) -> int:
    """Kafka 3.9 for a partition fetched by topic id (KafkaApis.handleFetchRequest and
    ReplicaManager.readFromLog): an id never resolved to a name is UNKNOWN_TOPIC_ID; a name
    no longer in the metadata is UNKNOWN_TOPIC_OR_PARTITION; a name now held by a topic
    with another id (deleted and re-created) is INCONSISTENT_TOPIC_ID."""
    if cp.topic is None:
        return ErrorCode.UNKNOWN_TOPIC_ID
    t = image.topics.get(cp.topic)
    if t is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if t.topic_id != cp.topic_id:
        return ErrorCode.INCONSISTENT_TOPIC_ID
    return ErrorCode.NONE


def _current_leader(broker, ctx, tp, pd, node_endpoints, v: int) -> None:
    """KIP-951: name the partition's leader in a NOT_LEADER_OR_FOLLOWER answer (v12+), and
    its endpoint (v16+)."""
    leader = broker.metadata_cache.leader_of(tp[0], tp[1])
    if leader is None or leader[0] < 0:
        return
    pd.current_leader = LeaderIdAndEpoch(leader_id=leader[0], leader_epoch=leader[1])
    if v >= 16 and leader[0] not in node_endpoints:
        ep = broker.metadata_cache.endpoint(leader[0], getattr(ctx.request, "listener_name", None))
        if ep is not None:
            node_endpoints[leader[0]] = NodeEndpoint(node_id=leader[0], host=ep[0], port=ep[1], rack=None)


def _fetch_session(broker, ctx, req, image, follower: bool):
    """The request's fetch session context (KIP-227) and its fetch list, or None once a
    session error has been answered. v13+ names topics by id: the session keys its
    partitions by (topic_id, partition), else by (name, partition). A follower's session is
    privileged in the broker's one session cache, as in Kafka."""
    v = ctx.api_version
    uses_topic_ids = v >= 13
    requested: OrderedDict = OrderedDict()
    for t in req.topics:
        if uses_topic_ids:
            ti = image.topics_by_id.get(t.topic_id)
            name = ti.name if ti is not None else None
        else:
            name = t.topic
        for p in t.partitions:
            key = (t.topic_id, p.partition) if uses_topic_ids else (name, p.partition)
            requested[key] = CachedPartition(
                p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch, p.log_start_offset,
                p.last_fetched_epoch, topic_id=t.topic_id if uses_topic_ids else None, topic=name)
    forgotten = [((f.topic_id if uses_topic_ids else f.topic), p)
                 for f in (req.forgotten_topics_data if v >= 7 else ()) for p in f.partitions]
    try:
        fctx = broker.fetch_sessions.new_context(req.session_id if v >= 7 else 0,
                                                 req.session_epoch if v >= 7 else -1,
                                                 requested, forgotten, follower, uses_topic_ids)
    except FetchSessionError as e:
        ctx.respond(FetchResponse(throttle_time_ms=0, error_code=e.code, session_id=0, responses=[]))
        return None

    def resolve_name(topic_id):
        ti = image.topics_by_id.get(topic_id)
        return ti.name if ti is not None else None

    return fctx, fctx.fetch_list(resolve_name if uses_topic_ids else None)


def handle_fetch(broker, ctx, req) -> None:
    v = ctx.api_version
    image = broker.metadata.image
    replica_id = req.replica_id if v <= 14 else req.replica_state.replica_id
    if replica_id >= 0:
        ctx.quota_exempt = True          # replication is not a client: no client quotas
        handle_replica_fetch(broker, ctx, req, replica_id)
        return
    uses_topic_ids = v >= 13
    got = _fetch_session(broker, ctx, req, image, follower=False)
    if got is None:
        return
    fctx, fetch_list = got
    erroneous: dict = {}  # key -> FetchPartitionResult, answered without reading
    infos = []
    auth = authz(broker, ctx)
    for key, cp in fetch_list:
        err = _topic_id_error(image, cp) if uses_topic_ids else ErrorCode.NONE
        if err == ErrorCode.NONE and auth is not None and not auth.allowed(READ, TOPIC, cp.topic):
            err = ErrorCode.TOPIC_AUTHORIZATION_FAILED      # KafkaApis: READ on the topic
        if err != ErrorCode.NONE:
            erroneous[key] = FetchPartitionResult(err)
            continue
        infos.append(((cp.topic, key[1]), FetchPartitionStatus(
            cp.fetch_offset, cp.max_bytes, cp.current_leader_epoch, cp.log_start_offset, cp.last_fetched_epoch)))
    max_bytes = min(req.max_bytes if v >= 3 else 2**31 - 1, broker.config["fetch.max.bytes"])
    if ctx.quotas is not None and ctx.quotas.fetch.enabled:
        # at most what the quota allows in its window, so a throttled consumer still advances
        max_bytes = min(max_bytes, ctx.quotas.fetch.max_value_in_window(ctx.user, ctx.client_id or ""))
    isolation = req.isolation_level if v >= 4 else 0

    def respond(results: dict) -> None:
        q = ctx.quotas
        if q is not None and q.fetch.enabled and _throttled(ctx, q, results):
            # KafkaApis: a throttled fetch is answered empty (its bytes not counted), the
            # session kept only when it was an incremental fetch (getThrottledResponse)
            ctx.respond(FetchResponse(throttle_time_ms=ctx.bandwidth_throttle_ms, error_code=ErrorCode.NONE,
                                      session_id=0 if fctx.full else fctx.session_id, responses=[]))
            return
        topics: "OrderedDict[object, list]" = OrderedDict()  # topic id (v13+) or name -> partitions
        node_endpoints: dict = {}
        for key, cp in fetch_list:
            r = erroneous.get(key) or results[(cp.topic, key[1])]
            has_records = _region_size(r.records) > 0
            if not fctx.include(key, cp, r.error, r.high_watermark, r.last_stable_offset,
                                r.log_start_offset, has_records):
                continue
            pd = PartitionData(
                partition_index=key[1], error_code=r.error, high_watermark=r.high_watermark,
                last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset,
                aborted_transactions=None if isolation == 0 else [
                    AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in (r.aborted_transactions or ())],
                preferred_read_replica=-1, records=r.records if has_records else b"")
            if r.error == ErrorCode.NOT_LEADER_OR_FOLLOWER and v >= 12:
                _current_leader(broker, ctx, (cp.topic, key[1]), pd, node_endpoints, v)
            topics.setdefault(key[0], []).append(pd)
        if uses_topic_ids:
            responses = [FetchableTopicResponse(topic_id=tid, partitions=parts) for tid, parts in topics.items()]
        else:
            responses = [FetchableTopicResponse(topic=name, partitions=parts) for name, parts in topics.items()]
        resp = FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                             session_id=fctx.session_id, responses=responses)
        if node_endpoints:
            resp.node_endpoints = list(node_endpoints.values())
        ctx.respond(resp)

    broker.replica_manager.fetch_messages(req.max_wait_ms, req.min_bytes, max_bytes, isolation, infos, respond,
                                          replica_id)


def _throttled(ctx, q, results: dict) -> bool:
    """Record the response's bytes against consumer_byte_rate; on a violation take them
    back, set the context's bandwidth throttle and return True."""
    size = sum(_region_size(r.records) for r in results.values())
    user, client_id = ctx.user, ctx.client_id or ""
    throttle = q.fetch.record_and_get_throttle_ms(user, client_id, size)
    if not throttle:
        return False
    q.fetch.unrecord(user, client_id, size)
    ctx.bandwidth_throttle_ms = throttle
    return True


# -- followers ---------------------------------------------------------------------------------
def handle_replica_fetch(broker, ctx, req, replica_id: int) -> None:
    """A follower's Fetch (replica id >= 0; its broker epoch in ReplicaState, v15+): every
    partition answered by the ReplicaManager's follower read (epochs, diverging epoch,
    records up to the log end, the follower's state, ISR expansion, high watermark),
    long-polled in the same fetch purgatory as consumers (min_bytes / max_wait_ms), the
    records sent zero-copy. In a fetch session (KIP-227, the broker's FetchSessionCache,
    privileged) as consumers' fetches: an incremental request lists only changed
    partitions, every partition of the session is read (its follower state updated at
    its cached fetch offset), and the answer carries only partitions with news.
    A node that is not a broker of a replicated cluster (zero-config) has no followers:
    NOT_LEADER_OR_FOLLOWER for the whole request."""
    v = ctx.api_version
    rm = broker.replica_manager
    if getattr(rm, "replica_fetcher_manager", None) is None:
        ctx.respond(FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                  session_id=0, responses=[]))
        return
    if not allowed(broker, ctx, CLUSTER_ACTION, CLUSTER):
        # KafkaApis: a follower needs ClusterAction on the cluster; else every partition is refused
        err = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        ctx.respond(FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, session_id=0, responses=[
            FetchableTopicResponse(topic_id=t.topic_id, partitions=[
                PartitionData(partition_index=p.partition, error_code=err, high_watermark=-1, last_stable_offset=-1,
                              log_start_offset=-1, preferred_read_replica=-1, records=b"") for p in t.partitions])
            if v >= 13 else FetchableTopicResponse(topic=t.topic, partitions=[
                PartitionData(partition_index=p.partition, error_code=err, high_watermark=-1, last_stable_offset=-1,
                              log_start_offset=-1, preferred_read_replica=-1, records=b"") for p in t.partitions])
            for t in req.topics]))
        return
    image = broker.metadata.image
    epoch = req.replica_state.replica_epoch if v >= 15 else -1
    uses_topic_ids = v >= 13
    got = _fetch_session(broker, ctx, req, image, follower=True)
    if got is None:
        return
    fctx, fetch_list = got
    infos = []
    for key, cp in fetch_list:
        if cp.topic is not None:
            infos.append(((cp.topic, key[1]), FetchPartitionStatus(
                cp.fetch_offset, cp.max_bytes, cp.current_leader_epoch, cp.log_start_offset, cp.last_fetched_epoch,
                replica_epoch=epoch)))
    max_bytes = min(req.max_bytes if v >= 3 else 2**31 - 1, broker.config["fetch.max.bytes"])

    def respond(results: dict) -> None:
        topics: "OrderedDict[object, list]" = OrderedDict()
        for key, cp in fetch_list:
            r = results.get((cp.topic, key[1])) if cp.topic is not None else None
            if r is None:
                r = FetchPartitionResult(ErrorCode.UNKNOWN_TOPIC_ID if uses_topic_ids
                                         else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            has_records = _region_size(r.records) > 0
            diverging = r.diverging_epoch is not None and v >= 12
            if not fctx.include(key, cp, r.error, r.high_watermark, r.last_stable_offset, r.log_start_offset,
                                has_records, must_respond=diverging):
                continue
            pd = PartitionData(partition_index=key[1], error_code=r.error, high_watermark=r.high_watermark,
                               last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset,
                               preferred_read_replica=-1, records=r.records if has_records else b"")
            if diverging:
                pd.diverging_epoch = EpochEndOffset(epoch=r.diverging_epoch[0], end_offset=r.diverging_epoch[1])
            topics.setdefault(key[0], []).append(pd)
        if uses_topic_ids:
            responses = [FetchableTopicResponse(topic_id=k, partitions=ps) for k, ps in topics.items()]
        else:
            responses = [FetchableTopicResponse(topic=k, partitions=ps) for k, ps in topics.items()]
        ctx.respond(FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, session_id=fctx.session_id,
                                  responses=responses))

    rm.fetch_messages(req.max_wait_ms, req.min_bytes, max_bytes, 0, infos, respond, replica_id)


HANDLERS = {ApiKey.FETCH: ApiHandler(4, 17, handle_fetch)}

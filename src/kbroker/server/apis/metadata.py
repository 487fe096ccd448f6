"""Metadata: brokers, controller, topics and their partitions; auto topic creation."""
from __future__ import annotations

import uuid

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.metadata import (
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.topics import TopicError, validate_topic_name

#: Kafka's "authorized operations not requested" marker
NOT_REQUESTED = -(2**31)
#: AclOperation codes a topic supports (no authorizer: all allowed): READ 3, WRITE 4,
#: CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
#: cluster: CREATE 5, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10,
#: ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12, CREATE_TOKENS 13, DESCRIBE_TOKENS 14
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12, 13, 14))


class _EncodedTopic:
    """A MetadataResponseTopic already encoded at one version: the response's encoder
    calls ``_write`` on each element of its topics array."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def _write(self, w, parts, v) -> None:
        w += self.data


class TopicMetadataCache:
    """Encoded MetadataResponseTopics, so a Metadata request for 10,000 partitions
    encodes only what changed since the last one.

    An entry is valid while the topic's TopicImage is the same object (images are
    replaced, never mutated) and so are its Partition objects (the ReplicaManager
    replaces its partitions map on every change and never mutates a Partition's
    leader epoch or replicas). Checking the partitions costs one dict lookup per
    partition only when the map object changed. Thread-safety: entries are replaced
    whole; a race encodes a topic twice, never serves a wrong one.
    """

    def __init__(self):
        self._entries: dict[str, tuple] = {}   # name -> (image, partitions map, parts, {key: bytes})

    def get(self, broker, t, v: int, include_ops: bool):
        rm = broker.replica_manager
        pmap = rm.partitions
        key = (v, include_ops)
        e = self._entries.get(t.name)
        if e is not None and e[0] is t:
            if e[1] is not pmap:
                parts = [pmap.get((t.name, p)) for p in range(t.num_partitions)]
                if len(parts) != len(e[2]) or any(a is not b for a, b in zip(parts, e[2])):
                    e = None
                else:
                    e = (t, pmap, e[2], e[3])
                    self._entries[t.name] = e
            if e is not None:
                data = e[3].get(key)
                if data is None:
                    data = e[3][key] = _encode_topic(_build_topic(broker, t, e[2], include_ops), v)
                return _EncodedTopic(data)
        parts = [pmap.get((t.name, p)) for p in range(t.num_partitions)]
        data = _encode_topic(_build_topic(broker, t, parts, include_ops), v)
        self._entries[t.name] = (t, pmap, parts, {key: data})
        return _EncodedTopic(data)

    def retain(self, names) -> None:
        """Forget topics not in ``names`` (deleted ones)."""
        for name in [n for n in self._entries if n not in names]:
            self._entries.pop(name, None)


def _encode_topic(topic: MetadataResponseTopic, v: int) -> bytes:
    w = bytearray()
    topic._write(w, [], v)
    return bytes(w)


def topic_metadata(broker, name: str, error: int = ErrorCode.NONE, include_ops: bool = False,
                   topic_id=None, version: int | None = None):
    """The topic's entry of a Metadata response (pre-encoded at ``version`` when the
    broker has a TopicMetadataCache and the topic exists)."""
    image = broker.metadata.image
    t = image.topics.get(name) if name is not None else image.topics_by_id.get(topic_id)
    if t is None or error != ErrorCode.NONE:
        return MetadataResponseTopic(error_code=error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name,
                                     topic_id=topic_id or uuid.UUID(int=0), partitions=[],
                                     topic_authorized_operations=NOT_REQUESTED)
    cache = getattr(broker, "metadata_cache", None)
    if cache is not None and version is not None:
        return cache.get(broker, t, version, include_ops)
    get = broker.replica_manager.get_partition
    return _build_topic(broker, t, [get((t.name, p)) for p in range(t.num_partitions)], include_ops)


def _build_topic(broker, t, partitions, include_ops: bool) -> MetadataResponseTopic:
    parts = []
    node = broker.node_id
    for p, part in enumerate(partitions):
        epoch = part.leader_epoch if part is not None else 0
        parts.append(MetadataResponsePartition(
            error_code=ErrorCode.NONE if part is not None else ErrorCode.LEADER_NOT_AVAILABLE,
            partition_index=p, leader_id=node if part is not None else -1, leader_epoch=epoch,
            replica_nodes=[node], isr_nodes=[node] if part is not None else [], offline_replicas=[]))
    return MetadataResponseTopic(
        error_code=ErrorCode.NONE, name=t.name, topic_id=t.topic_id, is_internal=t.is_internal,
        partitions=parts, topic_authorized_operations=TOPIC_OPERATIONS if include_ops else NOT_REQUESTED)


def handle_metadata(broker, ctx, req) -> None:
    v = ctx.api_version
    image = broker.metadata.image
    include_ops = v >= 8 and req.include_topic_authorized_operations
    topics = []
    if req.topics is None or (v == 0 and not req.topics):
        names = sorted(image.topics)
        topics = [topic_metadata(broker, n, include_ops=include_ops, version=v) for n in names]
        cache = getattr(broker, "metadata_cache", None)
        if cache is not None:
            cache.retain(image.topics)
    else:
        allow_auto = (req.allow_auto_topic_creation if v >= 4 else True) and broker.config["auto.create.topics.enable"]
        for rt in req.topics:
            name = rt.name
            if name is None:  # by topic id: v12+ only; v10-11 must name the topic (Kafka: INVALID_REQUEST,
                # and the response's name is not nullable before v12, so "")
                known = image.topics_by_id.get(rt.topic_id) if v >= 12 else None
                if known is not None:
                    topics.append(topic_metadata(broker, known.name, include_ops=include_ops, version=v))
                else:
                    topics.append(topic_metadata(broker, None if v >= 12 else "",
                                                 ErrorCode.UNKNOWN_TOPIC_ID if v >= 12 else ErrorCode.INVALID_REQUEST,
                                                 topic_id=rt.topic_id))
                continue
            if name not in image.topics:
                try:
                    validate_topic_name(name)
                except TopicError:
                    topics.append(topic_metadata(broker, name, ErrorCode.INVALID_TOPIC_EXCEPTION))
                    continue
                if allow_auto and name not in ("__consumer_offsets", "__transaction_state"):
                    try:
                        broker.topic_manager.auto_create(name)
                    except TopicError as e:
                        # e.g. a name colliding with an existing one ('.' vs '_'): Kafka's
                        # AutoTopicCreationManager answers the creation's error for the topic
                        topics.append(topic_metadata(broker, name, e.code))
                        continue
                    image = broker.metadata.image
                else:
                    topics.append(topic_metadata(broker, name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
            topics.append(topic_metadata(broker, name, include_ops=include_ops, version=v))
    host, port = broker.endpoint(ctx.request.listener_name)
    resp = MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponseBroker(node_id=broker.node_id, host=host, port=port, rack=broker.config["broker.rack"])],
        cluster_id=broker.cluster_id, controller_id=broker.node_id, topics=topics,
        cluster_authorized_operations=(CLUSTER_OPERATIONS if 8 <= v <= 10 and req.include_cluster_authorized_operations
                                       else NOT_REQUESTED))
    ctx.respond(resp)


HANDLERS = {ApiKey.METADATA: ApiHandler(0, 12, handle_metadata)}

"""Metadata: brokers, controller, topics and their partitions; auto topic creation.

With an authorizer (KafkaApis.handleTopicMetadataRequest): an all-topics request lists only the
topics the principal may DESCRIBE; a topic asked by name (or id) without DESCRIBE answers
TOPIC_AUTHORIZATION_FAILED; auto-creation needs CREATE on the cluster or on the topic (else
TOPIC_AUTHORIZATION_FAILED); the authorized operations fields carry the principal's own.
"""
from __future__ import annotations

import uuid

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.metadata import (
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import CLUSTER, CLUSTER_NAME, CREATE, DESCRIBE, TOPIC, authz
from kbroker.server.topics import TopicError, validate_topic_name

#: Kafka's "authorized operations not requested" marker
NOT_REQUESTED = -(2**31)
#: AclOperation codes a topic supports (no authorizer: all allowed): READ 3, WRITE 4,
#: CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11
TOPIC_OPS = (3, 4, 5, 6, 7, 8, 10, 11)
TOPIC_OPERATIONS = sum(1 << op for op in TOPIC_OPS)
#: cluster: CREATE 5, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10,
#: ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12, CREATE_TOKENS 13, DESCRIBE_TOKENS 14
CLUSTER_OPS = (5, 7, 8, 9, 10, 11, 12, 13, 14)
CLUSTER_OPERATIONS = sum(1 << op for op in CLUSTER_OPS)


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
    replaced, never mutated), so are its partition states (``metadata_cache.
    partition_states``: the ReplicaManager's Partition objects, or the KRaft image's
    registrations, never mutated) and so is the view's ``cluster_token`` (alive brokers).
    Comparing the states costs one lookup per partition only when the view's
    ``states_token`` (the partitions map, or the KRaft topic) changed.
    Thread-safety: entries are replaced whole; a race encodes a topic twice, never serves
    a wrong one.
    """

    def __init__(self):
        #: name -> (TopicImage, states token, partition states, {(version, ops): bytes}, cluster token)
        self._entries: dict[str, tuple] = {}

    def get(self, broker, t, v: int, include_ops: bool, view=None, cluster=None):
        """``t``'s entry encoded at ``v``; ``view`` / ``cluster``: the broker's metadata_cache
        and its cluster_token, when the caller read them once for many topics."""
        if view is None:
            view = broker.metadata_cache
            cluster = view.cluster_token
        token = view.states_token(t)
        key = (v, include_ops)
        e = self._entries.get(t.name)
        if e is not None and e[0] is t and e[4] is cluster:
            if e[1] is not token:
                states = view.partition_states(t)
                if len(states) != len(e[2]) or any(a is not b for a, b in zip(states, e[2])):
                    e = None
                else:
                    e = (t, token, e[2], e[3], cluster)
                    self._entries[t.name] = e
            if e is not None:
                data = e[3].get(key)
                if data is None:
                    data = e[3][key] = _encode_topic(_build_topic(view, t, e[2], include_ops), v)
                return _EncodedTopic(data)
        states = view.partition_states(t)
        data = _encode_topic(_build_topic(view, t, states, include_ops), v)
        self._entries[t.name] = (t, token, states, {key: data}, cluster)
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
    view = broker.metadata_cache
    image = view.image
    t = image.topics.get(name) if name is not None else image.topics_by_id.get(topic_id)
    if t is None or error != ErrorCode.NONE:
        return MetadataResponseTopic(error_code=error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name,
                                     topic_id=topic_id or uuid.UUID(int=0), partitions=[],
                                     topic_authorized_operations=NOT_REQUESTED)
    cache = getattr(broker, "topic_metadata_cache", None)
    if cache is not None and version is not None:
        return cache.get(broker, t, version, include_ops)
    return _build_topic(view, t, view.partition_states(t), include_ops)


def _build_topic(view, t, states, include_ops: bool) -> MetadataResponseTopic:
    return MetadataResponseTopic(
        error_code=ErrorCode.NONE, name=t.name, topic_id=t.topic_id, is_internal=t.is_internal,
        partitions=view.partition_metadata(t, states),
        topic_authorized_operations=TOPIC_OPERATIONS if include_ops else NOT_REQUESTED)


def _authorized_topic(broker, auth, name: str, include_ops: bool, v: int):
    """An existing topic's entry for a principal allowed to DESCRIBE it."""
    if not include_ops:
        return topic_metadata(broker, name, version=v)
    t = topic_metadata(broker, name, include_ops=True)
    t.topic_authorized_operations = auth.operations(TOPIC, name, TOPIC_OPS)
    return t


def handle_metadata(broker, ctx, req) -> None:
    v = ctx.api_version
    view = broker.metadata_cache
    image = view.image
    include_ops = v >= 8 and req.include_topic_authorized_operations
    auth = authz(broker, ctx)
    topics = []
    if req.topics is None or (v == 0 and not req.topics):
        names = sorted(image.topics)
        cache = getattr(broker, "topic_metadata_cache", None)
        if auth is not None:
            topics = [_authorized_topic(broker, auth, n, include_ops, v) for n in names
                      if auth.allowed(DESCRIBE, TOPIC, n)]
        elif cache is not None:
            get, by_name, cluster = cache.get, image.topics, view.cluster_token
            topics = [get(broker, by_name[n], v, include_ops, view, cluster) for n in names]
            cache.retain(image.topics)
        else:
            topics = [topic_metadata(broker, n, include_ops=include_ops, version=v) for n in names]
    else:
        allow_auto = (req.allow_auto_topic_creation if v >= 4 else True) and broker.config["auto.create.topics.enable"]
        for rt in req.topics:
            name = rt.name
            if name is None:  # by topic id: v12+ only; v10-11 must name the topic (Kafka: INVALID_REQUEST,
                # and the response's name is not nullable before v12, so "")
                known = image.topics_by_id.get(rt.topic_id) if v >= 12 else None
                if known is not None and auth is not None and not auth.allowed(DESCRIBE, TOPIC, known.name):
                    topics.append(topic_metadata(broker, None, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                 topic_id=rt.topic_id))
                elif known is not None:
                    topics.append(topic_metadata(broker, known.name, include_ops=include_ops, version=v))
                else:
                    topics.append(topic_metadata(broker, None if v >= 12 else "",
                                                 ErrorCode.UNKNOWN_TOPIC_ID if v >= 12 else ErrorCode.INVALID_REQUEST,
                                                 topic_id=rt.topic_id))
                continue
            if auth is not None:
                if not auth.allowed(DESCRIBE, TOPIC, name) or (
                        name not in image.topics and allow_auto and not auth.cluster(CREATE)
                        and not auth.allowed(CREATE, TOPIC, name)):
                    topics.append(topic_metadata(broker, name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    continue
                if name in image.topics:
                    topics.append(_authorized_topic(broker, auth, name, include_ops, v))
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
                    image = view.image
                    if name not in image.topics:
                        # created through the controller, not in this broker's metadata yet:
                        # Kafka's AutoTopicCreationManager answers LEADER_NOT_AVAILABLE (retriable)
                        topics.append(topic_metadata(broker, name, ErrorCode.LEADER_NOT_AVAILABLE))
                        continue
                else:
                    topics.append(topic_metadata(broker, name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
            topics.append(topic_metadata(broker, name, include_ops=include_ops, version=v))
    alive = view.alive_brokers(getattr(ctx.request, "listener_name", None))
    resp = MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponseBroker(node_id=i, host=host, port=port, rack=rack) for i, host, port, rack in alive],
        cluster_id=broker.cluster_id, controller_id=view.controller_id(alive), topics=topics,
        cluster_authorized_operations=(
            NOT_REQUESTED if not (8 <= v <= 10 and req.include_cluster_authorized_operations) else
            CLUSTER_OPERATIONS if auth is None else auth.operations(CLUSTER, CLUSTER_NAME, CLUSTER_OPS)))
    ctx.respond(resp)


HANDLERS = {ApiKey.METADATA: ApiHandler(0, 12, handle_metadata)}

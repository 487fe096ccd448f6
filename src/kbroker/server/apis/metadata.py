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


def topic_metadata(broker, name: str, error: int = ErrorCode.NONE, include_ops: bool = False,
                   topic_id=None) -> MetadataResponseTopic:
    image = broker.metadata.image
    t = image.topics.get(name) if name is not None else image.topics_by_id.get(topic_id)
    if t is None or error != ErrorCode.NONE:
        return MetadataResponseTopic(error_code=error or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name,
                                     topic_id=topic_id or uuid.UUID(int=0), partitions=[],
                                     topic_authorized_operations=NOT_REQUESTED)
    parts = []
    node = broker.node_id
    for p in range(t.num_partitions):
        part = broker.replica_manager.get_partition((t.name, p))
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
        topics = [topic_metadata(broker, n, include_ops=include_ops) for n in names]
    else:
        allow_auto = (req.allow_auto_topic_creation if v >= 4 else True) and broker.config["auto.create.topics.enable"]
        for rt in req.topics:
            name = rt.name
            if name is None:  # by topic id: v12+ only; v10-11 must name the topic (Kafka: INVALID_REQUEST,
                # and the response's name is not nullable before v12, so "")
                known = image.topics_by_id.get(rt.topic_id) if v >= 12 else None
                if known is not None:
                    topics.append(topic_metadata(broker, known.name, include_ops=include_ops))
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
            topics.append(topic_metadata(broker, name, include_ops=include_ops))
    host, port = broker.advertised_endpoint
    resp = MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponseBroker(node_id=broker.node_id, host=host, port=port, rack=broker.config["broker.rack"])],
        cluster_id=broker.cluster_id, controller_id=broker.node_id, topics=topics,
        cluster_authorized_operations=(CLUSTER_OPERATIONS if 8 <= v <= 10 and req.include_cluster_authorized_operations
                                       else NOT_REQUESTED))
    ctx.respond(resp)


HANDLERS = {ApiKey.METADATA: ApiHandler(0, 12, handle_metadata)}

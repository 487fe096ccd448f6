"""CreateTopics, DeleteTopics, CreatePartitions.

With an authorizer (KafkaApis): CREATE on the cluster or on the topic to create it, DELETE on a
topic to delete it, ALTER on a topic to add partitions; else the topic's result is
TOPIC_AUTHORIZATION_FAILED and the others go on.
"""
from __future__ import annotations

import uuid

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.create_partitions import (
    CreatePartitionsResponse, CreatePartitionsTopicResult,
)
from kbroker.protocol.messages.create_topics import (
    CreatableTopicConfigs, CreatableTopicResult, CreateTopicsResponse,
)
from kbroker.protocol.messages.delete_topics import DeletableTopicResult, DeleteTopicsResponse
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import ALTER, CREATE, DELETE, TOPIC, authz
from kbroker.server.topics import TopicError

ZERO_UUID = uuid.UUID(int=0)
#: DescribeConfigs ConfigSource codes
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5


def handle_create_topics(broker, ctx, req) -> None:
    v = ctx.api_version
    results = []
    seen: dict[str, int] = {}
    for t in req.topics:
        seen[t.name] = seen.get(t.name, 0) + 1
    auth = authz(broker, ctx)
    may_create_any = auth is None or auth.cluster(CREATE)
    for t in req.topics:
        if seen[t.name] > 1:
            results.append(CreatableTopicResult(name=t.name, error_code=ErrorCode.INVALID_REQUEST,
                                                error_message="Duplicate topic name.", topic_id=ZERO_UUID))
            continue
        if not may_create_any and not auth.allowed(CREATE, TOPIC, t.name):
            results.append(CreatableTopicResult(name=t.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                error_message="Authorization failed." if v >= 1 else None,
                                                topic_id=ZERO_UUID))
            continue
        configs = {c.name: c.value for c in t.configs}
        try:
            topic = broker.topic_manager.create(t.name, t.num_partitions, t.replication_factor, configs,
                                                t.assignments, req.validate_only)
        except TopicError as e:
            results.append(CreatableTopicResult(name=t.name, error_code=e.code,
                                                error_message=e.message if v >= 1 else None, topic_id=ZERO_UUID))
            continue
        r = CreatableTopicResult(name=t.name, error_code=ErrorCode.NONE, topic_id=topic.topic_id if topic else ZERO_UUID)
        if v >= 5:
            r.num_partitions = topic.num_partitions if topic else (
                len(t.assignments) if t.assignments else
                t.num_partitions if t.num_partitions > 0 else broker.config["num.partitions"])
            r.replication_factor = 1
            cfg = broker.log_manager.config_for(t.name)
            overrides = topic.configs if topic else configs
            r.configs = [CreatableTopicConfigs(name=n, value=cfg.string_value(n), read_only=False,
                                               config_source=DYNAMIC_TOPIC_CONFIG if n in overrides else DEFAULT_CONFIG,
                                               is_sensitive=False)
                         for n in sorted(cfg.config_names())]
        results.append(r)
    ctx.respond(CreateTopicsResponse(throttle_time_ms=0, topics=results))


def handle_delete_topics(broker, ctx, req) -> None:
    v = ctx.api_version
    results = []
    if v >= 6:
        targets = [(t.name, t.topic_id) for t in req.topics]
    else:
        targets = [(n, ZERO_UUID) for n in req.topic_names]
    auth = authz(broker, ctx)
    for name, topic_id in targets:
        if name is None:
            t = broker.metadata.image.topics_by_id.get(topic_id)
            if t is None:
                results.append(DeletableTopicResult(name=None, topic_id=topic_id, error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                                                    error_message="This server does not host this topic ID." if v >= 5 else None))
                continue
            name = t.name
        if auth is not None and not auth.allowed(DELETE, TOPIC, name):
            results.append(DeletableTopicResult(name=name, topic_id=topic_id,
                                                error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                error_message="Authorization failed." if v >= 5 else None))
            continue
        try:
            t = broker.topic_manager.delete(name)
            results.append(DeletableTopicResult(name=name, topic_id=t.topic_id, error_code=ErrorCode.NONE))
        except TopicError as e:
            results.append(DeletableTopicResult(name=name, topic_id=topic_id, error_code=e.code,
                                                error_message=e.message if v >= 5 else None))
    ctx.respond(DeleteTopicsResponse(throttle_time_ms=0, responses=results))


def handle_create_partitions(broker, ctx, req) -> None:
    results = []
    auth = authz(broker, ctx)
    for t in req.topics:
        if auth is not None and not auth.allowed(ALTER, TOPIC, t.name):
            results.append(CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                       error_message="Authorization failed."))
            continue
        try:
            broker.topic_manager.create_partitions(t.name, t.count, t.assignments, req.validate_only)
            results.append(CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.NONE))
        except TopicError as e:
            results.append(CreatePartitionsTopicResult(name=t.name, error_code=e.code, error_message=e.message))
    ctx.respond(CreatePartitionsResponse(throttle_time_ms=0, results=results))


HANDLERS = {
    ApiKey.CREATE_TOPICS: ApiHandler(0, 7, handle_create_topics),
    ApiKey.DELETE_TOPICS: ApiHandler(0, 6, handle_delete_topics),
    ApiKey.CREATE_PARTITIONS: ApiHandler(0, 3, handle_create_partitions),
}

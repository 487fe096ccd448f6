"""CreateTopics, DeleteTopics, CreatePartitions.

With an authorizer (KafkaApis): CREATE on the cluster or on the topic to create it, DELETE on a
topic to delete it, ALTER on a topic to add partitions; else the topic's result is
TOPIC_AUTHORIZATION_FAILED and the others go on.

The client's ``controller_mutation_rate`` (KIP-599, :mod:`kbroker.quota.controller_mutation`)
counts the partitions each topic creates or deletes; a strict request's topic whose turn comes
while the client is over it is THROTTLING_QUOTA_EXCEEDED. The throttle time goes into the
response (and mutes the connection) through the request context.
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
from kbroker.quota.controller_mutation import THROTTLING_QUOTA_EXCEEDED_MESSAGE

ZERO_UUID = uuid.UUID(int=0)
#: DescribeConfigs ConfigSource codes
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5


def mutation_quota(ctx):
    """The request's controller mutation quota (strict or permissive), or None."""
    q = ctx.quotas
    if q is None or not q.controller_mutation.enabled:
        return None
    return q.controller_mutation.new_quota_for(ctx.user, ctx.client_id or "", ctx.api_key, ctx.api_version)


def throttle_mutations(ctx, mq) -> None:
    """Put the quota's throttle time into the response (the context writes and mutes)."""
    if mq is not None:
        ctx.bandwidth_throttle_ms = max(ctx.bandwidth_throttle_ms, mq.throttle_time_ms())


def handle_create_topics(broker, ctx, req) -> None:
    v = ctx.api_version
    mq = mutation_quota(ctx)
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
        if mq is not None and not mq.check():
            results.append(CreatableTopicResult(name=t.name, error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                                                error_message=THROTTLING_QUOTA_EXCEEDED_MESSAGE, topic_id=ZERO_UUID))
            continue
        try:
            topic = broker.topic_manager.create(t.name, t.num_partitions, t.replication_factor, configs,
                                                t.assignments, req.validate_only)
        except TopicError as e:
            results.append(CreatableTopicResult(name=t.name, error_code=e.code,
                                                error_message=e.message if v >= 1 else None, topic_id=ZERO_UUID))
            continue
        if mq is not None:      # (a validate-only topic counts too, as in Kafka's KRaft controller)
            mq.record(topic.num_partitions if topic else len(t.assignments) if t.assignments else
                      t.num_partitions if t.num_partitions > 0 else broker.config["num.partitions"])
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
    throttle_mutations(ctx, mq)
    ctx.respond(CreateTopicsResponse(throttle_time_ms=0, topics=results))


def handle_delete_topics(broker, ctx, req) -> None:
    v = ctx.api_version
    mq = mutation_quota(ctx)
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
        if mq is not None and not mq.check():
            results.append(DeletableTopicResult(name=name, topic_id=topic_id,
                                                error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                                                error_message=THROTTLING_QUOTA_EXCEEDED_MESSAGE if v >= 5 else None))
            continue
        try:
            t = broker.topic_manager.delete(name)
            results.append(DeletableTopicResult(name=name, topic_id=t.topic_id, error_code=ErrorCode.NONE))
            if mq is not None:
                mq.record(t.num_partitions)
        except TopicError as e:
            results.append(DeletableTopicResult(name=name, topic_id=topic_id, error_code=e.code,
                                                error_message=e.message if v >= 5 else None))
    throttle_mutations(ctx, mq)
    ctx.respond(DeleteTopicsResponse(throttle_time_ms=0, responses=results))


def handle_create_partitions(broker, ctx, req) -> None:
    mq = mutation_quota(ctx)
    results = []
    auth = authz(broker, ctx)
    for t in req.topics:
        if auth is not None and not auth.allowed(ALTER, TOPIC, t.name):
            results.append(CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                       error_message="Authorization failed."))
            continue
        if mq is not None and not mq.check():
            results.append(CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                                                       error_message=THROTTLING_QUOTA_EXCEEDED_MESSAGE))
            continue
        before = broker.metadata.image.topics.get(t.name)
        try:
            broker.topic_manager.create_partitions(t.name, t.count, t.assignments, req.validate_only)
            results.append(CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.NONE))
            if mq is not None and before is not None:
                mq.record(t.count - before.num_partitions)
        except TopicError as e:
            results.append(CreatePartitionsTopicResult(name=t.name, error_code=e.code, error_message=e.message))
    throttle_mutations(ctx, mq)
    ctx.respond(CreatePartitionsResponse(throttle_time_ms=0, results=results))


HANDLERS = {
    ApiKey.CREATE_TOPICS: ApiHandler(0, 7, handle_create_topics),
    ApiKey.DELETE_TOPICS: ApiHandler(0, 6, handle_delete_topics),
    ApiKey.CREATE_PARTITIONS: ApiHandler(0, 3, handle_create_partitions),
}


# -- a KRaft broker's forwarded mutations --------------------------------------------------------
def quota_forwarded(ctx, body, partitions_of, default_partitions: int):
    """The controller mutation quota around a KRaft broker's forward of CreateTopics,
    CreatePartitions or DeleteTopics (see :mod:`kbroker.quota.controller_mutation` for why
    the broker enforces it). Each item in turn is checked (strict: refused while the client is
    over its quota) and takes the partitions it would create or delete, ``partitions_of(name or
    topic id)`` being a topic's current count (None: unknown). Returns (body to forward or None,
    merge(response) -> response, answer now or None); the merge gives back what the
    controller refused and sets the throttle time."""
    from kbroker.server.request_context import error_response_for
    import copy
    key, v = ctx.api_key, ctx.api_version
    if key not in (ApiKey.CREATE_TOPICS, ApiKey.CREATE_PARTITIONS, ApiKey.DELETE_TOPICS):
        return body, None, None
    mq = mutation_quota(ctx)
    if mq is None:
        return body, None, None
    if key == ApiKey.DELETE_TOPICS:
        attr = "topics" if v >= 6 else "topic_names"
    else:
        attr = "topics"
    items = list(getattr(body, attr) or [])

    def ident(item):           # what the response's result is matched by
        if isinstance(item, str):
            return item
        return item.name if item.name is not None else getattr(item, "topic_id", None)

    def permits(item) -> int:
        if key == ApiKey.CREATE_TOPICS:
            return len(item.assignments) if item.assignments else (
                item.num_partitions if item.num_partitions > 0 else default_partitions)
        cur = partitions_of(ident(item))
        if cur is None:
            return 0
        return max(0, item.count - cur) if key == ApiKey.CREATE_PARTITIONS else cur

    kept, refused, taken = [], [], {}
    for item in items:
        if not mq.check():
            refused.append(item)
            continue
        n = permits(item)
        mq.record(n)
        taken[ident(item)] = n
        kept.append(item)

    def part(selected):
        p = copy.copy(body)
        setattr(p, attr, selected)
        if key == ApiKey.DELETE_TOPICS:
            setattr(p, "topic_names" if v >= 6 else "topics", [])
        return p

    resp_attr = {ApiKey.CREATE_TOPICS: "topics", ApiKey.CREATE_PARTITIONS: "results",
                 ApiKey.DELETE_TOPICS: "responses"}[key]
    extra = []
    if refused:
        extra = getattr(error_response_for(key, v, ErrorCode.THROTTLING_QUOTA_EXCEEDED, part(refused)), resp_attr)
        if key != ApiKey.DELETE_TOPICS or v >= 5:
            for r in extra:
                r.error_message = THROTTLING_QUOTA_EXCEEDED_MESSAGE

    def merge(resp):
        for r in getattr(resp, resp_attr) or []:
            rid = r.name if r.name is not None else getattr(r, "topic_id", None)
            n = taken.pop(rid, 0)
            if r.error_code != ErrorCode.NONE:
                mq.refund(n)                   # the controller did not do it
            elif key == ApiKey.CREATE_TOPICS and v >= 5 and r.num_partitions > 0 and r.num_partitions != n:
                mq.record(r.num_partitions - n)
        if extra:
            setattr(resp, resp_attr, list(getattr(resp, resp_attr) or []) + extra)
        throttle_mutations(ctx, mq)
        return resp

    if not kept:
        return None, None, merge(error_response_for(key, v, ErrorCode.NONE, part([])))
    return part(kept), merge, None

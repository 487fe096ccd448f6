"""Authorization of the admin requests a KRaft broker forwards to the controller.

Kafka forwards these inside an Envelope and the controller authorizes them with the client's
principal; kbroker forwards the bare request (no Envelope), so the broker checks what Kafka's
ControllerApis would before forwarding: the items the principal may not touch answer
TOPIC_AUTHORIZATION_FAILED (CLUSTER_AUTHORIZATION_FAILED for a broker config resource) and are
taken out of the forwarded request; the controller's answer for the rest is merged with them.
Cluster-wide requests (ElectLeaders, AlterPartitionReassignments, ListPartitionReassignments,
AlterClientQuotas, UpdateFeatures) need ALTER / DESCRIBE / ALTER_CONFIGS on the cluster, else
their whole answer is CLUSTER_AUTHORIZATION_FAILED (in every entry of an AlterClientQuotas
answer).
"""
from __future__ import annotations

import copy

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.server.authz import ALTER, ALTER_CONFIGS, CREATE, DELETE, DESCRIBE, TOPIC
from kbroker.server.request_context import error_response_for

TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
#: api key -> (request items attribute, response results attribute)
_ITEMS = {
    ApiKey.CREATE_TOPICS: ("topics", "topics"),
    ApiKey.DELETE_TOPICS: (None, "responses"),
    ApiKey.CREATE_PARTITIONS: ("topics", "results"),
    ApiKey.ALTER_CONFIGS: ("resources", "responses"),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: ("resources", "responses"),
}
_CLUSTER_OP = {ApiKey.ELECT_LEADERS: ALTER, ApiKey.ALTER_PARTITION_REASSIGNMENTS: ALTER,
               ApiKey.LIST_PARTITION_REASSIGNMENTS: DESCRIBE,
               ApiKey.ALTER_CLIENT_QUOTAS: ALTER_CONFIGS, ApiKey.UPDATE_FEATURES: ALTER}


def _denied_code(auth, key: int, item, names_by_id) -> int:
    """The error for one request item, or NONE when the principal may act on it."""
    if key == ApiKey.CREATE_TOPICS:
        ok = auth.cluster(CREATE) or auth.allowed(CREATE, TOPIC, item.name)
    elif key == ApiKey.DELETE_TOPICS:
        name = item if isinstance(item, str) else (item.name or names_by_id(item.topic_id))
        ok = name is None or auth.allowed(DELETE, TOPIC, name)
    elif key == ApiKey.CREATE_PARTITIONS:
        ok = auth.allowed(ALTER, TOPIC, item.name)
    else:
        if item.resource_type == BROKER_RESOURCE:
            return ErrorCode.NONE if auth.cluster(ALTER_CONFIGS) else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        ok = item.resource_type != TOPIC_RESOURCE or auth.allowed(ALTER_CONFIGS, TOPIC, item.resource_name)
    return ErrorCode.NONE if ok else ErrorCode.TOPIC_AUTHORIZATION_FAILED


def authorize_forwarded(auth, ctx, body, names_by_id):
    """(body to forward or None, merge(response) -> response, answer now or None)."""
    key, v = ctx.api_key, ctx.api_version
    op = _CLUSTER_OP.get(key)
    if op is not None:
        if auth.cluster(op):
            return body, None, None
        return None, None, error_response_for(key, v, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, body)
    attrs = _ITEMS.get(key)
    if attrs is None:
        return body, None, None
    req_attr, resp_attr = attrs
    if key == ApiKey.DELETE_TOPICS:
        req_attr = "topics" if v >= 6 else "topic_names"
    items = list(getattr(body, req_attr) or [])
    denied: dict[int, list] = {}
    allowed = []
    for item in items:
        code = _denied_code(auth, key, item, names_by_id)
        if code == ErrorCode.NONE:
            allowed.append(item)
        else:
            denied.setdefault(code, []).append(item)
    if not denied:
        return body, None, None
    extra = []
    for code, its in denied.items():
        part = copy.copy(body)
        setattr(part, req_attr, its)
        if key == ApiKey.DELETE_TOPICS:
            setattr(part, "topic_names" if v >= 6 else "topics", [])
        extra += getattr(error_response_for(key, v, code, part), resp_attr)
    if not allowed:
        part = copy.copy(body)
        setattr(part, req_attr, [])
        if key == ApiKey.DELETE_TOPICS:
            setattr(part, "topic_names" if v >= 6 else "topics", [])
        resp = error_response_for(key, v, ErrorCode.NONE, part)
        setattr(resp, resp_attr, extra)
        return None, None, resp
    forwarded = copy.copy(body)
    setattr(forwarded, req_attr, allowed)

    def merge(resp):
        setattr(resp, resp_attr, list(getattr(resp, resp_attr) or []) + extra)
        return resp
    return forwarded, merge, None

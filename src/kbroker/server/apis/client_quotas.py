"""DescribeClientQuotas (48) and AlterClientQuotas (49), KIP-546.

Kafka: ``ClientQuotasImage.describe`` (brokers answer Describe from their metadata) and
``ClientQuotaControlManager.alterClientQuotas`` (the controller validates and records
ClientQuotaRecords). Here the zero-config node keeps the quotas in its MetadataStore
(``client_quotas`` / ``set_client_quotas``, durable before the answer) and hands every
change to the broker's QuotaManagers; a KRaft broker forwards AlterClientQuotas to the
controller and describes from its metadata image. The rules (entity types and
combinations, keys per entity, integral values, duplicates) are kbroker.quota.entity's.
With an authorizer: DESCRIBE_CONFIGS / ALTER_CONFIGS on the cluster (Kafka's checks).
"""
from __future__ import annotations

import logging

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.alter_client_quotas import (
    AlterClientQuotasResponse, AlterClientQuotasResponseEntityData, AlterClientQuotasResponseEntryData,
)
from kbroker.protocol.messages.describe_client_quotas import (
    DescribeClientQuotasResponse, EntityData, EntryData, ValueData,
)
from kbroker.quota import entity as Q
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import ALTER_CONFIGS, CLUSTER, DESCRIBE_CONFIGS, allowed
from kbroker.server.request_context import error_response_for

log = logging.getLogger(__name__)


def handle_describe(broker, ctx, req) -> None:
    if not allowed(broker, ctx, DESCRIBE_CONFIGS, CLUSTER):
        ctx.respond(DescribeClientQuotasResponse(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                                 error_message=None, entries=None))
        return
    try:
        found = Q.describe(broker.metadata.client_quotas(),
                           [(c.entity_type, c.match_type, c.match) for c in req.components], req.strict)
    except Q.QuotaError as e:
        ctx.respond(DescribeClientQuotasResponse(throttle_time_ms=0, error_code=e.code,
                                                 error_message=e.message, entries=None))
        return
    entries = [EntryData(entity=[EntityData(entity_type=t, entity_name=n) for t, n in key],
                         values=[ValueData(key=k, value=v) for k, v in sorted(values.items())])
               for key, values in found]
    ctx.respond(DescribeClientQuotasResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                             error_message=None, entries=entries))


def handle_alter(broker, ctx, req) -> None:
    if not allowed(broker, ctx, ALTER_CONFIGS, CLUSTER):
        ctx.respond(error_response_for(ApiKey.ALTER_CLIENT_QUOTAS, ctx.api_version,
                                       ErrorCode.CLUSTER_AUTHORIZATION_FAILED, req))
        return
    store = broker.metadata
    current = store.client_quotas()
    results, changes = Q.plan_alterations(
        current, [([(e.entity_type, e.entity_name) for e in entry.entity],
                   [(op.key, op.value, op.remove) for op in entry.ops]) for entry in req.entries])
    if changes and not req.validate_only:
        store.set_client_quotas(Q.apply_changes(current, changes))
        quotas = getattr(broker, "quotas", None)
        if quotas is not None:
            quotas.update_quotas(store.client_quotas())
        log.info("client quotas altered: %s", ", ".join(
            f"{dict(k)} {q}={'(removed)' if v is None else v}" for k, q, v in changes))
    ctx.respond(AlterClientQuotasResponse(throttle_time_ms=0, entries=[
        AlterClientQuotasResponseEntryData(
            error_code=code, error_message=msg,
            entity=[AlterClientQuotasResponseEntityData(entity_type=t, entity_name=n) for t, n in raw])
        for raw, code, msg in results]))


HANDLERS = {
    ApiKey.DESCRIBE_CLIENT_QUOTAS: ApiHandler(0, 1, handle_describe),
    ApiKey.ALTER_CLIENT_QUOTAS: ApiHandler(0, 1, handle_alter),
}

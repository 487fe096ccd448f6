"""CreateAcls (30), DescribeAcls (29), DeleteAcls (31): Kafka's AclApis.

ALTER (create, delete) or DESCRIBE (describe) on the cluster is required
(CLUSTER_AUTHORIZATION_FAILED); without an authorizer every answer is SECURITY_DISABLED.
The zero-config node keeps the ACLs in its MetadataStore (durable before the answer); a KRaft
broker (``broker.forward_to_controller``) authorizes the request, then forwards
CreateAcls / DeleteAcls to the active controller, whose AccessControlEntryRecords reach every
broker's image; DescribeAcls is answered from the broker's own ACLs.
"""
from __future__ import annotations

from kbroker.protocol import ApiKey
from kbroker.security import acl_api
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import ALTER, DESCRIBE, authz


def _check(broker, ctx, req, api: str, operation) -> bool:
    """Answer and return False when there is no authorizer or the principal lacks ``operation``."""
    if broker.authorizer is None:
        ctx.respond(acl_api.security_disabled(api, req))
        return False
    if not authz(broker, ctx).cluster(operation):
        ctx.respond(acl_api.cluster_authorization_failed(api, req))
        return False
    return True


def handle_create(broker, ctx, req) -> None:
    if not _check(broker, ctx, req, "create", ALTER):
        return
    forward = getattr(broker, "forward_to_controller", None)
    if forward is not None:
        forward(ctx, req)
        return
    ctx.respond(acl_api.create_acls(req, broker.metadata.create_acls))


def handle_delete(broker, ctx, req) -> None:
    if not _check(broker, ctx, req, "delete", ALTER):
        return
    forward = getattr(broker, "forward_to_controller", None)
    if forward is not None:
        forward(ctx, req)
        return
    ctx.respond(acl_api.delete_acls(req, broker.metadata.delete_acls))


def handle_describe(broker, ctx, req) -> None:
    if not _check(broker, ctx, req, "describe", DESCRIBE):
        return
    ctx.respond(acl_api.describe_acls(req, broker.acl_index()))


HANDLERS = {
    ApiKey.DESCRIBE_ACLS: ApiHandler(0, 3, handle_describe),
    ApiKey.CREATE_ACLS: ApiHandler(0, 3, handle_create),
    ApiKey.DELETE_ACLS: ApiHandler(0, 3, handle_delete),
}

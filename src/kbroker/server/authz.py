"""The one helper request handlers authorize through (Kafka's ``AuthHelper``).

``authz(broker, ctx)`` is None when the broker has no authorizer (``authorizer.class.name``
empty: every check passes, and the cost is one attribute read); otherwise a
:class:`RequestAuthorizer` for the request's principal and client host, created once per
request (kept on the RequestContext) with its decisions cached per (operation, resource
type, name), so a produce to 100 partitions of one topic asks the authorizer once.

The principal is the connection's (``User:ANONYMOUS`` on PLAINTEXT and on SSL without a client
certificate; the SASL user; ``User:CN=...`` for a certificate under ssl.client.auth=required).
"""
from __future__ import annotations

from kbroker.security.authorizer import ANONYMOUS, CLUSTER_NAME, AclOperation, ResourceType

# plain ints: they key the per-request cache (an IntEnum member hashes through a Python call)
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = (int(o) for o in (
    AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER,
    AclOperation.DESCRIBE))
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = (int(o) for o in (
    AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
    AclOperation.IDEMPOTENT_WRITE))
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = (int(r) for r in (
    ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID))
__all__ = ["authz", "allowed", "RequestAuthorizer", "CLUSTER_NAME", "READ", "WRITE", "CREATE", "DELETE", "ALTER",
           "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "TOPIC", "GROUP",
           "CLUSTER", "TRANSACTIONAL_ID"]


def principal_of(ctx) -> str:
    session = getattr(ctx.request.connection, "session", None)
    return session.principal if session is not None else ANONYMOUS


class RequestAuthorizer:
    """One request's view of the authorizer. Used by the request's handler thread (and its
    delayed completion); the cache is a plain dict."""

    __slots__ = ("authorizer", "principal", "host", "_cache")

    def __init__(self, authorizer, principal: str, host: str):
        self.authorizer = authorizer
        self.principal = principal
        self.host = host
        self._cache: dict = {}

    def allowed(self, operation: int, resource_type: int, name: str) -> bool:
        key = (operation, resource_type, name)
        r = self._cache.get(key)
        if r is None:
            r = self._cache[key] = self.authorizer.authorize(self.principal, self.host, operation,
                                                             resource_type, name)
        return r

    def cluster(self, operation: int) -> bool:
        return self.allowed(operation, CLUSTER, CLUSTER_NAME)

    def by_resource_type(self, operation: int, resource_type: int) -> bool:
        key = (operation, resource_type, None)
        r = self._cache.get(key)
        if r is None:
            r = self._cache[key] = self.authorizer.authorize_by_resource_type(
                self.principal, self.host, operation, resource_type)
        return r

    def operations(self, resource_type: int, name: str, supported) -> int:
        """Kafka's authorizedOperations: the bit field of ``supported`` operations allowed."""
        return sum(1 << op for op in supported if self.allowed(op, resource_type, name))


def authz(broker, ctx):
    """The request's RequestAuthorizer, or None when authorization is off."""
    authorizer = getattr(broker, "authorizer", None)
    if authorizer is None:
        return None
    r = ctx.authz
    if r is None:
        r = ctx.authz = RequestAuthorizer(authorizer, principal_of(ctx), ctx.client_host)
    return r


def allowed(broker, ctx, operation: int, resource_type: int, name: str = CLUSTER_NAME) -> bool:
    """True when authorization is off or the request's principal may do it."""
    a = authz(broker, ctx)
    return a is None or a.allowed(operation, resource_type, name)

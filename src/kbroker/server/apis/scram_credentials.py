"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), KIP-554.

Kafka: ``ControllerApis`` / ``ScramControlManager``. On the zero-config node the credentials live
in the broker's :class:`kbroker.security.credentials.ScramCredentialStore` (``broker.metadata``:
durable before the answer). On a KRaft broker (``broker.forward_to_controller``),
AlterUserScramCredentials is authorized here, then forwarded to the active controller, whose
:mod:`kbroker.controller.scram_control` validates it (its rules differ in one way: a user named
twice in a request is DUPLICATE_RESOURCE whatever the mechanisms) and writes
UserScramCredentialRecords; DescribeUserScramCredentials is answered from the broker's published
image (``broker.scram_credentials``), so a change shows once the broker replayed it.
Zero-config node: one result per user, with Kafka's checks and texts: an empty user name or an iteration count outside [4096, 16384] is UNACCEPTABLE_CREDENTIAL,
an unknown mechanism UNSUPPORTED_SASL_MECHANISM, a (user, mechanism) named twice DUPLICATE_RESOURCE, deleting
or describing what does not exist RESOURCE_NOT_FOUND. The client sends the salted password
(never the password); the broker keeps only the stored and server keys derived from it.
With an authorizer: DESCRIBE (describe) or ALTER (alter) on the cluster, else every result is
CLUSTER_AUTHORIZATION_FAILED (Kafka's ControllerApis / KafkaApis checks); a refused describe of
named users has no top-level error, unlike Kafka's, which makes librdkafka abort (see below).
"""
from __future__ import annotations

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.alter_user_scram_credentials import (
    AlterUserScramCredentialsResponse, AlterUserScramCredentialsResult,
)
from kbroker.protocol.messages.describe_user_scram_credentials import (
    CredentialInfo, DescribeUserScramCredentialsResponse, DescribeUserScramCredentialsResult,
)
from kbroker.security import scram
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import ALTER, CLUSTER, DESCRIBE, allowed


def _store(broker):
    src = getattr(broker, "scram_credentials", None)       # a KRaft broker's published image
    return src if src is not None else broker.metadata


def handle_describe(broker, ctx, req) -> None:
    if not allowed(broker, ctx, DESCRIBE, CLUSTER):
        # Kafka answers with a top-level error (DescribeUserScramCredentialsRequest.getErrorResponse),
        # which makes librdkafka (2.x: rd_kafka_DescribeUserScramCredentialsResponse_parse frees
        # a string it does not own) abort the client process. For named users the error goes in
        # each user's result instead (what Kafka's AdminClient and librdkafka report per user
        # anyway); only a describe-all keeps Kafka's top-level error.
        message = "Cluster authorization failed."
        users = list(dict.fromkeys(u.name for u in req.users or ()))
        ctx.respond(DescribeUserScramCredentialsResponse(
            throttle_time_ms=0, error_code=ErrorCode.NONE if users else ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            error_message=None if users else message,
            results=[DescribeUserScramCredentialsResult(
                user=u, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=message,
                credential_infos=[]) for u in users]))
        return
    creds = _store(broker).scram_credentials()
    results = []
    names = [u.name for u in req.users or []]
    if not names:
        names = sorted(creds)
        explicit = False
    else:
        explicit = True
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    done = set()
    for name in names:
        if name in done:
            continue
        done.add(name)
        if explicit and seen[name] > 1:
            results.append(DescribeUserScramCredentialsResult(
                user=name, error_code=ErrorCode.DUPLICATE_RESOURCE,
                error_message=f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}",
                credential_infos=[]))
            continue
        mechs = creds.get(name)
        if not mechs:
            results.append(DescribeUserScramCredentialsResult(
                user=name, error_code=ErrorCode.RESOURCE_NOT_FOUND,
                error_message=f"Attempt to describe a user credential that does not exist: {name}",
                credential_infos=[]))
            continue
        results.append(DescribeUserScramCredentialsResult(
            user=name, error_code=ErrorCode.NONE, error_message=None,
            credential_infos=[CredentialInfo(mechanism=scram.MECHANISMS[m][1], iterations=c.iterations)
                              for m, c in sorted(mechs.items())]))
    ctx.respond(DescribeUserScramCredentialsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                                     error_message=None, results=results))


def handle_alter(broker, ctx, req) -> None:
    if not allowed(broker, ctx, ALTER, CLUSTER):
        names = list(dict.fromkeys(x.name for x in list(req.deletions) + list(req.upsertions)))
        ctx.respond(AlterUserScramCredentialsResponse(throttle_time_ms=0, results=[
            AlterUserScramCredentialsResult(user=n, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                            error_message=None) for n in names]))
        return
    forward = getattr(broker, "forward_to_controller", None)
    if forward is not None:
        forward(ctx, req)
        return
    store = _store(broker)
    existing = store.scram_credentials()
    errors: dict[str, tuple[int, str]] = {}
    order: list[str] = []
    pairs: set[tuple[str, int]] = set()
    for item in list(req.deletions) + list(req.upsertions):
        if item.name not in order:
            order.append(item.name)
        if (item.name, item.mechanism) in pairs:     # Kafka: duplicate (user, mechanism) pairs
            errors[item.name] = (ErrorCode.DUPLICATE_RESOURCE,
                                 "A user credential cannot be altered twice in the same request")
        pairs.add((item.name, item.mechanism))
    deletions, upsertions = [], {}
    for d in req.deletions:
        if d.name in errors:
            continue
        mech = scram.MECHANISM_BY_TYPE.get(d.mechanism)
        if not d.name:
            errors[d.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif mech is None:
            errors[d.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        elif mech not in existing.get(d.name, {}):
            errors[d.name] = (ErrorCode.RESOURCE_NOT_FOUND,
                              "Attempt to delete a user credential that does not exist")
        else:
            deletions.append((d.name, mech))
    for u in req.upsertions:
        if u.name in errors:
            continue
        mech = scram.MECHANISM_BY_TYPE.get(u.mechanism)
        if not u.name:
            errors[u.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        elif mech is None:
            errors[u.name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        elif u.iterations < scram.MIN_ITERATIONS:
            errors[u.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        elif u.iterations > scram.MAX_ITERATIONS:
            errors[u.name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        else:
            upsertions[(u.name, mech)] = scram.credential_from_salted(
                mech, bytes(u.salted_password), bytes(u.salt), u.iterations)
    if deletions or upsertions:
        store.alter_scram_credentials(upsertions, deletions)
    results = []
    for name in order:
        code, message = errors.get(name, (ErrorCode.NONE, None))
        results.append(AlterUserScramCredentialsResult(user=name, error_code=code, error_message=message))
    ctx.respond(AlterUserScramCredentialsResponse(throttle_time_ms=0, results=results))


HANDLERS = {
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: ApiHandler(0, 0, handle_describe),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: ApiHandler(0, 0, handle_alter),
}

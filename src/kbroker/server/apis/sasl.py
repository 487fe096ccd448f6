"""SaslHandshake and SaslAuthenticate (Kafka's ``SaslServerAuthenticator``, request side).

The connection's :class:`kbroker.security.sasl.ChannelSession` (``request.connection.session``)
holds the SASL state; the network processor has already refused anything but ApiVersions and
these two before authentication, and bounded the frame size. SaslHandshake v0 switches the
connection to bare tokens (:func:`handle_raw_token`, reached through KafkaApis for a
``RAW_SASL_TOKEN`` request); v1 keeps tokens inside SaslAuthenticate requests.

Failures: SASL_AUTHENTICATION_FAILED with Kafka's generic text (never which part was wrong),
then the processor closes the connection ``connection.failed.authentication.delay.ms`` later;
the reason goes to the broker's log only.

Re-authentication (KIP-368, ``connections.max.reauth.ms`` > 0): SaslAuthenticate v1+ tells the
client the session lifetime; before it ends the client sends SaslHandshake v1 (same mechanism)
and SaslAuthenticate again on the authenticated connection, for the same principal. After it
ends, any other request closes the connection (the network processor checks).
"""
from __future__ import annotations

import logging
import struct

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.sasl_authenticate import SaslAuthenticateResponse
from kbroker.protocol.messages.sasl_handshake import SaslHandshakeResponse
from kbroker.security.sasl import (
    AUTHENTICATE, HANDSHAKE_OR_VERSIONS, SaslAuthenticationError, auth_failed_message,
)
from kbroker.server.apis import ApiHandler

log = logging.getLogger(__name__)


def _session(ctx):
    conn = ctx.request.connection
    session = getattr(conn, "session", None)
    return session if session is not None and session.sasl is not None else None


def handle_sasl_handshake(broker, ctx, req) -> None:
    session = _session(ctx)
    if session is None:
        # not a SASL listener (or already authenticated: no re-authentication yet)
        ctx.respond(SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[]))
        return
    if session.state != HANDSHAKE_OR_VERSIONS and not (session.can_reauthenticate and ctx.api_version >= 1):
        session.fail()
        ctx.respond(SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                                          mechanisms=list(session.sasl.mechanisms)))
        return
    mechanism = req.mechanism
    if not session.handshake(mechanism, raw_tokens=ctx.api_version == 0):
        log.info("connection %s from %s asked for SASL mechanism %r, which is not enabled (%s)",
                 ctx.connection_id, ctx.client_host, mechanism, ",".join(session.sasl.mechanisms))
        session.fail()
        ctx.respond(SaslHandshakeResponse(error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                          mechanisms=list(session.sasl.mechanisms)))
        return
    ctx.respond(SaslHandshakeResponse(error_code=ErrorCode.NONE, mechanisms=list(session.sasl.mechanisms)))


def handle_sasl_authenticate(broker, ctx, req) -> None:
    session = _session(ctx)
    if session is None or session.state != AUTHENTICATE or session.raw_tokens:
        if session is not None:
            session.fail()
        ctx.respond(SaslAuthenticateResponse(
            error_code=ErrorCode.ILLEGAL_SASL_STATE,
            error_message="Unexpected SaslAuthenticate request: no SASL handshake on this connection"
            if session is None or session.state == HANDSHAKE_OR_VERSIONS else
            "Unexpected SaslAuthenticate request in the current SASL state", auth_bytes=b""))
        return
    mechanism = session.mechanism
    try:
        challenge = session.evaluate(req.auth_bytes)
    except SaslAuthenticationError as e:
        log.info("failed authentication with %s (%s) on %s: %s", ctx.client_host, ctx.connection_id,
                 session.listener_name, e)
        ctx.respond(SaslAuthenticateResponse(error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
                                             error_message=auth_failed_message(mechanism), auth_bytes=b""))
        return
    if session.authenticated:
        log.debug("connection %s authenticated as %s (%s)", ctx.connection_id, session.principal, mechanism)
    ctx.respond(SaslAuthenticateResponse(error_code=ErrorCode.NONE, error_message=None,
                                         auth_bytes=challenge, session_lifetime_ms=session.session_lifetime_ms))


def handle_raw_token(broker, channel, request) -> None:
    """A bare SASL token (after SaslHandshake v0): answer a bare token, or close (delayed)."""
    session = request.connection.session
    try:
        challenge = session.evaluate(request.payload)
    except SaslAuthenticationError as e:
        log.info("failed authentication with %s (%s) on %s: %s", request.client_address,
                 request.connection_id, session.listener_name, e)
        channel.close_connection(request)
        return
    channel.send_response(request, [struct.pack(">i", len(challenge)) + challenge])


HANDLERS = {
    ApiKey.SASL_HANDSHAKE: ApiHandler(0, 1, handle_sasl_handshake),
    ApiKey.SASL_AUTHENTICATE: ApiHandler(0, 2, handle_sasl_authenticate),
}

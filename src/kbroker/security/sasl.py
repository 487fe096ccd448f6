"""SASL on a connection: its :class:`ChannelSession`, and the server side of PLAIN and SCRAM.

Kafka: ``SaslServerAuthenticator``, ``PlainSaslServer``, ``ScramSaslServer``.

Session states (Kafka's ``SaslState``)::

    HANDSHAKE_OR_VERSIONS --SaslHandshake(mechanism enabled)--> AUTHENTICATE
    AUTHENTICATE --tokens--> COMPLETE (authenticated; the principal is User:<name>)
                          \\-> FAILED  (SASL_AUTHENTICATION_FAILED answered; the connection is
                                       closed connection.failed.authentication.delay.ms later)

Before COMPLETE only ApiVersions, SaslHandshake and SaslAuthenticate are accepted (the network
processor closes the connection on anything else, Kafka's ILLEGAL_SASL_STATE), and a frame may
be at most ``sasl.server.max.receive.size`` bytes. After a SaslHandshake v0 the client sends
bare SASL tokens (a size prefix and the token, no request header: ``raw_tokens``) and gets bare
tokens back.

Thread-safety: a session belongs to its connection, which has at most one request in flight; it
is changed only by the thread handling that request (the request queue hand-over orders those
writes before the processor's next read of the session).

Failures never say which part was wrong: an unknown user, a wrong password and a malformed
token all give :data:`AUTH_FAILED_MESSAGE`; SCRAM answers an unknown user with a made-up salt and
iteration count (stable per user) so that it fails at the proof, like a wrong password.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import time
from typing import Callable, Mapping, Optional

from kbroker.security import scram
from kbroker.security.credentials import ScramCredentialSource

HANDSHAKE_OR_VERSIONS = "HANDSHAKE_OR_VERSIONS"
AUTHENTICATE = "AUTHENTICATE"
COMPLETE = "COMPLETE"
FAILED = "FAILED"

SUPPORTED_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def auth_failed_message(mechanism: str) -> str:
    """Kafka's text for every authentication failure (it names no user and no field)."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


class SaslAuthenticationError(Exception):
    """Authentication failed; ``str(e)`` is for the broker's log only, never the client."""


class SaslListenerConfig:
    """A SASL listener's settings: enabled mechanisms, PLAIN users (from JAAS), where SCRAM
    credentials come from, the size bound of pre-authentication frames, the close delay after a
    failure, and ``connections.max.reauth.ms`` (0: no session lifetime)."""

    def __init__(self, mechanisms: list[str], plain_users: Mapping[str, str] | None = None,
                 scram_credentials: ScramCredentialSource | None = None,
                 max_receive_size: int = 524288, failed_authentication_delay_ms: int = 100,
                 max_reauth_ms: int = 0, oauthbearer_options: Mapping[str, str] | None = None):
        self.mechanisms = list(mechanisms)
        self.plain_users = dict(plain_users or {})
        self.scram_credentials = scram_credentials
        self.max_receive_size = max_receive_size
        self.failed_authentication_delay_ms = failed_authentication_delay_ms
        self.max_reauth_ms = max_reauth_ms
        self.oauthbearer_options = dict(oauthbearer_options or {})
        self._fake_salt_key = os.urandom(32)

    def new_server(self, mechanism: str):
        if mechanism == "PLAIN":
            return PlainServer(self.plain_users)
        if mechanism in scram.MECHANISMS:
            return ScramServer(mechanism, self._scram_lookup, self._fake_salt_key)
        if mechanism == "OAUTHBEARER":
            from kbroker.security.oauthbearer import OAuthBearerUnsecuredServer

            return OAuthBearerUnsecuredServer(self.oauthbearer_options)
        raise ValueError(mechanism)

    def _scram_lookup(self, user: str, mechanism: str):
        src = self.scram_credentials
        return src.scram_credential(user, mechanism) if src is not None else None


class ChannelSession:
    """Security state of one connection (see the module docstring for who may touch it).

    ``principal``: ``User:ANONYMOUS`` until authenticated (SSL: the certificate's, at once).
    ``session_expiry_ns`` (KIP-368, ``connections.max.reauth.ms`` > 0): monotonic time after which
    the processor closes the connection on any request but a re-authentication's SaslHandshake;
    0: never.
    ``authenticated``: requests other than the SASL ones may be handled. ``close_delay_ms``:
    not None once authentication failed; the processor closes the connection that long after
    the failure response was written instead of reading from it again.
    """

    __slots__ = ("security_protocol", "listener_name", "principal", "authenticated", "state",
                 "sasl", "mechanism", "server", "raw_tokens", "close_delay_ms",
                 "session_expiry_ns", "_lifetime_ms")

    def __init__(self, security_protocol: str, listener_name: str,
                 sasl: Optional[SaslListenerConfig] = None, principal: str = "User:ANONYMOUS"):
        self.security_protocol = security_protocol
        self.listener_name = listener_name
        self.principal = principal
        self.sasl = sasl
        self.authenticated = sasl is None
        self.state = HANDSHAKE_OR_VERSIONS if sasl is not None else COMPLETE
        self.mechanism: Optional[str] = None
        self.server = None
        self.raw_tokens = False
        self.close_delay_ms: Optional[int] = None
        self.session_expiry_ns = 0
        self._lifetime_ms = 0

    @property
    def max_receive_size(self) -> int:
        return self.sasl.max_receive_size if self.sasl is not None else 0

    @property
    def can_reauthenticate(self) -> bool:
        """KIP-368: an authenticated session with a lifetime may authenticate again in-band."""
        return self.state == COMPLETE and self.sasl is not None and self.sasl.max_reauth_ms > 0

    def handshake(self, mechanism: str, raw_tokens: bool) -> bool:
        """A SaslHandshake for ``mechanism``: True (state AUTHENTICATE) if it is enabled (on
        re-authentication: if it is the mechanism of the first authentication, as Kafka requires)."""
        if mechanism not in self.sasl.mechanisms:
            return False
        if self.state == COMPLETE and mechanism != self.mechanism:
            return False
        self.mechanism = mechanism
        self.server = self.sasl.new_server(mechanism)
        self.raw_tokens = raw_tokens
        self.state = AUTHENTICATE
        return True

    def evaluate(self, token: bytes) -> bytes:
        """The next server token; on completion the session is authenticated. Raises
        SaslAuthenticationError (the session is FAILED)."""
        try:
            challenge = self.server.evaluate(bytes(token))
        except SaslAuthenticationError:
            self.fail()
            raise
        except Exception as e:           # a malformed token: a failure like any other
            self.fail()
            raise SaslAuthenticationError(f"malformed {self.mechanism} token: {type(e).__name__}") from None
        if self.server.complete:
            principal = "User:" + self.server.authorization_id
            if self.authenticated and principal != self.principal:
                self.fail()
                raise SaslAuthenticationError(f"re-authentication as {principal} on a session of {self.principal}")
            self.principal = principal
            self.state = COMPLETE
            self.authenticated = True
            self.raw_tokens = False
            lifetime = self.sasl.max_reauth_ms
            token_expiry_ms = getattr(self.server, "expiry_ms", 0)
            if lifetime > 0 and token_expiry_ms:
                # KIP-368: the session ends with the token (Kafka: min of both)
                lifetime = max(0, min(lifetime, token_expiry_ms - int(time.time() * 1000)))
            self._lifetime_ms = lifetime
            self.server = None
            self.session_expiry_ns = time.monotonic_ns() + lifetime * 1_000_000 if self.sasl.max_reauth_ms > 0 else 0
        return challenge

    @property
    def session_lifetime_ms(self) -> int:
        """What SaslAuthenticate v1+ tells the client (0: no re-authentication needed)."""
        return self._lifetime_ms if self.state == COMPLETE and self.sasl.max_reauth_ms > 0 else 0

    def fail(self) -> None:
        self.state = FAILED
        self.server = None
        self.close_delay_ms = self.sasl.failed_authentication_delay_ms


# -- PLAIN (RFC 4616) ------------------------------------------------------------------------

class PlainServer:
    """``[authzid] NUL authcid NUL passwd``; the password is compared in constant time with the
    JAAS ``user_<authcid>`` entry; an authzid, if given, must equal the authcid."""

    mechanism = "PLAIN"

    def __init__(self, users: Mapping[str, str]):
        self._users = users
        self.complete = False
        self.authorization_id = ""

    def evaluate(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslAuthenticationError("PLAIN: the token is not authzid NUL authcid NUL passwd")
        authzid, user, password = (p.decode("utf-8") for p in parts)
        if not user:
            raise SaslAuthenticationError("PLAIN: empty user name")
        expected = self._users.get(user)
        ok = hmac.compare_digest((expected if expected is not None else "\0" + password).encode(),
                                 password.encode())
        if not ok or expected is None:
            raise SaslAuthenticationError(f"PLAIN: wrong password or unknown user {user!r}")
        if authzid and authzid != user:
            raise SaslAuthenticationError("PLAIN: the authorization id differs from the user name")
        self.authorization_id = user
        self.complete = True
        return b""


# -- SCRAM (RFC 5802, RFC 7677) --------------------------------------------------------------

_CLIENT_FIRST = re.compile(
    r"(?P<gs2>[ny],(?:a=(?P<authzid>[^,]*))?,)(?P<bare>n=(?P<user>[^,]*),r=(?P<nonce>[\x21-\x2b\x2d-\x7e]+)"
    r"(?P<ext>(?:,[a-zA-Z][^,]*)*))", re.S)
_CLIENT_FINAL = re.compile(r"(?P<without>c=(?P<cbind>[A-Za-z0-9+/=]*),r=(?P<nonce>[\x21-\x2b\x2d-\x7e]+)"
                           r"(?:,[a-zA-Z][^,]*)*?),p=(?P<proof>[A-Za-z0-9+/=]+)", re.S)


def server_nonce() -> str:
    """The server's half of the nonce: letters and digits only, as Kafka's
    ``ScramFormatter.secureRandomString`` (librdkafka 2.0 mis-handles a server nonce with '+' or '/')."""
    return secrets.token_hex(16)


def _saslname(name: str) -> str:
    """RFC 5802 saslname: ``=2C`` is ',' and ``=3D`` is '='; any other '=' is malformed."""
    if re.search(r"=(?!2C|3D)", name):
        raise SaslAuthenticationError("SCRAM: malformed user name")
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """Two rounds: client-first -> server-first (nonce, salt, iterations), client-final ->
    server-final (the server signature) once the client proof checks out. Kafka's extensions
    (``tokenauth=true`` for delegation tokens) are refused; others are ignored as Kafka does."""

    def __init__(self, mechanism: str, lookup: Callable[[str, str], Optional[scram.ScramCredential]],
                 fake_key: bytes):
        self.mechanism = mechanism
        self._hash = scram.hash_name(mechanism)
        self._lookup = lookup
        self._fake_key = fake_key
        self.complete = False
        self.authorization_id = ""
        self._round = 0

    def evaluate(self, token: bytes) -> bytes:
        if self._round == 0:
            return self._first(token.decode("utf-8"))
        if self._round == 1:
            return self._final(token.decode("utf-8"))
        raise SaslAuthenticationError("SCRAM: unexpected token after the exchange")

    def _first(self, msg: str) -> bytes:
        m = _CLIENT_FIRST.fullmatch(msg)
        if m is None:
            raise SaslAuthenticationError("SCRAM: malformed client-first message")
        user = _saslname(m.group("user"))
        if m.group("authzid") and _saslname(m.group("authzid")) != user:
            raise SaslAuthenticationError("SCRAM: the authorization id differs from the user name")
        exts = dict(e.partition("=")[::2] for e in m.group("ext").split(",") if e)
        if exts.get("tokenauth", "").lower() == "true":
            raise SaslAuthenticationError("SCRAM: delegation tokens are not supported")
        cred = self._lookup(user, self.mechanism)
        self._known = cred is not None
        if cred is None:
            # An unknown user gets a stable made-up salt and iteration count: it fails at the
            # proof, as a wrong password does, so the exchange does not tell the two apart.
            fake = hmac.new(self._fake_key, user.encode() + self.mechanism.encode(), hashlib.sha256).digest()
            cred = scram.ScramCredential(fake, b"", b"", scram.MIN_ITERATIONS)
        self._cred = cred
        self._user = user
        self._gs2 = m.group("gs2")
        self._client_first_bare = m.group("bare")
        self._nonce = m.group("nonce") + server_nonce()
        self._server_first = (f"r={self._nonce},s={base64.b64encode(cred.salt).decode()},"
                              f"i={cred.iterations}")
        self._round = 1
        return self._server_first.encode()

    def _final(self, msg: str) -> bytes:
        m = _CLIENT_FINAL.fullmatch(msg)
        if m is None:
            raise SaslAuthenticationError("SCRAM: malformed client-final message")
        nonce = m.group("nonce")
        # Kafka 3.8.1+/3.9 accept a nonce that ends with the server's (librdkafka before 2.6.1
        # sends the client nonce twice, librdkafka#4895); Kafka 4 wants it equal. The server's
        # random part is bound either way.
        if nonce != self._nonce and not nonce.endswith(self._nonce):
            raise SaslAuthenticationError("SCRAM: nonce mismatch")
        try:
            cbind = base64.b64decode(m.group("cbind"), validate=True)
            proof = base64.b64decode(m.group("proof"), validate=True)
        except ValueError:
            raise SaslAuthenticationError("SCRAM: malformed base64") from None
        if cbind != self._gs2.encode():
            raise SaslAuthenticationError("SCRAM: channel binding mismatch")
        auth_message = f"{self._client_first_bare},{self._server_first},{m.group('without')}".encode()
        cred = self._cred
        signature = scram.hmac_(self._hash, cred.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslAuthenticationError("SCRAM: bad proof length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        ok = hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), cred.stored_key)
        if not ok or not self._known:
            raise SaslAuthenticationError(f"SCRAM: invalid proof for user {self._user!r}")
        self._round = 2
        self.authorization_id = self._user
        self.complete = True
        server_signature = scram.hmac_(self._hash, cred.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)

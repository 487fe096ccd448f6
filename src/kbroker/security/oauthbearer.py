"""SASL OAUTHBEARER (RFC 7628) with unsecured JWTs, for development: Kafka's default broker-side
validator (``OAuthBearerUnsecuredValidatorCallbackHandler``; "not for production").

The client's initial response is ``n,[a=authzid],`` ``\\x01auth=Bearer <token>\\x01`` [``key=value\\x01`` ...]
``\\x01``. The token is a JWS in compact form with ``{"alg":"none"}`` and an empty signature; its
claims must hold the principal (``sub``, or ``unsecuredValidatorPrincipalClaimName``) and ``exp``
(seconds) in the future, ``iat`` if present not in the future (both with
``unsecuredValidatorAllowableClockSkewMs``), and every scope of
``unsecuredValidatorRequiredScope`` in ``scope``. These options come from the listener's
``oauthbearer.sasl.jaas.config`` (OAuthBearerLoginModule), as in Kafka.

A bad token is answered as RFC 7628 says: a JSON error challenge ``{"status":"invalid_token"}``;
the client replies ``\\x01`` and the authentication fails then. The session lifetime is capped by
the token's expiry (KIP-368).
"""
from __future__ import annotations

import base64
import json
import re
import time
from typing import Mapping

from kbroker.security.sasl import SaslAuthenticationError

_RESPONSE = re.compile(r"n,(?:a=(?P<authzid>[^,]*))?,\x01(?P<kvpairs>(?:[A-Za-z]+=[\x21-\x7E \t\r\n]*\x01)*)\x01", re.S)
_KV = re.compile(r"(?P<key>[A-Za-z]+)=(?P<value>[\x21-\x7E \t\r\n]*)\x01", re.S)
_TOKEN = re.compile(r"[A-Za-z0-9\-_]+\.[A-Za-z0-9\-_]+\.")


def _b64url_json(part: str) -> dict:
    data = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


class OAuthBearerUnsecuredServer:
    mechanism = "OAUTHBEARER"

    def __init__(self, options: Mapping[str, str]):
        self._principal_claim = options.get("unsecuredValidatorPrincipalClaimName", "sub") or "sub"
        self._scope_claim = options.get("unsecuredValidatorScopeClaimName", "scope") or "scope"
        self._required_scope = (options.get("unsecuredValidatorRequiredScope") or "").split()
        self._skew_s = int(options.get("unsecuredValidatorAllowableClockSkewMs", "0") or 0) / 1000
        self.complete = False
        self.authorization_id = ""
        self.expiry_ms = 0
        self._error_sent = None

    def evaluate(self, token: bytes) -> bytes:
        if self._error_sent is not None:
            # the client acknowledged the error challenge (RFC 7628 §3.2.3): fail now
            raise SaslAuthenticationError(f"OAUTHBEARER: {self._error_sent}")
        try:
            principal, expiry_ms = self._validate(token.decode("utf-8"))
        except SaslAuthenticationError as e:
            self._error_sent = str(e)
            return json.dumps({"status": "invalid_token"}).encode()
        self.authorization_id = principal
        self.expiry_ms = expiry_ms
        self.complete = True
        return b""

    def _validate(self, msg: str) -> tuple[str, int]:
        m = _RESPONSE.fullmatch(msg)
        if m is None:
            raise SaslAuthenticationError("malformed client initial response")
        pairs = {k.group("key"): k.group("value") for k in _KV.finditer(m.group("kvpairs"))}
        auth = pairs.get("auth", "")
        scheme, _, jws = auth.partition(" ")
        if scheme.lower() != "bearer" or not _TOKEN.fullmatch(jws.strip()):
            raise SaslAuthenticationError("no unsecured bearer token")
        header_b64, payload_b64, _ = jws.strip().split(".")
        try:
            header, claims = _b64url_json(header_b64), _b64url_json(payload_b64)
        except (ValueError, UnicodeDecodeError) as e:
            raise SaslAuthenticationError(f"undecodable token: {type(e).__name__}") from None
        if header.get("alg") != "none":
            raise SaslAuthenticationError("only unsecured tokens (alg none) are accepted")
        now = time.time()
        exp = claims.get("exp")
        if not isinstance(exp, (int, float)) or isinstance(exp, bool):
            raise SaslAuthenticationError("the token has no numeric exp claim")
        if exp + self._skew_s <= now:
            raise SaslAuthenticationError("the token has expired")
        iat = claims.get("iat")
        if iat is not None and (not isinstance(iat, (int, float)) or iat - self._skew_s > now):
            raise SaslAuthenticationError("the token's iat is in the future")
        principal = claims.get(self._principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            raise SaslAuthenticationError(f"the token has no {self._principal_claim} claim")
        if self._required_scope:
            scope = claims.get(self._scope_claim, [])
            scopes = set(scope.split() if isinstance(scope, str) else scope if isinstance(scope, list) else [])
            if not set(self._required_scope) <= scopes:
                raise SaslAuthenticationError("the token lacks a required scope")
        if m.group("authzid") and m.group("authzid") != principal:
            raise SaslAuthenticationError("the authorization id differs from the token's principal")
        return principal, int(exp * 1000)

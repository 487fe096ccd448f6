"""The client side of SASL PLAIN and SCRAM-SHA-256/512 (RFC 4616, RFC 5802), and of a client's
TLS context from Java client settings, for kbroker's own client (``kbroker.client``)."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import ssl

from kbroker.security import scram
from kbroker.security.jaas import parse_jaas


def jaas_credentials(text: str) -> tuple[str, str]:
    """``username`` and ``password`` of a client's sasl.jaas.config (Plain or Scram LoginModule)."""
    for m in parse_jaas(text):
        if "username" in m.options and "password" in m.options:
            return m.options["username"], m.options["password"]
    raise ValueError("sasl.jaas.config has no username and password options")


class PlainClient:
    def __init__(self, user: str, password: str):
        self._token = f"\0{user}\0{password}".encode()
        self.done = False

    def next(self, challenge: bytes | None) -> bytes | None:
        """The next token (None: the exchange is over)."""
        if challenge is None:
            return self._token
        self.done = True
        return None


class ScramClient:
    """RFC 5802 client; ``next(None)`` gives client-first, then client-final, then checks the
    server signature (ValueError if it is wrong: the broker does not know the password)."""

    def __init__(self, mechanism: str, user: str, password: str):
        self._hash = scram.hash_name(mechanism)
        self._mechanism, self._user, self._password = mechanism, user, password
        self._nonce = base64.b64encode(os.urandom(24)).decode().replace(",", "_")
        self._round = 0
        self.done = False

    def next(self, challenge: bytes | None) -> bytes | None:
        if self._round == 0:
            self._round = 1
            name = self._user.replace("=", "=3D").replace(",", "=2C")
            self._bare = f"n={name},r={self._nonce}"
            return ("n,," + self._bare).encode()
        if self._round == 1:
            self._round = 2
            server_first = challenge.decode()
            attrs = dict(a.split("=", 1) for a in server_first.split(","))
            if not attrs.get("r", "").startswith(self._nonce) or int(attrs["i"]) < scram.MIN_ITERATIONS:
                raise ValueError("invalid SCRAM server-first message")
            salted = scram.salted_password(self._mechanism, self._password, base64.b64decode(attrs["s"]),
                                           int(attrs["i"]))
            without = f"c=biws,r={attrs['r']}"
            self._auth_message = f"{self._bare},{server_first},{without}".encode()
            client_key = scram.hmac_(self._hash, salted, b"Client Key")
            signature = scram.hmac_(self._hash, hashlib.new(self._hash, client_key).digest(), self._auth_message)
            self._server_key = scram.hmac_(self._hash, salted, b"Server Key")
            proof = bytes(a ^ b for a, b in zip(client_key, signature))
            return f"{without},p={base64.b64encode(proof).decode()}".encode()
        expected = b"v=" + base64.b64encode(scram.hmac_(self._hash, self._server_key, self._auth_message))
        if not hmac.compare_digest(bytes(challenge), expected):
            raise ValueError("the broker's SCRAM server signature is wrong")
        self.done = True
        return None


def new_sasl_client(mechanism: str, jaas: str | None):
    if not jaas:
        raise ValueError("sasl.jaas.config is required for SASL (username and password)")
    user, password = jaas_credentials(jaas)
    if mechanism == "PLAIN":
        return PlainClient(user, password)
    if mechanism in scram.MECHANISMS:
        return ScramClient(mechanism, user, password)
    raise ValueError(f"SASL mechanism {mechanism} is not supported by this client (PLAIN, SCRAM-SHA-256/512)")


def client_ssl_context(config) -> ssl.SSLContext:
    """A client SSLContext from Java client settings (PEM stores only: a key store file, or
    inline ssl.keystore.key + ssl.keystore.certificate.chain)."""
    ctx = ssl.create_default_context()
    ca = config.get("ssl.truststore.location")
    if ca:
        ctx.load_verify_locations(cafile=ca)
    certs = config.get("ssl.truststore.certificates")
    if certs:
        ctx.load_verify_locations(cadata=certs)
    keystore = config.get("ssl.keystore.location")
    if keystore:
        ctx.load_cert_chain(keystore, password=config.get("ssl.key.password") or (lambda: b""))
    elif config.get("ssl.keystore.key") and config.get("ssl.keystore.certificate.chain"):
        from kbroker.security.tls import _load_inline_cert_chain
        _load_inline_cert_chain(ctx, str(config["ssl.keystore.certificate.chain"]), str(config["ssl.keystore.key"]),
                                config.get("ssl.key.password"))
    if not config.get("ssl.endpoint.identification.algorithm"):
        ctx.check_hostname = False
    return ctx

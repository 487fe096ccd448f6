"""The client side of SCRAM (RFC 5802), written from the RFC for the tests."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os

from kbroker.security import scram


class ScramClient:
    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None,
                 old_librdkafka: bool = False):
        self.mechanism, self.user, self.password = mechanism, user, password
        self.old_librdkafka = old_librdkafka       # librdkafka < 2.6.1: client nonce sent twice
        self.hash = scram.hash_name(mechanism)
        self.nonce = nonce or base64.b64encode(os.urandom(18)).decode()

    def first(self) -> bytes:
        self.bare = f"n={self.user.replace('=', '=3D').replace(',', '=2C')},r={self.nonce}"
        return ("n,," + self.bare).encode()

    def final(self, server_first: bytes) -> bytes:
        sf = server_first.decode()
        attrs = dict(a.split("=", 1) for a in sf.split(","))
        assert attrs["r"].startswith(self.nonce)
        salted = hashlib.pbkdf2_hmac(self.hash, self.password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
        without = f"c=biws,r={self.nonce if self.old_librdkafka else ''}{attrs['r']}"
        self.auth_message = f"{self.bare},{sf},{without}".encode()
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        stored = hashlib.new(self.hash, client_key).digest()
        sig = hmac.new(stored, self.auth_message, self.hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, sig))
        self.server_key = hmac.new(salted, b"Server Key", self.hash).digest()
        return f"{without},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        expected = base64.b64encode(hmac.new(self.server_key, self.auth_message, self.hash).digest())
        assert server_final == b"v=" + expected, server_final

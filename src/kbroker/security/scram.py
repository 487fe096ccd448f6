"""SCRAM (RFC 5802, RFC 7677): mechanisms, credentials and the formulas (Kafka's ``ScramFormatter``).

A credential is what the broker stores for a user and mechanism: ``salt``, ``stored_key``
(``H(HMAC(SaltedPassword, "Client Key"))``), ``server_key`` (``HMAC(SaltedPassword, "Server
Key")``) and ``iterations``; never the password or the salted password. This is the content of
Kafka's ``UserScramCredentialRecord``.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
import re

#: mechanism name -> (hashlib name, the int8 of AlterUserScramCredentials / DescribeUserScramCredentials)
MECHANISMS = {"SCRAM-SHA-256": ("sha256", 1), "SCRAM-SHA-512": ("sha512", 2)}
MECHANISM_BY_TYPE = {t: name for name, (_, t) in MECHANISMS.items()}
#: Kafka's ScramMechanism minimum iterations; AlterUserScramCredentials allows at most 16384
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384


@dataclasses.dataclass(frozen=True)
class ScramCredential:
    """(repr hides the salt and keys, as Kafka's ScramCredentialValue.toString does)"""
    salt: bytes = dataclasses.field(repr=False)
    stored_key: bytes = dataclasses.field(repr=False)
    server_key: bytes = dataclasses.field(repr=False)
    iterations: int

    def to_json(self) -> dict:
        b64 = lambda b: base64.b64encode(b).decode()
        return {"salt": b64(self.salt), "stored_key": b64(self.stored_key),
                "server_key": b64(self.server_key), "iterations": self.iterations}

    @classmethod
    def from_json(cls, d: dict) -> "ScramCredential":
        return cls(base64.b64decode(d["salt"]), base64.b64decode(d["stored_key"]),
                   base64.b64decode(d["server_key"]), int(d["iterations"]))


def hash_name(mechanism: str) -> str:
    return MECHANISMS[mechanism][0]


def hmac_(hash_: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(Normalize(password), salt, i): PBKDF2 with HMAC of the mechanism's hash (Kafka does not
    SASLprep; neither do we: the UTF-8 bytes of the password)."""
    return hashlib.pbkdf2_hmac(hash_name(mechanism), password.encode("utf-8"), salt, iterations)


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    h = hash_name(mechanism)
    client_key = hmac_(h, salted, b"Client Key")
    return ScramCredential(salt, hashlib.new(h, client_key).digest(), hmac_(h, salted, b"Server Key"),
                           iterations)


def make_credential(mechanism: str, password: str, iterations: int = MIN_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    """A credential for ``password`` (a random 32-byte salt unless given)."""
    salt = os.urandom(32) if salt is None else salt
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt, iterations),
                                  salt, iterations)


# -- kafka-configs.sh syntax --------------------------------------------------------------

_SPEC = re.compile(r"^\[(.*)\]$|^(.*)$", re.S)


def parse_credential_spec(text: str) -> dict[str, str]:
    """``[iterations=8192,password=alice-secret]`` (or ``password=...`` alone) -> {key: value}.
    The password is the rest of the text after ``password=`` up to the closing bracket or a
    following ``,iterations=``/``,salt=`` (Kafka's ConfigCommand parses it the same way)."""
    m = _SPEC.match(text.strip())
    body = m.group(1) if m.group(1) is not None else m.group(2)
    out: dict[str, str] = {}
    for part in re.split(r",(?=\s*(?:iterations|password|salt)=)", body):
        k, sep, v = part.partition("=")
        if not sep:
            raise ValueError(f"invalid SCRAM credential {text!r}: expected key=value")
        out[k.strip()] = v
    if "password" not in out:
        raise ValueError(f"invalid SCRAM credential {text!r}: password is required")
    return out

"""``kbroker storage format --add-scram``: SCRAM credentials for the bootstrap metadata.

Kafka: ``metadata/.../storage/ScramParser.java`` (3.9). Each argument is
``MECHANISM=[key=value,...]`` (``SCRAM-SHA-256=[name=alice,password=alice-secret]``) with the
keys ``name`` (required), ``password`` or ``saltedpassword`` (base64, needs ``salt``),
``salt`` (base64; else 32 random bytes) and ``iterations`` (4096..16384; default 4096). A
value in double quotes loses them; components are split at every comma (a password cannot
hold one, as in Kafka). Each argument becomes one UserScramCredentialRecord (stored and server
keys derived here: the password never reaches the log). Errors are FormatterError with
Kafka's texts.
"""
from __future__ import annotations

import base64
import binascii
import os
import re

from kbroker.metadata.bootstrap import FormatterError
from kbroker.metadata.records.user_scram_credential_record import UserScramCredentialRecord
from kbroker.metadata.serde import ApiMessageAndVersion
from kbroker.security import scram

#: Kafka's internals.ScramMechanism enum names (its toString, in the iteration messages)
_ENUM_NAME = {"SCRAM-SHA-256": "SCRAM_SHA_256", "SCRAM-SHA-512": "SCRAM_SHA_512"}
DEFAULT_ITERATIONS = 4096


def _b64(text: str) -> bytes:
    """java.util.Base64.getDecoder().decode: standard alphabet, padding optional."""
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _java_split(text: str, sep: str) -> list[str]:
    """Java's String.split: trailing empty strings dropped (an input without ``sep`` is kept whole)."""
    if sep not in text:
        return [text]
    parts = text.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def split_component(text: str) -> tuple[str, str]:
    """``key=value`` -> (key, value), a value in double quotes without them (Kafka's
    splitTrimmedConfigStringComponent, which trims nothing else)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise FormatterError(f"No equals sign found in SCRAM component: {text}")
    if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
        value = value[1:-1]
    return key, value


def parse_argument(text: str) -> tuple[str, str]:
    """``MECHANISM=[...]`` -> (mechanism name, the text between the brackets)."""
    text = text.strip()
    mechanism, sep, config = text.partition("=")
    if not sep:
        raise FormatterError(f"Failed to find equals sign in SCRAM argument '{text}'")
    if mechanism not in scram.MECHANISMS:
        raise FormatterError(f"The add-scram mechanism {mechanism} is not supported.")
    if not config.startswith("["):
        raise FormatterError("Expected configuration string to start with [")
    if not config.endswith("]"):
        raise FormatterError("Expected configuration string to end with ]")
    return mechanism, config[1:-1]


def credential_record(mechanism: str, config: str, random_bytes=os.urandom) -> UserScramCredentialRecord:
    """One --add-scram argument's record (Kafka's PerMechanismData and its toRecord)."""
    components = dict(split_component(c) for c in _java_split(config, ","))
    name = components.pop("name", None)
    if name is None:
        raise FormatterError("You must supply 'name' to add-scram")
    salt_text = components.pop("salt", None)
    salt = None
    if salt_text is not None:
        try:
            salt = _b64(salt_text)
        except (binascii.Error, ValueError):
            raise FormatterError(f"Failed to decode given salt: {salt_text}") from None
    iterations = DEFAULT_ITERATIONS
    iterations_text = components.pop("iterations", None)
    if iterations_text is not None:
        if re.fullmatch(r"[+-]?[0-9]+", iterations_text) and -2**31 <= int(iterations_text) < 2**31:
            iterations = int(iterations_text)      # Java's Integer.parseInt
        else:
            raise FormatterError(f"Failed to parse iterations count: {iterations_text}") from None
    password = components.pop("password", None)
    salted_text = components.pop("saltedpassword", None)
    salted = None
    if password is None:
        if salted_text is None:
            raise FormatterError("You must supply one of 'password' or 'saltedpassword' to add-scram")
        if salt is None:
            raise FormatterError("You must supply 'salt' with 'saltedpassword' to add-scram")
        try:
            salted = _b64(salted_text)
        except (binascii.Error, ValueError):
            raise FormatterError(f"Failed to decode given saltedPassword: {salted_text}") from None
    if components:
        raise FormatterError("Unknown SCRAM configurations: " + ", ".join(sorted(components)))
    if salt is None:
        salt = random_bytes(32)
    if iterations < scram.MIN_ITERATIONS:
        raise FormatterError(f"The 'iterations' value must be >= {scram.MIN_ITERATIONS} for add-scram using "
                             f"{_ENUM_NAME[mechanism]}")
    if iterations > scram.MAX_ITERATIONS:
        raise FormatterError(f"The 'iterations' value must be <= {scram.MAX_ITERATIONS} for add-scram using "
                             f"{_ENUM_NAME[mechanism]}")
    if salted is None:
        salted = scram.salted_password(mechanism, password, salt, iterations)
    c = scram.credential_from_salted(mechanism, salted, salt, iterations)
    return UserScramCredentialRecord(name=name, mechanism=scram.MECHANISMS[mechanism][1], salt=c.salt,
                                     stored_key=c.stored_key, server_key=c.server_key, iterations=iterations)


def parse(arguments, random_bytes=os.urandom) -> list[ApiMessageAndVersion]:
    """Every --add-scram argument's UserScramCredentialRecord, in order."""
    return [ApiMessageAndVersion(credential_record(*parse_argument(a), random_bytes=random_bytes), 0)
            for a in arguments]

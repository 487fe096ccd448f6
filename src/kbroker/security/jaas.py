"""Kafka's JAAS configuration text (``sasl.jaas.config``), parsed as Kafka's ``JaasConfig`` does::

    org.apache.kafka.common.security.plain.PlainLoginModule required
        username="admin" password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";

One or more ``<LoginModule class> <flag> key=value ... ;`` entries; values are double-quoted
strings (``\\"`` and ``\\\\`` escapes) or bare tokens.
"""
from __future__ import annotations

import dataclasses
import re

FLAGS = ("required", "requisite", "sufficient", "optional")
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"

_TOKEN = re.compile(r'\s*(?:(?P<q>"(?:\\.|[^"\\])*")|(?P<semi>;)|(?P<eq>=)|(?P<word>[^\s=;"]+))', re.S)


@dataclasses.dataclass(frozen=True)
class LoginModule:
    class_name: str
    flag: str
    options: dict


def parse_jaas(text: str) -> list[LoginModule]:
    """The login modules of a JAAS text; ValueError (no secret in its message) if malformed."""
    tokens = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"unexpected character at offset {pos}")
        pos = m.end()
        if m.group("q") is not None:
            tokens.append(("str", re.sub(r"\\(.)", r"\1", m.group("q")[1:-1])))
        elif m.group("semi"):
            tokens.append((";", ";"))
        elif m.group("eq"):
            tokens.append(("=", "="))
        else:
            tokens.append(("word", m.group("word")))
    modules = []
    i = 0
    while i < len(tokens):
        if tokens[i][0] != "word":
            raise ValueError("expected a login module class name")
        cls = tokens[i][1]
        if i + 1 >= len(tokens) or tokens[i + 1][1].lower() not in FLAGS:
            raise ValueError(f"login module {cls}: expected a control flag ({', '.join(FLAGS)})")
        flag = tokens[i + 1][1].lower()
        i += 2
        options = {}
        while i < len(tokens) and tokens[i][0] != ";":
            if (i + 2 >= len(tokens) or tokens[i][0] != "word" or tokens[i + 1][0] != "="
                    or tokens[i + 2][0] not in ("str", "word")):
                raise ValueError(f"login module {cls}: expected key=value options")
            options[tokens[i][1]] = tokens[i + 2][1]
            i += 3
        if i >= len(tokens):
            raise ValueError(f"login module {cls}: the entry must end with ';'")
        i += 1
        modules.append(LoginModule(cls, flag, options))
    if not modules:
        raise ValueError("no login module")
    return modules


def plain_users(text: str) -> dict[str, str]:
    """``user_<name>="<password>"`` options of the PlainLoginModule entries -> {name: password}."""
    users = {}
    for m in parse_jaas(text):
        if m.class_name == PLAIN_LOGIN_MODULE:
            users.update({k[5:]: v for k, v in m.options.items() if k.startswith("user_")})
    return users

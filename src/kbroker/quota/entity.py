"""Client quota entities, keys and the rules for altering and describing them.

Kafka: ``ClientQuotaEntity``, ``QuotaConfig`` (the quota keys and their types),
``ClientQuotaControlManager`` (validation of AlterClientQuotas) and
``ClientQuotasImage.describe`` (DescribeClientQuotas filters).

An *entity* is a mapping of entity type (``user``, ``client-id``, ``ip``) to a name, where
``None`` is the type's default entity (``--entity-default``). It is kept as a sorted tuple
of ``(type, name)`` pairs (:func:`entity_key`), hashable and stable in files. ``user``
and ``client-id`` may be combined; ``ip`` stands alone. Values are floats, as on the wire.
"""
from __future__ import annotations

import ipaddress
import socket
from typing import Iterable, Mapping

from kbroker.protocol import ErrorCode

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

#: key -> Kafka's ConfigDef type, for user/client-id entities (QuotaConfig.userAndClientQuotaConfigs)
USER_CLIENT_KEYS = {PRODUCER_BYTE_RATE: "LONG", CONSUMER_BYTE_RATE: "LONG",
                    REQUEST_PERCENTAGE: "DOUBLE", CONTROLLER_MUTATION_RATE: "DOUBLE"}
#: for ip entities (QuotaConfig.ipConfigs)
IP_KEYS = {CONNECTION_CREATION_RATE: "INT"}
_LIMITS = {"INT": 2**31 - 1, "LONG": 2**63 - 1}

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2

EntityKey = tuple  # ((type, name | None), ...) sorted by type


class QuotaError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def entity_key(entries: Iterable[tuple[str, str | None]]) -> EntityKey:
    return tuple(sorted(entries, key=lambda e: e[0]))


def validate_entity(entries: Iterable[tuple[str, str | None]]) -> tuple[EntityKey, dict[str, str]]:
    """The entity's key and its allowed quota keys (name -> type), or QuotaError
    (INVALID_REQUEST with Kafka's message)."""
    seen: dict[str, str | None] = {}
    for etype, name in entries:
        if etype in seen:
            raise QuotaError(ErrorCode.INVALID_REQUEST,
                             f"Invalid client quota entity, duplicate entity entry {etype}")
        if etype not in ENTITY_TYPES:
            raise QuotaError(ErrorCode.INVALID_REQUEST, f"Unhandled client quota entity type: {etype}")
        if name is not None and name == "":
            raise QuotaError(ErrorCode.INVALID_REQUEST, f"Empty {etype} not supported")
        seen[etype] = name
    if not seen:
        raise QuotaError(ErrorCode.INVALID_REQUEST, "Invalid empty client quota entity")
    if IP in seen:
        if USER in seen or CLIENT_ID in seen:
            raise QuotaError(ErrorCode.INVALID_REQUEST, "Invalid quota entity combination, IP entity should"
                                                        "not be combined with User or ClientId")
        if not _valid_ip_entity(seen[IP]):
            raise QuotaError(ErrorCode.INVALID_REQUEST, f"{seen[IP]} is not a valid IP or resolvable host.")
        keys = IP_KEYS
    else:
        keys = USER_CLIENT_KEYS
    return entity_key(seen.items()), keys


def _valid_ip_entity(name: str | None) -> bool:
    if name is None:
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


def validate_value(keys: Mapping[str, str], key: str, value: float) -> None:
    """Kafka's ClientQuotaControlManager.validateQuotaKeyValue."""
    typ = keys.get(key)
    if typ is None:
        raise QuotaError(ErrorCode.INVALID_REQUEST, f"Invalid configuration key {key}")
    if not value > 0.0:
        raise QuotaError(ErrorCode.INVALID_REQUEST, f"Quota {key} must be greater than 0")
    if typ == "DOUBLE":
        return
    if value > _LIMITS[typ]:
        raise QuotaError(ErrorCode.INVALID_REQUEST,
                         f"Proposed value for {key} is too large for {'an INT' if typ == 'INT' else 'a LONG'}.")
    if abs(value % 1.0) > 1e-6:
        raise QuotaError(ErrorCode.INVALID_REQUEST, f"{key} cannot be a fractional value.")


def plan_alterations(current: Mapping[EntityKey, Mapping[str, float]], entries):
    """Validate AlterClientQuotas ``entries`` (each with ``entity`` [(type, name)] and ``ops``
    [(key, value, remove)]) against ``current``. Returns ``(results, changes)``: per entry
    ``(entity entries, error code, message)``, and the accepted changes as
    ``(entity key, quota key, value or None to remove)``; an entity with any error changes
    nothing (Kafka applies the request's valid entities only)."""
    results = []
    changes = []
    seen_entities: set = set()
    for entry in entries:
        raw = list(entry[0])
        try:
            key, allowed = validate_entity(raw)
            if key in seen_entities:
                raise QuotaError(ErrorCode.INVALID_REQUEST, f"Ignoring duplicate entity {_describe(key)}")
            seen_entities.add(key)
            ops: dict[str, float | None] = {}
            for qkey, value, remove in entry[1]:
                if qkey in ops:
                    raise QuotaError(ErrorCode.INVALID_REQUEST,
                                     f"Duplicate quota key {qkey} not updating quota for this entity "
                                     f"{_describe(key)}")
                ops[qkey] = None if remove else float(value)
            have = current.get(key, {})
            mine = []
            for qkey, value in ops.items():
                if value is None:
                    if qkey in have:
                        mine.append((key, qkey, None))
                    continue
                validate_value(allowed, qkey, value)
                if have.get(qkey) != value:
                    mine.append((key, qkey, value))
            changes.extend(mine)
            results.append((raw, ErrorCode.NONE, None))
        except QuotaError as e:
            results.append((raw, e.code, e.message))
    return results, changes


def apply_changes(current: Mapping[EntityKey, Mapping[str, float]], changes) -> dict:
    """A new quota map with ``changes`` applied (an entity left with no quota is dropped)."""
    out = {k: dict(v) for k, v in current.items()}
    for key, qkey, value in changes:
        q = out.setdefault(key, {})
        if value is None:
            q.pop(qkey, None)
            if not q:
                del out[key]
        else:
            q[qkey] = value
    return out


def _describe(key: EntityKey) -> str:
    return "ClientQuotaEntity(entries={" + ", ".join(f"{t}={n}" for t, n in key) + "})"


def describe(quotas: Mapping[EntityKey, Mapping[str, float]], components, strict: bool):
    """Kafka's ClientQuotasImage.describe: the entities matching the filter
    ``components`` [(entity type, match type, match)], with their quotas."""
    exact: dict[str, str | None] = {}
    typed: set[str] = set()
    for etype, match_type, match in components:
        if not etype:
            raise QuotaError(ErrorCode.INVALID_REQUEST, "Invalid empty entity type.")
        if etype in exact or etype in typed:
            raise QuotaError(ErrorCode.INVALID_REQUEST,
                             f"Entity type {etype} cannot appear more than once in the filter.")
        if etype not in ENTITY_TYPES:
            raise QuotaError(ErrorCode.UNSUPPORTED_VERSION, f"Unsupported entity type {etype}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaError(ErrorCode.INVALID_REQUEST,
                                 "Request specified MATCH_TYPE_EXACT, but set match string to null.")
            exact[etype] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaError(ErrorCode.INVALID_REQUEST,
                                 "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.")
            exact[etype] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaError(ErrorCode.INVALID_REQUEST,
                                 "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.")
            typed.add(etype)
        else:
            raise QuotaError(ErrorCode.INVALID_REQUEST, f"Unknown match type {match_type}")
    if (IP in exact or IP in typed) and (USER in exact or USER in typed or CLIENT_ID in exact or CLIENT_ID in typed):
        raise QuotaError(ErrorCode.INVALID_REQUEST, "Invalid entity filter component combination. IP filter "
                                                    "component should not be used with user or clientId filter component.")
    out = []
    for key, values in quotas.items():
        entries = dict(key)
        if strict and len(entries) != len(exact) + len(typed):
            continue
        if any(t not in entries or entries[t] != n for t, n in exact.items()):
            continue
        if any(t not in entries for t in typed):
            continue
        out.append((key, dict(values)))
    return out

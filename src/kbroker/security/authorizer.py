"""ACLs and the StandardAuthorizer: Kafka's authorization semantics, indexed by resource.

Kafka: ``org.apache.kafka.metadata.authorizer.StandardAuthorizer`` / ``StandardAuthorizerData``,
``org.apache.kafka.common.acl.*`` and ``resource.*`` (filters), ``Authorizer.authorizeByResourceType``.

- An ACL (:class:`StandardAcl`) binds a resource pattern (resource type, name, LITERAL or PREFIXED;
  the LITERAL name ``*`` matches every name) to a principal (``User:<name>`` or ``User:*``), a
  host (``*`` or one address), an operation and ALLOW or DENY.
- ``authorize``: a super user (``super.users``) may do anything. Otherwise the ACLs whose pattern
  matches the resource are consulted: a matching DENY wins over any ALLOW; an ALLOW for the
  operation, for ALL, or — ALLOW only — for an operation that implies it (READ, WRITE, DELETE,
  ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows; when no ACL at all exists
  for the resource, ``allow.everyone.if.no.acl.found`` decides (default: denied); when ACLs exist
  but none matches, denied.
- :class:`AclIndex` is immutable: literal ACLs by (type, name), prefixed ACLs by (type, prefix)
  with the set of prefix lengths per type, so a check costs a few dict lookups (one per distinct
  prefix length), never a loop over all ACLs. Whoever owns the ACLs (the zero-config MetadataStore,
  a KRaft image) builds a new index on each change; the authorizer reads the current one through a
  callable, so a check never takes a lock.

Enum values are Kafka's wire codes (``ResourceType``, ``PatternType``, ``AclOperation``,
``AclPermissionType``); a code we do not know is UNKNOWN, as in Kafka's ``fromCode``.
"""
from __future__ import annotations

import enum
from typing import Callable, Iterable, NamedTuple, Optional


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


def _code(enum_cls, value: int):
    try:
        return enum_cls(value)
    except ValueError:
        return enum_cls.UNKNOWN


WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"
ANONYMOUS = "User:ANONYMOUS"
#: the names ``authorizer.class.name`` accepts (empty: no authorization)
AUTHORIZER_CLASS_NAMES = frozenset({"org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                                    "kbroker.security.authorizer.StandardAuthorizer"})

# plain ints on the hot path (an IntEnum member hashes through Enum.__hash__, a Python call)
_IMPLIES_DESCRIBE = frozenset(int(o) for o in (AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE,
                                               AclOperation.DELETE, AclOperation.ALTER))
_IMPLIES_DESCRIBE_CONFIGS = frozenset(int(o) for o in (AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS))
_ALL, _ALLOW, _DENY = int(AclOperation.ALL), int(AclPermissionType.ALLOW), int(AclPermissionType.DENY)
_DESCRIBE, _DESCRIBE_CONFIGS = int(AclOperation.DESCRIBE), int(AclOperation.DESCRIBE_CONFIGS)
_LITERAL, _PREFIXED = int(PatternType.LITERAL), int(PatternType.PREFIXED)
#: decisions remembered per ACL index before the memo starts afresh
_MEMO_MAX = 65536


class InvalidAclError(ValueError):
    """An ACL or filter Kafka refuses with INVALID_REQUEST (message: Kafka's text)."""


class StandardAcl(NamedTuple):
    """One ACL; its fields are plain ints (``StandardAcl.of`` converts enum members)."""
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int

    @classmethod
    def of(cls, resource_type, resource_name, pattern_type, principal, host, operation, permission_type):
        return cls(int(resource_type), resource_name, int(pattern_type), principal, host, int(operation),
                   int(permission_type))

    def to_json(self) -> list:
        return list(self)

    @classmethod
    def from_json(cls, v) -> "StandardAcl":
        rt, name, pt, principal, host, op, perm = v
        return cls(int(rt), str(name), int(pt), str(principal), str(host), int(op), int(perm))

    def __str__(self) -> str:
        return (f"(pattern=ResourcePattern(resourceType={_code(ResourceType, self.resource_type).name}, "
                f"name={self.resource_name}, patternType={_code(PatternType, self.pattern_type).name}), "
                f"entry=(principal={self.principal}, host={self.host}, "
                f"operation={_code(AclOperation, self.operation).name}, "
                f"permissionType={_code(AclPermissionType, self.permission_type).name}))")


def validate_new_acl(acl: StandardAcl) -> None:
    """Kafka's checks of an ACL to create (AclApis.handleCreateAcls + AclControlManager.validateNewAcl)."""
    rt = _code(ResourceType, acl.resource_type)
    if rt in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise InvalidAclError(f"Invalid resourceType {rt.name}")
    if rt == ResourceType.CLUSTER and acl.resource_name != CLUSTER_NAME:
        raise InvalidAclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not acl.resource_name:
        raise InvalidAclError("Invalid empty resource name")
    pt = _code(PatternType, acl.pattern_type)
    if pt not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAclError(f"Invalid patternType {pt.name}")
    op = _code(AclOperation, acl.operation)
    if op in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise InvalidAclError(f"Invalid operation {op.name}")
    perm = _code(AclPermissionType, acl.permission_type)
    if perm not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        raise InvalidAclError(f"Invalid permissionType {perm.name}")
    kind, sep, name = acl.principal.partition(":")
    if not sep or not kind or not name:
        raise InvalidAclError(f"Could not parse principal from `{acl.principal}` (no colon is present "
                              "separating the principal type from the principal name)")
    if not acl.host:
        raise InvalidAclError("Invalid empty host")


class AclFilter(NamedTuple):
    """Kafka's AclBindingFilter: None name/principal/host match anything; resource type ANY,
    pattern type ANY or MATCH, operation ANY and permission ANY likewise."""
    resource_type: int
    resource_name: Optional[str]
    pattern_type: int
    principal: Optional[str]
    host: Optional[str]
    operation: int
    permission_type: int

    def validate(self) -> None:
        """INVALID_REQUEST for a filter with an UNKNOWN element (Kafka's isUnknown)."""
        if _code(ResourceType, self.resource_type) == ResourceType.UNKNOWN \
                or _code(PatternType, self.pattern_type) == PatternType.UNKNOWN:
            raise InvalidAclError("Unknown patternFilter.")
        if _code(AclOperation, self.operation) == AclOperation.UNKNOWN \
                or _code(AclPermissionType, self.permission_type) == AclPermissionType.UNKNOWN:
            raise InvalidAclError("Unknown entryFilter.")

    def matches(self, acl: StandardAcl) -> bool:
        # ResourcePatternFilter.matches
        if self.resource_type != ResourceType.ANY and self.resource_type != acl.resource_type:
            return False
        pt = self.pattern_type
        if pt not in (PatternType.ANY, PatternType.MATCH) and pt != acl.pattern_type:
            return False
        name = self.resource_name
        if name is not None:
            if pt == PatternType.ANY or pt == acl.pattern_type:
                if name != acl.resource_name:
                    return False
            elif acl.pattern_type == PatternType.LITERAL:      # MATCH
                if name != acl.resource_name and acl.resource_name != WILDCARD:
                    return False
            elif acl.pattern_type == PatternType.PREFIXED:
                if not name.startswith(acl.resource_name):
                    return False
            else:
                return False
        # AccessControlEntryFilter.matches
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != acl.operation:
            return False
        if self.permission_type != AclPermissionType.ANY and self.permission_type != acl.permission_type:
            return False
        return True


class AclIndex:
    """An immutable set of ACLs indexed for ``authorize`` (see the module docstring)."""

    __slots__ = ("acls", "_literal", "_prefixed", "_prefix_lengths", "_by_type")

    def __init__(self, acls: Iterable[StandardAcl] = ()):
        self.acls: frozenset = frozenset(StandardAcl.of(*a) for a in acls)
        literal: dict = {}
        prefixed: dict = {}
        lengths: dict = {}
        by_type: dict = {}
        for a in self.acls:
            by_type.setdefault(a.resource_type, []).append(a)
            if a.pattern_type == _LITERAL:
                literal.setdefault((a.resource_type, a.resource_name), []).append(a)
            elif a.pattern_type == _PREFIXED:
                prefixed.setdefault((a.resource_type, a.resource_name), []).append(a)
                lengths.setdefault(a.resource_type, set()).add(len(a.resource_name))
        self._literal = {k: tuple(v) for k, v in literal.items()}
        self._prefixed = {k: tuple(v) for k, v in prefixed.items()}
        self._prefix_lengths = {k: tuple(sorted(v)) for k, v in lengths.items()}
        self._by_type = {k: tuple(v) for k, v in by_type.items()}

    def __len__(self) -> int:
        return len(self.acls)

    def __eq__(self, other) -> bool:
        return isinstance(other, AclIndex) and self.acls == other.acls

    def __hash__(self) -> int:
        return hash(self.acls)

    def __repr__(self) -> str:
        return f"AclIndex({len(self.acls)} acls)"

    def matching(self, resource_type: int, name: str) -> list:
        """Every ACL whose pattern matches the LITERAL resource (type, name)."""
        out = []
        lit = self._literal
        found = lit.get((resource_type, name))
        if found:
            out.extend(found)
        if name != WILDCARD:
            found = lit.get((resource_type, WILDCARD))
            if found:
                out.extend(found)
        lengths = self._prefix_lengths.get(resource_type)
        if lengths:
            pre = self._prefixed
            n = len(name)
            for length in lengths:
                if length > n:
                    break
                found = pre.get((resource_type, name[:length]))
                if found:
                    out.extend(found)
        return out

    def of_type(self, resource_type: int) -> tuple:
        return self._by_type.get(resource_type, ())

    def filter(self, f: AclFilter) -> list:
        return sorted(a for a in self.acls if f.matches(a))


EMPTY_ACLS = AclIndex()


def _result(acl: StandardAcl, operation: int, principal: str, host: str):
    """StandardAuthorizerData.findResult: True (ALLOW), False (DENY) or None (no match)."""
    p = acl.principal
    if p != principal and p != WILDCARD_PRINCIPAL:
        return None
    if acl.host != WILDCARD and acl.host != host:
        return None
    op = acl.operation
    allow = acl.permission_type == _ALLOW
    if op != _ALL:
        if allow:
            if operation == _DESCRIBE:
                if op not in _IMPLIES_DESCRIBE:
                    return None
            elif operation == _DESCRIBE_CONFIGS:
                if op not in _IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif operation != op:
                return None
        elif operation != op:
            return None
    return allow


def parse_super_users(value: Optional[str]) -> frozenset:
    """``super.users``: principals separated by ';' (Kafka's StandardAuthorizer.getConfiguredSuperUsers)."""
    return frozenset(s.strip() for s in (value or "").split(";") if s.strip())


class StandardAuthorizer:
    """Authorization decisions over the ACLs ``acls()`` returns (the current AclIndex).

    Thread-safe without locks: the index is immutable and read once per decision."""

    def __init__(self, acls: Callable[[], AclIndex], super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False):
        self._acls = acls
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = bool(allow_everyone_if_no_acl_found)
        #: (the AclIndex, {(principal, host, operation, resource type, name): decision}): decisions
        #: are pure functions of the immutable index, so they are remembered per index; the pair
        #: is replaced whole, never a decision of one index stored under another
        self._memo: tuple = (None, {})

    @classmethod
    def from_config(cls, config, acls: Callable[[], AclIndex]) -> Optional["StandardAuthorizer"]:
        """The authorizer ``authorizer.class.name`` asks for, or None (empty: no authorization).
        KafkaConfig has already refused any other class name."""
        if not config["authorizer.class.name"]:
            return None
        return cls(acls, parse_super_users(config["super.users"]), config["allow.everyone.if.no.acl.found"])

    def acls(self, f: AclFilter) -> list:
        return self._acls().filter(f)

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        if principal in self.super_users:
            return True
        index = self._acls()
        memo = self._memo
        if memo[0] is not index:
            memo = self._memo = (index, {})
        key = (principal, host, int(operation), int(resource_type), name)
        r = memo[1].get(key)
        if r is None:
            r = self._decide(index, principal, host, key[2], key[3], name)
            if len(memo[1]) >= _MEMO_MAX:
                memo = self._memo = (index, {})
            memo[1][key] = r
        return r

    def _decide(self, index: AclIndex, principal: str, host: str, operation: int, resource_type: int,
                name: str) -> bool:
        matching = index.matching(resource_type, name)
        if not matching:
            return self.allow_everyone_if_no_acl_found
        allowed = False
        for acl in matching:
            r = _result(acl, operation, principal, host)
            if r is False:
                return False          # a DENY wins
            if r:
                allowed = True
        return allowed

    def authorize_by_resource_type(self, principal: str, host: str, operation: int, resource_type: int) -> bool:
        """Kafka's Authorizer.authorizeByResourceType: may the principal do ``operation`` on
        at least one resource of the type (an ALLOW pattern not dominated by a DENY)?"""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True
        deny_literal, deny_prefixed, allow_literal, allow_prefixed = set(), set(), set(), set()
        wildcard_allow = False
        for acl in self._acls().of_type(resource_type):
            if acl.host != host and acl.host != WILDCARD:
                continue
            if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
                continue
            if acl.operation != operation and acl.operation != _ALL:
                continue
            literal = acl.pattern_type == PatternType.LITERAL
            if acl.permission_type == _DENY:
                if literal:
                    if acl.resource_name == WILDCARD:
                        return False
                    deny_literal.add(acl.resource_name)
                elif acl.pattern_type == PatternType.PREFIXED:
                    deny_prefixed.add(acl.resource_name)
            elif acl.permission_type == _ALLOW:
                if literal:
                    if acl.resource_name == WILDCARD:
                        wildcard_allow = True
                        continue
                    allow_literal.add(acl.resource_name)
                elif acl.pattern_type == PatternType.PREFIXED:
                    allow_prefixed.add(acl.resource_name)
        if wildcard_allow:
            return True
        for literal, names in ((True, allow_literal), (False, allow_prefixed)):
            for name in names:
                if literal and name in deny_literal:
                    continue
                if not any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                    return True
        return False

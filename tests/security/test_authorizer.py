"""The StandardAuthorizer's decisions (Kafka's StandardAuthorizerData semantics), filters and the index."""
from __future__ import annotations

import pytest

from kbroker.security.authorizer import (
    AclFilter, AclIndex, AclOperation as Op, AclPermissionType as Perm, InvalidAclError, PatternType as PT,
    ResourceType as RT, StandardAcl, StandardAuthorizer, parse_super_users, validate_new_acl,
)

ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(name, op, perm=Perm.ALLOW, principal=ALICE, pattern=PT.LITERAL, rtype=RT.TOPIC, host="*"):
    return StandardAcl(rtype, name, pattern, principal, host, op, perm)


def authorizer(*acls, super_users=(), allow_if_none=False):
    index = AclIndex(acls)
    return StandardAuthorizer(lambda: index, super_users, allow_if_none)


def can(a, op, name, principal=ALICE, rtype=RT.TOPIC, host=HOST):
    return a.authorize(principal, host, op, rtype, name)


def test_no_acls_denies_unless_allow_everyone_if_no_acl_found():
    assert not can(authorizer(), Op.READ, "t")
    assert can(authorizer(allow_if_none=True), Op.READ, "t")
    # an ACL for another principal on the resource: the resource has ACLs, so denied even then
    a = authorizer(acl("t", Op.READ, principal=BOB), allow_if_none=True)
    assert not can(a, Op.READ, "t")
    assert can(a, Op.READ, "other")


def test_literal_prefixed_and_wildcard_patterns():
    a = authorizer(acl("orders", Op.WRITE), acl("logs-", Op.READ, pattern=PT.PREFIXED),
                   acl("*", Op.DESCRIBE, principal=BOB))
    assert can(a, Op.WRITE, "orders")
    assert not can(a, Op.WRITE, "orders2")            # literal is exact
    assert can(a, Op.READ, "logs-app") and can(a, Op.READ, "logs-")
    assert not can(a, Op.READ, "logs")                 # shorter than the prefix
    assert can(a, Op.DESCRIBE, "anything", principal=BOB)
    assert not can(a, Op.READ, "anything", principal=BOB)


def test_deny_wins_over_allow_whatever_the_pattern():
    a = authorizer(acl("*", Op.ALL), acl("secret-", Op.READ, Perm.DENY, pattern=PT.PREFIXED))
    assert can(a, Op.READ, "public")
    assert not can(a, Op.READ, "secret-x")
    assert can(a, Op.WRITE, "secret-x")              # the DENY is for READ only
    b = authorizer(acl("t", Op.READ), acl("*", Op.ALL, Perm.DENY, principal="User:*"))
    assert not can(b, Op.READ, "t")


def test_operation_implications_apply_to_allow_only():
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert can(authorizer(acl("t", op)), Op.DESCRIBE, "t"), op
    assert not can(authorizer(acl("t", Op.CREATE)), Op.DESCRIBE, "t")
    assert can(authorizer(acl("t", Op.ALTER_CONFIGS)), Op.DESCRIBE_CONFIGS, "t")
    assert not can(authorizer(acl("t", Op.DESCRIBE_CONFIGS)), Op.ALTER_CONFIGS, "t")
    assert can(authorizer(acl("t", Op.ALL)), Op.IDEMPOTENT_WRITE, "t")
    # a DENY of READ does not deny DESCRIBE
    a = authorizer(acl("t", Op.DESCRIBE), acl("t", Op.READ, Perm.DENY))
    assert can(a, Op.DESCRIBE, "t") and not can(a, Op.READ, "t")


def test_principal_wildcard_and_host():
    a = authorizer(acl("t", Op.READ, principal="User:*", host=HOST))
    assert can(a, Op.READ, "t", principal=BOB)
    assert not can(a, Op.READ, "t", host="10.0.0.2")


def test_super_users_bypass_even_deny():
    supers = parse_super_users(" User:admin ; User:ops;")
    assert supers == {"User:admin", "User:ops"}
    a = authorizer(acl("*", Op.ALL, Perm.DENY, principal="User:*"), super_users=supers)
    assert can(a, Op.WRITE, "t", principal="User:admin")
    assert not can(a, Op.WRITE, "t", principal=ALICE)


def test_resource_types_are_separate():
    a = authorizer(acl("g", Op.READ, rtype=RT.GROUP))
    assert can(a, Op.READ, "g", rtype=RT.GROUP)
    assert not can(a, Op.READ, "g", rtype=RT.TOPIC)


def test_authorize_by_resource_type():
    a = authorizer(acl("t-", Op.WRITE, pattern=PT.PREFIXED))
    assert a.authorize_by_resource_type(ALICE, HOST, Op.WRITE, RT.TOPIC)
    assert not a.authorize_by_resource_type(BOB, HOST, Op.WRITE, RT.TOPIC)
    # the only ALLOW is dominated by a prefixed DENY
    b = authorizer(acl("t-x", Op.WRITE), acl("t-", Op.WRITE, Perm.DENY, pattern=PT.PREFIXED))
    assert not b.authorize_by_resource_type(ALICE, HOST, Op.WRITE, RT.TOPIC)
    c = authorizer(acl("*", Op.WRITE), acl("*", Op.WRITE, Perm.DENY))
    assert not c.authorize_by_resource_type(ALICE, HOST, Op.WRITE, RT.TOPIC)


def test_filters_match_as_kafka_acl_binding_filters():
    lit, pre, wild = acl("foo", Op.READ), acl("fo", Op.READ, pattern=PT.PREFIXED), acl("*", Op.WRITE)
    index = AclIndex([lit, pre, wild])
    any_ = dict(principal=None, host=None, operation=Op.ANY, permission_type=Perm.ANY)
    assert index.filter(AclFilter(RT.ANY, None, PT.ANY, **any_)) == sorted([lit, pre, wild])
    assert index.filter(AclFilter(RT.TOPIC, "foo", PT.MATCH, **any_)) == sorted([lit, pre, wild])
    assert index.filter(AclFilter(RT.TOPIC, "foo", PT.LITERAL, **any_)) == [lit]
    assert index.filter(AclFilter(RT.TOPIC, "fo", PT.ANY, **any_)) == [pre]
    assert index.filter(AclFilter(RT.TOPIC, None, PT.ANY, None, None, Op.WRITE, Perm.ANY)) == [wild]
    with pytest.raises(InvalidAclError):
        AclFilter(RT.UNKNOWN, None, PT.ANY, **any_).validate()
    with pytest.raises(InvalidAclError):
        AclFilter(RT.TOPIC, None, 99, **any_).validate()


@pytest.mark.parametrize("bad", [
    acl("t", Op.ANY), acl("t", Op.READ, Perm.ANY), acl("t", Op.READ, pattern=PT.MATCH),
    acl("", Op.READ), acl("other", Op.ALTER, rtype=RT.CLUSTER), acl("t", Op.READ, rtype=RT.ANY),
    acl("t", Op.READ, principal="alice"),
])
def test_invalid_acls_are_refused(bad):
    with pytest.raises(InvalidAclError):
        validate_new_acl(bad)


def test_index_lookup_does_not_scan_unrelated_acls():
    many = [acl(f"topic-{i}", Op.READ) for i in range(5000)] + [acl("p-", Op.WRITE, pattern=PT.PREFIXED)]
    index = AclIndex(many)
    assert index.matching(RT.TOPIC, "topic-42") == [acl("topic-42", Op.READ)]
    assert index.matching(RT.TOPIC, "p-1") == [acl("p-", Op.WRITE, pattern=PT.PREFIXED)]


def test_decisions_follow_a_new_acl_index():
    """Decisions are remembered per immutable index: a new index (ACLs created or deleted) is
    decided afresh, never answered from the old one's memo."""
    holder = [AclIndex([acl("t", Op.READ)])]
    a = StandardAuthorizer(lambda: holder[0])
    assert can(a, Op.READ, "t") and can(a, Op.READ, "t")
    holder[0] = AclIndex([acl("t", Op.READ), acl("t", Op.READ, Perm.DENY)])
    assert not can(a, Op.READ, "t")
    holder[0] = AclIndex()
    assert not can(a, Op.READ, "t")
    assert can(StandardAuthorizer(lambda: holder[0], allow_everyone_if_no_acl_found=True), Op.READ, "t")

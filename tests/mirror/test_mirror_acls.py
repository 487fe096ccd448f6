"""sync.topic.acls: MM2's topic ACL sync between two kbroker clusters with the
StandardAuthorizer (the mirror's PLAINTEXT principal, User:ANONYMOUS, is a super user on
both, as a mirror's principal is in a secured MM2 set-up). LITERAL ACLs of a replicated
topic reach its remote topic; ALLOW WRITE is not synced; ALLOW ALL becomes ALLOW READ; a
DENY is synced as it is; ACLs of a topic the flow does not replicate are left alone."""
from __future__ import annotations

from kbroker.client import Admin, NewTopic
from kbroker.security.authorizer import (
    AclFilter, AclOperation as Op, AclPermissionType as Perm, PatternType, ResourceType, StandardAcl,
)
from kbroker.testing import KBrokerProcess
from tests.mirror.conftest import BROKER, mm2_props, wait_until

SECURED = {**BROKER, "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
           "super.users": "User:ANONYMOUS"}


def _acl(topic, principal, op, perm=Perm.ALLOW, pattern=PatternType.LITERAL):
    return StandardAcl(ResourceType.TOPIC, topic, pattern, principal, "*", op, perm)


def _topic_acls(bootstrap):
    with Admin({"bootstrap.servers": bootstrap}) as a:
        return {(x.resource_name, x.principal, x.operation, x.permission_type, x.pattern_type)
                for x in a.describe_acls(AclFilter(ResourceType.TOPIC, None, PatternType.ANY, None, None,
                                                   Op.ANY, Perm.ANY))}


def test_topic_acls_follow_their_topics(mirror):
    with KBrokerProcess(overrides=SECURED).start() as a, KBrokerProcess(overrides=SECURED).start() as b:
        with Admin({"bootstrap.servers": a.bootstrap}) as adm:
            adm.create_topics([NewTopic("orders", 1, 1), NewTopic("private", 1, 1)])
            assert adm.create_acls([
                _acl("orders", "User:alice", Op.READ), _acl("orders", "User:bob", Op.WRITE),
                _acl("orders", "User:carol", Op.ALL), _acl("orders", "User:eve", Op.READ, Perm.DENY),
                _acl("ord", "User:dan", Op.READ, pattern=PatternType.PREFIXED),
                _acl("private", "User:alice", Op.READ)]) == [None] * 6
        m = mirror(mm2_props(a, b, topics="orders", **{"sync.topic.acls.interval.seconds": 1}))
        want = {("A.orders", "User:alice", Op.READ, Perm.ALLOW, PatternType.LITERAL),
                ("A.orders", "User:carol", Op.READ, Perm.ALLOW, PatternType.LITERAL),
                ("A.orders", "User:eve", Op.READ, Perm.DENY, PatternType.LITERAL)}
        wait_until(lambda: _topic_acls(b.bootstrap) == want, 30, "the remote topic's ACLs on B")
        # a new source ACL follows at the next sync
        with Admin({"bootstrap.servers": a.bootstrap}) as adm:
            adm.create_acls([_acl("orders", "User:frank", Op.DESCRIBE)])
        want.add(("A.orders", "User:frank", Op.DESCRIBE, Perm.ALLOW, PatternType.LITERAL))
        wait_until(lambda: _topic_acls(b.bootstrap) == want, 30, "the new ACL on B")
        assert m.terminate() == 0, m.log()[-3000:]     # while both clusters are still up

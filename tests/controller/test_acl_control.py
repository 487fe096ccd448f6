"""AclControlManager: CreateAcls / DeleteAcls as AccessControlEntryRecords, replayed into the
controller and a broker's image alike, kept in snapshots."""
from __future__ import annotations

from kbroker.metadata.delta import replay_all
from kbroker.protocol.errors import ErrorCode as E
from kbroker.protocol.messages import create_acls as CA, delete_acls as DA
from kbroker.security.authorizer import StandardAcl

from tests.controller.harness import Harness

TOPIC, GROUP, CLUSTER = 2, 3, 4
LITERAL, PREFIXED, ANY_PATTERN, MATCH = 3, 4, 1, 2
READ, WRITE, ALTER, ANY_OP = 3, 4, 7, 1
ALLOW, DENY, ANY_PERM = 3, 2, 1


def creation(rtype, name, op, perm=ALLOW, pattern=LITERAL, principal="User:alice"):
    return CA.AclCreation(resource_type=rtype, resource_name=name, resource_pattern_type=pattern,
                          principal=principal, host="*", operation=op, permission_type=perm)


def flt(rtype=1, name=None, pattern=ANY_PATTERN, op=ANY_OP, perm=ANY_PERM):
    return DA.DeleteAclsFilter(resource_type_filter=rtype, resource_name_filter=name, pattern_type_filter=pattern,
                               principal_filter=None, host_filter=None, operation=op, permission_type=perm)


def test_create_and_delete_acls_replay_to_the_same_image():
    h = Harness()
    r = h.write(h.c.create_acls(CA.CreateAclsRequest(creations=[
        creation(TOPIC, "t", READ), creation(TOPIC, "p-", WRITE, pattern=PREFIXED),
        creation(CLUSTER, "not-kafka-cluster", ALTER), creation(GROUP, "g", READ, perm=DENY),
        creation(TOPIC, "t", READ)])))                  # a duplicate: accepted, written once
    assert [x.error_code for x in r.response.results] == [0, 0, E.INVALID_REQUEST, 0, 0]
    assert len(r.records) == 3 and r.atomic
    image = h.broker_image()
    assert image.same_state(h.c.image())
    assert h.replayed().state() == h.c.state()
    assert set(image.acls.by_id.values()) == {
        StandardAcl(TOPIC, "t", LITERAL, "User:alice", "*", READ, ALLOW),
        StandardAcl(TOPIC, "p-", PREFIXED, "User:alice", "*", WRITE, ALLOW),
        StandardAcl(GROUP, "g", LITERAL, "User:alice", "*", READ, DENY)}
    assert image.acls.index.matching(TOPIC, "p-x") == [StandardAcl(TOPIC, "p-", PREFIXED, "User:alice", "*",
                                                                    WRITE, ALLOW)]
    # a snapshot of the image keeps the ACLs
    assert replay_all(image.to_records()).acls == image.acls

    r = h.write(h.c.delete_acls(DA.DeleteAclsRequest(filters=[
        flt(TOPIC, "p-x", MATCH), flt(rtype=0), flt(TOPIC, "p-x", MATCH)])))
    res = r.response.filter_results
    assert [x.error_code for x in res] == [0, E.INVALID_REQUEST, 0]
    assert [a.resource_name for a in res[0].matching_acls] == ["p-"]
    assert len(r.records) == 1                         # matched twice, removed once
    image = h.broker_image()
    assert image.same_state(h.c.image()) and h.replayed().state() == h.c.state()
    assert {a.resource_name for a in image.acls.by_id.values()} == {"t", "g"}

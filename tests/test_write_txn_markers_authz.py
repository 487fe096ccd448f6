"""WriteTxnMarkers needs ALTER or CLUSTER_ACTION on the cluster (Kafka's
KafkaApis.handleWriteTxnMarkersRequest) on a KRaft broker with an authorizer: the brokers'
own principal holds it (super.users or an ACL); anyone else is answered
CLUSTER_AUTHORIZATION_FAILED for every partition and nothing is appended."""
from __future__ import annotations

from types import SimpleNamespace

from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.write_txn_markers import (
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest,
)
from kbroker.security.authorizer import (
    CLUSTER_NAME, AclIndex, AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl,
    StandardAuthorizer,
)
from kbroker.server.apis.write_txn_markers import handle_write_txn_markers


class _Rm:
    def __init__(self):
        self.appended = []

    def append_txn_markers(self, timeout_ms, pid, epoch, coordinator_epoch, commit, tps, respond):
        self.appended.append((pid, tuple(tps)))
        respond({tp: SimpleNamespace(error=ErrorCode.NONE) for tp in tps})


def _call(principal: str, acls=(), cluster_mode=True):
    authorizer = StandardAuthorizer(lambda: AclIndex(acls), super_users=["User:broker"])
    broker = SimpleNamespace(authorizer=authorizer, replica_manager=_Rm(), config=_Config(cluster_mode))
    out = []
    ctx = SimpleNamespace(authz=None, client_host="127.0.0.1", respond=out.append,
                          request=SimpleNamespace(connection=SimpleNamespace(
                              session=SimpleNamespace(principal=principal))))
    req = WriteTxnMarkersRequest(markers=[WritableTxnMarker(
        producer_id=7, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
        topics=[WritableTxnMarkerTopic(name="t", partition_indexes=[0, 1])])])
    handle_write_txn_markers(broker, ctx, req)
    (resp,) = out
    codes = [p.error_code for m in resp.markers for t in m.topics for p in t.partitions]
    return codes, broker.replica_manager.appended


class _Config(dict):
    def __init__(self, cluster_mode):
        super().__init__({"request.timeout.ms": 30000})
        self.cluster_mode = cluster_mode


def _cluster_acl(principal, op):
    return StandardAcl.of(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL, principal, "*", op,
                          AclPermissionType.ALLOW)


def test_only_a_principal_with_cluster_action_or_alter_writes_markers():
    assert _call("User:broker") == ([ErrorCode.NONE] * 2, [(7, (("t", 0), ("t", 1)))])   # a super user
    assert _call("User:mallory") == ([ErrorCode.CLUSTER_AUTHORIZATION_FAILED] * 2, [])
    for op in (AclOperation.CLUSTER_ACTION, AclOperation.ALTER):
        codes, appended = _call("User:other-broker", [_cluster_acl("User:other-broker", op)])
        assert codes == [ErrorCode.NONE] * 2 and appended, op
    # zero-config mode: the single node's markers come to itself unauthenticated
    assert _call("User:ANONYMOUS", cluster_mode=False)[0] == [ErrorCode.NONE] * 2

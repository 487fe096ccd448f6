"""ACLs on a KRaft cluster of real processes (1 controller + 2 brokers, StandardAuthorizer,
allow.everyone.if.no.acl.found=true; PLAINTEXT listeners, so every client is User:ANONYMOUS).
CreateAcls sent to one broker is forwarded to the controller, becomes AccessControlEntryRecords
and is enforced by both brokers from their images; kafka-python and aiokafka get Kafka's
errors; CreateTopics forwarded to the controller is authorized by the broker first; DeleteAcls
lifts the restriction everywhere."""
from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType,
    ResourceType,
)

from kbroker.testing import KRaftControllerQuorum

FAST = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 600,
        "controller.quorum.election.backoff.max.ms": 300, "controller.quorum.request.timeout.ms": 600,
        "broker.session.timeout.ms": 2000, "broker.heartbeat.interval.ms": 300,
        "offsets.topic.num.partitions": 2, "group.initial.rebalance.delay.ms": 0,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true"}
ANON = "User:ANONYMOUS"


def _wait(cond, timeout_s=20.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            v = cond()
        except KafkaException:
            v = None
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout_s}s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    q = KRaftControllerQuorum(str(tmp_path_factory.mktemp("kraft-acl")), n=1, overrides=FAST, brokers=2)
    try:
        q.start()
        _wait(lambda: sorted(AdminClient({"bootstrap.servers": q.bootstrap}).list_topics(timeout=5).brokers)
              == [2, 3], what="2 brokers unfenced")
        yield q
    finally:
        q.stop()


def _admin(q, node):
    return AdminClient({"bootstrap.servers": f"127.0.0.1:{q.broker_ports[node]}"})


def _bind(rtype, name, op, perm=AclPermissionType.DENY, pattern=ResourcePatternType.LITERAL):
    return AclBinding(rtype, name, pattern, ANON, "*", op, perm)


def _kafka_python_send(q, node, topic):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{q.broker_ports[node]}", max_block_ms=10000)
    try:
        return p.send(topic, b"x").get(timeout=15)
    finally:
        p.close(timeout=5)


async def _aiokafka_send(bootstrap, topic):
    from aiokafka import AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    await p.start()
    try:
        return await p.send_and_wait(topic, b"x")
    finally:
        await p.stop()


def test_kraft_acls_forwarded_and_enforced_by_every_broker(cluster):
    from kafka.errors import TopicAuthorizationFailedError
    from aiokafka.errors import TopicAuthorizationFailedError as AioTopicAuthorizationFailedError
    q = cluster
    a2, a3 = _admin(q, 2), _admin(q, 3)
    fs = a2.create_topics([NewTopic("open-t", 1, 1), NewTopic("secret-t", 1, 1)])
    for f in fs.values():
        f.result(15)
    _wait(lambda: {"open-t", "secret-t"} <= set(a3.list_topics(timeout=5).topics), what="topics on broker 3")
    # ALTER on the cluster for ANONYMOUS keeps the ACL APIs open once the cluster resource has ACLs
    # (and takes away CREATE on the cluster, which would allow creating any topic)
    acls = [_bind(ResourceType.BROKER, "kafka-cluster", AclOperation.ALTER, AclPermissionType.ALLOW),
            _bind(ResourceType.TOPIC, "secret-", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
            _bind(ResourceType.TOPIC, "nocreate-", AclOperation.CREATE, pattern=ResourcePatternType.PREFIXED)]
    for f in a2.create_acls(acls).values():
        f.result(15)
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                           AclPermissionType.ANY)
    # the other broker has them from its image (the metadata log)
    _wait(lambda: set(a3.describe_acls(flt).result(10)) == set(acls), what="ACLs on broker 3")
    for node in (2, 3):
        with pytest.raises(TopicAuthorizationFailedError):
            _kafka_python_send(q, node, "secret-t")
    with pytest.raises(AioTopicAuthorizationFailedError):
        asyncio.run(_aiokafka_send(q.bootstrap, "secret-t"))
    assert _kafka_python_send(q, 3, "open-t").offset == 0
    # CreateTopics is authorized on the broker before it is forwarded to the controller
    fs = a3.create_topics([NewTopic("nocreate-x", 1, 1), NewTopic("create-ok", 1, 1)])
    fs["create-ok"].result(15)
    with pytest.raises(KafkaException) as e:
        fs["nocreate-x"].result(15)
    assert e.value.args[0].code() == 29            # TOPIC_AUTHORIZATION_FAILED
    # DeleteAcls through broker 3: broker 2 lets the producer in again
    deleted = a3.delete_acls([AclBindingFilter(ResourceType.TOPIC, "secret-t", ResourcePatternType.MATCH, None,
                                               None, AclOperation.ANY, AclPermissionType.ANY)])
    assert [set(f.result(15)) for f in deleted.values()] == [{acls[1]}]
    _wait(lambda: _kafka_python_send(q, 2, "secret-t") is not None, what="secret-t writable again")


def test_follower_fetch_needs_cluster_action(cluster):
    """KafkaApis: a Fetch from a replica (replica id >= 0) needs ClusterAction on the cluster;
    without it every partition answers TOPIC_AUTHORIZATION_FAILED and nothing is read."""
    from kbroker.protocol import ApiKey, ErrorCode
    from kbroker.protocol.messages import fetch as F
    from tests.broker.raw_client import RawClient

    a = _admin(cluster, 2)
    a.create_topics([NewTopic("ca-topic", 1, 1)], operation_timeout=10)["ca-topic"].result(timeout=20)
    _wait(lambda: "ca-topic" in a.list_topics(timeout=5).topics, what="topic visible")

    def follower_fetch(port):
        # v12: the replica id at the top level, topics by name
        req = F.FetchRequest(replica_id=99, max_wait_ms=0,
                             min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                             topics=[F.FetchTopic(topic="ca-topic", partitions=[F.FetchPartition(
                                 partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                 log_start_offset=-1, partition_max_bytes=1 << 20)])],
                             forgotten_topics_data=[], rack_id="")
        with RawClient(port) as c:
            r = c.call(ApiKey.FETCH, 12, req)
        return [p.error_code for t in r.responses for p in t.partitions]

    ports = list(cluster.broker_ports.values())
    # ALLOW everything on the cluster but DENY ClusterAction (a DENY wins): the ACLs stay manageable
    allow = _bind(ResourceType.BROKER, "kafka-cluster", AclOperation.ALL, AclPermissionType.ALLOW)
    deny = _bind(ResourceType.BROKER, "kafka-cluster", AclOperation.CLUSTER_ACTION)
    for f in a.create_acls([allow, deny]).values():
        f.result(timeout=20)
    try:
        _wait(lambda: all(follower_fetch(p) == [ErrorCode.TOPIC_AUTHORIZATION_FAILED] for p in ports),
              what="follower fetch refused on both brokers")
    finally:
        for binding in (deny, allow):
            flt = AclBindingFilter(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, ANON, "*",
                                   binding.operation, binding.permission_type)
            a.delete_acls([flt])[flt].result(timeout=20)


def test_scram_credential_apis_are_authorized_on_the_broker(cluster):
    """AlterUserScramCredentials needs ALTER on the cluster (then it is forwarded to the
    controller), DescribeUserScramCredentials DESCRIBE (answered from the broker's image)."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    from kbroker.protocol import ErrorCode

    a2, a3 = _admin(cluster, 2), _admin(cluster, 3)
    acls = [_bind(ResourceType.BROKER, "kafka-cluster", AclOperation.ALTER, AclPermissionType.ALLOW),
            _bind(ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE)]
    for f in a2.create_acls(acls).values():
        f.result(15)
    def describe_refused():
        try:
            a3.describe_user_scram_credentials(["ursula"])["ursula"].result(10)
        except KafkaException as e:
            return e.args[0].code() == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return False
    try:
        _wait(describe_refused, what="DescribeUserScramCredentials refused by broker 3")
        up = UserScramCredentialUpsertion("ursula", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw")
        for f in a2.alter_user_scram_credentials([up]).values():
            f.result(15)
    finally:
        for b in reversed(acls):          # the DENY first: ALTER on the cluster deletes ACLs
            flt = AclBindingFilter(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, ANON, "*",
                                   b.operation, b.permission_type)
            a2.delete_acls([flt])[flt].result(timeout=20)
    _wait(lambda: [i.mechanism for i in a3.describe_user_scram_credentials(["ursula"])["ursula"].result(10)
                   .scram_credential_infos] == [ScramMechanism.SCRAM_SHA_256], what="ursula described by broker 3")


def test_alter_client_quotas_needs_alter_configs_on_the_cluster(cluster):
    """AlterClientQuotas is forwarded to the controller, which sees no principal: the broker
    checks ALTER_CONFIGS on the cluster first (Kafka's ControllerApis). Refused, every entry
    answers CLUSTER_AUTHORIZATION_FAILED and no quota is set; allowed again, it is set."""
    from kbroker.protocol import ApiKey, ErrorCode
    from kbroker.protocol.messages import alter_client_quotas as acq
    from kbroker.protocol.messages import describe_client_quotas as dcq
    from tests.broker.raw_client import RawClient

    a = _admin(cluster, 2)
    ports = list(cluster.broker_ports.values())
    def alter(port, validate_only=False):
        req = acq.AlterClientQuotasRequest(validate_only=validate_only, entries=[
            acq.AlterClientQuotasRequestEntryData(
                entity=[acq.AlterClientQuotasRequestEntityData(entity_type="client-id", entity_name=name)],
                ops=[acq.OpData(key="producer_byte_rate", value=5000.0, remove=False)])
            for name in ("q1", "q2")])
        with RawClient(port) as c:
            r = c.call(ApiKey.ALTER_CLIENT_QUOTAS, 1, req)
        return [(e.error_code, [x.entity_name for x in e.entity]) for e in r.entries]

    def described(port):
        with RawClient(port) as c:
            r = c.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, 1,
                       dcq.DescribeClientQuotasRequest(strict=False, components=[]))
        return sorted(x.entity_name for e in r.entries for x in e.entity)

    allow = _bind(ResourceType.BROKER, "kafka-cluster", AclOperation.ALTER, AclPermissionType.ALLOW)
    see = _bind(ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE_CONFIGS, AclPermissionType.ALLOW)
    deny = _bind(ResourceType.BROKER, "kafka-cluster", AclOperation.ALTER_CONFIGS)
    for f in a.create_acls([allow, see, deny]).values():
        f.result(timeout=20)
    denied = [(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ["q1"]), (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ["q2"])]
    try:
        # validate-only probes until both brokers have the ACLs (a probe sets nothing)
        _wait(lambda: all(alter(p, validate_only=True) == denied for p in ports),
              what="AlterClientQuotas refused on both brokers")
        assert [alter(p) for p in ports] == [denied, denied]
        time.sleep(0.5)
        assert all(described(p) == [] for p in ports)
    finally:
        for binding in (deny, see, allow):
            flt = AclBindingFilter(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, ANON, "*",
                                   binding.operation, binding.permission_type)
            a.delete_acls([flt])[flt].result(timeout=20)
    _wait(lambda: alter(ports[0]) == [(ErrorCode.NONE, ["q1"]), (ErrorCode.NONE, ["q2"])],
          what="AlterClientQuotas allowed again")
    _wait(lambda: all(described(p) == ["q1", "q2"] for p in ports), what="quotas on both brokers")

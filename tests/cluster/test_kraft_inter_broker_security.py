"""Inter-broker traffic over TLS and SASL on a KRaft cluster of real processes (1 controller
+ 3 brokers). Each broker has a client listener PLAINTEXT and an inter-broker listener
REPLICATION (``inter.broker.listener.name``); the replica fetchers, the transaction
markers (WriteTxnMarkers) and the KIP-890 verifications (AddPartitionsToTxn v4+) connect to
the other brokers' REPLICATION endpoints from the metadata image with that listener's
security, and the StandardAuthorizer sees the broker's own principal:

- SASL_SSL with PLAIN (``sasl.mechanism.inter.broker.protocol``, JAAS user ``broker``) and
  super.users=User:broker: an RF 3 topic with min.insync.replicas=2 has all three replicas in
  its ISR (even with a DENY ClusterAction ACL on User:broker: a super user is never denied),
  confluent-kafka produces with acks=all and consumes; a transaction over partitions led by
  different brokers commits and read_committed sees it;
- SSL with mutual TLS (``ssl.client.auth=required``, the broker certificate mapped to
  User:broker) and the broker principal NOT a super user (allow.everyone.if.no.acl.found
  off): the followers' fetches are refused, the ISR shrinks to the leader alone and acks=all
  is answered NOT_ENOUGH_REPLICAS; an ALLOW ClusterAction ACL for User:broker lets the ISR grow
  to all three.

Clients use the PLAINTEXT listener (User:ANONYMOUS)."""
from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType, ResourceType,
)

from kbroker.testing import KRaftControllerQuorum, free_port
from kbroker.protocol import ErrorCode
from tests.cluster.test_replication_e2e import BROKERS, _raw_produce, _wait
from tests.security.certs import TestPKI

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
FAST = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 600,
        "controller.quorum.election.backoff.max.ms": 300, "controller.quorum.request.timeout.ms": 600,
        "broker.session.timeout.ms": 3000, "broker.heartbeat.interval.ms": 300,
        "offsets.topic.num.partitions": 2, "offsets.topic.replication.factor": 3,
        "transaction.state.log.num.partitions": 2, "transaction.state.log.replication.factor": 3,
        "transaction.state.log.min.isr": 2, "group.initial.rebalance.delay.ms": 0,
        "replica.lag.time.max.ms": 3000, "replica.fetch.backoff.ms": 100,
        "authorizer.class.name": STANDARD}
BROKER_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
               'password="broker-secret" user_broker="broker-secret";')


def _cluster(tmp_path, protocol: str, overrides: dict) -> KRaftControllerQuorum:
    """1 controller + 3 brokers whose inter-broker listener REPLICATION uses ``protocol``
    (``listener.name.replication.*`` keys go to the brokers only)."""
    listener_keys = {k: v for k, v in overrides.items() if k.startswith("listener.name.replication.")}
    q = KRaftControllerQuorum(str(tmp_path), n=1, brokers=3, overrides={
        **FAST, "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,REPLICATION:{protocol}",
        **{k: v for k, v in overrides.items() if k not in listener_keys}})
    for b in BROKERS:
        o = q.procs[b].overrides
        o.update(listener_keys)
        port = free_port()
        # first: a sender that took each broker's first listener reaches it without its
        # security and fails (instead of passing by luck on the PLAINTEXT one)
        o["listeners"] = f"REPLICATION://127.0.0.1:{port}," + o["listeners"]
        o["advertised.listeners"] = f"REPLICATION://127.0.0.1:{port}," + o["advertised.listeners"]
        o["inter.broker.listener.name"] = "REPLICATION"
    q.start()
    _wait(lambda: sorted(_admin(q).list_topics(timeout=5).brokers) == BROKERS, what="3 brokers unfenced")
    return q


def _admin(q):
    return AdminClient({"bootstrap.servers": q.bootstrap})


def _partitions(q, topic):
    return _admin(q).list_topics(topic, timeout=5).topics[topic].partitions


def _create(q, topic, partitions=1):
    admin = _admin(q)
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=3,
                                      config={"min.insync.replicas": "2"})])[topic].result(15)


def _full_isr(q, topic, partitions=1):
    return _wait(lambda: (lambda ps: ps if len(ps) == partitions and all(
        p.leader in BROKERS and sorted(p.isrs) == BROKERS for p in ps.values()) else None)(_partitions(q, topic)),
        timeout_s=20, what=f"{topic}: all 3 replicas in the ISR")


def _acl(principal, op, perm):
    return AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, principal, "*", op, perm)


def _produce(q, topic, values, **conf):
    p = Producer({"bootstrap.servers": q.bootstrap, "acks": "all", "linger.ms": 5, **conf})
    errors = []
    for v in values:
        p.produce(topic, v, on_delivery=lambda err, _m: err and errors.append(err))
    assert p.flush(30) == 0
    return errors


def _consume(q, topic, partitions, n, isolation="read_uncommitted"):
    c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": "g-" + uuid.uuid4().hex[:6],
                  "enable.auto.commit": False, "isolation.level": isolation})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    try:
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    return got


def test_sasl_ssl_inter_broker_listener_replicates_and_carries_transaction_markers(tmp_path):
    (tmp_path / "pki").mkdir()
    pki = TestPKI(str(tmp_path / "pki"))
    q = _cluster(tmp_path, "SASL_SSL", {
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"],
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
        "sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.replication.plain.sasl.jaas.config": BROKER_JAAS,
        "super.users": "User:broker", "allow.everyone.if.no.acl.found": "true"})
    try:
        # a super user is never denied: this DENY does not stop the followers
        deny = _acl("User:broker", AclOperation.CLUSTER_ACTION, AclPermissionType.DENY)
        admin = _admin(q)
        for f in admin.create_acls([deny]).values():
            f.result(15)
        _create(q, "repl")
        created = time.monotonic()
        _full_isr(q, "repl")
        # acks=all: every replica of the ISR (all three at creation) fetched the records
        values = [b"v%d" % i for i in range(200)]
        assert _produce(q, "repl", values) == []
        assert sorted(_consume(q, "repl", 1, 200)) == sorted(values)

        # a transaction over partitions led by the three brokers: markers to the other
        # leaders and the leaders' verifications go over SASL_SSL
        _create(q, "txn", partitions=3)
        leaders = {p.leader for p in _full_isr(q, "txn", partitions=3).values()}
        assert len(leaders) > 1, leaders
        p = Producer({"bootstrap.servers": q.bootstrap, "transactional.id": "t-" + uuid.uuid4().hex[:6],
                      "linger.ms": 5, "transaction.timeout.ms": 30000})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(30):
            p.produce("txn", b"c%d" % i, partition=i % 3)
        p.commit_transaction(30)
        assert sorted(_consume(q, "txn", 3, 30, "read_committed")) == sorted(b"c%d" % i for i in range(30))
        # and they keep fetching: past replica.lag.time.max.ms (and a shrink check) the ISR is whole
        time.sleep(max(0.0, created + 3 * FAST["replica.lag.time.max.ms"] / 2000 - time.monotonic()))
        assert sorted(_partitions(q, "repl")[0].isrs) == BROKERS
        logs = "".join(q.procs[b].read_log() for b in BROKERS)
        assert "failed authentication" not in logs
    finally:
        q.stop()


def test_mutual_tls_inter_broker_listener_needs_cluster_action_for_the_broker_principal(tmp_path):
    (tmp_path / "pki").mkdir()
    pki = TestPKI(str(tmp_path / "pki"))
    cert = pki.issue("broker", server=True, client_too=True)
    q = _cluster(tmp_path, "SSL", {
        "ssl.keystore.type": "PEM", "ssl.keystore.location": cert["keystore"],
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
        "listener.name.replication.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+),.*$/$1/,DEFAULT",
        # the PLAINTEXT clients (and the brokers' controller channel) are the super user here
        "super.users": "User:ANONYMOUS", "allow.everyone.if.no.acl.found": "false"})
    try:
        _create(q, "mtls")
        # User:broker may not ClusterAction: every follower fetch is refused, so the leader
        # drops the followers from the ISR it was created with (replica.lag.time.max.ms)
        # and acks=all with min.insync.replicas=2 cannot be met
        part = _wait(lambda: (lambda p: p if p.leader in BROKERS and p.isrs == [p.leader] else None)(
            _partitions(q, "mtls")[0]), what="mtls: the ISR shrunk to the leader")
        r = _raw_produce(q.broker_ports[part.leader], "mtls", -1, [b"x"])
        assert r.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
        assert _partitions(q, "mtls")[0].isrs == [part.leader]
        admin = _admin(q)
        for f in admin.create_acls([_acl("User:broker", AclOperation.CLUSTER_ACTION,
                                         AclPermissionType.ALLOW)]).values():
            f.result(15)
        _full_isr(q, "mtls")
        values = [b"m%d" % i for i in range(100)]
        assert _produce(q, "mtls", values) == []
        assert sorted(_consume(q, "mtls", 1, 100)) == sorted(values)
    finally:
        q.stop()

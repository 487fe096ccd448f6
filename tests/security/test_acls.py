"""ACLs end to end on the zero-config node: the ACL admin APIs through confluent-kafka's AdminClient,
SCRAM users allowed and denied by them with unchanged clients, a super user, and ACLs surviving a
restart. The broker: PLAINTEXT (User:ANONYMOUS) and SASL_PLAINTEXT (PLAIN for the super user
``admin``, SCRAM-SHA-256 for ``carol`` and ``dave``), StandardAuthorizer on."""
from __future__ import annotations

import time
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType,
    ResourceType, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion,
)

from kbroker.testing import KBrokerProcess, free_port
from tests.broker.raw_client import RawClient

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret";')
USERS = {"carol": "carol-secret", "dave": "dave-secret"}
STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ANY_FILTER = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)


class AclBroker:
    def __init__(self, proc, sasl_port):
        self.proc, self.sasl_port = proc, sasl_port

    def conf(self, user: str | None) -> dict:
        if user is None:
            return {"bootstrap.servers": f"127.0.0.1:{self.proc.port}"}
        mech = "PLAIN" if user == "admin" else "SCRAM-SHA-256"
        pw = "admin-secret" if user == "admin" else USERS[user]
        return {"bootstrap.servers": f"127.0.0.1:{self.sasl_port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": mech, "sasl.username": user, "sasl.password": pw}

    def admin(self, user: str | None = "admin") -> AdminClient:
        return AdminClient(self.conf(user))


def start_broker(data_dir: str | None = None, sasl_port: int | None = None, port: int | None = None):
    sasl_port = sasl_port or free_port()
    proc = KBrokerProcess(data_dir=data_dir, port=port, overrides={
        "num.partitions": 1, "group.initial.rebalance.delay.ms": 0,
        "authorizer.class.name": STANDARD, "super.users": "User:admin",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256", "sasl.jaas.config": JAAS,
    })
    proc.overrides["listeners"] = f"PLAINTEXT://127.0.0.1:{proc.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
    proc.overrides["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
    proc.start()
    return AclBroker(proc, sasl_port)


def _stop(b: AclBroker) -> None:
    rc = b.proc.terminate()
    log = b.proc.read_log()
    assert rc == 0, log[-4000:]
    assert "Traceback" not in log, log[-6000:]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_broker(str(tmp_path_factory.mktemp("acl-broker")))
    admin = b.admin()
    ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), pw.encode())
           for u, pw in USERS.items()]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result()
    yield b
    _stop(b)


def _bind(rtype, name, op, principal="User:carol", perm=AclPermissionType.ALLOW,
          pattern=ResourcePatternType.LITERAL):
    return AclBinding(rtype, name, pattern, principal, "*", op, perm)


def _create(admin, bindings):
    for f in admin.create_acls(bindings).values():
        f.result(timeout=15)


def _tag() -> str:
    return uuid.uuid4().hex[:8]


def test_acl_admin_apis_with_confluent_admin_client(broker):
    admin = broker.admin()
    t = f"adm-{_tag()}"
    lit = _bind(ResourceType.TOPIC, t, AclOperation.READ)
    pre = _bind(ResourceType.TOPIC, t[:6], AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED)
    deny = _bind(ResourceType.GROUP, "g-" + t, AclOperation.ALL, principal="User:*", perm=AclPermissionType.DENY)
    _create(admin, [lit, pre, deny])
    found = admin.describe_acls(AclBindingFilter(ResourceType.TOPIC, t, ResourcePatternType.MATCH, None, None,
                                                 AclOperation.ANY, AclPermissionType.ANY)).result(timeout=15)
    assert set(found) == {lit, pre}
    assert deny in admin.describe_acls(ANY_FILTER).result(timeout=15)
    # delete by a filter: what it matched comes back, the others stay
    gone = admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.PREFIXED, None, None,
                                               AclOperation.ANY, AclPermissionType.ANY)])
    assert [list(f.result(timeout=15)) for f in gone.values()] == [[pre]]
    left = admin.describe_acls(ANY_FILTER).result(timeout=15)
    assert lit in left and deny in left and pre not in left
    for f in admin.delete_acls([AclBindingFilter(ResourceType.ANY, t, ResourcePatternType.ANY, None, None,
                                                 AclOperation.ANY, AclPermissionType.ANY),
                                AclBindingFilter(ResourceType.GROUP, "g-" + t, ResourcePatternType.ANY, None, None,
                                                 AclOperation.ANY, AclPermissionType.ANY)]).values():
        f.result(timeout=15)


def test_acl_apis_need_cluster_permissions_and_validate(broker):
    from kbroker.protocol import ApiKey, ErrorCode
    from kbroker.protocol.messages import create_acls as CA, describe_acls as DA
    with RawClient(broker.proc.port) as c:   # PLAINTEXT: User:ANONYMOUS, no ACLs
        r = c.call(ApiKey.DESCRIBE_ACLS, 2, DA.DescribeAclsRequest(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
            host_filter=None, operation=1, permission_type=1))
        assert r.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        r = c.call(ApiKey.CREATE_ACLS, 2, CA.CreateAclsRequest(creations=[CA.AclCreation(
            resource_type=2, resource_name="t", resource_pattern_type=3, principal="User:x", host="*",
            operation=3, permission_type=3)]))
        assert [x.error_code for x in r.results] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    # the super user gets INVALID_REQUEST for a bad ACL, the good one in the same request is created
    admin = broker.admin()
    bad = _bind(ResourceType.BROKER, "not-the-cluster", AclOperation.ALTER)   # librdkafka's name for CLUSTER
    good = _bind(ResourceType.TOPIC, f"ok-{_tag()}", AclOperation.READ)
    res = admin.create_acls([bad, good])
    with pytest.raises(ck.KafkaException) as e:
        res[bad].result(timeout=15)
    assert e.value.args[0].code() == ck.KafkaError.INVALID_REQUEST
    res[good].result(timeout=15)


def _produce(conf: dict, topic: str, n: int = 5) -> list:
    """Deliver n records; the delivery errors (empty: all delivered)."""
    errors = []
    p = ck.Producer({**conf, "message.timeout.ms": 10000})
    for i in range(n):
        p.produce(topic, b"v%d" % i, on_delivery=lambda err, msg: errors.append(err) if err else None)
    p.flush(20)
    return errors


def _consume(conf: dict, topic: str, group: str, n: int) -> tuple[list, list]:
    c = ck.Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got, errors = [], []
    deadline = time.monotonic() + 20
    try:
        while len(got) < n and not errors and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                errors.append(m.error().code())
            else:
                got.append(m.value())
                c.commit(m, asynchronous=False)
    finally:
        c.close()
    return got, errors


def test_scram_users_allowed_and_denied(broker):
    tag = _tag()
    topic, group = f"carol-{tag}", f"carol-g-{tag}"
    admin = broker.admin()
    admin.create_topics([NewTopic(topic, 1, 1)])["%s" % topic].result(timeout=15)
    _create(admin, [
        _bind(ResourceType.TOPIC, "carol-", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
        _bind(ResourceType.TOPIC, "carol-", AclOperation.READ, pattern=ResourcePatternType.PREFIXED),
        _bind(ResourceType.GROUP, group, AclOperation.READ),
        _bind(ResourceType.TOPIC, topic, AclOperation.READ, principal="User:dave"),
    ])
    carol, dave = broker.conf("carol"), broker.conf("dave")
    assert _produce(carol, topic) == []
    got, errors = _consume(carol, topic, group, 5)
    assert (sorted(got), errors) == ([b"v%d" % i for i in range(5)], [])
    # dave: no WRITE on the topic
    errors = _produce(dave, topic, 1)
    assert [e.code() for e in errors] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # dave: READ on the topic but not on the group
    got, errors = _consume(dave, topic, f"dave-g-{tag}", 1)
    assert ck.KafkaError.GROUP_AUTHORIZATION_FAILED in errors, (got, errors)
    # carol sees only the topics she may describe
    names = set(AdminClient(carol).list_topics(timeout=15).topics)
    assert topic in names and all(n.startswith("carol-") for n in names), names
    # the super user sees them all and may do anything
    assert topic in set(admin.list_topics(timeout=15).topics)
    assert _produce(broker.conf("admin"), topic, 1) == []


def test_create_topics_needs_create(broker):
    tag = _tag()
    admin = broker.admin()
    _create(admin, [_bind(ResourceType.TOPIC, "carolnew-", AclOperation.CREATE,
                          pattern=ResourcePatternType.PREFIXED)])
    carol = AdminClient(broker.conf("carol"))
    fs = carol.create_topics([NewTopic(f"carolnew-{tag}", 1, 1), NewTopic(f"other-{tag}", 1, 1)])
    fs[f"carolnew-{tag}"].result(timeout=15)
    with pytest.raises(ck.KafkaException) as e:
        fs[f"other-{tag}"].result(timeout=15)
    assert e.value.args[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    # the super user may create anything; a DENY for everyone does not stop it
    _create(admin, [_bind(ResourceType.TOPIC, f"other-{tag}", AclOperation.ALL, principal="User:*",
                          perm=AclPermissionType.DENY)])
    admin.create_topics([NewTopic(f"other-{tag}", 1, 1)])[f"other-{tag}"].result(timeout=15)


def test_kafka_python_sees_topic_authorization_failed(broker):
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError
    topic = f"carol-kp-{_tag()}"
    admin = broker.admin()
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=15)
    p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{broker.sasl_port}", security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="dave",
                      sasl_plain_password=USERS["dave"], max_block_ms=10000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            p.send(topic, b"x").get(timeout=15)
    finally:
        p.close(timeout=5)


def test_acls_survive_a_restart(tmp_path):
    b = start_broker(str(tmp_path))
    binding = _bind(ResourceType.TOPIC, "kept", AclOperation.READ)
    try:
        admin = b.admin()
        _create(admin, [binding])
    finally:
        _stop(b)
    b = start_broker(str(tmp_path), sasl_port=b.sasl_port, port=b.proc.port)
    try:
        admin = b.admin()
        assert admin.describe_acls(ANY_FILTER).result(timeout=15) == [binding]
    finally:
        _stop(b)


def test_no_authorizer_answers_security_disabled():
    from kbroker.protocol import ApiKey, ErrorCode
    from kbroker.protocol.messages import describe_acls as DA
    with KBrokerProcess().start() as p:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{p.port}"})
        res = admin.create_acls([_bind(ResourceType.TOPIC, "t", AclOperation.READ)])
        with pytest.raises(ck.KafkaException) as e:
            list(res.values())[0].result(timeout=15)
        assert e.value.args[0].code() == ck.KafkaError.SECURITY_DISABLED
        with RawClient(p.port) as c:
            r = c.call(ApiKey.DESCRIBE_ACLS, 2, DA.DescribeAclsRequest(
                resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
                host_filter=None, operation=1, permission_type=1))
        assert r.error_code == ErrorCode.SECURITY_DISABLED


def test_unknown_authorizer_class_stops_start_up():
    from kbroker.config_def import ConfigError
    from kbroker.server.config import KafkaConfig
    with pytest.raises(ConfigError, match="authorizer.class.name"):
        KafkaConfig({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
    assert KafkaConfig({"authorizer.class.name": STANDARD})["authorizer.class.name"] == STANDARD


def test_kbroker_acls_tool_over_sasl(broker, tmp_path):
    import io
    from kbroker.tools import acls as tool
    cfg = tmp_path / "admin.properties"
    cfg.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                   "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                   "username=\"admin\" password=\"admin-secret\";\n")
    base = ["--bootstrap-server", f"127.0.0.1:{broker.sasl_port}", "--command-config", str(cfg)]
    t = f"tool-{_tag()}"

    def run(*args):
        out = io.StringIO()
        assert tool.main(base + list(args), out) == 0
        return out.getvalue()

    text = run("--add", "--allow-principal", "User:carol", "--consumer", "--topic", t, "--group", "g-" + t)
    assert f"Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name={t}, patternType=LITERAL)`:" in text
    assert "\t(principal=User:carol, host=*, operation=READ, permissionType=ALLOW)" in text
    text = run("--add", "--deny-principal", "User:dave", "--operation", "Write", "--topic", t[:5],
               "--resource-pattern-type", "prefixed")
    text = run("--list", "--topic", t, "--resource-pattern-type", "match")
    assert "operation=DESCRIBE" in text and "patternType=PREFIXED" in text and "User:dave" in text
    text = run("--remove", "--topic", t)
    assert "Removed ACLs for resource" in text and "operation=READ" in text
    assert f"name={t}," not in run("--list", "--topic", t)
    run("--remove", "--topic", t[:5], "--resource-pattern-type", "prefixed")
    run("--remove", "--group", "g-" + t)
    # without the command config the client is User:ANONYMOUS: refused with Kafka's error
    out, err = io.StringIO(), io.StringIO()
    from kbroker.tools._common import run_tool
    assert run_tool(tool._main, ["--bootstrap-server", f"127.0.0.1:{broker.proc.port}", "--list"], out, err) == 1
    assert "CLUSTER_AUTHORIZATION_FAILED" in err.getvalue() or "ClusterAuthorization" in err.getvalue(), err.getvalue()


def test_mutual_tls_principal_is_authorized(pki, tmp_path):
    """ssl.client.auth=required: the certificate's principal (here mapped to its CN by
    ssl.principal.mapping.rules) is what the ACLs name."""
    tls_port = free_port()
    proc = KBrokerProcess(data_dir=str(tmp_path), overrides={
        "num.partitions": 1, "authorizer.class.name": STANDARD, "allow.everyone.if.no.acl.found": "true",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"],
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file, "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^.*CN=([^,]+).*$/$1/,DEFAULT"})
    proc.overrides["listeners"] = f"PLAINTEXT://127.0.0.1:{proc.port},SSL://127.0.0.1:{tls_port}"
    proc.overrides["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT,SSL:SSL"
    proc.start()
    try:
        topic = f"mtls-{_tag()}"
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{proc.port}"})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=15)
        # ANONYMOUS (PLAINTEXT) may still create ACLs: the cluster resource has none yet
        _create(admin, [_bind(ResourceType.TOPIC, topic, AclOperation.WRITE, principal="User:alice")])

        def conf(cn):
            cert = pki.issue(cn)
            return {"bootstrap.servers": f"127.0.0.1:{tls_port}", "security.protocol": "SSL",
                    "ssl.ca.location": pki.ca_file, "ssl.certificate.location": cert["cert"],
                    "ssl.key.location": cert["key"]}
        assert _produce(conf("alice"), topic, 2) == []
        assert [e.code() for e in _produce(conf("eve"), topic, 1)] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    finally:
        rc = proc.terminate()
        assert rc == 0, proc.read_log()[-3000:]


def test_transactional_producer_needs_write_on_its_transactional_id(broker):
    tag = _tag()
    topic, txn = f"carol-txn-{tag}", f"carol-tx-{tag}"
    admin = broker.admin()
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=15)
    conf = {**broker.conf("dave"), "transactional.id": txn, "transaction.timeout.ms": 10000}
    p = ck.Producer(conf)
    with pytest.raises(ck.KafkaException) as e:
        p.init_transactions(15)
    assert e.value.args[0].code() == ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    _create(admin, [_bind(ResourceType.TRANSACTIONAL_ID, txn, AclOperation.WRITE, principal="User:dave"),
                    _bind(ResourceType.TOPIC, topic, AclOperation.WRITE, principal="User:dave")])
    p = ck.Producer(conf)
    p.init_transactions(15)
    p.begin_transaction()
    p.produce(topic, b"in-txn")
    p.commit_transaction(15)


def test_describe_groups_reports_the_principals_own_operations(broker):
    group = f"carol-ops-{_tag()}"
    admin = broker.admin()
    _create(admin, [_bind(ResourceType.GROUP, group, AclOperation.READ)])
    carol = AdminClient(broker.conf("carol"))
    d = carol.describe_consumer_groups([group], include_authorized_operations=True)[group].result(timeout=15)
    assert sorted(op.name for op in d.authorized_operations) == ["DESCRIBE", "READ"]
    dave = AdminClient(broker.conf("dave"))
    with pytest.raises(ck.KafkaException) as e:
        dave.describe_consumer_groups([group])[group].result(timeout=15)
    assert e.value.args[0].code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED


def test_describe_user_scram_credentials_refused_per_user(broker):
    """DESCRIBE on the cluster is needed; a refusal of named users is in each user's result
    (Kafka's top-level error makes librdkafka 2.x abort the client process: it frees the error
    string it parsed into a stack buffer), so confluent-kafka reports it per user."""
    from kbroker.protocol import ApiKey, ErrorCode
    from kbroker.protocol.messages import describe_user_scram_credentials as D

    anonymous = broker.admin(None)
    fs = anonymous.describe_user_scram_credentials(["carol", "dave"])
    for user in ("carol", "dave"):
        with pytest.raises(ck.KafkaException) as e:
            fs[user].result(timeout=15)
        assert e.value.args[0].code() == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    with RawClient(broker.proc.port) as c:
        r = c.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, D.DescribeUserScramCredentialsRequest(users=None))
        assert (r.error_code, r.results) == (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, [])   # describe-all: Kafka's

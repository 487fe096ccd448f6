"""Configs that must do what they say, against a real ``kbroker serve`` with confluent-kafka:
min.insync.replicas, dynamic broker configs (per broker / cluster default, persisted,
DescribeConfigs sources and synonyms), deprecated message.format.version, configs
kbroker cannot honour, manual replica assignments (librdkafka tests 0081, 0092)."""
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewPartitions, NewTopic,
    ResourceType,
)

from kbroker.protocol import ApiKey
from kbroker.protocol.messages.create_topics import (
    CreatableReplicaAssignment, CreatableTopic, CreateTopicsRequest,
)
from kbroker.protocol.messages.describe_configs import DescribeConfigsRequest, DescribeConfigsResource
from kbroker.protocol.messages.incremental_alter_configs import (
    AlterableConfig, AlterConfigsResource, IncrementalAlterConfigsRequest,
)
from tests.broker.test_admin import _raw

TIMEOUT = 15
#: the legacy AlterConfigs API is what test 0081 also exercises; librdkafka marks it deprecated
pytestmark = pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")


def _topic(prefix="dyn"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def _create(admin, name, config=None, **kw):
    admin.create_topics([NewTopic(name, config=config or {}, **kw)],
                        operation_timeout=10)[name].result(timeout=TIMEOUT)


def _create_error(admin, topic: NewTopic):
    with pytest.raises(KafkaException) as ei:
        admin.create_topics([topic], operation_timeout=10)[topic.topic].result(timeout=TIMEOUT)
    return ei.value.args[0]


def _describe(admin, rtype, name):
    res = ConfigResource(rtype, name)
    return admin.describe_configs([res])[res].result(timeout=TIMEOUT)


def _set_broker(admin, name, entries, op=AlterConfigOpType.SET):
    res = ConfigResource(ResourceType.BROKER, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v in entries.items()])
    return admin.incremental_alter_configs([res])[res]


def _set_cluster_default(bootstrap, entries, op=AlterConfigOpType.SET, validate_only=False, name=""):
    """IncrementalAlterConfigs on BROKER resource ``name`` (librdkafka refuses an empty name and
    sends a broker's resource to that broker): (error_code, error_message)."""
    req = IncrementalAlterConfigsRequest(validate_only=validate_only, resources=[AlterConfigsResource(
        resource_type=4, resource_name=name, configs=[
            AlterableConfig(name=k, config_operation=op.value, value=v) for k, v in entries.items()])])
    r = _raw(bootstrap, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, req).responses[0]
    return r.error_code, r.error_message


def _describe_cluster_default(bootstrap, name=""):
    """{name: (value, source, [(synonym name, value, source)])} of BROKER resource ``name``
    (raw: librdkafka keys synonyms by name, which folds the dynamic layers of one key)."""
    req = DescribeConfigsRequest(resources=[DescribeConfigsResource(resource_type=4, resource_name=name,
                                                                    configuration_keys=None)],
                                 include_synonyms=True)
    r = _raw(bootstrap, ApiKey.DESCRIBE_CONFIGS, 4, req).results[0]
    assert r.error_code == 0, r.error_message
    return {c.name: (c.value, c.config_source, [(s.name, s.value, s.source) for s in c.synonyms])
            for c in r.configs}


def _produce_one(bootstrap, topic, value=b"v", **conf):
    """Deliver one record; the delivery report's error (None on success)."""
    p = Producer({"bootstrap.servers": bootstrap, "retries": 0, "message.timeout.ms": 10000,
                  "enable.idempotence": False, **conf})
    errors = []
    p.produce(topic, value=value, on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0
    return errors[0]


def _high_watermark(bootstrap, topic):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    from confluent_kafka import TopicPartition
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)[1]
    finally:
        c.close()


def test_min_insync_replicas_refuses_acks_all_only(broker):
    admin = _admin(broker.bootstrap)
    t = _topic("minisr")
    _create(admin, t, {"min.insync.replicas": "2"})
    err = _produce_one(broker.bootstrap, t, acks="all")
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS
    assert _high_watermark(broker.bootstrap, t) == 0  # nothing appended
    assert _produce_one(broker.bootstrap, t, acks=1) is None  # acks=1 and 0 are unaffected, as in Kafka
    assert _produce_one(broker.bootstrap, t, acks=0) is None
    # acks=0 is reported delivered once sent: wait for the broker to have appended it
    deadline = time.monotonic() + TIMEOUT
    while _high_watermark(broker.bootstrap, t) != 2:
        assert time.monotonic() < deadline, "the acks=0 record was never appended"


def test_dynamic_broker_configs_apply_live_persist_and_report_their_source(fresh_broker):
    b = fresh_broker()
    admin = _admin(b.bootstrap)
    t = _topic()
    _create(admin, t)
    big = b"x" * 5000
    assert _produce_one(b.bootstrap, t, big) is None
    # cluster default, then this broker's own value, which wins
    assert _set_cluster_default(b.bootstrap, {"message.max.bytes": "3000", "log.retention.ms": "1111"}) == (0, None)
    err = _produce_one(b.bootstrap, t, big)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    _set_broker(admin, "1", {"log.retention.ms": "2222", "min.insync.replicas": "2"}).result(timeout=TIMEOUT)
    err = _produce_one(b.bootstrap, t, b"small", acks="all")
    assert err is not None and err.code() == KafkaError.NOT_ENOUGH_REPLICAS

    def check(admin, bootstrap):
        cfg = _describe(admin, ResourceType.BROKER, "1")
        assert _describe_cluster_default(bootstrap, "1")["log.retention.ms"] == (
            "2222", ConfigSource.DYNAMIC_BROKER_CONFIG.value, [
                ("log.retention.ms", "2222", ConfigSource.DYNAMIC_BROKER_CONFIG.value),
                ("log.retention.ms", "1111", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value),
                ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG.value)])
        mmb = cfg["message.max.bytes"]
        assert (mmb.value, mmb.source) == ("3000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        assert cfg["num.io.threads"].source == ConfigSource.DEFAULT_CONFIG.value
        assert cfg["log.dirs"].source == ConfigSource.STATIC_BROKER_CONFIG.value  # set by the test harness
        dyn_default, default = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, ConfigSource.DEFAULT_CONFIG.value
        assert _describe_cluster_default(bootstrap) == {
            "log.retention.ms": ("1111", dyn_default, [("log.retention.ms", "1111", dyn_default),
                                                       ("log.retention.hours", "168", default)]),
            "message.max.bytes": ("3000", dyn_default, [("message.max.bytes", "3000", dyn_default),
                                                        ("message.max.bytes", "1048588", default)])}
        topic = _describe(admin, ResourceType.TOPIC, t)
        assert (topic["retention.ms"].value, topic["retention.ms"].source) == (
            "2222", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        assert topic["max.message.bytes"].value == "3000"

    check(admin, b.bootstrap)
    assert b.terminate() == 0
    b2 = fresh_broker()
    admin = _admin(b2.bootstrap)
    check(admin, b2.bootstrap)  # persisted, and applied at start-up:
    err = _produce_one(b2.bootstrap, t, big, acks=1)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    # deleting the per-broker value falls back to the cluster default; then the default goes too
    _set_broker(admin, "1", {"min.insync.replicas": None, "log.retention.ms": None},
                AlterConfigOpType.DELETE).result(timeout=TIMEOUT)
    assert _produce_one(b2.bootstrap, t, b"small", acks="all") is None
    assert _describe(admin, ResourceType.BROKER, "1")["log.retention.ms"].value == "1111"
    assert _set_cluster_default(b2.bootstrap, {"message.max.bytes": None, "log.retention.ms": None},
                                AlterConfigOpType.DELETE) == (0, None)
    assert _produce_one(b2.bootstrap, t, big) is None
    assert _describe_cluster_default(b2.bootstrap) == {}
    assert b2.terminate() == 0


def test_dynamic_broker_config_refusals(broker):
    admin = _admin(broker.bootstrap)
    code, msg = _set_cluster_default(broker.bootstrap, {"no.such.config": "1"})
    assert code == 42 and "Cannot update these configs dynamically: no.such.config" in msg  # INVALID_REQUEST
    code, msg = _set_cluster_default(broker.bootstrap, {"log.retention.ms": "1000"}, name="7")
    assert code == 42 and "7" in msg  # another node's resource
    cases = [
        ("1", {"num.partitions": "5"}, "Cannot update these configs dynamically"),  # static in Kafka too
        ("1", {"num.io.threads": "4"}, "without a restart"),  # dynamic in Kafka, not live in kbroker
        ("1", {"log.retention.ms": "not-a-number"}, "log.retention.ms"),
        ("1", {"log.segment.bytes": "1"}, "log.segment.bytes"),
    ]
    for name, entries, text in cases:
        with pytest.raises(KafkaException) as ei:
            _set_broker(admin, name, entries).result(timeout=TIMEOUT)
        err = ei.value.args[0]
        assert err.code() == KafkaError.INVALID_REQUEST and text in err.str(), (entries, err)
    assert _describe_cluster_default(broker.bootstrap) == {}
    # validate_only changes nothing
    res = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("log.retention.ms", "3333", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], validate_only=True)[res].result(timeout=TIMEOUT)
    assert _describe(admin, ResourceType.BROKER, "1")["log.retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_deprecated_message_format_version_accepted_with_a_warning(broker):
    admin = _admin(broker.bootstrap)
    t = _topic("mfv")
    _create(admin, t, {"message.format.version": "0.10.0.0"})  # as librdkafka's test 0092 does
    assert _describe(admin, ResourceType.TOPIC, t)["message.format.version"].value == "0.10.0.0"
    assert _produce_one(broker.bootstrap, t) is None  # batches are still v2: nothing changes
    deadline = time.monotonic() + TIMEOUT
    while "message.format.version is deprecated" not in broker.read_log():
        assert time.monotonic() < deadline, "no deprecation warning logged"
        time.sleep(0.05)
    err = _create_error(admin, NewTopic(_topic("mfv"), config={"message.format.version": "banana"}))
    assert err.code() == KafkaError.INVALID_CONFIG


def test_unhonourable_topic_config_is_refused(broker):
    admin = _admin(broker.bootstrap)
    t = _topic("tier")
    err = _create_error(admin, NewTopic(t, config={"remote.storage.enable": "true"}))
    assert err.code() == KafkaError.INVALID_CONFIG and "Tiered Storage" in err.str()
    _create(admin, t, {"remote.storage.enable": "false"})
    res = ConfigResource(ResourceType.TOPIC, t, incremental_configs=[
        ConfigEntry("remote.storage.enable", "true", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as ei:
        admin.incremental_alter_configs([res])[res].result(timeout=TIMEOUT)
    assert ei.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert _describe(admin, ResourceType.TOPIC, t)["remote.storage.enable"].value == "false"


def test_manual_replica_assignment(broker):
    admin = _admin(broker.bootstrap)
    t = _topic("assign")
    _create(admin, t, num_partitions=2, replica_assignment=[[1], [1]])
    md = admin.list_topics(t, timeout=TIMEOUT).topics[t]
    assert sorted(md.partitions) == [0, 1] and all(p.replicas == [1] for p in md.partitions.values())
    err = _create_error(admin, NewTopic(_topic("assign"), num_partitions=1, replica_assignment=[[2]]))
    assert err.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    # CreatePartitions with an assignment: broker 1 is fine, an unknown broker is not
    admin.create_partitions([NewPartitions(t, 3, replica_assignment=[[1]])])[t].result(timeout=TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        admin.create_partitions([NewPartitions(t, 4, replica_assignment=[[5]])])[t].result(timeout=TIMEOUT)
    assert ei.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    # replication factor and assignment both given: INVALID_REQUEST (the client library refuses to send it)
    req = CreateTopicsRequest(topics=[CreatableTopic(
        name=_topic("assign"), num_partitions=-1, replication_factor=1,
        assignments=[CreatableReplicaAssignment(partition_index=0, broker_ids=[1])])], timeout_ms=10000)
    r = _raw(broker.bootstrap, ApiKey.CREATE_TOPICS, 5, req).topics[0]
    assert r.error_code == 42 and "replicationFactor" in r.error_message  # INVALID_REQUEST


def test_librdkafka_0081_broker_alter(broker):
    """librdkafka's test 0081 sets sasl.kerberos.min.time.before.relogin on broker resource
    "<node.id>" (AlterConfigs and IncrementalAlterConfigs) and expects success."""
    admin = _admin(broker.bootstrap)
    try:
        _set_broker(admin, "1", {"sasl.kerberos.min.time.before.relogin": "58000"}).result(timeout=TIMEOUT)
        entry = _describe(admin, ResourceType.BROKER, "1")["sasl.kerberos.min.time.before.relogin"]
        assert (entry.value, entry.source) == ("58000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        res = ConfigResource(ResourceType.BROKER, "1", set_config={"sasl.kerberos.min.time.before.relogin": "57000"})
        admin.alter_configs([res])[res].result(timeout=TIMEOUT)
        assert _describe(admin, ResourceType.BROKER, "1")["sasl.kerberos.min.time.before.relogin"].value == "57000"
    finally:
        res = ConfigResource(ResourceType.BROKER, "1", set_config={})
        admin.alter_configs([res])[res].result(timeout=TIMEOUT)  # legacy AlterConfigs replaces the whole set
    assert _describe(admin, ResourceType.BROKER, "1")["sasl.kerberos.min.time.before.relogin"].source == \
        ConfigSource.DEFAULT_CONFIG.value

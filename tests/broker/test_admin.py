"""Admin APIs against a real kbroker: configs, DescribeCluster, DeleteRecords, DescribeLogDirs.

Clients: confluent-kafka's AdminClient (librdkafka), kafka-python's KafkaAdminClient, and
raw requests (kbroker.protocol over a socket) for what the clients hide.
"""
import os
import socket
import struct
import time
import uuid

import pytest

import confluent_kafka as ck  # noqa: E402
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewTopic, ResourceType,
)

TIMEOUT = 15
#: the legacy AlterConfigs API is what these tests exercise; librdkafka marks it deprecated
pytestmark = pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")


def _raw(bootstrap, api_key, version, body):
    """One request over a fresh connection; the decoded response body."""
    from kbroker.protocol import decode_response, encode_request

    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as s:
        s.sendall(encode_request(api_key, version, 1, "test-admin", body))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = s.recv(65536)
            assert chunk, "broker closed the connection"
            buf += chunk
    header, resp = decode_response(buf[4:], api_key, version)
    assert header.correlation_id == 1
    return resp


def _topic(prefix="adm"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def _create(admin, name, partitions=1, config=None):
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
                        operation_timeout=10)[name].result(timeout=TIMEOUT)


def _describe(admin, rtype, name, **kw):
    res = ConfigResource(rtype, name)
    return admin.describe_configs([res], **kw)[res].result(timeout=TIMEOUT)


def _alter(admin, name, configs, validate_only=False):
    res = ConfigResource(ResourceType.TOPIC, name, set_config=configs)
    return admin.alter_configs([res], validate_only=validate_only)[res].result(timeout=TIMEOUT)


def _incremental(admin, name, entries, validate_only=False):
    res = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
    return admin.incremental_alter_configs([res], validate_only=validate_only)[res].result(timeout=TIMEOUT)


def _produce(bootstrap, topic, n, partition=0):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def _error(fut):
    with pytest.raises(KafkaException) as ei:
        fut.result(timeout=TIMEOUT)
    return ei.value.args[0]


# -- DescribeConfigs ------------------------------------------------------------------------

def test_describe_topic_configs(broker):
    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t, config={"retention.ms": "3600000", "cleanup.policy": "compact"})
    cfg = _describe(admin, ResourceType.TOPIC, t)
    # every topic config is described
    for name in ("retention.ms", "segment.bytes", "cleanup.policy", "max.message.bytes",
                 "min.insync.replicas", "message.timestamp.type", "compression.type"):
        assert name in cfg, name
    assert cfg["retention.ms"].value == "3600000"
    assert cfg["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not cfg["retention.ms"].is_default
    assert cfg["cleanup.policy"].value == "compact"
    syn = cfg["retention.ms"].synonyms
    assert list(syn)[0] == "retention.ms"
    # not overridden: the broker's key default
    seg = cfg["segment.bytes"]
    assert seg.value == "1073741824" and seg.source == ConfigSource.DEFAULT_CONFIG.value
    assert [(s.name, s.source) for s in seg.synonyms.values()] == [
        ("log.segment.bytes", ConfigSource.DEFAULT_CONFIG.value)]
    assert not seg.is_read_only and not seg.is_sensitive
    # num.partitions=1 is set by the test fixture on the command line → STATIC_BROKER_CONFIG on the broker
    b = _describe(admin, ResourceType.BROKER, "1")
    assert b["num.partitions"].value == "1"
    assert b["num.partitions"].source == ConfigSource.STATIC_BROKER_CONFIG.value


def test_describe_static_broker_default_and_filter(fresh_broker):
    b = fresh_broker(**{"log.segment.bytes": 5000000, "log.retention.ms": 120000})
    admin = _admin(b.bootstrap)
    t = _topic()
    _create(admin, t)
    cfg = _describe(admin, ResourceType.TOPIC, t)
    assert cfg["segment.bytes"].value == "5000000"
    assert cfg["segment.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    # (librdkafka keys synonyms by name, so only one log.segment.bytes entry survives here)
    assert "log.segment.bytes" in cfg["segment.bytes"].synonyms
    assert cfg["retention.ms"].value == "120000"
    assert cfg["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    # broker resource: read_only follows Kafka's dynamic-config list
    bc = _describe(admin, ResourceType.BROKER, "1")
    assert bc["log.segment.bytes"].value == "5000000" and not bc["log.segment.bytes"].is_read_only
    assert bc["node.id"].is_read_only and bc["node.id"].value == "1"
    assert bc["num.io.threads"].source == ConfigSource.DEFAULT_CONFIG.value
    assert "listeners" in bc and "log.dirs" in bc
    b.terminate()


def test_describe_unknown_topic(broker):
    admin = _admin(broker.bootstrap)
    res = ConfigResource(ResourceType.TOPIC, _topic("missing"))
    err = _error(admin.describe_configs([res])[res])
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


# -- AlterConfigs / IncrementalAlterConfigs ------------------------------------------------------

def test_alter_configs_replaces_overrides(broker):
    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t, config={"retention.ms": "3600000"})
    _alter(admin, t, {"segment.bytes": "2000000", "max.message.bytes": "5000"})
    cfg = _describe(admin, ResourceType.TOPIC, t)
    assert cfg["segment.bytes"].value == "2000000"
    assert cfg["segment.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert cfg["max.message.bytes"].value == "5000"
    # the legacy API replaces the whole set: retention.ms went back to the default
    assert cfg["retention.ms"].value == "604800000"
    assert cfg["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    # applied live: a batch larger than max.message.bytes is refused now
    p = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 100000,
                  "message.timeout.ms": 10000})
    errs = []
    p.produce(t, value=b"x" * 20000, on_delivery=lambda e, m: errs.append(e))
    p.flush(15)
    assert errs and errs[0] is not None and errs[0].code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_alter_validate_only_and_invalid(broker):
    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t)
    _alter(admin, t, {"retention.ms": "1000"}, validate_only=True)
    assert _describe(admin, ResourceType.TOPIC, t)["retention.ms"].value == "604800000"
    res = ConfigResource(ResourceType.TOPIC, t, set_config={"retention.ms": "soon"})
    err = _error(admin.alter_configs([res])[res])
    assert err.code() == KafkaError.INVALID_CONFIG and "retention.ms" in err.str()
    res = ConfigResource(ResourceType.TOPIC, t, set_config={"no.such.config": "1"})
    err = _error(admin.alter_configs([res])[res])
    assert err.code() == KafkaError.INVALID_CONFIG and "no.such.config" in err.str()
    res = ConfigResource(ResourceType.TOPIC, t, incremental_configs=[
        ConfigEntry("cleanup.policy", "shred", incremental_operation=AlterConfigOpType.SET)])
    err = _error(admin.incremental_alter_configs([res])[res])
    assert err.code() == KafkaError.INVALID_CONFIG and "cleanup.policy" in err.str()
    res = ConfigResource(ResourceType.TOPIC, _topic("missing"), set_config={"retention.ms": "1000"})
    assert _error(admin.alter_configs([res])[res]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    # nothing changed
    cfg = _describe(admin, ResourceType.TOPIC, t)
    assert all(e.source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value for e in cfg.values())


def test_incremental_alter_ops(broker):
    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t, config={"retention.ms": "3600000"})
    _incremental(admin, t, [
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("segment.ms", "100000", incremental_operation=AlterConfigOpType.SET),
    ])
    cfg = _describe(admin, ResourceType.TOPIC, t)
    assert cfg["cleanup.policy"].value == "delete,compact"  # appended to the default
    assert cfg["segment.ms"].value == "100000"
    assert cfg["retention.ms"].value == "3600000"  # untouched: incremental keeps other overrides
    _incremental(admin, t, [
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    cfg = _describe(admin, ResourceType.TOPIC, t)
    assert cfg["cleanup.policy"].value == "compact"
    assert cfg["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    # APPEND to a non-list config
    res = ConfigResource(ResourceType.TOPIC, t, incremental_configs=[
        ConfigEntry("segment.bytes", "1", incremental_operation=AlterConfigOpType.APPEND)])
    err = _error(admin.incremental_alter_configs([res])[res])
    assert err.code() == KafkaError.INVALID_CONFIG and "segment.bytes" in err.str()
    # validate_only leaves it alone
    res = ConfigResource(ResourceType.TOPIC, t, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SUBTRACT)])
    err = _error(admin.incremental_alter_configs([res], validate_only=True)[res])
    assert err.code() == KafkaError.INVALID_CONFIG  # an empty cleanup.policy is invalid
    assert _describe(admin, ResourceType.TOPIC, t)["cleanup.policy"].value == "compact"


def test_broker_alter_refused(broker):
    admin = _admin(broker.bootstrap)
    for name in ("num.partitions", "num.io.threads"):  # not dynamic; dynamic in Kafka, not live in kbroker
        res = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
            ConfigEntry(name, "5", incremental_operation=AlterConfigOpType.SET)])
        err = _error(admin.incremental_alter_configs([res])[res])
        assert err.code() == KafkaError.INVALID_REQUEST and name in err.str()


def test_config_survives_restart(fresh_broker):
    b = fresh_broker()
    admin = _admin(b.bootstrap)
    t = _topic()
    _create(admin, t)
    _incremental(admin, t, [ConfigEntry("retention.bytes", "123456789", incremental_operation=AlterConfigOpType.SET)])
    assert b.terminate() == 0
    b2 = fresh_broker()
    cfg = _describe(_admin(b2.bootstrap), ResourceType.TOPIC, t)
    assert cfg["retention.bytes"].value == "123456789"
    assert cfg["retention.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    b2.terminate()


def test_describe_configs_wire_details(broker):
    """Synonym order, v0 is_default, v3+ config_type/documentation, broker-id checks."""
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.describe_configs import DescribeConfigsRequest, DescribeConfigsResource

    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t, config={"segment.bytes": "2000000"})

    def describe(v, rtype, name, keys=None, **kw):
        req = DescribeConfigsRequest(resources=[DescribeConfigsResource(resource_type=rtype, resource_name=name,
                                                                        configuration_keys=keys)], **kw)
        return _raw(broker.bootstrap, ApiKey.DESCRIBE_CONFIGS, v, req).results[0]

    r = describe(4, 2, t, ["segment.bytes", "cleanup.policy", "no.such"], include_synonyms=True,
                 include_documentation=True)
    assert r.error_code == 0
    by = {c.name: c for c in r.configs}
    assert sorted(by) == ["cleanup.policy", "segment.bytes"]  # filtered; unknown keys ignored
    seg = by["segment.bytes"]
    assert (seg.value, seg.config_source, seg.config_type) == ("2000000", 1, 3)  # TOPIC_CONFIG, INT
    assert [(s.name, s.value, s.source) for s in seg.synonyms] == [
        ("segment.bytes", "2000000", 1), ("log.segment.bytes", "1073741824", 5)]
    assert by["cleanup.policy"].config_type == 7 and by["cleanup.policy"].documentation  # LIST
    r0 = describe(0, 2, t, ["segment.bytes", "retention.ms"])
    assert {c.name: c.is_default for c in r0.configs} == {"segment.bytes": False, "retention.ms": True}
    # without include_synonyms: none sent
    assert describe(2, 2, t, ["segment.bytes"]).configs[0].synonyms == []
    # broker resource: this node, the cluster default (no dynamic defaults set), others refused
    b = describe(4, 4, "1", ["num.io.threads", "node.id"], include_synonyms=True)
    # read_only: kbroker cannot change num.io.threads without a restart (Kafka can)
    assert {c.name: (c.value, c.read_only) for c in b.configs} == {"num.io.threads": ("8", True),
                                                                   "node.id": ("1", True)}
    assert describe(4, 4, "").configs == []
    bad = describe(4, 4, "7")
    assert bad.error_code == 42 and "7" in bad.error_message  # INVALID_REQUEST
    bad = describe(4, 4, "x")
    assert bad.error_code == 42
    assert describe(4, 2, "bad/name").error_code == 17  # INVALID_TOPIC_EXCEPTION


# -- DescribeCluster -------------------------------------------------------------------------

def test_describe_cluster(broker):
    admin = _admin(broker.bootstrap)
    d = admin.describe_cluster(request_timeout=10).result(timeout=TIMEOUT)
    assert d.cluster_id and len(d.nodes) == 1
    n = d.nodes[0]
    assert (n.id, n.host, n.port) == (1, "127.0.0.1", broker.port)
    assert d.controller.id == 1


def test_describe_cluster_endpoint_types(broker):
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.describe_cluster import DescribeClusterRequest

    r = _raw(broker.bootstrap, ApiKey.DESCRIBE_CLUSTER, 1,
             DescribeClusterRequest(include_cluster_authorized_operations=True, endpoint_type=1))
    assert r.error_code == 0 and r.endpoint_type == 1 and r.cluster_authorized_operations > 0
    assert [(b.broker_id, b.port) for b in r.brokers] == [(1, broker.port)]
    r = _raw(broker.bootstrap, ApiKey.DESCRIBE_CLUSTER, 1, DescribeClusterRequest(endpoint_type=2))
    assert r.error_code == 114 and r.brokers == []  # MISMATCHED_ENDPOINT_TYPE
    r = _raw(broker.bootstrap, ApiKey.DESCRIBE_CLUSTER, 1, DescribeClusterRequest(endpoint_type=9))
    assert r.error_code == 115  # UNSUPPORTED_ENDPOINT_TYPE


# -- DeleteRecords ---------------------------------------------------------------------------

def test_delete_records(broker):
    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t, partitions=2)
    _produce(broker.bootstrap, t, 20, partition=0)
    _produce(broker.bootstrap, t, 5, partition=1)
    res = admin.delete_records([TopicPartition(t, 0, 12)])
    deleted = res[TopicPartition(t, 0, 12)].result(timeout=TIMEOUT)
    assert deleted.low_watermark == 12
    # -1: everything up to the high watermark
    tp1 = TopicPartition(t, 1, -1)
    assert admin.delete_records([tp1])[tp1].result(timeout=TIMEOUT).low_watermark == 5
    # beyond the high watermark
    bad = TopicPartition(t, 0, 21)
    assert _error(admin.delete_records([bad])[bad]).code() == KafkaError.OFFSET_OUT_OF_RANGE
    # ListOffsets earliest moved; a consumer from the beginning starts at 12
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    lo, hi = c.get_watermark_offsets(TopicPartition(t, 0), timeout=10)
    assert (lo, hi) == (12, 20)
    c.assign([TopicPartition(t, 0, ck.OFFSET_BEGINNING)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 8 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.offset())
    c.close()
    assert got == list(range(12, 20))


def test_delete_records_unknown_partition(broker):
    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t)
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.delete_records import (
        DeleteRecordsPartition, DeleteRecordsRequest, DeleteRecordsTopic,
    )

    _produce(broker.bootstrap, t, 3)
    for v in (0, 1, 2):
        req = DeleteRecordsRequest(timeout_ms=5000, topics=[
            DeleteRecordsTopic(name=t, partitions=[DeleteRecordsPartition(partition_index=3, offset=0),
                                                   DeleteRecordsPartition(partition_index=0, offset=-2),
                                                   DeleteRecordsPartition(partition_index=0, offset=1)]),
            DeleteRecordsTopic(name=_topic("missing"), partitions=[DeleteRecordsPartition(partition_index=0, offset=0)])])
        resp = _raw(broker.bootstrap, ApiKey.DELETE_RECORDS, v, req)
        got = [(p.partition_index, p.error_code, p.low_watermark) for tr in resp.topics for p in tr.partitions]
        assert got == [(3, 3, -1), (0, 1, -1), (0, 0, 1), (0, 3, -1)]  # UNKNOWN_TOPIC_OR_PARTITION=3, OFFSET_OUT_OF_RANGE=1


def test_delete_records_compacted_topic_refused(broker):
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.delete_records import (
        DeleteRecordsPartition, DeleteRecordsRequest, DeleteRecordsTopic,
    )

    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t, config={"cleanup.policy": "compact"})
    _produce(broker.bootstrap, t, 3)
    resp = _raw(broker.bootstrap, ApiKey.DELETE_RECORDS, 2, DeleteRecordsRequest(timeout_ms=5000, topics=[
        DeleteRecordsTopic(name=t, partitions=[DeleteRecordsPartition(partition_index=0, offset=2)])]))
    assert resp.topics[0].partitions[0].error_code == 44  # POLICY_VIOLATION


# -- DescribeLogDirs (kafka-python) ------------------------------------------------------------

def test_describe_log_dirs_kafka_python(broker):
    import kafka
    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t, partitions=2)
    _produce(broker.bootstrap, t, 10, partition=1)
    ka = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        resp = ka.describe_log_dirs()
    finally:
        ka.close()
    assert [r["broker"] for r in resp] == [1]
    sizes = {}
    for r in resp[0]["log_dirs"]:
        assert r["error_code"] == 0
        assert r["log_dir"] == os.path.join(broker.data_dir, "logs")
        assert r["total_bytes"] >= r["usable_bytes"] > 0
        for topic in r["topics"]:
            for p in topic["partitions"]:
                assert p["offset_lag"] == 0 and p["is_future_key"] is False
                sizes[(topic["name"], p["partition_index"])] = p["partition_size"]
    assert sizes[(t, 0)] == 0
    assert sizes[(t, 1)] == os.path.getsize(os.path.join(broker.data_dir, "logs", f"{t}-1", "00000000000000000000.log"))
    assert sizes[(t, 1)] > 0


def test_describe_log_dirs_filter_and_v0(broker):
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.describe_log_dirs import DescribableLogDirTopic, DescribeLogDirsRequest

    admin = _admin(broker.bootstrap)
    t = _topic()
    _create(admin, t, partitions=3)
    req = DescribeLogDirsRequest(topics=[DescribableLogDirTopic(topic=t, partitions=[2, 7]),
                                         DescribableLogDirTopic(topic=_topic("missing"), partitions=[0])])
    for v in (0, 4):
        resp = _raw(broker.bootstrap, ApiKey.DESCRIBE_LOG_DIRS, v, req)
        (r,) = resp.results
        assert [(tt.name, [p.partition_index for p in tt.partitions]) for tt in r.topics] == [(t, [2])]
        assert (r.total_bytes > 0) == (v >= 4)

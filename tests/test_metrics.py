"""The Prometheus /metrics endpoint of a real broker (kbroker.metrics.port=0)."""
import re
import time
import urllib.request
import uuid

import pytest

from kbroker.testing import KBrokerProcess

import confluent_kafka as ck
import prometheus_client.parser as parser


POOL_BYTES = 200 * 1024 * 1024


@pytest.fixture(scope="module")
def metrics_broker():
    b = KBrokerProcess(overrides={"kbroker.metrics.port": 0, "queued.max.request.bytes": POOL_BYTES})
    b.start()
    url = None
    deadline = time.monotonic() + 15
    while url is None and time.monotonic() < deadline:
        m = re.search(r"metrics endpoint listening on (http://\S+/metrics)", b.read_log())
        if m:
            url = m.group(1)
        else:
            time.sleep(0.1)
    assert url, "bound metrics port not logged:\n" + b.read_log()[-3000:]
    b.metrics_url = url
    yield b
    rc = b.terminate()
    log = b.read_log()
    b.__exit__(None, None, None)
    assert rc == 0, log[-3000:]
    assert "Traceback" not in log, log[-4000:]


def scrape(url) -> dict:
    """{(name, frozenset(labels.items())): value} of every sample."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def test_metrics_exposed_and_move(metrics_broker):
    b = metrics_broker
    before = scrape(b.metrics_url)
    for name in ("kafka_network_RequestChannel_RequestQueueSize", "kafka_network_RequestChannel_ResponseQueueSize",
                 "kafka_network_SocketServer_NetworkProcessorAvgIdlePercent",
                 "kafka_server_KafkaRequestHandlerPool_RequestHandlerAvgIdlePercent",
                 "kafka_server_ReplicaManager_UnderReplicatedPartitions",
                 "kafka_server_FetchSessionCache_NumIncrementalFetchSessions",
                 "kafka_server_FetchSessionCache_NumIncrementalFetchPartitionsCached"):
        assert (name, frozenset()) in before, name
    assert 0.0 <= value(before, "kafka_network_SocketServer_NetworkProcessorAvgIdlePercent") <= 1.0
    assert value(before, "kafka_server_ReplicaManager_UnderReplicatedPartitions") == 0
    # the request memory pool (queued.max.request.bytes): nothing in flight between requests
    assert value(before, "kafka_network_SocketServer_MemoryPoolAvailable") == POOL_BYTES
    assert value(before, "kafka_network_SocketServer_MemoryPoolUsed") == 0
    for op in ("Produce", "Fetch"):
        assert value(before, "kafka_server_DelayedOperationPurgatory_PurgatorySize", delayedOperation=op) >= 0
        assert value(before, "kafka_server_DelayedOperationPurgatory_NumDelayedOperations", delayedOperation=op) >= 0
    bytes_in0 = value(before, "kafka_server_BrokerTopicMetrics_BytesInPerSec_total")
    bytes_out0 = value(before, "kafka_server_BrokerTopicMetrics_BytesOutPerSec_total")
    parts0 = value(before, "kafka_server_ReplicaManager_PartitionCount")

    topic = f"m-{uuid.uuid4().hex[:8]}"
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(timeout=15)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    for i in range(50):
        p.produce(topic, value=b"x" * 100, partition=i % 2)
    assert p.flush(30) == 0

    after = scrape(b.metrics_url)
    assert value(after, "kafka_server_BrokerTopicMetrics_BytesInPerSec_total") > bytes_in0 + 50 * 100
    assert value(after, "kafka_server_BrokerTopicMetrics_BytesOutPerSec_total") > bytes_out0
    assert value(after, "kafka_server_ReplicaManager_PartitionCount") == parts0 + 2
    for part in (0, 1):
        assert value(after, "kafka_log_Log_LogEndOffset", topic=topic, partition=str(part)) == 25
        assert value(after, "kafka_log_Log_LogStartOffset", topic=topic, partition=str(part)) == 0
        assert value(after, "kafka_log_Log_Size", topic=topic, partition=str(part)) > 25 * 100
    produced = value(after, "kafka_network_RequestMetrics_RequestsPerSec_total", request="Produce")
    assert produced >= 1
    assert value(after, "kafka_network_RequestMetrics_TotalTimeMs_count", request="Produce") == produced
    assert value(after, "kafka_network_RequestMetrics_TotalTimeMs_sum", request="Produce") > 0
    assert value(after, "kafka_network_RequestMetrics_RequestsPerSec_total", request="CreateTopics") >= 1
    assert value(after, "kafka_controller_KafkaController_GlobalTopicCount") >= 1


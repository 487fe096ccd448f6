"""KIP-227 fetch sessions with a real client: kafka-python's consumer of 1,000 partitions.

kafka-python (``FetchSessionHandler``) opens an incremental fetch session when the broker
gives it a session id, and from then on sends only the partitions whose fetch state
changed. librdkafka and aiokafka never use sessions, so this is the client that shows the
broker keeps a 1,000-partition consumer from resending every partition on every fetch:
an idle incremental Fetch carries no partition (tens of bytes), a full one about 33 bytes
per partition. Measured from the broker's own metrics (RequestBytes and RequestsPerSec for
Fetch, the FetchSessionCache gauges).
"""
from __future__ import annotations

import re
import time
import uuid

import confluent_kafka as ck
import kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import KBrokerProcess
from tests.test_metrics import scrape

N = 1000


def _v(samples, name, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _fetch_totals(url) -> tuple[float, float, dict]:
    s = scrape(url)
    return (_v(s, "kafka_network_RequestMetrics_RequestsPerSec_total", request="Fetch"),
            _v(s, "kafka_network_RequestMetrics_RequestBytes_total", request="Fetch"), s)


@pytest.fixture
def metrics_broker(request):
    overrides = {"kbroker.metrics.port": 0}
    overrides.update(getattr(request, "param", {}))
    b = KBrokerProcess(overrides=overrides)
    b.start()
    try:
        deadline = time.monotonic() + 15
        m = None
        while m is None and time.monotonic() < deadline:
            m = re.search(r"metrics endpoint listening on (http://\S+/metrics)", b.read_log())
            if m is None:
                time.sleep(0.1)
        assert m, "bound metrics port not logged:\n" + b.read_log()[-3000:]
        b.metrics_url = m.group(1)
        yield b
    finally:
        b.terminate()
        b.cleanup()


def _consume_then_idle(b) -> tuple[float, float, dict]:
    """Consume one record from each of N partitions with kafka-python, then poll an idle
    consumer for 2 s. Returns (idle fetches, their request bytes, metrics after)."""
    topic = "fs-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, N, 1)])[topic].result(30)
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    for i in range(N):
        p.produce(topic, b"v%d" % i, partition=i)
    assert p.flush(30) == 0
    del p

    c = kafka.KafkaConsumer(bootstrap_servers=b.bootstrap, enable_auto_commit=False,
                            fetch_max_wait_ms=100, request_timeout_ms=30000)
    try:
        c.assign([kafka.TopicPartition(topic, i) for i in range(N)])
        c.seek_to_beginning()
        got = {}
        deadline = time.monotonic() + 60
        while len(got) < N and time.monotonic() < deadline:
            for tp, recs in c.poll(500).items():
                got[tp.partition] = [r.value for r in recs]
        assert got == {i: [b"v%d" % i] for i in range(N)}

        # Every partition's fetch offset just moved (0 -> 1), so the next incremental
        # fetch names all of them; once it is answered the session holds them and idle
        # fetches name none.
        settle = time.monotonic()
        while time.monotonic() - settle < 1.0:
            c.poll(200)
        n1, bytes1, _ = _fetch_totals(b.metrics_url)
        idle_start = time.monotonic()
        while time.monotonic() - idle_start < 2.0:
            c.poll(200)
        n2, bytes2, s = _fetch_totals(b.metrics_url)
    finally:
        c.close()
    return n2 - n1, bytes2 - bytes1, s


def test_kafka_python_consumer_of_1000_partitions_fetches_incrementally(metrics_broker):
    idle_fetches, idle_bytes, s = _consume_then_idle(metrics_broker)
    assert _v(s, "kafka_server_FetchSessionCache_NumIncrementalFetchSessions") >= 1
    assert _v(s, "kafka_server_FetchSessionCache_NumIncrementalFetchPartitionsCached") >= N
    assert idle_fetches >= 3, idle_fetches
    # A full Fetch of 1,000 partitions is ~33 KB; an incremental one with nothing to
    # send is a header, a session id and epoch, and empty topic and forgotten lists.
    assert idle_bytes / idle_fetches < 200, (idle_bytes, idle_fetches)


@pytest.mark.parametrize("metrics_broker", [{"max.incremental.fetch.session.cache.slots": 0}],
                         indirect=True)
def test_without_session_slots_every_fetch_names_every_partition(metrics_broker):
    """The control: a broker that keeps no session (Kafka's
    max.incremental.fetch.session.cache.slots=0) makes the same consumer resend all
    1,000 partitions on every fetch, so the measure above can tell the two apart."""
    idle_fetches, idle_bytes, s = _consume_then_idle(metrics_broker)
    assert _v(s, "kafka_server_FetchSessionCache_NumIncrementalFetchSessions") == 0
    assert idle_fetches >= 3, idle_fetches
    assert idle_bytes / idle_fetches > 30 * N, (idle_bytes, idle_fetches)

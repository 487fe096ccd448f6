"""Client quotas against a real ``kbroker serve``: AlterClientQuotas / DescribeClientQuotas,
byte-rate throttling seen by librdkafka, KIP-219's throttle_time_ms and muted connection,
and quotas kept across a restart.

The broker runs with ``quota.window.num=2`` so a rate is measured over >= 1 s (Kafka's
default 11 × 1 s would make every throttle here last ~10 s)."""
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kbroker.protocol import ApiKey as K, ErrorCode as E
from kbroker.protocol.messages import alter_client_quotas as acq, describe_client_quotas as dcq
from kbroker.protocol.messages.api_versions import ApiVersionsRequest
from kbroker.protocol.messages.produce import PartitionProduceData, ProduceRequest, TopicProduceData
from kbroker.kernels import records
from kbroker.testing import KBrokerProcess
from tests.broker.kafka_helpers import create_topic
from tests.broker.raw_client import RawClient


@pytest.fixture(scope="module")
def qbroker():
    b = KBrokerProcess(overrides={"quota.window.num": 2, "quota.window.size.seconds": 1})
    b.start()
    yield b
    rc = b.terminate()
    log = b.read_log()
    b.__exit__(None, None, None)
    assert rc == 0 and "Traceback" not in log, log[-4000:]


def _alter(port, entity, ops):
    with RawClient(port) as c:
        r = c.call(K.ALTER_CLIENT_QUOTAS, 1, acq.AlterClientQuotasRequest(entries=[
            acq.AlterClientQuotasRequestEntryData(
                entity=[acq.AlterClientQuotasRequestEntityData(entity_type=t, entity_name=n) for t, n in entity],
                ops=[acq.OpData(key=k, value=float(v or 0), remove=v is None) for k, v in ops.items()])],
            validate_only=False))
    assert [e.error_code for e in r.entries] == [E.NONE], r


def _describe(port, components, strict=False):
    with RawClient(port) as c:
        r = c.call(K.DESCRIBE_CLIENT_QUOTAS, 1, dcq.DescribeClientQuotasRequest(
            components=[dcq.ComponentData(entity_type=t, match_type=m, match=x) for t, m, x in components],
            strict=strict))
    assert r.error_code == E.NONE, r
    return {tuple((e.entity_type, e.entity_name) for e in x.entity): {v.key: v.value for v in x.values}
            for x in r.entries}


def _produce_timed(bootstrap, topic, client_id, n, size):
    p = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": 1, "linger.ms": 5,
                  "batch.size": 16384})
    t0 = time.monotonic()
    errors = []
    for i in range(n):
        p.produce(topic, b"x" * size, on_delivery=lambda err, m: err and errors.append(err))
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors
    return time.monotonic() - t0


def test_producer_byte_rate_throttles_librdkafka_and_spares_other_clients(qbroker):
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    create_topic(qbroker.bootstrap, topic)
    _alter(qbroker.port, [("client-id", "slow-producer")], {"producer_byte_rate": 50_000})
    # 300 KiB at 50 KB/s: after the first window's allowance the quota paces the rest
    slow = _produce_timed(qbroker.bootstrap, topic, "slow-producer", 300, 1024)
    fast = _produce_timed(qbroker.bootstrap, topic, "fast-producer", 300, 1024)
    assert slow >= 3.0, slow
    assert fast < slow / 2, (fast, slow)
    _alter(qbroker.port, [("client-id", "slow-producer")], {"producer_byte_rate": None})
    assert _produce_timed(qbroker.bootstrap, topic, "slow-producer", 300, 1024) < slow / 2


def test_consumer_byte_rate_throttles_fetches(qbroker):
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    create_topic(qbroker.bootstrap, topic)
    _produce_timed(qbroker.bootstrap, topic, "loader", 400, 1024)
    _alter(qbroker.port, [("user", None), ("client-id", "slow-consumer")], {"consumer_byte_rate": 100_000})

    def consume(client_id):
        c = Consumer({"bootstrap.servers": qbroker.bootstrap, "group.id": "g-" + uuid.uuid4().hex,
                      "client.id": client_id, "enable.auto.commit": False,
                      "max.partition.fetch.bytes": 65536})
        c.assign([TopicPartition(topic, 0, 0)])
        got, t0 = 0, time.monotonic()
        while got < 400 and time.monotonic() - t0 < 60:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got += 1
        c.close()
        assert got == 400
        return time.monotonic() - t0

    slow, fast = consume("slow-consumer"), consume("fast-consumer")
    assert slow >= 2.0, slow
    assert fast < slow / 2, (fast, slow)


def test_a_throttled_response_carries_its_throttle_time_and_mutes_the_connection(qbroker):
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    create_topic(qbroker.bootstrap, topic)
    client = "raw-" + uuid.uuid4().hex[:6]
    _alter(qbroker.port, [("client-id", client)], {"producer_byte_rate": 10_000})
    batch = records.encode_batch([(int(time.time() * 1000), None, b"v" * 1000, [])] * 20)
    with RawClient(qbroker.port, client_id=client) as c:
        req = ProduceRequest(transactional_id=None, acks=1, timeout_ms=5000, topic_data=[TopicProduceData(
            name=topic, partition_data=[PartitionProduceData(index=0, records=batch)])])
        r = c.call(K.PRODUCE, 9, req)
        assert r.responses[0].partition_responses[0].error_code == E.NONE
        # ~20.2 kB over the 1 s window against 10 kB/s: (20.2k - 10k) / 10k * 1 s ≈ 1 s
        assert 800 <= r.throttle_time_ms <= 1300, r.throttle_time_ms
        t0 = time.monotonic()
        c.call(K.API_VERSIONS, 3, ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        waited = time.monotonic() - t0
    assert waited >= r.throttle_time_ms / 1000 - 0.1, (waited, r.throttle_time_ms)


def test_quotas_are_described_and_kept_across_a_restart(tmp_path):
    b = KBrokerProcess(data_dir=str(tmp_path))
    b.start()
    try:
        _alter(b.port, [("user", "alice")], {"producer_byte_rate": 1024, "request_percentage": 50.5})
        _alter(b.port, [("user", None), ("client-id", None)], {"consumer_byte_rate": 2048})
        want = {(("user", "alice"),): {"producer_byte_rate": 1024.0, "request_percentage": 50.5},
                (("client-id", None), ("user", None)): {"consumer_byte_rate": 2048.0}}
        assert _describe(b.port, []) == want
        assert b.terminate() == 0
        b = KBrokerProcess(data_dir=str(tmp_path), port=b.port)
        b.start()
        assert _describe(b.port, []) == want
        assert _describe(b.port, [("user", 0, "alice")], strict=True) == {
            (("user", "alice"),): want[(("user", "alice"),)]}
    finally:
        b.kill()

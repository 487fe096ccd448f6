"""librdkafka (confluent-kafka) against a real kbroker process: the judge."""
import time
import uuid

import pytest

import confluent_kafka as ck  # noqa: E402
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402

from tests.broker.kafka_helpers import _topic, consume_assigned, create_topic, produce  # noqa: E402


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_produce_consume_acks(broker, acks):
    topic = _topic()
    create_topic(broker.bootstrap, topic, partitions=3)
    msgs = [(i % 3, f"k{i}".encode(), f"value-{i}".encode() * (i % 7), [("h", f"{i}".encode())])
            for i in range(300)]
    reports = produce(broker.bootstrap, topic, msgs, acks=acks, **{"linger.ms": 2})
    assert all(err is None for err, *_ in reports)
    if acks != "0":
        # offsets are dense and per-partition ordered
        for part in range(3):
            offs = [o for _, p, o, _, _ in reports if p == part]
            assert sorted(offs) == list(range(100))
    got = consume_assigned(broker.bootstrap, topic, [0, 1, 2], 300)
    assert len(got) == 300
    for part in range(3):
        seen = [m for m in got if m.partition() == part]
        assert [m.offset() for m in seen] == list(range(100))
        want = [m for m in msgs if m[0] == part]
        assert [(m.key(), m.value(), m.headers()) for m in seen] == [
            (k, v, h) for _, k, v, h in want]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_codecs(broker, codec):
    topic = _topic(codec)
    create_topic(broker.bootstrap, topic)
    msgs = [(0, None, (b"%05d" % i) * 40, None) for i in range(500)]
    reports = produce(broker.bootstrap, topic, msgs, **{"compression.type": codec, "linger.ms": 5})
    assert [r[2] for r in reports] == list(range(500))
    got = consume_assigned(broker.bootstrap, topic, [0], 500)
    assert [m.value() for m in got] == [v for _, _, v, _ in msgs]


def test_null_and_empty_keys_values(broker):
    topic = _topic()
    create_topic(broker.bootstrap, topic)
    msgs = [(0, None, None, None), (0, b"", b"", None), (0, b"k", None, [("a", None), ("b", b"")])]
    produce(broker.bootstrap, topic, msgs)
    got = consume_assigned(broker.bootstrap, topic, [0], 3)
    assert [(m.key(), m.value()) for m in got] == [(None, None), (b"", b""), (b"k", None)]
    assert got[2].headers() == [("a", None), ("b", b"")]


def test_consume_from_latest_and_timestamp(broker):
    topic = _topic()
    create_topic(broker.bootstrap, topic)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    base = 1_700_000_000_000
    for i in range(10):
        p.produce(topic, value=b"%d" % i, partition=0, timestamp=base + i * 1000)
    assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x" + uuid.uuid4().hex})
    tps = c.offsets_for_times([TopicPartition(topic, 0, base + 4500)], timeout=10)
    assert tps[0].offset == 5
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    assert (lo, hi) == (0, 10)
    c.close()
    got = consume_assigned(broker.bootstrap, topic, [0], 5, offset=5)
    assert [m.value() for m in got] == [b"%d" % i for i in range(5, 10)]
    assert [m.timestamp()[1] for m in got] == [base + i * 1000 for i in range(5, 10)]


def test_metadata_and_auto_create(broker):
    topic = _topic("auto")
    reports = produce(broker.bootstrap, topic, [(None, None, b"x", None)])
    assert reports[0][0] is None
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    md = admin.list_topics(timeout=10)
    assert topic in md.topics
    assert len(md.topics[topic].partitions) == 1
    assert list(md.brokers) == [1]


def test_create_partitions_and_delete_topic(broker):
    topic = _topic()
    admin = create_topic(broker.bootstrap, topic, partitions=2)
    admin.create_partitions([NewPartitions(topic, 5)])[topic].result(timeout=15)
    md = admin.list_topics(topic, timeout=10)
    assert len(md.topics[topic].partitions) == 5
    admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=15)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if topic not in admin.list_topics(timeout=10).topics:
            break
        time.sleep(0.2)
    assert topic not in admin.list_topics(timeout=10).topics
    fut = admin.create_topics([NewTopic(topic, 1, 1)])[topic]
    fut.result(timeout=15)  # the name can be reused


def test_create_topic_errors(broker):
    topic = _topic()
    admin = create_topic(broker.bootstrap, topic)
    fut = admin.create_topics([NewTopic(topic, 1, 1)])[topic]
    with pytest.raises(ck.KafkaException) as e:
        fut.result(timeout=15)
    assert e.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    bad = admin.create_topics([NewTopic(_topic(), 1, 1, config={"cleanup.policy": "nonsense"})])
    with pytest.raises(ck.KafkaException) as e:
        list(bad.values())[0].result(timeout=15)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_message_too_large(broker):
    topic = _topic()
    create_topic(broker.bootstrap, topic, config={"max.message.bytes": "2000"})
    reports = produce(broker.bootstrap, topic, [(0, None, b"x" * 5000, None)],
                      **{"message.max.bytes": 100000})
    assert reports[0][0] is not None
    assert reports[0][0].code() == KafkaError.MSG_SIZE_TOO_LARGE

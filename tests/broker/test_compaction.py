"""Log compaction through a real broker process and librdkafka (confluent-kafka)."""
import time
import uuid

import pytest

from kbroker.testing import KBrokerProcess

import confluent_kafka as ck  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

KEYS = 20
ROUNDS = 40


@pytest.fixture(scope="module")
def broker():
    b = KBrokerProcess(overrides={"num.partitions": 1, "log.cleaner.backoff.ms": 100})
    b.start()
    yield b
    rc = b.terminate()
    log = b.read_log()
    b.__exit__(None, None, None)
    assert rc == 0, log[-4000:]
    assert "Traceback" not in log, log[-6000:]


def consume_all(bootstrap, topic, timeout_s=10):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    break
                raise AssertionError(m.error())
            out.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()
    return out


def test_compacted_topic_keeps_latest_value_per_key(broker):
    topic = f"compact-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={
        "cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "3600000"})])[topic].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})
    produced = []
    for r in range(ROUNDS):
        for k in range(KEYS):
            p.produce(topic, key=b"key-%d" % k, value=b"round-%d-%s" % (r, b"x" * 20))
            produced.append((b"key-%d" % k, b"round-%d-%s" % (r, b"x" * 20)))
        assert p.flush(15) == 0
    last_value = {}
    for k, v in produced:
        last_value[k] = v
    got = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = consume_all(broker.bootstrap, topic)
        if got and len(got) < len(produced) // 4:
            break
        time.sleep(0.5)
    assert got and len(got) < len(produced) // 4, f"not compacted: {len(got)} of {len(produced)} records"
    # a subsequence of what was produced, at the original offsets
    for off, k, v in got:
        assert produced[off] == (k, v)
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets))
    # the latest value of every key is there
    final = {}
    for _, k, v in got:
        final[k] = v
    assert final == last_value
    # duplicates of a key only in the uncleaned tail (the active segment: < 4096 bytes)
    seen, first_repeat = {}, None
    for off, k, _ in got:
        if k in seen and first_repeat is None:
            first_repeat = off
        seen[k] = off
    tail = len(produced) - (first_repeat if first_repeat is not None else len(produced))
    assert tail <= 4096 // 30, f"superseded records at offset {first_repeat}, {tail} records from the end"

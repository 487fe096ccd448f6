"""1,000 partitions on one node: SIGKILL while a producer writes to all of them
(acks=all), restart, and every acknowledged record is there at its offset.

The crash lands between appends and the (deferred) leader-epoch checkpoint and
recovery-point writes of most partitions, so the restart recovers each log from
its recovery point and rebuilds its epoch cache from the batches.
"""
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kbroker.testing import KBrokerProcess
from tests.broker.kafka_helpers import create_topic

PARTITIONS = 1000
pytestmark = pytest.mark.timeout(180)


def _value(p: int, i: int) -> bytes:
    return b"%04d-%06d-" % (p, i) + b"x" * 40


def test_sigkill_during_produce_to_1000_partitions_keeps_acknowledged_records(tmp_path):
    broker = KBrokerProcess(data_dir=str(tmp_path), overrides={"num.partitions": 1})
    broker.start(timeout_s=60)
    try:
        topic = "many-" + uuid.uuid4().hex[:8]
        create_topic(broker.bootstrap, topic, PARTITIONS)
        acked: dict[tuple[int, int], bytes] = {}
        stop = threading.Event()

        def on_delivery(err, msg):
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()

        def produce():
            p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 2,
                          "message.timeout.ms": 5000, "retries": 0, "enable.idempotence": False})
            i = 0
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                for part in range(PARTITIONS):
                    try:
                        p.produce(topic, _value(part, i), partition=part, on_delivery=on_delivery)
                    except BufferError:
                        p.poll(0.05)
                p.poll(0)
                i += 1
            p.flush(10)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        while len(acked) < 3 * PARTITIONS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(acked) >= 3 * PARTITIONS, "producer too slow"
        broker.kill()                        # mid-produce: records are in flight
        stop.set()
        t.join(30)
        snapshot = dict(acked)

        broker.start(timeout_s=60)
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g-" + uuid.uuid4().hex,
                      "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(k in seen for k in snapshot):
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                seen[(m.partition(), m.offset())] = m.value()
        c.close()
        missing = [k for k in snapshot if seen.get(k) != snapshot[k]]
        assert not missing, f"{len(missing)} acknowledged records lost or changed, e.g. {missing[:5]}"
        # offsets stay dense per partition: no gaps in what survived
        by_part: dict[int, list[int]] = {}
        for p, o in seen:
            by_part.setdefault(p, []).append(o)
        assert all(sorted(v) == list(range(len(v))) for v in by_part.values())
    finally:
        broker.kill()

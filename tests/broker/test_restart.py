"""Clean restart (SIGTERM) and crash (SIGKILL) keep every acknowledged record."""
import os
import uuid

from confluent_kafka import Producer

from tests.broker.kafka_helpers import consume_assigned, create_topic


def _produce_n(bootstrap, topic, n, start=0):
    acked = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
    for i in range(start, start + n):
        p.produce(topic, value=b"r%06d" % i, partition=0,
                  on_delivery=lambda err, m: acked.append(m.value()) if err is None else None)
        p.poll(0)
    assert p.flush(30) == 0
    return acked


def test_sigterm_restart_keeps_everything(fresh_broker):
    b = fresh_broker()
    topic = "rs-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic)
    acked = _produce_n(b.bootstrap, topic, 2000)
    assert b.terminate() == 0
    data_dir = os.path.join(b.data_dir, "logs")
    assert os.path.exists(os.path.join(data_dir, ".kafka_cleanshutdown"))
    b2 = fresh_broker()
    got = consume_assigned(b2.bootstrap, topic, [0], len(acked))
    assert [m.value() for m in got] == acked
    acked2 = _produce_n(b2.bootstrap, topic, 10, start=2000)
    got = consume_assigned(b2.bootstrap, topic, [0], 10, offset=2000)
    assert [m.offset() for m in got] == list(range(2000, 2010))
    assert [m.value() for m in got] == acked2


def test_sigkill_with_fsync_keeps_acknowledged(fresh_broker):
    b = fresh_broker(**{"kbroker.log.fsync.every.append": "true"})
    topic = "rk-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic)
    acked = _produce_n(b.bootstrap, topic, 1500)
    b.kill()
    b2 = fresh_broker(**{"kbroker.log.fsync.every.append": "true"})
    got = consume_assigned(b2.bootstrap, topic, [0], len(acked))
    assert [m.value() for m in got][: len(acked)] == acked
    acked2 = _produce_n(b2.bootstrap, topic, 5, start=len(acked))
    got = consume_assigned(b2.bootstrap, topic, [0], 5, offset=len(acked))
    assert [m.value() for m in got] == acked2

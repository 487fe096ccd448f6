"""Client byte-rate quotas hold an unchanged librdkafka client to its quota (issue #18).

The rate is what the client sees: the value bytes of the records librdkafka acknowledges
(producer) or hands to the application (consumer), over a window after a warm-up, never the
broker's own counter. The broker runs with ``quota.window.num=2`` x 1 s windows: Kafka's
``Rate`` admits a burst of (samples - 1) windows' worth of quota whenever its oldest sample
expires (the window is then counted as at least samples - 1 windows long), so a greedy client
moves in a sawtooth of period ~samples x window; over a measuring window L the error is up to
(samples - 1) x window / L. With Kafka's default 11 x 1 s that is +-33% over 30 s (bench/quotas.py
shows it); with 2 x 1 s it is ~10% over 10 s at most and much less once requests are small against
the quota (16 KiB batches against 256 KiB/s here).

librdkafka does not delay its own sends on throttle_time_ms (it only reports it: throttle_cb and
the statistics' ``throttle`` window); the broker's mute of the connection for the throttle time
after the response (Kafka's KIP-219 THROTTLED channel state) is what holds it to the quota.
"""
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from kbroker.testing import KBrokerProcess
from tests.broker.kafka_helpers import create_topic
from tests.broker.test_quotas import _alter

QUOTA = 256 * 1024          # bytes/s
RECORD = 1024
WARMUP = 4.0                # s: the start-up burst (one window's worth) is left out
MEASURE = 10.0              # s measured after the warm-up


def _broker():
    return KBrokerProcess(overrides={"quota.window.num": 2, "quota.window.size.seconds": 1,
                                     "num.partitions": 1})


def _rate(events, start, end):
    return sum(n for t, n in events if start <= t < end) / (end - start)


def test_a_producer_over_its_producer_byte_rate_is_held_within_10_percent_and_told_its_throttle():
    with _broker().start() as b:
        topic = "pq-" + uuid.uuid4().hex[:8]
        create_topic(b.bootstrap, topic)
        _alter(b.port, [("client-id", "limited")], {"producer_byte_rate": QUOTA})
        throttles = []
        acked = []                      # (monotonic time of the delivery report, value bytes)
        p = Producer({"bootstrap.servers": b.bootstrap, "client.id": "limited", "acks": 1,
                      "linger.ms": 5, "batch.size": 16384,
                      # a bounded queue: the producer waits on the quota instead of buffering the run
                      "queue.buffering.max.messages": 1000,
                      "throttle_cb": lambda ev: throttles.append(ev.throttle_time * 1000)})   # (s -> ms)
        p.list_topics(topic, timeout=10)
        payload = b"x" * RECORD

        def delivered(err, msg):
            if err is None:
                acked.append((time.monotonic(), len(msg.value())))

        t0 = time.monotonic()
        end = t0 + WARMUP + MEASURE
        while time.monotonic() < end:
            try:
                p.produce(topic, payload, on_delivery=delivered)
            except BufferError:
                p.poll(0.02)
            p.poll(0)
        p.purge()
        p.flush(30)
        del p                           # (closed while the broker is up)
        rate = _rate(acked, t0 + WARMUP, end)
        # the quota is faster than nothing: the client kept sending through the whole window
        print(f"producer: {rate / QUOTA:.3f} of the quota, throttles {len(throttles)} max {max(throttles or [0])} ms")
        assert 0.9 * QUOTA <= rate <= 1.1 * QUOTA, (rate / QUOTA, len(acked))
        assert throttles and max(throttles) > 0, throttles
        # a throttle is at most what one window over quota asks: (O - T) / T * W, W <= 2 windows
        assert max(throttles) <= 2500, max(throttles)


def test_a_consumer_over_its_consumer_byte_rate_is_held_to_it_and_told_its_throttle():
    with _broker().start() as b:
        topic = "cq-" + uuid.uuid4().hex[:8]
        create_topic(b.bootstrap, topic)
        n = int(QUOTA * (WARMUP + MEASURE) * 1.5) // RECORD       # more than the run can read
        # small batches: a fetch answers at least one whole batch, and a batch larger than what the
        # quota admits in its window is throttled (and not counted) on every try, as in Kafka
        loader = Producer({"bootstrap.servers": b.bootstrap, "client.id": "loader", "linger.ms": 20,
                           "batch.size": 16384})
        for _ in range(n):
            while True:
                try:
                    loader.produce(topic, b"y" * RECORD)
                    break
                except BufferError:
                    loader.poll(0.05)
        assert loader.flush(60) == 0
        del loader
        _alter(b.port, [("client-id", "limited")], {"consumer_byte_rate": QUOTA})
        throttles = []
        got = []
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g-" + uuid.uuid4().hex,
                      "client.id": "limited", "enable.auto.commit": False,
                      # fetches small against the quota (see the module docstring)
                      "max.partition.fetch.bytes": 16384,
                      "throttle_cb": lambda ev: throttles.append(ev.throttle_time * 1000)})   # (s -> ms)
        c.assign([TopicPartition(topic, 0, 0)])
        t0 = time.monotonic()
        end = t0 + WARMUP + MEASURE
        while time.monotonic() < end:
            for m in c.consume(500, 0.1):
                if m.error() is None:
                    got.append((time.monotonic(), len(m.value())))
        c.close()
        assert len(got) < n, "the topic ran dry: the consumer was not over its quota"
        rate = _rate(got, t0 + WARMUP, end)
        # Never above the quota. Below it by the round trip of each throttled fetch: Kafka answers
        # a throttled fetch empty (getThrottledResponse) and does not count it, so every ~16 KiB
        # accepted costs one empty fetch and two round trips; measured 0.88-0.95 on 2 busy cores.
        print(f"consumer: {rate / QUOTA:.3f} of the quota, throttles {len(throttles)} max {max(throttles or [0])} ms")
        assert 0.8 * QUOTA <= rate <= 1.1 * QUOTA, (rate / QUOTA, len(got))
        assert throttles and max(throttles) > 0, throttles

"""The high watermark under concurrent acks=all produces to one partition (librdkafka).

Handler threads append to the same partition concurrently; each then proposes the
log end offset it read as the new high watermark. Proposals arriving out of order
must never move it back (Kafka's maybeIncrementHighWatermark): a consumer's
ListOffsets(LATEST) never decreases, every acknowledged offset stays below it, and
no acks=all produce whose records are in the log waits for a high watermark that
already passed them and times out.

A race test: before the fix it failed in 4 runs of 5 here (ListOffsets went back);
test_log_concurrency.py has the deterministic interleaving.
"""
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.broker.kafka_helpers import _topic, create_topic

THREADS = 8
PER_THREAD = 1200
PRODUCE_BUDGET_S = 8.0


def test_concurrent_acks_all_produces_keep_the_high_watermark_monotonic(broker):
    topic = _topic("hw")
    create_topic(broker.bootstrap, topic)
    tp = TopicPartition(topic, 0)
    done = threading.Event()
    failures: list = []
    acked: list[int] = []
    lock = threading.Lock()
    seen_hw: list[int] = []

    def producer(i):
        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                      "enable.idempotence": False, "message.send.max.retries": 0,
                      "request.timeout.ms": 10_000, "message.timeout.ms": 20_000})

        def cb(err, msg):
            with lock:
                if err is not None:
                    failures.append(err)
                else:
                    acked.append(msg.offset())
        deadline = time.monotonic() + PRODUCE_BUDGET_S
        try:
            for n in range(PER_THREAD):
                if time.monotonic() > deadline:
                    break
                p.produce(topic, value=b"%d-%d" % (i, n), partition=0, on_delivery=cb)
                p.poll(0)
                if n % 4 == 3:
                    p.flush(15)     # several requests in flight per producer, not one long batch
            left = p.flush(30)
            if left:
                failures.append(f"producer {i}: {left} undelivered")
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    def poller():
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "hw-poller"})
        try:
            while not done.is_set():
                seen_hw.append(c.get_watermark_offsets(tp, timeout=10, cached=False)[1])
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)
        finally:
            c.close()

    poll_thread = threading.Thread(target=poller, daemon=True)
    poll_thread.start()
    threads = [threading.Thread(target=producer, args=(i,), daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(PRODUCE_BUDGET_S + 60)
    done.set()
    poll_thread.join(20)
    assert not any(t.is_alive() for t in threads + [poll_thread])
    assert not failures, failures[:5]                    # no REQUEST_TIMED_OUT, nothing lost
    assert len(seen_hw) > 5
    assert all(a <= b for a, b in zip(seen_hw, seen_hw[1:])), "ListOffsets(LATEST) went back"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "hw-final"})
    low, final_hw = c.get_watermark_offsets(tp, timeout=10, cached=False)
    c.close()
    assert sorted(acked) == list(range(len(acked)))      # dense: every append acknowledged once
    assert final_hw == len(acked) and max(acked) < final_hw

"""The queue workload with unchanged clients: producers send unique values, a reader reads
every partition to its end afterwards, and :func:`kbroker.chaos.checker.check` judges.

Each producer is a confluent-kafka (librdkafka) Producer, or with ``clients`` naming
``"kbroker"`` for some, a :class:`kbroker.client.Producer`, with acks=all and idempotence,
sending ``b"<producer>:<sequence>"`` to a seeded random partition, paced to spread over
``duration_s``; its delivery reports make the history (acknowledged offset, a definite
failure, or a timeout = unknown). Counts and times are bounded; ``nemesis`` (if given) runs
beside the producers and is stopped, and its faults healed, before the final read.
"""
from __future__ import annotations

import random
import threading
import time

from kbroker.chaos.checker import FAILED, OK, UNKNOWN, Send


def _produce_kbroker(bootstrap, topic, partitions, producer_id, count, duration_s, seed, config, out, lock):
    from kbroker.client import KafkaTimeoutError, Producer

    rnd = random.Random(seed * 7919 + producer_id)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "delivery.timeout.ms": 60000, "request.timeout.ms": 10000,
                  "retry.backoff.ms": 50, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
                  "metadata.max.age.ms": 1000, **(config or {})})
    pause = duration_s / max(1, count)
    sends = []
    slock = threading.Lock()

    def report(seq, part, value):
        def cb(err, md):
            if err is None:
                s = Send(producer_id, seq, value, part, OK, md.offset)
            elif isinstance(err, KafkaTimeoutError) or "timed out" in str(err).lower() \
                    or "expir" in str(err).lower():
                s = Send(producer_id, seq, value, part, UNKNOWN, error=type(err).__name__)
            else:
                s = Send(producer_id, seq, value, part, FAILED, error=type(err).__name__)
            with slock:
                sends.append(s)
        return cb

    t0 = time.monotonic()
    try:
        for seq in range(count):
            part = rnd.randrange(partitions)
            value = b"%d:%d" % (producer_id, seq)
            try:
                p.send(topic, value=value, partition=part, on_delivery=report(seq, part, value))
            except Exception as e:   # metadata or buffer not available within max.block.ms: never sent
                with slock:
                    sends.append(Send(producer_id, seq, value, part, FAILED, error=type(e).__name__))
            lag = t0 + (seq + 1) * pause - time.monotonic()
            if lag > 0:
                time.sleep(lag)
        try:
            p.flush(90)
        except Exception:
            pass
    finally:
        p.close(5)
    with slock:
        done = {s.sequence for s in sends}
        sends += [Send(producer_id, seq, b"%d:%d" % (producer_id, seq), -1, UNKNOWN, error="not reported")
                  for seq in range(count) if seq not in done]
    with lock:
        out.extend(sends)


def _produce(bootstrap, topic, partitions, producer_id, count, duration_s, seed, config, out, lock):
    import confluent_kafka as ck

    rnd = random.Random(seed * 7919 + producer_id)
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 5, "message.timeout.ms": 60000, "retry.backoff.ms": 50,
                     "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
                     "topic.metadata.refresh.interval.ms": 1000, **(config or {})})
    pause = duration_s / max(1, count)
    sends = []

    def report(seq, part, value):
        def cb(err, msg):
            if err is None:
                sends.append(Send(producer_id, seq, value, part, OK, msg.offset()))
            elif err.code() == ck.KafkaError._MSG_TIMED_OUT:
                sends.append(Send(producer_id, seq, value, part, UNKNOWN, error=err.name()))
            else:
                sends.append(Send(producer_id, seq, value, part, FAILED, error=err.name()))
        return cb

    t0 = time.monotonic()
    for seq in range(count):
        part = rnd.randrange(partitions)
        value = b"%d:%d" % (producer_id, seq)
        while True:
            try:
                p.produce(topic, value=value, partition=part, on_delivery=report(seq, part, value))
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
        lag = t0 + (seq + 1) * pause - time.monotonic()
        if lag > 0:
            time.sleep(lag)
    left = p.flush(90)
    if left:
        # never reported within the bound: unknown outcome
        done = {(s.sequence) for s in sends}
        for seq in range(count):
            if seq not in done:
                sends.append(Send(producer_id, seq, b"%d:%d" % (producer_id, seq), -1, UNKNOWN, error="not reported"))
    with lock:
        out.extend(sends)


def read_all(bootstrap, topic, partitions, timeout_s: float = 60.0) -> dict:
    """{partition: [(offset, value)]} from the log start to the high watermark."""
    import confluent_kafka as ck

    def consumer():
        return ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-reader-{random.random()}",
                            "enable.auto.commit": False, "auto.offset.reset": "earliest",
                            "isolation.level": "read_uncommitted"})

    c = consumer()
    try:
        deadline = time.monotonic() + timeout_s
        ends = {}
        for p in range(partitions):
            while True:
                try:
                    ends[p] = c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=5)[1]
                    break
                except ck.KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    # librdkafka answers "Unknown partition" from its own metadata cache, which a
                    # broker that had not yet applied a leadership record can leave stale for
                    # minutes: ask again with a fresh client
                    c.close()
                    c = consumer()
                    time.sleep(0.2)
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(partitions)])
        out = {p: [] for p in range(partitions)}
        pos = {p: 0 for p in range(partitions)}
        while any(pos[p] < ends[p] for p in range(partitions)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read did not reach the end: {pos} of {ends}")
            for m in c.consume(1000, 1.0):
                if m.error():
                    continue
                out[m.partition()].append((m.offset(), m.value()))
                pos[m.partition()] = m.offset() + 1
        return out
    finally:
        c.close()


def run_queue_workload(bootstrap: str, topic: str, partitions: int, *, producers: int = 3,
                       records_per_producer: int = 1000, duration_s: float = 15.0, seed: int = 0,
                       nemesis=None, producer_config: dict | None = None, read_bootstrap: str | None = None,
                       clients=("confluent",)):
    """(sends, reads, nemesis log). Producer i uses ``clients[i % len(clients)]``
    (``"confluent"`` or ``"kbroker"``)."""
    sends: list = []
    lock = threading.Lock()
    fns = {"confluent": _produce, "kbroker": _produce_kbroker}
    threads = [threading.Thread(target=fns[clients[i % len(clients)]], args=(bootstrap, topic, partitions, i, records_per_producer,
                                                       duration_s, seed, producer_config, sends, lock), daemon=True)
               for i in range(producers)]
    stop = threading.Event()
    nt = None
    if nemesis is not None:
        nt = threading.Thread(target=nemesis.run, args=(stop,), daemon=True)
        nt.start()
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join(duration_s + 150)
    finally:
        stop.set()
        if nt is not None:
            nt.join(60)
    reads = read_all(read_bootstrap or bootstrap, topic, partitions)
    return sends, reads, (nemesis.log if nemesis is not None else [])

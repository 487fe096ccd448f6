"""Producer / consumer throughput of kbroker.client vs confluent-kafka (librdkafka) and
kafka-python, against the same broker in the same run.

Workload: 100-byte values, no keys, acks=all, linger.ms=5, one partition; each
producer run writes its own fresh topic, then each consumer reads the topic librdkafka
wrote (assign-based, from offset 0). Each run is bounded by --records and --seconds.

Producers, run alternately in every round (the machine is shared and noisy):
  rdkafka        librdkafka defaults (batch.size 1000000, max.in.flight 1000000)
  ours           kbroker.client defaults = Kafka's (batch.size 16384, max.in.flight 5)
  rdkafka_16k    librdkafka at batch.size=16384 (our default: equal batching)
  ours_batch1m   ours at batch.size=1000000 (librdkafka's default: equal batching)
  kafka-python   its defaults (batch_size 16384), --kafka-python-records records
Reports the median records/s per client and the median over rounds of each round's
ratio (ours / theirs measured back to back), as JSON.

    python bench/system/client_throughput.py --broker kbroker    # python -m kbroker serve
    python bench/system/client_throughput.py                     # Tansu
    python bench/system/client_throughput.py --bootstrap host:port
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

VALUE = b"x" * 100


def ours_produce(bootstrap, topic, n, seconds, batch_size=16384):
    from kbroker.client import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": batch_size})
    p.partitions_for(topic)
    send = p.send
    t0 = time.perf_counter()
    end = t0 + seconds
    i = 0
    while i < n:
        for _ in range(1000):
            send(topic, VALUE, partition=0)
        i += 1000
        if time.perf_counter() > end:
            break
    p.flush(60)
    dt = time.perf_counter() - t0
    p.close(10)
    return i, dt


def rdkafka_produce(bootstrap, topic, n, seconds, batch_size=None):
    import confluent_kafka
    conf = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": False}
    if batch_size is not None:
        conf["batch.size"] = batch_size
    p = confluent_kafka.Producer(conf)
    p.produce(topic, VALUE, partition=0)
    p.flush(30)
    produce, poll = p.produce, p.poll
    t0 = time.perf_counter()
    end = t0 + seconds
    i = 0
    while i < n:
        for _ in range(1000):
            while True:
                try:
                    produce(topic, VALUE, partition=0)
                    break
                except BufferError:      # queue.buffering.max.messages reached: let it drain
                    poll(0.01)
        poll(0)
        i += 1000
        if time.perf_counter() > end:
            break
    p.flush(60)
    return i, time.perf_counter() - t0


def kafka_python_produce(bootstrap, topic, n, seconds):
    import kafka
    p = kafka.KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    p.partitions_for(topic)
    t0 = time.perf_counter()
    end = t0 + seconds
    i = 0
    while i < n:
        for _ in range(1000):
            p.send(topic, VALUE, partition=0)
        i += 1000
        if time.perf_counter() > end:
            break
    p.flush(60)
    dt = time.perf_counter() - t0
    p.close(10)
    return i, dt


def ours_consume(bootstrap, topic, n, seconds):
    from kbroker.client import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0)])
    c.seek(TopicPartition(topic, 0), 0)
    got = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while got < n and time.perf_counter() < end:
        got += len(c.poll(1.0))
    dt = time.perf_counter() - t0
    c.close()
    return got, dt


def rdkafka_consume(bootstrap, topic, n, seconds):
    import confluent_kafka
    # fetch.queue.backoff.ms=10 as bench/clients/confluent.py: librdkafka's 1,000 ms default
    # pause after each full local queue would measure its pacing, not the broker
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-rd",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  "fetch.queue.backoff.ms": 10})
    c.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while got < n and time.perf_counter() < end:
        msgs = c.consume(500, 1.0)
        got += sum(1 for m in msgs if m.error() is None)
    dt = time.perf_counter() - t0
    c.close()
    return got, dt


def create_topics(bootstrap, names):
    from kbroker.client import Admin, NewTopic
    with Admin({"bootstrap.servers": bootstrap}) as a:
        a.create_topics([NewTopic(n, 1, 1) for n in names], timeout=30)


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def run(bootstrap, records, seconds, kp_records, repeat):
    """``repeat`` rounds; in each, every producer runs once (alternating ours and
    librdkafka), then the consumers alternate. Ratios are taken within a round, between
    runs made back to back, and the median over rounds is reported."""
    tag = str(int(time.time() * 1000))
    producers = (
        ("rdkafka", rdkafka_produce, records),                                  # its defaults
        ("ours", ours_produce, records),                                        # ours (Kafka's)
        ("rdkafka_16k", lambda b, t, n, s: rdkafka_produce(b, t, n, s, 16384), records),
        ("ours_batch1m", lambda b, t, n, s: ours_produce(b, t, n, s, 1000000), records),
        ("kafka-python", kafka_python_produce, kp_records),
    )
    topics = {f"{name}-{r}": f"bench-{name}-{r}-{tag}" for name, _, _ in producers for r in range(repeat)}
    create_topics(bootstrap, list(topics.values()))
    rates: dict[str, list[float]] = {}
    for r in range(repeat):
        for name, fn, n in producers:
            cnt, dt = fn(bootstrap, topics[f"{name}-{r}"], n, seconds)
            rates.setdefault(f"produce_{name}", []).append(cnt / dt)
    consumed = {}
    for r in range(repeat):
        for name, fn in (("ours", ours_consume), ("rdkafka", rdkafka_consume)):
            cnt, dt = fn(bootstrap, topics["rdkafka-0"], records, seconds)
            rates.setdefault(f"consume_{name}", []).append(cnt / dt)
            consumed[name] = cnt

    def ratio(a, b):
        return round(_median([x / y for x, y in zip(rates[a], rates[b])]), 3)
    res = {k: round(_median(v)) for k, v in rates.items()}
    res["rounds"] = repeat
    res["consume_records"] = consumed
    res["produce_ratio_defaults"] = ratio("produce_ours", "produce_rdkafka")
    res["produce_ratio_equal_batch16k"] = ratio("produce_ours", "produce_rdkafka_16k")
    res["produce_ratio_equal_batch1m"] = ratio("produce_ours_batch1m", "produce_rdkafka")
    res["produce_ratio_vs_kafka_python"] = ratio("produce_ours", "produce_kafka-python")
    res["consume_ratio_vs_rdkafka"] = ratio("consume_ours", "consume_rdkafka")
    res["raw"] = {k: [round(x) for x in v] for k, v in rates.items()}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", choices=("tansu", "kbroker"), default="tansu")
    ap.add_argument("--bootstrap")
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--kafka-python-records", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    from kbroker.testing import KBrokerProcess, TansuProcess
    if args.bootstrap:
        res = run(args.bootstrap, args.records, args.seconds, args.kafka_python_records, args.repeat)
    else:
        with (TansuProcess() if args.broker == "tansu" else KBrokerProcess()).start() as b:
            res = run(b.bootstrap, args.records, args.seconds, args.kafka_python_records, args.repeat)
    res = {"broker": args.bootstrap or args.broker, "value_bytes": len(VALUE), "acks": "all",
           "partitions": 1, **res}
    out = json.dumps(res, indent=2)
    print(out)
    if args.json:
        with open(args.json, "w") as f:
            f.write(out)


if __name__ == "__main__":
    main()

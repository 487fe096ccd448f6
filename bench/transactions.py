"""Transactions: what a transaction costs (issue 17's speed section), one kbroker, one client.

Workloads (librdkafka via confluent-kafka, 1 partition, 100-byte values, linger.ms=5,
acks=all, idempotence on in both modes):

* ``idempotent``: N records produced and flushed — the baseline (after a warm-up record:
  connections, metadata and the producer id are not measured, in either mode);
* ``txn_<k>``: the same N records in transactions of k records (begin, k produces,
  commit), for k in --sizes; throughput in records/s and the ratio to the baseline;
* ``commit latency``: per transaction, commit_transaction()'s duration (EndTxn written,
  markers out and complete before the next AddPartitionsToTxn succeeds) — p50/p99;
* ``consume``: N committed records read from offset 0 with read_committed vs
  read_uncommitted (records/s).

Needs both halves of issue 17 (the coordinator and the partition leaders' markers/LSO).

    flock /tmp/kbroker-bench.lock python bench/transactions.py [--records 20000] [--sizes 1,100,10000]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

VALUE = b"x" * 100


def _producer(bootstrap, tid=None):
    from confluent_kafka import Producer
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True,
            "log_level": 3}
    if tid:
        conf["transactional.id"] = tid
    return Producer(conf)


def _topic(bootstrap, tag):
    from confluent_kafka.admin import AdminClient, NewTopic
    name = f"bt-{tag}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)  # admin stays alive until done
    return name


def idempotent(bootstrap, n):
    topic = _topic(bootstrap, "idem")
    p = _producer(bootstrap)
    p.produce(topic, VALUE, partition=0)  # warm-up: connections, metadata, producer id
    assert p.flush(30) == 0
    t0 = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, VALUE, partition=0)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    assert p.flush(60) == 0
    return n / (time.perf_counter() - t0), topic


def transactional(bootstrap, n, k):
    topic = _topic(bootstrap, f"txn{k}")
    p = _producer(bootstrap, "bt-" + uuid.uuid4().hex[:8])
    p.init_transactions(30)
    p.begin_transaction()  # warm-up: connections, metadata, the partition's leader
    p.produce(topic, VALUE, partition=0)
    p.commit_transaction(30)
    commits = []
    t0 = time.perf_counter()
    left = n
    while left > 0:
        m = min(k, left)
        p.begin_transaction()
        for _ in range(m):
            while True:
                try:
                    p.produce(topic, VALUE, partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
            p.poll(0)
        c0 = time.perf_counter()
        p.commit_transaction(60)
        commits.append(time.perf_counter() - c0)
        left -= m
    return n / (time.perf_counter() - t0), commits, topic


def consume(bootstrap, topic, n, isolation):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bt-" + uuid.uuid4().hex, "log_level": 3,
                  "enable.auto.commit": False, "isolation.level": isolation})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    t0 = time.perf_counter()
    deadline = t0 + 120
    while got < n and time.perf_counter() < deadline:
        for m in c.consume(1000, 0.5):
            if m.error() is None:
                got += 1
    dt = time.perf_counter() - t0
    c.close()
    return got / dt


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--sizes", default="1,100,10000")
    ap.add_argument("--bootstrap", default=None, help="an already running broker (else one is started)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker config of the started broker, e.g. "
                         "transaction.partition.verification.enable=false (KIP-890 verification off)")
    args = ap.parse_args()
    target = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from bench.common import start_kbroker
        target = start_kbroker({"num.partitions": 1, **dict(o.split("=", 1) for o in args.override)})
        bootstrap = target.bootstrap
    try:
        out = {"records": args.records, "overrides": args.override}
        base, base_topic = idempotent(bootstrap, args.records)
        out["idempotent_records_per_s"] = round(base)
        txn_topic = None
        for k in (int(x) for x in args.sizes.split(",")):
            n = min(args.records, max(k, 1) * 2000)  # transactions of 1 record: at most 2000 of them
            rate, commits, topic = transactional(bootstrap, n, k)
            txn_topic = txn_topic or topic
            out[f"txn_{k}"] = {"records": n, "records_per_s": round(rate), "vs_idempotent": round(rate / base, 3),
                               "commit_ms_p50": round(statistics.median(commits) * 1000, 2),
                               "commit_ms_p99": round(_pct(commits, 0.99) * 1000, 2)}
        big = transactional(bootstrap, args.records, args.records)[2]
        out["consume_read_uncommitted_per_s"] = round(consume(bootstrap, big, args.records, "read_uncommitted"))
        out["consume_read_committed_per_s"] = round(consume(bootstrap, big, args.records, "read_committed"))
        out["consume_committed_vs_uncommitted"] = round(
            out["consume_read_committed_per_s"] / out["consume_read_uncommitted_per_s"], 3)
        print(json.dumps(out, indent=2))
    finally:
        if target is not None:
            target.stop()


if __name__ == "__main__":
    main()

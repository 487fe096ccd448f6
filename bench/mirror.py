"""MirrorMaker 2 throughput and replication latency: ``kbroker mirror`` against a plain
consume+produce copy loop with confluent-kafka (librdkafka) at the same settings.

    flock /tmp/kbroker-bench.lock python -m bench.mirror
    flock /tmp/kbroker-bench.lock python -m bench.mirror --records 100000 --rate 2000 --duration 10

Two zero-config kbroker brokers (A, B) on 127.0.0.1. For each record size (100 B, 1 KiB):

* throughput: ``--records`` records (keys, 4 partitions) are preloaded into A; the copier
  then copies them to B; records/s and MB/s between 10 % and 90 % of them on B (start-up
  and tail excluded). The reference copies with one confluent-kafka Consumer
  (assign, from the beginning) and one Producer (same partition, key, value, headers,
  timestamp), both at linger.ms=5, acks=all, idempotence on: kbroker.client's defaults,
  which the mirror uses.
* exactly once: the same runs with ``kind = mirror-eos`` (``exactly.once.source.support =
  enabled``, read_committed source consumer, a transaction per poll); B's progress is then
  its last stable offset (read_committed ListOffsets, which counts one commit marker per
  partition per transaction: a slight overcount) and the latency reader is read_committed.
* latency: while a copier runs, a producer writes ``--rate`` records/s for ``--duration`` s
  to an A topic with message.timestamp.type=LogAppendTime; the copied timestamp is A's
  append time, and a confluent-kafka consumer on B records receipt time minus it
  (A append -> readable on B, including B's fetch wait); p50 / p99 in ms.

Every phase is bounded in records and time; the brokers and the mirror are child
processes stopped by PID.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import KBrokerProcess

PARTITIONS = 4
CLIENT = {"linger.ms": 5, "acks": "all", "enable.idempotence": True}
PHASE_TIMEOUT_S = 180.0


def _create(bootstrap: str, topic: str, configs: dict | None = None) -> None:
    from confluent_kafka import KafkaError, KafkaException

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=configs or {})],
                                 request_timeout=60).values():
        try:
            f.result(60)
        except KafkaException as e:      # a slow broker: librdkafka retried a request that did succeed
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def _preload(bootstrap: str, topic: str, n: int, size: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, **CLIENT})
    value = os.urandom(size)
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, f"key-{i % 1000}".encode(), partition=i % PARTITIONS,
                          headers=[("h", b"1")])
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def _end_total(c, topic: str) -> int:
    if not isinstance(c, Consumer):           # kbroker.client, read_committed: last stable offsets
        from kbroker.client import TopicPartition as KTP

        try:
            return sum(c.end_offsets([KTP(topic, p) for p in range(PARTITIONS)], timeout=5).values())
        except Exception:
            return 0
    total = 0
    for p in range(PARTITIONS):
        try:
            total += c.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)[1]
        except Exception:
            return 0
    return total


def _watch(bootstrap: str, topic: str, n: int, lo: float = 0.1, hi: float = 0.9,
           committed: bool = False) -> tuple[float, float]:
    """Wall-clock times when B holds ``lo`` and ``hi`` of the n records (start-up and the
    tail excluded; polled every 10 ms); ``committed``: records of committed transactions."""
    # the mirror creates the topic after this starts watching: refresh metadata often, or
    # librdkafka keeps the topic unknown for topic.metadata.refresh.interval.ms (5 min)
    if committed:
        from kbroker.client import Consumer as KConsumer

        c = KConsumer({"bootstrap.servers": bootstrap, "isolation.level": "read_committed",
                       "allow.auto.create.topics": False, "metadata.max.age.ms": 200})
    else:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-mirror-watch",
                      "topic.metadata.refresh.interval.ms": 200})
    t_lo = None
    deadline = time.time() + PHASE_TIMEOUT_S
    try:
        while time.time() < deadline:
            got = _end_total(c, topic)
            now = time.time()
            if t_lo is None and got >= max(1, lo * n):
                t_lo, n_lo = now, got
            if got >= hi * n:
                return t_lo, now, got - n_lo
            time.sleep(0.01)
    finally:
        c.close()
    raise TimeoutError(f"{topic}: not {hi:.0%} of {n} records on B within {PHASE_TIMEOUT_S}s")


class CopyLoop:
    """The reference: a confluent-kafka consume+produce loop, A -> B."""

    def __init__(self, a: str, b: str, topic: str, remote: str):
        self.a, self.b, self.topic, self.remote = a, b, topic, remote
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _run(self):
        c = Consumer({"bootstrap.servers": self.a, "group.id": "bench-copy", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest"})
        c.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
        p = Producer({"bootstrap.servers": self.b, **CLIENT})
        while not self.stop.is_set():
            for m in c.consume(500, 0.1):
                if m.error():
                    continue
                while True:
                    try:
                        p.produce(self.remote, m.value(), m.key(), partition=m.partition(),
                                  timestamp=m.timestamp()[1], headers=m.headers())
                        break
                    except BufferError:
                        p.poll(0.05)
            p.poll(0)
        p.flush(30)
        c.close()

    def close(self):
        self.stop.set()
        self.thread.join(60)


class Mirror:
    def __init__(self, a: str, b: str, topic: str, workdir: str, exactly_once: bool = False):
        self.conf = os.path.join(workdir, f"mm2-{topic}.properties")
        props = {"clusters": "A, B", "A.bootstrap.servers": a, "B.bootstrap.servers": b, "A->B.enabled": "true",
                 "A->B.topics": topic, "replication.factor": 1, "offset-syncs.topic.replication.factor": 1,
                 "checkpoints.topic.replication.factor": 1, "heartbeats.topic.replication.factor": 1,
                 "offset.flush.interval.ms": 5000}
        if exactly_once:
            props.update({"exactly.once.source.support": "enabled", "A.consumer.isolation.level": "read_committed",
                          "offset.storage.replication.factor": 1})
        with open(self.conf, "w") as f:
            f.write("".join(f"{k} = {v}\n" for k, v in props.items()))
        self.log = open(os.path.join(workdir, f"mirror-{topic}.log"), "wb")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "kbroker", "mirror", "--config", self.conf],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def throughput(kind: str, a: str, b: str, size: int, n: int, workdir: str) -> dict:
    topic = f"tput-{kind}-{size}"
    remote = f"A.{topic}"
    _create(a, topic)
    _preload(a, topic, n, size)
    if kind == "reference":
        _create(b, remote)
        copier = CopyLoop(a, b, topic, remote).start()
    else:
        copier = Mirror(a, b, topic, workdir, kind == "mirror-eos").start()
    try:
        first, last, copied = _watch(b, remote, n, committed=kind == "mirror-eos")
    finally:
        copier.close()
    secs = max(last - first, 1e-6)
    return {"records_per_s": copied / secs, "mb_per_s": copied * size / secs / 1e6, "seconds": secs}


def latency(kind: str, a: str, b: str, size: int, rate: float, duration: float, workdir: str) -> dict:
    topic = f"lat-{kind}-{size}"
    remote = f"A.{topic}"
    _create(a, topic, {"message.timestamp.type": "LogAppendTime"})
    if kind == "reference":
        _create(b, remote)
        copier = CopyLoop(a, b, topic, remote).start()
    else:
        copier = Mirror(a, b, topic, workdir, kind == "mirror-eos").start()
    # wait for the copier: one record through
    p = Producer({"bootstrap.servers": a, **CLIENT})
    p.produce(topic, b"warmup", partition=0)
    p.flush(30)
    _watch(b, remote, 1, lo=1.0, hi=1.0, committed=kind == "mirror-eos")
    c = Consumer({"bootstrap.servers": b, "group.id": f"bench-lat-{kind}-{size}", "auto.offset.reset": "latest",
                  "fetch.wait.max.ms": 10,
                  "isolation.level": "read_committed" if kind == "mirror-eos" else "read_uncommitted"})
    c.assign([TopicPartition(remote, q, 1 if q == 0 else 0) for q in range(PARTITIONS)])
    lat = []
    n = int(rate * duration)
    value = os.urandom(size)
    stop = threading.Event()

    def consume():
        while not stop.is_set() or len(lat) < n:
            for m in c.consume(500, 0.1):
                if not m.error():
                    lat.append(time.time() * 1000 - m.timestamp()[1])
            if stop.is_set() and time.time() > stop_at[0]:
                break
    stop_at = [float("inf")]
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    start = time.time()
    for i in range(n):
        due = start + i / rate
        d = due - time.time()
        if d > 0:
            time.sleep(d)
        p.produce(topic, value, f"k{i}".encode(), partition=i % PARTITIONS)
        p.poll(0)
    p.flush(30)
    stop_at[0] = time.time() + 30
    stop.set()
    t.join(40)
    c.close()
    copier.close()
    arr = np.array(lat)
    return {"records": len(arr), "p50_ms": float(np.percentile(arr, 50)) if len(arr) else None,
            "p99_ms": float(np.percentile(arr, 99)) if len(arr) else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.mirror", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=None,
                    help="records per throughput run (default: 30 MB worth, at least 100,000)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1024])
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s for the latency runs")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of the latency runs")
    ap.add_argument("--kinds", nargs="+", default=["reference", "mirror", "mirror-eos"],
                    choices=["reference", "mirror", "mirror-eos"],
                    help="copiers to run (mirror-eos: exactly.once.source.support = enabled)")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--workdir", help="keep mirror configs and logs here (default: a temporary directory)")
    args = ap.parse_args(argv)
    out = {"throughput": {}, "latency": {}}
    with (contextlib.nullcontext(args.workdir) if args.workdir else
          tempfile.TemporaryDirectory(prefix="bench-mirror-")) as workdir, \
            KBrokerProcess(overrides={"num.partitions": 1}).start() as a, \
            KBrokerProcess(overrides={"num.partitions": 1}).start() as b:
        # latency first, on fresh brokers (the throughput runs leave 100s of MB behind)
        size = args.sizes[0]
        for kind in args.kinds:
            r = latency(kind, a.bootstrap, b.bootstrap, size, args.rate, args.duration, workdir)
            out["latency"][kind] = r
            print(f"latency {kind:10} at {args.rate:.0f}/s: p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms "
                  f"({r['records']} records)", flush=True)
        ref = out["latency"].get("reference")
        for kind in ("mirror", "mirror-eos"):
            m = out["latency"].get(kind)
            if ref and m and m["p50_ms"] and ref["p50_ms"]:
                print(f"  {kind} / reference latency: p50 {m['p50_ms'] / ref['p50_ms']:.2f}  "
                      f"p99 {m['p99_ms'] / ref['p99_ms']:.2f}", flush=True)
        for size in args.sizes:
            for kind in args.kinds:
                n = args.records or max(100_000, 30_000_000 // size)
                r = throughput(kind, a.bootstrap, b.bootstrap, size, n, workdir)
                out["throughput"][f"{kind}-{size}"] = r
                print(f"throughput {kind:10} {size:5} B: {r['records_per_s']:10.0f} records/s "
                      f"{r['mb_per_s']:7.2f} MB/s", flush=True)
            t = {k: out["throughput"].get(f"{k}-{size}", {}).get("records_per_s") for k in args.kinds}
            for num, den in (("mirror", "reference"), ("mirror-eos", "reference"), ("mirror-eos", "mirror")):
                if t.get(num) and t.get(den):
                    print(f"  {num} / {den} at {size} B: {t[num] / t[den]:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replication on 3 brokers (issue 16, "Speed"): the cost of RF 3, latency, failover.

    python -m bench.replication --json /tmp/repl.json                # everything, ~3-5 min
    python -m bench.replication --phases throughput --duration 5
    python -m bench.replication --phases failover,shutdown --kills 20 --shutdowns 5
    python -m bench.replication --phases throughput --inter-broker-security SASL_SSL

Starts a KRaft cluster of real processes (``kbroker.chaos.cluster.ChaosCluster`` with
``links=False``: 1 controller + 3 brokers on 127.0.0.1, no proxy on the replication path)
on a temporary directory, stopped by PID at the end. One confluent-kafka (librdkafka)
producer with acks=all and idempotence. Phases:

1. ``throughput``: for each record size (``--sizes``, default 100 B and 1 KiB), a topic of
   3 partitions with RF 1 and one with RF 3 (min.insync.replicas=2), produced at the
   client's maximum rate for ``--duration`` s each, alternating RF 1 / RF 3 in ``--rounds``
   rounds: acknowledged records/s and MB/s; the RF 3 / RF 1 ratio is the cost of replication.
2. ``latency``: RF 3, ``--latency-size`` records at ``--rate`` records/s for ``--duration``
   s: publish latency (send -> acks=all delivery report) and end-to-end latency (send ->
   a consumer's receipt; the first 8 bytes of each value are the send time), p50/p99/p99.9.
   Anchor (bench/data, Apache Kafka on 3 x i3en.2xlarge, RF 3, acks=all, 1 KiB at 200k
   msg/s): publish p99 4.3 ms, end-to-end p99 5.4 ms.
3. ``failover``: one partition (RF 3, min ISR 2) under a steady ``--failover-rate`` load;
   ``--kills`` times: SIGKILL its leader and time until the producer's first successful
   delivery after the kill (necessarily from the new leader), restart the broker and wait
   until the ISR is full again. p50/p99/max. Dominated by ``broker.session.timeout.ms``
   (``--session-timeout-ms``; the controller fences the dead broker, then elects).
4. ``shutdown``: ``--shutdowns`` times: SIGTERM the leader under the same load (controlled
   shutdown moves leadership first), count failed deliveries (target 0) and the longest
   gap between successful deliveries; restart and wait for a full ISR.

Every wait has a deadline (``--max-wait``); the summary and per-event samples go to
``--json`` (default bench/results/replication-<time>.json).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import tempfile
import threading
import time

import numpy as np

from kbroker.chaos.cluster import ChaosCluster

ANCHOR = {"source": "bench/data (Apache Kafka, 3 x i3en.2xlarge, RF 3, acks=all, 1 KiB, 200k msg/s)",
          "publish_p99_ms": 4.3, "e2e_p99_ms": 5.4}


def _pct(values, qs=(50, 99, 99.9)) -> dict:
    if not len(values):
        return {}
    a = np.asarray(values, dtype=float)
    return {f"p{q:g}": round(float(np.percentile(a, q)), 3) for q in qs} | {"max": round(float(a.max()), 3),
                                                                            "n": int(len(a))}


def _producer(c, **extra):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True,
                     "linger.ms": 5, "message.timeout.ms": 60000, "retry.backoff.ms": 20,
                     "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200,
                     "topic.metadata.refresh.interval.ms": 1000, **extra})


# -- 1. throughput ---------------------------------------------------------------------------------
def throughput(c, topic: str, size: int, duration_s: float) -> dict:
    p = _producer(c, **{"linger.ms": 10, "batch.size": 262144, "queue.buffering.max.kbytes": 65536})
    acked = [0]
    errors = [0]

    def cb(err, _m):
        if err is None:
            acked[0] += 1
        else:
            errors[0] += 1
    payload = os.urandom(size)
    t0 = time.monotonic()
    end = t0 + duration_s
    i = 0
    while time.monotonic() < end:
        for _ in range(256):
            try:
                p.produce(topic, value=payload, partition=i % 3, on_delivery=cb)
                i += 1
            except BufferError:
                p.poll(0.005)
                break
        p.poll(0)
    p.flush(60)
    dt = time.monotonic() - t0
    return {"records_s": round(acked[0] / dt), "mb_s": round(acked[0] * size / dt / 1e6, 2),
            "acked": acked[0], "errors": errors[0], "seconds": round(dt, 2)}


# -- 2. latency -------------------------------------------------------------------------------------
def latency(c, topic: str, size: int, rate: float, duration_s: float) -> dict:
    from confluent_kafka import Consumer, TopicPartition

    cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"lat-{time.time()}", "enable.auto.commit": False,
                     "fetch.wait.max.ms": 100, "fetch.min.bytes": 1})
    cons.assign([TopicPartition(topic, i, 0) for i in range(3)])   # a fresh topic: from the start
    e2e: list = []
    stop = threading.Event()

    def consume():
        while not stop.is_set():
            m = cons.poll(0.1)          # one at a time: consume(n, t) waits for n records or t
            if m is not None and not m.error():
                e2e.append((time.time_ns() - struct.unpack_from("<q", m.value())[0]) / 1e6)
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    p = _producer(c, **{"linger.ms": 0})
    pub: list = []
    errors = [0]
    tail = os.urandom(max(0, size - 8))

    def report(t_send):
        def cb(err, _m):
            if err is None:
                pub.append((time.monotonic() - t_send) * 1e3)
            else:
                errors[0] += 1
        return cb
    # warm-up, untimed: metadata, connections, producer id, the consumer's positions
    for i in range(300):
        p.produce(topic, value=struct.pack("<q", time.time_ns()) + tail, partition=i % 3)
        p.poll(0.003)
    p.flush(30)
    deadline = time.monotonic() + 20
    while len(e2e) < 300 and time.monotonic() < deadline:
        time.sleep(0.05)
    e2e.clear()
    t0 = time.monotonic()
    n = int(rate * duration_s)
    for i in range(n):
        due = t0 + i / rate
        while True:
            lag = due - time.monotonic()
            if lag <= 0:
                break
            p.poll(min(lag, 0.001))
        p.produce(topic, value=struct.pack("<q", time.time_ns()) + tail, partition=i % 3,
                  on_delivery=report(time.monotonic()))
        p.poll(0)
    p.flush(60)
    deadline = time.monotonic() + 20
    while len(e2e) < len(pub) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(5)
    cons.close()
    return {"rate": rate, "size": size, "sent": n, "errors": errors[0], "publish_ms": _pct(pub), "e2e_ms": _pct(e2e)}


# -- 3./4. failover and controlled shutdown ----------------------------------------------------------
class SteadyLoad:
    """A producer thread at ``rate`` records/s to partition 0 of ``topic``; ``oks`` are
    (send time, report time) of successful deliveries, ``errors`` the report times of
    failed ones (time.monotonic)."""

    def __init__(self, c, topic: str, rate: float):
        self.p = _producer(c, **{"linger.ms": 0})
        self.topic, self.rate = topic, rate
        self.oks: list = []
        self.errors: list = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _report(self, t_send):
        def cb(err, _m):
            if err is None:
                self.oks.append((t_send, time.monotonic()))
            else:
                self.errors.append(time.monotonic())
        return cb

    def _run(self):
        i = 0
        t0 = time.monotonic()
        while not self.stop.is_set():
            due = t0 + i / self.rate
            lag = due - time.monotonic()
            if lag > 0:
                self.p.poll(min(lag, 0.002))
                continue
            try:
                self.p.produce(self.topic, value=b"%d" % i, partition=0, on_delivery=self._report(time.monotonic()))
                i += 1
            except BufferError:
                self.p.poll(0.01)
            self.p.poll(0)
        self.p.flush(60)

    def first_ok_after(self, t: float, timeout_s: float) -> float | None:
        """The report time of the first successful delivery of a record sent after ``t``
        (a report of an earlier record may still arrive late from the old leader)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [done for sent, done in self.oks[-5000:] if sent > t]
            if later:
                return min(later)
            time.sleep(0.005)
        return None


def _full_isr(c, topic, timeout_s):
    c.wait(lambda: len(c.metadata(topic)[0][3]) == 3 and c.metadata(topic)[0][0] in c.broker_ids,
           timeout_s, "a full ISR")


def failover(c, topic: str, kills: int, rate: float, max_wait: float) -> dict:
    load = SteadyLoad(c, topic, rate)
    load.t.start()
    samples, misses = [], 0
    try:
        for k in range(kills):
            _full_isr(c, topic, max_wait)
            time.sleep(0.5)
            victim = c.leader(topic, 0)
            t_kill = time.monotonic()
            c.kill(victim)
            ok = load.first_ok_after(t_kill, max_wait)
            if ok is None:
                misses += 1
            else:
                samples.append((ok - t_kill) * 1e3)
            print(f"kill {k + 1}/{kills}: broker {victim}, first delivery after "
                  f"{'-' if ok is None else f'{(ok - t_kill) * 1e3:.0f} ms'}", flush=True)
            c.start(victim)
    finally:
        load.stop.set()
        load.t.join(90)
    return {"kills": kills, "rate": rate, "first_success_ms": _pct(samples, (50, 99)), "no_success_within_max_wait": misses,
            "delivery_errors": len(load.errors), "samples_ms": [round(x) for x in samples]}


def shutdown(c, topic: str, shutdowns: int, rate: float, max_wait: float) -> dict:
    load = SteadyLoad(c, topic, rate)
    load.t.start()
    gaps, errors = [], []
    try:
        for k in range(shutdowns):
            _full_isr(c, topic, max_wait)
            time.sleep(0.5)
            victim = c.leader(topic, 0)
            e0 = len(load.errors)
            t0 = time.monotonic()
            rc = c.terminate(victim, timeout_s=max_wait)
            load.first_ok_after(time.monotonic(), max_wait)
            time.sleep(1.0)
            oks = sorted(done for _, done in load.oks[-5000:] if done >= t0 - 0.5)
            gap = max((b - a for a, b in zip(oks, oks[1:])), default=float("nan")) * 1e3
            gaps.append(gap)
            errors.append(len(load.errors) - e0)
            print(f"SIGTERM {k + 1}/{shutdowns}: broker {victim} exited {rc}, failed deliveries "
                  f"{errors[-1]}, longest gap {gap:.0f} ms", flush=True)
            c.start(victim)
    finally:
        load.stop.set()
        load.t.join(90)
    return {"shutdowns": shutdowns, "rate": rate, "failed_deliveries": sum(errors), "per_shutdown_errors": errors,
            "longest_gap_ms": _pct(gaps, (50, 99)), "samples_gap_ms": [round(x) for x in gaps]}


def _inter_broker_security(protocol: str, base_dir: str) -> dict:
    """Broker settings that put the REPLICATION (inter-broker) listener on ``protocol``: a CA
    and a certificate for 127.0.0.1 made under ``base_dir`` (tests.security.certs), PLAIN with
    the JAAS user ``broker`` for SASL_SSL."""
    if protocol == "PLAINTEXT":
        return {}
    from tests.security.certs import TestPKI

    os.makedirs(os.path.join(base_dir, "pki"))
    pki = TestPKI(os.path.join(base_dir, "pki"))
    out = {"listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,REPLICATION:{protocol},CONTROLLER:PLAINTEXT",
           "listener.name.replication.ssl.keystore.type": "PEM",
           "listener.name.replication.ssl.keystore.location": pki.server["keystore"],
           "listener.name.replication.ssl.truststore.type": "PEM",
           "listener.name.replication.ssl.truststore.location": pki.ca_file}
    if protocol == "SASL_SSL":
        out |= {"sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "listener.name.replication.plain.sasl.jaas.config":
                    'org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
                    'password="broker-secret" user_broker="broker-secret";'}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", default="throughput,latency,failover,shutdown")
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rate", type=float, default=2000.0, help="latency phase: records/s")
    ap.add_argument("--latency-size", type=int, default=1024)
    ap.add_argument("--latency-rf", type=int, default=3, help="latency phase: replication factor (1: the baseline)")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--shutdowns", type=int, default=5)
    ap.add_argument("--failover-rate", type=float, default=500.0)
    ap.add_argument("--session-timeout-ms", type=int, default=2000)
    ap.add_argument("--max-wait", type=float, default=60.0)
    ap.add_argument("--broker-config", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker/controller setting for every node (repeatable)")
    ap.add_argument("--inter-broker-security", default="PLAINTEXT", choices=("PLAINTEXT", "SSL", "SASL_SSL"),
                    help="the brokers' REPLICATION listener (SSL: server-authenticated TLS; SASL_SSL: PLAIN as "
                         "User:broker), with a throw-away test CA")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the cluster's processes are stopped in ``finally``
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    phases = set(args.phases.split(","))
    out: dict = {"tool": "bench.replication", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "config": vars(args), "anchor": ANCHOR}
    from confluent_kafka import libversion
    out["client"] = f"confluent-kafka / librdkafka {libversion()[0]}"
    with tempfile.TemporaryDirectory(prefix="bench-repl-") as d:
        extra = dict(kv.split("=", 1) for kv in args.broker_config)
        c = ChaosCluster(d, links=False, overrides={"broker.session.timeout.ms": args.session_timeout_ms, **extra},
                         broker_overrides=_inter_broker_security(args.inter_broker_security, d))
        try:
            c.start()
            c.wait_ready(60)
            if "throughput" in phases:
                res = []
                for size in (int(x) for x in args.sizes.split(",")):
                    for r in range(args.rounds):
                        for rf in (1, 3):
                            topic = f"tp-{size}-rf{rf}-{r}"
                            c.create_topic(topic, 3, rf, configs={"min.insync.replicas": min(rf, 2)})
                            t = throughput(c, topic, size, args.duration)
                            res.append({"size": size, "rf": rf, "round": r, **t})
                            print(f"throughput {size} B RF {rf}: {t['records_s']} rec/s, {t['mb_s']} MB/s", flush=True)
                for size in {x["size"] for x in res}:
                    r1 = np.mean([x["records_s"] for x in res if x["size"] == size and x["rf"] == 1])
                    r3 = np.mean([x["records_s"] for x in res if x["size"] == size and x["rf"] == 3])
                    res.append({"size": size, "rf3_over_rf1": round(float(r3 / r1), 3) if r1 else None})
                out["throughput"] = res
            if "latency" in phases:
                c.create_topic("latency", 3, args.latency_rf, configs={"min.insync.replicas": min(2, args.latency_rf)})
                out["latency"] = latency(c, "latency", args.latency_size, args.rate, args.duration)
                print(f"latency: {out['latency']}", flush=True)
            if "failover" in phases and args.kills:
                c.create_topic("failover", 1, 3, configs={"min.insync.replicas": 2})
                out["failover"] = failover(c, "failover", args.kills, args.failover_rate, args.max_wait)
                print(f"failover: {out['failover']['first_success_ms']}", flush=True)
            if "shutdown" in phases and args.shutdowns:
                c.create_topic("shutdown", 1, 3, configs={"min.insync.replicas": 2})
                out["shutdown"] = shutdown(c, "shutdown", args.shutdowns, args.failover_rate, args.max_wait)
                print(f"shutdown: failed deliveries {out['shutdown']['failed_deliveries']}", flush=True)
        finally:
            c.stop()
    print(json.dumps({k: v for k, v in out.items() if k != "config"}, indent=1))
    path = args.json or os.path.join("bench", "results", f"replication-{int(time.time())}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

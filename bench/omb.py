"""Replay an OpenMessaging-Benchmark (OMB) workload YAML so results line up with the
published Apache Kafka OMB results in bench/data/kafka-bench-results.

    python -m bench.omb bench/data/kafka-bench-workloads/omb-upstream/1-topic-1-partition-100b.yaml \
        --duration 30 [--rate 5000] [--driver .../drivers/kafka-throughput.yaml] [--vs tansu]

Workload fields used: ``name`` (recorded as the manifest's workload name), ``topics``,
``partitionsPerTopic``, ``messageSize``, ``producerRate`` (total msg/s over all
producers, as in OMB), ``producersPerTopic``, ``subscriptionsPerTopic`` (one consumer
group each), ``consumerPerSubscription``, ``keyDistributor`` (NO_KEY, KEY_ROUND_ROBIN ->
seq, RANDOM_NANO -> random), ``testDurationMinutes`` and ``warmupDurationMinutes``
(scale them down with --duration / --warmup). ``consumerBacklogSizeGB`` > 0 (backlog
drain tests) is not supported. An OMB driver YAML (--driver) supplies producerConfig /
consumerConfig / topicConfig as Kafka properties; replicationFactor is ignored
(one broker). Producers and consumers run concurrently (subscribe() in one group per
subscription, like OMB) and record ``publish`` and ``e2e`` latency.

On a small machine, --max-producers / --max-consumers (default 4 each) cap the client
instances: one instance then serves several topics (the total rate is unchanged).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import uuid
from pathlib import Path

from bench.clients import make_admin, make_consumer
from bench.common import (
    STAMP_BYTES, RunSummary, Target, add_broker_args, add_run_args, parse_kv, print_summary,
    print_vs, run_rounds, session_targets, summarize,
)
from bench.e2e import READY_S, E2EPair
from bench.trace import TraceWriter

TOOL = "bench.omb"
KEY_MAP = {"NO_KEY": "none", "KEY_ROUND_ROBIN": "seq", "RANDOM_NANO": "random"}


def load_yaml(path: str | Path) -> dict:
    import yaml
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: not a YAML mapping")
    return data


def parse_properties(text: str | None) -> dict[str, str]:
    """Java properties block (``key=value`` lines, # comments) -> dict."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


class OmbWorkload:
    """The fields of an OMB workload YAML this runner understands."""

    def __init__(self, data: dict, path: str):
        def num(key, default):
            v = data.get(key, default)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise SystemExit(f"{path}: {key} must be a number, got {v!r}")
            return v

        self.path = path
        self.name = str(data.get("name") or Path(path).stem)
        self.topics = int(num("topics", 1))
        self.partitions = int(num("partitionsPerTopic", 1))
        self.message_size = int(num("messageSize", 1024))
        self.producer_rate = float(num("producerRate", 0))
        self.producers_per_topic = int(num("producersPerTopic", 1))
        self.subscriptions = int(num("subscriptionsPerTopic", 1))
        self.consumers_per_subscription = int(num("consumerPerSubscription", 1))
        self.duration_s = float(num("testDurationMinutes", 15)) * 60
        self.warmup_s = float(num("warmupDurationMinutes", 1)) * 60
        self.backlog_gb = float(num("consumerBacklogSizeGB", 0))
        kd = str(data.get("keyDistributor", "NO_KEY"))
        if kd not in KEY_MAP:
            raise SystemExit(f"{path}: keyDistributor {kd!r} not supported ({', '.join(KEY_MAP)})")
        self.keys = KEY_MAP[kd]
        if min(self.topics, self.partitions, self.producers_per_topic) < 1 or self.message_size < STAMP_BYTES:
            raise SystemExit(f"{path}: topics/partitionsPerTopic/producersPerTopic must be >= 1 "
                             f"and messageSize >= {STAMP_BYTES}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.omb", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("workload", help="OMB workload YAML")
    add_broker_args(p)
    add_run_args(p, duration_default=None)
    p.set_defaults(warmup=None)
    g = p.add_argument_group("omb")
    g.add_argument("--driver", help="OMB driver YAML (producerConfig/consumerConfig/topicConfig)")
    g.add_argument("--rate", type=float, default=None, help="override producerRate (total msg/s; 0 = max)")
    g.add_argument("--max-producers", type=int, default=4)
    g.add_argument("--max-consumers", type=int, default=4)
    g.add_argument("--assign", action="store_true",
                   help="consumers use assign() (partitions split per subscription) instead of subscribe()")
    g.add_argument("--producer-config", action="append", default=[], metavar="KEY=VALUE")
    g.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE")
    return p


def configure(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the generic run arguments from the workload (+ driver) and overrides."""
    wl = OmbWorkload(load_yaml(args.workload), args.workload)
    if wl.backlog_gb > 0:
        raise SystemExit(f"{args.workload}: consumerBacklogSizeGB > 0 (backlog drain) is not supported")
    args.omb = wl
    drv = load_yaml(args.driver) if args.driver else {}
    # without a driver file: OMB's kafka-throughput driver settings (no RF/min.insync here)
    args.producer_props = {"acks": "all", "linger.ms": 1, "batch.size": 1048576,
                           **parse_properties(drv.get("producerConfig")),
                           **parse_kv(args.producer_config)}
    args.consumer_props = {**{k: v for k, v in parse_properties(drv.get("consumerConfig")).items()
                              if k not in ("enable.auto.commit", "auto.offset.reset")},
                           **parse_kv(args.consumer_config)}
    args.topic_props = parse_properties(drv.get("topicConfig"))
    args.topic_props.pop("min.insync.replicas", None)      # single broker
    args.partitions = wl.partitions
    args.topics = wl.topics
    args.record_size = wl.message_size
    args.keys = wl.keys
    args.rate = wl.producer_rate if args.rate is None else args.rate
    if args.duration is None and args.records is None:
        args.duration = wl.duration_s
    if args.warmup is None:
        args.warmup = min(wl.warmup_s, 0.1 * (args.duration or wl.duration_s))
    if args.rounds is None:
        args.rounds = 3 if args.vs else 1
    p = args.producer_props
    args.acks = str(p.get("acks", "all")).replace("-1", "all")
    args.linger_ms = float(p.get("linger.ms", 5))
    args.batch_size = int(p.get("batch.size", 16384))
    args.compression = str(p.get("compression.type", "none"))
    return args


def _producer_settings(args) -> dict:
    out = {}
    for k, v in args.producer_props.items():
        if k in ("key.serializer", "value.serializer", "bootstrap.servers"):
            continue
        out[k] = int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else v
    return out


def run_once(args: argparse.Namespace, target: Target, session_id: str | None, round_: int | None,
             out=None) -> RunSummary:
    out = out or sys.stdout
    wl: OmbWorkload = args.omb
    admin = make_admin(target.bootstrap)
    stem = f"omb-{uuid.uuid4().hex[:8]}"
    topics = [f"{stem}-{i}" for i in range(wl.topics)]
    n_prod = max(1, min(wl.topics * wl.producers_per_topic, args.max_producers))
    per_sub = max(1, min(wl.topics * wl.consumers_per_subscription,
                         args.max_consumers // max(1, wl.subscriptions) or 1))
    consumers = []
    try:
        admin.create_topics({t: wl.partitions for t in topics}, timeout=60, configs=args.topic_props)
        for s in range(wl.subscriptions):
            group = f"{stem}-sub-{s}"
            for c in range(per_sub):
                cons = make_consumer(args.client, target.bootstrap,
                                     {**args.consumer_props, "group.id": group})
                consumers.append(cons)
                if args.assign:
                    # every (topic, partition) once per subscription, round-robin over its consumers
                    all_tps = [(t, p) for t in topics for p in range(wl.partitions)]
                    mine = all_tps[c::per_sub]
                    if mine:
                        cons.assign_tps(mine)
                else:
                    cons.subscribe(topics)
        _await_ready(consumers, wl, args.assign)
        manifest = {
            "tool": TOOL, "broker": target.name, "broker_version": target.version,
            "client": args.client, "warmup_s": args.warmup, "session_id": session_id, "round": round_,
            "command": " ".join(sys.argv),
            "omb": {"workload_file": str(args.workload), "driver_file": args.driver,
                    "producers_per_topic": wl.producers_per_topic,
                    "subscriptions_per_topic": wl.subscriptions,
                    "consumers_per_subscription": wl.consumers_per_subscription,
                    "test_duration_minutes": wl.duration_s / 60, "producer_config": args.producer_props},
            "workload": {"name": wl.name, "topics": wl.topics, "partitions": wl.partitions,
                         "message_size": wl.message_size, "producer_rate": args.rate,
                         "producers": n_prod, "consumers": len(consumers), "acks": args.acks,
                         "linger_ms": args.linger_ms, "batch_size": args.batch_size,
                         "compression": args.compression, "key_distribution": args.keys,
                         **({"duration_s": args.duration} if args.duration is not None else {}),
                         **({"records": args.records} if args.records is not None else {})}}
        label = f"{target.name}" + (f" r{round_}" if round_ is not None else "")
        with TraceWriter(args.results, manifest, broker_pid=target.pid, autotick=True) as tw:
            pair = E2EPair(tw, args, target, topics, wl.partitions, rate=args.rate, n_producers=n_prod,
                           consumers=consumers, producer_settings_=_producer_settings(args),
                           progress_label=label, subscriptions=wl.subscriptions,
                           commit=not args.assign)
            pair.run(args.duration, args.records)
        summary = summarize(tw.run_dir)
        print_summary(summary, side="send", stream=out)
        return summary
    finally:
        for c in consumers:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        try:
            admin.delete_topics(topics, timeout=60)
        except Exception as e:  # noqa: BLE001 - best effort cleanup
            print(f"WARNING: could not delete topics {stem}-*: {e}", file=sys.stderr)
        admin.close()


def _await_ready(consumers, wl: OmbWorkload, assigned: bool) -> None:
    """Wait (bounded by READY_S) until each subscription's group holds every partition."""
    if assigned or not consumers:
        return
    want = wl.topics * wl.partitions * wl.subscriptions
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll_batch(1, 0.05)
        if sum(c.assigned_count() for c in consumers) >= want:
            return
    print(f"WARNING: consumer groups not fully assigned after {READY_S:.0f} s; starting anyway",
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = configure(build_parser().parse_args(argv))
    wl = args.omb
    print(f"OMB workload {wl.name!r}: {wl.topics} topic(s) x {wl.partitions} partition(s), "
          f"{wl.message_size} B, {args.rate:,.0f} msg/s, {args.duration} s "
          f"(published: {wl.duration_s / 60:g} min), acks={args.acks} linger.ms={args.linger_ms:g} "
          f"batch.size={args.batch_size}", file=sys.stderr)
    if math.isfinite(args.rate) and args.rate < 0:
        raise SystemExit("producerRate must be >= 0")
    with session_targets(args) as targets:
        _, pairs = run_rounds(targets, args.rounds, lambda t, sid, k: run_once(args, t, sid, k))
    if pairs:
        print_vs(pairs, side="send", latency_metric="e2e")
    return 0


if __name__ == "__main__":
    sys.exit(main())

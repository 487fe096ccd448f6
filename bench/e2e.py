"""End-to-end latency: producer send time -> consumer receipt, at a target rate, with the
producer and the consumer running concurrently.

    python -m bench.e2e --rate 5000 --duration 10
    python -m bench.e2e --rate 5000 --linger-ms 0 --vs tansu --rounds 3

Each value starts with the wall-clock send time in microseconds (8 bytes, little-endian;
--record-size must be >= 8); the consumer (assign(), fresh topic, from the beginning)
subtracts it from its own receipt time: the ``e2e`` histogram. Producer delivery
latencies go to ``publish`` as in bench.produce. After the producer stops, the consumer
keeps reading until it has every acknowledged record or DRAIN_S seconds pass.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np

from bench.clients import make_admin, make_consumer, make_producer
from bench.common import (
    STAMP_BYTES, DeliveryRecorder, KeySource, Progress, RunSummary, Target, add_broker_args,
    add_producer_args, add_run_args, finish_args, fresh_topic, parse_kv, payload_pool,
    print_summary, print_vs, producer_settings, run_rounds, session_targets, summarize,
    workload_manifest,
)
from bench.consume import consume_records
from bench.produce import FLUSH_TIMEOUT_S, MAX_RUN_S, produce_records
from bench.trace import TraceWriter

TOOL = "bench.e2e"
DRAIN_S = 15.0
READY_S = 15.0


def stamps_to_latency_us(values: list[bytes], now_us: int) -> np.ndarray:
    """Receipt time minus the 8-byte send stamp at the start of each value (µs)."""
    raw = b"".join(v[:STAMP_BYTES] for v in values)
    sent = np.frombuffer(raw, dtype="<i8")
    return (now_us - sent).astype(np.float64)


class E2EPair:
    """One producer thread and one consumer loop on ``topics`` of one broker, both
    recording into ``tw`` (``publish`` and ``e2e``). Used by bench.e2e and bench.omb."""

    def __init__(self, tw, args, target: Target, topics: list[str], partitions: int, *,
                 rate: float, n_producers: int = 1, consumers: list | None = None,
                 producer_settings_: dict | None = None, progress_label: str = "",
                 subscriptions: int = 1, commit: bool = False):
        self.tw, self.args, self.target = tw, args, target
        self.topics, self.partitions, self.rate = topics, partitions, rate
        self.pub = DeliveryRecorder(tw, "publish", warmup_s=args.warmup)
        self.e2e = DeliveryRecorder(tw, "e2e", warmup_s=args.warmup, received=True)
        self.progress = Progress(progress_label or target.name, [self.pub, self.e2e], quiet=args.quiet)
        self.n_producers = max(1, n_producers)
        self.settings = producer_settings_ if producer_settings_ is not None else producer_settings(args)
        self.consumers = consumers or []
        self.subscriptions = max(1, subscriptions)   # each acked record is expected this often
        self.commit = commit
        self.sent = [0] * self.n_producers
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def _producer(self, k: int, deadline: float, limit: int | None) -> None:
        try:
            prod = make_producer(self.args.client, self.target.bootstrap, self.settings, self.pub)
            try:
                mine = self.topics[k::self.n_producers] or self.topics
                self.sent[k] = produce_records(
                    prod, mine[0], topics=mine, limit=limit, deadline=deadline,
                    rate=self.rate / self.n_producers, payloads=payload_pool(self.args.record_size),
                    keys=KeySource(self.args.keys), stamp=True, stop=self.stop)
                end = time.monotonic() + FLUSH_TIMEOUT_S
                left = 1
                while left and time.monotonic() < end and not self.stop.is_set():
                    left = prod.flush(1.0)
            finally:
                prod.close()
        except BaseException as e:  # noqa: BLE001 - reported by run()
            self.errors.append(e)
            self.stop.set()

    def _on_values(self, values, nbytes) -> None:
        now_us = time.time_ns() // 1000
        self.e2e.ok_many(stamps_to_latency_us(values, now_us), nbytes)

    def run(self, duration: float | None, records: int | None) -> int:
        """Produce for ``duration`` s (or ``records``), consume concurrently, drain."""
        start = time.monotonic()
        deadline = start + (duration if duration is not None else MAX_RUN_S)
        limit = None if records is None else max(1, records // self.n_producers)
        threads = [threading.Thread(target=self._producer, args=(k, deadline, limit),
                                    name=f"bench-producer-{k}", daemon=True)
                   for k in range(self.n_producers)]
        for t in threads:
            t.start()
        got = 0
        tick = lambda now: (self.pub.drain(), self.e2e.drain(), self.progress.maybe_print(now))  # noqa: E731
        try:
            # phase 1: while producers run; phase 2: drain what was acknowledged
            while any(t.is_alive() for t in threads) and time.monotonic() < deadline + FLUSH_TIMEOUT_S:
                got += self._consume_some(min(deadline + FLUSH_TIMEOUT_S, time.monotonic() + 0.5), tick)
            for t in threads:
                t.join(timeout=max(0.0, deadline + FLUSH_TIMEOUT_S - time.monotonic()))
            self.pub.drain()
            # the consumer may lag: send-side throughput is over the producing window only
            self.tw.manifest["produce_window_ms"] = int((time.monotonic() - start) * 1000)
            drain_end = time.monotonic() + DRAIN_S
            while time.monotonic() < drain_end:
                acked = self.pub.total_records
                if got >= acked * self.subscriptions:
                    break
                got += self._consume_some(min(drain_end, time.monotonic() + 0.5), tick)
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=FLUSH_TIMEOUT_S)
        self.pub.drain()
        self.e2e.drain()
        if self.errors:
            raise self.errors[0]
        return got

    def _consume_some(self, until: float, tick) -> int:
        got = 0
        for c in self.consumers:
            got += consume_records(c, target=1 << 62, deadline=until if len(self.consumers) == 1
                                   else min(until, time.monotonic() + 0.05),
                                   rec=self.e2e, tick=tick, want_values=True, on_values=self._on_values,
                                   commit=self.commit)
        return got


def run_once(args: argparse.Namespace, target: Target, session_id: str | None, round_: int | None,
             out=None) -> RunSummary:
    out = out or sys.stdout
    admin = make_admin(target.bootstrap)
    topic = args.topic or fresh_topic(TOOL)
    admin.create_topics({topic: args.partitions})
    manifest = {"tool": TOOL, "broker": target.name, "broker_version": target.version,
                "client": args.client, "warmup_s": args.warmup, "session_id": session_id,
                "round": round_, "topic": topic, "command": " ".join(sys.argv),
                "workload": workload_manifest(args, tool=TOOL, consumers=1)}
    label = f"{target.name}" + (f" r{round_}" if round_ is not None else "")
    try:
        cons = make_consumer(args.client, target.bootstrap, parse_kv(args.consumer_config))
        try:
            cons.assign(topic, args.partitions, from_beginning=True)
            cons.poll_batch(1, 0.5)                     # connect + resolve the start offset
            with TraceWriter(args.results, manifest, broker_pid=target.pid, autotick=True) as tw:
                pair = E2EPair(tw, args, target, [topic], args.partitions, rate=args.rate,
                               consumers=[cons], progress_label=label)
                got = pair.run(args.duration, args.records)
                if got < pair.pub.total_records:
                    print(f"WARNING: received {got:,} of {pair.pub.total_records:,} acknowledged records",
                          file=sys.stderr)
        finally:
            cons.close()
        summary = summarize(tw.run_dir)
        print_summary(summary, side="receive", stream=out)
        return summary
    finally:
        if not args.topic:
            try:
                admin.delete_topics([topic])
            except Exception as e:  # noqa: BLE001 - best effort cleanup
                print(f"WARNING: could not delete topic {topic}: {e}", file=sys.stderr)
        admin.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_broker_args(p)
    add_run_args(p)
    add_producer_args(p, rate_default=1000.0)
    p.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                   help="consumer property, Kafka name (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = finish_args(build_parser().parse_args(argv))
    if args.record_size < STAMP_BYTES:
        raise SystemExit(f"--record-size must be >= {STAMP_BYTES} (the send time stamp)")
    with session_targets(args) as targets:
        _, pairs = run_rounds(targets, args.rounds, lambda t, sid, k: run_once(args, t, sid, k))
    if pairs:
        print_vs(pairs, side="receive", latency_metric="e2e")
    return 0


if __name__ == "__main__":
    sys.exit(main())

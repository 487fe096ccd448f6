"""Producer throughput and delivery latency against a real broker.

    python -m bench.produce --acks=all                         # temporary kbroker, 10 s
    python -m bench.produce --rate 5000 --linger-ms 0 --vs tansu --rounds 3
    python -m bench.produce --bootstrap host:9092 --broker-name apache-kafka --records 1000000

Without ``--bootstrap`` a kbroker is started on a temporary data dir and stopped (by its
PID) at the end; ``--vs tansu`` starts the Tansu peer the same way and alternates rounds
between the two brokers in one session (same ``session_id``, ``round`` 0, 1, ...).
Each run creates its topic (a fresh one unless ``--topic``), produces with the chosen
client, records every delivery (send -> delivery callback) into the trace's ``publish``
histogram, prints a progress line each second and a summary at the end, and writes its
trace (manifest.json + Parquet) under ``--results``.
"""
from __future__ import annotations

import argparse
import sys
import time

from bench.clients import make_admin, make_producer
from bench.common import (
    STAMP_BYTES, DeliveryRecorder, KeySource, Progress, RunSummary, Target, add_broker_args,
    add_producer_args, add_run_args, finish_args, fresh_topic, payload_pool, print_summary,
    print_vs, producer_settings, run_rounds, session_targets, summarize, workload_manifest,
)
from bench.trace import TraceWriter

TOOL = "bench.produce"
#: runs bounded by --records only still stop after this many seconds
MAX_RUN_S = 600.0
FLUSH_TIMEOUT_S = 60.0
CHUNK = 256


def produce_records(prod, topic: str, *, limit: int | None, deadline: float, rate: float,
                    payloads: list[bytes], keys: KeySource, stamp: bool = False,
                    tick=None, stop=None, topics: list[str] | None = None) -> int:
    """Send up to ``limit`` records until ``deadline`` (time.monotonic) at ``rate``
    records/s (0 = as fast as the client accepts them). ``stamp``: the first 8 bytes of
    each value become the wall-clock send time in µs (little-endian) for e2e latency.
    ``tick(now)`` runs about every 100 ms; ``stop`` (threading.Event) ends early.
    ``topics`` spreads records round-robin over several topics. Returns records sent."""
    limit = (1 << 62) if limit is None else limit
    send, poll = prod.send, prod.poll
    mask = len(payloads) - 1
    assert mask & (mask + 1) == 0, "payload pool size must be a power of two"
    tails = [p[STAMP_BYTES:] for p in payloads] if stamp else None
    keyf = keys.key if keys.mode != "none" else None
    tlist = topics or [topic]
    nt = len(tlist)
    mono, time_ns = time.monotonic, time.time_ns
    t0 = mono()
    next_tick = t0 + 0.1
    i = 0
    ok = True
    while ok and i < limit:
        now = mono()
        if now >= deadline or (stop is not None and stop.is_set()):
            break
        if now >= next_tick:
            if tick is not None:
                tick(now)
            next_tick = now + 0.1
        if rate > 0:
            n = min(limit, int((now - t0) * rate) + 1) - i
            if n <= 0:
                wait = t0 + i / rate - now
                poll(min(max(wait, 0.0), 0.01, max(0.0, deadline - now)))
                continue
            n = min(n, CHUNK)
        else:
            n = min(CHUNK, limit - i)
        end = i + n
        if stamp:
            while i < end:
                v = (time_ns() // 1000).to_bytes(8, "little") + tails[i & mask]
                if not send(tlist[i % nt], v, keyf(i) if keyf else None, None, deadline):
                    ok = False
                    break
                i += 1
        elif keyf is None and nt == 1:
            while i < end:
                if not send(topic, payloads[i & mask], None, None, deadline):
                    ok = False
                    break
                i += 1
        else:
            while i < end:
                if not send(tlist[i % nt], payloads[i & mask], keyf(i) if keyf else None, None, deadline):
                    ok = False
                    break
                i += 1
        poll(0)
    return i


def run_once(args: argparse.Namespace, target: Target, session_id: str | None, round_: int | None,
             *, rate: float | None = None, out=None) -> RunSummary:
    """One produce run against ``target``; writes its trace and returns its summary."""
    out = out or sys.stdout
    rate = args.rate if rate is None else rate
    admin = make_admin(target.bootstrap)
    topic = args.topic or fresh_topic(TOOL)
    admin.create_topics({topic: args.partitions})
    manifest = {"tool": TOOL, "broker": target.name, "broker_version": target.version,
                "client": args.client, "warmup_s": args.warmup, "session_id": session_id,
                "round": round_, "topic": topic, "command": " ".join(sys.argv),
                "workload": workload_manifest(args, tool=TOOL, rate=rate)}
    payloads = payload_pool(args.record_size)
    keys = KeySource(args.keys)
    label = f"{target.name}" + (f" r{round_}" if round_ is not None else "")
    try:
        with TraceWriter(args.results, manifest, broker_pid=target.pid, autotick=True) as tw:
            rec = DeliveryRecorder(tw, "publish", warmup_s=args.warmup)
            progress = Progress(label, [rec], quiet=args.quiet)
            prod = make_producer(args.client, target.bootstrap, producer_settings(args), rec)
            try:
                start = time.monotonic()
                limit_s = args.duration if args.duration is not None else MAX_RUN_S
                sent = produce_records(prod, topic, limit=args.records, deadline=start + limit_s,
                                       rate=rate, payloads=payloads, keys=keys,
                                       tick=lambda now: (rec.drain(), progress.maybe_print(now)))
                flush_end = time.monotonic() + FLUSH_TIMEOUT_S
                remaining = 1
                while remaining and time.monotonic() < flush_end:      # bounded by FLUSH_TIMEOUT_S
                    remaining = prod.flush(min(1.0, max(0.0, flush_end - time.monotonic())))
                    rec.drain()
                    progress.maybe_print()
            finally:
                prod.close()
            rec.drain()
            if remaining:
                print(f"WARNING: {remaining} record(s) not delivered within {FLUSH_TIMEOUT_S:.0f} s "
                      f"of the end", file=sys.stderr)
        summary = summarize(tw.run_dir)
        print_summary(summary, side="send", stream=out)
        return summary
    finally:
        if not args.topic:
            try:
                admin.delete_topics([topic])
            except Exception as e:  # noqa: BLE001 - best effort cleanup
                print(f"WARNING: could not delete topic {topic}: {e}", file=sys.stderr)
        admin.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.produce", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_broker_args(p)
    add_run_args(p)
    add_producer_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = finish_args(build_parser().parse_args(argv))
    with session_targets(args) as targets:
        _, pairs = run_rounds(targets, args.rounds, lambda t, sid, k: run_once(args, t, sid, k))
    if pairs:
        print_vs(pairs, side="send", latency_metric="publish")
    return 0


if __name__ == "__main__":
    sys.exit(main())

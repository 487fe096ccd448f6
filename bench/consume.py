"""Consumer throughput: pre-fill a topic (or use an existing one), then read it from the
beginning with ``assign()`` and measure records/s and MB/s.

    python -m bench.consume                                  # temporary kbroker, 1M records
    python -m bench.consume --records 2000000 --vs tansu --rounds 3
    python -m bench.consume --bootstrap host:9092 --topic t --prefill 0   # existing data

Pre-filling uses librdkafka (acks=all, the run's --linger-ms/--batch-size/--compression,
which shape the batches on disk) and is not part of the trace. The measured phase ends
when the consumer has read min(--records, the partitions' high watermarks at its start)
records or after --duration seconds. Same --client/--vs/--rounds options as
bench.produce; the trace's ``records_received``/``bytes_received`` carry the counts and
broker CPU per interval gives broker CPU seconds per MB fetched.
"""
from __future__ import annotations

import argparse
import sys
import time

from bench.clients import make_admin, make_consumer
from bench.common import (
    DeliveryRecorder, KeySource, Progress, RunSummary, Target, add_broker_args, add_producer_args,
    add_run_args, finish_args, fresh_topic, parse_kv, payload_pool, print_summary, print_vs,
    producer_settings, run_rounds, session_targets, summarize, workload_manifest,
)
from bench.trace import TraceWriter

TOOL = "bench.consume"
DEFAULT_RECORDS = 1_000_000
DEFAULT_MAX_S = 60.0
PREFILL_MAX_S = 300.0
POLL_MAX_RECORDS = 10_000


class _CountingSink:
    """Delivery sink for the (untraced) pre-fill producer."""

    def __init__(self):
        self.ok_n = 0
        self.errors = 0

    def ok(self, _lat, _nbytes):
        self.ok_n += 1

    def error(self):
        self.errors += 1


def prefill(args: argparse.Namespace, bootstrap: str, topic: str, n: int, out=None) -> int:
    """Write ``n`` records (acks=all) with librdkafka; returns records acknowledged."""
    from bench.clients.confluent import ConfluentProducer
    from bench.produce import produce_records
    if n <= 0:
        return 0
    sink = _CountingSink()
    settings = producer_settings(args)
    settings["acks"] = "all"
    prod = ConfluentProducer(bootstrap, settings, sink)
    t0 = time.monotonic()
    try:
        sent = produce_records(prod, topic, limit=n, deadline=t0 + PREFILL_MAX_S, rate=0,
                               payloads=payload_pool(args.record_size), keys=KeySource(args.keys))
        left = prod.flush(60)
    finally:
        prod.close()
    dt = time.monotonic() - t0
    if not args.quiet:
        print(f"pre-filled {sink.ok_n:,} of {sent:,} records in {dt:.1f} s"
              + (f" ({sink.errors} errors, {left} undelivered)" if sink.errors or left else ""),
              file=sys.stderr, flush=True)
    return sink.ok_n


def consume_records(cons, *, target: int, deadline: float, rec: DeliveryRecorder, tick=None,
                    want_values: bool = False, on_values=None, stop=None, commit: bool = False) -> int:
    """Poll until ``target`` records arrived, ``deadline`` (monotonic) or ``stop``; counts
    go to ``rec`` (or to ``on_values(values, nbytes)`` when ``want_values``). ``commit``:
    commit_async() after every non-empty batch (group consumers)."""
    got = 0
    next_tick = time.monotonic() + 0.1
    while got < target:
        now = time.monotonic()
        if now >= deadline or (stop is not None and stop.is_set()):
            break
        if now >= next_tick:
            if tick is not None:
                tick(now)
            next_tick = now + 0.1
        n, nbytes, errors, values = cons.poll_batch(min(POLL_MAX_RECORDS, target - got),
                                                    min(0.1, max(0.0, deadline - now)), want_values)
        if errors:
            rec.error(errors)
        if n:
            got += n
            if on_values is not None:
                on_values(values, nbytes)
            else:
                rec.count(n, nbytes)
            if commit:
                cons.commit_async()
    return got


def run_once(args: argparse.Namespace, target: Target, session_id: str | None, round_: int | None,
             out=None) -> RunSummary:
    out = out or sys.stdout
    admin = make_admin(target.bootstrap)
    fresh = not args.topic
    topic = args.topic or fresh_topic(TOOL)
    try:
        if fresh:
            admin.create_topics({topic: args.partitions})
        partitions = admin.partitions(topic)
        if partitions < 1:
            raise SystemExit(f"topic {topic} does not exist on {target.bootstrap}")
        n_prefill = args.prefill if args.prefill is not None else (args.records if fresh else 0)
        prefill(args, target.bootstrap, topic, n_prefill)
        available = sum(admin.end_offsets(topic, partitions).values())
        goal = min(args.records, available) if args.records is not None else available
        wl = workload_manifest(args, tool=TOOL, consumers=1, producers=0, rate=0)
        wl["partitions"] = partitions
        wl["records"] = goal
        manifest = {"tool": TOOL, "broker": target.name, "broker_version": target.version,
                    "client": args.client, "warmup_s": args.warmup, "session_id": session_id,
                    "round": round_, "topic": topic, "command": " ".join(sys.argv), "workload": wl}
        label = f"{target.name}" + (f" r{round_}" if round_ is not None else "")
        with TraceWriter(args.results, manifest, broker_pid=target.pid, autotick=True) as tw:
            rec = DeliveryRecorder(tw, "consume", warmup_s=args.warmup, received=True)
            progress = Progress(label, [rec], quiet=args.quiet)
            cons = make_consumer(args.client, target.bootstrap, parse_kv(args.consumer_config))
            try:
                cons.assign(topic, partitions, from_beginning=True)
                got = consume_records(cons, target=goal, deadline=time.monotonic() + args.duration,
                                      rec=rec, tick=lambda now: (rec.drain(), progress.maybe_print(now)))
            finally:
                cons.close()
            rec.drain()
            if got < goal:
                print(f"WARNING: consumed {got:,} of {goal:,} records within {args.duration:.0f} s",
                      file=sys.stderr)
        summary = summarize(tw.run_dir)
        print_summary(summary, side="receive", stream=out)
        return summary
    finally:
        if fresh:
            try:
                admin.delete_topics([topic])
            except Exception as e:  # noqa: BLE001 - best effort cleanup
                print(f"WARNING: could not delete topic {topic}: {e}", file=sys.stderr)
        admin.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.consume", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_broker_args(p)
    add_run_args(p, records_default=DEFAULT_RECORDS, duration_default=DEFAULT_MAX_S)
    add_producer_args(p)
    g = p.add_argument_group("consumer")
    g.add_argument("--prefill", type=int, default=None,
                   help="records to write first (default: --records for a fresh topic, 0 with --topic)")
    g.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                   help="consumer property, Kafka name (repeatable), e.g. fetch.max.bytes=52428800")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.duration is None:
        args.duration = DEFAULT_MAX_S
    args = finish_args(args)
    with session_targets(args) as targets:
        _, pairs = run_rounds(targets, args.rounds, lambda t, sid, k: run_once(args, t, sid, k))
    if pairs:
        print_vs(pairs, side="receive")
    return 0


if __name__ == "__main__":
    sys.exit(main())

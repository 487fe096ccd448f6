"""Producer throughput and delivery latency against a real broker.

    python -m bench.produce --acks=all                         # temporary kbroker, 10 s
    python -m bench.produce --rate 5000 --linger-ms 0 --vs tansu --rounds 3
    python -m bench.produce --bootstrap host:9092 --broker-name apache-kafka --records 1000000
    python -m bench.produce --rate 5000 --linger-ms 0 --background-consumers 20   # + lagging readers

Without ``--bootstrap`` a kbroker is started on a temporary data dir and stopped (by its
PID) at the end; ``--vs tansu`` starts the Tansu peer the same way and alternates rounds
between the two brokers in one session (same ``session_id``, ``round`` 0, 1, ...).
Each run creates its topic (a fresh one unless ``--topic``), produces with the chosen
client, records every delivery (send -> delivery callback) into the trace's ``publish``
histogram, prints a progress line each second and a summary at the end, and writes its
trace (manifest.json + Parquet) under ``--results``.

``--background-consumers N``: before the timed run, ``--background-prefill-mb`` of large
records (64 KiB, untimed) go to the topic; during it N librdkafka consumers (in a child
process) read that old data from offset 0 in a loop, a load of lagging readers on the
broker's read path while the producer's latency is measured; each fetch returns one 64 KiB
record (many reads for the bytes moved), ``--background-rate-mb-s`` caps their total rate so
they need not saturate the CPU. Their reads are counted
(``background_consumers`` in the manifest's workload) but not traced.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid

from bench.clients import make_admin, make_producer
from bench.common import (
    STAMP_BYTES, DeliveryRecorder, KeySource, Progress, RunSummary, Target, add_broker_args,
    add_producer_args, add_run_args, finish_args, fresh_topic, payload_pool, print_summary,
    print_vs, producer_settings, run_rounds, run_rounds_fresh, session_targets, summarize,
    workload_manifest,
)
from bench.trace import TraceWriter

TOOL = "bench.produce"
#: runs bounded by --records only still stop after this many seconds
MAX_RUN_S = 600.0
FLUSH_TIMEOUT_S = 60.0
CHUNK = 256
#: pre-fill record size of --background-consumers: few records per fetched MiB, so the
#: readers cost this process little while each of their fetches still costs the broker a read
BACKGROUND_RECORD_SIZE = 64 * 1024
BACKGROUND_PREFILL_MAX_S = 120.0


def produce_records(prod, topic: str, *, limit: int | None, deadline: float, rate: float,
                    payloads: list[bytes], keys: KeySource, stamp: bool = False,
                    tick=None, stop=None, topics: list[str] | None = None,
                    partitions: list[tuple[str, int]] | None = None) -> int:
    """Send up to ``limit`` records until ``deadline`` (time.monotonic) at ``rate``
    records/s (0 = as fast as the client accepts them). ``stamp``: the first 8 bytes of
    each value become the wall-clock send time in µs (little-endian) for e2e latency.
    ``tick(now)`` runs about every 100 ms; ``stop`` (threading.Event) ends early.
    ``topics`` spreads records round-robin over several topics (the client picks the
    partition); ``partitions`` sends record i to ``partitions[i % len]`` (topic,
    partition): round-robin over every partition. Returns records sent."""
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
        if partitions is not None and not stamp:
            npart = len(partitions)
            while i < end:
                t, part = partitions[i % npart]
                if not send(t, payloads[i & mask], keyf(i) if keyf else None, part, deadline):
                    ok = False
                    break
                i += 1
        elif stamp:
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


class BackgroundConsumers:
    """``n`` consumers (one librdkafka client each, own thread) reading ``topic``'s old data,
    offsets ``[0, ends[p])`` of each partition, in a loop until ``stop()`` or ``max_s``
    seconds: lagging readers that never catch up with the producer. They run in a child
    process (spawned), so their Python work does not compete for this process's GIL with
    the producer whose delivery latency is measured."""

    def __init__(self, bootstrap: str, topic: str, ends: dict[int, int], n: int, max_s: float,
                 rate_mb_s: float = 0.0):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        self.n = n
        self._stop = ctx.Event()
        self._results = ctx.Queue()
        self._proc = ctx.Process(target=_background_main, name="bench-bg-consumers", daemon=True,
                                 args=(bootstrap, topic, ends, n, max_s, rate_mb_s, self._stop, self._results))
        self.records = self.bytes = self.laps = self.errors = 0

    @staticmethod
    def prefill(bootstrap: str, topic: str, partitions: int, mb: float, quiet: bool) -> dict[int, int]:
        """Write ``mb`` MiB of BACKGROUND_RECORD_SIZE records (acks=1, untimed); returns the
        end offset of each partition after it."""
        import confluent_kafka
        n = max(1, int(mb * (1 << 20)) // BACKGROUND_RECORD_SIZE)
        acked = [0]

        def cb(err, _msg):
            if err is None:
                acked[0] += 1
        p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 20,
                                      "batch.size": 1 << 20, "enable.idempotence": False,
                                      "log.connection.close": False})
        value = bytes(range(256)) * (BACKGROUND_RECORD_SIZE // 256)
        t0 = time.monotonic()
        deadline = t0 + BACKGROUND_PREFILL_MAX_S
        for i in range(n):
            while time.monotonic() < deadline:
                try:
                    p.produce(topic, value, partition=i % partitions, on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.01)
            p.poll(0)
        p.flush(max(0.0, deadline - time.monotonic()))
        if not quiet:
            print(f"background pre-fill: {acked[0]:,} of {n:,} records of {BACKGROUND_RECORD_SIZE} B "
                  f"in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-bg-ends",
                                      "log.connection.close": False})
        try:
            return {p: c.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=10)[1]
                    for p in range(partitions)}
        finally:
            c.close()

    def start(self, timeout_s: float = 60.0) -> "BackgroundConsumers":
        """Start the child and wait until its consumers are reading."""
        self._proc.start()
        if self._results.get(timeout=timeout_s) != "ready":
            raise RuntimeError("background consumers did not start")
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self.records, self.bytes, self.laps, self.errors = self._results.get(timeout=60)
        finally:
            self._proc.join(30)
            if self._proc.is_alive():
                self._proc.kill()       # our own child, by its handle


def _background_main(bootstrap: str, topic: str, ends: dict[int, int], n: int, max_s: float,
                     rate_mb_s: float, stop, results) -> None:
    """Child process of BackgroundConsumers: ``n`` reader threads (each at most
    ``rate_mb_s / n`` MB/s when ``rate_mb_s`` > 0), then their totals on ``results``."""
    import confluent_kafka
    from confluent_kafka import KafkaError, TopicPartition
    deadline = time.monotonic() + max_s
    totals = [0, 0, 0, 0]
    lock = threading.Lock()

    def run() -> None:
        c = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-bg-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "fetch.queue.backoff.ms": 10,
            # one pre-fill record per fetch: many reads of old data for the bytes moved
            "max.partition.fetch.bytes": BACKGROUND_RECORD_SIZE, "queued.max.messages.kbytes": 1024,
            "log.connection.close": False})
        records = nbytes = laps = errors = 0
        per_s = rate_mb_s * 1e6 / n if rate_mb_s > 0 else 0.0
        t0 = time.monotonic()
        try:
            c.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                      for p, end in ends.items() if end > 0])
            batch = 16 if per_s else 500
            while not stop.is_set() and time.monotonic() < deadline:
                if per_s:     # ahead of the rate: wait (librdkafka's queue fills up, its fetches stop)
                    ahead = nbytes / per_s - (time.monotonic() - t0)
                    if ahead > 0:
                        stop.wait(min(ahead, 0.5))
                        continue
                for m in c.consume(batch, 0.1):
                    if m.error() is not None:
                        errors += m.error().code() != KafkaError._PARTITION_EOF
                        continue
                    p = m.partition()
                    if m.offset() >= ends[p]:
                        continue                 # the producer's new records: not ours
                    records += 1
                    nbytes += len(m)
                    if m.offset() == ends[p] - 1:
                        laps += 1                # the end of the old data: read it again
                        c.seek(TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING))
        finally:
            c.close()
            with lock:
                for i, v in enumerate((records, nbytes, laps, errors)):
                    totals[i] += v

    threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    results.put("ready")
    for t in threads:
        t.join(max(1.0, deadline - time.monotonic() + 30))
    results.put(tuple(totals))


def prime_partitions(bootstrap: str, partitions: list[tuple[str, int]], n: int, payloads: list[bytes],
                     settings: dict, timeout_s: float = 300.0) -> float:
    """``n`` records to every (topic, partition), librdkafka, acks=all, until every
    delivery report is in; returns the seconds it took. Raises on a failed delivery."""
    import confluent_kafka
    conf = {k: v for k, v in settings.items() if k in ("linger.ms", "batch.size", "compression.type")}
    prod = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                     "log.connection.close": False, **conf})
    failed: list = []
    t0 = time.monotonic()
    deadline = t0 + timeout_s

    def cb(err, _msg):
        if err is not None:
            failed.append(err)
    for j in range(n):
        for i, (t, part) in enumerate(partitions):
            while True:
                try:
                    prod.produce(t, payloads[(i + j) % len(payloads)], partition=part, on_delivery=cb)
                    break
                except BufferError:
                    prod.poll(0.01)
                    if time.monotonic() > deadline:
                        raise TimeoutError("priming: the producer queue stayed full")
            prod.poll(0)
    left = prod.flush(max(0.0, deadline - time.monotonic()))
    if left or failed:
        raise RuntimeError(f"priming: {left} undelivered, {len(failed)} failed ({failed[:1]})")
    return time.monotonic() - t0


def run_once(args: argparse.Namespace, target: Target, session_id: str | None, round_: int | None,
             *, rate: float | None = None, out=None) -> RunSummary:
    """One produce run against ``target``; writes its trace and returns its summary."""
    out = out or sys.stdout
    rate = args.rate if rate is None else rate
    admin = make_admin(target.bootstrap)
    topic = args.topic or fresh_topic(TOOL)
    n_topics = 1 if args.topic else args.topics
    topics = [topic] + [f"{topic}-{i}" for i in range(1, n_topics)]
    admin.create_topics({t: args.partitions for t in topics})
    all_partitions = [(t, p) for p in range(args.partitions) for t in topics]   # interleaved topics
    n_bg = getattr(args, "background_consumers", 0)
    workload = workload_manifest(args, tool=TOOL, rate=rate)
    background = None
    if n_bg > 0:
        bg_ends = BackgroundConsumers.prefill(target.bootstrap, topic, args.partitions,
                                              args.background_prefill_mb, args.quiet)
        workload["background_consumers"] = n_bg
        workload["background_prefill_mb"] = args.background_prefill_mb
        workload["background_rate_mb_s"] = args.background_rate_mb_s
    manifest = {"tool": TOOL, "broker": target.name, "broker_version": target.version,
                "client": args.client, "warmup_s": args.warmup, "session_id": session_id,
                "round": round_, "topic": topic, "command": " ".join(sys.argv),
                "workload": workload}
    payloads = payload_pool(args.record_size)
    keys = KeySource(args.keys)
    label = f"{target.name}" + (f" r{round_}" if round_ is not None else "")
    if args.prime_records:
        t_prime = prime_partitions(target.bootstrap, all_partitions, args.prime_records, payloads,
                                   producer_settings(args))
        workload["prime_s"] = round(t_prime, 3)
        if not args.quiet:
            print(f"{label}: {args.prime_records} record(s) in each of {len(all_partitions):,} partitions "
                  f"first (untimed): {t_prime:.2f} s", file=out, flush=True)
    try:
        with TraceWriter(args.results, manifest, broker_pid=target.pid, autotick=True) as tw:
            rec = DeliveryRecorder(tw, "publish", warmup_s=args.warmup)
            progress = Progress(label, [rec], quiet=args.quiet)
            prod = make_producer(args.client, target.bootstrap, producer_settings(args), rec)
            try:
                start = time.monotonic()
                limit_s = args.duration if args.duration is not None else MAX_RUN_S
                if n_bg > 0:
                    background = BackgroundConsumers(target.bootstrap, topic, bg_ends, n_bg,
                                                     limit_s + FLUSH_TIMEOUT_S,
                                                     args.background_rate_mb_s).start()
                rr = all_partitions if args.partitioner == "round-robin" else None
                sent = produce_records(prod, topic, limit=args.records, deadline=start + limit_s,
                                       rate=rate, payloads=payloads, keys=keys,
                                       tick=lambda now: (rec.drain(), progress.maybe_print(now)),
                                       topics=topics if len(topics) > 1 else None, partitions=rr)
                flush_end = time.monotonic() + FLUSH_TIMEOUT_S
                remaining = 1
                while remaining and time.monotonic() < flush_end:      # bounded by FLUSH_TIMEOUT_S
                    remaining = prod.flush(min(1.0, max(0.0, flush_end - time.monotonic())))
                    rec.drain()
                    progress.maybe_print()
            finally:
                if background is not None:
                    background.stop()
                prod.close()
            rec.drain()
            if remaining:
                print(f"WARNING: {remaining} record(s) not delivered within {FLUSH_TIMEOUT_S:.0f} s "
                      f"of the end", file=sys.stderr)
        summary = summarize(tw.run_dir)
        print_summary(summary, side="send", stream=out)
        if background is not None:
            print(f"background: {n_bg} consumers read {background.bytes / (1 << 20):,.0f} MiB "
                  f"({background.records:,} records, {background.laps} laps, {background.errors} errors)",
                  file=out)
        return summary
    finally:
        if not args.topic:
            try:
                admin.delete_topics(topics)
            except Exception as e:  # noqa: BLE001 - best effort cleanup
                print(f"WARNING: could not delete topic {topic}: {e}", file=sys.stderr)
        admin.close()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.produce", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_broker_args(p)
    add_run_args(p)
    add_producer_args(p)
    g = p.add_argument_group("many partitions")
    g.add_argument("--topics", type=int, default=1,
                   help="fresh topics of --partitions each (records spread over all of them)")
    g.add_argument("--partitioner", choices=["client", "round-robin"], default="client",
                   help="client: the client's partitioner; round-robin: record i to partition i mod "
                        "(topics x partitions), topics interleaved")
    g.add_argument("--prime-records", type=int, default=0, metavar="N",
                   help="N records to every partition before the timed run (untimed, acks=all): "
                        "partitions that exist on disk vs fresh ones")
    g = p.add_argument_group("background readers")
    g.add_argument("--background-consumers", type=int, default=0, metavar="N",
                   help="N consumers re-reading the topic from offset 0 during the run (lagging readers)")
    g.add_argument("--background-prefill-mb", type=float, default=64.0, metavar="MB",
                   help="old data written first (untimed) for the background consumers")
    g.add_argument("--background-rate-mb-s", type=float, default=0.0, metavar="MB/S",
                   help="cap on the background consumers' total read rate (0 = as fast as they go)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = finish_args(build_parser().parse_args(argv))
    if args.fresh_broker:
        _, pairs = run_rounds_fresh(args, args.rounds, lambda t, sid, k: run_once(args, t, sid, k))
    else:
        with session_targets(args) as targets:
            _, pairs = run_rounds(targets, args.rounds, lambda t, sid, k: run_once(args, t, sid, k))
    if pairs:
        print_vs(pairs, side="send", latency_metric="publish")
    return 0


if __name__ == "__main__":
    sys.exit(main())

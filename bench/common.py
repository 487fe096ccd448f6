"""Shared pieces of the whole-system benchmark drivers (bench.produce, bench.consume,
bench.e2e, bench.sweep, bench.omb).

* argument parsing with Kafka's names for client settings (``--linger-ms`` -> ``linger.ms``);
* broker targets: ``--bootstrap`` (given) or a kbroker started on a temporary data dir,
  ``--vs HOST:PORT|tansu|kbroker`` (a second broker for alternating rounds); brokers we
  start are stopped by their PID when the session ends;
* payload and key generation (precomputed, so generation is not timed);
* :class:`DeliveryRecorder` batches latency samples into a TraceWriter
  (``record_latencies``) and keeps a whole-run histogram for the progress line;
* :func:`summarize` reads a finished run back (bench.trace.read_run) with the report's
  interval trimming; :func:`print_summary`, :func:`print_vs`.

Every loop here is bounded in count and time.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from bench.clients import CLIENTS
from bench.trace import (
    BUCKET_UPPER_US, LatencyHistogram, percentile_from_counts, read_run,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = REPO / "bench" / "results"
KEY_MODES = ("none", "random", "seq", "zipf")
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
QUANTILES = (50, 95, 99, 99.9)
#: timestamp prefix of e2e payloads: little-endian int64 wall-clock microseconds
STAMP_BYTES = 8


# --------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------
def _acks(v: str) -> str:
    if v not in ("0", "1", "all", "-1"):
        raise argparse.ArgumentTypeError("acks must be 0, 1 or all")
    return "all" if v == "-1" else v


def add_broker_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("brokers")
    g.add_argument("--bootstrap", metavar="HOST:PORT",
                   help="broker to measure (default: start a kbroker on a temporary data dir)")
    g.add_argument("--broker-name", default="kbroker",
                   help="label of --bootstrap's broker in the trace (default kbroker)")
    g.add_argument("--broker-pid", type=int,
                   help="PID of --bootstrap's broker on this machine (broker CPU per interval)")
    g.add_argument("--broker-override", action="append", default=[], metavar="KEY=VALUE",
                   help="server property for a kbroker we start (repeatable)")
    g.add_argument("--vs", metavar="HOST:PORT|tansu|kbroker",
                   help="second broker: run the same workload against it in alternating rounds")
    g.add_argument("--vs-name", default=None,
                   help="label of the --vs broker (default: tansu/kbroker, or apache-kafka for HOST:PORT)")
    g.add_argument("--vs-pid", type=int, help="PID of a --vs HOST:PORT broker on this machine")
    g.add_argument("--rounds", type=int, default=None,
                   help="rounds per broker (default 1, or 3 with --vs)")
    g.add_argument("--fresh-broker", action="store_true",
                   help="start a new broker (kbroker / tansu we start) for every run, stopped after it")


def add_run_args(p: argparse.ArgumentParser, *, records_default: int | None = None,
                 duration_default: float | None = 10.0) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--client", choices=CLIENTS, default="confluent")
    g.add_argument("--topic", help="topic to use (default: a fresh topic per run, deleted afterwards)")
    g.add_argument("--partitions", type=int, default=1, help="partitions (per topic with bench.produce --topics)")
    g.add_argument("--record-size", type=int, default=100, help="value bytes per record")
    g.add_argument("--records", type=int, default=records_default, help="stop after N records")
    g.add_argument("--duration", type=float, default=None,
                   help=f"stop after S seconds (default {duration_default} when --records is not given)")
    g.add_argument("--warmup", type=float, default=1.0,
                   help="seconds at the start excluded from statistics (default 1)")
    g.add_argument("--results", default=str(DEFAULT_RESULTS), help="trace directory (default bench/results)")
    g.add_argument("--workload-name", default=None, help="workload name in the manifest")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(_duration_default=duration_default)


def add_producer_args(p: argparse.ArgumentParser, *, rate_default: float = 0.0) -> None:
    g = p.add_argument_group("producer (Kafka producer settings)")
    g.add_argument("--rate", type=float, default=rate_default, help="records/s (0 = as fast as possible)")
    g.add_argument("--linger-ms", type=float, default=5, help="linger.ms (default 5)")
    g.add_argument("--batch-size", type=int, default=16384, help="batch.size (default 16384)")
    g.add_argument("--compression", choices=COMPRESSIONS, default="none", help="compression.type")
    g.add_argument("--acks", type=_acks, default="all", help="acks: 0, 1 or all (default all)")
    g.add_argument("--keys", choices=KEY_MODES, default="none",
                   help="key distribution: none, random (16 random bytes), seq (counter), "
                        "zipf (10,000 keys, s=1.1)")
    g.add_argument("--producer-config", action="append", default=[], metavar="KEY=VALUE",
                   help="any other producer property, Kafka name (repeatable)")


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Defaults that depend on other options; validation."""
    if args.records is None and args.duration is None:
        args.duration = args._duration_default
    if args.rounds is None:
        args.rounds = 3 if args.vs else 1
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    if args.partitions < 1 or args.record_size < 0:
        raise SystemExit("--partitions must be >= 1 and --record-size >= 0")
    if getattr(args, "topics", 1) < 1:
        raise SystemExit("--topics must be >= 1")
    if getattr(args, "fresh_broker", False) and (args.bootstrap or (args.vs and args.vs not in ("tansu", "kbroker"))):
        raise SystemExit("--fresh-broker needs brokers this tool starts (no --bootstrap, --vs tansu|kbroker)")
    return args


def parse_kv(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise SystemExit(f"expected KEY=VALUE, got {it!r}")
        out[k.strip()] = v.strip()
    return out


def producer_settings(args: argparse.Namespace) -> dict:
    """Kafka producer properties from the command line."""
    s = {"acks": args.acks, "linger.ms": args.linger_ms, "batch.size": args.batch_size,
         "compression.type": args.compression}
    s.update(parse_kv(args.producer_config))
    if isinstance(s["linger.ms"], float) and s["linger.ms"].is_integer():
        s["linger.ms"] = int(s["linger.ms"])
    return s


def workload_manifest(args: argparse.Namespace, *, tool: str, consumers: int = 0,
                      producers: int = 1, rate: float | None = None) -> dict:
    """The manifest's ``workload`` object for this run's arguments."""
    rate = args.rate if rate is None else rate
    name = args.workload_name or default_workload_name(args, tool, rate)
    wl = {"name": name, "topics": getattr(args, "topics", 1), "partitions": args.partitions,
          "message_size": args.record_size, "producer_rate": rate, "producers": producers,
          "consumers": consumers, "acks": getattr(args, "acks", "all"),
          "linger_ms": getattr(args, "linger_ms", 5), "batch_size": getattr(args, "batch_size", 16384),
          "compression": getattr(args, "compression", "none"),
          "key_distribution": getattr(args, "keys", "none")}
    if args.records is not None:
        wl["records"] = int(args.records)
    if args.duration is not None:
        wl["duration_s"] = args.duration
    return wl


def _size_label(n: int) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}kb"
    return f"{n}b"


def default_workload_name(args, tool: str, rate: float) -> str:
    t = getattr(args, "topics", 1)
    kind = {"bench.produce": "produce", "bench.consume": "consume", "bench.e2e": "e2e"}.get(tool, tool)
    rate_s = "max" if not rate else (f"{rate / 1000:g}k" if rate >= 1000 else f"{rate:g}")
    extra = []
    if getattr(args, "acks", "all") != "all":
        extra.append(f"acks{args.acks}")
    if getattr(args, "linger_ms", 5) != 5:
        extra.append(f"linger{args.linger_ms:g}")
    if getattr(args, "compression", "none") != "none":
        extra.append(args.compression)
    if getattr(args, "keys", "none") != "none":
        extra.append(f"keys-{args.keys}")
    if getattr(args, "background_consumers", 0):
        extra.append(f"bg{args.background_consumers}")
    if getattr(args, "partitioner", "client") == "round-robin":
        extra.append("rr")
    if getattr(args, "prime_records", 0):
        extra.append(f"prime{args.prime_records}")
    if getattr(args, "batch_size", 16384) != 16384:
        extra.append(f"batch{args.batch_size}")
    # other producer properties change the workload too (runs with and without
    # enable.idempotence must never be compared as one workload)
    for k, v in sorted(parse_kv(getattr(args, "producer_config", None) or []).items()):
        if k == "enable.idempotence" and str(v).lower() == "true":
            extra.append("idempotent")
        else:
            extra.append(re.sub(r"[^A-Za-z0-9]+", "_", f"{k}_{v}").strip("_"))
    parts = [kind, f"{t}-topic-{args.partitions}-partition-{_size_label(args.record_size)}"]
    if kind != "consume":
        parts.append(f"rate-{rate_s}")
    return "-".join(parts + extra)


# --------------------------------------------------------------------------
# Brokers
# --------------------------------------------------------------------------
@dataclass
class Target:
    """One broker endpoint of a session. ``pid`` is known for brokers we started
    (and for --broker-pid / --vs-pid); ``proc`` is set only when we own the process."""

    name: str
    bootstrap: str
    pid: int | None = None
    version: str | None = None
    proc: object = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc = None


def _kbroker_version() -> str | None:
    try:
        import kbroker
        return getattr(kbroker, "__version__", None)
    except ImportError:
        return None


def start_kbroker(overrides: dict | None = None) -> Target:
    from kbroker.testing import KBrokerProcess
    proc = KBrokerProcess(overrides=dict(overrides or {})).start()
    return Target("kbroker", proc.bootstrap, proc.pid, _kbroker_version(), proc)


def start_tansu() -> Target:
    from kbroker.testing import TansuProcess, tansu_binary
    proc = TansuProcess().start()
    version = None
    base = os.path.basename(tansu_binary())           # tansu-v0.6.0-<sha>
    if base.startswith("tansu-v"):
        version = base[len("tansu-v"):].split("-")[0]
    return Target("tansu", proc.bootstrap, proc.pid, version, proc)


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """While brokers this tool started run: SIGTERM (``timeout``, a CI runner) raises
    SystemExit in the main thread, so the ``finally`` blocks that stop them (by PID)
    run, and no peer broker outlives the tool. Python's default for SIGTERM is to die at
    once, skipping them. A no-op off the main thread or when SIGTERM is handled already."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return

    def _exit(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def session_targets(args: argparse.Namespace) -> Iterator[list[Target]]:
    """The broker(s) of this session: ``[primary]`` or ``[primary, peer]``. Brokers
    started here are stopped (by their own PID) when the block exits, SIGTERM included."""
    targets: list[Target] = []
    stack = contextlib.ExitStack()
    stack.enter_context(sigterm_as_exit())
    try:
        overrides = parse_kv(args.broker_override)
        if args.bootstrap:
            targets.append(Target(args.broker_name, args.bootstrap, args.broker_pid,
                                  _kbroker_version() if args.broker_name == "kbroker" else None))
        else:
            targets.append(start_kbroker(overrides))
        if args.vs:
            if args.vs == "tansu":
                t = start_tansu()
            elif args.vs == "kbroker":
                t = start_kbroker(overrides)
            else:
                t = Target(args.vs_name or "apache-kafka", args.vs, args.vs_pid)
            if args.vs_name:
                t.name = args.vs_name
            targets.append(t)
        yield targets
    finally:
        for t in reversed(targets):
            with contextlib.suppress(Exception):
                t.stop()
        stack.close()


def fresh_topic(tool: str) -> str:
    return f"bench-{tool.rsplit('.', 1)[-1]}-{uuid.uuid4().hex[:10]}"


# --------------------------------------------------------------------------
# Payloads and keys
# --------------------------------------------------------------------------
def payload_pool(size: int, n: int = 64, seed: int = 7) -> list[bytes]:
    """``n`` distinct values of ``size`` bytes: half random bytes, half a repeated
    text pattern (OMB's randomBytesRatio 0.5), so compression has something to do."""
    rnd = random.Random(seed)
    half = size // 2
    pattern = (b"kbroker-benchmark-payload " * (size // 26 + 1))[: size - half]
    return [rnd.randbytes(half) + pattern for _ in range(n)]


class KeySource:
    """Keys by index: ``none`` -> None, ``seq`` -> b"<i>", ``random`` -> one of 65,536
    precomputed 16-byte random keys, ``zipf`` -> one of 10,000 keys drawn Zipf(1.1)."""

    POOL = 1 << 16

    def __init__(self, mode: str, seed: int = 11):
        self.mode = mode
        self._pool: list[bytes] | None = None
        rng = np.random.default_rng(seed)
        if mode == "random":
            raw = rng.bytes(16 * self.POOL)
            self._pool = [raw[i * 16:(i + 1) * 16] for i in range(self.POOL)]
        elif mode == "zipf":
            ranks = (rng.zipf(1.1, size=self.POOL * 4) - 1)
            ranks = ranks[ranks < 10_000][: self.POOL]
            self._pool = [b"key-%d" % r for r in ranks.tolist()]
            while len(self._pool) < self.POOL:            # practically never
                self._pool.append(b"key-0")
        elif mode not in ("none", "seq"):
            raise ValueError(f"unknown key mode {mode!r}")

    def key(self, i: int) -> bytes | None:
        if self.mode == "none":
            return None
        if self.mode == "seq":
            return b"%d" % i
        return self._pool[i & (self.POOL - 1)]


# --------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------
class DeliveryRecorder:
    """Buffers per-record outcomes and hands them to a TraceWriter in batches
    (``record_send`` + ``record_latencies``), at most ``max_batch`` samples or
    ``max_age_s`` old, so a 1 s interval gets its samples within ~50 ms of the event.

    ``ok``/``error`` may be called from any thread (one lock). A whole-run histogram of
    samples recorded after ``warmup_s`` feeds the progress line and quick summaries;
    the trace keeps everything.
    """

    def __init__(self, tw, metric: str = "publish", *, warmup_s: float = 0.0,
                 max_batch: int = 2048, max_age_s: float = 0.05, received: bool = False):
        self.tw = tw
        self.metric = metric
        self.received = received
        self._lock = threading.Lock()
        self._lat: list[float] = []
        self._arrays: list[np.ndarray] = []
        self._n = 0
        self._bytes = 0
        self._errors = 0
        self._max_batch = max_batch
        self._max_age = max_age_s
        self._last = time.monotonic()
        self._t0 = self._last
        self._warmup_end = self._t0 + warmup_s
        self.hist = LatencyHistogram()
        self.total_records = 0
        self.total_bytes = 0
        self.total_errors = 0

    def ok(self, latency_s: float, nbytes: int) -> None:
        with self._lock:
            self._lat.append(latency_s)
            self._n += 1
            self._bytes += nbytes
            if self._n >= self._max_batch:
                self._drain_locked(time.monotonic())
            elif self._n & 63 == 0:
                now = time.monotonic()
                if now - self._last >= self._max_age:
                    self._drain_locked(now)

    def ok_many(self, latencies_us: np.ndarray, nbytes: int) -> None:
        """Many successes at once (latencies: array of microseconds); pushed at once."""
        with self._lock:
            self._arrays.append(np.asarray(latencies_us, dtype=np.float64))
            self._n += len(latencies_us)
            self._bytes += nbytes
            self._drain_locked(time.monotonic())

    def count(self, n: int, nbytes: int) -> None:
        """Successes without latency samples (e.g. consumed records)."""
        with self._lock:
            self._n += n
            self._bytes += nbytes
            now = time.monotonic()
            if now - self._last >= self._max_age:
                self._drain_locked(now)

    def error(self, n: int = 1) -> None:
        with self._lock:
            self._errors += n

    def drain(self) -> None:
        """Push everything buffered to the trace (call periodically and at the end)."""
        with self._lock:
            self._drain_locked(time.monotonic())

    def _drain_locked(self, now: float) -> None:
        self._last = now
        tw = self.tw
        if self._n or self._bytes:
            if self.received:
                tw.record_receive(self._n, self._bytes)
            else:
                tw.record_send(self._n, self._bytes)
        if self._errors:
            tw.record_error(self._errors)
        if self._lat or self._arrays:
            parts = self._arrays
            if self._lat:
                parts.append(np.asarray(self._lat, dtype=np.float64) * 1e6)
            us = parts[0] if len(parts) == 1 else np.concatenate(parts)
            us = np.maximum(us, 0.0)
            tw.record_latencies(self.metric, us)
            if now >= self._warmup_end:
                self.hist.record_many(us)
        self.total_records += self._n
        self.total_bytes += self._bytes
        self.total_errors += self._errors
        self._lat = []
        self._arrays = []
        self._n = self._bytes = self._errors = 0


class Progress:
    """One line per second: ``[label]  t=3s  12,345 rec/s  1.23 MB/s  p99 4.51 ms``
    (rates over the last second; p99 over the post-warm-up samples so far)."""

    def __init__(self, label: str, recorders: list[DeliveryRecorder], *, quiet: bool = False,
                 stream=None):
        self.label = label
        self.recorders = recorders
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self._t0 = self._last_t = time.monotonic()
        self._last_n = [0] * len(recorders)
        self._last_b = [0] * len(recorders)

    def maybe_print(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self._last_t < 1.0:
            return
        parts = []
        for i, r in enumerate(self.recorders):
            r.drain()
            dt = now - self._last_t
            rate = (r.total_records - self._last_n[i]) / dt
            mbps = (r.total_bytes - self._last_b[i]) / dt / 1e6
            self._last_n[i], self._last_b[i] = r.total_records, r.total_bytes
            s = f"{r.metric}: {rate:>10,.0f} rec/s {mbps:7.2f} MB/s"
            if r.hist.total:
                s += f"  p99 {r.hist.percentile(99) / 1000:8.2f} ms"
            if r.total_errors:
                s += f"  errors {r.total_errors}"
            parts.append(s)
        self._last_t = now
        if not self.quiet:
            print(f"[{self.label}] {now - self._t0:5.0f}s  " + " | ".join(parts),
                  file=self.stream, flush=True)


# --------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------
@dataclass
class RunSummary:
    run_dir: str
    broker: str
    round: int | None
    records_per_s: float
    mb_per_s: float
    received_per_s: float
    received_mb_per_s: float
    kept_s: float
    errors: int
    latency_ms: dict = field(default_factory=dict)       # metric -> {p50, ..., max}
    broker_cpu_s: float | None = None
    broker_cpu_s_per_mb_sent: float | None = None
    broker_cpu_s_per_mb_received: float | None = None
    #: the load generator's own CPU (this process: the client library's threads included)
    client_cpu_s: float | None = None

    def cpu_us_per_record(self, who: str = "broker", side: str = "send") -> float | None:
        """CPU µs of ``who`` ("broker" / "client") per record moved over the kept intervals:
        on a machine the client shares with the broker, what the two together spend per
        record bounds the rate (cores / (broker + client µs per record))."""
        cpu = self.broker_cpu_s if who == "broker" else self.client_cpu_s
        records = self.throughput(side) * self.kept_s
        if cpu is None or not records or records != records:
            return None
        return cpu / records * 1e6

    def throughput(self, side: str = "send") -> float:
        return self.records_per_s if side == "send" else self.received_per_s


def summarize(run_dir: str | os.PathLike) -> RunSummary:
    """Throughput/latency/CPU of a finished run over the intervals the report keeps
    (start >= warmup_s and at least half an interval long; all intervals if none are)."""
    m, iv, lat = read_run(run_dir)
    d = iv.to_pydict()
    ims = m["interval_ms"]
    n = len(d["interval_index"])
    kept = [d["start_ms"][i] >= m["warmup_s"] * 1000 and d["duration_ms"][i] >= ims / 2
            for i in range(n)]
    if not any(kept):
        kept = [d["duration_ms"][i] > 0 for i in range(n)]
    idx = [i for i in range(n) if kept[i]]
    secs = sum(d["duration_ms"][i] for i in idx) / 1000.0 or float("nan")
    # e2e/omb: intervals after the producers stopped (consumer catching up) do not
    # dilute the send rate (manifest "produce_window_ms", written by bench.e2e)
    window = m.get("produce_window_ms")
    sidx = [i for i in idx if window is None or d["start_ms"][i] + d["duration_ms"][i] <= window] or idx
    send_secs = sum(d["duration_ms"][i] for i in sidx) / 1000.0 or float("nan")
    sent = sum(d["records_sent"][i] for i in sidx)
    sent_b = sum(d["bytes_sent"][i] for i in sidx)
    recv = sum(d["records_received"][i] for i in idx)
    recv_b = sum(d["bytes_received"][i] for i in idx)
    cpu_vals = [d["broker_cpu_s"][i] for i in idx if d["broker_cpu_s"][i] is not None]
    cpu = sum(cpu_vals) if cpu_vals else None
    client_vals = [d["client_cpu_s"][i] for i in idx if d["client_cpu_s"][i] is not None]
    s = RunSummary(str(run_dir), m["broker"], m.get("round"), sent / send_secs, sent_b / send_secs / 1e6,
                   recv / secs, recv_b / secs / 1e6, secs, int(sum(d["errors"])))
    s.broker_cpu_s = cpu
    s.client_cpu_s = sum(client_vals) if client_vals else None
    if cpu is not None:
        s.broker_cpu_s_per_mb_sent = cpu / (sent_b / 1e6) if sent_b else None
        s.broker_cpu_s_per_mb_received = cpu / (recv_b / 1e6) if recv_b else None
    keep_set = set(d["interval_index"][i] for i in idx)
    ld = lat.to_pydict()
    by_metric: dict[str, np.ndarray] = {}
    for ii, metric, b, c in zip(ld["interval_index"], ld["metric"], ld["bucket"], ld["count"]):
        if ii in keep_set:
            arr = by_metric.setdefault(metric, np.zeros(len(BUCKET_UPPER_US), dtype=np.int64))
            arr[b] += c
    for metric, counts in by_metric.items():
        if counts.sum():
            pct = {f"p{q:g}": percentile_from_counts(counts, BUCKET_UPPER_US, q) / 1000.0
                   for q in QUANTILES}
            pct["max"] = float(BUCKET_UPPER_US[np.flatnonzero(counts)[-1]]) / 1000.0
            pct["samples"] = int(counts.sum())
            s.latency_ms[metric] = pct
    return s


def print_summary(s: RunSummary, *, side: str = "send", stream=None) -> None:
    out = stream or sys.stdout
    rnd = f" round {s.round}" if s.round is not None else ""
    if side == "send":
        line = f"{s.records_per_s:,.0f} records/s  {s.mb_per_s:,.2f} MB/s"
    else:
        line = f"{s.received_per_s:,.0f} records/s  {s.received_mb_per_s:,.2f} MB/s"
    print(f"== {s.broker}{rnd}: {line} over {s.kept_s:.1f} s"
          + (f"  errors {s.errors}" if s.errors else ""), file=out)
    for metric, p in sorted(s.latency_ms.items()):
        print(f"   {metric} latency ms: " + "  ".join(
            f"{k} {v:.3f}" for k, v in p.items() if k != "samples") + f"  (n={p['samples']:,})",
            file=out)
    if s.broker_cpu_s is not None:
        per = s.broker_cpu_s_per_mb_sent if side == "send" else s.broker_cpu_s_per_mb_received
        print(f"   broker CPU {s.broker_cpu_s:.2f} s" + (f" = {per:.4f} s/MB" if per else ""), file=out)
    b_us, c_us = s.cpu_us_per_record("broker", side), s.cpu_us_per_record("client", side)
    if c_us is not None:
        print(f"   CPU per record: " + (f"broker {b_us:.1f} µs + " if b_us is not None else "")
              + f"client {c_us:.1f} µs (client: this process, its client library's threads included)",
              file=out)
    print(f"   trace: {s.run_dir}", file=out, flush=True)


def print_vs(rounds: list[tuple[RunSummary, RunSummary]], *, side: str = "send",
             latency_metric: str | None = None, stream=None) -> dict:
    """Per-round primary/peer ratios and their median; returns them as a dict."""
    out = stream or sys.stdout
    if not rounds:
        return {}
    a0, b0 = rounds[0]
    res: dict = {"primary": a0.broker, "peer": b0.broker, "throughput_ratios": []}
    lat_ratios = []
    for i, (a, b) in enumerate(rounds):
        ta, tb = a.throughput(side), b.throughput(side)
        r = ta / tb if tb else float("nan")
        res["throughput_ratios"].append(r)
        line = f"round {i}: {a.broker} {ta:,.0f} rec/s vs {b.broker} {tb:,.0f} rec/s -> ratio {r:.3f}"
        if latency_metric and latency_metric in a.latency_ms and latency_metric in b.latency_ms:
            la, lb = a.latency_ms[latency_metric]["p99"], b.latency_ms[latency_metric]["p99"]
            lat_ratios.append(la / lb if lb else float("nan"))
            line += f";  {latency_metric} p99 {la:.3f} vs {lb:.3f} ms -> ratio {lat_ratios[-1]:.3f}"
        print(line, file=out)
    res["median_throughput_ratio"] = statistics.median(res["throughput_ratios"])
    print(f"median throughput ratio {a0.broker}/{b0.broker}: {res['median_throughput_ratio']:.3f} "
          f"(> 1: {a0.broker} faster; {len(rounds)} rounds)", file=out)
    if lat_ratios:
        res["p99_ratios"] = lat_ratios
        res["median_p99_ratio"] = statistics.median(lat_ratios)
        print(f"median {latency_metric} p99 ratio {a0.broker}/{b0.broker}: {res['median_p99_ratio']:.3f} "
              f"(< 1: {a0.broker} lower latency)", file=out)
    out.flush()
    return res


def run_rounds_fresh(args: argparse.Namespace, rounds: int,
                     run_one: Callable[[Target, str, int], RunSummary],
                     ) -> tuple[list[RunSummary], list[tuple[RunSummary, RunSummary]]]:
    """``run_rounds`` with a new broker for every run (``--fresh-broker``): each run
    starts its broker on an empty data dir and stops it (by its PID) afterwards, so no
    run inherits another's partitions, page cache state or background work."""
    overrides = parse_kv(args.broker_override)
    starters = [lambda: start_kbroker(overrides)]
    if args.vs:
        starters.append(start_tansu if args.vs == "tansu" else (lambda: start_kbroker(overrides)))
    session_id = uuid.uuid4().hex[:12]
    summaries: list[RunSummary] = []
    pairs: list[tuple[RunSummary, RunSummary]] = []
    with sigterm_as_exit():
        for k in range(rounds):
            got = []
            for start in starters:
                t = start()
                try:
                    if args.vs_name and len(got) == 1:
                        t.name = args.vs_name
                    got.append(run_one(t, session_id, k))
                finally:
                    t.stop()
            summaries.extend(got)
            if len(got) == 2:
                pairs.append((got[0], got[1]))
    return summaries, pairs


def run_rounds(targets: list[Target], rounds: int, run_one: Callable[[Target, str, int], RunSummary],
               ) -> tuple[list[RunSummary], list[tuple[RunSummary, RunSummary]]]:
    """Run ``run_one(target, session_id, round)`` ``rounds`` times per target,
    alternating targets (A B A B ...); returns all summaries and the (A, B) pairs."""
    session_id = uuid.uuid4().hex[:12]
    summaries: list[RunSummary] = []
    pairs: list[tuple[RunSummary, RunSummary]] = []
    for k in range(rounds):
        got = [run_one(t, session_id, k) for t in targets]
        summaries.extend(got)
        if len(got) == 2:
            pairs.append((got[0], got[1]))
    return summaries, pairs


def nan_to_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x

"""Benchmark trace writer and a mergeable latency histogram.

A *run* is one directory ``<results_dir>/<run_id>/``::

    manifest.json       what ran, where, when (schema: bench/README.md)
    intervals.parquet   one row per fixed interval (INTERVALS_SCHEMA)
    latency.parquet     per interval and metric: non-empty histogram buckets
                        (LATENCY_SCHEMA)

The directory appears atomically: :class:`TraceWriter` writes into
``<results_dir>/.<run_id>.partial/`` and renames it on :meth:`TraceWriter.close`.
A crashed driver leaves at most a ``.partial`` directory, which readers ignore.

Latency histogram (HdrHistogram-style log-linear bucketing, 2 significant
digits). Values are integer microseconds. With ``SUB_BUCKET_BITS = 8``::

    value v < 256            bucket = v                      (exact, width 1)
    value v >= 256           e = bit_length(v) - 8           (e >= 1)
                             bucket = 256 + (e-1)*128 + (v >> e) - 128
                             covers [(v>>e)<<e, ((v>>e)+1)<<e - 1]  (width 2**e)

Every bucket with lower bound L >= 256 has width at most L/128, so any value
reported for a bucket is within 1/128 (0.78 %) of every sample in it: two
significant decimal digits, as HdrHistogram's ``numberOfSignificantValueDigits=2``.
Values at or above ``MAX_TRACKABLE_US`` (2**40 us, about 12.7 days) are
clamped into the last bucket. A histogram is a fixed array of
``BUCKET_COUNT`` (4352) counters, whatever the number of samples.

Percentiles follow HdrHistogram's ``getValueAtPercentile``: the rank is
``max(1, ceil(q/100 * total))`` and the answer is the *upper* bound (highest
equivalent value) of the bucket holding that rank. Histograms merge by adding
counts, so percentiles over a whole run are computed from summed buckets,
never by averaging per-interval percentiles.

No Spark here: benchmark drivers import this module.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import platform
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1

# --------------------------------------------------------------------------
# Histogram bucketing
# --------------------------------------------------------------------------
SUB_BUCKET_BITS = 8
SUB_BUCKET_COUNT = 1 << SUB_BUCKET_BITS          # 256
SUB_BUCKET_HALF = SUB_BUCKET_COUNT >> 1           # 128
MAX_EXPONENT_BITS = 40
MAX_TRACKABLE_US = (1 << MAX_EXPONENT_BITS) - 1
BUCKET_COUNT = SUB_BUCKET_COUNT + (MAX_EXPONENT_BITS - SUB_BUCKET_BITS) * SUB_BUCKET_HALF  # 4352
#: worst-case relative error of a reported value vs. any sample in its bucket
RELATIVE_PRECISION = 1.0 / SUB_BUCKET_HALF

HISTOGRAM_SPEC = {
    "kind": "log-linear",
    "unit": "us",
    "sub_bucket_bits": SUB_BUCKET_BITS,
    "significant_digits": 2,
    "bucket_count": BUCKET_COUNT,
    "percentile_value": "bucket upper bound",
}


def bucket_index(value_us: int) -> int:
    """Bucket of a non-negative integer value in microseconds (clamped)."""
    v = value_us if value_us <= MAX_TRACKABLE_US else MAX_TRACKABLE_US
    if v < SUB_BUCKET_COUNT:
        return v
    e = v.bit_length() - SUB_BUCKET_BITS
    return SUB_BUCKET_COUNT + (e - 1) * SUB_BUCKET_HALF + (v >> e) - SUB_BUCKET_HALF


def bucket_bounds(index: int) -> tuple[int, int]:
    """Inclusive ``(lower_us, upper_us)`` of bucket ``index``."""
    if not 0 <= index < BUCKET_COUNT:
        raise ValueError(f"bucket index {index} outside [0, {BUCKET_COUNT})")
    if index < SUB_BUCKET_COUNT:
        return index, index
    j = index - SUB_BUCKET_COUNT
    e = j // SUB_BUCKET_HALF + 1
    lower = (j % SUB_BUCKET_HALF + SUB_BUCKET_HALF) << e
    return lower, lower + (1 << e) - 1


def bucket_indexes(values_us: np.ndarray) -> np.ndarray:
    """Vectorised :func:`bucket_index` for an array of non-negative integers."""
    v = np.minimum(np.asarray(values_us, dtype=np.int64), MAX_TRACKABLE_US)
    if v.size and v.min() < 0:
        raise ValueError("latency values must be >= 0")
    # frexp's exponent is the bit length; exact for integers < 2**53
    bl = np.frexp(v.astype(np.float64))[1].astype(np.int64)
    e = np.maximum(bl - SUB_BUCKET_BITS, 1)
    big = SUB_BUCKET_COUNT + (e - 1) * SUB_BUCKET_HALF + (v >> e) - SUB_BUCKET_HALF
    return np.where(v < SUB_BUCKET_COUNT, v, big)


_IDX = np.arange(BUCKET_COUNT)
_BOUNDS = np.array([bucket_bounds(i) for i in range(BUCKET_COUNT)], dtype=np.int64)
BUCKET_LOWER_US = _BOUNDS[:, 0]
BUCKET_UPPER_US = _BOUNDS[:, 1]


def percentile_rank(q: float, total: int) -> int:
    """1-based rank of percentile ``q`` (0..100) among ``total`` samples."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} outside [0, 100]")
    # the small epsilon keeps 99.9/100*1000 == 999.0000000000001 at rank 999
    return max(1, math.ceil(q / 100.0 * total - 1e-9))


class LatencyHistogram:
    """Mergeable latency histogram over microseconds; see the module docstring.

    Memory is fixed (``BUCKET_COUNT`` counters). Not thread-safe on its own:
    :class:`TraceWriter` holds its lock around every call.
    """

    __slots__ = ("_counts", "total", "min_us", "max_us")

    def __init__(self) -> None:
        self._counts = [0] * BUCKET_COUNT
        self.total = 0
        self.min_us: int | None = None   # exact, in-memory only (not persisted)
        self.max_us: int | None = None

    def record(self, value_us: float, count: int = 1) -> None:
        """Add ``count`` samples of ``value_us`` (rounded to whole microseconds)."""
        if not value_us >= 0:           # also rejects NaN
            raise ValueError(f"latency must be >= 0, got {value_us!r}")
        v = int(value_us + 0.5)
        if v > MAX_TRACKABLE_US:
            v = MAX_TRACKABLE_US
        if v < SUB_BUCKET_COUNT:
            i = v
        else:
            e = v.bit_length() - SUB_BUCKET_BITS
            i = SUB_BUCKET_COUNT + (e - 1) * SUB_BUCKET_HALF + (v >> e) - SUB_BUCKET_HALF
        self._counts[i] += count
        self.total += count
        if self.min_us is None or v < self.min_us:
            self.min_us = v
        if self.max_us is None or v > self.max_us:
            self.max_us = v

    def record_many(self, values_us: Iterable[float]) -> None:
        """Vectorised :meth:`record` for an array of samples."""
        arr = np.asarray(values_us, dtype=np.float64)
        if arr.size == 0:
            return
        if not np.all(arr >= 0):
            raise ValueError("latency values must be >= 0")
        v = np.minimum(np.floor(arr + 0.5), MAX_TRACKABLE_US).astype(np.int64)
        binc = np.bincount(bucket_indexes(v), minlength=BUCKET_COUNT)
        counts = self._counts
        for i in np.flatnonzero(binc).tolist():
            counts[i] += int(binc[i])
        self.total += int(v.size)
        lo, hi = int(v.min()), int(v.max())
        self.min_us = lo if self.min_us is None else min(self.min_us, lo)
        self.max_us = hi if self.max_us is None else max(self.max_us, hi)

    def merge(self, other: "LatencyHistogram") -> "LatencyHistogram":
        """Add ``other``'s counts into this histogram; returns self."""
        a, b = self._counts, other._counts
        for i in range(BUCKET_COUNT):
            if b[i]:
                a[i] += b[i]
        self.total += other.total
        for attr, pick in (("min_us", min), ("max_us", max)):
            x, y = getattr(self, attr), getattr(other, attr)
            setattr(self, attr, y if x is None else x if y is None else pick(x, y))
        return self

    def reset(self) -> None:
        self._counts = [0] * BUCKET_COUNT
        self.total = 0
        self.min_us = self.max_us = None

    def counts(self) -> np.ndarray:
        """Dense int64 array of bucket counts (copy)."""
        return np.array(self._counts, dtype=np.int64)

    def percentile(self, q: float) -> int:
        """Value at percentile ``q`` (0..100): upper bound of the rank's bucket.

        Raises ValueError on an empty histogram.
        """
        if self.total == 0:
            raise ValueError("percentile of an empty histogram")
        rank = percentile_rank(q, self.total)
        seen = 0
        for i, c in enumerate(self._counts):
            if c:
                seen += c
                if seen >= rank:
                    return int(BUCKET_UPPER_US[i])
        raise AssertionError("unreachable: total disagrees with counts")

    def mean(self) -> float:
        """Mean using each bucket's midpoint (within the histogram precision)."""
        if self.total == 0:
            raise ValueError("mean of an empty histogram")
        c = self.counts()
        mid = (BUCKET_LOWER_US + BUCKET_UPPER_US) / 2.0
        return float((c * mid).sum() / self.total)

    def to_buckets(self) -> list[tuple[int, int]]:
        """Non-empty buckets as ``[(bucket_index, count), ...]`` ascending."""
        return [(i, c) for i, c in enumerate(self._counts) if c]

    @classmethod
    def from_buckets(cls, buckets: Iterable[tuple[int, int]]) -> "LatencyHistogram":
        """Inverse of :meth:`to_buckets`; min/max become bucket bounds."""
        h = cls()
        lo_i = hi_i = None
        for i, c in buckets:
            i, c = int(i), int(c)
            if not 0 <= i < BUCKET_COUNT or c < 0:
                raise ValueError(f"bad bucket ({i}, {c})")
            if c:
                h._counts[i] += c
                h.total += c
                lo_i = i if lo_i is None else min(lo_i, i)
                hi_i = i if hi_i is None else max(hi_i, i)
        if lo_i is not None:
            h.min_us = int(BUCKET_LOWER_US[lo_i])
            h.max_us = int(BUCKET_UPPER_US[hi_i])
        return h

    def __len__(self) -> int:
        return self.total


def percentile_from_counts(counts: np.ndarray, upper_us: np.ndarray, q: float) -> int:
    """Percentile from parallel arrays of (ascending) bucket counts and upper bounds."""
    counts = np.asarray(counts)
    total = int(counts.sum())
    if total == 0:
        raise ValueError("percentile of an empty histogram")
    cum = np.cumsum(counts)
    i = int(np.searchsorted(cum, percentile_rank(q, total), side="left"))
    return int(np.asarray(upper_us)[i])


# --------------------------------------------------------------------------
# Parquet schemas (bench/report mirrors these as Spark schemas)
# --------------------------------------------------------------------------
INTERVALS_SCHEMA = pa.schema([
    pa.field("interval_index", pa.int32(), nullable=False),
    pa.field("start_ms", pa.int64(), nullable=False),      # since run start
    pa.field("duration_ms", pa.int64(), nullable=False),
    pa.field("records_sent", pa.int64(), nullable=False),
    pa.field("bytes_sent", pa.int64(), nullable=False),
    pa.field("records_received", pa.int64(), nullable=False),
    pa.field("bytes_received", pa.int64(), nullable=False),
    pa.field("errors", pa.int64(), nullable=False),
    pa.field("broker_cpu_s", pa.float64(), nullable=True),
    pa.field("client_cpu_s", pa.float64(), nullable=True),
])

LATENCY_SCHEMA = pa.schema([
    pa.field("interval_index", pa.int32(), nullable=False),
    pa.field("metric", pa.string(), nullable=False),
    pa.field("bucket", pa.int32(), nullable=False),
    pa.field("lower_us", pa.int64(), nullable=False),
    pa.field("upper_us", pa.int64(), nullable=False),
    pa.field("count", pa.int64(), nullable=False),
])

KNOWN_METRICS = ("publish", "e2e")
BROKERS = ("kbroker", "tansu", "apache-kafka")
CLIENTS = ("confluent", "kbroker", "kafka-python", "aiokafka")
WORKLOAD_REQUIRED = ("name", "topics", "partitions", "message_size", "producer_rate",
                     "consumers", "acks", "linger_ms", "batch_size", "compression",
                     "key_distribution")
MANIFEST_REQUIRED = ("schema_version", "run_id", "tool", "broker", "broker_version",
                     "client", "workload", "started_at", "warmup_s", "interval_ms",
                     "machine", "histogram")
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_METRIC_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def validate_manifest(m: Mapping[str, Any], *, complete: bool = True) -> list[str]:
    """Problems with a manifest (empty list = valid).

    ``complete=False`` checks only the fields a driver must supply to
    :class:`TraceWriter`; the writer fills in the rest.
    """
    problems: list[str] = []
    if not isinstance(m, Mapping):
        return ["manifest is not a JSON object"]
    need = MANIFEST_REQUIRED if complete else ("tool", "broker", "client", "workload")
    for k in need:
        if k not in m or m[k] is None and k not in ("broker_version",):
            problems.append(f"missing {k!r}")
    if complete and "schema_version" in m and m["schema_version"] != SCHEMA_VERSION:
        problems.append(f"unsupported schema_version {m.get('schema_version')!r}")
    if "run_id" in m and not (isinstance(m["run_id"], str) and _RUN_ID_RE.match(m["run_id"])):
        problems.append(f"bad run_id {m.get('run_id')!r}")
    wl = m.get("workload")
    if isinstance(wl, Mapping):
        for k in WORKLOAD_REQUIRED:
            if k not in wl:
                problems.append(f"workload missing {k!r}")
        if "records" not in wl and "duration_s" not in wl:
            problems.append("workload needs 'records' or 'duration_s'")
        for k in ("topics", "partitions", "message_size", "consumers", "producers",
                  "batch_size", "records"):
            if wl.get(k) is not None and not (isinstance(wl[k], int) and not isinstance(wl[k], bool)
                                              and wl[k] >= 0):
                problems.append(f"workload {k!r} must be an integer >= 0")
        for k in ("producer_rate", "linger_ms", "duration_s"):
            if wl.get(k) is not None and not (isinstance(wl[k], (int, float))
                                              and not isinstance(wl[k], bool) and wl[k] >= 0):
                problems.append(f"workload {k!r} must be a number >= 0")
        if wl.get("name") is not None and not isinstance(wl["name"], str):
            problems.append("workload 'name' must be a string")
    elif "workload" in m:
        problems.append("workload is not an object")
    for k in ("warmup_s", "interval_ms"):
        if k in m and not (isinstance(m[k], (int, float)) and not isinstance(m[k], bool) and m[k] >= 0):
            problems.append(f"{k!r} must be a number >= 0")
    if complete and "interval_ms" in m and isinstance(m["interval_ms"], (int, float)) and m["interval_ms"] <= 0:
        problems.append("'interval_ms' must be > 0")
    if "round" in m and m["round"] is not None and not (isinstance(m["round"], int)
                                                        and not isinstance(m["round"], bool)):
        problems.append("'round' must be an integer")
    for k in ("tool", "broker", "client", "session_id", "broker_version", "git_commit"):
        if m.get(k) is not None and not isinstance(m[k], str):
            problems.append(f"{k!r} must be a string")
    if "machine" in m and not isinstance(m["machine"], Mapping):
        problems.append("'machine' is not an object")
    return problems


# --------------------------------------------------------------------------
# Environment facts
# --------------------------------------------------------------------------
def machine_facts() -> dict[str, Any]:
    """Facts about this machine for the manifest (Linux /proc, best effort)."""
    cpu_model = platform.processor() or None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gb = round(int(line.split()[1]) / (1024 * 1024), 1)
                    break
    except (OSError, ValueError, IndexError):
        pass
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model,
        "logical_cpus": os.cpu_count(),
        "mem_total_gb": mem_gb,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def git_commit(repo_dir: str | os.PathLike | None = None) -> str | None:
    """``HEAD`` of the git checkout at ``repo_dir`` (default: this file's repo),
    with ``-dirty`` appended when tracked files are modified; None without git."""
    cwd = Path(repo_dir) if repo_dir else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=cwd, capture_output=True, text=True, timeout=10)
        sha = head.stdout.strip()
        return sha + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def process_cpu_seconds(pid: int) -> float | None:
    """user+system CPU seconds of process ``pid`` (Linux /proc), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        # fields[11], fields[12] are utime, stime (fields 14, 15 of proc(5))
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def new_run_id(tool: str, broker: str) -> str:
    """``<UTC yyyymmddThhmmssZ>-<tool>-<broker>-<6 hex>``, sortable by start time."""
    ts = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = lambda s: re.sub(r"[^A-Za-z0-9.-]+", "-", s).strip("-") or "x"  # noqa: E731
    return f"{ts}-{safe(tool)}-{safe(broker)}-{uuid.uuid4().hex[:6]}"


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------
# Trace writer
# --------------------------------------------------------------------------
class TraceWriter:
    """Writes one benchmark run as ``<results_dir>/<run_id>/`` (module docstring).

    Usage by a driver::

        with TraceWriter("bench/results", {"tool": "bench.produce", "broker": "kbroker",
                         "broker_version": "0.1.0", "client": "confluent",
                         "workload": {...}, "warmup_s": 5}) as tw:
            tw.record_send(n_records, n_bytes)          # per acked batch
            tw.record_latency("publish", latency_us)    # per acked record
        # run directory now complete; tw.run_dir is its path

    Intervals: interval ``k`` covers ``[t0 + k*interval_ms, t0 + (k+1)*interval_ms)``
    of ``clock`` (monotonic seconds, injectable for tests), ``t0`` being
    construction time. Every event is attributed to the interval in which its
    ``record_*`` call happens (a latency to the interval it *completed* in).
    Rollover is lazy: the first call after a boundary closes the elapsed
    intervals, writing empty rows for intervals without events; :meth:`tick`
    (or ``autotick=True``, a daemon thread calling it 4x per interval) closes
    them promptly. CPU deltas (``broker_pid`` via /proc, this process's
    ``time.process_time`` when ``client_cpu=True``) are sampled at each close
    and attributed to the interval being closed.

    Thread-safety: every public method takes one internal lock, so callbacks on
    other threads (e.g. librdkafka delivery reports) may record concurrently.
    Memory is bounded: one fixed-size histogram per metric for the open
    interval plus at most ``flush_every`` closed intervals buffered before a
    Parquet row group is written to the partial directory.
    """

    def __init__(self, results_dir: str | os.PathLike, manifest: Mapping[str, Any], *,
                 interval_ms: int = 1000, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, broker_pid: int | None = None,
                 client_cpu: bool = True, flush_every: int = 60, autotick: bool = False) -> None:
        problems = validate_manifest(manifest, complete=False)
        if problems:
            raise ValueError("bad manifest: " + "; ".join(problems))
        if interval_ms <= 0:
            raise ValueError("interval_ms must be > 0")
        m = json.loads(json.dumps(dict(manifest)))   # deep copy, proves JSON-serialisable
        m.setdefault("run_id", new_run_id(m["tool"], m["broker"]))
        if not _RUN_ID_RE.match(str(m["run_id"])):
            raise ValueError(f"bad run_id {m['run_id']!r}")
        m["schema_version"] = SCHEMA_VERSION
        m.setdefault("broker_version", None)
        m.setdefault("warmup_s", 0)
        m.setdefault("session_id", None)
        m.setdefault("round", None)
        if "git_commit" not in m:
            m["git_commit"] = git_commit()
            if not m["git_commit"] or m["git_commit"].endswith("-dirty"):
                print(f"WARNING: {m['tool']}: tree has uncommitted changes or no git commit "
                      f"({m['git_commit']}); the report marks this run and keeps it out of "
                      "regression verdicts: commit first", file=sys.stderr)
        if "machine" not in m:
            m["machine"] = machine_facts()
        m["interval_ms"] = int(interval_ms)
        m["histogram"] = dict(HISTOGRAM_SPEC)
        self.manifest = m
        self.run_id: str = m["run_id"]
        self.results_dir = Path(results_dir)
        self.run_dir = self.results_dir / self.run_id
        if self.run_dir.exists():
            raise FileExistsError(f"run directory {self.run_dir} already exists")
        self._tmp_dir = self.results_dir / f".{self.run_id}.partial"
        self._tmp_dir.mkdir(parents=True, exist_ok=False)

        self._lock = threading.Lock()
        self._clock = clock
        self._wall = wall_clock
        self._interval_s = interval_ms / 1000.0
        self._interval_ms = int(interval_ms)
        self._broker_pid = broker_pid
        self._client_cpu = client_cpu
        self._flush_every = max(1, int(flush_every))
        self._t0 = clock()
        m["started_at"] = _iso(wall_clock())
        self._index = 0
        self._closed = False
        self._hists: dict[str, LatencyHistogram] = {}
        self._reset_counters()
        self._cpu_broker_last = process_cpu_seconds(broker_pid) if broker_pid else None
        self._cpu_client_last = time.process_time() if client_cpu else None
        self._extra_broker_cpu: float | None = None
        self._extra_client_cpu: float | None = None
        self._iv_rows: dict[str, list] = {f.name: [] for f in INTERVALS_SCHEMA}
        self._lat_rows: dict[str, list] = {f.name: [] for f in LATENCY_SCHEMA}
        self._buffered = 0
        self._iv_writer: pq.ParquetWriter | None = None
        self._lat_writer: pq.ParquetWriter | None = None
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        if autotick:
            self._ticker = threading.Thread(target=self._tick_loop, name=f"trace-{self.run_id}",
                                            daemon=True)
            self._ticker.start()

    # -- recording ---------------------------------------------------------
    def record_send(self, n_records: int, n_bytes: int) -> None:
        """Records acknowledged by the broker (count once, on success)."""
        with self._lock:
            self._advance()
            self._records_sent += n_records
            self._bytes_sent += n_bytes

    def record_receive(self, n_records: int, n_bytes: int) -> None:
        """Records delivered to a consumer."""
        with self._lock:
            self._advance()
            self._records_received += n_records
            self._bytes_received += n_bytes

    def record_error(self, n: int = 1) -> None:
        """Failed sends/receives (delivery errors, timeouts)."""
        with self._lock:
            self._advance()
            self._errors += n

    def record_latency(self, metric: str, value_us: float) -> None:
        """One latency sample in microseconds; metric "publish" (send -> ack)
        or "e2e" (send -> consume), or another lower_snake_case name."""
        with self._lock:
            self._advance()
            h = self._hists.get(metric)
            if h is None:
                if not _METRIC_RE.match(metric):
                    raise ValueError(f"bad metric name {metric!r}")
                h = self._hists[metric] = LatencyHistogram()
            h.record(value_us)

    def record_latencies(self, metric: str, values_us: Iterable[float]) -> None:
        """Many samples at once (vectorised)."""
        with self._lock:
            self._advance()
            h = self._hists.get(metric)
            if h is None:
                if not _METRIC_RE.match(metric):
                    raise ValueError(f"bad metric name {metric!r}")
                h = self._hists[metric] = LatencyHistogram()
            h.record_many(values_us)

    def record_cpu(self, broker_cpu_s: float | None = None, client_cpu_s: float | None = None) -> None:
        """Add CPU seconds measured by the driver itself (e.g. a remote broker's
        JMX/procfs figures) to the open interval, on top of any sampling."""
        with self._lock:
            self._advance()
            if broker_cpu_s is not None:
                self._extra_broker_cpu = (self._extra_broker_cpu or 0.0) + broker_cpu_s
            if client_cpu_s is not None:
                self._extra_client_cpu = (self._extra_client_cpu or 0.0) + client_cpu_s

    def tick(self) -> None:
        """Close intervals whose end has passed (call periodically when idle)."""
        with self._lock:
            self._advance()

    @property
    def interval_index(self) -> int:
        """Index of the interval currently open."""
        return self._index

    # -- lifecycle -----------------------------------------------------------
    def close(self) -> Path:
        """Close the open (possibly short) interval, write the files and rename
        the partial directory to ``run_dir``. Idempotent; returns ``run_dir``."""
        self._stop_ticker()
        with self._lock:
            if self._closed:
                return self.run_dir
            self._advance()
            now = self._clock()
            dur_ms = max(0, round((now - self._t0) * 1000) - self._index * self._interval_ms)
            self._close_interval(dur_ms)
            self._flush()
            for w in (self._iv_writer, self._lat_writer):
                if w is not None:
                    w.close()
            # a run with no latency samples still gets (empty) files
            if self._iv_writer is None:
                pq.write_table(INTERVALS_SCHEMA.empty_table(), self._tmp_dir / "intervals.parquet")
            if self._lat_writer is None:
                pq.write_table(LATENCY_SCHEMA.empty_table(), self._tmp_dir / "latency.parquet")
            self.manifest["ended_at"] = _iso(self._wall())
            self.manifest["intervals"] = self._index + 1
            tmp_manifest = self._tmp_dir / "manifest.json"
            with open(tmp_manifest, "w", encoding="utf-8") as f:
                json.dump(self.manifest, f, indent=2, sort_keys=True)
                f.write("\n")
            for name in ("intervals.parquet", "latency.parquet", "manifest.json"):
                fd = os.open(self._tmp_dir / name, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.rename(self._tmp_dir, self.run_dir)
            self._closed = True
            return self.run_dir

    def abort(self) -> None:
        """Discard everything written so far (no run directory appears)."""
        self._stop_ticker()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in (self._iv_writer, self._lat_writer):
                if w is not None:
                    try:
                        w.close()
                    except Exception:   # noqa: BLE001 - discarding anyway
                        pass
            shutil.rmtree(self._tmp_dir, ignore_errors=True)

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- internals (caller holds self._lock) --------------------------------
    def _reset_counters(self) -> None:
        self._records_sent = self._bytes_sent = 0
        self._records_received = self._bytes_received = 0
        self._errors = 0
        for h in self._hists.values():
            if h.total:
                h.reset()

    def _advance(self) -> None:
        if self._closed:
            raise RuntimeError("TraceWriter is closed")
        target = int((self._clock() - self._t0) / self._interval_s)
        while self._index < target:
            self._close_interval(self._interval_ms)
            self._index += 1

    def _close_interval(self, duration_ms: int) -> None:
        k = self._index
        broker_cpu = client_cpu = None
        if self._broker_pid:
            now_cpu = process_cpu_seconds(self._broker_pid)
            if now_cpu is not None and self._cpu_broker_last is not None:
                broker_cpu = max(0.0, now_cpu - self._cpu_broker_last)
            self._cpu_broker_last = now_cpu
        if self._client_cpu:
            now_cpu = time.process_time()
            client_cpu = max(0.0, now_cpu - self._cpu_client_last)
            self._cpu_client_last = now_cpu
        if self._extra_broker_cpu is not None:
            broker_cpu = (broker_cpu or 0.0) + self._extra_broker_cpu
        if self._extra_client_cpu is not None:
            client_cpu = (client_cpu or 0.0) + self._extra_client_cpu
        self._extra_broker_cpu = self._extra_client_cpu = None
        row = (k, k * self._interval_ms, int(duration_ms), self._records_sent, self._bytes_sent,
               self._records_received, self._bytes_received, self._errors, broker_cpu, client_cpu)
        for f, v in zip(INTERVALS_SCHEMA, row):
            self._iv_rows[f.name].append(v)
        lat = self._lat_rows
        for metric in sorted(self._hists):
            for i, c in self._hists[metric].to_buckets():
                lat["interval_index"].append(k)
                lat["metric"].append(metric)
                lat["bucket"].append(i)
                lat["lower_us"].append(int(BUCKET_LOWER_US[i]))
                lat["upper_us"].append(int(BUCKET_UPPER_US[i]))
                lat["count"].append(c)
        self._reset_counters()
        self._buffered += 1
        if self._buffered >= self._flush_every:
            self._flush()

    def _flush(self) -> None:
        if not self._buffered:
            return
        iv = pa.Table.from_pydict(self._iv_rows, schema=INTERVALS_SCHEMA)
        if self._iv_writer is None:
            self._iv_writer = pq.ParquetWriter(self._tmp_dir / "intervals.parquet", INTERVALS_SCHEMA)
        self._iv_writer.write_table(iv)
        if self._lat_rows["interval_index"]:
            lat = pa.Table.from_pydict(self._lat_rows, schema=LATENCY_SCHEMA)
            if self._lat_writer is None:
                self._lat_writer = pq.ParquetWriter(self._tmp_dir / "latency.parquet", LATENCY_SCHEMA)
            self._lat_writer.write_table(lat)
        for v in self._iv_rows.values():
            v.clear()
        for v in self._lat_rows.values():
            v.clear()
        self._buffered = 0

    def _tick_loop(self) -> None:
        while not self._stop.wait(self._interval_s / 4):
            try:
                self.tick()
            except RuntimeError:   # closed underneath us
                return

    def _stop_ticker(self) -> None:
        self._stop.set()
        t = self._ticker
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)


def read_run(run_dir: str | os.PathLike) -> tuple[dict, pa.Table, pa.Table]:
    """Load one run with pyarrow (manifest, intervals, latency); for drivers,
    tests and quick looks. The report reads runs with Spark instead."""
    p = Path(run_dir)
    with open(p / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    return (manifest, pq.read_table(p / "intervals.parquet", schema=INTERVALS_SCHEMA),
            pq.read_table(p / "latency.parquet", schema=LATENCY_SCHEMA))

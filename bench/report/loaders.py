"""Find, validate (in Python) and read (with Spark) the report's inputs.

Every input is validated before Spark sees it, so a malformed file costs one
``WARNING: skipping <path>: <reason>`` line on stderr and is left out; Spark
never gets the chance to fail with a Java stack trace on it.

* run directory: ``manifest.json`` must parse and pass
  :func:`bench.trace.validate_manifest`; both Parquet files must have a
  readable footer and every column of the trace schema with its exact type.
* OMB result: JSON object with ``workload``, a non-empty numeric
  ``publishRate`` series and a non-empty ``aggregatedPublishLatencyQuantiles``.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from bench import trace
from bench.report import schemas as S


@dataclass
class InputLog:
    """Collects skipped inputs; prints one warning line per skip."""
    stream: TextIO | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)

    def skip(self, path: Path | str, reason: str) -> None:
        reason = " ".join(str(reason).split())[:500]
        self.skipped.append({"path": str(path), "reason": reason})
        print(f"WARNING: skipping {path}: {reason}", file=self.stream or sys.stderr)


@dataclass
class Run:
    run_id: str
    path: Path
    role: str                  # "candidate" (--runs) or "baseline" (--baseline)
    manifest: dict[str, Any]


# -- run directories -----------------------------------------------------------
def _json_file(path: Path) -> tuple[Any, str | None]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    except FileNotFoundError:
        return None, f"missing {path.name}"
    except json.JSONDecodeError as e:
        return None, f"malformed JSON in {path.name} ({e.msg} at line {e.lineno} column {e.colno})"
    except (OSError, UnicodeDecodeError) as e:
        return None, f"unreadable {path.name} ({e})"


def check_parquet(path: Path, expected: pa.Schema) -> str | None:
    """Reason the file is unusable, or None."""
    if not path.is_file():
        return f"missing {path.name}"
    try:
        got = pq.ParquetFile(path).schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        return f"unreadable Parquet {path.name} ({e})"
    missing = [f.name for f in expected if f.name not in got.names]
    if missing:
        return f"{path.name} lacks column(s) {', '.join(missing)}"
    for f in expected:
        t = got.field(f.name).type
        if not t.equals(f.type):
            return f"{path.name} column {f.name} has type {t}, expected {f.type}"
    return None


def validate_run(path: Path, role: str, log: InputLog) -> Run | None:
    manifest, err = _json_file(path / "manifest.json")
    if err:
        log.skip(path, err)
        return None
    problems = trace.validate_manifest(manifest)
    if problems:
        log.skip(path, "manifest.json: " + "; ".join(problems))
        return None
    for name, schema in (("intervals.parquet", trace.INTERVALS_SCHEMA),
                         ("latency.parquet", trace.LATENCY_SCHEMA)):
        err = check_parquet(path / name, schema)
        if err:
            log.skip(path, err)
            return None
    return Run(manifest["run_id"], path, role, manifest)


def discover_runs(dirs: list[str | Path], role: str, log: InputLog) -> list[Run]:
    """Each DIR is a run directory (has manifest.json) or a results directory
    holding run directories. ``.partial`` (unfinished) directories are ignored."""
    runs: list[Run] = []
    for d in map(Path, dirs):
        if not d.is_dir():
            log.skip(d, "not a directory")
            continue
        if (d / "manifest.json").exists():
            candidates = [d]
        else:
            candidates = sorted(c for c in d.iterdir()
                                if c.is_dir() and not c.name.startswith("."))
            if not candidates:
                log.skip(d, "no run directories found (empty)")
                continue
        for c in candidates:
            r = validate_run(c, role, log)
            if r is not None:
                runs.append(r)
    return runs


def dedupe_runs(runs: list[Run], log: InputLog) -> list[Run]:
    seen: dict[str, Run] = {}
    out = []
    for r in runs:
        if r.run_id in seen:
            log.skip(r.path, f"duplicate run_id {r.run_id} (already read from {seen[r.run_id].path})")
            continue
        seen[r.run_id] = r
        out.append(r)
    return out


def _analysis_exception():
    from pyspark.errors import AnalysisException, PySparkException
    return (AnalysisException, PySparkException)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def read_runs(spark, runs: list[Run], log: InputLog):
    """Spark DataFrames for validated runs: (manifests, intervals, latency, runs).

    ``intervals``/``latency`` gain a ``run_id`` column. Runs Spark cannot plan
    are skipped with a warning. Returns Nones when no run is left.
    """
    from pyspark.sql import functions as F
    errors = _analysis_exception()
    ivs, lats, kept = [], [], []
    for r in runs:
        try:
            iv = spark.read.schema(S.INTERVALS).parquet(str(r.path / "intervals.parquet"))
            lat = spark.read.schema(S.LATENCY).parquet(str(r.path / "latency.parquet"))
        except errors as e:
            log.skip(r.path, f"Spark could not read it: {_first_line(e)}")
            continue
        ivs.append(iv.withColumn("run_id", F.lit(r.run_id)))
        lats.append(lat.withColumn("run_id", F.lit(r.run_id)))
        kept.append(r)
    if not kept:
        return None, None, None, []
    manifests = (spark.read.schema(S.MANIFEST).option("multiLine", True)
                 .option("mode", "FAILFAST")
                 .json([str(r.path / "manifest.json") for r in kept]))
    n = spark.sparkContext.defaultParallelism
    union = lambda a, b: a.unionByName(b)   # noqa: E731
    # one small scan per run: coalesce so the task count follows the cores
    return (manifests, reduce(union, ivs).coalesce(n), reduce(union, lats).coalesce(n), kept)


# -- OpenMessaging-Benchmark results -------------------------------------------
def _numbers(xs: Any) -> bool:
    return isinstance(xs, list) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)


def validate_omb(obj: Any) -> str | None:
    """Reason an object is not a usable OMB TestResult, or None."""
    if not isinstance(obj, dict):
        return "not an OMB result (top level is not an object)"
    if not isinstance(obj.get("workload"), str):
        return "not an OMB result (no 'workload' name)"
    pr = obj.get("publishRate")
    if not _numbers(pr) or not pr:
        return "no numeric 'publishRate' series"
    for k in S.OMB.fieldNames():
        v = obj.get(k)
        if v is None:
            continue
        if k.endswith("Quantiles"):
            if not isinstance(v, dict) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values()):
                return f"'{k}' is not a map of numbers"
            try:
                [float(q) for q in v]
            except ValueError:
                return f"'{k}' has a non-numeric quantile key"
        elif S.OMB[k].dataType.typeName() == "array" and not _numbers(v):
            return f"'{k}' is not a list of numbers"
        elif k in ("messageSize", "topics", "partitions", "producersPerTopic",
                   "consumersPerTopic", "sampleRateMillis") and not (
                isinstance(v, int) and not isinstance(v, bool)):
            return f"'{k}' is not an integer"
        elif k == "producerRate" and not isinstance(v, (int, float)):
            return f"'{k}' is not a number"
    q = obj.get("aggregatedPublishLatencyQuantiles")
    if not isinstance(q, dict) or not q:
        return "no 'aggregatedPublishLatencyQuantiles'"
    if any(isinstance(x, float) and not math.isfinite(x) for x in pr):
        return "non-finite value in 'publishRate'"
    return None


@dataclass
class OmbFile:
    path: Path
    rel: str                    # path relative to the OMB root, e.g. "confluent-.../x.json"
    data: dict[str, Any]


def discover_omb(roots: list[str | Path], log: InputLog) -> list[OmbFile]:
    out: list[OmbFile] = []
    for root in map(Path, roots):
        if not root.is_dir():
            log.skip(root, "OMB results directory not found")
            continue
        files = sorted(root.rglob("*.json"))
        if not files:
            log.skip(root, "no *.json OMB results found")
        for p in files:
            obj, err = _json_file(p)
            err = err or validate_omb(obj)
            if err:
                log.skip(p, err)
                continue
            out.append(OmbFile(p, p.relative_to(root).as_posix(), obj))
    return out


def read_omb(spark, files: list[OmbFile], log: InputLog):
    """Spark DataFrame of validated OMB results plus a ``file`` column."""
    from pyspark.sql import functions as F
    errors = _analysis_exception()
    dfs = []
    for f in files:
        try:
            df = (spark.read.schema(S.OMB).option("multiLine", True).option("mode", "FAILFAST")
                  .json(str(f.path)))
        except errors as e:
            log.skip(f.path, f"Spark could not read it: {_first_line(e)}")
            continue
        dfs.append(df.withColumn("file", F.lit(f.rel)))
    if not dfs:
        return None
    return reduce(lambda a, b: a.unionByName(b), dfs).coalesce(spark.sparkContext.defaultParallelism)

"""The report pipeline: discover -> validate -> Spark load/aggregate ->
statistics -> plots -> report.md / report.html / verdict.json."""
from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from bench.report import aggregate as A
from bench.report import compare as C
from bench.report import loaders as L
from bench.report import plots as P
from bench.report import render as R


class NoInput(Exception):
    """Nothing usable to report on (a usage error: exit status 2)."""


def _spark_errors() -> tuple[type[BaseException], ...]:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException
    return (Py4JJavaError, PySparkException)


def _manifests(spark, manifests, runs: list[L.Run], log: L.InputLog):
    """Manifest table; on a Spark read failure, find and drop the bad file(s)."""
    from bench.report import schemas as S
    try:
        return A.manifest_table(manifests), runs
    except _spark_errors():
        good, tables = [], []
        for r in runs:
            try:
                tables.append(A.manifest_table(
                    spark.read.schema(S.MANIFEST).option("multiLine", True)
                    .option("mode", "FAILFAST").json(str(r.path / "manifest.json"))))
                good.append(r)
            except _spark_errors() as e:
                log.skip(r.path, f"manifest.json rejected by Spark: {L._first_line(e)}")
        return (pd.concat(tables, ignore_index=True) if tables else None), good


def _probe(spark, runs: list[L.Run], log: L.InputLog) -> list[L.Run]:
    """Fully read each run's Parquet files; drop runs Spark cannot decode."""
    from bench.report import schemas as S
    good = []
    for r in runs:
        try:
            spark.read.schema(S.INTERVALS).parquet(str(r.path / "intervals.parquet")).count()
            spark.read.schema(S.LATENCY).parquet(str(r.path / "latency.parquet")).count()
            good.append(r)
        except _spark_errors() as e:
            log.skip(r.path, f"Spark could not decode it: {L._first_line(e)}")
    return good


def _load_and_aggregate(spark, runs: list[L.Run], log: L.InputLog):
    manifests, iv, lat, runs = L.read_runs(spark, runs, log)
    if not runs:
        return None
    meta, runs = _manifests(spark, manifests, runs, log)
    if meta is None or meta.empty:
        return None
    if len(runs) != len(meta):
        _, iv, lat, runs = L.read_runs(spark, runs, log)
    role = {r.run_id: r.role for r in runs}
    meta = meta[meta.run_id.isin(role)].copy()
    meta["role"] = meta.run_id.map(role)
    meta = C.assign_groups(meta)
    ivr = A.interval_rates(spark, iv, meta).cache()
    try:
        intervals = A.collect_intervals(ivr)
        tp = A.throughput_summary(ivr)
        latk = A.kept_latency(lat, ivr).cache()
        pct, curves = A.merged_percentiles(spark, latk, meta[["run_id", "group_id"]])
        both = set(meta[meta.role == "candidate"].match_key) & set(meta[meta.role == "baseline"].match_key)
        lat_iv = A.latency_intervals(latk, sorted(meta[meta.match_key.isin(both)].run_id))
        latk.unpersist()
    finally:
        ivr.unpersist()
    return C.Tables(meta, intervals, tp, pct, curves, lat_iv)


def run(*, runs: list[str], baseline: list[str], omb: list[str], out_dir: Path,
        threshold: float = 0.05, alpha: float = C.ALPHA, master: str | None = None, spark=None,
        log_stream: TextIO | None = None) -> dict[str, Any]:
    log = L.InputLog(stream=log_stream or sys.stderr)
    cands = L.discover_runs(runs, "candidate", log)
    bases = L.discover_runs(baseline, "baseline", log)
    all_runs = L.dedupe_runs(cands + bases, log)
    if not any(r.role == "candidate" for r in all_runs):
        raise NoInput("no usable candidate runs (see the warnings above)")
    omb_files = L.discover_omb(omb, log)

    if spark is None:
        from bench.report.spark import get_spark
        spark = get_spark(master)

    tables = None
    try:
        tables = _load_and_aggregate(spark, all_runs, log)
    except _spark_errors() as e:
        print(f"WARNING: Spark failed on the combined runs ({L._first_line(e)}); "
              "probing each run", file=log.stream)
        tables = _load_and_aggregate(spark, _probe(spark, all_runs, log), log)
    if tables is None or not (tables.meta.role == "candidate").any():
        raise NoInput("no usable candidate runs (see the warnings above)")

    omb_t = None
    if omb_files:
        try:
            omb_df = L.read_omb(spark, omb_files, log)
            omb_t = A.omb_tables(omb_df) if omb_df is not None else None
        except _spark_errors() as e:
            print(f"WARNING: skipping OMB results: Spark failed ({L._first_line(e)})",
                  file=log.stream)

    comparisons = C.baseline_comparisons(tables, threshold, alpha)
    peers = C.peer_comparisons(tables)
    partition_cost = C.partition_cost_rows(tables)
    omb_list = C.omb_rows(omb_t)
    matches = C.omb_matches(tables, omb_list)

    out_dir.mkdir(parents=True, exist_ok=True)
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(exist_ok=True)
    labels = {r.run_id: f"{r.broker} ({r.role}): {r.run_id[-24:]}"
              for r in tables.meta.itertuples()}
    run_curves = tables.curves[tables.curves.key_kind == "run"]
    omb_curves = omb_labels = None
    if omb_t is not None:
        keep = {x["file"] for m in matches for x in m["matches"]}
        omb_curves = omb_t["curves"][omb_t["curves"].file.isin(keep)]
        omb_labels = {x["file"]: f"Kafka {x['kafka_version']}, {x['source']}: "
                                 f"{x['file'].rsplit('/', 1)[-1]}" for x in omb_list}
    plots = {
        "throughput": P.throughput_over_time(tables.intervals, tables.meta,
                                             plot_dir / "throughput.png"),
        "latency_publish": P.latency_percentiles(run_curves, labels, "publish",
                                                 plot_dir / "latency_publish.png",
                                                 omb_curves, omb_labels),
        "latency_e2e": P.latency_percentiles(run_curves, labels, "e2e",
                                             plot_dir / "latency_e2e.png", omb_curves, omb_labels),
        "regression_deltas": P.regression_deltas(comparisons, threshold,
                                                 plot_dir / "regression_deltas.png"),
    }
    model = {
        "generated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "status": C.overall_status(comparisons),
        "threshold": threshold, "alpha": alpha,
        "runs": C.run_rows(tables),
        "comparisons": comparisons, "peers": peers, "omb": omb_list, "omb_matches": matches,
        "partition_cost": partition_cost,
        "skipped": log.skipped,
        "plots": {k: f"plots/{v.name}" for k, v in plots.items() if v is not None},
        "baseline_requested": bool(baseline),
    }
    R.write_outputs(model, out_dir)
    return model

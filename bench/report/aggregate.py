"""Spark aggregations; each returns a small pandas table.

Interval trimming (per run): an interval is *kept* when it starts at or after
``warmup_s`` and lasts at least half the nominal ``interval_ms`` (drops the
short final interval). A run too short to keep any interval that way (a fast
consume of a small topic ends inside its warm-up) keeps its full intervals, or
failing those all of non-zero duration, so it still has numbers. Throughput =
records (bytes) per kept interval divided by its duration; MB = 10**6 bytes.

Latency percentiles come from *merged* histograms: bucket counts of all kept
intervals are summed in Spark per key (a run, or a group of runs), then the
percentile is the upper bound of the first bucket whose cumulative count
reaches ``max(1, ceil(q/100 * total))`` -- the same rule as
:meth:`bench.trace.LatencyHistogram.percentile`.
"""
from __future__ import annotations

import pandas as pd

QUANTILES = (50.0, 95.0, 99.0, 99.9)


def qcol(q: float) -> str:
    """Column name for percentile q: 50 -> "p50", 99.9 -> "p99_9"."""
    return "p" + (f"{q:g}").replace(".", "_")


def manifest_table(manifests) -> pd.DataFrame:
    from pyspark.sql import functions as F
    flat = manifests.select(
        "run_id", "tool", "broker", "broker_version", "client", "git_commit", "started_at",
        "ended_at", "warmup_s", "interval_ms", "session_id", F.col("round").alias("round"),
        *[F.col(f"workload.{c}").alias(f"wl_{c}") for c in
          ("name", "topics", "partitions", "message_size", "producer_rate", "producers",
           "consumers", "acks", "linger_ms", "batch_size", "compression", "key_distribution",
           "records", "duration_s", "records_per_batch")],
        *[F.col(f"machine.{c}").alias(f"m_{c}") for c in
          ("hostname", "cpu_model", "logical_cpus", "mem_total_gb", "os", "python")])
    return flat.toPandas()


def interval_rates(spark, iv, meta: pd.DataFrame):
    """Intervals joined with their run's warm-up, with ``kept`` and rate columns."""
    from pyspark.sql import functions as F
    m = spark.createDataFrame(
        meta[["run_id", "warmup_s", "interval_ms"]].astype(
            {"warmup_s": "float64", "interval_ms": "int64"}),
        "run_id string, warmup_s double, interval_ms long")
    from pyspark.sql import Window
    d = F.col("duration_ms").cast("double")
    run = Window.partitionBy("run_id")
    full = F.col("duration_ms") * 2 >= F.col("interval_ms")
    trimmed = (F.col("start_ms") >= F.col("warmup_s") * 1000.0) & full
    any_trimmed = F.max(trimmed.cast("int")).over(run) == 1
    any_full = F.max(full.cast("int")).over(run) == 1
    kept = (F.when(any_trimmed, trimmed)            # the rule
            .when(any_full, full)                   # ended inside its warm-up
            .otherwise(F.col("duration_ms") > 0))   # shorter than one interval
    return (iv.join(F.broadcast(m), "run_id")
            .withColumn("kept", kept)
            .withColumn("send_rps", F.when(d > 0, F.col("records_sent") * 1000.0 / d))
            .withColumn("recv_rps", F.when(d > 0, F.col("records_received") * 1000.0 / d))
            .withColumn("send_mbps", F.when(d > 0, F.col("bytes_sent") / d / 1000.0))
            .withColumn("recv_mbps", F.when(d > 0, F.col("bytes_received") / d / 1000.0)))


def collect_intervals(ivr) -> pd.DataFrame:
    return (ivr.select("run_id", "interval_index", "start_ms", "duration_ms", "kept", "errors",
                       "send_rps", "recv_rps", "send_mbps", "recv_mbps",
                       "broker_cpu_s", "client_cpu_s")
            .orderBy("run_id", "interval_index").toPandas())


def throughput_summary(ivr) -> pd.DataFrame:
    """Per run over kept intervals: n, mean/std of rates, totals, CPU per MB."""
    from pyspark.sql import functions as F
    k = ivr.where("kept")
    mb = F.when(F.col("bytes_sent") > 0, F.col("bytes_sent")).otherwise(F.col("bytes_received")) / 1e6
    aggs = [F.count("*").alias("n_intervals"),
            F.sum("errors").alias("errors"),
            F.sum("records_sent").alias("records_sent"),
            F.sum("records_received").alias("records_received"),
            F.sum(F.col("duration_ms")).alias("kept_ms")]
    for c in ("send_rps", "recv_rps", "send_mbps", "recv_mbps"):
        aggs += [F.mean(c).alias(f"{c}_mean"), F.stddev_samp(c).alias(f"{c}_std")]
    for who in ("broker", "client"):
        cpu = F.col(f"{who}_cpu_s")
        aggs += [F.sum(cpu).alias(f"{who}_cpu_s"),
                 F.sum(F.when(cpu.isNotNull(), mb)).alias(f"{who}_cpu_mb")]
    out = k.groupBy("run_id").agg(*aggs).toPandas()
    for who in ("broker", "client"):
        out[f"{who}_cpu_s_per_mb"] = out[f"{who}_cpu_s"] / out[f"{who}_cpu_mb"].where(
            out[f"{who}_cpu_mb"] > 0)
    return out


def kept_latency(lat, ivr):
    """Latency rows of kept intervals only."""
    k = ivr.where("kept").select("run_id", "interval_index")
    return lat.join(k, ["run_id", "interval_index"], "left_semi")


def merged_percentiles(spark, lat_kept, groups: pd.DataFrame,
                       quantiles=QUANTILES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Percentiles from merged histograms, per run and per run group.

    ``groups`` maps run_id -> group_id. Returns ``(percentiles, merged)``:
    percentiles has key_kind ("run"/"group"), key, metric, n, mean_us, max_us
    and one column per quantile (:func:`qcol`); merged has the summed buckets
    (key_kind, key, metric, bucket, lower_us, upper_us, count) for plots.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    g = spark.createDataFrame(groups[["run_id", "group_id"]], "run_id string, group_id string")
    by_run = lat_kept.select(F.lit("run").alias("key_kind"), F.col("run_id").alias("key"),
                             "metric", "bucket", "lower_us", "upper_us", "count")
    by_group = (lat_kept.join(F.broadcast(g), "run_id")
                .select(F.lit("group").alias("key_kind"), F.col("group_id").alias("key"),
                        "metric", "bucket", "lower_us", "upper_us", "count"))
    merged = (by_run.unionByName(by_group)
              .groupBy("key_kind", "key", "metric", "bucket", "lower_us", "upper_us")
              .agg(F.sum("count").alias("count"))
              .where(F.col("count") > 0)).cache()
    try:
        part = ["key_kind", "key", "metric"]
        w = (Window.partitionBy(*part).orderBy("bucket")
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
        c = (merged.withColumn("cum", F.sum("count").over(w))
             .withColumn("total", F.sum("count").over(Window.partitionBy(*part))))
        aggs = [F.first("total").alias("n"),
                (F.sum(F.col("count") * (F.col("lower_us") + F.col("upper_us")) / 2.0)
                 / F.first("total")).alias("mean_us"),
                F.max("upper_us").alias("max_us")]
        for q in quantiles:
            rank = F.greatest(F.lit(1.0), F.ceil(F.col("total") * (q / 100.0) - 1e-9))
            aggs.append(F.min(F.when(F.col("cum") >= rank, F.col("upper_us"))).alias(qcol(q)))
        pct = c.groupBy(*part).agg(*aggs).toPandas()
        curves = merged.orderBy(*part, "bucket").toPandas()
    finally:
        merged.unpersist()
    return pct, curves


def latency_intervals(lat_kept, run_ids: list[str]) -> pd.DataFrame:
    """Per-interval bucket counts of the given runs (for the bootstrap)."""
    from pyspark.sql import functions as F
    if not run_ids:
        return pd.DataFrame(columns=["run_id", "interval_index", "metric", "bucket",
                                     "upper_us", "count"])
    return (lat_kept.where(F.col("run_id").isin(run_ids))
            .select("run_id", "interval_index", "metric", "bucket", "upper_us", "count")
            .toPandas())


# -- OMB -------------------------------------------------------------------------
def omb_tables(omb, quantiles=QUANTILES) -> dict[str, pd.DataFrame]:
    """OMB results -> {"meta" (+ throughput), "percentiles", "curves"} (pandas).

    Throughput: mean/std/n over the 10 s ``publishRate`` samples (OMB already
    excludes its warm-up). Percentiles from the whole-run
    ``aggregated*LatencyQuantiles`` maps (cumulative percent -> ms): the value
    at q is the smallest recorded value whose cumulative percent is >= q.
    """
    from pyspark.sql import functions as F
    iv = (omb.select("file", F.posexplode("publishRate").alias("idx", "publish_rate"),
                     "consumeRate")
          .select("file", "idx", "publish_rate",
                  F.try_element_at("consumeRate", F.col("idx") + 1).alias("consume_rate")))
    tp = (iv.groupBy("file").agg(F.count("*").alias("n_intervals"),
                                 F.mean("publish_rate").alias("publish_rps_mean"),
                                 F.stddev_samp("publish_rate").alias("publish_rps_std"),
                                 F.mean("consume_rate").alias("consume_rps_mean")))
    meta = omb.select("file", "workload", "driver", "messageSize", "topics", "partitions",
                      "producersPerTopic", "consumersPerTopic", "producerRate",
                      "sampleRateMillis").join(tp, "file", "left").toPandas()
    qcols = {"publish": "aggregatedPublishLatencyQuantiles",
             "e2e": "aggregatedEndToEndLatencyQuantiles"}
    long = None
    for metric, col in qcols.items():
        x = (omb.select("file", F.explode(col).alias("qkey", "value_ms"))
             .select("file", F.lit(metric).alias("metric"),
                     F.col("qkey").cast("double").alias("quantile"), "value_ms"))
        long = x if long is None else long.unionByName(x)
    long = long.cache()
    try:
        aggs = [F.max("value_ms").alias("max_ms"), F.count("*").alias("points")]
        for q in quantiles:
            aggs.append(F.min(F.when(F.col("quantile") >= q - 1e-9, F.col("value_ms"))).alias(qcol(q)))
        pct = long.groupBy("file", "metric").agg(*aggs).toPandas()
        curves = long.orderBy("file", "metric", "quantile").toPandas()
    finally:
        long.unpersist()
    return {"meta": meta, "percentiles": pct, "curves": curves}

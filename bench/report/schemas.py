"""Explicit Spark schemas for every input (no schema inference anywhere).

The run schemas mirror :data:`bench.trace.INTERVALS_SCHEMA` and
:data:`bench.trace.LATENCY_SCHEMA` (tests check they agree).
"""
from __future__ import annotations

from pyspark.sql.types import (ArrayType, BooleanType, DoubleType, IntegerType, LongType,
                               MapType, StringType, StructField, StructType)

INTERVALS = StructType([
    StructField("interval_index", IntegerType(), False),
    StructField("start_ms", LongType(), False),
    StructField("duration_ms", LongType(), False),
    StructField("records_sent", LongType(), False),
    StructField("bytes_sent", LongType(), False),
    StructField("records_received", LongType(), False),
    StructField("bytes_received", LongType(), False),
    StructField("errors", LongType(), False),
    StructField("broker_cpu_s", DoubleType(), True),
    StructField("client_cpu_s", DoubleType(), True),
])

LATENCY = StructType([
    StructField("interval_index", IntegerType(), False),
    StructField("metric", StringType(), False),
    StructField("bucket", IntegerType(), False),
    StructField("lower_us", LongType(), False),
    StructField("upper_us", LongType(), False),
    StructField("count", LongType(), False),
])

_WORKLOAD = StructType([
    StructField("name", StringType()),
    StructField("topics", LongType()),
    StructField("partitions", LongType()),
    StructField("message_size", LongType()),
    StructField("producer_rate", DoubleType()),
    StructField("producers", LongType()),
    StructField("consumers", LongType()),
    StructField("acks", StringType()),
    StructField("linger_ms", DoubleType()),
    StructField("batch_size", LongType()),
    StructField("compression", StringType()),
    StructField("key_distribution", StringType()),
    StructField("records", LongType()),
    StructField("duration_s", DoubleType()),
    StructField("records_per_batch", LongType()),     # bench.partition_cost
])

_MACHINE = StructType([
    StructField("hostname", StringType()),
    StructField("cpu_model", StringType()),
    StructField("logical_cpus", LongType()),
    StructField("mem_total_gb", DoubleType()),
    StructField("os", StringType()),
    StructField("python", StringType()),
])

MANIFEST = StructType([
    StructField("schema_version", LongType()),
    StructField("run_id", StringType()),
    StructField("tool", StringType()),
    StructField("broker", StringType()),
    StructField("broker_version", StringType()),
    StructField("client", StringType()),
    StructField("workload", _WORKLOAD),
    StructField("git_commit", StringType()),
    StructField("started_at", StringType()),
    StructField("ended_at", StringType()),
    StructField("warmup_s", DoubleType()),
    StructField("interval_ms", LongType()),
    StructField("session_id", StringType()),
    StructField("round", LongType()),
    StructField("machine", _MACHINE),
])

# OpenMessaging-Benchmark TestResult JSON (Latencies in ms, rates in msg/s).
_D = DoubleType()
_OMB_SERIES = ["publishRate", "consumeRate",
               "publishLatencyAvg", "publishLatency50pct", "publishLatency99pct",
               "publishLatency999pct", "publishLatencyMax",
               "endToEndLatencyAvg", "endToEndLatency50pct", "endToEndLatency99pct",
               "endToEndLatency999pct", "endToEndLatencyMax"]
OMB = StructType(
    [StructField("workload", StringType()),
     StructField("driver", StringType()),
     StructField("messageSize", LongType()),
     StructField("topics", LongType()),
     StructField("partitions", LongType()),
     StructField("producersPerTopic", LongType()),
     StructField("consumersPerTopic", LongType()),
     StructField("producerRate", DoubleType()),
     StructField("sampleRateMillis", LongType())]
    + [StructField(s, ArrayType(_D)) for s in _OMB_SERIES]
    + [StructField("aggregatedPublishLatencyQuantiles", MapType(StringType(), _D)),
       StructField("aggregatedEndToEndLatencyQuantiles", MapType(StringType(), _D))])

__all__ = ["INTERVALS", "LATENCY", "MANIFEST", "OMB", "BooleanType"]

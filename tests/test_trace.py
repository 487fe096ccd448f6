"""bench.trace: histogram bucketing/percentiles and the run trace writer."""
import json
import math
import os
import threading
import time
from fractions import Fraction

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench import trace
from bench.trace import (BUCKET_COUNT, LatencyHistogram, TraceWriter, bucket_bounds, bucket_index,
                         bucket_indexes)


class FakeClock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def manifest(**over):
    m = {"tool": "bench.produce", "broker": "kbroker", "broker_version": "0.1.0",
         "client": "confluent", "warmup_s": 1, "git_commit": "deadbeef",
         "machine": {"hostname": "h", "cpu_model": "c", "logical_cpus": 2, "mem_total_gb": 1.0,
                     "os": "linux", "python": "3.11"},
         "workload": {"name": "w", "topics": 1, "partitions": 3, "message_size": 100,
                      "producer_rate": 0, "consumers": 1, "acks": "all", "linger_ms": 5,
                      "batch_size": 16384, "compression": "none", "key_distribution": "none",
                      "records": 1000}}
    m.update(over)
    return m


def exact_percentile(ordered, q):
    """Order statistic of rank ceil(q/100 * n) in exact rational arithmetic
    (numpy's inverted_cdf, minus its float rounding at integer ranks)."""
    n = len(ordered)
    rank = max(1, math.ceil(Fraction(str(q)) * n / 100))
    return ordered[rank - 1]


# -- bucketing -------------------------------------------------------------------
def test_buckets_tile_the_range_and_invert():
    prev_upper = -1
    for i in range(BUCKET_COUNT):
        lo, hi = bucket_bounds(i)
        assert lo == prev_upper + 1
        assert bucket_index(lo) == i and bucket_index(hi) == i
        if lo >= 256:   # 2 significant digits: width <= lower/128
            assert hi - lo + 1 <= lo / 128
        prev_upper = hi
    assert prev_upper == trace.MAX_TRACKABLE_US
    assert bucket_index(10**15) == BUCKET_COUNT - 1      # clamped
    with pytest.raises(ValueError):
        bucket_bounds(BUCKET_COUNT)


def test_vectorised_bucket_index_matches_scalar():
    rng = np.random.default_rng(7)
    v = np.concatenate([rng.integers(0, 2**40, 5000), rng.integers(0, 5000, 5000),
                        2 ** np.arange(41) - 1, 2 ** np.arange(40)])
    assert (bucket_indexes(v) == np.array([bucket_index(int(x)) for x in v])).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_percentiles_match_numpy_within_precision(seed):
    rng = np.random.default_rng(seed)
    samples = np.floor(rng.lognormal(np.log(1500), 1.2, 20000) + 0.5)
    h = LatencyHistogram()
    h.record_many(samples[:10000])
    for x in samples[10000:10500]:
        h.record(float(x))
    h2 = LatencyHistogram()
    h2.record_many(samples[10500:])
    h.merge(h2)
    assert h.total == len(samples)
    ordered = np.sort(samples)
    for q in (0, 1, 50, 90, 95, 99, 99.9, 99.99, 100):
        exact = exact_percentile(ordered, q)
        got = h.percentile(q)
        # same bucket as the exact order statistic, reported as its upper bound
        assert bucket_index(int(exact)) == bucket_index(got)
        assert exact <= got <= exact * (1 + trace.RELATIVE_PRECISION) + 1
    assert h.min_us == samples.min() and h.max_us == samples.max()
    assert abs(h.mean() - samples.mean()) <= samples.mean() * trace.RELATIVE_PRECISION


def test_buckets_round_trip_and_merge_is_addition():
    rng = np.random.default_rng(3)
    a, b = LatencyHistogram(), LatencyHistogram()
    a.record_many(rng.integers(0, 10**6, 3000))
    b.record_many(rng.integers(0, 10**4, 3000))
    back = LatencyHistogram.from_buckets(a.to_buckets())
    assert (back.counts() == a.counts()).all() and back.total == a.total
    merged = LatencyHistogram.from_buckets(a.to_buckets()).merge(b)
    assert (merged.counts() == a.counts() + b.counts()).all()
    up = trace.BUCKET_UPPER_US
    for q in (50, 99, 99.9):
        assert trace.percentile_from_counts(merged.counts(), up, q) == merged.percentile(q)


def test_histogram_rejects_bad_values_and_empty():
    h = LatencyHistogram()
    with pytest.raises(ValueError):
        h.percentile(50)
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            h.record(bad)
    with pytest.raises(ValueError):
        h.record_many([1, -2])
    with pytest.raises(ValueError):
        LatencyHistogram.from_buckets([(BUCKET_COUNT, 1)])
    h.record(1e30)      # clamped, memory stays fixed
    assert h.percentile(100) == trace.MAX_TRACKABLE_US
    assert len(h.counts()) == BUCKET_COUNT


# -- writer --------------------------------------------------------------------------
def test_writer_intervals_latency_and_atomic_close(tmp_path):
    clock = FakeClock()
    tw = TraceWriter(tmp_path, manifest(run_id="r1"), clock=clock, wall_clock=lambda: 1.7e9,
                     client_cpu=False, flush_every=2)
    tw.record_send(10, 1000)
    tw.record_latency("publish", 1500)
    tw.record_latency("publish", 1502)
    tw.record_cpu(broker_cpu_s=0.25)
    clock.t += 1.0                      # interval 1
    tw.record_receive(7, 700)
    tw.record_latency("e2e", 2000)
    clock.t += 2.5                      # intervals 2 (empty) and 3
    tw.record_error()
    tw.record_send(5, 500)
    clock.t += 0.3
    assert not tw.run_dir.exists()      # only the .partial dir while running
    assert (tmp_path / ".r1.partial").is_dir()
    run_dir = tw.close()
    assert tw.close() == run_dir        # idempotent
    assert not (tmp_path / ".r1.partial").exists()
    assert sorted(os.listdir(run_dir)) == ["intervals.parquet", "latency.parquet", "manifest.json"]

    m, iv, lat = trace.read_run(run_dir)
    assert trace.validate_manifest(m) == []
    assert m["run_id"] == "r1" and m["interval_ms"] == 1000 and m["intervals"] == 4
    assert m["histogram"]["significant_digits"] == 2
    iv = iv.to_pylist()
    assert [r["interval_index"] for r in iv] == [0, 1, 2, 3]
    assert [r["start_ms"] for r in iv] == [0, 1000, 2000, 3000]
    assert [r["duration_ms"] for r in iv] == [1000, 1000, 1000, 800]
    assert [r["records_sent"] for r in iv] == [10, 0, 0, 5]
    assert [r["records_received"] for r in iv] == [0, 7, 0, 0]
    assert [r["errors"] for r in iv] == [0, 0, 0, 1]
    assert iv[0]["broker_cpu_s"] == 0.25 and iv[1]["broker_cpu_s"] is None
    assert all(r["client_cpu_s"] is None for r in iv)
    lat = lat.to_pylist()
    pub = [r for r in lat if r["metric"] == "publish"]
    assert [(r["interval_index"], r["count"]) for r in pub] == [(0, 2)]  # 1500, 1502 share a bucket
    assert pub[0]["lower_us"] <= 1500 and pub[0]["upper_us"] >= 1502
    e2e = [r for r in lat if r["metric"] == "e2e"]
    assert [(r["interval_index"], r["count"], r["bucket"]) for r in e2e] == [(1, 1, bucket_index(2000))]
    with pytest.raises(RuntimeError):
        tw.record_send(1, 1)


def test_writer_abort_and_exception_leave_no_run(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with TraceWriter(tmp_path, manifest(run_id="boom"), client_cpu=False) as tw:
            tw.record_send(1, 1)
            1 / 0
    assert os.listdir(tmp_path) == []
    tw = TraceWriter(tmp_path, manifest(run_id="ab"), client_cpu=False)
    tw.abort()
    assert os.listdir(tmp_path) == []


def test_writer_validates_manifest_and_refuses_existing_run(tmp_path):
    with pytest.raises(ValueError, match="workload missing 'acks'"):
        m = manifest()
        del m["workload"]["acks"]
        TraceWriter(tmp_path, m)
    with pytest.raises(ValueError, match="records' or 'duration_s"):
        m = manifest()
        del m["workload"]["records"]
        TraceWriter(tmp_path, m)
    with pytest.raises(ValueError, match="bad run_id"):
        TraceWriter(tmp_path, manifest(run_id="../x"))
    with pytest.raises(ValueError, match="metric"):
        tw = TraceWriter(tmp_path, manifest(run_id="m"), client_cpu=False)
        tw.record_latency("Bad Metric", 1)
    tw.abort()
    TraceWriter(tmp_path, manifest(run_id="dup"), client_cpu=False).close()
    with pytest.raises(FileExistsError):
        TraceWriter(tmp_path, manifest(run_id="dup"))


def test_writer_is_thread_safe(tmp_path):
    tw = TraceWriter(tmp_path, manifest(run_id="threads"), interval_ms=20, client_cpu=True,
                     broker_pid=os.getpid())
    n_threads, per_thread = 4, 3000

    def work(seed):
        rng = np.random.default_rng(seed)
        for v in rng.integers(1, 10**5, per_thread):
            tw.record_send(1, 10)
            tw.record_latency("publish", int(v))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    run_dir = tw.close()
    _, iv, lat = trace.read_run(run_dir)
    assert sum(iv.column("records_sent").to_pylist()) == n_threads * per_thread
    assert sum(lat.column("count").to_pylist()) == n_threads * per_thread
    idx = iv.column("interval_index").to_pylist()
    assert idx == list(range(len(idx)))
    assert all(x is not None for x in iv.column("broker_cpu_s").to_pylist())
    assert all(x is not None for x in iv.column("client_cpu_s").to_pylist())


def test_autotick_closes_idle_intervals(tmp_path):
    tw = TraceWriter(tmp_path, manifest(run_id="tick"), interval_ms=20, client_cpu=False,
                     autotick=True)
    deadline = time.monotonic() + 5
    while tw.interval_index < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tw.interval_index >= 3
    run_dir = tw.close()
    assert pq.read_metadata(run_dir / "intervals.parquet").num_rows >= 4


def test_environment_helpers():
    facts = trace.machine_facts()
    assert set(facts) == {"hostname", "cpu_model", "logical_cpus", "mem_total_gb", "os", "python"}
    assert facts["logical_cpus"] >= 1
    commit = trace.git_commit()
    assert commit is None or len(commit.split("-")[0]) == 40
    assert trace.process_cpu_seconds(os.getpid()) >= 0
    assert trace.process_cpu_seconds(2**31 - 1) is None
    rid = trace.new_run_id("bench.produce", "kbroker")
    assert "bench.produce-kbroker" in rid and trace._RUN_ID_RE.match(rid)
    json.dumps(facts)

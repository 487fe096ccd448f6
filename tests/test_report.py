"""bench.report: the PySpark regression report on generated traces and the
real OMB results in bench/data (one shared local SparkSession)."""
import json
import math
import pathlib
import shutil
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pyspark  # noqa: F401  (the bench extra; tools/test.sh installs it)

from bench import trace  # noqa: E402
from bench.report import cli, stats  # noqa: E402
from bench.report import schemas as S  # noqa: E402
from conftest_spark import spark  # noqa: E402,F401

ROOT = pathlib.Path(__file__).resolve().parent.parent
OMB_DIR = ROOT / "bench" / "data" / "kafka-bench-results"


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make_run(results, *, seed, rate=10_000.0, lat_us=2000.0, n_intervals=24, warmup_s=2,
             broker="kbroker", session_id=None, round_=None, run_id=None, git_commit="0" * 40):
    """Write a run with TraceWriter from known raw samples; return (run_dir,
    {metric: raw samples of the kept (post-warm-up, full) intervals})."""
    rng = np.random.default_rng(seed)
    clock = FakeClock()
    m = {"tool": "bench.produce", "broker": broker, "broker_version": "0.1.0",
         "client": "confluent", "warmup_s": warmup_s, "session_id": session_id,
         "round": round_, "git_commit": git_commit,
         "machine": {"hostname": "testhost", "cpu_model": "Test CPU", "logical_cpus": 2,
                     "mem_total_gb": 8.0, "os": "Linux", "python": "3.11"},
         "workload": {"name": "produce-1kb", "topics": 1, "partitions": 100,
                      "message_size": 1024, "producer_rate": 0, "consumers": 1, "acks": "all",
                      "linger_ms": 5, "batch_size": 16384, "compression": "none",
                      "key_distribution": "none", "duration_s": n_intervals}}
    if run_id:
        m["run_id"] = run_id
    tw = trace.TraceWriter(results, m, clock=clock, wall_clock=lambda: 1.7e9, client_cpu=False)
    raw = {"publish": [], "e2e": []}
    for k in range(n_intervals):
        n = int(rng.normal(rate, rate * 0.03))
        tw.record_send(n, n * 1024)
        tw.record_receive(n, n * 1024)
        tw.record_cpu(broker_cpu_s=0.4)
        pub = np.floor(rng.lognormal(np.log(lat_us), 0.6, 300) + 0.5)
        e2e = pub + np.floor(rng.exponential(500, 300))
        tw.record_latencies("publish", pub)
        tw.record_latencies("e2e", e2e)
        if k >= warmup_s:
            raw["publish"].append(pub)
            raw["e2e"].append(e2e)
        clock.t = 1000.0 + k + 1
    clock.t += 0.2              # short final interval: trimmed by the report
    run_dir = tw.close()
    return run_dir, {k: np.concatenate(v) if v else np.array([]) for k, v in raw.items()}


def exact(samples, q):
    s = np.sort(samples)
    return s[max(1, math.ceil(Fraction(str(q)) * len(s) / 100)) - 1]


def assert_hist_close(reported_ms, samples, q):
    """Reported percentile is the upper bound of the exact order statistic's bucket."""
    x = exact(samples, q)
    got_us = round(reported_ms * 1000)
    assert trace.bucket_index(int(x)) == trace.bucket_index(got_us), (q, x, got_us)
    assert x <= got_us <= x * (1 + trace.RELATIVE_PRECISION) + 1


def read_outputs(out):
    verdict = json.loads((out / "verdict.json").read_text())
    return verdict, (out / "report.md").read_text(), (out / "report.html").read_text()


# -- schemas ----------------------------------------------------------------------
def test_spark_schemas_mirror_trace_schemas():
    to_spark = {pa.int32(): "integer", pa.int64(): "long", pa.float64(): "double",
                pa.string(): "string"}
    for arrow, spark_schema in ((trace.INTERVALS_SCHEMA, S.INTERVALS),
                                (trace.LATENCY_SCHEMA, S.LATENCY)):
        assert [f.name for f in arrow] == spark_schema.fieldNames()
        for f in arrow:
            assert to_spark[f.type] == spark_schema[f.name].dataType.typeName()


# -- regression: 20% slower is flagged, with OMB comparison ------------------------------
@pytest.fixture(scope="module")
def regression_case(spark, tmp_path_factory):   # noqa: F811
    base = tmp_path_factory.mktemp("base")
    cand = tmp_path_factory.mktemp("cand")
    out = tmp_path_factory.mktemp("out") / "report"
    raw_base = [make_run(base, seed=s)[1] for s in (1, 2)]
    cand_dir, raw_cand = make_run(cand, seed=3, rate=8_000.0, lat_us=2400.0)
    rc = cli.main(["--runs", str(cand), "--baseline", str(base), "--omb", str(OMB_DIR),
                   "--out", str(out), "--fail-on-regression"], spark=spark)
    return rc, out, raw_base, raw_cand, cand_dir


def test_regression_flagged_and_exit_code(regression_case):
    rc, out, *_ = regression_case
    verdict, md, html = read_outputs(out)
    assert rc == cli.EXIT_REGRESSION
    assert verdict["status"] == "regression"
    (comp,) = verdict["comparisons"]
    metrics = {m["metric"]: m for m in comp["metrics"]}
    tp = metrics["throughput_send"]
    assert tp["regression"] and tp["p_value"] < 1e-6
    assert -23 < tp["delta_pct"] < -17 and tp["ci_high_pct"] < -5
    assert metrics["publish_p50"]["regression"] and metrics["publish_p50"]["delta_pct"] > 10
    assert not metrics["publish_max"]["gates_verdict"]
    assert metrics["broker_cpu_per_mb"]["candidate"] > metrics["broker_cpu_per_mb"]["baseline"]
    for m in metrics.values():
        assert set(m) >= {"baseline", "candidate", "delta_pct", "p_value", "regression"}


def test_percentiles_from_merged_histograms_match_numpy(regression_case):
    _, out, raw_base, raw_cand, cand_dir = regression_case
    verdict, _, _ = read_outputs(out)
    run = next(r for r in verdict["runs"] if r["run_id"] == cand_dir.name)
    for metric in ("publish", "e2e"):
        assert run[f"{metric}_n"] == len(raw_cand[metric])
        for q, col in ((50, "p50"), (95, "p95"), (99, "p99"), (99.9, "p99_9"), (100, "max")):
            assert_hist_close(run[f"{metric}_{col}_ms"], raw_cand[metric], q)
    # the baseline group merges both baseline runs' histograms (not an average of percentiles)
    pooled = np.concatenate([r["publish"] for r in raw_base])
    metrics = {m["metric"]: m for m in verdict["comparisons"][0]["metrics"]}
    for q, col in ((50, "p50"), (99, "p99"), (99.9, "p99_9")):
        assert_hist_close(metrics[f"publish_{col}"]["baseline"], pooled, q)


def test_outputs_exist_with_tables(regression_case):
    _, out, *_ = regression_case
    verdict, md, html = read_outputs(out)
    for png in ("throughput", "latency_publish", "latency_e2e", "regression_deltas"):
        data = (out / "plots" / f"{png}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert f"plots/{png}.png" in md and f"plots/{png}.png" in html
    assert "| throughput_send | records/s | higher |" in md
    assert "## Candidate vs baseline" in md and "<h2>Candidate vs baseline</h2>" in html
    n_tables = sum(1 for line in md.splitlines() if line.startswith("|---|"))
    assert html.count("<table>") == n_tables >= 5
    # OMB: cross-machine label and each side's hardware next to its numbers
    assert "cross-machine, not like-for-like" in md
    assert "testhost: Test CPU, 2 logical CPUs, 8 GB RAM, Linux" in md
    assert "i3en.2xlarge" in md and "t3.large" in md
    (match,) = verdict["omb"]
    best = match["matches"][0]
    assert best["message_size"] == 1024 and best["total_partitions"] == 100
    assert "i3en.2xlarge" in best["hardware"]


def test_omb_percentiles_agree_with_published_aggregates(regression_case):
    _, out, *_ = regression_case
    verdict, md, _ = read_outputs(out)
    rows = {x["file"]: x for m in verdict["omb"] for x in m["matches"]}
    f = "confluent-2020-kafka-2.6/latency_default-sync-200k.json"
    src = json.loads((OMB_DIR / f).read_text())
    row = rows[f]
    for col, key in (("p50", "50pct"), ("p99", "99pct"), ("p99_9", "999pct")):
        assert row[f"publish_{col}_ms"] == pytest.approx(src[f"aggregatedPublishLatency{key}"], rel=0.01)
    assert row["publish_rps"] == pytest.approx(np.mean(src["publishRate"]))
    assert row["publish_max_ms"] == pytest.approx(src["aggregatedPublishLatencyMax"])
    assert "All published results read" in md and "vanlightly-omb-copy-2024/" in md


# -- same distribution: not flagged -----------------------------------------------------
def test_same_distribution_not_flagged(spark, tmp_path):   # noqa: F811
    for s in (11, 12):
        make_run(tmp_path / "base", seed=s)
    for s in (13, 14):
        make_run(tmp_path / "cand", seed=s)
    out = tmp_path / "out"
    rc = cli.main(["--runs", str(tmp_path / "cand"), "--baseline", str(tmp_path / "base"),
                   "--omb", "--out", str(out), "--fail-on-regression"], spark=spark)
    verdict, md, _ = read_outputs(out)
    assert rc == cli.EXIT_OK
    assert verdict["status"] == "ok"
    flagged = [m["metric"] for m in verdict["comparisons"][0]["metrics"] if m["regression"]]
    assert flagged == []


# -- runs from a dirty tree are marked and never enter a verdict --------------------------
def test_dirty_tree_runs_excluded_from_verdicts(spark, tmp_path):   # noqa: F811
    for s in (21, 22):
        make_run(tmp_path / "base", seed=s)
    clean, _ = make_run(tmp_path / "cand", seed=23)
    # 30% slower, but measured on a tree with uncommitted changes: no regression verdict
    dirty, _ = make_run(tmp_path / "cand", seed=24, rate=7_000.0, git_commit="1" * 40 + "-dirty")
    out = tmp_path / "out"
    rc = cli.main(["--runs", str(tmp_path / "cand"), "--baseline", str(tmp_path / "base"),
                   "--omb", "--out", str(out), "--fail-on-regression"], spark=spark)
    verdict, md, _ = read_outputs(out)
    assert rc == cli.EXIT_OK and verdict["status"] == "ok"
    (comp,) = verdict["comparisons"]
    ids = {r["run_id"]: r for r in verdict["runs"]}
    dirty_id = next(i for i, r in ids.items() if r["git_commit"].endswith("-dirty"))
    assert comp["excluded_runs"] == [dirty_id] and dirty_id not in comp["candidate_runs"]
    assert len(comp["candidate_runs"]) == 1 and not ids[dirty_id]["clean_tree"]
    assert "NO (excluded from verdicts)" in md and "1 of 4 runs were measured on a dirty tree" in md

    # only dirty candidates: the comparison stands without a verdict
    only = tmp_path / "only-dirty"
    make_run(only, seed=25, rate=7_000.0, git_commit=None)
    rc = cli.main(["--runs", str(only), "--baseline", str(tmp_path / "base"),
                   "--omb", "--out", str(tmp_path / "out2"), "--fail-on-regression"], spark=spark)
    verdict, md, _ = read_outputs(tmp_path / "out2")
    assert rc == cli.EXIT_OK and verdict["status"] == "no-baseline"
    assert verdict["comparisons"][0]["no_verdict"] and "No verdict: every run" in md


# -- a run that ends inside its warm-up still has numbers --------------------------------
def test_run_shorter_than_warmup_keeps_all_intervals(spark, tmp_path):   # noqa: F811
    """A fast consume of a small topic can end before its warm-up does: the report keeps
    that run's intervals instead of showing no throughput at all."""
    short_dir, _ = make_run(tmp_path / "runs", seed=31, rate=5_000.0, n_intervals=2, warmup_s=3,
                            run_id="short")
    make_run(tmp_path / "runs", seed=32, rate=5_000.0, run_id="normal")
    out = tmp_path / "out"
    assert cli.main(["--runs", str(tmp_path / "runs"), "--omb", "--out", str(out)],
                    spark=spark) == cli.EXIT_OK
    verdict, md, _ = read_outputs(out)
    runs = {r["run_id"]: r for r in verdict["runs"]}
    short, normal = runs["short"], runs["normal"]
    # both full 1 s intervals kept, the 0.2 s tail still dropped
    assert short["kept_intervals"] == 2
    assert 4_500 < short["send_rps"] < 5_500 and short["publish_n"] == 2 * 300
    # a normal run is still trimmed: 24 intervals minus 2 of warm-up, tail dropped
    assert normal["kept_intervals"] == 22


# -- malformed inputs are reported and skipped ------------------------------------------
def test_malformed_inputs_reported_and_skipped(spark, tmp_path, capsys):   # noqa: F811
    runs, base = tmp_path / "runs", tmp_path / "base"
    make_run(base, seed=21, run_id="good-base")
    make_run(runs, seed=22, rate=7_000.0, run_id="good-cand")
    bad_json, _ = make_run(runs, seed=23, run_id="bad-json")
    text = (bad_json / "manifest.json").read_text()
    (bad_json / "manifest.json").write_text(text[: len(text) // 2])
    bad_col, _ = make_run(runs, seed=24, run_id="bad-column")
    t = pq.read_table(bad_col / "intervals.parquet").drop(["records_sent"])
    pq.write_table(t, bad_col / "intervals.parquet")
    bad_pq, _ = make_run(runs, seed=25, run_id="bad-parquet")
    data = (bad_pq / "latency.parquet").read_bytes()
    (bad_pq / "latency.parquet").write_bytes(data[: len(data) // 2])
    (runs / ".unfinished.partial").mkdir()          # a crashed writer: ignored silently
    empty = tmp_path / "empty"
    empty.mkdir()
    omb = tmp_path / "omb" / "vanlightly-omb-copy-2024"
    omb.mkdir(parents=True)
    shutil.copy(OMB_DIR / "omb-pr407-t3large-kafka-3.2.1" /
                "1-topic-1-partition-1kb-Kafka-2024-02-08-10-51-41.json", omb / "good.json")
    src = (OMB_DIR / "confluent-2020-kafka-2.6" / "latency_sync-200k.json").read_text()
    (omb / "truncated.json").write_text(src[:5000])
    (omb / "not-omb.json").write_text('{"hello": 1}')
    out = tmp_path / "out"
    rc = cli.main(["--runs", str(runs), str(empty), "--baseline", str(base),
                   "--omb", str(tmp_path / "omb"), "--out", str(out)], spark=spark)
    err = capsys.readouterr().err
    assert rc == cli.EXIT_OK        # a regression, but no --fail-on-regression
    verdict, md, _ = read_outputs(out)
    assert verdict["status"] == "regression"
    skipped = {pathlib.Path(s["path"]).name: s["reason"] for s in verdict["skipped_inputs"]}
    assert "malformed JSON" in skipped["bad-json"]
    assert "lacks column(s) records_sent" in skipped["bad-column"]
    assert "unreadable Parquet latency.parquet" in skipped["bad-parquet"]
    assert "empty" in skipped["empty"]
    assert "malformed JSON" in skipped["truncated.json"]
    assert "not an OMB result" in skipped["not-omb.json"]
    assert ".unfinished.partial" not in skipped
    for name in ("bad-json", "bad-column", "bad-parquet", "truncated.json", "not-omb.json"):
        assert f"WARNING: skipping {tmp_path}" in err and name in err
    assert "Traceback" not in err and "at org.apache" not in err
    assert [r["run_id"] for r in verdict["runs"]] == ["good-base", "good-cand"]
    assert "Skipped inputs" in md and "1-topic-1-partition-1kb" not in " ".join(skipped)


# -- peer comparison in one session ------------------------------------------------------
def test_peer_ratios_per_round(spark, tmp_path):   # noqa: F811
    for rnd in range(3):
        make_run(tmp_path / "r", seed=40 + rnd, rate=12_000.0, broker="kbroker",
                 session_id="s1", round_=rnd, n_intervals=8)
        make_run(tmp_path / "r", seed=50 + rnd, rate=10_000.0, broker="tansu",
                 session_id="s1", round_=rnd, n_intervals=8)
    out = tmp_path / "out"
    assert cli.main(["--runs", str(tmp_path / "r"), "--omb", "--out", str(out)], spark=spark) == 0
    verdict, md, _ = read_outputs(out)
    assert verdict["status"] == "no-baseline"
    peers = {p["metric"]: p for p in verdict["peers"]}
    tp = peers["throughput_send"]
    assert tp["peer"] == "tansu" and tp["rounds"] == 3
    assert 1.1 < tp["median_ratio"] < 1.3
    # 3 rounds cannot reach 95 %: the CI is the range at 1 - 2 * 0.5**3
    assert tp["ci_confidence"] == pytest.approx(0.75)
    assert "kbroker vs peer brokers" in md and "| tansu |" in md


def make_cost_run(results, *, api, n, broker, round_, req_us, cpu_s_per_interval, requests=100,
                  n_intervals=4):
    """A bench.partition_cost run: ``requests`` requests of N partitions per interval,
    each taking ``req_us``; the broker spends ``cpu_s_per_interval`` per interval."""
    clock = FakeClock()
    m = {"tool": "bench.partition_cost", "broker": broker, "broker_version": "0.1.0",
         "client": "kbroker", "warmup_s": 0, "session_id": "pc", "round": round_,
         "git_commit": "0" * 40,
         "machine": {"hostname": "testhost", "cpu_model": "Test CPU", "logical_cpus": 2,
                     "mem_total_gb": 8.0, "os": "Linux", "python": "3.11"},
         "workload": {"name": f"partition-cost-{api}-{n}p-100b", "topics": max(1, n // 50),
                      "partitions": n, "message_size": 100, "producer_rate": 0,
                      "consumers": 1 if api == "fetch" else 0, "acks": "1", "linger_ms": 0,
                      "batch_size": 170, "compression": "none", "key_distribution": "none",
                      "duration_s": n_intervals, "records_per_batch": 1}}
    tw = trace.TraceWriter(results, m, clock=clock, wall_clock=lambda: 1.7e9, client_cpu=False)
    metric = f"{api}_request"
    for k in range(n_intervals):
        if api == "produce":
            tw.record_send(requests * n, requests * n * 100)
        else:
            tw.record_receive(requests * n, requests * n * 100)
        tw.record_cpu(broker_cpu_s=cpu_s_per_interval)
        tw.record_latencies(metric, np.full(requests, float(req_us)))
        clock.t = 1000.0 + k + 1
    return tw.close()


def test_partition_cost_section(spark, tmp_path):   # noqa: F811
    """µs per partition-batch: request p50 / N and broker CPU / partition-batches,
    median over rounds, kbroker / peer ratio in the same session."""
    for rnd in range(2):
        for n, kb_us, peer_us in ((1, 200.0, 300.0), (1000, 30_000.0, 60_000.0)):
            for api in ("produce", "fetch"):
                # kbroker: 100 requests x N per interval, CPU 0.5 s -> 5000/N us per partition
                make_cost_run(tmp_path / "r", api=api, n=n, broker="kbroker", round_=rnd,
                              req_us=kb_us, cpu_s_per_interval=0.5)
                make_cost_run(tmp_path / "r", api=api, n=n, broker="tansu", round_=rnd,
                              req_us=peer_us, cpu_s_per_interval=1.0)
    out = tmp_path / "out"
    assert cli.main(["--runs", str(tmp_path / "r"), "--omb", "--out", str(out)], spark=spark) == 0
    verdict, md, _ = read_outputs(out)
    rows = {(r["broker"], r["api"], r["partitions"]): r for r in verdict["partition_cost"]}
    kb = rows[("kbroker", "produce", 1000)]
    assert kb["rounds"] == 2
    assert kb["us_per_partition_rt"] == pytest.approx(30.0, rel=0.01)     # 30 ms / 1000
    assert kb["broker_cpu_us_per_partition"] == pytest.approx(5.0, rel=0.01)
    assert kb["us_per_partition_rt_ratio_vs_tansu"] == pytest.approx(0.5, rel=0.02)
    assert kb["broker_cpu_us_per_partition_ratio_vs_tansu"] == pytest.approx(0.5, rel=0.01)
    assert rows[("kbroker", "fetch", 1)]["us_per_partition_rt"] == pytest.approx(200.0, rel=0.01)
    assert rows[("tansu", "fetch", 1)]["broker_cpu_us_per_partition"] == pytest.approx(10_000.0, rel=0.01)
    assert "Per-partition cost" in md and "produce_request latency" in md


# -- usage errors ----------------------------------------------------------------------
def test_usage_errors_exit_2(tmp_path, capsys):
    assert cli.main([]) == cli.EXIT_USAGE
    assert cli.main(["--runs", str(tmp_path), "--threshold", "2"]) == cli.EXIT_USAGE
    assert cli.main(["--runs", str(tmp_path / "missing"), "--omb"]) == cli.EXIT_USAGE
    assert "no usable candidate runs" in capsys.readouterr().err


# -- statistics helpers ------------------------------------------------------------------
def test_stats_helpers():
    rng = np.random.default_rng(0)
    a, b = rng.normal(100, 5, 40), rng.normal(80, 5, 40)
    assert stats.mann_whitney_worse(b, a, higher_is_better=True) < 1e-6
    assert stats.mann_whitney_worse(a, b, higher_is_better=True) > 0.5
    lo, hi = stats.bootstrap_mean_ratio(b, a)
    assert -0.25 < lo < -0.2 < hi < -0.15
    med, lo, hi, conf = stats.median_ci(np.arange(1, 21, dtype=float))
    assert med == 10.5 and lo <= med <= hi and conf >= 0.95
    lo_ci, hi_ci = stats.mean_ci(10.0, 2.0, 25)
    assert lo_ci < 10 < hi_ci and hi_ci - lo_ci == pytest.approx(2 * 2.0639 * 2.0 / 5, rel=1e-3)


# -- the real command line in a fresh process (own JVM) -----------------------------------
@pytest.mark.slow
def test_python_dash_m_bench_report(tmp_path):
    import os
    import subprocess
    import sys
    make_run(tmp_path / "runs", seed=61)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "bench.report", "--runs", str(tmp_path / "runs"),
                        "--out", str(out), "--master", "local[1]"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    assert "NO-BASELINE: report written" in p.stdout
    assert "Traceback" not in p.stderr and "WARN" not in p.stderr.replace("WARNING: Using incubator", "")
    assert (out / "report.html").is_file() and (out / "verdict.json").is_file()

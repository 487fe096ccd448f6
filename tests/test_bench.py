"""Smoke tests of the whole-system benchmark drivers (bench.produce/consume/e2e/sweep/omb).

Each entry point runs for ~2 s against a temporary kbroker (one per module, plus one the
produce driver starts itself) and must write a run directory that bench.trace.read_run
and validate_manifest accept, with counts that agree between intervals, histograms and
what the client saw. One --vs round against the Tansu peer. Unit tests cover the pieces
(keys, payloads, e2e stamps, interval trimming, recorder batching, OMB parsing).
"""
from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from bench import common, consume, e2e, omb, produce, sweep
from bench.trace import TraceWriter, read_run, validate_manifest

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
OMB_100B = REPO / "bench/data/kafka-bench-workloads/omb-upstream/1-topic-1-partition-100b.yaml"
OMB_DRIVER = REPO / "bench/data/kafka-bench-workloads/omb-upstream/drivers/kafka-throughput.yaml"


@pytest.fixture(scope="module")
def kbroker():
    from kbroker.testing import KBrokerProcess
    proc = KBrokerProcess().start()
    try:
        yield proc
    finally:
        proc.terminate()
        proc.cleanup()


def _runs(results: Path) -> list[Path]:
    return sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith("."))


def _check_run(run_dir: Path, *, tool: str, broker: str = "kbroker", metrics=("publish",)):
    m, iv, lat = read_run(run_dir)
    assert validate_manifest(m) == [], validate_manifest(m)
    assert m["tool"] == tool and m["broker"] == broker
    d = iv.to_pydict()
    assert d["interval_index"] == list(range(len(d["interval_index"])))
    assert m["intervals"] == len(d["interval_index"])
    ld = lat.to_pydict()
    counts = {}
    for metric, c in zip(ld["metric"], ld["count"]):
        counts[metric] = counts.get(metric, 0) + c
    for metric in metrics:
        assert counts.get(metric, 0) > 0, f"no {metric} samples"
    # one publish sample per acknowledged record; one e2e sample per received record
    if "publish" in metrics:
        assert counts["publish"] == sum(d["records_sent"])
        size = m["workload"]["message_size"]
        if m["workload"]["key_distribution"] == "none":
            assert sum(d["bytes_sent"]) == sum(d["records_sent"]) * size
        else:
            assert sum(d["bytes_sent"]) > sum(d["records_sent"]) * size
    if "e2e" in metrics:
        assert counts["e2e"] == sum(d["records_received"])
    return m, d


def _pid_args(proc) -> list[str]:
    return ["--bootstrap", proc.bootstrap, "--broker-pid", str(proc.pid)]


# -- whole drivers ----------------------------------------------------------------------
def test_produce_starts_its_own_broker(tmp_path, capsys):
    rc = produce.main(["--duration", "2", "--warmup", "0.5", "--results", str(tmp_path), "--quiet",
                       "--acks", "all", "--keys", "seq", "--record-size", "64"])
    assert rc == 0
    (run,) = _runs(tmp_path)
    m, d = _check_run(run, tool="bench.produce")
    wl = m["workload"]
    assert (wl["acks"], wl["message_size"], wl["key_distribution"], wl["duration_s"]) == ("all", 64, "seq", 2)
    assert sum(d["records_sent"]) > 1000 and sum(d["errors"]) == 0
    # the broker we started was sampled: CPU per interval is known
    assert all(c is not None for c in d["broker_cpu_s"])
    out = capsys.readouterr().out
    assert "records/s" in out and "p99.9" in out and str(run) in out
    # the CPU budget per record: broker (sampled by PID) and client (this process)
    s = common.summarize(run)
    assert s.client_cpu_s is not None and s.client_cpu_s > 0
    b_us, c_us = s.cpu_us_per_record("broker"), s.cpu_us_per_record("client")
    assert b_us is not None and b_us > 0 and c_us is not None and c_us > 0
    assert c_us == pytest.approx(s.client_cpu_s / (s.records_per_s * s.kept_s) * 1e6)
    assert "CPU per record: broker" in out and " µs (client" in out
    # seq keys add their bytes: b"0", b"1", ... so bytes_sent exceeds records * value size
    assert sum(d["bytes_sent"]) > sum(d["records_sent"]) * 64


def test_produce_records_rate_and_compression(kbroker, tmp_path):
    rc = produce.main([*_pid_args(kbroker), "--records", "3000", "--rate", "2000", "--warmup", "0",
                       "--compression", "lz4", "--linger-ms", "0", "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path)
    m, d = _check_run(run, tool="bench.produce")
    assert sum(d["records_sent"]) == 3000
    assert m["workload"]["records"] == 3000 and m["workload"]["producer_rate"] == 2000
    assert m["workload"]["compression"] == "lz4" and m["workload"]["linger_ms"] == 0
    # 3000 records at 2000/s take ~1.5 s: the rate limit held (not sent in one burst)
    assert m["intervals"] >= 2
    s = common.summarize(run)
    assert s.broker_cpu_s is not None and s.latency_ms["publish"]["samples"] > 0


def test_produce_with_background_consumers(kbroker, tmp_path, capsys):
    rc = produce.main([*_pid_args(kbroker), "--records", "1500", "--rate", "1000", "--warmup", "0",
                       "--linger-ms", "0", "--background-consumers", "2", "--background-prefill-mb", "1",
                       "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path)
    m, d = _check_run(run, tool="bench.produce")
    wl = m["workload"]
    assert wl["background_consumers"] == 2 and wl["background_prefill_mb"] == 1
    assert wl["name"].endswith("-bg2") and sum(d["records_sent"]) == 1500
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("background: 2 consumers"))
    assert "0 errors" in line and " 0 laps" not in line      # they re-read the old data


def test_produce_vs_tansu_one_round(kbroker, tmp_path, capsys):
    rc = produce.main([*_pid_args(kbroker), "--vs", "tansu", "--rounds", "1", "--duration", "1.5",
                       "--warmup", "0.5", "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    runs = _runs(tmp_path)
    assert len(runs) == 2
    ms = [_check_run(r, tool="bench.produce", broker=b)[0]
          for r, b in zip(sorted(runs, key=lambda r: read_run(r)[0]["broker"]), ("kbroker", "tansu"))]
    assert ms[0]["session_id"] == ms[1]["session_id"] and ms[0]["session_id"]
    assert ms[0]["round"] == ms[1]["round"] == 0
    assert ms[1]["broker_version"]
    out = capsys.readouterr().out
    assert "round 0: kbroker" in out and "median throughput ratio kbroker/tansu" in out


def test_consume(kbroker, tmp_path, capsys):
    rc = consume.main([*_pid_args(kbroker), "--records", "20000", "--warmup", "0", "--duration", "30",
                       "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path)
    m, d = _check_run(run, tool="bench.consume", metrics=())
    assert sum(d["records_received"]) == 20000
    assert sum(d["bytes_received"]) == 20000 * 100
    assert sum(d["records_sent"]) == 0 and m["workload"]["consumers"] == 1
    assert "records/s" in capsys.readouterr().out


def test_consume_existing_topic(kbroker, tmp_path):
    from bench.clients import make_admin
    admin = make_admin(kbroker.bootstrap)
    admin.create_topics({"bench-existing": 2})
    args = consume.build_parser().parse_args(["--records", "1000"])
    assert consume.prefill(args, kbroker.bootstrap, "bench-existing", 1000) == 1000
    rc = consume.main([*_pid_args(kbroker), "--topic", "bench-existing", "--warmup", "0",
                       "--duration", "20", "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path)
    m, d = _check_run(run, tool="bench.consume", metrics=())
    assert sum(d["records_received"]) == 1000 and m["workload"]["partitions"] == 2
    assert "bench-existing" in admin._a.list_topics(timeout=5).topics   # not deleted: user's topic


def test_e2e(kbroker, tmp_path):
    rc = e2e.main([*_pid_args(kbroker), "--rate", "2000", "--duration", "2", "--warmup", "0",
                   "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path)
    m, d = _check_run(run, tool="bench.e2e", metrics=("publish", "e2e"))
    assert sum(d["records_received"]) == sum(d["records_sent"]) > 2000
    s = common.summarize(run)
    # a record cannot arrive before it was sent, nor (here) take more than 10 s
    assert 0 <= s.latency_ms["e2e"]["p50"] <= s.latency_ms["e2e"]["max"] < 10_000


def test_sweep(kbroker, tmp_path, capsys):
    rc = sweep.main([*_pid_args(kbroker), "--param", "record-size", "--values", "16,1024",
                     "--duration", "1", "--warmup", "0", "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    runs = _runs(tmp_path)
    sizes = sorted(read_run(r)[0]["workload"]["message_size"] for r in runs)
    assert sizes == [16, 1024]
    for r in runs:
        _check_run(r, tool="bench.produce")
    out = capsys.readouterr().out
    assert "sweep over record-size" in out


def test_omb_workload(kbroker, tmp_path):
    rc = omb.main([str(OMB_100B), "--driver", str(OMB_DRIVER), *_pid_args(kbroker), "--duration", "2",
                   "--rate", "2000", "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path)
    m, d = _check_run(run, tool="bench.omb", metrics=("publish", "e2e"))
    wl = m["workload"]
    assert wl["name"] == "1 topic / 1 partition / 100b"
    assert (wl["topics"], wl["partitions"], wl["message_size"], wl["producer_rate"]) == (1, 1, 100, 2000)
    assert wl["batch_size"] == 1048576 and wl["linger_ms"] == 1        # from the driver file
    assert m["omb"]["test_duration_minutes"] == 15
    assert sum(d["records_received"]) == sum(d["records_sent"]) > 0


def test_kbroker_client(kbroker, tmp_path):
    rc = produce.main([*_pid_args(kbroker), "--client", "kbroker", "--duration", "1.5", "--warmup", "0",
                       "--results", str(tmp_path / "p"), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path / "p")
    m, d = _check_run(run, tool="bench.produce")
    assert m["client"] == "kbroker" and sum(d["records_sent"]) > 0
    rc = consume.main([*_pid_args(kbroker), "--client", "kbroker", "--records", "5000", "--warmup", "0",
                       "--results", str(tmp_path / "c"), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path / "c")
    _, d = _check_run(run, tool="bench.consume", metrics=())
    assert sum(d["records_received"]) == 5000


def test_kafka_python_client(kbroker, tmp_path):
    rc = produce.main([*_pid_args(kbroker), "--client", "kafka-python", "--records", "2000", "--warmup", "0",
                       "--results", str(tmp_path), "--quiet"])
    assert rc == 0
    (run,) = _runs(tmp_path)
    m, d = _check_run(run, tool="bench.produce")
    assert m["client"] == "kafka-python" and sum(d["records_sent"]) == 2000


# -- pieces -----------------------------------------------------------------------------
def test_keys_and_payloads():
    assert common.KeySource("none").key(5) is None
    assert common.KeySource("seq").key(42) == b"42"
    r = common.KeySource("random")
    assert len(r.key(1)) == 16 and r.key(1) != r.key(2) and r.key(3) == r.key(3 + r.POOL)
    z = common.KeySource("zipf")
    keys = [z.key(i) for i in range(5000)]
    top = max(set(keys), key=keys.count)
    assert top == b"key-0" and keys.count(top) > 5000 / 100          # skewed, not uniform
    pool = common.payload_pool(100)
    assert len(pool) == 64 and all(len(p) == 100 for p in pool) and len(set(pool)) == 64
    assert common.payload_pool(0)[0] == b""
    with pytest.raises(ValueError):
        common.KeySource("bogus")


def test_stamps_to_latency():
    vals = [(1_000_000 + i).to_bytes(8, "little") + b"x" * 20 for i in range(3)]
    lat = e2e.stamps_to_latency_us(vals, 1_000_500)
    assert lat.tolist() == [500.0, 499.0, 498.0]


def test_recorder_batches_and_is_thread_safe(tmp_path):
    t = [0.0]
    with TraceWriter(tmp_path, {"tool": "bench.produce", "broker": "kbroker", "client": "confluent",
                                "workload": _wl()}, clock=lambda: t[0], client_cpu=False) as tw:
        rec = common.DeliveryRecorder(tw, "publish", max_batch=100)

        def worker():
            for _ in range(1000):
                rec.ok(0.002, 10)
        ths = [threading.Thread(target=worker) for _ in range(4)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(30)
        rec.error(3)
        rec.drain()
        assert rec.total_records == 4000 and rec.total_bytes == 40000 and rec.total_errors == 3
        assert rec.hist.total == 4000 and rec.hist.percentile(50) in range(1990, 2020)
    _, iv, lat = read_run(tw.run_dir)
    assert sum(iv.column("records_sent").to_pylist()) == 4000
    assert sum(lat.column("count").to_pylist()) == 4000


def _wl(**kw):
    return {"name": "t", "topics": 1, "partitions": 1, "message_size": 10, "producer_rate": 0,
            "consumers": 0, "acks": "all", "linger_ms": 5, "batch_size": 16384, "compression": "none",
            "key_distribution": "none", "duration_s": 3, **kw}


def test_summarize_trims_warmup_and_short_tail(tmp_path):
    t = [0.0]
    with TraceWriter(tmp_path, {"tool": "bench.produce", "broker": "kbroker", "client": "confluent",
                                "warmup_s": 1, "workload": _wl()}, clock=lambda: t[0], client_cpu=False) as tw:
        tw.record_send(999, 9990)                  # interval 0: warm-up, excluded
        tw.record_latencies("publish", [50_000] * 999)
        t[0] = 1.0
        tw.record_send(100, 1000)                  # intervals 1 and 2: kept
        tw.record_latencies("publish", [1000] * 100)
        t[0] = 2.0
        tw.record_send(300, 3000)
        tw.record_latencies("publish", [3000] * 300)
        t[0] = 3.1                                 # interval 3: 100 ms tail, excluded
        tw.record_send(5000, 50000)
    s = common.summarize(tw.run_dir)
    assert s.records_per_s == pytest.approx(200.0) and s.mb_per_s == pytest.approx(0.002)
    p = s.latency_ms["publish"]
    assert p["samples"] == 400 and p["p50"] == pytest.approx(3.0, rel=0.01) and p["max"] < 3.1
    assert s.broker_cpu_s is None


def test_print_vs_median():
    mk = lambda b, r, x, p99: common.RunSummary("d", b, r, x, 0, 0, 0, 1, 0,  # noqa: E731
                                                 {"publish": {"p99": p99}})
    buf = io.StringIO()
    res = common.print_vs([(mk("kbroker", 0, 200, 1), mk("tansu", 0, 100, 2)),
                           (mk("kbroker", 1, 300, 1), mk("tansu", 1, 100, 4)),
                           (mk("kbroker", 2, 100, 3), mk("tansu", 2, 100, 3))],
                          latency_metric="publish", stream=buf)
    assert res["throughput_ratios"] == [2.0, 3.0, 1.0] and res["median_throughput_ratio"] == 2.0
    assert res["median_p99_ratio"] == 0.5
    assert "median throughput ratio kbroker/tansu: 2.000" in buf.getvalue()


def test_omb_parsing(tmp_path):
    assert omb.parse_properties("acks=all\n# c\nlinger.ms = 1\n\nbad") == {"acks": "all", "linger.ms": "1"}
    args = omb.configure(omb.build_parser().parse_args([str(OMB_100B), "--duration", "5"]))
    assert (args.partitions, args.record_size, args.rate, args.duration) == (1, 100, 50000, 5)
    assert args.warmup == 0.5 and args.keys == "none" and args.acks == "all"
    bad = tmp_path / "w.yaml"
    bad.write_text(json.dumps({"name": "b", "topics": 1, "consumerBacklogSizeGB": 1}))
    with pytest.raises(SystemExit):
        omb.configure(omb.build_parser().parse_args([str(bad)]))
    bad.write_text("name: x\nkeyDistributor: WEIRD\n")
    with pytest.raises(SystemExit):
        omb.configure(omb.build_parser().parse_args([str(bad)]))


def test_sweep_values():
    assert sweep.parse_values("rate", "0, 1000,5e3") == [0.0, 1000.0, 5000.0]
    assert sweep.parse_values("acks", "-1,1") == ["all", "1"]
    with pytest.raises(SystemExit):
        sweep.parse_values("compression", "brotli")


def test_produce_loop_is_bounded_by_deadline():
    class Fake:
        def __init__(self):
            self.n = 0

        def send(self, *a):
            self.n += 1
            return True

        def poll(self, t):
            pass
    import time
    f = Fake()
    t0 = time.monotonic()
    sent = produce.produce_records(f, "t", limit=None, deadline=t0 + 0.2, rate=1000,
                                   payloads=common.payload_pool(10), keys=common.KeySource("none"))
    assert time.monotonic() - t0 < 1.0
    assert sent == f.n and 150 <= sent <= 260                   # ~1000/s for 0.2 s
    assert np.isfinite(sent)


def test_partition_cost(kbroker, tmp_path, capsys):
    from bench import partition_cost
    rc = partition_cost.main([*_pid_args(kbroker), "--partitions", "1,7", "--partitions-per-topic", "4",
                              "--duration", "0.3", "--requests", "50", "--results", str(tmp_path), "--json"])
    assert rc == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{"):])["summary"]
    assert set(summary) == {f"kbroker/{api}/{n}" for api in ("produce", "fetch") for n in (1, 7)}
    for v in summary.values():
        assert v["us_per_partition"] > 0 and v["broker_cpu_us_per_partition"] is not None
    runs = _runs(tmp_path)
    assert len(runs) == 4
    for run in runs:
        m, d = _check_run(run, tool="bench.partition_cost", metrics=())
        api = m["workload"]["name"].split("-")[2]
        n = m["workload"]["partitions"]
        recs = sum(d["records_sent"] if api == "produce" else d["records_received"])
        assert recs > 0 and recs % n == 0     # every request carried all N partitions


def test_sigterm_stops_the_brokers_a_bench_started(tmp_path):
    """``timeout`` or a CI runner ends a bench with SIGTERM: the kbroker and the Tansu peer
    it started are stopped too (Python's default for SIGTERM skips the finally blocks that
    stop them, and the peer would run on, orphaned)."""
    import signal
    import subprocess
    import sys
    script = tmp_path / "hold.py"
    script.write_text(
        "import argparse, sys, time\n"
        "from bench import common\n"
        "args = argparse.Namespace(broker_override=[], bootstrap=None, vs='tansu', vs_name=None,"
        " broker_name='kbroker', broker_pid=None, vs_pid=None)\n"
        "with common.session_targets(args) as targets:\n"
        "    print(' '.join(str(t.pid) for t in targets), flush=True)\n"
        "    time.sleep(120)\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=str(REPO), env=env)
    pids: list[int] = []
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert not [p for p in pids if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in pids:                    # a failure must not leave them running either
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workload_name_tells_producer_configs_apart():
    """Runs with other producer properties (enable.idempotence, batch.size, ...) are other
    workloads: the report must never compare them as one."""
    def name(*argv):
        args = produce.finish_args(produce.build_parser().parse_args(["--partitions", "50", *argv]))
        return common.workload_manifest(args, tool="bench.produce")["name"]
    plain = name()
    assert plain == "produce-1-topic-50-partition-100b-rate-max"
    assert name("--producer-config", "enable.idempotence=true") == plain + "-idempotent"
    assert name("--producer-config", "enable.idempotence=false") == plain + "-enable_idempotence_false"
    assert name("--batch-size", "65536", "--producer-config", "max.in.flight.requests.per.connection=1") == \
        plain + "-batch65536-max_in_flight_requests_per_connection_1"
    assert name("--workload-name", "mine", "--producer-config", "enable.idempotence=true") == "mine"

"""Comparisons and verdicts over the aggregated tables (pandas only).

Three kinds:

* **candidate vs baseline** -- runs from ``--runs`` and ``--baseline`` with the
  same tool, broker, client and workload are pooled per side. A metric
  *regresses* when it is worse by more than ``threshold`` (relative) **and**
  a one-sided test backs it at ``alpha``: Mann-Whitney U over per-interval
  throughputs; for latency percentiles a bootstrap over intervals (resample
  intervals, merge their histograms, take the percentile). ``max`` latency and
  CPU per MB are reported but never gate the verdict (single extreme values).
  Runs whose ``git_commit`` is unknown or ends in ``-dirty`` (measured on a tree with
  uncommitted changes, so nobody can rebuild what was measured) never enter a verdict:
  they are listed as excluded and, if no clean run is left on a side, the comparison
  has no verdict.
* **kbroker vs peer broker, same session** -- runs sharing a ``session_id``
  are paired by ``round``; one ratio kbroker/peer per round; median and an
  order-statistic CI of the ratios.
* **kbroker vs published Apache Kafka (OMB)** -- nearest OMB result with the
  same message size (then partitions, then rate). Always labelled
  cross-machine: different hardware, replication and client.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bench.report import stats
from bench.report.aggregate import QUANTILES, qcol
from bench.report.sources import rate_from_workload_name, source_facts

LATENCY_METRICS = ("publish", "e2e", "produce_request", "fetch_request")
#: bench.partition_cost: one request carrying N partitions, one batch each
PARTITION_COST_TOOL = "bench.partition_cost"
REQUEST_METRICS = {"produce_request": "produce", "fetch_request": "fetch"}
CROSS_MACHINE = "cross-machine, not like-for-like"
ALPHA = 0.05


def is_clean_commit(commit: Any) -> bool:
    """True for a known commit measured on a clean tree (no ``-dirty`` suffix)."""
    return isinstance(commit, str) and bool(commit) and not commit.endswith("-dirty")


def _num(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def workload_sig(r: pd.Series) -> str:
    """Identity of a workload: name + the parameters that change the result."""
    parts = [str(r.get("wl_name"))]
    for c in ("topics", "partitions", "message_size", "producer_rate", "consumers", "acks",
              "compression", "linger_ms", "batch_size", "key_distribution"):
        v = r.get(f"wl_{c}")
        parts.append(f"{c}={'' if v is None or (isinstance(v, float) and math.isnan(v)) else v}")
    return "|".join(parts)


def workload_label(r: pd.Series) -> str:
    rate = _num(r.get("wl_producer_rate"))
    rate_s = "max rate" if not rate else f"{rate:,.0f} msg/s"
    return (f"{r.get('wl_name')} ({int(r.get('wl_topics') or 0)}x{int(r.get('wl_partitions') or 0)} "
            f"partitions, {int(r.get('wl_message_size') or 0)} B, {rate_s}, acks={r.get('wl_acks')})")


def machine_label(r: pd.Series) -> str:
    mem = _num(r.get("m_mem_total_gb"))
    return (f"{r.get('m_hostname')}: {r.get('m_cpu_model')}, {r.get('m_logical_cpus')} logical CPUs, "
            f"{mem:g} GB RAM, {r.get('m_os')}" if mem is not None else
            f"{r.get('m_hostname')}: {r.get('m_cpu_model')}, {r.get('m_logical_cpus')} logical CPUs, "
            f"{r.get('m_os')}")


def assign_groups(meta: pd.DataFrame) -> pd.DataFrame:
    meta = meta.copy()
    meta["workload_sig"] = meta.apply(workload_sig, axis=1)
    meta["match_key"] = (meta["tool"].astype(str) + "|" + meta["broker"].astype(str) + "|"
                         + meta["client"].astype(str) + "|" + meta["workload_sig"])
    meta["group_id"] = meta["role"] + "|" + meta["match_key"]
    return meta


@dataclass
class Tables:
    meta: pd.DataFrame            # manifest table + role, group_id, match_key
    intervals: pd.DataFrame       # per interval with kept + rates
    throughput: pd.DataFrame      # per run summary
    pct: pd.DataFrame             # merged percentiles, key_kind run/group
    curves: pd.DataFrame          # merged buckets
    lat_iv: pd.DataFrame          # per-interval buckets of compared runs


def _pct(t: Tables, kind: str, key: str, metric: str) -> pd.Series | None:
    m = t.pct[(t.pct.key_kind == kind) & (t.pct.key == key) & (t.pct.metric == metric)]
    return None if m.empty else m.iloc[0]


def run_rows(t: Tables) -> list[dict[str, Any]]:
    """One summary row per run."""
    rows = []
    for _, r in t.meta.sort_values(["role", "started_at", "run_id"]).iterrows():
        tp = t.throughput[t.throughput.run_id == r.run_id]
        tp = tp.iloc[0] if not tp.empty else None
        row: dict[str, Any] = {
            "run_id": r.run_id, "role": r.role, "broker": r.broker, "client": r.client,
            "tool": r.tool, "workload": workload_label(r), "session": r.session_id,
            "round": r["round"], "machine": machine_label(r), "git_commit": r.git_commit,
            "clean_tree": is_clean_commit(r.git_commit),
        }
        if tp is not None:
            n = int(tp.n_intervals)
            row["kept_intervals"] = n
            for side in ("send", "recv"):
                mean, std = _num(tp[f"{side}_rps_mean"]), _num(tp[f"{side}_rps_std"])
                lo, hi = stats.mean_ci(mean or 0.0, std if std is not None else math.nan, n)
                row[f"{side}_rps"] = mean
                row[f"{side}_rps_ci"] = (lo, hi)
                row[f"{side}_mbps"] = _num(tp[f"{side}_mbps_mean"])
            row["errors"] = int(tp.errors)
            row["broker_cpu_s_per_mb"] = _num(tp.broker_cpu_s_per_mb)
            row["client_cpu_s_per_mb"] = _num(tp.client_cpu_s_per_mb)
        for metric in LATENCY_METRICS:
            p = _pct(t, "run", r.run_id, metric)
            if p is None:
                continue
            row[f"{metric}_n"] = int(p.n)
            for q in QUANTILES:
                row[f"{metric}_{qcol(q)}_ms"] = p[qcol(q)] / 1000.0
            row[f"{metric}_max_ms"] = p.max_us / 1000.0
        rows.append(row)
    return rows


def _bucket_matrix(lat_iv: pd.DataFrame, run_ids: list[str], metric: str,
                   buckets: np.ndarray) -> np.ndarray:
    d = lat_iv[(lat_iv.metric == metric) & lat_iv.run_id.isin(run_ids)]
    if d.empty:
        return np.zeros((0, len(buckets)))
    wide = d.pivot_table(index=["run_id", "interval_index"], columns="bucket", values="count",
                         aggfunc="sum", fill_value=0)
    return wide.reindex(columns=buckets, fill_value=0).to_numpy(dtype=np.float64)


def baseline_comparisons(t: Tables, threshold: float, alpha: float = ALPHA) -> list[dict[str, Any]]:
    out = []
    cand = t.meta[t.meta.role == "candidate"]
    base = t.meta[t.meta.role == "baseline"]
    for ci, key in enumerate(sorted(set(cand.match_key) & set(base.match_key))):
        cg, bg = cand[cand.match_key == key], base[base.match_key == key]
        clean_c = cg.git_commit.map(is_clean_commit)
        clean_b = bg.git_commit.map(is_clean_commit)
        c_runs = sorted(cg[clean_c].run_id)
        b_runs = sorted(bg[clean_b].run_id)
        first = cg.iloc[0]
        comp: dict[str, Any] = {
            "tool": first.tool, "broker": first.broker, "client": first.client,
            "workload": workload_label(first), "baseline_runs": b_runs, "candidate_runs": c_runs,
            "excluded_runs": sorted(cg[~clean_c].run_id) + sorted(bg[~clean_b].run_id),
            "metrics": []}
        if not c_runs or not b_runs:
            comp["regression"] = False
            comp["no_verdict"] = "every run on one side is from a dirty tree or an unknown commit"
            out.append(comp)
            continue
        ivk = t.intervals[t.intervals.kept]
        for name, col, unit in (("throughput_send", "send_rps", "records/s"),
                                ("throughput_receive", "recv_rps", "records/s")):
            b = ivk[ivk.run_id.isin(b_runs)][col].dropna().to_numpy()
            c = ivk[ivk.run_id.isin(c_runs)][col].dropna().to_numpy()
            if len(b) == 0 or len(c) == 0 or b.mean() <= 0:
                continue
            delta = c.mean() / b.mean() - 1.0
            p = stats.mann_whitney_worse(c, b, higher_is_better=True)
            lo, hi = stats.bootstrap_mean_ratio(c, b, seed=ci)
            comp["metrics"].append(_metric(name, unit, "higher", b.mean(), c.mean(), delta, p,
                                           "mann-whitney-u one-sided", lo, hi, len(b), len(c),
                                           threshold, alpha, gate=True))
        for metric in LATENCY_METRICS:
            bp = _pct(t, "group", f"baseline|{key}", metric)
            cp = _pct(t, "group", f"candidate|{key}", metric)
            if bp is None or cp is None:
                continue
            buckets = np.sort(
                t.lat_iv[(t.lat_iv.metric == metric) & t.lat_iv.run_id.isin(b_runs + c_runs)]
                .bucket.unique())
            upper = (t.lat_iv.drop_duplicates("bucket").set_index("bucket").upper_us
                     .reindex(buckets).to_numpy(dtype=np.float64))
            bm = _bucket_matrix(t.lat_iv, b_runs, metric, buckets)
            cm = _bucket_matrix(t.lat_iv, c_runs, metric, buckets)
            boots = stats.bootstrap_latency(bm, cm, upper, list(QUANTILES), seed=ci)
            for q, (lo, hi, p) in zip(QUANTILES, boots):
                bv, cv = bp[qcol(q)] / 1000.0, cp[qcol(q)] / 1000.0
                delta = cv / bv - 1.0 if bv > 0 else math.nan
                comp["metrics"].append(_metric(f"{metric}_{qcol(q)}", "ms", "lower", bv, cv, delta, p,
                                               "bootstrap over intervals one-sided", lo, hi,
                                               bm.shape[0], cm.shape[0], threshold, alpha, gate=True))
            bv, cv = bp.max_us / 1000.0, cp.max_us / 1000.0
            comp["metrics"].append(_metric(f"{metric}_max", "ms", "lower", bv, cv,
                                           cv / bv - 1.0 if bv > 0 else math.nan, math.nan,
                                           "informational", math.nan, math.nan, bm.shape[0],
                                           cm.shape[0], threshold, alpha, gate=False))
        tb = t.throughput[t.throughput.run_id.isin(b_runs)]
        tc = t.throughput[t.throughput.run_id.isin(c_runs)]
        for who in ("broker", "client"):
            bs, bmb = tb[f"{who}_cpu_s"].sum(), tb[f"{who}_cpu_mb"].sum()
            cs, cmb = tc[f"{who}_cpu_s"].sum(), tc[f"{who}_cpu_mb"].sum()
            if bmb > 0 and cmb > 0 and bs > 0:
                bv, cv = bs / bmb, cs / cmb
                comp["metrics"].append(_metric(f"{who}_cpu_per_mb", "CPU s/MB", "lower", bv, cv,
                                               cv / bv - 1.0, math.nan, "informational", math.nan,
                                               math.nan, len(tb), len(tc), threshold, alpha,
                                               gate=False))
        comp["regression"] = any(m["regression"] for m in comp["metrics"])
        out.append(comp)
    return out


def _metric(name, unit, better, base, cand, delta, p, test, lo, hi, n_b, n_c, threshold, alpha,
            gate) -> dict[str, Any]:
    worse = (-delta if better == "higher" else delta) if _num(delta) is not None else math.nan
    regression = bool(gate and _num(worse) is not None and worse > threshold
                      and _num(p) is not None and p < alpha)
    return {"metric": name, "unit": unit, "better": better, "baseline": _num(base),
            "candidate": _num(cand), "delta_pct": _pct100(delta), "ci_low_pct": _pct100(lo),
            "ci_high_pct": _pct100(hi), "p_value": _num(p), "test": test,
            "n_baseline": int(n_b), "n_candidate": int(n_c), "gates_verdict": gate,
            "regression": regression}


def _pct100(x) -> float | None:
    x = _num(x)
    return None if x is None else 100.0 * x


def peer_comparisons(t: Tables, ours: str = "kbroker") -> list[dict[str, Any]]:
    """Per session: ratio kbroker/peer per round; median and CI over rounds."""
    out = []
    m = t.meta[(t.meta.role == "candidate") & t.meta.session_id.notna() & t.meta["round"].notna()]
    by_run_tp = t.throughput.set_index("run_id") if not t.throughput.empty else None
    for (session, tool, client, sig), g in m.groupby(["session_id", "tool", "client", "workload_sig"]):
        peers = sorted(set(g.broker) - {ours})
        if ours not in set(g.broker) or not peers:
            continue
        for peer in peers:
            ratios: dict[str, list[float]] = {}
            rounds = []
            for rnd, rg in g.groupby("round"):
                kb, pr = rg[rg.broker == ours], rg[rg.broker == peer]
                if kb.empty or pr.empty:
                    continue
                rounds.append(int(rnd))
                vals = {}
                for side in ("kb", "peer"):
                    ids = list((kb if side == "kb" else pr).run_id)
                    v = {}
                    if by_run_tp is not None:
                        tp = by_run_tp.reindex(ids)
                        v["throughput_send"] = _num(tp.send_rps_mean.mean())
                        v["throughput_receive"] = _num(tp.recv_rps_mean.mean())
                    for metric in LATENCY_METRICS:
                        ps = [_pct(t, "run", i, metric) for i in ids]
                        ps = [p for p in ps if p is not None]
                        if ps:
                            v[f"{metric}_p50"] = float(np.mean([p[qcol(50)] for p in ps]))
                            v[f"{metric}_p99"] = float(np.mean([p[qcol(99)] for p in ps]))
                    vals[side] = v
                for k, kv in vals["kb"].items():
                    pv = vals["peer"].get(k)
                    if kv is not None and pv:
                        ratios.setdefault(k, []).append(kv / pv)
            if not rounds:
                continue
            first = g.iloc[0]
            for metric, rs in ratios.items():
                med, lo, hi, conf = stats.median_ci(np.array(rs))
                higher_better = metric.startswith("throughput")
                if _num(lo) is not None and _num(hi) is not None and (lo > 1 or hi < 1):
                    better = (lo > 1) == higher_better
                    verdict = f"{ours} {'better' if better else 'worse'}"
                else:
                    verdict = "no clear difference"
                out.append({"session_id": session, "tool": tool, "client": client,
                            "workload": workload_label(first), "peer": peer, "metric": metric,
                            "better": "higher" if higher_better else "lower",
                            "rounds": len(rs), "ratios": rs, "median_ratio": med,
                            "ci_low": _num(lo), "ci_high": _num(hi), "ci_confidence": _num(conf),
                            "verdict": verdict, "machine": machine_label(first)})
    return out


def partition_cost_rows(t: Tables, ours: str = "kbroker") -> list[dict[str, Any]]:
    """bench.partition_cost runs: µs per partition-batch of one Produce / Fetch
    carrying N partitions, per (session, broker, api, N), median over rounds: the
    request's p50 round trip / N (as a client sees it) and the broker's CPU over the
    kept intervals / partition-batches served; with a peer in the same session, the
    kbroker / peer ratio of each (< 1: kbroker cheaper)."""
    m = t.meta[(t.meta.role == "candidate") & (t.meta.tool == PARTITION_COST_TOOL)]
    if m.empty:
        return []
    by_run_tp = t.throughput.set_index("run_id") if not t.throughput.empty else None
    cells: dict[tuple, dict[str, list[float]]] = {}
    for _, r in m.iterrows():
        n = int(r.wl_partitions) if _num(r.wl_partitions) else None
        if not n:
            continue
        rpb = int(r.wl_records_per_batch) if _num(r.get("wl_records_per_batch")) else 1
        for metric, api in REQUEST_METRICS.items():
            p = _pct(t, "run", r.run_id, metric)
            if p is None:
                continue
            c = cells.setdefault((r.session_id, r.broker, api, n), {"rt": [], "cpu": []})
            c["rt"].append(p[qcol(50)] / n)
            if by_run_tp is not None and r.run_id in by_run_tp.index:
                tp = by_run_tp.loc[r.run_id]
                records = _num(tp.records_sent) or _num(tp.records_received)
                cpu = _num(tp.broker_cpu_s)
                if records and cpu is not None:
                    c["cpu"].append(cpu * 1e6 / (records / rpb))
    rows = []
    med = lambda xs: float(np.median(xs)) if xs else None   # noqa: E731
    for (session, broker, api, n), c in sorted(cells.items(), key=lambda kv: (str(kv[0][0]), kv[0][1:])):
        rows.append({"session_id": session, "broker": broker, "api": api, "partitions": n,
                     "rounds": len(c["rt"]), "us_per_partition_rt": med(c["rt"]),
                     "broker_cpu_us_per_partition": med(c["cpu"])})
    ours_rows = {(x["session_id"], x["api"], x["partitions"]): x for x in rows if x["broker"] == ours}
    for x in rows:
        o = ours_rows.get((x["session_id"], x["api"], x["partitions"]))
        if x["broker"] == ours or o is None:
            continue
        for k in ("us_per_partition_rt", "broker_cpu_us_per_partition"):
            if o[k] is not None and x[k]:
                o[f"{k}_ratio_vs_{x['broker']}"] = o[k] / x[k]
                o.setdefault("peers", []).append(x["broker"])
    for x in rows:
        if "peers" in x:
            x["peers"] = sorted(set(x["peers"]))
    return rows


# -- OMB ------------------------------------------------------------------------------
def omb_rows(omb: dict[str, pd.DataFrame] | None) -> list[dict[str, Any]]:
    """One row per OMB result file with its source facts."""
    if omb is None:
        return []
    rows = []
    tp = omb["meta"].set_index("file")
    pct = omb["percentiles"]
    for _, r in omb["meta"].iterrows():
        facts = source_facts(r.file)
        wl = facts["workload"]
        size = _num(r.messageSize) or wl.get("message_size")
        topics = _num(r.topics) or wl.get("topics")
        parts = _num(r.partitions) or wl.get("partitions")
        rate = _num(r.producerRate) or rate_from_workload_name(r.workload) or wl.get("producer_rate")
        row: dict[str, Any] = {
            "file": r.file, "source": facts["label"], "workload": r.workload, "driver": r.driver,
            "message_size": int(size) if size else None, "topics": int(topics) if topics else None,
            "partitions_per_topic": int(parts) if parts else None,
            "total_partitions": int(topics * parts) if topics and parts else None,
            "target_rate": rate, "kafka_version": facts["kafka_version"],
            "hardware": facts["hardware"], "durability": facts["durability"]}
        if r.file in tp.index:
            x = tp.loc[r.file]
            n = int(x.n_intervals)
            row["publish_rps"] = _num(x.publish_rps_mean)
            row["publish_rps_ci"] = stats.mean_ci(x.publish_rps_mean, _num(x.publish_rps_std)
                                                  or math.nan, n)
            row["publish_mbps"] = (row["publish_rps"] * size / 1e6) if size and row["publish_rps"] else None
            row["intervals"] = n
        for metric in LATENCY_METRICS:
            p = pct[(pct.file == r.file) & (pct.metric == metric)]
            if p.empty:
                continue
            p = p.iloc[0]
            for q in QUANTILES:
                row[f"{metric}_{qcol(q)}_ms"] = _num(p[qcol(q)])
            row[f"{metric}_max_ms"] = _num(p.max_ms)
        rows.append(row)
    return rows


def omb_matches(t: Tables, omb_list: list[dict[str, Any]], ours: str = "kbroker",
                top: int = 3) -> list[dict[str, Any]]:
    """For each candidate kbroker workload group, the nearest OMB results."""
    out = []
    cand = t.meta[(t.meta.role == "candidate") & (t.meta.broker == ours)]
    for gid, g in cand.groupby("group_id"):
        first = g.iloc[0]
        size = _num(first.wl_message_size)
        parts = (_num(first.wl_topics) or 1) * (_num(first.wl_partitions) or 1)
        rate = _num(first.wl_producer_rate) or 0.0
        scored = []
        for o in omb_list:
            if o.get("message_size") != (int(size) if size else None):
                continue
            op = o.get("total_partitions") or 1
            score = abs(math.log2(parts / op)) * 0.5
            notes = [f"message size {int(size)} B = {o['message_size']} B",
                     f"partitions {int(parts)} vs {op}"]
            orate = o.get("target_rate")
            if rate > 0 and orate:
                score += abs(math.log(rate / orate))
                notes.append(f"rate {rate:,.0f} vs {orate:,.0f} msg/s")
            elif rate <= 0:
                saturated = bool(orate and o.get("publish_rps") and o["publish_rps"] < 0.95 * orate)
                score += 0.0 if saturated else 1.0
                notes.append("max rate vs " + (f"{orate:,.0f} msg/s target"
                                               + (" (saturated)" if saturated else "")
                                               if orate else "unknown target"))
            scored.append((score, o, "; ".join(notes)))
        scored.sort(key=lambda s: s[0])
        ivk = t.intervals[t.intervals.kept & t.intervals.run_id.isin(g.run_id)]
        ours_row: dict[str, Any] = {
            "group": gid, "workload": workload_label(first), "runs": sorted(g.run_id),
            "machine": machine_label(first), "broker": ours, "client": first.client,
            "send_rps": _num(ivk.send_rps.mean()) if not ivk.empty else None,
            "send_mbps": _num(ivk.send_mbps.mean()) if not ivk.empty else None,
            "recv_rps": _num(ivk.recv_rps.mean()) if not ivk.empty else None,
            "recv_mbps": _num(ivk.recv_mbps.mean()) if not ivk.empty else None}
        for metric in LATENCY_METRICS:
            p = _pct(t, "group", gid, metric)
            if p is not None:
                for q in QUANTILES:
                    ours_row[f"{metric}_{qcol(q)}_ms"] = p[qcol(q)] / 1000.0
                ours_row[f"{metric}_max_ms"] = p.max_us / 1000.0
        out.append({"ours": ours_row, "label": CROSS_MACHINE,
                    "matches": [{"score": round(s, 3), "match": note, **o}
                                for s, o, note in scored[:top]]})
    return out


def overall_status(comparisons: list[dict[str, Any]]) -> str:
    if not any(not c.get("no_verdict") for c in comparisons):
        return "no-baseline"
    return "regression" if any(c["regression"] for c in comparisons) else "ok"

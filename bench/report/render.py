"""report.md, report.html and verdict.json from the report model.

The document is a list of blocks -- ("h1"|"h2"|"h3"|"p", text),
("table", headers, rows), ("img", relative path, alt) -- rendered twice,
as Markdown and as self-contained HTML (plots linked relatively).
"""
from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from bench.report.aggregate import QUANTILES, qcol
from bench.report.compare import CROSS_MACHINE


def _f(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, float):
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def _ci(ci: Any) -> str:
    if not ci or any(v is None or (isinstance(v, float) and not math.isfinite(v)) for v in ci):
        return "-"
    return f"[{_f(ci[0])}, {_f(ci[1])}]"


def _pcts(row: dict, metric: str) -> list[str]:
    return [_f(row.get(f"{metric}_{qcol(q)}_ms")) for q in QUANTILES] + [_f(row.get(f"{metric}_max_ms"))]


_PCT_HEAD = [f"p{q:g}" for q in QUANTILES] + ["max"]


def build_document(model: dict[str, Any]) -> list[tuple]:
    d: list[tuple] = [("h1", f"kbroker performance report: {model['status'].upper()}")]
    d.append(("p", f"Generated {model['generated_at']}. Regression threshold "
                   f"{100 * model['threshold']:g} % with one-sided significance at "
                   f"alpha = {model['alpha']:g}. Latencies in ms from merged HdrHistogram-style "
                   f"buckets (2 significant digits; a percentile is the upper bound of its "
                   f"bucket). MB = 10^6 bytes. Throughput CIs are 95 % Student-t over kept "
                   f"intervals (warm-up and short final interval trimmed; a run that ends "
                   f"inside its warm-up keeps its full intervals)."))
    if model["skipped"]:
        d.append(("h2", "Skipped inputs"))
        d.append(("table", ["path", "reason"], [[s["path"], s["reason"]] for s in model["skipped"]]))

    d.append(("h2", "Runs"))
    runs = model["runs"]
    if runs:
        d.append(("table", ["run", "role", "broker", "client", "workload", "kept intervals",
                            "records/s sent", "95% CI", "MB/s sent", "records/s recv", "MB/s recv",
                            "errors", "broker CPU s/MB", "client CPU s/MB"],
                  [[r["run_id"], r["role"], r["broker"], r["client"], r["workload"],
                    _f(r.get("kept_intervals")), _f(r.get("send_rps")), _ci(r.get("send_rps_ci")),
                    _f(r.get("send_mbps")), _f(r.get("recv_rps")), _f(r.get("recv_mbps")),
                    _f(r.get("errors")), _f(r.get("broker_cpu_s_per_mb")),
                    _f(r.get("client_cpu_s_per_mb"))] for r in runs]))
        for metric in ("publish", "e2e", "produce_request", "fetch_request"):
            rows = [[r["run_id"], r["broker"], _f(r.get(f"{metric}_n"))] + _pcts(r, metric)
                    for r in runs if r.get(f"{metric}_n")]
            if rows:
                d.append(("h3", f"{metric} latency (ms)"))
                d.append(("table", ["run", "broker", "samples"] + _PCT_HEAD, rows))
        d.append(("h3", "Machines"))
        dirty = [r["run_id"] for r in runs if not r.get("clean_tree", True)]
        if dirty:
            d.append(("p", f"**{len(dirty)} of {len(runs)} runs were measured on a dirty tree or an "
                           "unknown commit** (marked below): they are shown but excluded from "
                           "candidate-vs-baseline verdicts."))
        d.append(("table", ["run", "machine", "git commit", "clean tree", "session", "round"],
                  [[r["run_id"], r["machine"], _f(r.get("git_commit")),
                    "yes" if r.get("clean_tree", True) else "NO (excluded from verdicts)",
                    _f(r.get("session")), _f(r.get("round"))] for r in runs]))
    else:
        d.append(("p", "No usable runs."))
    for key, alt in (("throughput", "throughput over time"), ("latency_publish", "publish latency"),
                     ("latency_e2e", "end-to-end latency")):
        if model["plots"].get(key):
            d.append(("img", model["plots"][key], alt))

    d.append(("h2", "Candidate vs baseline"))
    if not model["comparisons"]:
        d.append(("p", "No baseline runs matched (give --baseline with runs of the same tool, "
                       "broker, client and workload). No verdict."))
    for i, c in enumerate(model["comparisons"]):
        verdict = ("no verdict" if c.get("no_verdict") else
                   "REGRESSION" if c["regression"] else "ok")
        d.append(("h3", f"#{i + 1} {c['broker']} / {c['client']} / {c['tool']}: {c['workload']}"
                        f" -- {verdict}"))
        d.append(("p", f"baseline runs: {', '.join(c['baseline_runs']) or '-'}; candidate runs: "
                       f"{', '.join(c['candidate_runs']) or '-'}"))
        if c.get("excluded_runs"):
            d.append(("p", "excluded (dirty tree or unknown commit): "
                           f"{', '.join(c['excluded_runs'])}"))
        if c.get("no_verdict"):
            d.append(("p", f"No verdict: {c['no_verdict']}."))
            continue
        d.append(("table", ["metric", "unit", "better", "baseline", "candidate", "delta %",
                            "95% CI of delta %", "p-value", "test", "n (b/c)", "regression"],
                  [[m["metric"], m["unit"], m["better"], _f(m["baseline"]), _f(m["candidate"]),
                    _f(m["delta_pct"]), _ci((m["ci_low_pct"], m["ci_high_pct"])),
                    _f(m["p_value"]), m["test"], f"{m['n_baseline']}/{m['n_candidate']}",
                    "YES" if m["regression"] else "no"] for m in c["metrics"]]))
    if model["plots"].get("regression_deltas"):
        d.append(("img", model["plots"]["regression_deltas"], "regression deltas"))

    d.append(("h2", "kbroker vs peer brokers (same session)"))
    if model["peers"]:
        d.append(("p", "Ratio = kbroker / peer per alternating round; median with a "
                       "distribution-free order-statistic CI (with fewer than 6 rounds the CI is "
                       "the min-max range at the confidence shown)."))
        d.append(("table", ["session", "workload", "client", "peer", "metric", "better", "rounds",
                            "per-round ratios", "median ratio", "CI", "CI conf.", "verdict",
                            "machine"],
                  [[p["session_id"], p["workload"], p["client"], p["peer"], p["metric"],
                    p["better"], p["rounds"], ", ".join(_f(x) for x in p["ratios"]),
                    _f(p["median_ratio"]), _ci((p["ci_low"], p["ci_high"])),
                    _f(p["ci_confidence"]), p["verdict"], p["machine"]] for p in model["peers"]]))
    else:
        d.append(("p", "No session with kbroker and a peer broker in the same rounds."))

    pc = model.get("partition_cost") or []
    if pc:
        d.append(("h2", "Per-partition cost (bench.partition_cost)"))
        d.append(("p", "One Produce or Fetch carrying N partitions, one batch each. Round trip: "
                       "the request's p50 / N (µs per partition-batch as a client sees it); broker "
                       "CPU: the broker's utime+stime over the kept intervals / partition-batches. "
                       "Medians over rounds; the ratio is kbroker / peer in the same session "
                       "(< 1: kbroker cheaper). Flat columns as N grows mean per-request work is "
                       "done once per request."))
        peers = sorted({p for x in pc for p in x.get("peers", [])})
        head = ["session", "broker", "api", "N", "rounds", "µs/partition (round trip)",
                "broker CPU µs/partition"]
        for p in peers:
            head += [f"round trip vs {p}", f"CPU vs {p}"]
        rows = []
        for x in pc:
            row = [x["session_id"], x["broker"], x["api"], _f(x["partitions"]), _f(x["rounds"]),
                   _f(x["us_per_partition_rt"]), _f(x["broker_cpu_us_per_partition"])]
            for p in peers:
                row += [_f(x.get(f"us_per_partition_rt_ratio_vs_{p}")),
                        _f(x.get(f"broker_cpu_us_per_partition_ratio_vs_{p}"))]
            rows.append(row)
        d.append(("table", head, rows))

    d.append(("h2", f"kbroker vs published Apache Kafka results ({CROSS_MACHINE})"))
    d.append(("p", f"**{CROSS_MACHINE.capitalize()}.** Published numbers come from other "
                   "hardware, cluster sizes, replication and clients (OpenMessaging-Benchmark); "
                   "they give scale, not a verdict. Each side's hardware is printed next to "
                   "its numbers."))
    for m in model["omb_matches"]:
        o = m["ours"]
        d.append(("h3", f"{o['workload']} ({o['client']} client)"))
        consumed = not o.get("send_rps") and bool(o.get("recv_rps"))   # a consume-only run
        rate = ("recv_rps", "recv_mbps") if consumed else ("send_rps", "send_mbps")
        rows = [["kbroker (ours)" + (", records consumed" if consumed else ""), o["machine"],
                 _f(o.get(rate[0])), _f(o.get(rate[1]))]
                + _pcts(o, "publish")[:4] + [_pcts(o, "e2e")[2], "-"]]
        for x in m["matches"]:
            rows.append([f"Apache Kafka {x['kafka_version']} - {x['source']} - {x['file']}",
                         f"{x['hardware']}; {x['durability']}", _f(x.get("publish_rps")),
                         _f(x.get("publish_mbps"))] + _pcts(x, "publish")[:4]
                        + [_f(x.get(f"e2e_{qcol(99)}_ms")), x["match"]])
        d.append(("table", ["system", "hardware", "records/s", "MB/s"]
                  + [f"publish {h}" for h in _PCT_HEAD[:4]] + ["e2e p99", "match"], rows))
        if not m["matches"]:
            d.append(("p", "No published result with the same message size."))
    if not model["omb_matches"]:
        d.append(("p", "No kbroker candidate runs to compare."))
    if model["omb"]:
        d.append(("h3", "All published results read"))
        d.append(("table", ["source", "file", "workload", "driver", "msg B", "topics x partitions",
                            "target msg/s", "publish msg/s (mean)", "95% CI", "MB/s",
                            "publish p50", "p95", "p99", "p99.9", "max", "e2e p50", "e2e p99",
                            "Kafka", "hardware", "durability"],
                  [[x["source"], x["file"], x["workload"], x["driver"], _f(x["message_size"]),
                    f"{x['topics']}x{x['partitions_per_topic']}", _f(x["target_rate"]),
                    _f(x.get("publish_rps")), _ci(x.get("publish_rps_ci")),
                    _f(x.get("publish_mbps")), *_pcts(x, "publish"), _f(x.get("e2e_p50_ms")),
                    _f(x.get("e2e_p99_ms")), x["kafka_version"], x["hardware"], x["durability"]]
                   for x in model["omb"]]))
    return d


def to_markdown(doc: list[tuple]) -> str:
    out = []
    for b in doc:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + b[1])
        elif kind == "p":
            out.append(b[1])
        elif kind == "img":
            out.append(f"![{b[2]}]({b[1]})")
        elif kind == "table":
            cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
            out.append("| " + " | ".join(cell(h) for h in b[1]) + " |")
            out.append("|" + "---|" * len(b[1]))
            out.extend("| " + " | ".join(cell(c) for c in row) + " |" for row in b[2])
        out.append("")
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.85em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3} img{max-width:100%;border:1px solid #eee}"""


def to_html(doc: list[tuple], title: str) -> str:
    e = html.escape
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
           f"<style>{_CSS}</style></head><body>"]
    for b in doc:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            out.append(f"<{kind}>{e(b[1])}</{kind}>")
        elif kind == "p":
            text = e(b[1])
            while "**" in text:   # the one Markdown emphasis we use
                text = text.replace("**", "<strong>", 1).replace("**", "</strong>", 1)
            out.append(f"<p>{text}</p>")
        elif kind == "img":
            out.append(f"<p><img src='{e(b[1])}' alt='{e(b[2])}'></p>")
        elif kind == "table":
            out.append("<table><thead><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in b[1])
                       + "</tr></thead><tbody>")
            for row in b[2]:
                out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
            out.append("</tbody></table>")
    out.append("</body></html>")
    return "\n".join(out)


def verdict(model: dict[str, Any]) -> dict[str, Any]:
    """Machine-readable verdict (bench/README.md documents the fields)."""
    return {
        "schema_version": 1,
        "generated_at": model["generated_at"],
        "status": model["status"],
        "threshold": model["threshold"],
        "alpha": model["alpha"],
        "comparisons": [
            {**{k: c[k] for k in ("tool", "broker", "client", "workload", "baseline_runs",
                                  "candidate_runs", "excluded_runs", "regression", "metrics")},
             "no_verdict": c.get("no_verdict")}
            for c in model["comparisons"]],
        "peers": model["peers"],
        "partition_cost": model.get("partition_cost", []),
        "omb": [{"ours": m["ours"], "label": m["label"],
                 "matches": [{k: v for k, v in x.items()} for x in m["matches"]]}
                for m in model["omb_matches"]],
        "runs": model["runs"],
        "skipped_inputs": model["skipped"],
    }


def _json_default(o: Any):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def _clean(o: Any) -> Any:
    """NaN/inf -> None so verdict.json is strict JSON."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        try:
            return _clean(o.item())
        except (ValueError, AttributeError):
            pass
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def write_outputs(model: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    doc = build_document(model)
    paths = {"md": out_dir / "report.md", "html": out_dir / "report.html",
             "verdict": out_dir / "verdict.json"}
    paths["md"].write_text(to_markdown(doc), encoding="utf-8")
    paths["html"].write_text(to_html(doc, "kbroker performance report"), encoding="utf-8")
    paths["verdict"].write_text(
        json.dumps(_clean(verdict(model)), indent=2, default=_json_default, allow_nan=False) + "\n",
        encoding="utf-8")
    return paths

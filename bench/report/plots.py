"""PNG plots (matplotlib, Agg backend). Each function returns the file written
or None when there is nothing to draw."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

_PCT_TICKS = [2, 10, 100, 1_000, 10_000, 100_000, 1_000_000]
_PCT_LABELS = ["50%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"]


def throughput_over_time(intervals: pd.DataFrame, meta: pd.DataFrame, out: Path) -> Path | None:
    """One panel per workload (a max-rate run and a 5,000 msg/s run do not share a
    y axis), a line per run labelled broker, round and run time."""
    if intervals.empty:
        return None
    m = meta.set_index("run_id")
    names = m["wl_name"] if "wl_name" in m else pd.Series("", index=m.index)
    workloads = sorted({str(names.get(r, "")) for r in intervals.run_id.unique()})
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 2.6 * len(workloads) + 0.8),
                             squeeze=False)
    for ax, wl in zip(axes[:, 0], workloads):
        for run_id, g in intervals.groupby("run_id"):
            if str(names.get(run_id, "")) != wl:
                continue
            warm = m["warmup_s"].get(run_id)
            # the warm-up and the kept intervals; not the short final one, whose rate
            # (a flush's tail over a fraction of an interval) would dwarf the rest
            g = g[g.kept | (g.start_ms < (warm or 0) * 1000.0)]
            col = "send_rps" if g.send_rps.fillna(0).sum() > 0 else "recv_rps"
            rnd = m["round"].get(run_id) if "round" in m else None
            label = (f"{m['broker'].get(run_id, '?')}"
                     + (f" r{int(rnd)}" if rnd is not None and pd.notna(rnd) else "")
                     + f" {run_id[9:15]}")      # HHMMSS of the run id's UTC timestamp
            line, = ax.plot(g.start_ms / 1000.0, g[col], lw=1.2, label=label)
            if warm:
                ax.axvline(warm, color=line.get_color(), ls=":", lw=0.8)
        ax.set_title(wl or "(no workload name)", fontsize=9)
        ax.set_ylabel("records/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best", ncol=2)
    axes[-1, 0].set_xlabel("time since run start (s); dotted = end of warm-up; "
                           "records sent, or received for consumer runs")
    fig.suptitle("Throughput per interval")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _curve_from_buckets(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    counts = g["count"].to_numpy(dtype=float)
    cum = np.cumsum(counts)
    total = cum[-1]
    frac = cum / total
    x = 1.0 / np.maximum(1.0 - frac, 1.0 / (total * 10.0))   # last point: just past 1/(1/N)
    return x, g.upper_us.to_numpy(dtype=float) / 1000.0


def latency_percentiles(curves: pd.DataFrame, labels: dict[str, str], metric: str, out: Path,
                        omb_curves: pd.DataFrame | None = None,
                        omb_labels: dict[str, str] | None = None) -> Path | None:
    """HdrHistogram-style percentile plot: x = 1/(1-q) on log axes."""
    ours = curves[(curves.metric == metric)]
    theirs = omb_curves[omb_curves.metric == metric] if omb_curves is not None else None
    if ours.empty and (theirs is None or theirs.empty):
        return None
    fig, ax = plt.subplots(figsize=(9, 5))
    for key, g in ours.groupby("key", sort=True):
        if key not in labels:
            continue
        x, y = _curve_from_buckets(g.sort_values("bucket"))
        ax.step(x, y, where="post", lw=1.3, label=labels[key])
    if theirs is not None:
        for f, g in theirs.groupby("file"):
            g = g[g["quantile"] < 100.0]
            if g.empty:
                continue
            x = 1.0 / (1.0 - g["quantile"].to_numpy() / 100.0)
            ax.plot(x, g.value_ms, ls="--", lw=1.0,
                    label=f"{(omb_labels or {}).get(f, f)} [OMB, cross-machine]")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(_PCT_TICKS)
    ax.set_xticklabels(_PCT_LABELS)
    ax.set_xlim(1, None)
    ax.set_xlabel("percentile")
    ax.set_ylabel(f"{metric} latency (ms)")
    ax.set_title(f"{metric} latency by percentile (merged histograms)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def regression_deltas(comparisons: list[dict], threshold: float, out: Path) -> Path | None:
    rows = []
    for i, c in enumerate(comparisons):
        for m in c["metrics"]:
            if not m["gates_verdict"] or m["delta_pct"] is None:
                continue
            worse = -m["delta_pct"] if m["better"] == "higher" else m["delta_pct"]
            rows.append((f"#{i + 1} {m['metric']}", worse, m["regression"]))
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.5))
    y = np.arange(len(rows))
    ax.barh(y, [r[1] for r in rows], color=["#d62728" if r[2] else "#7f7f7f" for r in rows])
    ax.axvline(100 * threshold, color="k", ls="--", lw=0.8)
    ax.axvline(-100 * threshold, color="k", ls="--", lw=0.8)
    ax.axvline(0, color="k", lw=0.5)
    ax.set_yticks(y)
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("change in the worse direction (%); red = significant regression")
    ax.set_title("Candidate vs baseline")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

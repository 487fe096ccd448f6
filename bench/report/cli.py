"""Command line: ``python -m bench.report --runs DIR [DIR...] [options]``.

Exit status: 0 report written (also with regressions unless
``--fail-on-regression``); 1 a regression was found and
``--fail-on-regression`` was given; 2 usage error or no usable input.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Sequence

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.report",
        description="Turn benchmark traces (and published Kafka OMB results) into a "
                    "performance regression report.")
    p.add_argument("--runs", nargs="+", required=True, metavar="DIR",
                   help="candidate run directories, or results directories holding runs")
    p.add_argument("--baseline", nargs="+", default=[], metavar="DIR",
                   help="baseline run directories (same forms as --runs)")
    p.add_argument("--omb", nargs="*", default=None, metavar="DIR",
                   help="OpenMessaging-Benchmark result directories "
                        "(default: bench/data/kafka-bench-results; give no DIR to disable)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output directory (default: bench/reports/<UTC timestamp>)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="relative change that counts as a regression (default 0.05 = 5%%)")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="one-sided significance level (default 0.05)")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 when any gated metric regressed")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; spark-submit's setting is kept)")
    a = p.parse_args(argv)
    if not 0 < a.threshold < 1:
        p.error("--threshold must be in (0, 1)")
    if not 0 < a.alpha < 1:
        p.error("--alpha must be in (0, 1)")
    return a


def _default_omb() -> list[str]:
    d = Path(__file__).resolve().parents[1] / "data" / "kafka-bench-results"
    return [str(d)] if d.is_dir() else []


def main(argv: Sequence[str] | None = None, spark=None) -> int:
    """Run the report; ``spark`` lets tests share one session."""
    try:
        args = parse_args(argv)
    except SystemExit as e:          # argparse: 0 for --help, 2 for usage errors
        return int(e.code or 0)
    from bench.report import pipeline

    out = Path(args.out) if args.out else (
        Path(__file__).resolve().parents[1] / "reports"
        / dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    omb = _default_omb() if args.omb is None else args.omb
    try:
        model = pipeline.run(runs=args.runs, baseline=args.baseline, omb=omb, out_dir=out,
                             threshold=args.threshold, alpha=args.alpha, master=args.master,
                             spark=spark)
    except pipeline.NoInput as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.baseline and args.fail_on_regression and not model["comparisons"]:
        print("error: --fail-on-regression with --baseline, but no baseline run matches a "
              "candidate (same tool, broker, client, workload)", file=sys.stderr)
        return EXIT_USAGE
    print(f"{model['status'].upper()}: report written to {out}/report.md, report.html, "
          f"verdict.json")
    for c in model["comparisons"]:
        for m in c["metrics"]:
            if m["regression"]:
                print(f"  regression: {c['broker']}/{c['client']} {c['workload']}: {m['metric']} "
                      f"{m['delta_pct']:+.1f}% (p={m['p_value']:.3g})")
    if model["status"] == "regression" and args.fail_on_regression:
        return EXIT_REGRESSION
    return EXIT_OK

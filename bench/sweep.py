"""Parameter sweeps over bench.produce: one produce run per value (per broker and round),
all in one session against the same broker process(es).

    python -m bench.sweep --param rate --values 1000,5000,20000,0 --duration 10
    python -m bench.sweep --param record-size --values 100,1024,10240 --vs tansu --rounds 2
    python -m bench.sweep --param linger-ms --values 0,1,5,20 --rate 5000

Every bench.produce option applies; ``--param`` names the one that varies. Each run
writes its own trace (workload names carry the value); a table of records/s, MB/s and
publish latency p50/p99 per value and broker is printed at the end.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import uuid

from bench import produce
from bench.common import COMPRESSIONS, finish_args, session_targets

#: --param name -> (attribute on the produce arguments, value parser)
PARAMS = {
    "rate": ("rate", float),
    "record-size": ("record_size", int),
    "linger-ms": ("linger_ms", float),
    "batch-size": ("batch_size", int),
    "partitions": ("partitions", int),
    "compression": ("compression", str),
    "acks": ("acks", str),
    "keys": ("keys", str),
}


def parse_values(param: str, text: str) -> list:
    attr, conv = PARAMS[param]
    vals = [conv(v.strip()) for v in text.split(",") if v.strip()]
    if not vals:
        raise SystemExit("--values is empty")
    if param == "compression" and any(v not in COMPRESSIONS for v in vals):
        raise SystemExit(f"compression values must be in {COMPRESSIONS}")
    if param == "acks":
        vals = ["all" if v == "-1" else v for v in vals]
        if any(v not in ("0", "1", "all") for v in vals):
            raise SystemExit("acks values must be 0, 1 or all")
    return vals


def build_parser() -> argparse.ArgumentParser:
    p = produce.build_parser()
    p.prog = "python -m bench.sweep"
    p.description = __doc__.split("\n\n")[0]
    g = p.add_argument_group("sweep")
    g.add_argument("--param", required=True, choices=sorted(PARAMS))
    g.add_argument("--values", required=True, help="comma-separated values of --param")
    return p


def main(argv: list[str] | None = None) -> int:
    args = finish_args(build_parser().parse_args(argv))
    values = parse_values(args.param, args.values)
    attr = PARAMS[args.param][0]
    rows = []
    with session_targets(args) as targets:
        session_id = uuid.uuid4().hex[:12]
        for v in values:
            run_args = copy.copy(args)
            setattr(run_args, attr, v)
            if args.workload_name:
                run_args.workload_name = f"{args.workload_name}-{args.param}-{v}"
            for k in range(args.rounds):
                for t in targets:
                    # one session per sweep; rounds of a value share the round index
                    s = produce.run_once(run_args, t, f"{session_id}-{args.param}-{v}", k)
                    rows.append((v, t.name, s))
    print(f"\nsweep over {args.param}:")
    print(f"{'value':>10} {'broker':>12} {'records/s':>12} {'MB/s':>8} {'p50 ms':>9} {'p99 ms':>9}")
    for v in values:
        for name in dict.fromkeys(n for _, n, _ in rows):
            ss = [s for vv, n, s in rows if vv == v and n == name]
            if not ss:
                continue
            med = lambda f: statistics.median(f(s) for s in ss)  # noqa: E731
            lat = [s.latency_ms.get("publish") for s in ss if s.latency_ms.get("publish")]
            p50 = statistics.median(x["p50"] for x in lat) if lat else float("nan")
            p99 = statistics.median(x["p99"] for x in lat) if lat else float("nan")
            print(f"{v!s:>10} {name:>12} {med(lambda s: s.records_per_s):>12,.0f} "
                  f"{med(lambda s: s.mb_per_s):>8.2f} {p50:>9.3f} {p99:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

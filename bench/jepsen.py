"""Longer Jepsen-style runs of the queue workload on a 3-broker KRaft cluster (issue 16).

    python -m bench.jepsen --seeds 1-10 --duration 60 --json /tmp/jepsen.json
    python -m bench.jepsen --seeds 7 --faults isolate,pause --max-faults 20

The suite's tests/chaos/test_queue_cluster.py runs short seeded runs; this runs as many
seeds as asked, each ``--duration`` s of ``--producers`` idempotent acks=all producers
(confluent-kafka, and kbroker.client for every third) on a fresh topic (RF 3,
min.insync.replicas=2, ``--partitions``) while a :class:`ClusterNemesis` applies up to
``--max-faults`` faults from ``--faults`` (kill-leader, kill, pause, isolate, terminate).
One cluster (``kbroker.chaos.cluster.ChaosCluster``) for all seeds, stopped by PID at the
end. Prints each run's verdict (:func:`kbroker.chaos.checker.check`) and the fault log;
exits 1 if any run lost, duplicated, reordered or moved an acknowledged record.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time

from kbroker.chaos.checker import check
from kbroker.chaos.cluster import ChaosCluster, ClusterNemesis
from kbroker.chaos.workload import run_queue_workload


def _seeds(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1-5")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=100.0, help="records/s per producer")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--faults", default="kill-leader,kill,pause,isolate,terminate")
    ap.add_argument("--max-faults", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the cluster's processes are stopped in ``finally``
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    clients = tuple("kbroker" if i % 3 == 2 else "confluent" for i in range(args.producers))
    runs, bad = [], 0
    with tempfile.TemporaryDirectory(prefix="bench-jepsen-") as d:
        c = ChaosCluster(d, overrides={"default.replication.factor": 3})
        try:
            c.start()
            c.wait_ready(60)
            for seed in _seeds(args.seeds):
                topic = f"jepsen-{seed}"
                c.create_topic(topic, args.partitions, 3, configs={"min.insync.replicas": 2})
                nem = ClusterNemesis(c, topic=topic, partitions=args.partitions, seed=seed,
                                     faults=tuple(args.faults.split(",")), gap_s=(1.0, 3.0), fault_s=(1.0, 5.0),
                                     max_faults=args.max_faults)
                t0 = time.monotonic()
                sends, reads, log = run_queue_workload(
                    c.bootstrap, topic, args.partitions, producers=args.producers,
                    records_per_producer=int(args.rate * args.duration), duration_s=args.duration, seed=seed,
                    nemesis=nem, clients=clients)
                v = check(sends, reads)
                bad += not v.ok
                runs.append({"seed": seed, "ok": v.ok, "summary": v.summary(), "faults": log,
                             "seconds": round(time.monotonic() - t0, 1)})
                print(f"seed {seed}: {'OK' if v.ok else 'FAIL'} {v.summary()}\n  faults: {log}", flush=True)
                c.wait_ready(60)
        finally:
            c.stop()
    out = {"tool": "bench.jepsen", "config": vars(args), "runs": runs, "failed": bad}
    path = args.json or os.path.join("bench", "results", f"jepsen-{int(time.time())}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"{len(runs) - bad}/{len(runs)} runs kept every acknowledged record")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

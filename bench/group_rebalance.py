"""Consumer-group rebalance time: kbroker vs the Tansu peer broker, same run, same client.

Workload: a 30-partition topic; 10 librdkafka consumers (eager ``range`` assignor,
``group.initial.rebalance.delay.ms=0`` on kbroker) subscribe at once. Measured, per
round, with one thread polling every consumer round-robin:

* ``join_10``: first subscribe → all 30 partitions assigned across the 10 members;
* ``grow_11``: an 11th member subscribes → every member holds its new share (3 or 2);
* ``shrink_10``: one member closes (LeaveGroup) → the 10 left hold all 30 again.

Prints JSON with the median seconds per phase and broker, and kbroker/peer ratios
(< 1: kbroker is faster).

    python bench/group_rebalance.py [--rounds 3] [--peer tansu|none]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PARTITIONS = 30
MEMBERS = 10


def _consumer(bootstrap, group):
    from confluent_kafka import Consumer
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 10000,
                     "heartbeat.interval.ms": 300, "enable.auto.commit": False,
                     "topic.metadata.refresh.interval.ms": 1000, "log_level": 3})


def _wait(consumers, cond, timeout_s=60.0) -> float:
    t0 = time.perf_counter()
    deadline = t0 + timeout_s
    while time.perf_counter() < deadline:
        for c in consumers:
            c.poll(0.005)
        if cond():
            return time.perf_counter() - t0
    raise TimeoutError("group did not stabilise in %.0fs" % timeout_s)


def _balanced(consumers, total):
    sizes = [len(c.assignment()) for c in consumers]
    return sum(sizes) == total and max(sizes) - min(sizes) <= 1


def one_round(bootstrap) -> dict[str, float]:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = "rb-" + uuid.uuid4().hex[:8], "rbg-" + uuid.uuid4().hex[:8]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
    time.sleep(0.5)
    cs = [_consumer(bootstrap, group) for _ in range(MEMBERS)]
    out = {}
    try:
        t0 = time.perf_counter()
        for c in cs:
            c.subscribe([topic])
        _wait(cs, lambda: _balanced(cs, PARTITIONS))
        out["join_10"] = time.perf_counter() - t0
        extra = _consumer(bootstrap, group)
        t0 = time.perf_counter()
        extra.subscribe([topic])
        cs.append(extra)
        _wait(cs, lambda: _balanced(cs, PARTITIONS) and len(extra.assignment()) > 0)
        out["grow_11"] = time.perf_counter() - t0
        gone = cs.pop(0)
        t0 = time.perf_counter()
        gone.close()
        _wait(cs, lambda: _balanced(cs, PARTITIONS))
        out["shrink_10"] = time.perf_counter() - t0
    finally:
        for c in cs:
            c.close()
    return out


def run(bootstrap, rounds) -> dict[str, float]:
    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for k, v in one_round(bootstrap).items():
            samples.setdefault(k, []).append(v)
    return {k: round(statistics.median(v), 3) for k, v in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--peer", choices=("tansu", "none"), default="tansu")
    args = ap.parse_args()
    from kbroker.testing import KBrokerProcess, TansuProcess

    result = {"workload": f"{MEMBERS} librdkafka consumers, {PARTITIONS} partitions, range assignor",
              "rounds": args.rounds}
    with KBrokerProcess(overrides={"group.initial.rebalance.delay.ms": 0}) as b:
        b.start()
        result["kbroker_s"] = run(b.bootstrap, args.rounds)
    if args.peer == "tansu":
        try:
            with TansuProcess() as t:
                t.start()
                result["tansu_s"] = run(t.bootstrap, args.rounds)
            result["ratio_kbroker_over_tansu"] = {
                k: round(result["kbroker_s"][k] / result["tansu_s"][k], 3)
                for k in result["kbroker_s"] if result["tansu_s"].get(k)}
        except Exception as e:  # the peer is optional
            result["tansu_error"] = repr(e)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

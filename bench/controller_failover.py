"""KRaft controller quorum: failover time and metadata scale (issue 15).

    python -m bench.controller_failover --kills 20
    python -m bench.controller_failover --kills 20 --kafka-defaults     # Kafka's default timeouts
    python -m bench.controller_failover --kills 0 --topics 1000         # scale only

Starts three controller-only nodes (``kbroker.testing.KRaftControllerQuorum``) and brokers
that only register and heartbeat (our BrokerLifecycleManager, in this process), then:

1. ``failover``: ``--kills`` times: SIGKILL the active controller, time until a CreateTopics
   succeeds on another node (the "next successful CreateTopics"), restart the killed node
   and wait until it has caught up (DescribeQuorum) before the next kill. Median, p95, p99.
2. ``scale``: with ``--brokers`` registered brokers, CreateTopics for ``--topics`` topics of
   ``--partitions`` partitions and replication factor ``--rf`` (50 topics per request):
   time, records in the metadata log, each controller's RSS; then a SIGTERM of all three
   and a restart, timed until the active controller answers CreateTopics again (each node
   loads its newest metadata snapshot, then replays the log after it); then a broker-only
   node (a real ``kbroker serve``, stopped while the topics were created) is started and
   timed until its Metadata lists every topic (it fetches the leader's snapshot when its
   position is below the leader's log start, then the tail). Snapshots are taken every
   ``--snapshot-bytes`` of records (``metadata.log.max.record.bytes.between.snapshots``;
   Kafka's default is 20 MiB, more than a 1,000-topic log holds, so the bench lowers it).

Timeouts: ``controller.quorum.election.timeout.ms`` / ``fetch.timeout.ms`` default here to
300 / 600 ms (``--election-timeout-ms``, ``--fetch-timeout-ms``). The fetch timeout must
stay above the 500 ms max wait of the followers' long-poll Fetch, or an idle but healthy
leader looks dead; a 300-600 ms randomized election timeout and backoff settle a split vote
(both followers time out together) within one more round. Measured on this host, 20 kills
each: 300/600 -> median 0.99 s, p95 1.15 s; 200/500 -> median 0.83 s, p95 0.91 s, but one of
those 20 kills found leadership already moved (a spurious election: the bench sets
``controller.quorum.request.timeout.ms`` to the fetch timeout, and at 500 ms that equals
the Fetch max wait, so a parked Fetch can time out). Kafka's defaults are 1000 / 2000 ms
(``--kafka-defaults``).
Every wait has a deadline; processes are stopped by PID at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid

from bench.trace import percentile_rank
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import create_topics as CT
from kbroker.server.broker_lifecycle import BrokerLifecycle, BrokerLifecycleManager
from kbroker.server.inter_node import ControllerChannel, InterNodeSendThread, StaticNodes
from kbroker.testing import KRaftControllerQuorum


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _brokers(q, ids):
    sender = InterNodeSendThread("bench-brokers", StaticNodes({i: ("127.0.0.1", p) for i, p in q.ports.items()}),
                                 {"reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200})
    mgrs = []
    for b in ids:
        lc = BrokerLifecycle(node_id=b, cluster_id=q.cluster_id, listeners=[("PLAINTEXT", "127.0.0.1", 9000 + b, 0)],
                             features={"metadata.version": (7, 21)}, log_dirs=[uuid.uuid4()], rack=None,
                             heartbeat_interval_ms=500, metadata_offset=lambda: 1 << 40)
        m = BrokerLifecycleManager(lc, ControllerChannel(sender, retry_backoff_s=0.05), request_timeout_s=2.0)
        m.start()
        m.set_ready_to_unfence()
        mgrs.append(m)
    for m in mgrs:
        if not m.lifecycle.unfenced.wait(60):
            raise TimeoutError(f"broker {m.lifecycle.node_id} was not unfenced")
    return sender, mgrs


def _create(q, names, partitions, rf, exclude=(), timeout_s=60.0):
    req = CT.CreateTopicsRequest(topics=[CT.CreatableTopic(name=n, num_partitions=partitions, replication_factor=rf)
                                         for n in names], timeout_ms=30000)
    node, r = q.to_controller(ApiKey.CREATE_TOPICS, 7, req, timeout_s=timeout_s, exclude=exclude)
    # a retry of a CreateTopics whose first attempt committed although its answer was lost
    # (the leader changed in between) finds the topic there: that is success too
    bad = [(t.name, t.error_code, t.error_message) for t in r.topics
           if t.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS)]
    if bad:
        raise RuntimeError(f"CreateTopics failed: {bad[:3]}")
    return node


def failover(q, kills: int) -> dict:
    times = []
    for k in range(kills):
        leader, _ = q.leader()
        _create(q, [f"before-{k}-{uuid.uuid4().hex[:6]}"], 1, 1)
        t0 = time.monotonic()
        q.procs[leader].kill()
        node = _create(q, [f"after-{k}-{uuid.uuid4().hex[:6]}"], 1, 1, exclude=(leader,))
        times.append(time.monotonic() - t0)
        assert node != leader
        q.start(leader)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            nl, _ = q.leader()
            ends = {v.replica_id: v.log_end_offset for v in q.describe(nl).current_voters}
            if ends.get(leader) == ends.get(nl):
                break
            time.sleep(0.05)
        print(f"  kill {k + 1}/{kills}: leader {leader} -> {node} in {times[-1] * 1000:.0f} ms", flush=True)
    ordered = sorted(times)
    return {"kills": kills, "median_ms": statistics.median(times) * 1000,
            "p95_ms": ordered[percentile_rank(95, len(ordered)) - 1] * 1000,
            "p99_ms": ordered[percentile_rank(99, len(ordered)) - 1] * 1000, "max_ms": max(times) * 1000,
            "all_ms": [round(t * 1000, 1) for t in times]} if times else {}


def _listed_topics(port: int) -> int:
    from confluent_kafka.admin import AdminClient

    try:
        return len(AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10).topics)
    except Exception:
        return -1


def scale(q, topics: int, partitions: int, rf: int) -> dict:
    names = [f"scale-{i:05d}" for i in range(topics)]
    observers = [i for i in q.broker_ports if i not in q.ports]
    for i in observers:
        q.procs[i].terminate()
    t0 = time.monotonic()
    for i in range(0, topics, 50):
        _create(q, names[i:i + 50], partitions, rf)
    create_s = time.monotonic() - t0
    leader, _ = q.leader()
    end = q.describe(leader).high_watermark
    rss = {i: round(_rss_mb(p.pid), 1) for i, p in q.procs.items() if p.proc is not None}
    for i in q.ports:
        q.procs[i].terminate()
    t0 = time.monotonic()
    for i in q.ports:
        q.start(i)
    _create(q, [f"after-restart-{uuid.uuid4().hex[:6]}"], 1, 1, timeout_s=300)
    restart_s = time.monotonic() - t0
    out = {"topics": topics, "partitions": partitions, "rf": rf, "create_s": round(create_s, 3),
           "metadata_log_end_offset": end, "controller_rss_mb": rss, "restart_to_create_s": round(restart_s, 3)}
    for i in observers:
        t0 = time.monotonic()
        q.start(i)
        deadline = t0 + 300
        while _listed_topics(q.broker_ports[i]) < topics + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        out[f"broker_{i}_start_to_full_metadata_s"] = round(time.monotonic() - t0, 3)
        out[f"broker_{i}_rss_mb"] = round(_rss_mb(q.procs[i].pid), 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--topics", type=int, default=0, help="scale run: topics to create (0: skip)")
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--election-timeout-ms", type=int, default=300)
    ap.add_argument("--fetch-timeout-ms", type=int, default=600)
    ap.add_argument("--kafka-defaults", action="store_true", help="election 1000 ms, fetch 2000 ms")
    ap.add_argument("--snapshot-bytes", type=int, default=262144,
                    help="metadata.log.max.record.bytes.between.snapshots (Kafka's default: 20971520)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    el, fe = (1000, 2000) if args.kafka_defaults else (args.election_timeout_ms, args.fetch_timeout_ms)
    overrides = {"controller.quorum.election.timeout.ms": el, "controller.quorum.fetch.timeout.ms": fe,
                 "controller.quorum.election.backoff.max.ms": el, "controller.quorum.request.timeout.ms": fe,
                 "metadata.log.max.record.bytes.between.snapshots": args.snapshot_bytes}
    out = {"election_timeout_ms": el, "fetch_timeout_ms": fe, "snapshot_bytes": args.snapshot_bytes}
    with tempfile.TemporaryDirectory(prefix="kbroker-quorum-") as d:
        q = KRaftControllerQuorum(d, overrides=overrides, brokers=1 if args.topics else 0)
        sender = mgrs = None
        try:
            q.start()
            q.leader()
            sender, mgrs = _brokers(q, range(101, 101 + max(1, args.brokers)))
            if args.kills:
                out["failover"] = failover(q, args.kills)
            if args.topics:
                out["scale"] = scale(q, args.topics, args.partitions, args.rf)
        finally:
            for m in mgrs or ():
                m.close()
            if sender is not None:
                sender.close()
            q.stop()
    print(json.dumps(out, indent=1))
    path = args.json or os.path.join("bench", "results", f"controller-failover-{int(time.time())}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

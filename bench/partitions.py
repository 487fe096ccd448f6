"""Partition lifecycle at scale: one broker, many partitions (issue 23).

    python -m bench.partitions --partitions 10000            # 200 topics x 50
    python -m bench.partitions --partitions 2000 --topics 40 --json out.json

Starts a kbroker (``kbroker.testing.KBrokerProcess``, a temporary data dir, a free
port) and measures, in order:

1. ``create``: CreateTopics for every topic (``--topics`` topics of
   ``--partitions / --topics`` partitions, ``--topics-per-request`` per request),
   until every result is in;
2. ``first_record``: one record to every partition (one librdkafka producer,
   acks=all, partitions round-robin), until every delivery report is in;
3. ``metadata``: a Metadata request for all topics over a raw connection
   (``--metadata-requests`` times, request sent to response frame received, not
   decoded; median and max), and confluent's ``list_topics``;
4. ``idle``: the broker's CPU over ``--idle-seconds`` (utime+stime from
   /proc/<pid>/stat, % of one core), its RSS (/proc/<pid>/status), open fds
   (/proc/<pid>/fd) and memory maps (/proc/<pid>/maps), and per partition
   against the empty broker's;
5. ``clean_stop``: SIGTERM until the process exits;
6. ``restart``: spawn until a Metadata request lists every partition;
7. ``kill_restart``: one more record to every partition, SIGKILL, spawn until
   Metadata answers again; then every partition's log end offset is checked
   (ListOffsets latest == 2) unless ``--no-verify``.

Prints a table and writes the results as JSON (``--json``, default
``bench/results/partitions-<time>.json``). Every wait has a deadline
(``--timeout``); the broker is stopped by its PID at the end, whatever happened.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- /proc ------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK   # utime, stime (fields 14, 15)


def process_stats(pid: int) -> dict:
    rss_kb = 0
    threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for _ in f)
    return {"rss_mb": rss_kb / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")), "maps": maps,
            "threads": threads}


def idle_cpu_percent(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


# -- raw requests ----------------------------------------------------------------------------
class RawConnection:
    """One blocking connection for timing single requests (no client library in the way)."""

    def __init__(self, bootstrap: str, timeout: float):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation_id = 0

    def request_frame(self, api_key: int, version: int, body) -> bytes:
        """Send one request; the response frame, undecoded (what the broker's latency is)."""
        from kbroker.protocol import encode_request
        self.correlation_id += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation_id, "bench-partitions", body))
        head = self._recv_exactly(4)
        return self._recv_exactly(struct.unpack(">i", head)[0])

    def request(self, api_key: int, version: int, body):
        from kbroker.protocol import decode_response
        frame = self.request_frame(api_key, version, body)
        header, resp = decode_response(frame, api_key, version)
        if header.correlation_id != self.correlation_id:
            raise RuntimeError("correlation id mismatch")
        return resp

    def _recv_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def metadata_all(conn: RawConnection, decode: bool = True):
    """A Metadata v12 request for all topics: the decoded response, or (decode=False)
    its frame, so a timing does not include our own Python decoder."""
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.metadata import MetadataRequest
    req = MetadataRequest(topics=None, allow_auto_topic_creation=False)
    if not decode:
        return conn.request_frame(ApiKey.METADATA, 12, req)
    return conn.request(ApiKey.METADATA, 12, req)


def wait_for_metadata(bootstrap: str, expected_partitions: int, deadline: float) -> float:
    """Poll Metadata until it lists ``expected_partitions`` partitions; the time it answered."""
    last = None
    while time.monotonic() < deadline:
        try:
            conn = RawConnection(bootstrap, timeout=max(1.0, deadline - time.monotonic()))
            try:
                resp = metadata_all(conn)
            finally:
                conn.close()
            n = sum(len(t.partitions) for t in resp.topics if t.error_code == 0)
            if n >= expected_partitions:
                return time.monotonic()
            last = f"{n} partitions"
        except OSError as e:
            last = repr(e)
        time.sleep(0.02)
    raise TimeoutError(f"Metadata did not list {expected_partitions} partitions in time (last: {last})")


def log_end_offsets(bootstrap: str, topics: list[str], per_topic: int, timeout: float) -> dict:
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.list_offsets import (
        ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
    )
    conn = RawConnection(bootstrap, timeout)
    out = {}
    try:
        for i in range(0, len(topics), 50):
            req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
                ListOffsetsTopic(name=t, partitions=[ListOffsetsPartition(partition_index=p, timestamp=-1)
                                                     for p in range(per_topic)])
                for t in topics[i:i + 50]])
            resp = conn.request(ApiKey.LIST_OFFSETS, 7, req)
            for t in resp.topics:
                for p in t.partitions:
                    out[(t.name, p.partition_index)] = p.offset if p.error_code == 0 else -1
    finally:
        conn.close()
    return out


# -- client steps ----------------------------------------------------------------------------
def create_topics(bootstrap: str, topics: list[str], per_topic: int, per_request: int, timeout: float) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": min(300000, int(timeout * 1000))})
    for i in range(0, len(topics), per_request):
        futures = admin.create_topics([NewTopic(t, num_partitions=per_topic, replication_factor=1)
                                       for t in topics[i:i + per_request]],
                                      operation_timeout=timeout, request_timeout=timeout)
        for f in futures.values():
            f.result(timeout=timeout)


def produce_one_each(bootstrap: str, topics: list[str], per_topic: int, timeout: float, value: bytes) -> int:
    """One record to every partition, round-robin over partitions; returns delivery failures."""
    from confluent_kafka import Producer
    errors = []
    delivered = [0]

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            delivered[0] += 1

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "queue.buffering.max.messages": 2_000_000, "message.timeout.ms": int(timeout * 1000),
                  "enable.idempotence": False})
    total = len(topics) * per_topic
    deadline = time.monotonic() + timeout
    for p_idx in range(per_topic):
        for t in topics:
            while True:
                try:
                    p.produce(t, value, partition=p_idx, on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.05)
                    if time.monotonic() > deadline:
                        raise TimeoutError("producer queue stayed full")
        p.poll(0)
    while delivered[0] + len(errors) < total and time.monotonic() < deadline:
        p.poll(0.1)
    left = p.flush(max(0.0, deadline - time.monotonic()))
    if left or delivered[0] + len(errors) < total:
        raise TimeoutError(f"{total - delivered[0] - len(errors)} records undelivered after {timeout}s")
    return len(errors)


def list_topics_seconds(bootstrap: str, timeout: float) -> float:
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.list_topics(timeout=timeout)  # connect + ApiVersions first
    t0 = time.perf_counter()
    admin.list_topics(timeout=timeout)
    return time.perf_counter() - t0


# -- the run -----------------------------------------------------------------------------------
def run(args) -> dict:
    from kbroker.testing import KBrokerProcess

    per_topic = max(1, args.partitions // args.topics)
    total = per_topic * args.topics
    topics = [f"lc-{i:05d}" for i in range(args.topics)]
    data_dir = tempfile.mkdtemp(prefix="kbroker-partitions-", dir=args.data_root)
    overrides = dict(kv.split("=", 1) for kv in args.broker_override)
    res: dict = {"partitions": total, "topics": args.topics, "partitions_per_topic": per_topic,
                 "kbroker": os.path.dirname(os.path.abspath(sys.modules["kbroker"].__file__)),
                 "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "overrides": overrides}
    broker = KBrokerProcess(data_dir=data_dir, overrides=overrides)
    T = args.timeout
    try:
        broker.start(timeout_s=T)
        bootstrap = broker.bootstrap
        wait_for_metadata(bootstrap, 0, time.monotonic() + T)
        res["empty"] = process_stats(broker.pid)

        t0 = time.monotonic()
        create_topics(bootstrap, topics, per_topic, args.topics_per_request, T)
        res["create_s"] = time.monotonic() - t0
        wait_for_metadata(bootstrap, total, time.monotonic() + T)
        res["after_create"] = process_stats(broker.pid)

        value = b"x" * args.record_size
        t0 = time.monotonic()
        res["first_record_errors"] = produce_one_each(bootstrap, topics, per_topic, T, value)
        res["first_record_s"] = time.monotonic() - t0

        conn = RawConnection(bootstrap, T)
        try:
            lat = []
            for _ in range(args.metadata_requests):
                t0 = time.perf_counter()
                metadata_all(conn, decode=False)
                lat.append(time.perf_counter() - t0)
            resp = metadata_all(conn)
            if sum(len(t.partitions) for t in resp.topics) < total:
                raise RuntimeError("Metadata lists fewer partitions than were created")
        finally:
            conn.close()
        res["metadata_ms"] = {"median": 1000 * statistics.median(lat), "max": 1000 * max(lat),
                              "min": 1000 * min(lat), "n": len(lat)}
        res["list_topics_ms"] = 1000 * list_topics_seconds(bootstrap, T)

        time.sleep(args.settle_seconds)
        res["idle_cpu_pct"] = idle_cpu_percent(broker.pid, args.idle_seconds)
        st = res["loaded"] = process_stats(broker.pid)
        e = res["empty"]
        res["per_partition"] = {"rss_kb": 1024 * (st["rss_mb"] - e["rss_mb"]) / total,
                                "fds": (st["fds"] - e["fds"]) / total, "maps": (st["maps"] - e["maps"]) / total}

        pid = broker.pid
        t0 = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        try:
            rc = broker.proc.wait(T)
        except Exception:
            broker.kill()
            raise TimeoutError(f"broker did not stop within {T}s of SIGTERM")
        res["clean_stop_s"] = time.monotonic() - t0
        res["clean_stop_rc"] = rc
        broker._reap()

        t0 = time.monotonic()
        broker.start(timeout_s=T)
        res["restart_s"] = wait_for_metadata(bootstrap, total, t0 + T) - t0
        res["restart_stats"] = process_stats(broker.pid)

        produce_one_each(bootstrap, topics, per_topic, T, value)
        broker.kill()
        t0 = time.monotonic()
        broker.start(timeout_s=T)
        res["kill_restart_s"] = wait_for_metadata(bootstrap, total, t0 + T) - t0
        if not args.no_verify:
            leos = log_end_offsets(bootstrap, topics, per_topic, T)
            bad = {f"{t}-{p}": o for (t, p), o in leos.items() if o != 2}
            res["verify_bad_partitions"] = len(bad) + (total - len(leos))
            if bad:
                res["verify_examples"] = dict(list(bad.items())[:5])
        t0 = time.monotonic()
        broker.terminate(timeout_s=T)
        res["final_stop_s"] = time.monotonic() - t0
        res["broker_log_warnings"] = sum(1 for line in broker.read_log().splitlines()
                                         if " WARNING " in line or " ERROR " in line)
    finally:
        broker.kill()
        if args.keep:
            res["data_dir"] = data_dir
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return res


ROWS = [
    ("CreateTopics, all partitions", "create_s", "s"),
    ("first record to each partition", "first_record_s", "s"),
    ("Metadata (all topics), median", ("metadata_ms", "median"), "ms"),
    ("Metadata (all topics), max", ("metadata_ms", "max"), "ms"),
    ("confluent list_topics", "list_topics_ms", "ms"),
    ("idle CPU (% of one core)", "idle_cpu_pct", "%"),
    ("RSS loaded", ("loaded", "rss_mb"), "MB"),
    ("RSS per partition", ("per_partition", "rss_kb"), "KB"),
    ("open fds", ("loaded", "fds"), ""),
    ("fds per partition", ("per_partition", "fds"), ""),
    ("memory maps", ("loaded", "maps"), ""),
    ("maps per partition", ("per_partition", "maps"), ""),
    ("clean stop (SIGTERM to exit)", "clean_stop_s", "s"),
    ("restart (to Metadata)", "restart_s", "s"),
    ("fds after restart", ("restart_stats", "fds"), ""),
    ("restart after SIGKILL", "kill_restart_s", "s"),
    ("partitions with a wrong LEO after SIGKILL", "verify_bad_partitions", ""),
]


def _get(res, key):
    if isinstance(key, tuple):
        v = res
        for k in key:
            v = v.get(k) if isinstance(v, dict) else None
        return v
    return res.get(key)


def format_table(res: dict) -> str:
    lines = [f"{res['partitions']} partitions ({res['topics']} topics x {res['partitions_per_topic']}), "
             f"kbroker from {res['kbroker']}"]
    for label, key, unit in ROWS:
        v = _get(res, key)
        if v is None:
            continue
        s = f"{v:.3f}" if isinstance(v, float) else str(v)
        lines.append(f"  {label:<44} {s:>12} {unit}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=10000, help="partitions in all (default 10000)")
    p.add_argument("--topics", type=int, default=200, help="topics (default 200)")
    p.add_argument("--topics-per-request", type=int, default=200, help="topics per CreateTopics request")
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--metadata-requests", type=int, default=20)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--settle-seconds", type=float, default=2.0, help="wait before measuring idle CPU")
    p.add_argument("--timeout", type=float, default=300.0, help="deadline of every single wait (s)")
    p.add_argument("--broker-override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--data-root", default=None, help="parent of the temporary data dir")
    p.add_argument("--json", default=None, help="results file (default bench/results/partitions-<time>.json)")
    p.add_argument("--no-verify", action="store_true", help="skip the log end offset check after SIGKILL")
    p.add_argument("--keep", action="store_true", help="keep the data dir")
    args = p.parse_args(argv)
    res = run(args)
    print(format_table(res))
    out = Path(args.json) if args.json else REPO / "bench" / "results" / f"partitions-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, sort_keys=True))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Per-partition cost of a Produce and a Fetch: one request carrying N partitions.

    python -m bench.partition_cost                               # N = 1,10,100,1000, temp kbroker
    python -m bench.partition_cost --vs tansu --rounds 3         # alternating with the Tansu peer
    python -m bench.partition_cost --partitions 1,1000 --acks all --duration 5

For each N the driver sends, on one connection and one request at a time, a Produce
whose N partitions each carry one record batch (``--records-per-batch`` records of
``--record-size`` bytes), then a Fetch of the same N partitions from offset 0 with
``partition_max_bytes`` of one batch (so each partition answers one batch; min_bytes 1
and max_wait_ms 500, answered at once since the data is there — Tansu answers a
max_wait_ms 0 fetch with no partitions at all). What is
reported per (broker, api, N):

* the request round trip (median, p99) and the median divided by N: µs per
  partition-batch as a client sees it;
* the broker's CPU time (utime + stime from ``/proc/<pid>/stat``) per request divided
  by N: µs of broker CPU per partition-batch, the figure that must stay flat as N grows
  (a shared 2-core machine makes wall-clock numbers noisy; CPU per request much less).

Requests go through kbroker's generated codecs on a raw socket (no client library in
the way); every partition of every answer is checked for error code 0, so a broker
that refuses the work cannot look fast. Bounded: each (api, N) step stops after
``--requests`` requests or ``--duration`` seconds, whichever comes first. One trace
per (broker, api, N) goes to ``--results`` (latency metric ``produce_request`` or
``fetch_request``: one sample per request round trip; records and value bytes
acknowledged or received per interval), and a JSON summary is printed with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time
import uuid

from bench.common import Target, session_targets
from bench.trace import TraceWriter, process_cpu_seconds

TOOL = "bench.partition_cost"
PRODUCE, FETCH, API_VERSIONS = 0, 1, 18


class RawConnection:
    """One blocking connection speaking through kbroker.protocol; one request at a time."""

    def __init__(self, bootstrap: str, timeout_s: float = 30.0):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.corr = 0

    def request(self, api_key: int, version: int, body_bytes_fn):
        """Send ``body_bytes_fn(corr)`` (a whole frame) and return the decoded response."""
        from kbroker.protocol import decode_response
        self.corr += 1
        self.sock.sendall(body_bytes_fn(self.corr))
        header, body = decode_response(self._read_frame(), api_key, version)
        if header.correlation_id != self.corr:
            raise RuntimeError(f"correlation id {header.correlation_id} answered, {self.corr} sent")
        return body

    def _read_frame(self) -> bytes:
        head = self._read_exact(4)
        (n,) = struct.unpack(">i", head)
        return self._read_exact(n)

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("broker closed the connection")
            got += k
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def pick_version(conn: RawConnection, api_key: int, want: int) -> int:
    """min(want, the broker's max) for ``api_key``, from ApiVersions v0."""
    from kbroker.protocol import encode_request
    from kbroker.protocol.messages.api_versions import ApiVersionsRequest
    resp = conn.request(API_VERSIONS, 0, lambda c: encode_request(API_VERSIONS, 0, c, "bench", ApiVersionsRequest()))
    for k in resp.api_keys:
        if k.api_key == api_key:
            return min(want, k.max_version)
    raise RuntimeError(f"broker does not support api {api_key}")


def create_topics(bootstrap: str, n_partitions: int, per_topic: int) -> list[tuple[str, int]]:
    """Topics of ``per_topic`` partitions (the last one smaller) holding ``n_partitions``
    in all; returns the (topic, partition) list in creation order."""
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    prefix = f"bench-pc-{uuid.uuid4().hex[:8]}"
    sizes, left = [], n_partitions
    while left > 0:
        sizes.append(min(per_topic, left))
        left -= sizes[-1]
    names = [f"{prefix}-{i}" for i in range(len(sizes))]
    futs = admin.create_topics([NewTopic(n, num_partitions=s, replication_factor=1)
                                for n, s in zip(names, sizes)], request_timeout=120)
    for f in futs.values():
        f.result(timeout=180)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:      # every leader known before the first produce
        md = admin.list_topics(timeout=10)
        if all(n in md.topics and len(md.topics[n].partitions) == s for n, s in zip(names, sizes)):
            break
        time.sleep(0.2)
    else:
        raise RuntimeError("created topics did not show up in Metadata within 60 s")
    return [(n, p) for n, s in zip(names, sizes) for p in range(s)]


def _group(tps):
    topics: dict[str, list[int]] = {}
    for t, p in tps:
        topics.setdefault(t, []).append(p)
    return topics


def produce_frame_fn(tps, batch: bytes, version: int, acks: int):
    from kbroker.protocol import encode_request
    from kbroker.protocol.messages.produce import PartitionProduceData, ProduceRequest, TopicProduceData
    req = ProduceRequest(acks=acks, timeout_ms=30000, topic_data=[
        TopicProduceData(name=t, partition_data=[PartitionProduceData(index=p, records=batch) for p in ps])
        for t, ps in _group(tps).items()])
    body = encode_request(PRODUCE, version, 0, "bench", req)
    # the correlation id sits after size(4) api_key(2) api_version(2): patch it per request
    frame = bytearray(body)
    return lambda corr: (struct.pack_into(">i", frame, 8, corr), frame)[1]


def fetch_frame_fn(tps, part_bytes: int, version: int):
    from kbroker.protocol import encode_request
    from kbroker.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic
    req = FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=0x7FFFFFFF, isolation_level=0,
                       session_id=0, session_epoch=-1, topics=[
                           FetchTopic(topic=t, partitions=[FetchPartition(
                               partition=p, fetch_offset=0, partition_max_bytes=part_bytes,
                               log_start_offset=-1, current_leader_epoch=-1) for p in ps])
                           for t, ps in _group(tps).items()], forgotten_topics_data=[], rack_id="")
    frame = bytearray(encode_request(FETCH, version, 0, "bench", req))
    return lambda corr: (struct.pack_into(">i", frame, 8, corr), frame)[1]


def check_produce(resp, n: int) -> None:
    seen = 0
    for t in resp.responses:
        for p in t.partition_responses:
            if p.error_code != 0:
                raise RuntimeError(f"produce to {t.name}-{p.index} failed with error {p.error_code}")
            seen += 1
    if seen != n:
        raise RuntimeError(f"produce answered {seen} partitions, asked {n}")


def check_fetch(resp, n: int) -> int:
    seen = nbytes = 0
    if resp.error_code != 0:
        raise RuntimeError(f"fetch failed with error {resp.error_code}")
    for t in resp.responses:
        for p in t.partitions:
            if p.error_code != 0:
                raise RuntimeError(f"fetch of {t.topic}-{p.partition_index} failed with error {p.error_code}")
            if not p.records:
                raise RuntimeError(f"fetch of {t.topic}-{p.partition_index} returned no records")
            seen += 1
            nbytes += len(p.records)
    if seen != n:
        raise RuntimeError(f"fetch answered {seen} partitions, asked {n}")
    return nbytes


def measure(conn: RawConnection, target: Target, frame_fn, api_key: int, version: int, check, n: int,
            args, trace: TraceWriter, metric: str) -> dict:
    """Send the request until --requests or --duration; returns the step's figures."""
    for _ in range(args.warmup_requests):
        check(conn.request(api_key, version, frame_fn), n)
    lat_us = []
    cpu0 = process_cpu_seconds(target.pid) if target.pid else None
    t_end = time.monotonic() + args.duration
    while len(lat_us) < args.requests and time.monotonic() < t_end:
        t0 = time.perf_counter()
        resp = conn.request(api_key, version, frame_fn)
        us = (time.perf_counter() - t0) * 1e6
        check(resp, n)
        lat_us.append(us)
        trace.record_latency(metric, us)
        records_n = n * args.records_per_batch
        if api_key == PRODUCE:
            trace.record_send(records_n, records_n * args.record_size)
        else:
            trace.record_receive(records_n, records_n * args.record_size)
    cpu1 = process_cpu_seconds(target.pid) if target.pid else None
    med = statistics.median(lat_us)
    lat_sorted = sorted(lat_us)
    p99 = lat_sorted[min(len(lat_sorted) - 1, int(0.99 * len(lat_sorted)))]
    cpu_us = ((cpu1 - cpu0) * 1e6 / len(lat_us)) if cpu0 is not None and cpu1 is not None else None
    return {"requests": len(lat_us), "median_us": med, "p99_us": p99, "us_per_partition": med / n,
            "broker_cpu_us_per_request": cpu_us,
            "broker_cpu_us_per_partition": (cpu_us / n) if cpu_us is not None else None}


def run_broker(target: Target, args, session_id: str, round_: int) -> list[dict]:
    from kbroker.kernels import records
    ns = sorted(args.partitions)
    tps = create_topics(target.bootstrap, max(ns), args.partitions_per_topic)
    value = b"x" * args.record_size
    now = int(time.time() * 1000)
    batch = records.encode_batch([(now, None, value, [])] * args.records_per_batch)
    acks = -1 if args.acks == "all" else int(args.acks)
    conn = RawConnection(target.bootstrap)
    rows = []
    try:
        pv = pick_version(conn, PRODUCE, 9)
        fv = pick_version(conn, FETCH, 12)
        # one batch in every partition first, so the fetch step always has data and the
        # produce step measures appends to partitions that already exist on disk
        check_produce(conn.request(PRODUCE, pv, produce_frame_fn(tps, batch, pv, acks)), len(tps))
        for n in ns:
            sub = tps[:n]
            for api, metric in (("produce", "produce_request"), ("fetch", "fetch_request")):
                manifest = {"tool": TOOL, "broker": target.name, "broker_version": target.version,
                            "client": "kbroker", "session_id": session_id, "round": round_, "warmup_s": 0,
                            "workload": {"name": f"partition-cost-{api}-{n}p-{args.record_size}b",
                                         "topics": len({t for t, _ in sub}), "partitions": n,
                                         "message_size": args.record_size, "producer_rate": 0,
                                         "consumers": 1 if api == "fetch" else 0, "acks": args.acks,
                                         "linger_ms": 0, "batch_size": len(batch), "compression": "none",
                                         "key_distribution": "none", "duration_s": args.duration,
                                         "records_per_batch": args.records_per_batch}}
                with TraceWriter(args.results, manifest, broker_pid=target.pid, autotick=True) as tw:
                    if api == "produce":
                        r = measure(conn, target, produce_frame_fn(sub, batch, pv, acks), PRODUCE, pv,
                                    check_produce, n, args, tw, metric)
                    else:
                        r = measure(conn, target, fetch_frame_fn(sub, len(batch), fv), FETCH, fv,
                                    check_fetch, n, args, tw, metric)
                rows.append({"broker": target.name, "round": round_, "api": api, "partitions": n, **r})
                if not args.quiet:
                    _print_row(rows[-1])
    finally:
        conn.close()
    return rows


def _fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def _print_row(r: dict, out=sys.stdout) -> None:
    print(f"{r['broker']:>8} r{r['round']} {r['api']:>7} N={r['partitions']:>5}: {r['requests']:>5} req, "
          f"median {_fmt(r['median_us'] / 1000, 3)} ms, p99 {_fmt(r['p99_us'] / 1000, 3)} ms, "
          f"{_fmt(r['us_per_partition'], 2)} us/partition, broker CPU "
          f"{_fmt(r['broker_cpu_us_per_partition'], 2)} us/partition", file=out, flush=True)


def summarize(rows: list[dict], out=sys.stdout) -> dict:
    """Median over rounds per (broker, api, N); ratio primary/peer of the µs-per-partition figures."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["broker"], r["api"], r["partitions"]), []).append(r)
    table = {}
    for key, rs in sorted(by.items()):
        med = lambda k: (statistics.median([x[k] for x in rs if x[k] is not None])  # noqa: E731
                         if any(x[k] is not None for x in rs) else None)
        table[key] = {"us_per_partition": med("us_per_partition"),
                      "broker_cpu_us_per_partition": med("broker_cpu_us_per_partition")}
    print("\nmedian over rounds: broker api N -> us/partition (round trip), broker CPU us/partition", file=out)
    for (b, api, n), v in table.items():
        print(f"  {b:>8} {api:>7} {n:>5}: {_fmt(v['us_per_partition'], 2):>8}  "
              f"{_fmt(v['broker_cpu_us_per_partition'], 2):>8}", file=out)
    return {f"{b}/{api}/{n}": v for (b, api, n), v in table.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.partition_cost", description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", help="broker to measure (default: start a kbroker)")
    p.add_argument("--broker-name", default="kbroker")
    p.add_argument("--broker-pid", type=int)
    p.add_argument("--broker-override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--vs", help="tansu | kbroker | HOST:PORT: alternate rounds with a second broker")
    p.add_argument("--vs-name")
    p.add_argument("--vs-pid", type=int)
    p.add_argument("--rounds", type=int, default=None, help="rounds per broker (default 1, 3 with --vs)")
    p.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 100, 1000])
    p.add_argument("--partitions-per-topic", type=int, default=50)
    p.add_argument("--record-size", type=int, default=100)
    p.add_argument("--records-per-batch", type=int, default=1)
    p.add_argument("--acks", default="1", choices=["0", "1", "all"],
                   help="Produce acks (default 1; 0 is refused: no answer to time)")
    p.add_argument("--requests", type=int, default=2000, help="requests per step at most")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per step at most")
    p.add_argument("--warmup-requests", type=int, default=5)
    p.add_argument("--results", default="bench/results")
    p.add_argument("--json", action="store_true", help="print the summary as JSON at the end")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.acks == "0":
        p.error("--acks 0 has no response to time")
    if min(args.partitions) < 1 or args.duration <= 0 or args.requests < 1:
        p.error("--partitions, --duration and --requests must be positive")
    rounds = args.rounds or (3 if args.vs else 1)
    rows: list[dict] = []
    session_id = uuid.uuid4().hex[:12]
    with session_targets(args) as targets:
        for k in range(rounds):
            for t in targets:
                rows.extend(run_broker(t, args, session_id, k))
    summary = summarize(rows)
    if len({r["broker"] for r in rows}) == 2:
        a, b = rows[0]["broker"], next(r["broker"] for r in rows if r["broker"] != rows[0]["broker"])
        print(f"\nratio {a}/{b} of broker CPU us/partition (< 1: {a} cheaper)")
        for key, v in summary.items():
            b_, api, n = key.split("/")
            if b_ != a:
                continue
            peer = summary.get(f"{b}/{api}/{n}")
            if peer and v["broker_cpu_us_per_partition"] and peer["broker_cpu_us_per_partition"]:
                print(f"  {api:>7} {n:>5}: {v['broker_cpu_us_per_partition'] / peer['broker_cpu_us_per_partition']:.3f}")
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

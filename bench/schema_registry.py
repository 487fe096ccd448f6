"""Schema Registry: lookups by id per second (the cached, in-memory path) and
registrations per second (each one an append to ``_schemas`` that returns once applied).

    python -m bench.schema_registry                      # temp kbroker + kbroker schema-registry
    python -m bench.schema_registry --registrations 300 --lookups 5000 --threads 1,4 --json

Lookups: ``GET /schemas/ids/{id}`` over keep-alive HTTP connections (one per thread),
ids drawn round-robin from the registered ones; every answer is checked for status 200
and the schema it should carry. Also reported: confluent-kafka's ``SchemaRegistryClient``
``get_schema`` (its client-side cache: what a deserializer pays per record after the
first). Registrations: distinct Avro schemas (compatibility NONE, so the check does not
dominate) on one connection, one at a time; with ``--subjects-per-schema`` > 1 also the
BACKWARD check against the previous version. The registry's CPU per request comes from
``/proc/<pid>/stat``. Bounded by counts and ``--duration`` seconds per step.
"""
from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import uuid

from bench.trace import process_cpu_seconds


def _schema(i: int) -> str:
    return json.dumps({"type": "record", "name": "R", "namespace": "bench",
                       "fields": [{"name": "id", "type": "long"}, {"name": f"f{i}", "type": "string", "default": ""}]},
                      separators=(",", ":"))


class Http:
    def __init__(self, port: int):
        self.c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body=None):
        headers = {"Content-Type": "application/vnd.schemaregistry.v1+json"} if body is not None else {}
        self.c.request(method, path, None if body is None else json.dumps(body), headers)
        r = self.c.getresponse()
        data = r.read()
        return r.status, json.loads(data)


def bench_registrations(port: int, pid: int, count: int, duration: float, check: str) -> dict:
    h = Http(port)
    subject = f"bench-{uuid.uuid4().hex[:8]}"
    st, _ = h.call("PUT", f"/config/{subject}", {"compatibility": check})
    assert st == 200
    ids, lat = [], []
    cpu0, t0 = process_cpu_seconds(pid), time.perf_counter()
    for i in range(count):
        s = time.perf_counter()
        st, body = h.call("POST", f"/subjects/{subject}/versions", {"schema": _schema(i)})
        lat.append(time.perf_counter() - s)
        assert st == 200, body
        ids.append(body["id"])
        if time.perf_counter() - t0 > duration:
            break
    wall = time.perf_counter() - t0
    cpu = (process_cpu_seconds(pid) or 0) - (cpu0 or 0)
    lat.sort()
    return {"step": f"register ({check})", "requests": len(ids), "per_s": len(ids) / wall,
            "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
            "registry_cpu_us_per_req": cpu / len(ids) * 1e6, "_ids": ids, "_subject": subject}


def bench_lookups(port: int, pid: int, ids: list[int], count: int, threads: int, duration: float) -> dict:
    expected = {}
    h = Http(port)
    for i in ids:
        expected[i] = h.call("GET", f"/schemas/ids/{i}")[1]
    done = [0] * threads
    errors: list = []

    def worker(k):
        conn = Http(port)
        deadline = time.perf_counter() + duration
        n = 0
        while n < count // threads and time.perf_counter() < deadline:
            sid = ids[(k + n * threads) % len(ids)]
            st, body = conn.call("GET", f"/schemas/ids/{sid}")
            if st != 200 or body != expected[sid]:
                errors.append((st, body))
                return
            n += 1
        done[k] = n

    cpu0, t0 = process_cpu_seconds(pid), time.perf_counter()
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    cpu = (process_cpu_seconds(pid) or 0) - (cpu0 or 0)
    assert not errors, errors[:3]
    n = sum(done)
    return {"step": f"GET /schemas/ids/{{id}} x{threads} threads", "requests": n, "per_s": n / wall,
            "registry_cpu_us_per_req": cpu / n * 1e6}


def bench_client_cache(url: str, ids: list[int], count: int) -> dict:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    c = SchemaRegistryClient({"url": url})
    for i in ids:
        c.get_schema(i)  # fills the client's cache
    t0 = time.perf_counter()
    for n in range(count):
        c.get_schema(ids[n % len(ids)])
    wall = time.perf_counter() - t0
    return {"step": "SchemaRegistryClient.get_schema (client cache)", "requests": count, "per_s": count / wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.schema_registry", description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", help="an existing kbroker/Kafka (default: start a temporary kbroker)")
    ap.add_argument("--url", help="an existing registry (default: start kbroker schema-registry)")
    ap.add_argument("--registrations", type=int, default=200)
    ap.add_argument("--lookups", type=int, default=4000)
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per step at most")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from kbroker.schema_registry.testing import SchemaRegistryProcess
    from kbroker.testing import KBrokerProcess

    procs = []
    try:
        bootstrap = args.bootstrap
        if bootstrap is None:
            b = KBrokerProcess(overrides={"num.partitions": 1, "group.initial.rebalance.delay.ms": 0}).start()
            procs.append(b)
            bootstrap = b.bootstrap
        if args.url is None:
            r = SchemaRegistryProcess(bootstrap).start()
            procs.append(r)
            url, port, pid = r.url, r.port, r.pid
        else:
            url, port, pid = args.url, int(args.url.rsplit(":", 1)[1].strip("/")), -1
        results = []
        reg = bench_registrations(port, pid, args.registrations, args.duration, "NONE")
        ids = reg.pop("_ids")
        reg.pop("_subject")
        results.append(reg)
        back = bench_registrations(port, pid, max(args.registrations // 2, 1), args.duration, "BACKWARD")
        back.pop("_ids"), back.pop("_subject")
        results.append(back)
        for t in (int(x) for x in args.threads.split(",")):
            results.append(bench_lookups(port, pid, ids, args.lookups, t, args.duration))
        results.append(bench_client_cache(url, ids, args.lookups * 10))
    finally:
        for p in reversed(procs):
            p.terminate()
            p.__exit__(None, None, None)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            extra = "".join(f"  {k}={v:.3g}" for k, v in r.items() if k not in ("step", "requests", "per_s"))
            print(f"{r['step']:<50} {r['requests']:>7} req  {r['per_s']:>10.0f}/s{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

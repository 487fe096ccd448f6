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

``--produce-validation``: instead, produce throughput with broker-side schema id validation
(``kbroker.value.schema.validation``) on versus off, for Avro-framed values of
``--sizes`` bytes (default 100 and 1024): a broker started with
``kbroker.schema.registry.url``, one topic of each kind, librdkafka (acks=all, linger.ms 5)
sending ``--produce-count`` records per round, rounds alternating off/on ``--rounds``
times; reported: records/s, the broker's CPU µs per record (``/proc``), the records
kernel alone (``validate_batches`` over a 1,000-record batch, in this process) and the
optional payload check (``...validation.payload``: decode + fastavro, per record).
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


def _avro_value(size: int, schema_id: int) -> bytes:
    """A Confluent-framed Avro record ({"id": long, "payload": string}) of ``size`` bytes."""
    import io

    import fastavro

    parsed = fastavro.parse_schema(json.loads(_PRODUCE_SCHEMA))
    pad = size - 5 - 1 - 2  # header, the long 0, the string's length varint (2 bytes up to 8191)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, {"id": 0, "payload": "x" * pad})
    out = b"\x00" + schema_id.to_bytes(4, "big") + buf.getvalue()
    assert len(out) == size, (len(out), size)
    return out


_PRODUCE_SCHEMA = json.dumps({"type": "record", "name": "Payload", "namespace": "bench",
                              "fields": [{"name": "id", "type": "long"}, {"name": "payload", "type": "string"}]})


def _produce_round(bootstrap: str, topic: str, value: bytes, count: int, duration: float, broker_pid: int) -> dict:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "queue.buffering.max.messages": 1_000_000})
    failed = []
    cb = lambda err, msg: failed.append(err) if err is not None else None  # noqa: E731
    cpu0, t0 = process_cpu_seconds(broker_pid), time.perf_counter()
    sent = 0
    while sent < count and time.perf_counter() - t0 < duration:
        try:
            p.produce(topic, value, on_delivery=cb)
            sent += 1
        except BufferError:
            p.poll(0.01)
        if sent % 1000 == 0:
            p.poll(0)
    assert p.flush(60) == 0 and not failed, failed[:3]
    wall = time.perf_counter() - t0
    cpu = process_cpu_seconds(broker_pid) - cpu0
    return {"records": sent, "per_s": sent / wall, "broker_cpu_us_per_record": cpu / sent * 1e6}


def _kernel_us_per_record(value: bytes, n: int = 1000, reps: int = 200) -> tuple[float, float]:
    from kbroker.kernels import records as R

    batch = R.encode_batch([(1_700_000_000_000, None, value, [])] * n)
    out = []
    for on in (False, True):
        R.validate_batches(batch, timestamp_type=0, value_schema=on)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                R.validate_batches(batch, timestamp_type=0, now_ms=1_700_000_000_000, value_schema=on)
            best = min(best, (time.perf_counter() - t0) / reps / n * 1e6)
        out.append(best)
    return out[0], out[1]


def _check_validation_is_on(bootstrap: str, topic: str) -> None:
    """The "on" topic refuses a value without the header (else the comparison is void)."""
    from confluent_kafka import KafkaError, Producer

    p = Producer({"bootstrap.servers": bootstrap})
    got = []
    p.produce(topic, b"no header", on_delivery=lambda err, msg: got.append(err))
    p.flush(30)
    assert got and got[0] is not None and got[0].code() == KafkaError.INVALID_RECORD, got


def _payload_us_per_record(value: bytes, n: int = 1000, reps: int = 20) -> float:
    """The payload check (kbroker.value.schema.validation.payload) over a 1,000-record batch:
    records decoded, each value read with fastavro, per record."""
    from kbroker.kernels import records as R
    from kbroker.server import schema_validation as sv

    dec = sv._make_decoder({"schema": _PRODUCE_SCHEMA}, None)

    class Cached:
        def decoder(self, sid):
            return dec

    batch = R.encode_batch([(1_700_000_000_000, None, value, [])] * n)
    infos = R.validate_batches(batch)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            assert sv._payload_errors(Cached(), batch, infos, (False, True)) == []
        best = min(best, (time.perf_counter() - t0) / reps / n * 1e6)
    return best


def bench_produce_validation(args) -> list[dict]:
    from kbroker.schema_registry.testing import SchemaRegistryProcess
    from kbroker.testing import KBrokerProcess, free_port

    sr_port = free_port()
    b = KBrokerProcess(overrides={"num.partitions": 1, "group.initial.rebalance.delay.ms": 0,
                                  "kbroker.schema.registry.url": f"http://127.0.0.1:{sr_port}"}).start()
    r = None
    try:
        r = SchemaRegistryProcess(b.bootstrap, port=sr_port).start()
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        tag = uuid.uuid4().hex[:6]
        topics = {False: f"bench-off-{tag}", True: f"bench-on-{tag}"}
        futs = admin.create_topics([NewTopic(t, 1, 1, config={"kbroker.value.schema.validation": str(on).lower()})
                                    for on, t in topics.items()])
        for f in futs.values():
            f.result(30)
        h = Http(sr_port)
        ids = set()
        for t in topics.values():
            st, body = h.call("POST", f"/subjects/{t}-value/versions", {"schema": _PRODUCE_SCHEMA})
            assert st == 200, body
            ids.add(body["id"])
        (sid,) = ids
        _check_validation_is_on(b.bootstrap, topics[True])
        results = []
        for size in (int(x) for x in args.sizes.split(",")):
            value = _avro_value(size, sid)
            k_off, k_on = _kernel_us_per_record(value)
            rounds = {False: [], True: []}
            for _ in range(args.rounds):
                for on in (False, True):
                    rounds[on].append(_produce_round(b.bootstrap, topics[on], value, args.produce_count,
                                                     args.duration, b.pid))
            med = {on: sorted(x["per_s"] for x in rs)[len(rs) // 2] for on, rs in rounds.items()}
            cpu = {on: sorted(x["broker_cpu_us_per_record"] for x in rs)[len(rs) // 2] for on, rs in rounds.items()}
            results.append({"step": f"produce {size} B Avro, validation off", "requests": args.produce_count,
                            "per_s": med[False], "broker_cpu_us": cpu[False], "kernel_us": k_off})
            results.append({"step": f"produce {size} B Avro, validation on", "requests": args.produce_count,
                            "per_s": med[True], "broker_cpu_us": cpu[True], "kernel_us": k_on,
                            "ratio_on_off": med[True] / med[False], "payload_check_us": _payload_us_per_record(value)})
        return results
    finally:
        if r is not None:
            r.terminate()
            r.__exit__(None, None, None)
        b.terminate()
        b.__exit__(None, None, None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.schema_registry", description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", help="an existing kbroker/Kafka (default: start a temporary kbroker)")
    ap.add_argument("--url", help="an existing registry (default: start kbroker schema-registry)")
    ap.add_argument("--registrations", type=int, default=200)
    ap.add_argument("--lookups", type=int, default=4000)
    ap.add_argument("--threads", default="1,4")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per step at most")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--produce-validation", action="store_true",
                    help="produce throughput with broker-side schema validation on vs off (see the docstring)")
    ap.add_argument("--sizes", default="100,1024", help="--produce-validation: value sizes in bytes")
    ap.add_argument("--produce-count", type=int, default=100_000, help="--produce-validation: records per round")
    ap.add_argument("--rounds", type=int, default=3, help="--produce-validation: off/on rounds per size")
    args = ap.parse_args(argv)
    if args.produce_validation:
        return _print(bench_produce_validation(args), args.json)

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
    return _print(results, args.json)


def _print(results: list[dict], as_json: bool) -> int:
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            extra = "".join(f"  {k}={v:.3g}" for k, v in r.items() if k not in ("step", "requests", "per_s"))
            print(f"{r['step']:<50} {r['requests']:>7} req  {r['per_s']:>10.0f}/s{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

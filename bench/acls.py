"""Authorization cost on the produce path: two brokers side by side in one run, one without an
authorizer (Kafka's default) and one with the StandardAuthorizer holding ``--acls`` ACLs
(literal and prefixed of many lengths, for other principals and topics, plus the ALLOW that lets
the producer in), alternating rounds.

    flock /tmp/kbroker-bench.lock python -m bench.acls [--records 300000] [--rounds 3] [--acls 1000]

Produce: confluent-kafka, acks=1, ``--size``-byte records (default 100), linger 0 ms and a small
batch (``--batch-size``, default 2000 bytes: ~16 records per Produce, so per-request costs show),
one partition; records/s and the broker's CPU µs per Produce request (/proc). Also the
authorizer's own cost per decision (``StandardAuthorizer.authorize`` over the same ACLs, in
process) and per request-context check (a cached decision).
"""
from __future__ import annotations

import argparse
import os
import time
import timeit

import confluent_kafka as ck

from kbroker.testing import KBrokerProcess

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def noise_acls(n: int):
    """``n`` ACLs that do not match the bench topic's producer (other principals and names)."""
    from kbroker.security.authorizer import AclOperation as Op, AclPermissionType as Perm, PatternType as PT, \
        ResourceType as RT, StandardAcl
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(StandardAcl(RT.TOPIC, f"bench-other-{i}", PT.LITERAL, f"User:u{i}", "*", Op.READ, Perm.ALLOW))
        elif i % 3 == 1:
            out.append(StandardAcl(RT.TOPIC, "bench-t"[: 1 + i % 6] + f"x{i}", PT.PREFIXED, f"User:u{i}", "*",
                                   Op.WRITE, Perm.DENY))
        else:
            out.append(StandardAcl(RT.GROUP, f"g{i}", PT.LITERAL, f"User:u{i}", "*", Op.READ, Perm.ALLOW))
    return out


def produce(port: int, topic: str, n: int, size: int, batch_size: int) -> float:
    p = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "1", "linger.ms": 0,
                     "batch.size": batch_size, "queue.buffering.max.messages": 1000000})
    value = os.urandom(size)
    errors = []

    def report(err, _msg):
        if err is not None:
            errors.append(err)
    t0 = time.monotonic()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value, on_delivery=report)
                break
            except BufferError:
                p.poll(0.005)
    assert p.flush(120) == 0
    assert not errors, errors[:3]
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=300000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--acls", type=int, default=1000)
    o = ap.parse_args()
    from kbroker.client.admin import Admin
    from kbroker.security.authorizer import (
        ANONYMOUS, AclIndex, AclOperation as Op, AclPermissionType as Perm, PatternType as PT, ResourceType as RT,
        StandardAcl, StandardAuthorizer,
    )
    allow = [StandardAcl(RT.TOPIC, "bench-t", PT.PREFIXED, ANONYMOUS, "*", Op.ALL, Perm.ALLOW),
             StandardAcl(RT.CLUSTER, "kafka-cluster", PT.LITERAL, ANONYMOUS, "*", Op.ALL, Perm.ALLOW)]
    acls = noise_acls(o.acls) + allow
    off = KBrokerProcess(overrides={"num.partitions": 1}).start()
    # allow.everyone.if.no.acl.found lets ANONYMOUS create the first ACL (the cluster ALLOW);
    # the bench topics have ACLs, so the producer is decided by them (not by the default)
    on = KBrokerProcess(overrides={"num.partitions": 1, "authorizer.class.name": STANDARD,
                                   "allow.everyone.if.no.acl.found": "true"}).start()
    try:
        with Admin({"bootstrap.servers": f"127.0.0.1:{on.port}"}) as a:
            for chunk in ([allow[1]], acls[:-1]):
                for i in range(0, len(chunk), 500):
                    errs = [e for e in a.create_acls(chunk[i:i + 500]) if e is not None]
                    assert not errs, errs[0]
        brokers = {"authorizer off": off, "authorizer on": on}
        results: dict = {k: [] for k in brokers}
        est_requests = o.records / max(1, o.batch_size // (o.size + 20))
        for r in range(o.rounds):
            for name in (list(brokers) if r % 2 == 0 else list(brokers)[::-1]):
                b = brokers[name]
                cpu0 = _cpu_s(b.pid)
                dt = produce(b.port, f"bench-t-{r}", o.records, o.size, o.batch_size)
                cpu = _cpu_s(b.pid) - cpu0
                results[name].append((o.records / dt, cpu / o.records * 1e6))
        print(f"produce, acks=1, {o.size} B records, batch.size {o.batch_size}, {o.records} records x "
              f"{o.rounds} rounds; authorizer with {len(acls)} ACLs")
        print(f"{'':16} {'records/s (median)':>19} {'runs':>30} {'broker CPU µs/record':>21}")
        med = {}
        for name, runs in results.items():
            rates = sorted(x for x, _ in runs)
            cpus = sorted(c for _, c in runs)
            med[name] = (rates[len(rates) // 2], cpus[len(cpus) // 2])
            print(f"{name:16} {med[name][0]:19.0f} {' '.join(f'{x:.0f}' for x, _ in runs):>30} "
                  f"{med[name][1]:21.2f}")
        print(f"on/off throughput ratio: {med['authorizer on'][0] / med['authorizer off'][0]:.3f}; "
              f"CPU per record ratio: {med['authorizer on'][1] / med['authorizer off'][1]:.3f} "
              f"(~{est_requests:.0f} Produce requests per run)")
    finally:
        for b in (off, on):
            b.terminate()
            b.cleanup()
    index = AclIndex(acls)
    auth = StandardAuthorizer(lambda: index)
    n = 200000
    t = timeit.timeit(lambda: auth.authorize(ANONYMOUS, "127.0.0.1", Op.WRITE, RT.TOPIC, "bench-t-1"), number=n)
    print(f"StandardAuthorizer.authorize over {len(acls)} ACLs: {t / n * 1e6:.2f} µs per decision")
    from kbroker.server.authz import RequestAuthorizer
    ra = RequestAuthorizer(auth, ANONYMOUS, "127.0.0.1")
    t = timeit.timeit(lambda: ra.allowed(Op.WRITE, RT.TOPIC, "bench-t-1"), number=n)
    print(f"cached per-request check (RequestAuthorizer.allowed): {t / n * 1e6:.2f} µs")


if __name__ == "__main__":
    main()

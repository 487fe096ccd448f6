"""Security cost: produce and consume throughput over PLAINTEXT, SSL and SASL_SSL side by side
(one broker, alternating rounds), new TLS handshakes per second, SCRAM authentications per second.

    flock /tmp/kbroker-bench.lock python -m bench.security [--mb 200] [--rounds 3]

Consume: one partition prefilled with ``--mb`` MB of 1 KB records (over PLAINTEXT), read from
offset 0 by a confluent-kafka consumer (assign, no group) over each listener; the broker's CPU
seconds per run come from /proc. Produce: ``--produce-mb`` MB of 1 KB records, acks=1, linger 5 ms.
Over TLS a fetch cannot use sendfile: the log is read (pread) and encrypted by OpenSSL on the
network thread; Python 3.11 has no kernel-TLS switch (``ssl.OP_ENABLE_KTLS`` is 3.12+), so
there is no zero-copy TLS fetch here.
"""
from __future__ import annotations

import argparse
import os
import socket
import ssl
import tempfile
import time

import confluent_kafka as ck

from kbroker.testing import KBrokerProcess, free_port

RECORD = 1000


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _conf(broker, ports, pki, listener: str) -> dict:
    conf = {"bootstrap.servers": f"127.0.0.1:{ports[listener]}"}
    if listener == "SSL":
        conf.update({"security.protocol": "SSL", "ssl.ca.location": pki.ca_file})
    elif listener == "SASL_SSL":
        conf.update({"security.protocol": "SASL_SSL", "ssl.ca.location": pki.ca_file,
                     "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "bench", "sasl.password": "bench-secret"})
    return conf


def consume(conf: dict, topic: str, n: int) -> float:
    c = ck.Consumer({**conf, "group.id": "bench", "enable.auto.commit": False,
                     "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    c.assign([ck.TopicPartition(topic, 0, 0)])
    got = 0
    t0 = time.monotonic()
    while got < n:
        for m in c.consume(10000, 5):
            if m.error() is None:
                got += 1
        if time.monotonic() - t0 > 300:
            raise TimeoutError(f"consumed {got} of {n}")
    dt = time.monotonic() - t0
    c.close()
    return dt


def produce(conf: dict, topic: str, n: int) -> float:
    p = ck.Producer({**conf, "acks": "1", "linger.ms": 5, "batch.size": 262144,
                     "queue.buffering.max.messages": 1000000})
    value = os.urandom(RECORD)
    t0 = time.monotonic()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0
    return time.monotonic() - t0


def handshakes(port: int, ca: str, n: int) -> float:
    ctx = ssl.create_default_context(cafile=ca)
    t0 = time.monotonic()
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port)) as s:
            with ctx.wrap_socket(s, server_hostname="localhost"):
                pass
    return n / (time.monotonic() - t0)


def scram_auths(port: int, n: int) -> float:
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages import sasl_authenticate as sa, sasl_handshake as sh
    from tests.broker.raw_client import RawClient
    from tests.security.scram_client import ScramClient

    client = ScramClient("SCRAM-SHA-256", "bench", "bench-secret")
    client.first()
    t0 = time.monotonic()
    for _ in range(n):
        with RawClient(port) as c:
            c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
            r1 = c.call(ApiKey.SASL_AUTHENTICATE, 2, sa.SaslAuthenticateRequest(auth_bytes=client.first()))
            r2 = c.call(ApiKey.SASL_AUTHENTICATE, 2,
                        sa.SaslAuthenticateRequest(auth_bytes=client.final(r1.auth_bytes)))
            assert r2.error_code == 0
    return n / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=200.0, help="MB to prefill and consume per run")
    ap.add_argument("--produce-mb", type=float, default=100.0, help="MB to produce per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--handshakes", type=int, default=300)
    o = ap.parse_args()
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from kbroker.security import scram
    from tests.security.certs import TestPKI

    tmp = tempfile.mkdtemp(prefix="kbroker-secbench-")
    pki = TestPKI(tmp)
    ports = {"PLAINTEXT": None, "SSL": free_port(), "SASL_SSL": free_port(), "SASL_PLAINTEXT": free_port()}
    b = KBrokerProcess(overrides={"num.partitions": 1})
    ports["PLAINTEXT"] = b.port
    b.overrides.update({
        "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"],
        "sasl.enabled.mechanisms": "SCRAM-SHA-256"})
    b.start()
    try:
        from kbroker.client.admin import Admin
        with Admin({"bootstrap.servers": f"127.0.0.1:{b.port}"}) as a:
            a.alter_user_scram_credentials([("bench", "SCRAM-SHA-256", scram.MIN_ITERATIONS, "bench-secret")])
        n = int(o.mb * 1e6 / RECORD)
        produce(_conf(b, ports, pki, "PLAINTEXT"), "prefill", n)
        listeners = ("PLAINTEXT", "SSL", "SASL_SSL")
        results: dict = {(kind, l): [] for kind in ("consume", "produce") for l in listeners}
        for r in range(o.rounds):
            for l in (listeners if r % 2 == 0 else listeners[::-1]):
                cpu0 = _cpu_s(b.pid)
                dt = consume(_conf(b, ports, pki, l), "prefill", n)
                results[("consume", l)].append((o.mb / dt, (_cpu_s(b.pid) - cpu0) / o.mb * 1000))
                pn = int(o.produce_mb * 1e6 / RECORD)
                cpu0 = _cpu_s(b.pid)
                dt = produce(_conf(b, ports, pki, l), f"p-{l}-{r}", pn)
                results[("produce", l)].append((o.produce_mb / dt, (_cpu_s(b.pid) - cpu0) / o.produce_mb * 1000))
        print(f"{'':8} {'listener':10} {'MB/s (median)':>14} {'runs':>24} {'broker CPU ms/MB':>17}")
        for (kind, l), runs in results.items():
            rates = sorted(x for x, _ in runs)
            cpus = sorted(c for _, c in runs)
            print(f"{kind:8} {l:10} {rates[len(rates) // 2]:14.1f} {' '.join(f'{x:.1f}' for x, _ in runs):>24} "
                  f"{cpus[len(cpus) // 2]:17.2f}")
        print(f"TLS handshakes/s (sequential, one client): {handshakes(ports['SSL'], pki.ca_file, o.handshakes):.0f}")
        print(f"SCRAM-SHA-256 authentications/s (4096 iterations, sequential): "
              f"{scram_auths(ports['SASL_PLAINTEXT'], 200):.0f}")
    finally:
        b.terminate()
        b.cleanup()


if __name__ == "__main__":
    main()

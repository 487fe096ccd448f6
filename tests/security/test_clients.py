"""Unchanged clients with their usual settings over SSL, mutual TLS, SASL_SSL and SASL_PLAINTEXT."""
from __future__ import annotations

import time
import uuid

import confluent_kafka as ck
import pytest

from tests.broker.kafka_helpers import needs_kcat
from tests.security.conftest import SCRAM_USERS

N = 30


def _roundtrip(conf: dict, topic: str, n: int = N) -> None:
    """Produce n records and consume them back with a group; fail with the client's error."""
    errors = []
    p = ck.Producer({**conf, "error_cb": errors.append})
    for i in range(n):
        p.produce(topic, b"value-%d" % i, key=b"k%d" % i)
    assert p.flush(30) == 0, errors
    c = ck.Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                     "error_cb": errors.append})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    assert sorted(got) == sorted(b"value-%d" % i for i in range(n)), errors


def _topic(tag: str) -> str:
    return f"sec-{tag}-{uuid.uuid4().hex[:8]}"


def test_confluent_ssl_server_auth(secure_broker):
    _roundtrip({"bootstrap.servers": secure_broker.bootstrap("SSL"), "security.protocol": "SSL",
                "ssl.ca.location": secure_broker.pki.ca_file}, _topic("ssl"))


def test_confluent_mutual_tls(secure_broker, pki):
    client = pki.issue("app-client", ou="apps")
    _roundtrip({"bootstrap.servers": secure_broker.bootstrap("MTLS"), "security.protocol": "SSL",
                "ssl.ca.location": pki.ca_file, "ssl.certificate.location": client["cert"],
                "ssl.key.location": client["key"]}, _topic("mtls"))


def test_mutual_tls_refuses_a_client_without_certificate(secure_broker, pki):
    errors = []
    p = ck.Producer({"bootstrap.servers": secure_broker.bootstrap("MTLS"), "security.protocol": "SSL",
                     "ssl.ca.location": pki.ca_file, "error_cb": errors.append})
    p.produce(_topic("nocert"), b"x")
    deadline = time.monotonic() + 15
    while not errors and time.monotonic() < deadline:
        p.poll(0.2)
    assert errors, "a client without a certificate got through ssl.client.auth=required"
    assert p.flush(0) == 1          # nothing was delivered
    p.purge()                       # drop it here, not in a finalizer later
    p.flush(0)


def test_confluent_sasl_ssl_plain(secure_broker):
    _roundtrip({"bootstrap.servers": secure_broker.bootstrap("SASL_SSL"), "security.protocol": "SASL_SSL",
                "ssl.ca.location": secure_broker.pki.ca_file, "sasl.mechanism": "PLAIN",
                "sasl.username": "alice", "sasl.password": "alice-secret"}, _topic("plain"))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
def test_confluent_sasl_plaintext_scram(secure_broker, mechanism):
    _roundtrip({"bootstrap.servers": secure_broker.bootstrap("SASL_PLAINTEXT"),
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                "sasl.username": "carol", "sasl.password": SCRAM_USERS["carol"]}, _topic(mechanism.lower()))


def test_confluent_sasl_ssl_scram_512(secure_broker):
    _roundtrip({"bootstrap.servers": secure_broker.bootstrap("SASL_SSL"), "security.protocol": "SASL_SSL",
                "ssl.ca.location": secure_broker.pki.ca_file, "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "dave", "sasl.password": SCRAM_USERS["dave"]}, _topic("ssl-scram"))


def test_kafka_python_sasl_ssl_scram(secure_broker):
    from kafka import KafkaConsumer, KafkaProducer

    topic = _topic("kp-scram")
    conf = dict(bootstrap_servers=secure_broker.bootstrap("SASL_SSL"), security_protocol="SASL_SSL",
                ssl_cafile=secure_broker.pki.ca_file, sasl_mechanism="SCRAM-SHA-256",
                sasl_plain_username="dave", sasl_plain_password=SCRAM_USERS["dave"])
    p = KafkaProducer(**conf)
    for i in range(N):
        p.send(topic, b"value-%d" % i)
    p.flush(30)
    p.close()
    c = KafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest", consumer_timeout_ms=20000,
                      **conf)
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == N:
            break
    c.close()
    assert sorted(got) == sorted(b"value-%d" % i for i in range(N))


@pytest.mark.parametrize("listener,mechanism", [("SASL_PLAINTEXT", "SCRAM-SHA-512"), ("SASL_SSL", "PLAIN")])
def test_wrong_password_is_an_authentication_error_and_the_broker_stays_up(secure_broker, listener, mechanism):
    errors = []
    user = "carol" if mechanism.startswith("SCRAM") else "alice"
    conf = {"bootstrap.servers": secure_broker.bootstrap(listener), "security.protocol": listener,
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": "not-the-password",
            "error_cb": errors.append}
    if listener == "SASL_SSL":
        conf["ssl.ca.location"] = secure_broker.pki.ca_file
    p = ck.Producer(conf)
    deadline = time.monotonic() + 15
    while not any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors) and time.monotonic() < deadline:
        p.poll(0.2)
    p.purge()
    p.flush(0)
    auth = [e for e in errors if e.code() == ck.KafkaError._AUTHENTICATION]
    assert auth, errors
    text = auth[0].str()
    assert "invalid credentials" in text and "not-the-password" not in text
    # the broker is up: a correct client on the same listener works
    good = dict(conf, **{"sasl.password": SCRAM_USERS["carol"] if user == "carol" else "alice-secret"})
    good.pop("error_cb")
    _roundtrip(good, _topic("after-bad"), n=3)


def test_large_fetches_over_tls(secure_broker):
    """Fetch responses of several MB over TLS: FileRegions go through SSL_write in chunks, with
    partial writes when the socket buffer fills (a slow consumer: small receive buffer)."""
    topic = _topic("big")
    conf = {"bootstrap.servers": secure_broker.bootstrap("SSL"), "security.protocol": "SSL",
            "ssl.ca.location": secure_broker.pki.ca_file}
    p = ck.Producer({**conf, "linger.ms": 20, "batch.size": 1 << 20, "compression.type": "none"})
    payloads = [bytes([i % 251]) * 4000 + b"%d" % i for i in range(1500)]
    for v in payloads:
        p.produce(topic, v)
    assert p.flush(60) == 0
    c = ck.Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                     "fetch.max.bytes": 8 << 20, "max.partition.fetch.bytes": 8 << 20,
                     "socket.receive.buffer.bytes": 8192})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < len(payloads) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    assert got == payloads


@needs_kcat
def test_kcat_sasl_ssl_scram_and_mutual_tls(secure_broker, pki):
    """kcat (Debian's, librdkafka 2.0: it sends the client nonce twice in SCRAM's final message,
    which Kafka 3.9 accepts and so do we) produces over SASL_SSL SCRAM-SHA-512, consumes over mTLS."""
    import subprocess

    topic = _topic("kcat")
    ca = ["-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", "sasl.username=carol",
          "-X", f"sasl.password={SCRAM_USERS['carol']}", "-X", f"ssl.ca.location={pki.ca_file}"]
    subprocess.run(["kcat", "-b", secure_broker.bootstrap("SASL_SSL"), *ca, "-P", "-t", topic],
                   input=b"one\ntwo\n", capture_output=True, timeout=30, check=True)
    client = pki.issue("kcat-client")
    out = subprocess.run(["kcat", "-b", secure_broker.bootstrap("MTLS"), "-X", "security.protocol=SSL",
                          "-X", f"ssl.ca.location={pki.ca_file}", "-X", f"ssl.certificate.location={client['cert']}",
                          "-X", f"ssl.key.location={client['key']}", "-C", "-t", topic, "-o", "beginning", "-e"],
                         capture_output=True, timeout=30, check=True)
    assert out.stdout.split() == [b"one", b"two"]


def test_describe_configs_hides_secrets(secure_broker):
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    a = AdminClient({"bootstrap.servers": secure_broker.bootstrap("PLAINTEXT")})
    res = ConfigResource(ResourceType.BROKER, "1")
    entries = a.describe_configs([res])[res].result(timeout=15)
    assert entries["ssl.keystore.location"].value == secure_broker.pki.server["keystore"]
    assert entries["sasl.jaas.config"].is_sensitive and entries["sasl.jaas.config"].value is None
    assert entries["sasl.enabled.mechanisms"].value == "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"


def test_aiokafka_sasl_ssl_scram_512(secure_broker):
    import asyncio

    import aiokafka
    from aiokafka.helpers import create_ssl_context

    topic = _topic("aio-scram")
    conf = dict(bootstrap_servers=secure_broker.bootstrap("SASL_SSL"), security_protocol="SASL_SSL",
                ssl_context=create_ssl_context(cafile=secure_broker.pki.ca_file), sasl_mechanism="SCRAM-SHA-512",
                sasl_plain_username="carol", sasl_plain_password=SCRAM_USERS["carol"])

    async def run():
        prod = aiokafka.AIOKafkaProducer(**conf)
        await prod.start()
        try:
            for i in range(N):
                await prod.send(topic, b"value-%d" % i)
            await prod.flush()
        finally:
            await prod.stop()
        cons = aiokafka.AIOKafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest", **conf)
        await cons.start()
        got = []
        try:
            async with asyncio.timeout(30):
                async for m in cons:
                    got.append(m.value)
                    if len(got) == N:
                        break
        finally:
            await cons.stop()
        return got

    assert sorted(asyncio.run(run())) == sorted(b"value-%d" % i for i in range(N))

"""KIP-368 re-authentication: connections.max.reauth.ms on the REAUTH listener."""
from __future__ import annotations

import time
import uuid

import confluent_kafka as ck

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import metadata as md
from kbroker.protocol.messages import sasl_authenticate as sa
from kbroker.protocol.messages import sasl_handshake as sh
from tests.broker.raw_client import RawClient
from tests.security.conftest import REAUTH_MS, SCRAM_USERS
from tests.security.test_bad_input import closed_soon


def _auth(c: RawClient, user: str, password: str):
    assert c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
    return c.call(ApiKey.SASL_AUTHENTICATE, 1, sa.SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()))


def test_session_lifetime_and_expiry(secure_broker):
    with RawClient(secure_broker.ports["REAUTH"]) as c:
        r = _auth(c, "alice", "alice-secret")
        assert r.error_code == 0 and r.session_lifetime_ms == REAUTH_MS
        assert c.call(ApiKey.METADATA, 12, md.MetadataRequest(topics=None)).brokers
        time.sleep(REAUTH_MS / 1000 + 0.3)
        c.send(ApiKey.METADATA, 12, md.MetadataRequest(topics=None))
        assert closed_soon(c.sock)
    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:      # no lifetime there
        assert _auth(c, "alice", "alice-secret").session_lifetime_ms == 0


def test_reauthentication_extends_the_session_for_the_same_principal_only(secure_broker):
    with RawClient(secure_broker.ports["REAUTH"]) as c:
        assert _auth(c, "alice", "alice-secret").error_code == 0
        time.sleep(REAUTH_MS / 1000 * 0.6)
        r = _auth(c, "alice", "alice-secret")
        assert r.error_code == 0 and r.session_lifetime_ms == REAUTH_MS
        time.sleep(REAUTH_MS / 1000 * 0.6)                      # past the first session's end
        assert c.call(ApiKey.METADATA, 12, md.MetadataRequest(topics=None)).brokers
    with RawClient(secure_broker.ports["REAUTH"]) as c:
        assert _auth(c, "alice", "alice-secret").error_code == 0
        r = _auth(c, "admin", "admin-secret")                   # another principal: refused
        assert r.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert closed_soon(c.sock)


def test_librdkafka_reauthenticates_and_keeps_producing(secure_broker):
    """librdkafka (KIP-368 since 2.2) re-authenticates before the session ends: a producer that
    runs for several session lifetimes delivers everything without an error."""
    expired_before = secure_broker.proc.read_log().count("SASL session expired")
    errors, delivered = [], []
    p = ck.Producer({"bootstrap.servers": secure_broker.bootstrap("REAUTH"), "security.protocol": "SASL_PLAINTEXT",
                     "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "carol",
                     "sasl.password": SCRAM_USERS["carol"], "error_cb": errors.append, "linger.ms": 0})
    topic = f"sec-reauth-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + REAUTH_MS / 1000 * 2.2     # two re-authentications
    n = 0
    while time.monotonic() < deadline:
        p.produce(topic, b"x%d" % n, on_delivery=lambda e, m: delivered.append(e))
        n += 1
        p.poll(0.05)
    assert p.flush(30) == 0
    assert len(delivered) == n and not any(delivered), delivered[:3]
    assert not [e for e in errors if e.code() == ck.KafkaError._AUTHENTICATION], errors
    assert secure_broker.proc.read_log().count("SASL session expired") == expired_before


def test_a_reauthentication_begun_before_the_end_may_finish_after_it(secure_broker):
    with RawClient(secure_broker.ports["REAUTH"]) as c:
        assert _auth(c, "alice", "alice-secret").error_code == 0
        time.sleep(REAUTH_MS / 1000 * 0.8)
        assert c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        time.sleep(REAUTH_MS / 1000 * 0.4)                      # the old session has ended
        r = c.call(ApiKey.SASL_AUTHENTICATE, 1, sa.SaslAuthenticateRequest(auth_bytes=b"\0alice\0alice-secret"))
        assert r.error_code == 0 and r.session_lifetime_ms == REAUTH_MS
        assert c.call(ApiKey.METADATA, 12, md.MetadataRequest(topics=None)).brokers


def test_confluent_oauthbearer_unsecured_jwt(secure_broker):
    """librdkafka's unsecured JWT (development set-up): produce and consume, re-authenticating."""
    conf = {"bootstrap.servers": secure_broker.bootstrap("REAUTH"), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
            "sasl.oauthbearer.config": "principal=oauth-user"}
    from tests.security.test_clients import _roundtrip
    _roundtrip(conf, f"sec-oauth-{uuid.uuid4().hex[:8]}", n=10)


def _oauth(c: RawClient, token: str, authzid: str = ""):
    assert c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="OAUTHBEARER")).error_code == 0
    msg = f"n,{'a=' + authzid if authzid else ''},\x01auth=Bearer {token}\x01\x01".encode()
    return c.call(ApiKey.SASL_AUTHENTICATE, 1, sa.SaslAuthenticateRequest(auth_bytes=msg))


def _jwt(claims: dict, alg: str = "none") -> str:
    import base64
    import json

    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    return f"{enc({'alg': alg})}.{enc(claims)}."


def test_oauthbearer_bad_tokens_get_the_error_challenge_then_fail(secure_broker):
    now = int(time.time())
    with RawClient(secure_broker.ports["REAUTH"]) as c:
        r = _oauth(c, _jwt({"sub": "bob", "exp": now + 60, "iat": now}))
        assert r.error_code == 0 and r.auth_bytes == b"" and r.session_lifetime_ms <= REAUTH_MS
        assert c.call(ApiKey.METADATA, 12, md.MetadataRequest(topics=None)).brokers
    for bad, authzid in ((_jwt({"sub": "bob", "exp": now - 60}), ""), (_jwt({"exp": now + 60}), ""),
                         (_jwt({"sub": "bob", "exp": now + 60}, alg="HS256"), ""),
                         (_jwt({"sub": "bob", "exp": now + 60}), "eve"), ("not-a-jwt", "")):
        with RawClient(secure_broker.ports["REAUTH"]) as c:
            r = _oauth(c, bad, authzid)
            assert r.error_code == 0 and r.auth_bytes == b'{"status": "invalid_token"}', (bad, r)
            r = c.call(ApiKey.SASL_AUTHENTICATE, 1, sa.SaslAuthenticateRequest(auth_bytes=b"\x01"))
            assert r.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert closed_soon(c.sock)


def test_inter_node_client_renews_its_session_before_it_ends(secure_broker):
    """kbroker's own NetworkClient (what brokers' fetchers and senders use on a SASL
    inter-broker listener): a connection whose session nears its lifetime takes no new
    request and is replaced by a freshly authenticated one, so requests sent over several
    lifetimes all succeed and the broker never closes a connection for an expired session."""
    import threading

    from kbroker.server.inter_node import InterNodeSendThread, StaticNodes

    expired_before = secure_broker.proc.read_log().count("SASL session expired")
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" '
            'password="alice-secret";')
    sender = InterNodeSendThread("reauth-test", StaticNodes({0: ("127.0.0.1", secure_broker.ports["REAUTH"])}), {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas})
    failures, answered = [], []
    try:
        deadline = time.monotonic() + REAUTH_MS / 1000 * 3
        while time.monotonic() < deadline:
            done = threading.Event()

            def cb(resp, exc, done=done):
                (failures.append(exc) if exc is not None else answered.append(resp.brokers[0].node_id))
                done.set()
            sender.send(0, ApiKey.METADATA, md.MetadataRequest(topics=[]), cb, version=12)
            assert done.wait(10)
            time.sleep(0.05)
    finally:
        sender.close()
    assert failures == [] and len(answered) > 10
    assert secure_broker.proc.read_log().count("SASL session expired") == expired_before

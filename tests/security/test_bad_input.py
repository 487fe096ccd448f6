"""Bad input at TLS and SASL listeners: the offending connection is closed, nothing else is hurt."""
from __future__ import annotations

import os
import socket
import ssl
import struct
import time

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.frames import encode_request
from kbroker.protocol.messages import metadata as md
from kbroker.protocol.messages import sasl_authenticate as sa
from kbroker.protocol.messages import sasl_handshake as sh
from tests.broker.raw_client import RawClient
from tests.security.conftest import FAILED_AUTH_DELAY_MS, MAX_RECEIVE, SCRAM_USERS


def tls_client(secure_broker, listener: str = "SSL", **kw) -> RawClient:
    c = RawClient(secure_broker.ports[listener], **kw)
    ctx = ssl.create_default_context(cafile=secure_broker.pki.ca_file)
    c.sock = ctx.wrap_socket(c.sock, server_hostname="localhost")
    return c


def closed_soon(sock: socket.socket, timeout_s: float = 10.0) -> bool:
    """True if the peer closes ``sock`` (EOF or reset) within the timeout, reading anything it sends."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
        return True
    except socket.timeout:
        return False
    return False


def test_garbage_during_the_tls_handshake_closes_only_that_connection(secure_broker):
    port = secure_broker.ports["SSL"]
    # a client that starts a handshake and stalls in the middle of its ClientHello
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    garbage = socket.create_connection(("127.0.0.1", port))
    garbage.sendall(os.urandom(4096))
    try:
        assert closed_soon(garbage)
        # other clients are served while the stalled handshake is still open
        for _ in range(3):
            with tls_client(secure_broker) as c:
                assert c.api_versions(3).error_code == ErrorCode.NONE
        stalled.settimeout(0.2)
        try:
            assert stalled.recv(1) != b""      # still open: nothing waited for it
        except socket.timeout:
            pass
    finally:
        stalled.close()
        garbage.close()
    assert "TLS handshake" in secure_broker.proc.read_log()


def test_a_plaintext_request_to_a_tls_port_is_refused(secure_broker):
    for listener in ("SSL", "SASL_SSL", "MTLS"):
        with RawClient(secure_broker.ports[listener]) as c:
            c.sock.sendall(_api_versions_frame())
            assert closed_soon(c.sock), listener
    with tls_client(secure_broker) as c:
        assert c.api_versions(3).error_code == ErrorCode.NONE


def _api_versions_frame() -> bytes:
    from kbroker.protocol.messages.api_versions import ApiVersionsRequest
    return encode_request(ApiKey.API_VERSIONS, 0, 1, "plain", ApiVersionsRequest())


def _sasl_clients(secure_broker):
    yield "SASL_PLAINTEXT", RawClient(secure_broker.ports["SASL_PLAINTEXT"])
    yield "SASL_SSL", tls_client(secure_broker, "SASL_SSL")


def test_a_sasl_token_before_the_handshake_closes_the_connection(secure_broker):
    for name, c in _sasl_clients(secure_broker):
        with c:
            token = b"\0alice\0alice-secret"
            c.sock.sendall(struct.pack(">i", len(token)) + token)
            assert closed_soon(c.sock), name


def test_a_request_before_authentication_closes_the_connection(secure_broker):
    for name, c in _sasl_clients(secure_broker):
        with c:
            assert c.api_versions(3).error_code == ErrorCode.NONE      # allowed before authentication
            c.send(ApiKey.METADATA, 12, md.MetadataRequest(topics=None))
            assert closed_soon(c.sock), name
    # also after a handshake, before the authentication completed
    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:
        assert c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        c.send(ApiKey.METADATA, 12, md.MetadataRequest(topics=None))
        assert closed_soon(c.sock)


def test_an_oversized_sasl_token_closes_the_connection(secure_broker):
    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:
        assert c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        c.send(ApiKey.SASL_AUTHENTICATE, 1, sa.SaslAuthenticateRequest(auth_bytes=b"\0alice\0" + b"x" * MAX_RECEIVE))
        assert closed_soon(c.sock)
    # a frame that only announces a huge size is refused from its size prefix alone
    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:
        c.sock.sendall(struct.pack(">i", 100 * 1024 * 1024) + b"\0\x11\0\x01")
        assert closed_soon(c.sock)
    assert "larger than 8192" in secure_broker.proc.read_log()


def _plain_auth(c: RawClient, user: str, password: str, version: int = 2):
    assert c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
    return c.call(ApiKey.SASL_AUTHENTICATE, version,
                  sa.SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()))


def test_plain_v1_handshake_then_requests(secure_broker):
    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:
        r = _plain_auth(c, "alice", "alice-secret")
        assert r.error_code == ErrorCode.NONE, r
        m = c.call(ApiKey.METADATA, 12, md.MetadataRequest(topics=None))
        assert m.brokers[0].port == secure_broker.ports["SASL_PLAINTEXT"]   # the listener's own endpoint


def test_sasl_handshake_v0_bare_tokens(secure_broker):
    """Kafka's v0 framing: after SaslHandshake v0 the token goes bare (size prefix only)."""
    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:
        assert c.call(ApiKey.SASL_HANDSHAKE, 0, sh.SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        token = b"\0alice\0alice-secret"
        c.sock.sendall(struct.pack(">i", len(token)) + token)
        assert c.read_frame(10) == b""                          # PLAIN's empty final challenge
        assert c.call(ApiKey.METADATA, 12, md.MetadataRequest(topics=None)).brokers
    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:
        assert c.call(ApiKey.SASL_HANDSHAKE, 0, sh.SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        token = b"\0alice\0wrong"
        c.sock.sendall(struct.pack(">i", len(token)) + token)
        assert closed_soon(c.sock)


def test_scram_over_raw_requests_and_a_second_handshake_is_refused(secure_broker):
    from tests.security.scram_client import ScramClient

    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:
        assert c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="SCRAM-SHA-256")).error_code == 0
        client = ScramClient("SCRAM-SHA-256", "carol", SCRAM_USERS["carol"])
        r1 = c.call(ApiKey.SASL_AUTHENTICATE, 2, sa.SaslAuthenticateRequest(auth_bytes=client.first()))
        assert r1.error_code == 0
        r2 = c.call(ApiKey.SASL_AUTHENTICATE, 2, sa.SaslAuthenticateRequest(auth_bytes=client.final(r1.auth_bytes)))
        assert r2.error_code == 0
        client.verify(r2.auth_bytes)                  # the server proved it knows the server key
        r = c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="PLAIN"))
        assert r.error_code == ErrorCode.ILLEGAL_SASL_STATE


def test_an_unknown_mechanism_is_refused_with_the_enabled_ones(secure_broker):
    with RawClient(secure_broker.ports["SASL_PLAINTEXT"]) as c:
        r = c.call(ApiKey.SASL_HANDSHAKE, 1, sh.SaslHandshakeRequest(mechanism="GSSAPI"))
        assert r.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        assert sorted(r.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert closed_soon(c.sock)


def test_wrong_passwords_in_a_row_are_bounded_in_time(secure_broker):
    """200 failed authentications (PLAIN and SCRAM, known and unknown users): each answered
    SASL_AUTHENTICATION_FAILED with the same text, each connection closed after the delay, and the
    broker keeps serving."""
    from tests.security.scram_client import ScramClient

    port = secure_broker.ports["SASL_PLAINTEXT"]
    messages = set()
    t0 = time.monotonic()
    for i in range(200):
        with RawClient(port) as c:
            if i % 2:
                t_req = time.monotonic()        # the failing request goes out after this
                r = _plain_auth(c, "alice" if i % 4 == 1 else "nobody", f"wrong-{i}")
            else:
                user = "carol" if i % 4 == 0 else "nobody"
                assert c.call(ApiKey.SASL_HANDSHAKE, 1,
                              sh.SaslHandshakeRequest(mechanism="SCRAM-SHA-512")).error_code == 0
                client = ScramClient("SCRAM-SHA-512", user, f"wrong-{i}")
                r1 = c.call(ApiKey.SASL_AUTHENTICATE, 1, sa.SaslAuthenticateRequest(auth_bytes=client.first()))
                assert r1.error_code == 0          # an unknown user is not told apart here
                t_req = time.monotonic()
                r = c.call(ApiKey.SASL_AUTHENTICATE, 1,
                           sa.SaslAuthenticateRequest(auth_bytes=client.final(r1.auth_bytes)))
            assert r.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED, r
            messages.add(r.error_message.replace("SCRAM-SHA-512", "M").replace("PLAIN", "M"))
            assert closed_soon(c.sock)
            # closed no earlier than the delay after the failing request was sent
            assert time.monotonic() - t_req >= FAILED_AUTH_DELAY_MS / 1000, i
    elapsed = time.monotonic() - t0
    assert messages == {"Authentication failed during authentication due to invalid credentials with SASL "
                        "mechanism M"}
    assert elapsed < 60, elapsed
    with RawClient(port) as c:
        assert _plain_auth(c, "alice", "alice-secret").error_code == 0


def test_a_request_with_api_key_minus_one_is_not_a_bare_sasl_token(secure_broker):
    """A client's frame with api key -1 is an unknown API (closed), never mistaken for the
    processor's marker of a bare SASL token (it once reached the token handler and raised)."""
    bad = struct.pack(">hhi", -1, 3, 4242) + struct.pack(">h", 4) + b"fuzz" + b"\0" * 7
    for listener in ("PLAINTEXT", "SASL_PLAINTEXT"):
        with RawClient(secure_broker.ports[listener]) as c:
            c.sock.sendall(struct.pack(">i", len(bad)) + bad)
            assert closed_soon(c.sock), listener
    assert "AttributeError" not in secure_broker.proc.read_log()

"""The network layer over TLS, without a broker: principals from client certificates, FileRegion
responses written through OpenSSL byte-identical with partial writes, pipelined requests."""
from __future__ import annotations

import os
import socket
import ssl
import struct

from kbroker.network import SocketServer, SocketServerConfig
from kbroker.records.region import FileRegion
from kbroker.security.config import build_listener_security
from kbroker.server.config import KafkaConfig
from tests.test_network import frame, read_frame, running_server


def _security(pki, **extra):
    values = KafkaConfig({}).values
    settings = {"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"],
                "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file, **extra}
    return {"SSL": build_listener_security("SSL", "SSL", {**values, **settings}, {})}


def _tls(port: int, pki, cert: dict | None = None, rcvbuf: int | None = None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    if cert:
        ctx.load_cert_chain(cert["cert"], cert["key"])
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    return ctx.wrap_socket(s, server_hostname="localhost")


def _principal_echo(channel, request):
    p = request.connection.session.principal.encode()
    channel.send_response(request, [struct.pack(">ii", 4 + len(p), request.correlation_id), p])


def test_principal_from_the_client_certificate(pki):
    client = pki.issue("svc-orders", ou="ServiceUsers")
    rules = "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT"
    with running_server(_principal_echo, listeners="SSL://127.0.0.1:0",
                        listener_security=_security(pki, **{"ssl.client.auth": "requested",
                                                            "ssl.principal.mapping.rules": rules})) as server:
        port = server.bound_port("SSL")
        with _tls(port, pki, client) as s:
            s.sendall(frame(5))
            assert read_frame(s) == struct.pack(">i", 5) + b"User:svc-orders"
        other = pki.issue("plain-client")
        with _tls(port, pki, other) as s:
            s.sendall(frame(6))
            assert read_frame(s) == struct.pack(">i", 6) + b"User:CN=plain-client,O=kbroker,C=US"
        with _tls(port, pki) as s:                      # requested, not required: anonymous
            s.sendall(frame(7))
            assert read_frame(s) == struct.pack(">i", 7) + b"User:ANONYMOUS"


def test_file_regions_through_tls_byte_identical_with_partial_writes(pki, tmp_path):
    size = 6 << 20
    data = os.urandom(size)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    with open(path, "rb") as f:
        regions = [FileRegion(f, 123, size - 1000), FileRegion(f, 0, 10), FileRegion(f, size - 5, 5)]

        def handle(channel, request):
            n = 4 + 4 + (size - 1000) + 6 + 10 + 5 + 4
            channel.send_response(request, [struct.pack(">ii", n, request.correlation_id), b"head", regions[0],
                                            b"mid", memoryview(b"dle"), regions[1], regions[2], b"tail"])

        with running_server(handle, listeners="SSL://127.0.0.1:0", socket_send_buffer_bytes=65536,
                            listener_security=_security(pki)) as server:
            with _tls(server.bound_port("SSL"), pki, rcvbuf=65536) as s:
                for corr in (1, 2, 3):                     # pipelined: sent before any is read
                    s.sendall(frame(corr))
                expected_tail = data[123:size - 877] + b"middle" + data[:10] + data[size - 5:] + b"tail"
                for corr in (1, 2, 3):
                    resp = read_frame(s)
                    assert resp[:8] == struct.pack(">i", corr) + b"head"
                    assert resp[8:] == expected_tail


def test_a_tls_listener_is_not_served_without_a_handshake_and_plaintext_stays_plaintext(pki):
    from tests.test_network import echo
    with running_server(echo, listeners="PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
                        listener_security=_security(pki)) as server:
        with socket.create_connection(("127.0.0.1", server.bound_port("SSL")), timeout=10) as raw:
            raw.sendall(frame(9, b"x" * 100))
            got = b""
            try:
                while True:
                    d = raw.recv(65536)
                    if not d:
                        break
                    got += d
            except ConnectionResetError:
                pass
            assert struct.pack(">i", 9) not in got              # never answered in the clear
        with socket.create_connection(("127.0.0.1", server.bound_port("PLAINTEXT")), timeout=10) as s:
            s.sendall(frame(10, b"abc"))
            assert read_frame(s) == struct.pack(">i", 10) + b"abc"


def test_socket_server_config_default_is_plaintext():
    assert SocketServerConfig().listener_security == {}
    assert SocketServer(SocketServerConfig(listeners="PLAINTEXT://127.0.0.1:0")).listeners[0].name == "PLAINTEXT"

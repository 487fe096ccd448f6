"""A tiny blocking Kafka client over a raw socket, for conformance and fuzz tests.

It speaks only through ``kbroker.protocol`` (encode_request / the generated response
classes) and checks, for every response, what a real client relies on: the
correlation id is echoed, the header has the version the API's response requires,
and the body decodes at the request's version *exactly* (no bytes left over, which
would mean the broker encoded at another version than the one asked for).
"""
from __future__ import annotations

import socket
import struct
import time

from kbroker.protocol import API_INFO, ApiKey, encode_request, parse_response_header
from kbroker.protocol.messages.api_versions import ApiVersionsRequest

DEFAULT_TIMEOUT_S = 10.0


class ConnectionClosed(Exception):
    """The broker closed the connection (or reset it) before a full frame arrived."""


class RawClient:
    """One connection; requests are written in order and answered in order (Kafka's
    per-connection ordering). Not thread-safe."""

    def __init__(self, port: int, client_id: str | None = "kbroker-matrix",
                 timeout_s: float = DEFAULT_TIMEOUT_S, host: str = "127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout_s = timeout_s
        self.client_id = client_id
        self._next_corr = 1
        self._buf = b""

    # -- plumbing -------------------------------------------------------------------------------

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, api_key: int, version: int, body, correlation_id: int | None = None) -> int:
        """Write one request; returns its correlation id."""
        corr = self._next_corr if correlation_id is None else correlation_id
        self._next_corr = corr + 1
        self.sock.sendall(encode_request(api_key, version, corr, self.client_id, body))
        return corr

    def read_frame(self, timeout_s: float | None = None) -> bytes:
        """The next response frame without its size prefix; ConnectionClosed on EOF/reset."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            if len(self._buf) >= 4:
                (n,) = struct.unpack_from(">i", self._buf)
                if len(self._buf) >= 4 + n:
                    frame, self._buf = self._buf[4:4 + n], self._buf[4 + n:]
                    return frame
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("no complete response frame in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, BrokenPipeError) as e:
                raise ConnectionClosed(str(e)) from None
            if not chunk:
                raise ConnectionClosed("EOF")
            self._buf += chunk

    def recv(self, api_key: int, version: int, corr: int, timeout_s: float | None = None):
        """Read and strictly decode the response to request ``corr``."""
        frame = self.read_frame(timeout_s)
        return decode_exact(frame, api_key, version, corr)

    def call(self, api_key: int, version: int, body, timeout_s: float | None = None):
        return self.recv(api_key, version, self.send(api_key, version, body), timeout_s)

    def is_closed_by_peer(self, timeout_s: float = 5.0) -> bool:
        """True when the broker closes the connection within ``timeout_s`` (no frame)."""
        try:
            self.read_frame(timeout_s)
        except ConnectionClosed:
            return True
        except socket.timeout:
            return False
        return False

    # -- conveniences ---------------------------------------------------------------------------

    def api_versions(self, version: int = 3):
        req = ApiVersionsRequest(client_software_name="kbroker-matrix", client_software_version="1.0") \
            if version >= 3 else ApiVersionsRequest()
        return self.call(ApiKey.API_VERSIONS, version, req)


def decode_exact(frame: bytes, api_key: int, version: int, corr: int):
    mv = memoryview(frame)
    header, pos = parse_response_header(mv, api_key, version)
    assert header.correlation_id == corr, f"correlation id {header.correlation_id} != {corr}"
    body, end = API_INFO[api_key].response_class.decode_from(mv, pos, version)
    assert end == len(frame), (f"{API_INFO[api_key].name} v{version} response has {len(frame) - end} "
                               f"bytes after its body: encoded at another version?")
    return body


def advertised(port: int, version: int = 3) -> dict[int, tuple[int, int]]:
    """{api_key: (min_version, max_version)} from a live ApiVersions response."""
    with RawClient(port) as c:
        resp = c.api_versions(version)
    assert resp.error_code == 0, resp
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}

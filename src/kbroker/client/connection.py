"""One TCP connection to one broker: framing, correlation ids, the in-flight queue.

Wire: every request is a size-prefixed frame (kbroker.protocol.frames); the broker answers
requests on one connection strictly in order, so responses are matched to the head of the
in-flight deque and a correlation-id mismatch is a protocol error that closes the
connection (Kafka's NetworkClient.correlate).

States: DISCONNECTED -> CONNECTING (non-blocking connect) -> CHECKING_API_VERSIONS (our
ApiVersions request is the first in flight) -> [AUTHENTICATING: SASL, see NetworkClient] -> READY.
TLS (security.protocol SSL / SASL_SSL): the handshake runs when the TCP connect completes,
blocking this client's network thread for at most socket.connection.setup.timeout.ms (a
simplification: the client is for tools and tests, not thousands of brokers). ``versions`` maps api_key to the
version we use with this broker: min(our max, broker max), the negotiation Kafka's
ApiVersions.latestUsableVersion does.

Not thread-safe: owned by NetworkClient, which holds its lock around every call.
"""
from __future__ import annotations

import errno
import socket
import ssl
import struct
import time
from collections import deque

from kbroker.client.errors import KafkaConnectionError
from kbroker.protocol import API_INFO, ApiKey, ProtocolDecodeError, decode_response
from kbroker.protocol.frames import encode_request_parts

DISCONNECTED, CONNECTING, CHECKING_API_VERSIONS, READY, AUTHENTICATING = range(5)
_STATE_NAMES = ("DISCONNECTED", "CONNECTING", "CHECKING_API_VERSIONS", "READY", "AUTHENTICATING")
_SSL_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError)
_SSL_CHUNK = 1 << 18

_unpack_i32 = struct.Struct(">i").unpack_from

#: buffers handed to one sendmsg (well below IOV_MAX = 1024 on Linux)
_MAX_IOV = 256

#: Highest version this client speaks per API where it is below the spec's max: Fetch 13+
#: and DeleteTopics 6+ address topics by id, OffsetFetch 8+ and FindCoordinator 4+ batch by
#: group; we use the name-based forms. Produce 12 and TxnOffsetCommit 5 mean transaction
#: version 2 (the leader adds the partition to the transaction), which the producer's
#: transaction manager does not speak: it adds partitions itself (AddPartitionsToTxn v3).
CLIENT_MAX_VERSIONS = {
    int(ApiKey.PRODUCE): 11,
    int(ApiKey.TXN_OFFSET_COMMIT): 4,
    int(ApiKey.FETCH): 12,
    int(ApiKey.DELETE_TOPICS): 5,
    int(ApiKey.OFFSET_FETCH): 7,
    int(ApiKey.FIND_COORDINATOR): 3,
}


def _join(parts) -> bytes:
    """Up to _SSL_CHUNK bytes of the queued parts, in one buffer."""
    buf = bytearray()
    for p in parts:
        buf += p
        if len(buf) >= _SSL_CHUNK:
            break
    return buf


def our_max_version(api_key: int) -> int:
    info = API_INFO[api_key]
    return min(info.max_stable_version, CLIENT_MAX_VERSIONS.get(api_key, 1 << 15))


class InFlightRequest:
    """A request written (or queued to write) on a connection, awaiting its response."""

    __slots__ = ("correlation_id", "api_key", "api_version", "callback", "deadline",
                 "expect_response", "send_end")

    def __init__(self, correlation_id, api_key, api_version, callback, deadline, expect_response):
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.callback = callback          # callback(response_body, exception)
        self.deadline = deadline          # monotonic seconds
        self.expect_response = expect_response
        self.send_end = 0                 # total bytes queued when this frame was queued


class BrokerConnection:
    """Socket, buffers and in-flight requests for ``node_id`` at ``host:port``."""

    def __init__(self, node_id: int, host: str, port: int, client_id: str, config):
        self.node_id = node_id
        self.host = host
        self.port = port
        self.client_id = client_id
        self.state = DISCONNECTED
        self.sock: socket.socket | None = None
        self.in_flight: deque[InFlightRequest] = deque()
        self.versions: dict[int, int] = {}
        #: the broker's own highest version per api key, and (ApiVersions v3+) its
        #: finalized feature levels
        self.broker_max_versions: dict[int, int] = {}
        self.finalized_features: dict[str, int] = {}
        #: frames not yet written, as the parts encode_request_parts made (the records of
        #: a ProduceRequest stay their own part: no copy until the kernel's)
        self._out: deque = deque()
        self._out_total = 0      # bytes ever queued on this socket
        self._sent_total = 0     # bytes ever written on this socket
        self._no_response: deque[InFlightRequest] = deque()  # acks=0 style, complete on send
        self._in = bytearray()
        self._next_cid = 0
        self.connect_deadline = 0.0
        self.last_attempt = 0.0
        self.failures = 0
        self._send_buf = config["send.buffer.bytes"]
        self._recv_buf = config["receive.buffer.bytes"]
        self._setup_timeout_s = config["socket.connection.setup.timeout.ms"] / 1000.0
        self.ssl_context = None           # set by NetworkClient for SSL / SASL_SSL
        self.sasl = None                  # the SASL client of an AUTHENTICATING connection
        #: monotonic time after which a new SASL session is due (KIP-368 session lifetime), or None
        self.session_expiry: float | None = None

    def __repr__(self):
        return f"<BrokerConnection node={self.node_id} {self.host}:{self.port} {_STATE_NAMES[self.state]}>"

    # -- connect ------------------------------------------------------------------------
    def connect(self, now: float) -> None:
        """Start a non-blocking connect (state CONNECTING)."""
        self.last_attempt = now
        infos = socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._send_buf > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buf)
        if self._recv_buf > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buf)
        rc = sock.connect_ex(addr)
        if rc not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
            sock.close()
            raise KafkaConnectionError(f"connect to {self.host}:{self.port} failed: {errno.errorcode.get(rc, rc)}")
        self.sock = sock
        self.state = CONNECTING
        self.connect_deadline = now + self._setup_timeout_s

    def finish_connect(self) -> None:
        """Called when the socket becomes writable in CONNECTING."""
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise KafkaConnectionError(f"connect to {self.host}:{self.port} failed: {errno.errorcode.get(err, err)}")
        if self.ssl_context is not None:
            self.sock.settimeout(max(0.001, self.connect_deadline - time.monotonic()))
            try:
                self.sock = self.ssl_context.wrap_socket(self.sock, server_hostname=self.host)
            except (ssl.SSLError, OSError, ValueError) as e:
                raise KafkaConnectionError(f"TLS handshake with {self.host}:{self.port} failed: {e}") from e
            self.sock.setblocking(False)
        self.state = CHECKING_API_VERSIONS

    def set_versions(self, broker_ranges: dict[int, tuple[int, int]], finalized_features=None) -> None:
        self.broker_max_versions = {k: hi for k, (_lo, hi) in broker_ranges.items()}
        self.finalized_features = dict(finalized_features or {})
        versions = {}
        for key, (bmin, bmax) in broker_ranges.items():
            if key not in API_INFO:
                continue
            info = API_INFO[key]
            v = min(our_max_version(key), bmax)
            if v >= max(info.min_version, bmin):
                versions[key] = v
        self.versions = versions
        self.state = READY
        self.failures = 0

    # -- requests -----------------------------------------------------------------------
    def queue_request(self, api_key: int, api_version: int, request, callback, deadline: float,
                      expect_response: bool = True) -> InFlightRequest:
        cid = self._next_cid
        self._next_cid = (cid + 1) & 0x7FFFFFFF
        parts = encode_request_parts(api_key, api_version, cid, self.client_id, request)
        req = InFlightRequest(cid, api_key, api_version, callback, deadline, expect_response)
        out = self._out
        n = 0
        for part in parts:
            out.append(part)
            n += len(part)
        self._out_total += n
        req.send_end = self._out_total
        if expect_response:
            self.in_flight.append(req)
        else:
            self._no_response.append(req)
        return req

    def has_pending_send(self) -> bool:
        return bool(self._out)

    def write(self) -> list[InFlightRequest]:
        """Write what the socket takes, every queued frame in one sendmsg (writev);
        returns no-response requests now fully sent."""
        out = self._out
        if out:
            try:
                if self.ssl_context is not None:
                    # SSL_write takes one buffer; a retry after WANT_WRITE starts with the same
                    # bytes (what is left of the queue), as OpenSSL requires
                    n = self.sock.send(out[0] if len(out) == 1 else _join(out))
                elif len(out) == 1:
                    n = self.sock.send(out[0])
                else:
                    n = self.sock.sendmsg(out if len(out) <= _MAX_IOV else list(out)[:_MAX_IOV])
            except _SSL_WANT:
                n = 0
            except OSError as e:
                raise KafkaConnectionError(f"write to node {self.node_id} failed: {e}") from e
            if n:
                self._sent_total += n
                while n:
                    head = out[0]
                    size = len(head)
                    if n >= size:
                        out.popleft()
                        n -= size
                    else:
                        out[0] = memoryview(head)[n:]
                        n = 0
        done = []
        nr = self._no_response
        while nr and nr[0].send_end <= self._sent_total:
            done.append(nr.popleft())
        return done

    def read(self) -> list[tuple[InFlightRequest, object]]:
        """Read what is available; returns (request, response_body) for complete frames."""
        try:
            need = 1 << 18
            if len(self._in) >= 4:
                need = max(need, _unpack_i32(self._in, 0)[0] + 4 - len(self._in))
            chunk = self.sock.recv(min(need, 1 << 24))
            if self.ssl_context is not None:
                # OpenSSL may hold decrypted bytes the selector will not report
                while chunk and self.sock.pending():
                    chunk += self.sock.recv(self.sock.pending())
        except _SSL_WANT:
            return []
        except OSError as e:
            raise KafkaConnectionError(f"read from node {self.node_id} failed: {e}") from e
        if not chunk:
            raise KafkaConnectionError(f"connection to node {self.node_id} ({self.host}:{self.port}) closed by the broker")
        buf = self._in
        if buf:
            buf += chunk
        else:
            buf = bytearray(chunk) if len(chunk) < 4 else chunk
        out = []
        pos = 0
        n = len(buf)
        mv = memoryview(buf)
        try:
            while n - pos >= 4:
                size = _unpack_i32(mv, pos)[0]
                if size < 4:
                    raise KafkaConnectionError(f"bad frame size {size} from node {self.node_id}")
                if n - pos - 4 < size:
                    break
                frame = mv[pos + 4:pos + 4 + size]
                pos += 4 + size
                if not self.in_flight:
                    raise KafkaConnectionError(f"unexpected response from node {self.node_id}")
                req = self.in_flight.popleft()
                cid = _unpack_i32(frame, 0)[0]
                if cid != req.correlation_id:
                    raise KafkaConnectionError(
                        f"correlation id {cid} does not match the expected {req.correlation_id} "
                        f"from node {self.node_id}")
                try:
                    _, body = decode_response(frame, req.api_key, req.api_version)
                except ProtocolDecodeError as e:
                    raise KafkaConnectionError(f"undecodable {ApiKey(req.api_key).name} response "
                                               f"from node {self.node_id}: {e}") from e
                out.append((req, body))
            if pos == 0:
                rest = buf if type(buf) is bytearray else bytearray(buf)
            else:
                rest = bytearray(mv[pos:]) if pos < n else bytearray()
        finally:
            mv.release()
        self._in = rest
        return out

    def close(self) -> list[InFlightRequest]:
        """Close the socket; returns every request that will never get a response."""
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None
        self.state = DISCONNECTED
        failed = list(self.in_flight) + list(self._no_response)
        self.in_flight.clear()
        self._no_response.clear()
        self._out = deque()
        self._in = bytearray()
        self.versions = {}
        return failed

    def is_ready(self) -> bool:
        return self.state == READY

    def now(self) -> float:
        return time.monotonic()

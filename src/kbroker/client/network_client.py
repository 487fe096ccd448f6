"""NetworkClient: connections to every broker, multiplexed with a selector.

Modeled on Kafka's NetworkClient: ``send`` queues a request on a ready connection and
returns at once; ``poll(timeout)`` does all the I/O (connect, write, read, timeouts,
metadata refresh) and runs each request's callback(response, exception) exactly once, in
the polling thread. A connection becomes ready after ApiVersions negotiation; at most
max.in.flight.requests.per.connection requests are outstanding on it. A request that is
not answered within request.timeout.ms closes its connection (every request in flight on
it fails with a retriable error), as Kafka does. Reconnects back off exponentially from
reconnect.backoff.ms to reconnect.backoff.max.ms.

Thread-safety: every public method takes ``self.lock`` (an RLock). The producer's sender
thread is the only caller in a producer; in the consumer the application thread polls
and the heartbeat thread sends under the same lock. ``wakeup()`` may be called from any
thread without the lock to cut a blocking poll short.
"""
from __future__ import annotations

import random
import selectors
import socket
import threading
import time
from typing import Callable

from kbroker.client import errors as E
from kbroker.client.connection import (
    AUTHENTICATING, CHECKING_API_VERSIONS, CONNECTING, DISCONNECTED, READY, BrokerConnection,
)
from kbroker.client.metadata import Metadata
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.api_versions import ApiVersionsRequest

_API_VERSIONS = int(ApiKey.API_VERSIONS)
_METADATA = int(ApiKey.METADATA)


class NetworkClient:
    def __init__(self, config, metadata: Metadata, *, client_software_name="kbroker-python"):
        self.config = config
        self.metadata = metadata
        self.client_id = config["client.id"]
        self.max_in_flight = config.get("max.in.flight.requests.per.connection", 5)
        self.request_timeout_s = config["request.timeout.ms"] / 1000.0
        self.reconnect_backoff_s = config["reconnect.backoff.ms"] / 1000.0
        self.reconnect_backoff_max_s = config["reconnect.backoff.max.ms"] / 1000.0
        self.software_name = client_software_name
        self.lock = threading.RLock()
        self.selector = selectors.DefaultSelector()
        self.conns: dict[int, BrokerConnection] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._metadata_in_flight = False
        self._completed: list = []   # (callback, response, exc) to run at the end of poll
        self._selecting = False      # True while poll() blocks in select (wakeup matters)
        self._unwritten: set[BrokerConnection] = set()   # frames queued with defer_write
        self._wakeup_requested = False
        self.closed = False
        protocol = config.get("security.protocol", "PLAINTEXT")   # plain dicts too (inter_node)
        self._ssl_context = None
        if protocol in ("SSL", "SASL_SSL"):
            from kbroker.security.sasl_client import client_ssl_context
            try:
                self._ssl_context = client_ssl_context(config)
            except (OSError, ValueError) as e:
                raise E.KafkaConfigError(f"TLS settings: {e}") from None
        self._sasl_mechanism = config.get("sasl.mechanism", "GSSAPI") if protocol.startswith("SASL_") else None

    # -- connections --------------------------------------------------------------------
    def _conn(self, node_id: int) -> BrokerConnection | None:
        c = self.conns.get(node_id)
        if c is None:
            b = self.metadata.node(node_id)
            if b is None:
                return None
            c = BrokerConnection(node_id, b.host, b.port, self.client_id, self.config)
            self.conns[node_id] = c
        return c

    def _backoff_s(self, c: BrokerConnection) -> float:
        if c.failures == 0:
            return 0.0
        b = min(self.reconnect_backoff_s * (2 ** (c.failures - 1)), self.reconnect_backoff_max_s)
        return b * random.uniform(0.8, 1.2)

    def is_ready(self, node_id: int) -> bool:
        c = self.conns.get(node_id)
        if c is None or c.state != READY:
            return False
        if c.session_expiry is not None and time.monotonic() >= c.session_expiry:
            self._renew_session(c)
            return False
        return len(c.in_flight) < self.max_in_flight

    def _renew_session(self, c: BrokerConnection) -> None:
        """A SASL session near the end of its lifetime (the broker's connections.max.reauth.ms,
        KIP-368) takes no new requests; once its last answer is in, the connection is closed
        and the next maybe_connect authenticates a new one at once (no backoff): the broker
        would close a connection used after its session ended, failing the request."""
        with self.lock:
            if c.state == READY and not c.in_flight and not c.has_pending_send():
                self._close(c, E.KafkaConnectionError(f"node {c.node_id}: SASL session renewed"))

    def available_requests(self, node_id: int) -> int:
        """How many more requests node_id takes now (0 unless READY):
        max.in.flight.requests.per.connection minus those in flight."""
        c = self.conns.get(node_id)
        if c is None or c.state != READY:
            return 0
        return max(0, self.max_in_flight - len(c.in_flight))

    def in_flight_count(self, node_id: int | None = None) -> int:
        if node_id is None:
            return sum(len(c.in_flight) for c in self.conns.values())
        c = self.conns.get(node_id)
        return len(c.in_flight) if c else 0

    def connection_failed(self, node_id: int) -> bool:
        c = self.conns.get(node_id)
        return c is not None and c.state == DISCONNECTED and c.failures > 0

    def maybe_connect(self, node_id: int) -> bool:
        """Start connecting to node_id if not connected and not backing off; True if ready."""
        with self.lock:
            c = self._conn(node_id)
            if c is None:
                return False
            if c.state == READY:
                return True
            if c.state != DISCONNECTED:
                return False
            # the broker may have moved (metadata refresh): follow its address
            b = self.metadata.node(node_id)
            if b is not None and (b.host, b.port) != (c.host, c.port):
                c.host, c.port = b.host, b.port
            now = time.monotonic()
            if now < c.last_attempt + self._backoff_s(c):
                return False
            c.ssl_context = self._ssl_context
            try:
                c.connect(now)
            except (OSError, E.KafkaError):
                c.failures += 1
                c.last_attempt = now
                self.metadata.request_update()
                return False
            self.selector.register(c.sock, selectors.EVENT_WRITE, c)
            return False

    def least_loaded_node(self, exclude=()) -> int | None:
        """A node to send metadata-style requests to: ready with fewest in flight, else any
        node not backing off (Kafka's leastLoadedNode). ``exclude``: node ids not to pick
        (an admin call's nodes that refused it), unless no other node is known."""
        best, best_n = None, 1 << 30
        nodes = self.metadata.nodes()
        if exclude and any(b.node_id not in exclude for b in nodes):
            nodes = [b for b in nodes if b.node_id not in exclude]
        now = time.monotonic()
        random.shuffle(nodes)
        for b in nodes:
            c = self.conns.get(b.node_id)
            if c is not None and c.state == READY:
                n = len(c.in_flight)
                if n < best_n and n < self.max_in_flight:
                    best, best_n = b.node_id, n
            elif best is None or best_n >= 1 << 29:
                if c is None or c.state != DISCONNECTED or now >= c.last_attempt + self._backoff_s(c):
                    if best is None:
                        best, best_n = b.node_id, 1 << 29
        if best is None and self.metadata.cluster.brokers:
            # every known broker is backing off: fall back to the bootstrap list
            for b in self.metadata.bootstrap:
                return b.node_id
        return best

    def api_version(self, node_id: int, api_key: int) -> int | None:
        c = self.conns.get(node_id)
        return c.versions.get(int(api_key)) if c is not None else None

    def broker_max_version(self, node_id: int, api_key: int) -> int | None:
        """The highest version of ``api_key`` the node advertised (not capped by ours)."""
        c = self.conns.get(node_id)
        return c.broker_max_versions.get(int(api_key)) if c is not None else None

    def finalized_feature(self, node_id: int, name: str) -> int:
        """The node's finalized level of feature ``name`` (0 if not finalized or unknown)."""
        c = self.conns.get(node_id)
        return c.finalized_features.get(name, 0) if c is not None else 0

    # -- sending ------------------------------------------------------------------------
    def send(self, node_id: int, api_key: int, request, callback: Callable,
             *, expect_response: bool = True, version: int | None = None,
             timeout_s: float | None = None, defer_write: bool = False) -> None:
        """Queue ``request`` on node_id, which must be ready (see is_ready / maybe_connect).

        ``version`` defaults to the negotiated one; ``callback(response, exc)`` runs once in
        the polling thread. With ``defer_write`` the frame is written by the next ``poll``
        (together with every other frame queued before it, in one sendmsg)."""
        with self.lock:
            c = self.conns.get(node_id)
            if c is None or c.state != READY:
                raise E.KafkaConnectionError(f"node {node_id} is not ready")
            v = c.versions.get(int(api_key)) if version is None else version
            if v is None:
                raise E.KafkaError(f"node {node_id} does not support {ApiKey(api_key).name}",
                                   ErrorCode.UNSUPPORTED_VERSION)
            deadline = time.monotonic() + (self.request_timeout_s if timeout_s is None else timeout_s)
            c.queue_request(int(api_key), v, request, callback, deadline, expect_response)
            if defer_write:
                self._unwritten.add(c)
            else:
                self._try_write(c)

    def _try_write(self, c: BrokerConnection) -> None:
        try:
            done = c.write()
        except E.KafkaConnectionError as e:
            self._close(c, e)
            return
        for req in done:
            self._completed.append((req.callback, None, None))
        self._set_interest(c)

    def _set_interest(self, c: BrokerConnection) -> None:
        if c.sock is None:
            return
        ev = selectors.EVENT_READ
        if c.has_pending_send() or c.state == CONNECTING:
            ev |= selectors.EVENT_WRITE
        try:
            key = self.selector.get_key(c.sock)
            if key.events != ev:
                self.selector.modify(c.sock, ev, c)
        except KeyError:
            self.selector.register(c.sock, ev, c)

    def _close(self, c: BrokerConnection, exc: Exception) -> None:
        if c.sock is not None:
            try:
                self.selector.unregister(c.sock)
            except (KeyError, ValueError):
                pass
        was_ready = c.state == READY
        failed = c.close()
        if not was_ready:
            c.failures += 1
        for req in failed:
            if req.api_key == _METADATA:
                self._metadata_in_flight = False
                self.metadata.failed_update(exc, time.monotonic())
            self._completed.append((req.callback, None, exc))
        self.metadata.request_update()

    def wakeup(self) -> None:
        """Cut a blocking poll short, or make the next one not block. Writes to the
        socketpair only while poll is in select (a write costs a GIL handoff); otherwise
        the flag makes the next poll select with timeout 0. poll sets ``_selecting``
        before it reads the flag, and we set the flag before we read ``_selecting``, so
        a wakeup is never lost."""
        self._wakeup_requested = True
        if not self._selecting:
            return
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass

    # -- poll ---------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> None:
        """Do I/O for up to timeout_s (returns earlier on any completion or wakeup)."""
        with self.lock:
            if self.closed:
                raise E.IllegalStateError("the client is closed")
            if self._unwritten:
                for c in self._unwritten:
                    if c.sock is not None:
                        self._try_write(c)
                self._unwritten.clear()
            now = time.monotonic()
            timeout_s = min(timeout_s, self._maybe_update_metadata(now))
            if self._completed:
                timeout_s = 0
            timeout_s = min(timeout_s, self._next_deadline(now))
            self._selecting = True
            if self._wakeup_requested:
                self._wakeup_requested = False
                timeout_s = 0
            try:
                events = self.selector.select(max(0.0, timeout_s))
            finally:
                self._selecting = False
            for key, mask in events:
                c = key.data
                if c is None:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                    continue
                if c.sock is None or c.sock is not key.fileobj:
                    continue
                if c.state == CONNECTING:
                    if mask & selectors.EVENT_WRITE:
                        self._on_connected(c)
                    continue
                if mask & selectors.EVENT_READ:
                    try:
                        responses = c.read()
                    except E.KafkaConnectionError as e:
                        self._close(c, e)
                        continue
                    for req, body in responses:
                        self._on_response(c, req, body)
                if c.sock is not None and (mask & selectors.EVENT_WRITE or c.has_pending_send()):
                    self._try_write(c)
            self._check_timeouts(time.monotonic())
            completed, self._completed = self._completed, []
        # callbacks run outside the lock so they may call send()/poll() re-entrantly
        for cb, resp, exc in completed:
            cb(resp, exc)

    def _next_deadline(self, now: float) -> float:
        t = 3600.0
        for c in self.conns.values():
            if c.state == CONNECTING:
                t = min(t, c.connect_deadline - now)
            elif c.in_flight:
                t = min(t, c.in_flight[0].deadline - now)
        return max(0.0, t)

    def _check_timeouts(self, now: float) -> None:
        for c in list(self.conns.values()):
            if c.state == CONNECTING and now >= c.connect_deadline:
                self._close(c, E.KafkaConnectionError(
                    f"connection to node {c.node_id} ({c.host}:{c.port}) timed out"))
            elif c.in_flight and any(r.deadline <= now for r in c.in_flight):
                self._close(c, E.KafkaTimeoutError(
                    f"request to node {c.node_id} timed out after {self.request_timeout_s:.3f}s; "
                    "disconnecting"))

    def _on_connected(self, c: BrokerConnection) -> None:
        old = c.sock
        try:
            c.finish_connect()
        except E.KafkaConnectionError as e:
            self._close(c, e)
            return
        if c.sock is not old:             # wrapped in TLS: register the new socket object
            try:
                self.selector.unregister(old)
            except (KeyError, ValueError):
                pass
            self.selector.register(c.sock, selectors.EVENT_READ, c)
        self._send_api_versions(c, 3)

    # -- SASL (SaslHandshake v1, then SaslAuthenticate requests) ---------------------------
    def _start_sasl(self, c: BrokerConnection) -> None:
        from kbroker.protocol.messages.sasl_handshake import SaslHandshakeRequest
        from kbroker.security.sasl_client import new_sasl_client
        try:
            c.sasl = new_sasl_client(self._sasl_mechanism, self.config.get("sasl.jaas.config"))
        except ValueError as e:
            self._close(c, E.KafkaConfigError(str(e)))
            return
        c.state = AUTHENTICATING
        c.queue_request(ApiKey.SASL_HANDSHAKE, 1, SaslHandshakeRequest(mechanism=self._sasl_mechanism),
                        lambda resp, exc: None, time.monotonic() + self.request_timeout_s)
        self._try_write(c)

    def _on_sasl_response(self, c: BrokerConnection, req, body) -> None:
        from kbroker.protocol.messages.sasl_authenticate import SaslAuthenticateRequest
        if body.error_code:
            msg = getattr(body, "error_message", None) or (
                f"the broker's SASL mechanisms are {','.join(body.mechanisms)}" if req.api_key == ApiKey.SASL_HANDSHAKE
                else None)
            self._close(c, E.for_code(body.error_code, msg))
            return
        try:
            token = c.sasl.next(None if req.api_key == ApiKey.SASL_HANDSHAKE else bytes(body.auth_bytes))
        except ValueError as e:
            self._close(c, E.KafkaConnectionError(f"SASL authentication with node {c.node_id} failed: {e}"))
            return
        if token is None:
            c.sasl = None
            c.state = READY
            lifetime_ms = getattr(body, "session_lifetime_ms", 0) or 0
            # a new session before the broker's lifetime ends (Kafka's clients re-authenticate
            # at 85-95% of it; a new connection does the same here)
            c.session_expiry = time.monotonic() + lifetime_ms * 0.85 / 1000.0 if lifetime_ms > 0 else None
            return
        v = min(c.versions.get(ApiKey.SASL_AUTHENTICATE, 1), 1)
        c.queue_request(ApiKey.SASL_AUTHENTICATE, v, SaslAuthenticateRequest(auth_bytes=token),
                        lambda resp, exc: None, time.monotonic() + self.request_timeout_s)
        self._try_write(c)

    def _send_api_versions(self, c: BrokerConnection, version: int) -> None:
        req = ApiVersionsRequest(client_software_name=self.software_name if version >= 3 else "",
                                 client_software_version="0.1" if version >= 3 else "")
        c.queue_request(_API_VERSIONS, version, req,
                        lambda resp, exc: None, time.monotonic() + self.request_timeout_s)
        self._try_write(c)

    def _on_response(self, c: BrokerConnection, req, body) -> None:
        if req.api_key == _API_VERSIONS and c.state == CHECKING_API_VERSIONS:
            if body.error_code == ErrorCode.UNSUPPORTED_VERSION and req.api_version > 0:
                ours = [k for k in body.api_keys if k.api_key == _API_VERSIONS]
                v = min(ours[0].max_version, 3) if ours else 0
                self._send_api_versions(c, v if v < req.api_version else 0)
                return
            if body.error_code:
                self._close(c, E.for_code(body.error_code))
                return
            c.set_versions({k.api_key: (k.min_version, k.max_version) for k in body.api_keys},
                           {f.name: f.max_version_level for f in getattr(body, "finalized_features", None) or ()})
            if self._sasl_mechanism is not None:
                self._start_sasl(c)
            return
        if c.state == AUTHENTICATING and req.api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            self._on_sasl_response(c, req, body)
            return
        if req.api_key == _METADATA and req.callback is _METADATA_CB:
            self._metadata_in_flight = False
            self.metadata.update(body, time.monotonic())
            return
        self._completed.append((req.callback, body, None))

    def _maybe_update_metadata(self, now: float) -> float:
        """Send a metadata request if one is due; returns seconds until the next check."""
        wait = self.metadata.time_to_next_update(now)
        if wait > 0 or self._metadata_in_flight:
            return wait if not self._metadata_in_flight else self.request_timeout_s
        node = self.least_loaded_node()
        if node is None:
            return self.reconnect_backoff_s
        if self.is_ready(node):
            req = self.metadata.build_request(now)
            self._metadata_in_flight = True
            c = self.conns[node]
            c.queue_request(_METADATA, c.versions[_METADATA], req, _METADATA_CB,
                            now + self.request_timeout_s)
            self._try_write(c)
            return self.request_timeout_s
        self.maybe_connect(node)
        return self.reconnect_backoff_s

    # -- blocking helpers (admin, consumer) ---------------------------------------------
    def await_ready(self, node_id: int, deadline: float, *, fail_fast: bool = False) -> None:
        """Poll until node_id is ready or deadline passes (KafkaTimeoutError). With
        ``fail_fast`` a refused or dropped connection raises KafkaConnectionError at once,
        so that the caller can pick another node."""
        while not self.is_ready(node_id):
            self.maybe_connect(node_id)
            if fail_fast and self.connection_failed(node_id):
                raise E.KafkaConnectionError(f"connection to node {node_id} failed")
            left = deadline - time.monotonic()
            if left <= 0:
                raise E.KafkaTimeoutError(f"timed out waiting for a connection to node {node_id}")
            self.poll(min(left, 0.05))

    def request(self, node_id: int, api_key: int, request, timeout_s: float, *,
                version: int | None = None):
        """Send and poll until the response arrives; returns the body or raises."""
        deadline = time.monotonic() + timeout_s
        self.await_ready(node_id, deadline)
        box = []
        self.send(node_id, api_key, request, lambda r, e: box.append((r, e)), version=version,
                  timeout_s=max(0.001, min(self.request_timeout_s, deadline - time.monotonic())))
        while not box:
            left = deadline - time.monotonic()
            if left <= 0:
                raise E.KafkaTimeoutError(f"{ApiKey(api_key).name} to node {node_id} timed out")
            self.poll(left)
        resp, exc = box[0]
        if exc is not None:
            raise exc
        return resp

    def await_metadata(self, timeout_s: float, *, force: bool = True) -> None:
        """Refresh metadata now and wait for it (KafkaTimeoutError)."""
        deadline = time.monotonic() + timeout_s
        v = self.metadata.request_update() if force else self.metadata.version - 1
        while self.metadata.version <= v:
            left = deadline - time.monotonic()
            if left <= 0:
                err = self.metadata.last_error
                raise E.KafkaTimeoutError("timed out waiting for metadata"
                                          + (f" (last error: {err})" if err else ""))
            self.poll(min(left, 0.1))

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            for c in list(self.conns.values()):
                self._close(c, E.IllegalStateError("the client was closed"))
            completed, self._completed = self._completed, []
            self.selector.close()
            self._wake_r.close()
            self._wake_w.close()
        for cb, resp, exc in completed:
            try:
                cb(resp, exc)
            except Exception:
                pass


def _METADATA_CB(resp, exc):  # marker: metadata responses are handled inline
    return None

"""Requests from this node to other nodes: the raft channel and the controller channel.

Kafka: ``InterBrokerSendThread`` (one thread owning a NetworkClient, every callback run
on it), ``NodeToControllerChannelManager`` (a broker's requests to the active
controller: BrokerRegistration, BrokerHeartbeat, AlterPartition, AllocateProducerIds,
forwarded admin requests) and raft's ``KafkaNetworkChannel``.

Nodes are addressed by id with fixed endpoints (``controller.quorum.voters`` or the
controller endpoints a broker learns), so :class:`StaticNodes` stands in for the
client's Metadata: NetworkClient never sends a Metadata request from here.

Threads: :class:`InterNodeSendThread` owns its NetworkClient; ``send`` may be called
from any thread (it queues and wakes the thread); callbacks run on the send thread and
must not block. :class:`ControllerChannel` is a thin policy on top, with no thread of
its own.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, NamedTuple

from kbroker.client import errors as E
from kbroker.client.network_client import NetworkClient
from kbroker.protocol import ErrorCode

log = logging.getLogger(__name__)

Callback = Callable[[object, "Exception | None"], None]


class NodeEndpoint(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None = None


class _Cluster(NamedTuple):
    brokers: tuple


class StaticNodes:
    """The part of the client's Metadata that NetworkClient uses, over a fixed map of
    node id -> endpoint. ``set_nodes`` replaces the map (a broker learning controllers)."""

    version = 0
    last_error = None

    def __init__(self, nodes: dict[int, tuple[str, int]]):
        self.set_nodes(nodes)

    def set_nodes(self, nodes: dict[int, tuple[str, int]]) -> None:
        eps = {int(i): NodeEndpoint(int(i), h, int(p)) for i, (h, p) in nodes.items()}
        self._nodes = eps
        self.cluster = _Cluster(tuple(eps.values()))
        self.bootstrap = list(eps.values())

    def node(self, node_id: int) -> NodeEndpoint | None:
        return self._nodes.get(node_id)

    def nodes(self) -> list[NodeEndpoint]:
        return list(self._nodes.values())

    def node_ids(self) -> list[int]:
        return sorted(self._nodes)

    # NetworkClient's metadata hooks: nothing to refresh
    def request_update(self) -> int:
        return self.version

    def failed_update(self, exc, now) -> None:
        pass

    def time_to_next_update(self, now: float) -> float:
        return 3600.0


#: client settings for inter-node connections (Kafka's broker-side defaults)
DEFAULT_CONFIG = {
    "client.id": "kbroker-inter-node",
    "request.timeout.ms": 30000,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 1000,
    "socket.connection.setup.timeout.ms": 10000,
    "send.buffer.bytes": 131072,
    "receive.buffer.bytes": 32768,
    "max.in.flight.requests.per.connection": 100,
}


class _Pending(NamedTuple):
    node_id: int
    api_key: int
    request: object
    callback: Callback
    deadline: float
    version: int | None


class InterNodeSendThread:
    """One thread and one NetworkClient for this node's requests to other nodes.

    ``send`` queues; the thread connects on demand, writes the request once the node is
    ready, and runs ``callback(response, exc)`` exactly once: with the response, or with
    a KafkaTimeoutError if the node was not reachable and answering before ``timeout_s``,
    or the connection error that failed the request in flight. ``close`` fails whatever
    is still queued with a KafkaConnectionError."""

    def __init__(self, name: str, nodes: StaticNodes, config: dict | None = None):
        self.name = name
        self.nodes = nodes
        self.config = dict(DEFAULT_CONFIG, **(config or {}))
        self.client = NetworkClient(self.config, nodes, client_software_name="kbroker-" + name)
        self._lock = threading.Lock()        # guards _queue and _closed
        self._queue: deque[_Pending] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, node_id: int, api_key: int, request, callback: Callback, *,
             timeout_s: float | None = None, version: int | None = None) -> None:
        timeout = self.config["request.timeout.ms"] / 1000.0 if timeout_s is None else timeout_s
        p = _Pending(int(node_id), int(api_key), request, callback, time.monotonic() + timeout, version)
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._queue.append(p)
        if closed:
            callback(None, E.KafkaConnectionError(f"{self.name} is closed"))
            return
        self.client.wakeup()

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._closed = True
        self.client.wakeup()
        self._thread.join(timeout_s)

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        waiting: list[_Pending] = []
        try:
            while True:
                with self._lock:
                    closed = self._closed
                    while self._queue:
                        waiting.append(self._queue.popleft())
                if closed:
                    break
                now = time.monotonic()
                still = []
                for p in waiting:
                    if self.nodes.node(p.node_id) is None:
                        self._complete(p, None, E.KafkaConnectionError(f"unknown node {p.node_id}"))
                    elif now >= p.deadline:
                        self._complete(p, None, E.KafkaTimeoutError(
                            f"node {p.node_id} was not ready before the request's deadline"))
                    elif self.client.is_ready(p.node_id):
                        try:
                            self.client.send(p.node_id, p.api_key, p.request, p.callback,
                                             version=p.version, timeout_s=max(0.001, p.deadline - now))
                        except E.KafkaError as e:
                            self._complete(p, None, e)
                    else:
                        self.client.maybe_connect(p.node_id)
                        still.append(p)
                waiting = still
                self.client.poll(0.05 if waiting else 1.0)
        except Exception:
            log.exception("%s stopped on an unexpected error", self.name)
        finally:
            with self._lock:
                self._closed = True
                waiting.extend(self._queue)
                self._queue.clear()
            for p in waiting:
                self._complete(p, None, E.KafkaConnectionError(f"{self.name} is closed"))
            try:
                self.client.close()
            except Exception:
                pass

    @staticmethod
    def _complete(p: _Pending, resp, exc) -> None:
        try:
            p.callback(resp, exc)
        except Exception:
            log.exception("callback of a request to node %d failed", p.node_id)


def _not_controller(resp) -> bool:
    """NOT_CONTROLLER at the top level, or in every item of a response that has no
    top-level error code (CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs...)."""
    if getattr(resp, "error_code", ErrorCode.NONE) == ErrorCode.NOT_CONTROLLER:
        return True
    for attr in ("topics", "responses", "results"):
        items = getattr(resp, attr, None)
        if items:
            return all(getattr(i, "error_code", None) == ErrorCode.NOT_CONTROLLER for i in items)
    return False



class BrokerSender:
    """An InterNodeSendThread to other brokers, started on first use, whose node map is
    re-read from ``endpoints()`` (node id -> (host, port) of the inter-broker listener) on
    every use, so brokers that moved or joined are reached. ``client_config``: that
    listener's security (KafkaConfig.inter_broker_client_config; empty: PLAINTEXT).
    ``get()`` is None once ``close()`` ran. Thread-safe (``_lock`` guards the sender and
    the closed flag)."""

    def __init__(self, name: str, endpoints: Callable[[], dict], request_timeout_ms: int = 30000,
                 client_config: dict | None = None):
        self._name = name
        self._endpoints = endpoints
        self._request_timeout_ms = int(request_timeout_ms)
        self._client_config = dict(client_config or {})
        self._lock = threading.Lock()
        self._sender: InterNodeSendThread | None = None
        self._nodes: StaticNodes | None = None
        self._closed = False

    def get(self) -> "InterNodeSendThread | None":
        with self._lock:
            if self._closed:
                return None
            eps = self._endpoints()
            if self._sender is None:
                self._nodes = StaticNodes(eps)
                self._sender = InterNodeSendThread(self._name, self._nodes,
                                                   {**self._client_config,
                                                    "request.timeout.ms": self._request_timeout_ms})
            else:
                self._nodes.set_nodes(eps)
            return self._sender

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sender, self._sender = self._sender, None
        if sender is not None:
            sender.close()


class ControllerChannel:
    """A node's requests to the active controller (Kafka's NodeToControllerChannelManager).

    The active controller is ``leader_hint()`` when the caller knows it (the raft leader,
    learned from the metadata log), else the voters are tried in turn. A request that
    fails to connect, times out, or is answered NOT_CONTROLLER is retried on the next
    candidate after ``retry_backoff_s`` until ``timeout_s`` has passed; then its callback
    gets the last error. The callback runs once, on the send thread."""

    def __init__(self, sender: InterNodeSendThread, leader_hint: Callable[[], int | None] = lambda: None,
                 retry_backoff_s: float = 0.1):
        self.sender = sender
        self.leader_hint = leader_hint
        self.retry_backoff_s = retry_backoff_s
        self._rotation = 0

    def _candidate(self, failed: set[int]) -> int | None:
        hint = self.leader_hint()
        ids = self.sender.nodes.node_ids()
        if hint is not None and hint >= 0 and hint not in failed and hint in ids:
            return hint
        left = [i for i in ids if i not in failed] or ids
        if not left:
            return None
        self._rotation += 1
        return left[self._rotation % len(left)]

    def send(self, api_key: int, request, callback: Callback, *, timeout_s: float = 30.0,
             per_try_timeout_s: float = 5.0, version: int | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        failed: set[int] = set()

        def attempt():
            node = self._candidate(failed)
            left = deadline - time.monotonic()
            if node is None:
                callback(None, E.KafkaConnectionError("no controller endpoints are known"))
                return
            self.sender.send(node, api_key, request, lambda r, e: done(node, r, e),
                             timeout_s=max(0.001, min(per_try_timeout_s, left)), version=version)

        def done(node, resp, exc):
            if exc is None and not _not_controller(resp):
                callback(resp, None)
                return
            if exc is None:
                exc = E.for_code(ErrorCode.NOT_CONTROLLER)
            failed.add(node)
            if len(failed) >= len(self.sender.nodes.node_ids()):
                failed.clear()
            if time.monotonic() + self.retry_backoff_s >= deadline:
                callback(None, exc)
                return
            t = threading.Timer(self.retry_backoff_s, attempt)
            t.daemon = True
            t.start()

        attempt()

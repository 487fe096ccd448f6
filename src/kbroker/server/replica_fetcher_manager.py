"""ReplicaFetcherManager: the threads that feed a KRaft broker's follower logs.

Kafka: ``ReplicaFetcherManager`` / ``AbstractFetcherManager`` with ``ReplicaFetcherThread``.
``num.replica.fetchers`` fetcher threads per source broker; a partition goes to the
thread ``(source broker, hash(topic, partition) % num.replica.fetchers)``. Each
:class:`ReplicaFetcherThread` drives one pure :class:`~kbroker.cluster.replica_fetcher.ReplicaFetcher`
(Fetch v17 with this broker's id and epoch, appends as follower, truncation on a
diverging epoch, ListOffsets with the replica id for an OUT_OF_RANGE partition,
backoff) and sends its requests to the leader over its own InterNodeSendThread (one
NetworkClient, like Kafka's per-thread BlockingSend): one Fetch in flight per thread.
A Fetch's answer is applied on the send thread, which sends the next Fetch at once
(the leader's high watermark, and acks=all, wait for the fetch that carries the new
fetch offset: no wake-up of another thread in between); the fetcher thread starts
fetching, waits out backoffs and runs the ListOffsets of out-of-range partitions.

The leader's address: the endpoint of ``inter.broker.listener.name`` in the leader's
registration (none there: not fetched until it has one), from the latest metadata image
(refreshed each time the manager is told about partitions, and before each request when
unknown); the fetchers connect with that listener's security
(``KafkaConfig.inter_broker_client_config``: SSL, SASL_PLAINTEXT, SASL_SSL).

Threads and locks: the metadata publisher (raft thread) calls :meth:`follow` and
:meth:`remove_partitions`; a fetcher's ``lock`` is held while an answer is applied
(appends, truncation; on its send thread or its fetcher thread), so once
``remove_partitions`` returns no fetcher writes to those logs any more (the
ReplicaManager then makes this broker their leader). Fetcher threads with no
partitions left are stopped.
"""
from __future__ import annotations

import logging
import threading
import time
import zlib

from kbroker.cluster.replica_fetcher import FetcherConfig, ReplicaFetcher
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.list_offsets import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kbroker.server.inter_node import InterNodeSendThread, StaticNodes

log = logging.getLogger(__name__)

FETCH_VERSION = 17
LIST_OFFSETS_VERSION = 7
EARLIEST, LATEST = -2, -1


def fetcher_config(config) -> FetcherConfig:
    """The replica.fetch.* broker settings."""
    return FetcherConfig(wait_max_ms=config["replica.fetch.wait.max.ms"], min_bytes=config["replica.fetch.min.bytes"],
                         response_max_bytes=config["replica.fetch.response.max.bytes"],
                         max_bytes=config["replica.fetch.max.bytes"], backoff_ms=config["replica.fetch.backoff.ms"])


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ReplicaFetcherThread:
    """One thread fetching, from ``source_broker_id``, the partitions given to it."""

    def __init__(self, name: str, node_id: int, source_broker_id: int, endpoint, broker_epoch,
                 config: FetcherConfig, request_timeout_ms: int, resolve=None, client_config: dict | None = None):
        self.name = name
        #: () -> the leader's endpoint in the latest metadata (or None)
        self.resolve = resolve
        self.source_broker_id = source_broker_id
        self.fetcher = ReplicaFetcher(node_id, source_broker_id, broker_epoch, config)
        self.request_timeout_s = request_timeout_ms / 1000.0
        self.nodes = StaticNodes({source_broker_id: endpoint} if endpoint is not None else {})
        # client_config: the inter-broker listener's security (TLS, SASL)
        self.sender = InterNodeSendThread(name + "-net", self.nodes, {
            **(client_config or {}),
            "client.id": f"broker-{node_id}-fetcher", "request.timeout.ms": request_timeout_ms,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 1000})
        #: held while the fetcher state or a follower log is changed (module docstring)
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- membership (the publisher's thread) ---------------------------------------------------
    def set_endpoint(self, endpoint) -> None:
        """The leader's (host, port), when it is known and changed."""
        if endpoint is None:
            return
        cur = self.nodes.node(self.source_broker_id)
        if cur is None or (cur.host, cur.port) != (endpoint[0], int(endpoint[1])):
            self.nodes.set_nodes({self.source_broker_id: endpoint})

    def add_partition(self, tp, topic_id, leader_epoch: int, lg) -> None:
        with self.lock:
            self.fetcher.add_partition(tp, topic_id, leader_epoch, lg)
            self._wake.notify_all()

    def remove_partition(self, tp) -> None:
        with self.lock:
            self.fetcher.remove_partition(tp)

    def partition_count(self) -> int:
        with self.lock:
            return len(self.fetcher.partitions)

    def stop(self) -> None:
        with self.lock:
            self._stopped = True
            self._wake.notify_all()
        self.sender.close(1.0)
        self._thread.join(5.0)

    # -- the thread -----------------------------------------------------------------------------
    def _call(self, api_key: int, request, version: int):
        """Send and wait for the answer; None on any failure (logged)."""
        if self.resolve is not None:
            self.set_endpoint(self.resolve())
        done = threading.Event()
        box = []

        def cb(resp, exc):
            box.append((resp, exc))
            done.set()
        self.sender.send(self.source_broker_id, api_key, request, cb, timeout_s=self.request_timeout_s,
                         version=version)
        done.wait(self.request_timeout_s + 5.0)
        if not box:
            return None
        resp, exc = box[0]
        if exc is not None:
            log.debug("%s: request to broker %d failed: %s", self.name, self.source_broker_id, exc)
            return None
        return resp

    def _run(self) -> None:
        """Starts fetches and runs what may block (ListOffsets, waits for a backoff);
        a fetch's answer is applied on the send thread (:meth:`_on_fetch_answer`), which
        sends the next Fetch itself while nothing else is due."""
        try:
            while True:
                with self.lock:
                    if self._stopped:
                        return
                    if self.fetcher.in_flight:
                        self._wake.wait(1.0)     # the answer's callback notifies
                        continue
                    queries = self.fetcher.offset_queries()
                    req = None if queries else self.fetcher.poll(_now_ms())
                    if req is None and not queries:
                        deadline = self.fetcher.next_deadline_ms()
                        wait = 1.0 if deadline is None else max(0.0, min(1.0, (deadline - _now_ms()) / 1000.0))
                        self._wake.wait(wait)
                        continue
                if queries:
                    for tp, epoch in queries:
                        self._leader_offsets(tp, epoch)
                    continue
                self._send_fetch(req)
        except Exception:
            log.exception("%s stopped on an unexpected error", self.name)

    def _send_fetch(self, req) -> None:
        """Send the Fetch :meth:`ReplicaFetcher.poll` returned; its answer (or failure)
        comes back to :meth:`_on_fetch_answer` exactly once."""
        if self.resolve is not None:
            self.set_endpoint(self.resolve())
        self.sender.send(self.source_broker_id, ApiKey.FETCH, req, self._on_fetch_answer,
                         timeout_s=self.request_timeout_s, version=FETCH_VERSION)

    def _on_fetch_answer(self, resp, exc) -> None:
        """On the send thread: apply the answer (appends, truncation) under ``lock``, then
        send the next Fetch at once, carrying the new fetch offsets (the leader's high
        watermark, and so acks=all, waits for it), unless ListOffsets or a backoff is due:
        that is left to the fetcher thread, woken here. No hop to another thread on the
        replication path (Kafka's fetcher thread sends and processes on one thread too)."""
        if exc is not None:
            log.debug("%s: fetch from broker %d failed: %s", self.name, self.source_broker_id, exc)
            resp = None
        nxt = None
        try:
            with self.lock:
                if self._stopped:
                    return
                outcome = self.fetcher.on_fetch_response(_now_ms(), resp)
                if not self.fetcher.offset_queries():
                    nxt = self.fetcher.poll(_now_ms())
                if nxt is None:
                    self._wake.notify_all()
            for tp, what in outcome.items():
                if what in ("truncated", "out_of_range", "fenced"):
                    log.info("%s: %s-%d %s", self.name, tp[0], tp[1], what)
                elif what not in ("appended", "empty"):
                    # backoff (an error, a failed request) or a stale answer: once per retry
                    log.debug("%s: %s-%d %s", self.name, tp[0], tp[1], what)
            if nxt is not None:
                self._send_fetch(nxt)
        except Exception:
            log.exception("%s: applying a fetch answer failed", self.name)
            with self.lock:
                self._wake.notify_all()

    def _leader_offsets(self, tp, epoch: int) -> None:
        """The leader's log start and end offsets (ListOffsets EARLIEST / LATEST with this
        broker's replica id, so the end is the log end offset)."""
        answers = []
        for ts in (EARLIEST, LATEST):
            req = ListOffsetsRequest(replica_id=self.fetcher.replica_id, isolation_level=0, topics=[
                ListOffsetsTopic(name=tp[0], partitions=[ListOffsetsPartition(
                    partition_index=tp[1], current_leader_epoch=epoch, timestamp=ts)])])
            resp = self._call(ApiKey.LIST_OFFSETS, req, LIST_OFFSETS_VERSION)
            if resp is None:
                answers.append((-1, ErrorCode.NETWORK_EXCEPTION))
                continue
            p = resp.topics[0].partitions[0]
            answers.append((p.offset, p.error_code))
        (start, e1), (end, e2) = answers
        err = e1 or e2
        with self.lock:
            outcome = self.fetcher.on_leader_offsets(_now_ms(), tp, epoch, start, end, err)
        log.info("%s: %s-%d leader offsets [%d, %d) %s: %s", self.name, tp[0], tp[1], start, end,
                 ErrorCode(err).name, outcome)


class ReplicaFetcherManager:
    """The fetcher threads of one broker, by (source broker, fetcher id)."""

    def __init__(self, node_id: int, config, image, broker_epoch):
        self.node_id = node_id
        self.config = config
        self._image = image
        self.broker_epoch = broker_epoch
        self.num_fetchers = max(1, config["num.replica.fetchers"])
        self.fetcher_config = fetcher_config(config)
        self.request_timeout_ms = config["replica.socket.timeout.ms"]
        self.listener_name = config.inter_broker_listener_name if hasattr(config, "inter_broker_listener_name") \
            else None
        #: the inter-broker listener's security (TLS, SASL) for every fetcher's NetworkClient
        self.client_config = config.inter_broker_client_config() if hasattr(config, "inter_broker_client_config") \
            else {}
        self._lock = threading.Lock()
        self._threads: dict[tuple[int, int], ReplicaFetcherThread] = {}
        self._where: dict[tuple, tuple[int, int]] = {}     # tp -> thread key
        self._closed = False

    def endpoint(self, broker_id: int):
        reg = self._image().cluster.brokers.get(broker_id)
        if reg is None or not reg.listeners:
            return None
        if self.listener_name:
            # only that listener speaks the inter-broker security: none yet, no fetching
            ep = reg.listener(self.listener_name)
            return None if ep is None else (ep.host, ep.port)
        ep = reg.listeners[0]
        return (ep.host, ep.port)

    def _fetcher_id(self, tp) -> int:
        return zlib.crc32(f"{tp[0]}-{tp[1]}".encode()) % self.num_fetchers

    def follow(self, partitions: dict) -> None:
        """Fetch each ``tp -> Partition`` (a follower) from its leader in its leader
        epoch; one with no leader (-1) is only removed from its fetcher."""
        with self._lock:
            if self._closed:
                return
            for tp, part in partitions.items():
                leader = part.leader
                key = (leader, self._fetcher_id(tp)) if leader >= 0 else None
                old = self._where.get(tp)
                if old is not None and old != key:
                    t = self._threads.get(old)
                    if t is not None:
                        t.remove_partition(tp)
                    del self._where[tp]
                if key is None:
                    continue
                t = self._threads.get(key)
                ep = self.endpoint(leader)
                if t is None:
                    t = ReplicaFetcherThread(f"ReplicaFetcherThread-{key[1]}-{leader}", self.node_id, leader, ep,
                                             self.broker_epoch, self.fetcher_config, self.request_timeout_ms,
                                             resolve=lambda b=leader: self.endpoint(b),
                                             client_config=self.client_config)
                    self._threads[key] = t
                else:
                    t.set_endpoint(ep)
                t.add_partition(tp, part.topic_id, part.leader_epoch, part.log)
                self._where[tp] = key
            self._stop_idle_locked()

    def remove_partitions(self, tps) -> None:
        with self._lock:
            for tp in tps:
                key = self._where.pop(tp, None)
                if key is not None:
                    t = self._threads.get(key)
                    if t is not None:
                        t.remove_partition(tp)
            self._stop_idle_locked()

    def _stop_idle_locked(self) -> None:
        for key, t in list(self._threads.items()):
            if t.partition_count() == 0:
                del self._threads[key]
                threading.Thread(target=t.stop, name=f"stop-{t.name}", daemon=True).start()

    def fetcher_states(self) -> dict:
        """tp -> PartitionFetchState (for tests and tools)."""
        out = {}
        with self._lock:
            threads = list(self._threads.values())
        for t in threads:
            with t.lock:
                out.update(t.fetcher.partitions)
        return out

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads.values())
            self._threads.clear()
            self._where.clear()
        for t in threads:
            t.stop()

"""Cluster metadata: brokers, topics, partition leaders (Kafka's Metadata / Cluster).

``Cluster`` is an immutable snapshot built from one MetadataResponse. ``Metadata`` holds
the current snapshot plus the refresh policy: a refresh is due when someone called
``request_update()`` (after NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE, a new topic, a disconnect) -- rate limited by retry.backoff.ms -- or
when the snapshot is older than metadata.max.age.ms. NetworkClient sends the request.

Thread-safety: ``Metadata`` methods take its condition lock; threads waiting for a newer
snapshot (``wait_for_update``) are woken by ``update``/``failed_update``. ``version``
counts successful updates.
"""
from __future__ import annotations

import threading
import time
from typing import NamedTuple

from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic


class TopicPartition(NamedTuple):
    """A topic name and a partition index."""

    topic: str
    partition: int


class PartitionMetadata(NamedTuple):
    partition: int
    leader: int           # node id, -1 if none
    leader_epoch: int
    replicas: tuple
    isr: tuple
    error_code: int


class BrokerMetadata(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None


class Cluster:
    """One immutable metadata snapshot."""

    def __init__(self, brokers=(), topics=None, topic_errors=None, cluster_id=None,
                 controller_id=-1, topic_ids=None):
        self.brokers: dict[int, BrokerMetadata] = {b.node_id: b for b in brokers}
        #: topic -> list of PartitionMetadata indexed by partition
        self.topics: dict[str, list[PartitionMetadata]] = topics or {}
        self.topic_errors: dict[str, int] = topic_errors or {}
        self.topic_ids: dict = topic_ids or {}
        self.cluster_id = cluster_id
        self.controller_id = controller_id

    def partitions_for(self, topic: str) -> list[PartitionMetadata] | None:
        return self.topics.get(topic)

    def num_partitions(self, topic: str) -> int | None:
        p = self.topics.get(topic)
        return len(p) if p else None

    def leader_for(self, tp: TopicPartition) -> int:
        parts = self.topics.get(tp.topic)
        if parts is None or tp.partition >= len(parts):
            return -1
        return parts[tp.partition].leader

    def available_partitions(self, topic: str) -> list[int]:
        return [p.partition for p in self.topics.get(topic, ()) if p.leader >= 0]


class Metadata:
    """Current Cluster plus the refresh policy (see module docstring)."""

    def __init__(self, config):
        self.bootstrap = [BrokerMetadata(-(i + 1), h, p, None)
                          for i, (h, p) in enumerate(config["bootstrap.servers"])]
        self.cluster = Cluster()
        self.version = 0
        self.max_age_s = config["metadata.max.age.ms"] / 1000.0
        self.backoff_s = config["retry.backoff.ms"] / 1000.0
        self.allow_auto_topic_creation = True
        #: topics of interest; None means all topics (admin / pattern subscription)
        self.topics: set[str] | None = set()
        self._need_update = True
        self._last_refresh = 0.0
        self._last_attempt = 0.0
        self.last_error: Exception | None = None
        #: node id -> BrokerMetadata for connections outside the broker list (group
        #: coordinators get id 2**31-1-node_id so group traffic has its own connection)
        self.extra_nodes: dict[int, BrokerMetadata] = {}
        self._cond = threading.Condition()

    # -- policy -------------------------------------------------------------------------
    def add_topics(self, *topics: str) -> bool:
        """Track topics; returns True (and requests an update) if any was new."""
        with self._cond:
            if self.topics is None:
                new = any(t not in self.cluster.topics for t in topics)
            else:
                new = any(t not in self.topics for t in topics)
                self.topics.update(topics)
            if new:
                self._need_update = True
            return new

    def set_topics(self, topics) -> None:
        with self._cond:
            if topics is None or set(topics) != self.topics:
                self.topics = None if topics is None else set(topics)
                self._need_update = True

    def request_update(self) -> int:
        """Ask for a refresh soon; returns the current version to wait beyond."""
        with self._cond:
            self._need_update = True
            return self.version

    def time_to_next_update(self, now: float) -> float:
        """Seconds until a refresh is due (0 = now), honouring retry.backoff.ms."""
        backoff = self._last_attempt + self.backoff_s - now
        if self._need_update:
            return max(0.0, backoff)
        return max(0.0, self._last_refresh + self.max_age_s - now, backoff)

    def build_request(self, now: float) -> MetadataRequest:
        self._last_attempt = now
        topics = None if self.topics is None else [MetadataRequestTopic(name=t) for t in sorted(self.topics)]
        return MetadataRequest(topics=topics, allow_auto_topic_creation=self.allow_auto_topic_creation)

    # -- updates ------------------------------------------------------------------------
    def update(self, resp, now: float) -> None:
        brokers = [BrokerMetadata(b.node_id, b.host, b.port, b.rack) for b in resp.brokers]
        topics, errors, ids = {}, {}, {}
        retry = False
        for t in resp.topics:
            if t.error_code:
                errors[t.name] = t.error_code
                if ErrorCode(t.error_code).retriable:
                    retry = True
                continue
            parts = sorted(t.partitions, key=lambda p: p.partition_index)
            lst = [PartitionMetadata(p.partition_index, p.leader_id, p.leader_epoch,
                                     tuple(p.replica_nodes), tuple(p.isr_nodes), p.error_code)
                   for p in parts]
            if any(p.leader < 0 for p in lst):
                retry = True
            topics[t.name] = lst
            ids[t.name] = getattr(t, "topic_id", None)
        cluster = Cluster(brokers, topics, errors, resp.cluster_id, resp.controller_id, ids)
        with self._cond:
            self.cluster = cluster
            self.version += 1
            self._last_refresh = now
            # leaderless partitions or still-creating topics: keep refreshing (with backoff)
            self._need_update = retry
            self.last_error = None
            self._cond.notify_all()

    def failed_update(self, exc: Exception, now: float) -> None:
        with self._cond:
            self.last_error = exc
            self._need_update = True
            self._cond.notify_all()

    def wait_for_update(self, last_version: int, timeout_s: float) -> bool:
        """Block until version > last_version; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.version <= last_version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def node(self, node_id: int) -> BrokerMetadata | None:
        b = self.cluster.brokers.get(node_id)
        if b is None and node_id in self.extra_nodes:
            return self.extra_nodes[node_id]
        if b is None and node_id < 0 and -node_id <= len(self.bootstrap):
            return self.bootstrap[-node_id - 1]
        return b

    def nodes(self) -> list[BrokerMetadata]:
        return list(self.cluster.brokers.values()) or list(self.bootstrap)

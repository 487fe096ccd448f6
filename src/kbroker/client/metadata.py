"""Cluster metadata: brokers, topics, partition leaders (Kafka's Metadata / Cluster).

``Cluster`` is an immutable snapshot built from MetadataResponses. ``Metadata`` holds
the current snapshot plus the refresh policy: a refresh is due when someone called
``request_update()`` (after NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE, a disconnect) -- rate limited by retry.backoff.ms -- or when the
snapshot is older than metadata.max.age.ms. NetworkClient sends the request.

A topic of interest added by ``add_topics`` is fetched at once, not after the backoff, and
by itself: a *partial* request for the new topics only, whose answer is merged into the
snapshot (Kafka's ``requestUpdateForNewTopics`` and ``newMetadataRequestBuilderForNewTopics``).
So a producer that starts writing to 200 topics one after another waits one round trip
per topic, not retry.backoff.ms, and each answer carries one topic, not all it knows.
A full request is still sent when one was asked for (errors, leaderless partitions) or
the snapshot is older than metadata.max.age.ms.

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
        #: topics added since the last request that carried them (Kafka's newTopics)
        self._new_topics: set[str] = set()
        #: a new topic was added: the next request goes now, whatever the backoff
        self._immediate = False
        #: the topics of the partial request in flight; None: the request is a full one
        self._partial: frozenset | None = None
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
                if new:
                    self._need_update = True
            else:
                fresh = [t for t in topics if t not in self.topics]
                new = bool(fresh)
                if new:
                    self.topics.update(fresh)
                    self._new_topics.update(fresh)
                    self._immediate = True
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

    def request_update_for_topic(self, topic: str) -> int:
        """``request_update`` for a caller waiting on ``topic``: a topic still new (not yet
        asked for, or asked for in the partial request in flight) needs no full update
        (Kafka's requestUpdateForTopic). Returns the version to wait beyond."""
        with self._cond:
            if topic in self._new_topics:
                self._immediate = True
            elif self._partial is None or topic not in self._partial:
                self._need_update = True
            return self.version

    def time_to_next_update(self, now: float) -> float:
        """Seconds until a refresh is due (0 = now), honouring retry.backoff.ms (except
        for the first request after a new topic)."""
        if self._immediate:
            return 0.0
        backoff = self._last_attempt + self.backoff_s - now
        if self._need_update or self._new_topics:
            return max(0.0, backoff)
        return max(0.0, self._last_refresh + self.max_age_s - now, backoff)

    def build_request(self, now: float) -> MetadataRequest:
        """The next MetadataRequest: for the new topics only when nothing asked for a
        full one and the snapshot is younger than metadata.max.age.ms (Kafka's rule),
        else for every topic of interest."""
        with self._cond:
            self._last_attempt = now
            self._immediate = False
            if (self._new_topics and not self._need_update and self.topics is not None
                    and now < self._last_refresh + self.max_age_s):
                self._partial = frozenset(self._new_topics)
                names = sorted(self._partial)
            else:
                self._partial = None
                names = None if self.topics is None else sorted(self.topics)
            self._new_topics.clear()
        topics = None if names is None else [MetadataRequestTopic(name=t) for t in names]
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
        with self._cond:
            partial = self._partial
            self._partial = None
            if partial is not None:
                # a partial answer: the new topics replace their entries, the rest stays
                old = self.cluster
                topics = {**{t: v for t, v in old.topics.items() if t not in errors}, **topics}
                errors = {**{t: v for t, v in old.topic_errors.items()
                             if t not in topics and t not in partial}, **errors}
                ids = {**old.topic_ids, **ids}
            self.cluster = Cluster(brokers, topics, errors, resp.cluster_id, resp.controller_id, ids)
            self.version += 1
            if partial is None:
                self._last_refresh = now
                # leaderless partitions or still-creating topics: keep refreshing (with backoff)
                self._need_update = retry
            elif retry:
                self._need_update = True     # the new topic's trouble is for a full update
            self.last_error = None
            self._cond.notify_all()

    def failed_update(self, exc: Exception, now: float) -> None:
        with self._cond:
            if self._partial is not None:
                self._new_topics.update(self._partial)
                self._partial = None
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

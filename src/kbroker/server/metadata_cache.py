"""MetadataCache: the one metadata view request handlers read, in both modes.

Kafka: ``MetadataCache`` with ``ZkMetadataCache`` / ``KRaftMetadataCache``. Handlers
never look at where metadata comes from; they ask the broker's ``metadata_cache``:

- ``image``: topics by name (``image.topics``) and id (``image.topics_by_id``), each a
  :class:`kbroker.server.metadata.TopicImage` (name, topic id, partition count, topic
  config overrides), and the dynamic broker configs (``image.broker_configs``). Images
  are replaced, never mutated: a TopicImage that is the same object is unchanged.
- ``partition_states(topic)``: one entry per partition (None: no such state), each with
  ``leader``, ``leader_epoch``, ``replicas`` and ``isr``; entries are replaced, never
  mutated, so identity says "unchanged" (the Metadata handler's encoded-topic cache);
  ``states_token(topic)``: an object that is the same while no state of it can have changed.
- ``partition_metadata(topic, states)``: the Metadata response's partitions;
  ``cluster_token``: an object that changes when anything else those depend on changes
  (alive brokers).
- ``leader_of(topic, partition)``: (leader id, leader epoch) or None for an unknown one;
  ``alive_brokers(listener)``: [(id, host, port, rack)] of brokers reachable on the
  request's listener; ``endpoint(id, listener)``: (host, port) or None;
  ``controller_id(alive)``: what Metadata and DescribeCluster name as the controller.

:class:`SingleNodeMetadataCache` adapts the zero-config broker (the MetadataStore's image;
every partition led by this node, its leader epoch from the ReplicaManager).
:class:`KRaftMetadataCache` reads the published KRaft
:class:`~kbroker.metadata.image.MetadataImage` (``refresh`` after each publish builds the
handler image, reusing every TopicImage whose topic and configs did not change; a reader
that sees a newer KRaft image first refreshes it itself).
"""
from __future__ import annotations

import random
import threading
from types import MappingProxyType

from kbroker.metadata.image import BROKER_RESOURCE, TOPIC_RESOURCE, MetadataImage as KRaftImage
from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.metadata import MetadataResponsePartition
from kbroker.server.metadata import MetadataImage, TopicImage

_EMPTY = MappingProxyType({})


class SingleNodeMetadataCache:
    """The zero-config node: one broker, the leader of every partition it hosts."""

    cluster_token = None

    def __init__(self, broker):
        self.broker = broker
        self._rm = broker.replica_manager

    @property
    def image(self) -> MetadataImage:
        return self.broker.metadata.image

    def states_token(self, t):
        return self._rm._partitions   # the map object: replaced on every change (ReplicaManager)

    def partition_states(self, t) -> list:
        pmap = self.broker.replica_manager.partitions
        name = t.name
        return [pmap.get((name, p)) for p in range(t.num_partitions)]

    def partition_metadata(self, t, states) -> list:
        node = self.broker.node_id
        out = []
        for p, part in enumerate(states):
            out.append(MetadataResponsePartition(
                error_code=ErrorCode.NONE if part is not None else ErrorCode.LEADER_NOT_AVAILABLE,
                partition_index=p, leader_id=node if part is not None else -1,
                leader_epoch=part.leader_epoch if part is not None else 0,
                replica_nodes=[node], isr_nodes=[node] if part is not None else [], offline_replicas=[]))
        return out

    def leader_of(self, topic: str, partition: int):
        part = self.broker.replica_manager.get_partition((topic, partition))
        return None if part is None else (self.broker.node_id, part.leader_epoch)

    def alive_brokers(self, listener_name: str | None = None) -> list:
        host, port = self.broker.endpoint(listener_name)
        return [(self.broker.node_id, host, port, self.broker.config["broker.rack"])]

    def endpoint(self, broker_id: int, listener_name: str | None = None):
        return self.broker.endpoint(listener_name) if broker_id == self.broker.node_id else None

    def controller_id(self, alive=None) -> int:
        return self.broker.node_id


class KRaftMetadataCache:
    """A KRaft broker's view of the published image (``source()`` returns the latest)."""

    def __init__(self, source):
        self._source = source
        self._kraft: KRaftImage | None = None
        self._image = MetadataImage(_EMPTY, _EMPTY, -1, _EMPTY)
        self._topics: dict = {}          # topic id -> (kraft TopicImage, configs mapping, TopicImage)
        self._lock = threading.Lock()    # one refresh at a time; readers never take it
        self.refresh()

    @property
    def kraft_image(self) -> KRaftImage:
        return self._source()

    @property
    def image(self) -> MetadataImage:
        if self._source() is not self._kraft:
            self.refresh()
        return self._image

    @property
    def cluster_token(self):
        return self._source().cluster

    def refresh(self) -> None:
        """Rebuild the handler image from the latest KRaft image (the publisher calls it
        after each publish; readers call it when they see a newer image first)."""
        with self._lock:
            img = self._source()
            if img is not self._kraft:
                self._rebuild(img)

    def _rebuild(self, img) -> None:
        # caller holds self._lock
        prev = self._kraft
        if prev is not None and img.topics is prev.topics and img.configs is prev.configs:
            self._kraft = img          # e.g. a NoOpRecord or a broker heartbeat change: nothing to rebuild
            return
        old = self._topics
        topics, by_id, kept = {}, {}, {}
        for tid, kt in img.topics.by_id.items():
            configs = img.configs.get(TOPIC_RESOURCE, kt.name)
            prev = old.get(tid)
            if prev is not None and prev[0].num_partitions == kt.num_partitions and prev[1] is configs \
                    and prev[0].name == kt.name:
                t = prev[2]
            else:
                t = TopicImage(kt.name, tid, kt.num_partitions, configs)
            kept[tid] = (kt, configs, t)
            topics[kt.name] = t
            by_id[tid] = t
        broker_configs = {n: v for (rt, n), v in img.configs.resources.items() if rt == BROKER_RESOURCE}
        self._topics = kept
        self._image = MetadataImage(MappingProxyType(topics), MappingProxyType(by_id), img.offset,
                                    MappingProxyType(broker_configs))
        self._kraft = img

    def states_token(self, t):
        return self._source().topics.by_id.get(t.topic_id)

    def partition_states(self, t) -> list:
        kt = self._source().topics.by_id.get(t.topic_id)
        if kt is None:
            return [None] * t.num_partitions
        return [kt.partitions.get(p) for p in range(t.num_partitions)]

    def partition_metadata(self, t, states) -> list:
        brokers = self._source().cluster.brokers
        out = []
        for p, reg in enumerate(states):
            if reg is None:
                out.append(MetadataResponsePartition(error_code=ErrorCode.LEADER_NOT_AVAILABLE, partition_index=p,
                                                     leader_id=-1, leader_epoch=-1, replica_nodes=[], isr_nodes=[],
                                                     offline_replicas=[]))
                continue
            offline = [r for r in reg.replicas if (b := brokers.get(r)) is None or b.fenced]
            leader_ok = reg.leader >= 0 and reg.leader not in offline
            out.append(MetadataResponsePartition(
                error_code=ErrorCode.NONE if leader_ok else ErrorCode.LEADER_NOT_AVAILABLE,
                partition_index=p, leader_id=reg.leader if leader_ok else -1, leader_epoch=reg.leader_epoch,
                replica_nodes=list(reg.replicas), isr_nodes=list(reg.isr), offline_replicas=offline))
        return out

    def leader_of(self, topic: str, partition: int):
        kt = self._source().topics.by_name.get(topic)
        reg = None if kt is None else kt.partitions.get(partition)
        return None if reg is None else (reg.leader, reg.leader_epoch)

    def alive_brokers(self, listener_name: str | None = None) -> list:
        out = []
        for b in self._source().cluster.alive_brokers():
            ep = b.listener(listener_name) if listener_name else (b.listeners[0] if b.listeners else None)
            if ep is not None:
                out.append((b.id, ep.host, ep.port, b.rack))
        return out

    def endpoint(self, broker_id: int, listener_name: str | None = None):
        b = self._source().cluster.brokers.get(broker_id)
        if b is None or b.fenced:
            return None
        ep = b.listener(listener_name) if listener_name else (b.listeners[0] if b.listeners else None)
        return None if ep is None else (ep.host, ep.port)

    def client_quotas(self):
        """entity key -> {quota key: value} (DescribeClientQuotas reads it)."""
        return self.kraft_image.client_quotas.entities

    def controller_id(self, alive=None) -> int:
        # Kafka's brokers name a random live broker as "controller": clients cannot reach
        # the KRaft quorum, and admin requests sent to any broker are forwarded
        alive = self.alive_brokers() if alive is None else alive
        return random.choice(alive)[0] if alive else -1

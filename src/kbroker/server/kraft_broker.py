"""KRaftBroker: the broker role of a KRaft node, on the metadata log — first step.

Kafka: ``BrokerServer`` with its ``BrokerMetadataPublisher`` and ``ForwardingManager``.
What runs today:

- :class:`BrokerMetadataListener` follows the committed ``__cluster_metadata`` records
  (the node's RaftManager: an observer on a broker-only node, a voter on a combined one)
  and publishes an immutable :class:`~kbroker.metadata.image.MetadataImage` after each
  committed batch; readers take ``listener.image`` (one reference read, never a lock).
- registration and heartbeats with the active controller (BrokerLifecycleManager over a
  ControllerChannel that asks the raft leader first), unfenced once caught up;
  controlled shutdown on stop;
- on the broker listeners: ApiVersions, Metadata and DescribeCluster answered from the
  image (alive brokers with the endpoint of the request's listener, every partition's
  leader, leader epoch, replicas, ISR and offline replicas), and CreateTopics,
  DeleteTopics, CreatePartitions, IncrementalAlterConfigs, ElectLeaders and
  (Alter|List)PartitionReassignments forwarded to the active controller at the client's version (KIP-590's forwarding, without the Envelope).

Not yet: hosting partitions (Produce, Fetch, groups: the ReplicaManager fed with the
image's local changes comes next), auto topic creation, DescribeConfigs from the image.
ApiVersions lists exactly the APIs above, so clients do not send the others; a request
for another API closes its connection, as Kafka does for an API its listener does not
enable.
"""
from __future__ import annotations

import logging
import random
import threading
import uuid

from kbroker.metadata.delta import MetadataDelta
from kbroker.metadata.image import MetadataImage
from kbroker.metadata.serde import MetadataParseError, deserialize
from kbroker.metadata.snapshot import decode_snapshot
from kbroker.protocol import API_INFO, ApiKey, ErrorCode
from kbroker.protocol.messages.describe_cluster import DescribeClusterBroker, DescribeClusterResponse
from kbroker.protocol.messages.metadata import (
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
)
from kbroker.raft.client import Listener
from kbroker.raft.replicated_log import DATA
from kbroker.server.apis import ApiHandler
from kbroker.server.broker_lifecycle import BrokerLifecycle, BrokerLifecycleManager
from kbroker.server.controller_server import ControllerServer
from kbroker.server.inter_node import ControllerChannel, InterNodeSendThread, StaticNodes
from kbroker.server.request_context import error_response_for

log = logging.getLogger(__name__)

#: admin requests a broker forwards to the active controller
FORWARDED = (ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS,
             ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.ELECT_LEADERS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
             ApiKey.LIST_PARTITION_REASSIGNMENTS)
NOT_REQUESTED = -(2**31)


class BrokerMetadataListener(Listener):
    """Committed metadata records -> the published image. Runs on the raft thread."""

    def __init__(self):
        self.image = MetadataImage()
        self.highest_offset = -1
        self.leader_id = -1
        self.changed = threading.Condition()

    def handle_commit(self, batches) -> None:
        delta = MetadataDelta(self.image)
        last = self.highest_offset
        for b in batches:
            if b.control_type == DATA:
                for i, value in enumerate(b.records):
                    try:
                        delta.replay(deserialize(value), b.base_offset + i, b.epoch)
                    except MetadataParseError as e:
                        log.error("metadata record at offset %d cannot be decoded, skipped: %s", b.base_offset + i, e)
            last = b.last_offset
        self.image = delta.apply()
        with self.changed:
            self.highest_offset = last
            self.changed.notify_all()

    def handle_leader_change(self, leader_id: int, epoch: int) -> None:
        self.leader_id = leader_id

    def handle_load_snapshot(self, snapshot_id, data) -> None:
        """The image becomes the snapshot's content (at start-up, or fetched from the leader
        when this node fell below the leader's log start)."""
        delta = MetadataDelta(MetadataImage())
        for r in decode_snapshot(data):
            delta.replay(r)
        self.image = delta.apply()
        with self.changed:
            self.highest_offset = snapshot_id.offset - 1
            self.changed.notify_all()


class FanOutListener(Listener):
    """One raft Listener calling several (a combined node's controller and broker)."""

    def __init__(self, *listeners):
        self.listeners = [x for x in listeners if x is not None]

    def handle_commit(self, batches) -> None:
        for x in self.listeners:
            x.handle_commit(batches)

    def handle_leader_change(self, leader_id: int, epoch: int) -> None:
        for x in self.listeners:
            x.handle_leader_change(leader_id, epoch)

    def handle_load_snapshot(self, snapshot_id, data) -> None:
        for x in self.listeners:
            x.handle_load_snapshot(snapshot_id, data)


class KRaftBroker:
    def __init__(self, config, cluster_id: str, controllers: dict[int, tuple[str, int]],
                 directory_ids: list[uuid.UUID], listener: BrokerMetadataListener):
        self.config = config
        self.node_id = config.node_id
        self.cluster_id = cluster_id
        self.metadata = listener
        self.directory_ids = directory_ids
        self.controllers = dict(controllers)
        self.controller_nodes = StaticNodes(self.controllers)
        self.sender = InterNodeSendThread(f"broker-{self.node_id}-to-controller", self.controller_nodes,
                                          {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 1000})
        self.controller_channel = ControllerChannel(self.sender, leader_hint=lambda: listener.leader_id)
        names = set(config.controller_listener_names)
        self.listeners = [l for l in config.listeners if l.name not in names]
        self.server: ControllerServer | None = None
        self.lifecycle_manager: BrokerLifecycleManager | None = None

    def learn_controller(self, node_id: int, hp: tuple[str, int]) -> None:
        """A controller's endpoint learnt from the quorum (a broker configured with only
        controller.quorum.bootstrap.servers learns the leader's this way, KIP-853)."""
        self.controllers[node_id] = hp
        self.controller_nodes.set_nodes(self.controllers)

    @property
    def apis(self):
        return self.server.apis

    # -- lifecycle ----------------------------------------------------------------------------
    def startup(self) -> None:
        c = self.config
        self.server = ControllerServer(c, [f"{l.name}://{l.host}:{l.port}" for l in self.listeners],
                                       self._handlers(), target=self)
        self.server.startup()
        adv = {l.name: l for l in c.advertised_listeners}
        endpoints = []
        for l in self.listeners:
            a = adv.get(l.name, l)
            endpoints.append((l.name, a.host or "127.0.0.1", a.port or self.server.bound_port(l.name), 0))
        lc = BrokerLifecycle(node_id=self.node_id, cluster_id=self.cluster_id, listeners=endpoints,
                             features={"metadata.version": (1, 21)}, rack=c["broker.rack"],
                             log_dirs=self.directory_ids, heartbeat_interval_ms=c["broker.heartbeat.interval.ms"],
                             session_timeout_ms=c["broker.session.timeout.ms"],
                             initial_registration_timeout_ms=c["initial.broker.registration.timeout.ms"],
                             metadata_offset=lambda: self.metadata.highest_offset)
        self.lifecycle_manager = BrokerLifecycleManager(lc, self.controller_channel)
        self.lifecycle_manager.start()

        def unfence_when_caught_up():
            if lc.caught_up.wait(c["initial.broker.registration.timeout.ms"] / 1000.0):
                self.lifecycle_manager.set_ready_to_unfence()
        threading.Thread(target=unfence_when_caught_up, name=f"broker-{self.node_id}-unfence", daemon=True).start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if self.lifecycle_manager is not None:
            lc = self.lifecycle_manager.lifecycle
            self.lifecycle_manager.begin_controlled_shutdown()
            lc.shut_down.wait(timeout_s)
            self.lifecycle_manager.close()
        if self.server is not None:
            self.server.shutdown()
        self.sender.close()

    # -- handlers -----------------------------------------------------------------------------
    def _handlers(self) -> dict[int, ApiHandler]:
        def forward(_b, ctx, body):
            self._forward(ctx, body)
        h = {k: ApiHandler(API_INFO[k].min_version, API_INFO[k].max_version, forward) for k in FORWARDED}
        h[ApiKey.METADATA] = ApiHandler(0, 12, lambda _b, ctx, body: self._metadata(ctx, body))
        h[ApiKey.DESCRIBE_CLUSTER] = ApiHandler(0, 1, lambda _b, ctx, body: self._describe_cluster(ctx, body))
        return h

    def _forward(self, ctx, body) -> None:
        def done(resp, exc):
            if exc is not None:
                log.info("forwarding %s to the controller failed: %s", API_INFO[ctx.api_key].name, exc)
                err = error_response_for(ctx.api_key, ctx.api_version, ErrorCode.REQUEST_TIMED_OUT, body)
                if err is None:
                    ctx.close_connection()
                else:
                    ctx.respond(err)
                return
            ctx.respond(resp)
        self.controller_channel.send(ctx.api_key, body, done, timeout_s=30.0, per_try_timeout_s=5.0,
                                     version=ctx.api_version)

    def _alive_endpoints(self, image, listener_name: str):
        out = []
        for b in image.cluster.alive_brokers():
            ep = b.listener(listener_name)
            if ep is not None:
                out.append((b, ep))
        return out

    def _controller_id(self, alive) -> int:
        # Kafka's brokers name a random live broker as "controller": clients cannot reach
        # the KRaft quorum, and admin requests sent to any broker are forwarded
        return random.choice(alive)[0].id if alive else -1

    def _metadata(self, ctx, req) -> None:
        v = ctx.api_version
        img = self.metadata.image
        alive = self._alive_endpoints(img, ctx.request.listener_name)
        alive_ids = {b.id for b, _ in alive}
        resp = MetadataResponse(throttle_time_ms=0, cluster_id=self.cluster_id,
                                controller_id=self._controller_id(alive),
                                brokers=[MetadataResponseBroker(node_id=b.id, host=ep.host, port=ep.port, rack=b.rack)
                                         for b, ep in alive], topics=[],
                                cluster_authorized_operations=NOT_REQUESTED)
        if req.topics is None or (v == 0 and not req.topics):
            wanted = [(t, t.name) for _, t in sorted(img.topics.by_name.items())]
        else:
            wanted = []
            for rt in req.topics:
                if rt.name is None:
                    t = img.topics.by_id.get(rt.topic_id)
                    wanted.append((t, None if t is None else t.name))
                else:
                    wanted.append((img.topics.by_name.get(rt.name), rt.name))
        for t, name in wanted:
            if t is None:
                resp.topics.append(MetadataResponseTopic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name,
                                                         is_internal=False, partitions=[],
                                                         topic_authorized_operations=NOT_REQUESTED))
                continue
            parts = []
            for pid, p in sorted(t.partitions.items()):
                parts.append(MetadataResponsePartition(
                    error_code=ErrorCode.LEADER_NOT_AVAILABLE if p.leader < 0 else ErrorCode.NONE,
                    partition_index=pid, leader_id=p.leader, leader_epoch=p.leader_epoch,
                    replica_nodes=list(p.replicas), isr_nodes=list(p.isr),
                    offline_replicas=[r for r in p.replicas if r not in alive_ids]))
            resp.topics.append(MetadataResponseTopic(error_code=ErrorCode.NONE, name=t.name, topic_id=t.topic_id,
                                                     is_internal=t.is_internal, partitions=parts,
                                                     topic_authorized_operations=NOT_REQUESTED))
        ctx.respond(resp)

    def _describe_cluster(self, ctx, req) -> None:
        v = ctx.api_version
        img = self.metadata.image
        resp = DescribeClusterResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
                                       cluster_id=self.cluster_id, controller_id=-1, brokers=[],
                                       cluster_authorized_operations=NOT_REQUESTED)
        endpoint_type = req.endpoint_type if v >= 1 else 1
        if endpoint_type != 1:
            resp.error_code = ErrorCode.MISMATCHED_ENDPOINT_TYPE if endpoint_type == 2 else \
                ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
            resp.error_message = ("The request was sent to an endpoint of type BROKER, but we wanted an endpoint "
                                  "of type CONTROLLER" if endpoint_type == 2 else
                                  f"Unsupported endpoint type {endpoint_type}")
        else:
            alive = self._alive_endpoints(img, ctx.request.listener_name)
            resp.brokers = [DescribeClusterBroker(broker_id=b.id, host=ep.host, port=ep.port, rack=b.rack)
                            for b, ep in alive]
            resp.controller_id = self._controller_id(alive)
        if v >= 1:
            resp.endpoint_type = 1
        ctx.respond(resp)

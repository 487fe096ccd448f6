"""KRaftBroker: the broker role of a KRaft node — hosts partitions, serves the data plane.

Kafka: ``BrokerServer`` with ``BrokerMetadataPublisher``, ``KRaftMetadataCache``,
``ForwardingManager``, ``AutoTopicCreationManager`` and ``RPCProducerIdManager``.

- :class:`BrokerMetadataListener` follows the committed ``__cluster_metadata`` records
  (the node's RaftManager: an observer on a broker-only node, a voter on a combined one)
  and publishes an immutable :class:`~kbroker.metadata.image.MetadataImage` after each
  committed batch, handing each installed publisher the batch's delta; readers take
  ``listener.image`` (one reference read, never a lock).
- The data plane is the zero-config broker's: LogManager, ReplicaManager, purgatories, the
  group coordinator, SocketServer + KafkaApis + request handler pool with the same
  handler modules. Handlers read :class:`~kbroker.server.metadata_cache.KRaftMetadataCache`
  (``broker.metadata_cache``): topics, leaders, leader epochs, replicas, ISR, offline
  replicas, alive brokers on the request's listener, configs — all from the image.
- :class:`~kbroker.server.kraft_publisher.BrokerMetadataPublisher` applies each image's
  local changes to the ReplicaManager (stop/delete, become leader, become follower: Kafka's
  ``ReplicaManager.applyDelta``), loads/unloads the ``__consumer_offsets`` partitions this
  node starts/stops leading, and applies topic and broker configs to the logs.
- Mutating admin requests (CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs,
  IncrementalAlterConfigs, ElectLeaders, AlterPartitionReassignments, and
  ListPartitionReassignments) are forwarded to the active controller at the client's version
  (KIP-590's forwarding, without the Envelope); auto topic creation and ``__consumer_offsets``
  (on first FindCoordinator) are CreateTopics sent to the controller; producer ids come in
  blocks from AllocateProducerIds (unique cluster-wide).
- Registration and heartbeats (BrokerLifecycleManager over a ControllerChannel that asks
  the raft leader first); Kafka's start-up order: listeners bound, registered, caught up
  with the metadata log, first publish, the broker asks to be unfenced, and once the
  controller has unfenced it requests are processed (before that, connections are
  accepted and their requests wait: a Metadata answer would list no live broker, not
  even this one); controlled shutdown on stop.

- Replication (kbroker.server.replica_manager's docstring): leaders answer followers'
  Fetch requests and send ISR changes to the controller (AlterPartitionSender over the
  controller channel), a scheduler task shrinks ISRs every replica.lag.time.max.ms / 2,
  and the ReplicaFetcherManager's threads feed the logs this broker follows. On
  shutdown the fetchers stop once the controller granted the controlled shutdown.
  Every broker-to-broker connection (fetchers, markers, verifications) goes to the other
  broker's ``inter.broker.listener.name`` endpoint with ``config.inter_broker_client_config()``.

- SCRAM: the SASL servers of the broker listeners read the credentials of the published
  image (``scram_credentials``, updated by the publisher: Kafka's ScramPublisher);
  AlterUserScramCredentials is forwarded to the controller, DescribeUserScramCredentials is
  answered from the image.

- Transactions: the transaction coordinator is the zero-config broker's, over the
  ``__transaction_state`` partitions this broker leads (created through the controller
  on the first FindCoordinator(TRANSACTION)); markers and KIP-890 verifications go over
  the wire to the brokers the metadata names.

Not yet: the metrics endpoint (``kbroker.metrics.port``).
"""
from __future__ import annotations

import logging
import threading
import uuid

from kbroker.metadata.delta import MetadataDelta, image_delta
from kbroker.metadata.image import MetadataImage
from kbroker.metadata.serde import MetadataParseError, deserialize
from kbroker.metadata.snapshot import decode_snapshot
from kbroker.protocol import API_INFO, ApiKey, ErrorCode
from kbroker.raft.client import Listener
from kbroker.raft.replicated_log import DATA
from kbroker.log.manager import LogManager
from kbroker.network.socket_server import SocketServer
from kbroker.quota.manager import QuotaManagers
from kbroker.protocol.messages.create_topics import CreatableTopic, CreatableTopicConfig, CreateTopicsRequest
from kbroker.server import schema_validation
from kbroker.security.authorizer import StandardAuthorizer
from kbroker.security.credentials import PublishedScramCredentials
from kbroker.server.apis import ApiHandler
from kbroker.server.features import SUPPORTED as SUPPORTED_FEATURES
from kbroker.server.authz import authz
from kbroker.server.forward_authz import authorize_forwarded
from kbroker.server.apis.topics import quota_forwarded
from kbroker.server.broker_lifecycle import BrokerLifecycle, BrokerLifecycleManager
from kbroker.server.dynamic_config import DynamicBrokerConfig, log_props
from kbroker.server.fetch_session import FetchSessionCache
from kbroker.server.inter_node import ControllerChannel, InterNodeSendThread, StaticNodes
from kbroker.server.kafka_apis import KafkaApis, collect_handlers
from kbroker.server.kraft_publisher import BrokerMetadataPublisher
from kbroker.server.metadata_cache import KRaftMetadataCache
from kbroker.server.producer_id_manager import RPCProducerIdManager
from kbroker.server.purgatory import DelayedOperationPurgatory
from kbroker.server.replica_fetcher_manager import ReplicaFetcherManager
from kbroker.server.replica_manager import ReplicaManager
from kbroker.server.replication import AlterPartitionSender, MetadataBrokerRegistry
from kbroker.server.request_context import error_response_for
from kbroker.server.request_handler import KafkaRequestHandlerPool
from kbroker.server.topics import TopicError, validate_topic_name

log = logging.getLogger(__name__)

#: admin requests a broker forwards to the active controller
FORWARDED = (ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS,
             ApiKey.INCREMENTAL_ALTER_CONFIGS, ApiKey.ALTER_CONFIGS, ApiKey.ELECT_LEADERS,
             ApiKey.ALTER_PARTITION_REASSIGNMENTS, ApiKey.LIST_PARTITION_REASSIGNMENTS,
             ApiKey.ALTER_CLIENT_QUOTAS, ApiKey.UPDATE_FEATURES)
NOT_REQUESTED = -(2**31)


class BrokerMetadataListener(Listener):
    """Committed metadata records -> the published image. Runs on the raft thread."""

    def __init__(self):
        self.image = MetadataImage()
        self.highest_offset = -1
        self.leader_id = -1
        #: True once a snapshot was skipped: the image may lack topics that exist
        self.incomplete = False
        self.changed = threading.Condition()
        #: publishers: ``publish(delta, image)`` after each batch, on the raft thread;
        #: ``_publish_lock`` orders installs against publishes
        self._publishers: list = []
        self._publish_lock = threading.Lock()

    def install(self, publisher) -> None:
        """Add ``publisher``: it first gets ``publish(None, image)`` for the whole current
        image (Kafka's first publish after catch-up), then every later delta, in order."""
        with self._publish_lock:
            publisher.publish(None, self.image)
            self._publishers.append(publisher)

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
        with self._publish_lock:
            self.image = image = delta.apply()
            for p in self._publishers:
                try:
                    p.publish(delta, image)
                except Exception:
                    log.exception("metadata publisher %s failed at offset %d", type(p).__name__, image.offset)
        with self.changed:
            self.highest_offset = last
            self.changed.notify_all()

    def handle_leader_change(self, leader_id: int, epoch: int) -> None:
        self.leader_id = leader_id

    def handle_load_snapshot(self, snapshot_id, data) -> None:
        """The image becomes the snapshot's content (at start-up, or fetched from the leader
        when this node fell below the leader's log start)."""
        loaded = MetadataDelta(MetadataImage())
        for r in decode_snapshot(data):
            loaded.replay(r)
        loaded.offset, loaded.epoch = snapshot_id.offset - 1, snapshot_id.epoch
        new = loaded.apply()
        with self._publish_lock:
            # publishers see what changed from the image they had, removals included
            delta = image_delta(self.image, new)
            self.image = new
            for p in self._publishers:
                try:
                    p.publish(delta, new)
                except Exception:
                    log.exception("metadata publisher %s failed on snapshot %s", type(p).__name__,
                                  tuple(snapshot_id))
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

    def handle_control_append(self, last_offset: int) -> None:
        for x in self.listeners:
            x.handle_control_append(last_offset)



OFFSETS_TOPIC = "__consumer_offsets"


class ForwardingTopicManager:
    """Topic creation a KRaft broker asks the controller for (Kafka's
    AutoTopicCreationManager): CreateTopics sent to the active controller, answered
    asynchronously; the topic appears when its records are published. One request per
    topic in flight."""

    def __init__(self, broker):
        self.broker = broker
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()

    def _create(self, name: str, num_partitions: int, replication_factor: int, configs: dict) -> None:
        with self._lock:
            if name in self._in_flight:
                return
            self._in_flight.add(name)
        req = CreateTopicsRequest(topics=[CreatableTopic(
            name=name, num_partitions=num_partitions, replication_factor=replication_factor, assignments=[],
            configs=[CreatableTopicConfig(name=k, value=v) for k, v in sorted(configs.items())])],
            timeout_ms=30000, validate_only=False)

        def done(resp, exc):
            with self._lock:
                self._in_flight.discard(name)
            if exc is not None:
                log.warning("creating topic %s through the controller failed: %s", name, exc)
                return
            for t in resp.topics:
                if t.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                    log.warning("the controller refused to create topic %s: %s %s", t.name,
                                ErrorCode(t.error_code).name, t.error_message or "")
        self.broker.controller_channel.send(ApiKey.CREATE_TOPICS, req, done, timeout_s=30.0, version=7)

    def auto_create(self, name: str):
        """auto.create.topics.enable: num.partitions and default.replication.factor; None (the
        Metadata handler answers LEADER_NOT_AVAILABLE until the topic is published)."""
        validate_topic_name(name)
        c = self.broker.config
        self._create(name, c["num.partitions"], c["default.replication.factor"], {})
        return None

    def internal_topic_replication_factor(self, key: str, name: str) -> int:
        """The replication factor of an internal topic (``key``: its broker setting).
        Enforced, as Kafka does, when it is set explicitly or once the cluster has that many
        brokers registered (fenced ones too: the controller places replicas on a broker
        that is down when it has to, and it catches up when it returns), so a topic created
        while a broker is down does not keep fewer replicas forever; until the controller
        can place it, FindCoordinator answers COORDINATOR_NOT_AVAILABLE. Only the default,
        on a cluster with fewer registered brokers than it (a development cluster), is
        clamped to them."""
        c = self.broker.config
        rf = c[key]
        registered = len(self.broker.metadata_cache.kraft_image.cluster.brokers)
        if key in c.originals or registered >= rf or registered == 0:
            return rf
        log.warning("%s=%d (the default) but only %d broker(s) are registered: creating %s with replication "
                    "factor %d", key, rf, registered, name, registered)
        return registered

    def create_offsets_topic(self) -> None:
        """``__consumer_offsets`` with offsets.topic.num.partitions and offsets.topic.replication.factor
        (``internal_topic_replication_factor``)."""
        c = self.broker.config
        rf = self.internal_topic_replication_factor("offsets.topic.replication.factor", OFFSETS_TOPIC)
        self._create(OFFSETS_TOPIC, c["offsets.topic.num.partitions"], rf,
                     {"cleanup.policy": "compact", "compression.type": "producer",
                      "segment.bytes": str(c["offsets.topic.segment.bytes"])})

    def create_transaction_state_topic(self) -> None:
        """``__transaction_state`` with transaction.state.log.num.partitions and
        transaction.state.log.replication.factor (``internal_topic_replication_factor``), on
        the first FindCoordinator(TRANSACTION)."""
        from kbroker.coordinator.transaction.coordinator import transaction_state_topic_configs
        c = self.broker.config
        rf = self.internal_topic_replication_factor("transaction.state.log.replication.factor",
                                                    "__transaction_state")
        configs = transaction_state_topic_configs(c)
        if int(configs["min.insync.replicas"]) > rf:
            configs["min.insync.replicas"] = str(rf)
        self._create("__transaction_state", c["transaction.state.log.num.partitions"], rf, configs)

    def create(self, *a, **kw):
        raise TopicError(ErrorCode.NOT_CONTROLLER, "topics are created by the active controller")

    create_internal = create_partitions = delete = create


class KRaftBroker:
    #: __consumer_offsets is created on first FindCoordinator, not at start-up
    offsets_topic_on_demand = True

    def __init__(self, config, cluster_id: str, controllers: dict[int, tuple[str, int]],
                 directory_ids: list[uuid.UUID], listener: BrokerMetadataListener):
        self.config = config
        self.node_id = config.node_id
        self.cluster_id = cluster_id
        self.metadata_listener = listener
        self.metadata_cache = KRaftMetadataCache(lambda: listener.image)
        self.metadata = self.metadata_cache       # what handlers read ``.image`` from
        self.directory_ids = directory_ids
        self.controllers = dict(controllers)
        self.controller_nodes = StaticNodes(self.controllers)
        to_controller = config.inter_node_client_config(config.controller_listener_names[0],
                                                        "sasl.mechanism.controller.protocol")
        self.sender = InterNodeSendThread(f"broker-{self.node_id}-to-controller", self.controller_nodes,
                                          {**to_controller, "reconnect.backoff.ms": 50,
                                           "reconnect.backoff.max.ms": 1000})
        self.controller_channel = ControllerChannel(self.sender, leader_hint=lambda: listener.leader_id)
        names = set(config.controller_listener_names)
        self.listeners = [l for l in config.listeners if l.name not in names]
        self.socket_server: SocketServer | None = None
        self.handler_pool = None
        self.lifecycle_manager: BrokerLifecycleManager | None = None
        self.group_coordinator = None
        self.transaction_coordinator = None
        self.topic_deletion_hooks: list = []
        self._stopped = False
        #: the I/O threads were started (set once, under _serving_lock): see
        #: maybe_enable_request_processing
        self.serving = False
        self._serving_lock = threading.Lock()
        #: authorizer.class.name: None, or the StandardAuthorizer over the published image's ACLs
        self.authorizer = StandardAuthorizer.from_config(config, lambda: listener.image.acls.index)
        #: the SCRAM credentials of the published image (the publisher updates it); what the
        #: broker listeners' SASL servers and DescribeUserScramCredentials read
        self.scram_credentials = PublishedScramCredentials()
        for l in self.listeners:
            security = config.listener_security.get(l.name)
            if security is not None and security.sasl is not None:
                security.sasl.scram_credentials = self.scram_credentials

    # -- what handlers use ------------------------------------------------------------------
    @property
    def advertised_endpoint(self) -> tuple[str, int]:
        adv = {l.name: l for l in self.config.advertised_listeners}
        l = self.listeners[0]
        a = adv.get(l.name, l)
        return (a.host or "127.0.0.1", a.port or self.socket_server.bound_port(l.name))

    def endpoint(self, listener_name: str | None = None) -> tuple[str, int]:
        """(host, port) advertised for ``listener_name`` (the listener a request came in on),
        else the first broker listener's."""
        adv = {l.name: l for l in self.config.advertised_listeners}
        l = next((x for x in self.listeners if x.name == listener_name), self.listeners[0])
        a = adv.get(l.name, l)
        return (a.host or "127.0.0.1", a.port or self.socket_server.bound_port(l.name))

    def acl_index(self):
        """The ACLs now in force: those of the published image (AccessControlEntryRecords)."""
        return self.metadata_listener.image.acls.index

    def forward_to_controller(self, ctx, body) -> None:
        """Send an (already authorized) admin request to the active controller and answer with its reply."""
        self._forward(ctx, body)

    def learn_controller(self, node_id: int, hp: tuple[str, int]) -> None:
        """A controller's endpoint learnt from the quorum (a broker configured with only
        controller.quorum.bootstrap.servers learns the leader's this way, KIP-853)."""
        self.controllers[node_id] = hp
        self.controller_nodes.set_nodes(self.controllers)

    @property
    def node(self) -> tuple[int, str, int]:
        host, port = self.advertised_endpoint
        return (self.node_id, host, port)

    @property
    def server(self):
        """The broker listeners' SocketServer (``bound_port``)."""
        return self.socket_server

    # -- lifecycle ----------------------------------------------------------------------------
    def startup(self) -> None:
        c = self.config
        self.dynamic_config = DynamicBrokerConfig(c, self.metadata)
        self.quotas = QuotaManagers.from_config(c)      # the publisher sets the image's quotas
        self.log_manager = LogManager.from_broker_config(log_props(self.dynamic_config.current),
                                                         topic_overrides=self._topic_overrides)
        self.log_manager.startup()
        self.produce_purgatory = DelayedOperationPurgatory(
            "Produce", broker_id=self.node_id, purge_interval=c["producer.purgatory.purge.interval.requests"])
        self.fetch_purgatory = DelayedOperationPurgatory(
            "Fetch", broker_id=self.node_id, purge_interval=c["fetch.purgatory.purge.interval.requests"])
        self.replica_manager = ReplicaManager(c, self.log_manager, self.node_id,
                                              self.produce_purgatory, self.fetch_purgatory)
        self.replica_manager.metadata_cache = self.metadata_cache
        self.replica_manager.schema_validator = schema_validation.from_config(c)
        self._start_replication()
        self.log_manager.schedule(self.log_manager.checkpoint_high_watermarks,
                                  c["replica.high.watermark.checkpoint.interval.ms"],
                                  c["replica.high.watermark.checkpoint.interval.ms"])
        self.topic_manager = ForwardingTopicManager(self)
        self.fetch_sessions = FetchSessionCache(self.config["max.incremental.fetch.session.cache.slots"])
        from kbroker.server.apis.metadata import TopicMetadataCache
        self.topic_metadata_cache = TopicMetadataCache()
        self.producer_id_manager = RPCProducerIdManager(self.node_id, self.controller_channel,
                                                        broker_epoch=self._broker_epoch)
        # PLAINTEXT only on a KRaft node for now (KafkaConfig refuses other protocols there)
        self.socket_server = SocketServer(c.socket_server_config([f"{l.name}://{l.host}:{l.port}" for l in self.listeners]))
        self.quotas.bind_connection_quotas(self.socket_server.quotas)   # per-IP connection_creation_rate
        self.apis = KafkaApis(self, self.socket_server.channel, self._handlers())
        self.handler_pool = KafkaRequestHandlerPool(self.socket_server.channel, self.apis.handle,
                                                    c["num.io.threads"], self.socket_server.metrics)
        # bind first (registration names the bound ports); requests queue until the first publish
        self.socket_server.start()
        adv = {l.name: l for l in c.advertised_listeners}
        endpoints = []
        for l in self.listeners:
            a = adv.get(l.name, l)
            endpoints.append((l.name, a.host or "127.0.0.1", a.port or self.socket_server.bound_port(l.name), 0))
        lc = BrokerLifecycle(node_id=self.node_id, cluster_id=self.cluster_id, listeners=endpoints,
                             features=dict(SUPPORTED_FEATURES), rack=c["broker.rack"],
                             log_dirs=self.directory_ids, heartbeat_interval_ms=c["broker.heartbeat.interval.ms"],
                             session_timeout_ms=c["broker.session.timeout.ms"],
                             initial_registration_timeout_ms=c["initial.broker.registration.timeout.ms"],
                             metadata_offset=lambda: self.metadata_listener.highest_offset)
        lc.on_unfenced = self.maybe_enable_request_processing
        self.lifecycle_manager = BrokerLifecycleManager(lc, self.controller_channel)
        self.lifecycle_manager.start()
        # Kafka's BrokerServer: wait for the initial catch-up, publish, ask to be unfenced, serve
        if not lc.caught_up.wait(c["initial.broker.registration.timeout.ms"] / 1000.0):
            raise RuntimeError(f"broker {self.node_id} did not catch up with the metadata log within "
                               f"initial.broker.registration.timeout.ms={c['initial.broker.registration.timeout.ms']}")
        from kbroker.coordinator.group.coordinator import build_group_coordinator

        self.group_coordinator = build_group_coordinator(self)
        from kbroker.coordinator.transaction.coordinator import build_transaction_coordinator

        self.transaction_coordinator = build_transaction_coordinator(self)
        self.publisher = BrokerMetadataPublisher(self)
        self.metadata_listener.install(self.publisher)
        # Kafka's BrokerServer enables request processing once the controller has unfenced
        # the broker; until then requests wait in the channel (Metadata would list no live
        # broker, which librdkafka takes as a partial answer and waits on).
        self.lifecycle_manager.set_ready_to_unfence()
        self.maybe_enable_request_processing()

    def maybe_enable_request_processing(self) -> None:
        """Start the I/O threads once the controller has unfenced this incarnation (its
        heartbeat answer) and the published image shows it unfenced (so the first Metadata
        answer lists this broker). Called by the lifecycle thread as the broker is
        unfenced and by the publisher after each publish until then; never after
        ``shutdown`` began. ``_serving_lock`` makes the start happen once."""
        lm = self.lifecycle_manager
        if self.serving or lm is None or not lm.lifecycle.unfenced.is_set():
            return
        reg = self.metadata_listener.image.cluster.brokers.get(self.node_id)
        if reg is None or reg.fenced or reg.incarnation_id != lm.lifecycle.incarnation_id:
            return
        with self._serving_lock:
            if self._stopped or self.serving:
                return
            self.serving = True
            log.info("broker %d is unfenced: processing requests", self.node_id)
            self.handler_pool.start()

    def _start_replication(self) -> None:
        """Wire the ReplicaManager's replication seams: the brokers' registrations, this
        broker's epoch, ISR proposals to the controller, the follower fetchers, and the
        ISR shrink check every replica.lag.time.max.ms / 2 (Kafka's isr-expiration)."""
        c = self.config
        rm = self.replica_manager
        image = lambda: self.metadata_listener.image      # noqa: E731
        rm.broker_registry = MetadataBrokerRegistry(image)
        rm.broker_epoch = self._broker_epoch
        rm.alter_partition = AlterPartitionSender(self.node_id, self._broker_epoch, self.controller_channel)
        self.replica_fetcher_manager = ReplicaFetcherManager(self.node_id, c, image, self._broker_epoch)
        rm.replica_fetcher_manager = self.replica_fetcher_manager
        half = max(1, c["replica.lag.time.max.ms"] // 2)
        self.log_manager.schedule(rm.maybe_shrink_isr, half, half)

    def _broker_epoch(self) -> int:
        lm = self.lifecycle_manager
        return -1 if lm is None else lm.lifecycle.broker_epoch

    def _topic_overrides(self, topic: str):
        t = self.metadata_cache.image.topics.get(topic)
        return dict(t.configs) if t is not None else None

    def bound_port(self, listener_name: str | None = None) -> int:
        return self.socket_server.bound_port(listener_name)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        with self._serving_lock:         # no I/O thread starts after this
            if self._stopped:
                return
            self._stopped = True
        if self.lifecycle_manager is not None:
            lc = self.lifecycle_manager.lifecycle
            self.lifecycle_manager.begin_controlled_shutdown()
            lc.shut_down.wait(timeout_s)
            self.lifecycle_manager.close()
        # the controller moved leadership away (or gave up waiting): stop following
        for name in ("replica_fetcher_manager",):
            part = getattr(self, name, None)
            if part is not None:
                try:
                    part.shutdown()
                except Exception:
                    log.exception("stopping %s failed", name)
        rm = getattr(self, "replica_manager", None)
        if rm is not None and rm.alter_partition is not None:
            rm.alter_partition.close()
        for name, stop in (("socket_server", "stop"), ("handler_pool", "shutdown"),
                           ("transaction_coordinator", "shutdown"), ("group_coordinator", "shutdown"),
                           ("produce_purgatory", "shutdown"), ("fetch_purgatory", "shutdown"),
                           ("log_manager", "shutdown")):
            part = getattr(self, name, None)
            if part is not None:
                try:
                    getattr(part, stop)()
                except Exception:
                    log.exception("stopping %s failed", name)
        verifier = getattr(getattr(self, "replica_manager", None), "txn_verifier", None)
        if verifier is not None:
            verifier.close()
        self.sender.close()

    # -- handlers -----------------------------------------------------------------------------
    def _handlers(self) -> dict[int, ApiHandler]:
        """Every broker API family's handler (the zero-config broker's modules), with the
        admin APIs the controller owns forwarded to it."""
        def forward(_b, ctx, body):
            merge = None
            auth = authz(self, ctx)
            if auth is not None:
                body, merge, answer = authorize_forwarded(auth, ctx, body, self._topic_name)
                if answer is not None:
                    ctx.respond(answer)
                    return
            body, merge = self._quota_forwarded(ctx, body, merge)
            if body is not None:
                self._forward(ctx, body, merge)
        h = collect_handlers()
        for k in FORWARDED:
            h[int(k)] = ApiHandler(API_INFO[k].min_version, API_INFO[k].max_version, forward)
        return h

    def _quota_forwarded(self, ctx, body, merge):
        """The client's controller_mutation_rate around the forward (apis/topics.py):
        (body to forward or None when answered here, merge)."""
        fwd, qmerge, answer = quota_forwarded(ctx, body, self._partition_count, self.config["num.partitions"])
        if answer is not None:
            ctx.respond(answer if merge is None else merge(answer))
            return None, None
        if qmerge is None:
            return fwd, merge
        return fwd, (qmerge if merge is None else (lambda r: merge(qmerge(r))))

    def _partition_count(self, name_or_id):
        topics = self.metadata_listener.image.topics
        t = topics.by_id.get(name_or_id) if not isinstance(name_or_id, str) else topics.by_name.get(name_or_id)
        return None if t is None else len(t.partitions)

    def _topic_name(self, topic_id):
        t = self.metadata_listener.image.topics.by_id.get(topic_id)
        return t.name if t is not None else None

    def _forward(self, ctx, body, merge=None) -> None:
        def done(resp, exc):
            if exc is not None:
                log.info("forwarding %s to the controller failed: %s", API_INFO[ctx.api_key].name, exc)
                err = error_response_for(ctx.api_key, ctx.api_version, ErrorCode.REQUEST_TIMED_OUT, body)
                if err is None:
                    ctx.close_connection()
                else:
                    ctx.respond(err)
                return
            ctx.respond(resp if merge is None else merge(resp))
        self.controller_channel.send(ctx.api_key, body, done, timeout_s=30.0, per_try_timeout_s=5.0,
                                     version=ctx.api_version)

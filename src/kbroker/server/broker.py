"""KafkaBroker: builds the broker's parts, starts them in order, stops them in reverse.

Kafka: ``core/.../server/BrokerServer.scala`` (startup/shutdown ordering).
Start-up: (a KRaft node, process.roles set: its formatted storage is checked, then start-up
stops, since cluster mode does not run yet) meta.properties → MetadataStore (topics, dynamic broker configs) → LogManager
(load + recovery, with the dynamic log defaults) →
ReplicaManager (host every partition) → purgatories → coordinators →
KafkaApis + handler pool → SocketServer (listeners last, so nothing is
accepted before the broker can answer). Shutdown reverses it: stop accepting,
drain in-flight requests, stop handlers, close purgatories, flush and close
logs, write the clean-shutdown marker (LogManager.shutdown).

Every component is required: one that cannot be imported (the group coordinator, a
request handler module) stops start-up with a BrokerStartupError naming it; the broker
never runs without it.
"""
from __future__ import annotations

import logging
import os
import threading

from kbroker.log.checkpoints import META_PROPERTIES, random_uuid, read_meta_properties
from kbroker.log.manager import LogManager
from kbroker.network.socket_server import SocketServer
from kbroker.quota.manager import QuotaManagers
from kbroker.security.authorizer import StandardAuthorizer
from kbroker.server.config import KafkaConfig
from kbroker.server.dynamic_config import DynamicBrokerConfig, log_props
from kbroker.server.fetch_session import FetchSessionCache
from kbroker.server.kafka_apis import KafkaApis
from kbroker.server.metadata import MetadataStore
from kbroker.server.producer_id_manager import ProducerIdManager
from kbroker.server.purgatory import DelayedOperationPurgatory
from kbroker.server.replica_manager import ReplicaManager
from kbroker.server.request_handler import KafkaRequestHandlerPool
from kbroker.server import schema_validation
from kbroker.server.topics import TopicManager

log = logging.getLogger(__name__)


class BrokerStartupError(Exception):
    """A core component could not be loaded; the message names it (one line)."""


def _required(component: str, load):
    """``load()``, or a BrokerStartupError naming ``component`` if its code does not import."""
    try:
        return load()
    except ImportError as e:
        raise BrokerStartupError(f"{component} failed to import: {type(e).__name__}: {e}".replace("\n", " ")) from e


def new_cluster_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): url-safe base64 of 16 random bytes, no padding."""
    return random_uuid()


class KafkaBroker:
    def __init__(self, config: KafkaConfig):
        self.config = config
        self.node_id = config.node_id
        self.cluster_id: str | None = None
        self._stopped = threading.Event()
        self._started = False
        self.topic_deletion_hooks: list = []
        self.group_coordinator = None
        self.transaction_coordinator = None
        self.metrics_server = None
        self.authorizer = None

    # -- what handlers use ---------------------------------------------------------------
    @property
    def advertised_endpoint(self) -> tuple[str, int]:
        return self.endpoint()

    def endpoint(self, listener_name: str | None = None) -> tuple[str, int]:
        """(host, port) advertised for ``listener_name`` (Kafka answers Metadata and
        FindCoordinator with the endpoint of the listener the request came in on), else the
        first advertised listener's."""
        advertised = self.config.advertised_listeners
        adv = next((l for l in advertised if l.name == listener_name), advertised[0])
        port = adv.port
        if port == 0:  # advertise the port actually bound
            port = self.socket_server.bound_port(adv.name)
        return (adv.host or "127.0.0.1", port)

    def acl_index(self):
        """The ACLs now in force (an immutable kbroker.security.authorizer.AclIndex)."""
        return self.metadata.acl_index

    @property
    def node(self) -> tuple[int, str, int]:
        host, port = self.advertised_endpoint
        return (self.node_id, host, port)

    # -- lifecycle --------------------------------------------------------------------------
    def _load_cluster_id(self) -> str:
        configured = self.config["cluster.id"]
        for d in self.config.log_dirs:
            path = os.path.join(d, META_PROPERTIES)
            if os.path.exists(path):
                stored = read_meta_properties(path).get("cluster.id")
                if stored:
                    return stored
        return configured or new_cluster_id()

    def startup(self) -> None:
        c = self.config
        if c.cluster_mode:
            # a KRaft node (process.roles set) is kbroker.server.kraft_node.KRaftNode
            raise BrokerStartupError("process.roles is set: this is a node of a KRaft cluster, which runs as "
                                     "KRaftNode (kbroker serve picks it), not as the zero-config broker")
        for d in c.log_dirs:
            os.makedirs(d, exist_ok=True)
        self.cluster_id = self._load_cluster_id()
        self.metadata = MetadataStore(os.path.abspath(c.log_dirs[0]))
        for security in c.listener_security.values():
            if security.sasl is not None:      # SCRAM credentials live in the metadata
                security.sasl.scram_credentials = self.metadata
        store = self.metadata
        #: authorizer.class.name: None (empty: no authorization) or the StandardAuthorizer over the store's ACLs
        self.authorizer = StandardAuthorizer.from_config(c, lambda: store.acl_index)
        self.dynamic_config = DynamicBrokerConfig(c, self.metadata)
        self.quotas = QuotaManagers.from_config(c)
        self.quotas.update_quotas(self.metadata.client_quotas())
        self.log_manager = LogManager.from_broker_config(log_props(self.dynamic_config.current),
                                                         topic_overrides=self._topic_overrides)
        self.log_manager.ensure_meta_properties(self.node_id, self.cluster_id)
        for t in self.metadata.image.topics.values():
            if t.configs:
                self.log_manager.update_topic_config(t.name, t.configs)
        self.log_manager.startup()
        self.producer_id_manager = ProducerIdManager(os.path.abspath(c.log_dirs[0]), broker_id=self.node_id)
        self.produce_purgatory = DelayedOperationPurgatory(
            "Produce", broker_id=self.node_id, purge_interval=c["producer.purgatory.purge.interval.requests"])
        self.fetch_purgatory = DelayedOperationPurgatory(
            "Fetch", broker_id=self.node_id, purge_interval=c["fetch.purgatory.purge.interval.requests"])
        self.replica_manager = ReplicaManager(c, self.log_manager, self.node_id,
                                              self.produce_purgatory, self.fetch_purgatory,
                                              leader_epoch=self.metadata.start_leadership())
        self.replica_manager.schema_validator = schema_validation.from_config(c)
        with self.log_manager.batched_dir_sync():
            for t in self.metadata.image.topics.values():
                self.replica_manager.apply_topic(t)
        self.log_manager.schedule(self.log_manager.checkpoint_high_watermarks,
                                  c["replica.high.watermark.checkpoint.interval.ms"],
                                  c["replica.high.watermark.checkpoint.interval.ms"])
        hosted = {tp for tp in self.replica_manager.partitions}
        for tp in list(self.log_manager.logs):
            if tp not in hosted:
                log.warning("log %s-%d is on disk but its topic is not in the metadata; not served",
                            tp[0], tp[1])
        self.topic_manager = TopicManager(self)
        self.fetch_sessions = FetchSessionCache(self.config["max.incremental.fetch.session.cache.slots"])
        from kbroker.server.apis.metadata import TopicMetadataCache
        from kbroker.server.metadata_cache import SingleNodeMetadataCache
        self.metadata_cache = SingleNodeMetadataCache(self)
        self.topic_metadata_cache = TopicMetadataCache()
        self._start_coordinators()
        self.socket_server = SocketServer(c.socket_server_config(c.listeners))
        self.quotas.bind_connection_quotas(self.socket_server.quotas)   # per-IP connection_creation_rate
        self.apis = _required("request handlers (kbroker.server.apis)",
                              lambda: KafkaApis(self, self.socket_server.channel))
        self.handler_pool = KafkaRequestHandlerPool(self.socket_server.channel, self.apis.handle,
                                                    c["num.io.threads"], self.socket_server.metrics)
        self._started = True
        self.handler_pool.start()
        if c["kbroker.metrics.port"] >= 0:
            from kbroker.server.metrics import start_metrics_server

            self.metrics_server = start_metrics_server(self, c["kbroker.metrics.port"])
        self.socket_server.start()
        host, port = self.advertised_endpoint
        log.info("kbroker node %d of cluster %s listening on %s (advertised %s:%d), %d partitions",
                 self.node_id, self.cluster_id,
                 ", ".join(f"{l.name}://{l.host}:{self.socket_server.bound_port(l.name)}" for l in c.listeners),
                 host, port, len(self.replica_manager.partitions))

    def _topic_overrides(self, topic: str):
        t = self.metadata.image.topics.get(topic) if hasattr(self, "metadata") else None
        return dict(t.configs) if t is not None else None

    def _start_coordinators(self) -> None:
        def load():
            from kbroker.coordinator.group.coordinator import build_group_coordinator

            return build_group_coordinator

        build_group_coordinator = _required("group coordinator (kbroker.coordinator.group)", load)
        self.group_coordinator = build_group_coordinator(self)

        def load_txn():
            from kbroker.coordinator.transaction.coordinator import build_transaction_coordinator

            return build_transaction_coordinator

        build_transaction_coordinator = _required("transaction coordinator (kbroker.coordinator.transaction)",
                                                  load_txn)
        self.transaction_coordinator = build_transaction_coordinator(self)

    def shutdown(self) -> None:
        """Stop whatever was started, in reverse order (also after a failed start-up)."""
        if self._stopped.is_set():
            return
        log.info("kbroker node %d shutting down", self.node_id)
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        for name, stop in (("socket_server", "stop"), ("handler_pool", "shutdown"),
                           ("transaction_coordinator", "shutdown"), ("group_coordinator", "shutdown"),
                           ("produce_purgatory", "shutdown"),
                           ("fetch_purgatory", "shutdown"), ("log_manager", "shutdown")):
            part = getattr(self, name, None)
            if part is not None:
                getattr(part, stop)()
        self._started = False
        self._stopped.set()
        log.info("kbroker node %d shut down cleanly", self.node_id)

    def wait(self, timeout_s: float | None = None) -> bool:
        return self._stopped.wait(timeout_s)

"""KRaftNode: a node of a KRaft cluster (Kafka's ``KafkaRaftServer``).

One RaftManager (the pure KafkaRaftClient on the metadata log in ``metadata.log.dir``:
a voter on a controller, an observer on a broker-only node) feeds the roles:

- ``controller``: the quorum controller on top of it (QuorumControllerHost), served on
  the listeners named by ``controller.listener.names`` (ControllerServer); SASL controller
  listeners authenticate SCRAM users from the committed metadata image (a ScramPublisher on
  the node's metadata listener, as Kafka's ControllerServer), e.g. brokers with
  ``sasl.mechanism.controller.protocol=SCRAM-SHA-512`` and a user from ``storage format --add-scram``;
- ``broker``: the broker role (KRaftBroker: the metadata image and its publisher, which
  makes the ReplicaManager lead or follow each partition the controller placed here;
  the zero-config broker's data plane and handlers on the broker listeners; registration
  and heartbeats; admin requests, auto topic creation and producer-id blocks through the
  active controller).

Start-up: verify the formatted storage (meta.properties of this node and cluster), open
the metadata log and the quorum-state file, start the raft thread, bind the controller
listeners, then the broker's (which returns once it has caught up with the metadata log,
published it and asked to be unfenced). Shutdown in reverse: the broker's controlled shutdown, stop
accepting, let a leader resign (EndQuorumEpoch), close the log.
"""
from __future__ import annotations

import logging
import os
import threading

from kbroker.controller.result import ControllerConfig
from kbroker.server.config import parse_host_port, parse_voters
from kbroker.server.features import SUPPORTED as SUPPORTED_FEATURES
from kbroker.server.controller_server import ControllerServer
from kbroker.metadata.bootstrap import uuid_from_str
from kbroker.security.credentials import PublishedScramCredentials
from kbroker.server.kraft_broker import BrokerMetadataListener, FanOutListener, KRaftBroker
from kbroker.server.kraft_publisher import ScramPublisher
from kbroker.server.kraft_storage import EnsembleError, read_bootstrap_file, verify_kraft_storage
from kbroker.server.quorum_controller_host import QuorumControllerHost
from kbroker.server.raft_manager import RaftManager, raft_config
from kbroker.server.snapshot_generator import SnapshotGenerator

log = logging.getLogger(__name__)


class KRaftNodeError(Exception):
    """Start-up cannot go on; the message is one line naming the reason."""


class KRaftNode:
    def __init__(self, config):
        self.config = config
        self.node_id = config.node_id
        self.roles = frozenset(config["process.roles"])
        self.cluster_id: str | None = None
        self.raft: RaftManager | None = None
        self.controller: QuorumControllerHost | None = None
        self.controller_server: ControllerServer | None = None
        self.broker_metadata: BrokerMetadataListener | None = None
        self.broker: KRaftBroker | None = None
        self.snapshots: SnapshotGenerator | None = None
        self._stopped = threading.Event()

    def _bootstrap_records(self) -> list | None:
        """The records of ``metadata.log.dir/bootstrap.checkpoint`` (written by ``kbroker
        storage format``: the feature levels a new cluster starts with), if there is one."""
        path = os.path.join(self.config.metadata_log_dir, "bootstrap.checkpoint")
        return read_bootstrap_file(path) if os.path.exists(path) else None

    def startup(self) -> None:
        c = self.config
        try:
            self.cluster_id, ensemble = verify_kraft_storage(c)
        except EnsembleError as e:
            raise KRaftNodeError(str(e).replace("\n", " ")) from None
        voters = parse_voters(c["controller.quorum.voters"])
        bootstrap = [parse_host_port(e) for e in c["controller.quorum.bootstrap.servers"]]
        # KIP-853: a controller without controller.quorum.voters is part of a dynamic quorum:
        # its voter set is in the metadata log (the bootstrap snapshot `kbroker storage format
        # --standalone / --initial-controllers` wrote, then the VotersRecords), or it starts as
        # an observer (--no-initial-controllers) until `kbroker metadata-quorum add-controller`
        meta = ensemble.props.get(c.metadata_log_dir)
        directory_id = uuid_from_str(meta.directory_id) if meta is not None and meta.directory_id else None
        if "controller" in self.roles:
            self.controller = QuorumControllerHost(
                ControllerConfig(cluster_id=self.cluster_id, node_id=self.node_id,
                                 session_timeout_ms=c["broker.session.timeout.ms"],
                                 default_num_partitions=c["num.partitions"],
                                 default_replication_factor=c["default.replication.factor"],
                                 supported_features=dict(SUPPORTED_FEATURES)),
                bootstrap=self._bootstrap_records())
        if "broker" in self.roles:
            self.broker_metadata = BrokerMetadataListener()
        # the controller listeners' SCRAM credentials: the committed image's (a controller-only
        # node follows the image only when one of them takes SASL)
        controller_metadata = None
        sasl = [sec.sasl for n in c.controller_listener_names if "controller" in self.roles
                if (sec := c.listener_security.get(n)) is not None and sec.sasl is not None]
        if sasl:
            creds = PublishedScramCredentials()
            for s in sasl:
                s.scram_credentials = creds
            controller_metadata = (self.broker_metadata if self.broker_metadata is not None
                                   else BrokerMetadataListener())
            controller_metadata.install(ScramPublisher(creds))
        self.snapshots = SnapshotGenerator(
            self.node_id, c["metadata.log.max.record.bytes.between.snapshots"],
            c["metadata.log.max.snapshot.interval.ms"],
            on_written=[self.controller.snapshot_written] if self.controller is not None else [])
        self.raft = RaftManager(node_id=self.node_id, voters=voters, cluster_id=self.cluster_id,
                                metadata_log_dir=c.metadata_log_dir,
                                listener=FanOutListener(self.controller, self.broker_metadata,
                                                        None if controller_metadata is self.broker_metadata
                                                        else controller_metadata, self.snapshots),
                                config=raft_config(c), bootstrap_servers=[] if voters else bootstrap,
                                on_endpoint=self._learned_endpoint, directory_id=directory_id,
                                listener_name=c.controller_listener_names[0] if c.controller_listener_names else "",
                                local_endpoints=[(l.name, l.host or "localhost", l.port)
                                                 for l in c.advertised_controller_listeners]
                                if "controller" in self.roles else (),
                                followers_always_flush="controller" in self.roles,
                                client_config=c.inter_node_client_config(
                                    c.controller_listener_names[0], "sasl.mechanism.controller.protocol")
                                if c.controller_listener_names else None)
        self.snapshots.attach(self.raft)
        if self.controller is not None:
            self.controller.attach(self.raft)
        self.raft.start()
        if self.controller is not None:
            listeners = [f"{l.name}://{l.host}:{l.port}" for l in c.controller_listeners]
            self.controller_server = ControllerServer(c, listeners,
                                                      {**self.raft.handlers, **self.controller.handlers},
                                                      target=self)
            self.controller_server.startup()
            log.info("kbroker node %d of cluster %s: controller listening on %s, voters %s",
                     self.node_id, self.cluster_id,
                     ", ".join(f"{l.name}://{l.host}:{self.controller_server.bound_port(l.name)}"
                               for l in c.controller_listeners), sorted(self.raft.client.voters))
        if self.broker_metadata is not None:
            dirs = []
            for d in c.log_dirs:
                mp = ensemble.props.get(d)
                if mp is not None and mp.directory_id:
                    dirs.append(uuid_from_str(mp.directory_id))
            self.broker = KRaftBroker(c, self.cluster_id, voters, dirs, self.broker_metadata)
            for i, hp in list(self.raft.endpoints.items()):   # what the raft thread learnt already
                if i >= 0:
                    self.broker.learn_controller(i, hp)
            self.broker.startup()
            log.info("kbroker node %d of cluster %s: broker listening on %s", self.node_id, self.cluster_id,
                     ", ".join(f"{l.name}://{l.host}:{self.broker.server.bound_port(l.name)}"
                               for l in self.broker.listeners))

    def _learned_endpoint(self, node_id: int, hp) -> None:
        if self.broker is not None:
            self.broker.learn_controller(node_id, hp)

    def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        log.info("kbroker node %d shutting down", self.node_id)
        if self.broker is not None:
            self.broker.shutdown()
        if self.controller_server is not None:
            self.controller_server.shutdown()
        if self.raft is not None:
            self.raft.shutdown()
        self._stopped.set()
        log.info("kbroker node %d shut down cleanly", self.node_id)

"""KRaftNode: a node of a KRaft cluster (Kafka's ``KafkaRaftServer``).

Today it runs the ``controller`` role: the quorum that keeps ``__cluster_metadata``
(RaftManager: the pure KafkaRaftClient on the metadata log in ``metadata.log.dir``) and
the quorum controller on top of it (QuorumControllerHost), served on the listeners named
by ``controller.listener.names`` (ControllerServer). The broker role joins it next
(registration through BrokerLifecycleManager, the metadata image published to the
ReplicaManager); until then a node whose roles include ``broker`` stops at start-up with
a one-line message (KafkaBroker._check_kraft_storage).

Start-up: verify the formatted storage (meta.properties of this node and cluster), open
the metadata log and the quorum-state file, start the raft thread, then bind the
controller listeners. Shutdown: stop accepting, let a leader resign (EndQuorumEpoch),
close the log.
"""
from __future__ import annotations

import logging
import os
import threading

from kbroker.controller.result import ControllerConfig
from kbroker.server.config import parse_voters
from kbroker.server.controller_server import ControllerServer
from kbroker.server.kraft_storage import EnsembleError, read_bootstrap_file, verify_kraft_storage
from kbroker.server.quorum_controller_host import QuorumControllerHost
from kbroker.server.raft_manager import RaftManager, raft_config

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
        self._stopped = threading.Event()

    def _metadata_version(self) -> int | None:
        path = os.path.join(self.config.metadata_log_dir, "bootstrap.checkpoint")
        if not os.path.exists(path):
            return None
        for r in read_bootstrap_file(path):
            if getattr(r.message, "name", None) == "metadata.version":
                return r.message.feature_level
        return None

    def startup(self) -> None:
        c = self.config
        if "broker" in self.roles:
            raise KRaftNodeError("process.roles=%s: the broker role of a KRaft cluster is not yet supported "
                                 "(controller-only nodes run)" % ",".join(c["process.roles"]))
        try:
            self.cluster_id, _ = verify_kraft_storage(c)
        except EnsembleError as e:
            raise KRaftNodeError(str(e).replace("\n", " ")) from None
        voters = parse_voters(c["controller.quorum.voters"])
        if not voters:
            raise KRaftNodeError("controller.quorum.voters: a controller needs the static voter set "
                                 "(controller.quorum.bootstrap.servers alone is not supported yet)")
        self.controller = QuorumControllerHost(
            ControllerConfig(cluster_id=self.cluster_id, node_id=self.node_id,
                             session_timeout_ms=c["broker.session.timeout.ms"],
                             default_num_partitions=c["num.partitions"],
                             default_replication_factor=c["default.replication.factor"]),
            metadata_version=self._metadata_version())
        self.raft = RaftManager(node_id=self.node_id, voters=voters, cluster_id=self.cluster_id,
                                metadata_log_dir=c.metadata_log_dir, listener=self.controller,
                                config=raft_config(c))
        self.controller.attach(self.raft)
        self.raft.start()
        listeners = [f"{l.name}://{l.host}:{l.port}" for l in c.controller_listeners]
        self.controller_server = ControllerServer(c, listeners, {**self.raft.handlers, **self.controller.handlers},
                                                  target=self)
        self.controller_server.startup()
        log.info("kbroker node %d (roles %s) of cluster %s: controller listening on %s, voters %s",
                 self.node_id, ",".join(sorted(self.roles)), self.cluster_id,
                 ", ".join(f"{l.name}://{l.host}:{self.controller_server.bound_port(l.name)}"
                           for l in c.controller_listeners), sorted(voters))

    def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        log.info("kbroker node %d shutting down", self.node_id)
        if self.controller_server is not None:
            self.controller_server.shutdown()
        if self.raft is not None:
            self.raft.shutdown()
        self._stopped.set()
        log.info("kbroker node %d shut down cleanly", self.node_id)

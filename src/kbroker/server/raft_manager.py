"""RaftManager: a KafkaRaftClient hosted on its own thread, over real sockets and disk.

Kafka: ``core/.../raft/RaftManager.scala`` (KafkaRaftManager) and ``KafkaNetworkChannel``.
The pure client (``kbroker.raft.client``) decides; this module does its I/O:

- the metadata log is ``<metadata.log.dir>/__cluster_metadata-0`` on our own Log
  (KafkaMetadataLog) and the vote/epoch state is ``<metadata.log.dir>/quorum-state``;
- inbound quorum RPCs arrive on the controller listener (ControllerServer handler
  threads call ``handle_request``) and are answered when the client says so — a parked
  Fetch (long poll) later, from this thread;
- outbound requests go through an InterNodeSendThread to the voters'
  ``controller.quorum.voters`` endpoints; their answers come back to this thread;
- every call into the client and its Listener runs on this one thread ("raft-io"), so
  the client and whatever the listener drives (the quorum controller) need no locks.
  Other threads hand work over with ``submit(fn)``.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import threading
import time

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.raft import messages as M
from kbroker.raft.client import KafkaRaftClient, Listener, RaftConfig
from kbroker.raft.kafka_log import KafkaMetadataLog
from kbroker.raft.messages import Inbound
from kbroker.raft.quorum_state import FileQuorumStateStore
from kbroker.server.apis import ApiHandler
from kbroker.server.inter_node import InterNodeSendThread, StaticNodes

log = logging.getLogger(__name__)

#: the quorum RPCs, with the versions our client speaks (kbroker.raft.messages.VERSIONS)
RAFT_APIS = {
    ApiKey.VOTE: 1, ApiKey.BEGIN_QUORUM_EPOCH: 1, ApiKey.END_QUORUM_EPOCH: 1,
    ApiKey.FETCH: 17, ApiKey.FETCH_SNAPSHOT: 1, ApiKey.DESCRIBE_QUORUM: 1,
}
#: what the controller listener serves besides (KIP-853; DescribeQuorum 0..2 for admin tools)
SERVED_APIS = {
    **{k: (v, v) for k, v in RAFT_APIS.items()},
    ApiKey.DESCRIBE_QUORUM: (0, 2),
    ApiKey.ADD_RAFT_VOTER: (0, 0), ApiKey.REMOVE_RAFT_VOTER: (0, 0), ApiKey.UPDATE_RAFT_VOTER: (0, 0),
}
_API_OF = {req: key for key, req in (
    (ApiKey.VOTE, M.vm.VoteRequest), (ApiKey.BEGIN_QUORUM_EPOCH, M.bqe.BeginQuorumEpochRequest),
    (ApiKey.END_QUORUM_EPOCH, M.eqe.EndQuorumEpochRequest), (ApiKey.FETCH, M.fm.FetchRequest),
    (ApiKey.FETCH_SNAPSHOT, M.fs.FetchSnapshotRequest), (ApiKey.DESCRIBE_QUORUM, M.dq.DescribeQuorumRequest))}


def _source_of(req) -> int:
    """The node a quorum request comes from, as its fields say (-1 when none does)."""
    if isinstance(req, M.fm.FetchRequest):
        return M.fetch_replica_id(req)
    if isinstance(req, M.fs.FetchSnapshotRequest):
        return req.replica_id
    if isinstance(req, M.vm.VoteRequest):
        for t in req.topics:
            for p in t.partitions:
                return p.candidate_id
    if isinstance(req, M.bqe.BeginQuorumEpochRequest):
        for t in req.topics:
            for p in t.partitions:
                return p.leader_id
    if isinstance(req, M.eqe.EndQuorumEpochRequest):
        for t in req.topics:
            for p in t.partitions:
                return p.leader_id
    return -1


def raft_config(c) -> RaftConfig:
    """RaftConfig from a KafkaConfig's ``controller.quorum.*`` keys."""
    return RaftConfig(election_timeout_ms=c["controller.quorum.election.timeout.ms"],
                      fetch_timeout_ms=c["controller.quorum.fetch.timeout.ms"],
                      election_backoff_max_ms=c["controller.quorum.election.backoff.max.ms"],
                      request_timeout_ms=c["controller.quorum.request.timeout.ms"],
                      retry_backoff_ms=c["controller.quorum.retry.backoff.ms"],
                      append_linger_ms=c["controller.quorum.append.linger.ms"])


class RaftManager:
    def __init__(self, *, node_id: int, voters: dict[int, tuple[str, int]], cluster_id: str,
                 metadata_log_dir: str, listener: Listener, config: RaftConfig | None = None,
                 seed: int | None = None, bootstrap_servers=(), on_endpoint=None, directory_id=None,
                 listener_name: str = "", local_endpoints=(), followers_always_flush: bool = False,
                 client_config: dict | None = None):
        self.node_id = node_id
        #: the static voters (controller.quorum.voters); a dynamic quorum's come from the log
        self.voters = dict(voters)
        self.listener_name = listener_name
        #: every endpoint this node can reach a quorum node at: the voters, the bootstrap
        #: servers under ids -2, -3, ... (Kafka's numbering), and leaders learnt from the
        #: NodeEndpoints of Fetch / FetchSnapshot responses (KIP-853)
        self.endpoints = dict(self.voters)
        for name, host, port in local_endpoints:
            if name == listener_name and node_id not in self.endpoints:
                self.endpoints[node_id] = (host, port)     # named as the leader in our answers
        bootstrap_ids = []
        for i, hp in enumerate(bootstrap_servers):
            self.endpoints[-2 - i] = hp
            bootstrap_ids.append(-2 - i)
        self.on_endpoint = on_endpoint          # called (node id, (host, port)) when one is learnt
        os.makedirs(metadata_log_dir, exist_ok=True)
        self.metadata_log = KafkaMetadataLog.open(metadata_log_dir)
        store = FileQuorumStateStore(os.path.join(metadata_log_dir, FileQuorumStateStore.FILE_NAME))
        kw = {} if directory_id is None else {"directory_id": directory_id}
        self.client = KafkaRaftClient(node_id, self.voters, cluster_id, self.metadata_log, store,
                                      listener, random.Random(seed), config, bootstrap_ids=bootstrap_ids,
                                      listener_name=listener_name, endpoints=local_endpoints,
                                      followers_always_flush=followers_always_flush, **kw)
        self._voters_version = -1
        self.nodes = StaticNodes(self.endpoints)
        # client_config: the controller listener's security (KafkaConfig.inter_node_client_config)
        self.sender = InterNodeSendThread(f"raft-{node_id}-send", self.nodes,
                                          {**(client_config or {}),
                                           "request.timeout.ms": (config or RaftConfig()).request_timeout_ms})
        self._cond = threading.Condition()
        self._inbox: list = []                 # callables to run on the raft thread
        self._timers: list = []                # heap of (due ms, seq, callable), raft thread only
        self._answer_to: dict[int, object] = {}  # our correlation id -> RequestContext (raft thread only)
        self._corr = itertools.count(1)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"raft-{node_id}-io", daemon=True)
        self.started = threading.Event()

    # -- other threads ----------------------------------------------------------------------
    @staticmethod
    def now_ms() -> int:
        return time.monotonic_ns() // 1_000_000

    def start(self) -> None:
        self.submit(lambda: self._dispatch(self.client.start(self.now_ms())))
        self._thread.start()

    def submit(self, fn) -> None:
        """Run ``fn()`` on the raft thread (it may call into the client)."""
        with self._cond:
            self._inbox.append(fn)
            self._cond.notify()

    def submit_later(self, delay_ms: int, fn) -> None:
        """Run ``fn()`` on the raft thread ``delay_ms`` from now (call from the raft thread)."""
        heapq.heappush(self._timers, (self.now_ms() + delay_ms, next(self._corr), fn))

    def handle_request(self, ctx, body) -> None:
        """A quorum RPC from a ControllerServer handler thread; answered from the raft thread."""
        self.submit(lambda: self._on_request(ctx, body))

    @property
    def handlers(self) -> dict[int, ApiHandler]:
        """ControllerServer handlers for the quorum RPCs (exactly the versions we speak)."""
        def handle(_target, ctx, body):
            self.handle_request(ctx, body)

        def describe_cluster(_target, ctx, body):
            self.submit(lambda: ctx.respond(self._describe_cluster(ctx, body)))
        out = {key: ApiHandler(lo, hi, handle) for key, (lo, hi) in SERVED_APIS.items()}
        out[ApiKey.DESCRIBE_CLUSTER] = ApiHandler(0, 1, describe_cluster)
        return out

    def _describe_cluster(self, ctx, body):
        """DescribeCluster on a controller listener (KIP-919): the cluster id, the quorum
        leader as controller id and the voters as the nodes (raft thread)."""
        from kbroker.protocol.messages import describe_cluster as dc

        if ctx.api_version >= 1 and body.endpoint_type != 2:
            return dc.DescribeClusterResponse(error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
                                              error_message="The request was sent to an endpoint of type "
                                                            "CONTROLLER, but we wanted an endpoint of type BROKER",
                                              endpoint_type=2, cluster_id=self.client.cluster_id)
        nodes = []
        for node_id in sorted(self.client.voters):
            hp = self.endpoints.get(node_id)
            if hp is None and node_id == self.node_id:
                node = self.client.voter_set.nodes.get(node_id)
                hp = node.address(self.listener_name) if node is not None else None
            if hp is not None:
                nodes.append(dc.DescribeClusterBroker(broker_id=node_id, host=hp[0], port=hp[1]))
        return dc.DescribeClusterResponse(endpoint_type=2, cluster_id=self.client.cluster_id,
                                          controller_id=self.client.quorum.leader_id, brokers=nodes)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Graceful: a leader resigns (EndQuorumEpoch) before the thread stops."""
        done = threading.Event()

        def resign():
            try:
                self._dispatch(self.client.shutdown(self.now_ms()))
            finally:
                done.set()

        if self._thread.is_alive():
            self.submit(resign)
            done.wait(timeout_s)
            time.sleep(0.05)          # let the EndQuorumEpoch requests leave
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.sender.close()
        try:
            self.metadata_log.log.close()
        except Exception:
            log.exception("closing the metadata log failed")

    # -- the raft thread --------------------------------------------------------------------
    def _on_request(self, ctx, body) -> None:
        corr = next(self._corr)
        self._answer_to[corr] = ctx
        self._dispatch(self.client.handle(self.now_ms(), Inbound(_source_of(body), corr, body)))

    def _on_response(self, dest: int, corr: int, resp, exc) -> None:
        if exc is not None:
            log.debug("raft request to node %d failed: %s", dest, exc)
            return   # the client times the request out itself
        for ep in getattr(resp, "node_endpoints", None) or ():
            self._learn(ep.node_id, (ep.host, ep.port))
        self._dispatch(self.client.handle(self.now_ms(), Inbound(dest, corr, resp)))

    def _learn(self, node_id: int, hp: tuple[str, int]) -> None:
        if node_id < 0 or self.endpoints.get(node_id) == hp:
            return
        log.info("node %d: quorum node %d is at %s:%d", self.node_id, node_id, hp[0], hp[1])
        self.endpoints[node_id] = hp
        self.nodes.set_nodes(self.endpoints)
        if self.on_endpoint is not None:
            self.on_endpoint(node_id, hp)

    def _with_leader_endpoint(self, msg):
        """KIP-853: Fetch and FetchSnapshot responses name the current leader's endpoint,
        so an observer that came in through a bootstrap server can reach it."""
        if isinstance(msg, M.fm.FetchResponse):
            parts, cls = [p for t in msg.responses for p in t.partitions], M.fm.NodeEndpoint
        elif isinstance(msg, M.fs.FetchSnapshotResponse):
            parts, cls = [p for t in msg.topics for p in t.partitions], M.fs.NodeEndpoint
        else:
            return msg
        for p in parts:
            lid = p.current_leader.leader_id
            hp = self.endpoints.get(lid) if lid >= 0 else None
            if hp is not None:
                msg.node_endpoints = [cls(node_id=lid, host=hp[0], port=hp[1])]
                break
        return msg

    def _sync_voter_endpoints(self) -> None:
        """KIP-853: the voters' endpoints come with the voter set (VotersRecord); reach them
        on our controller listener."""
        c = self.client
        if c.voters_version == self._voters_version:
            return
        self._voters_version = c.voters_version
        for node in c.voter_set.nodes.values():
            hp = node.address(self.listener_name) or node.address()
            if hp is not None:
                self._learn(node.node_id, hp)

    def _dispatch(self, outs) -> None:
        self._sync_voter_endpoints()
        for o in outs:
            if o.is_request:
                key = _API_OF[type(o.message)]

                def done(resp, exc, dest=o.destination, corr=o.correlation_id):
                    self.submit(lambda: self._on_response(dest, corr, resp, exc))

                self.sender.send(o.destination, key, o.message, done, version=RAFT_APIS[key])
            else:
                ctx = self._answer_to.pop(o.correlation_id, None)
                if ctx is not None:
                    msg = self._with_leader_endpoint(o.message)
                    if isinstance(msg, M.dq.DescribeQuorumResponse):
                        msg = M.describe_quorum_for_version(msg, ctx.api_version)
                    ctx.respond(msg)

    def _run(self) -> None:
        self.started.set()
        try:
            while True:
                with self._cond:
                    if self._closing:
                        break
                    work, self._inbox = self._inbox, []
                now = self.now_ms()
                while self._timers and self._timers[0][0] <= now:
                    work.append(heapq.heappop(self._timers)[2])
                for fn in work:
                    try:
                        fn()
                    except Exception:
                        log.exception("raft thread task failed")
                self._dispatch(self.client.poll(self.now_ms()))
                due = self.client.next_deadline()
                if self._timers:
                    due = min(due, self._timers[0][0])
                wait = (due - self.now_ms()) / 1000.0
                with self._cond:
                    if not self._inbox and not self._closing:
                        self._cond.wait(max(0.0, min(wait, 0.5)))
        except Exception:
            log.exception("raft thread stopped on an unexpected error")
        finally:
            for ctx in self._answer_to.values():
                ctx.close_connection()
            self._answer_to.clear()


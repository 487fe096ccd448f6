"""QuorumControllerHost: the pure QuorumController driven by the raft log, on the raft thread.

Kafka: the event-queue half of ``controller/QuorumController`` and its
``QuorumMetaLogListener``. Every method here runs on the RaftManager's thread (handler
threads hand requests over with ``RaftManager.submit``), so the controller, the raft
client and this host share one thread and need no locks.

- Every voter replays each committed ``__cluster_metadata`` record (``handle_commit``);
  control batches (LeaderChangeMessage) only take up their offsets.
- The leader of the quorum becomes the *active* controller once everything up to its
  epoch's LeaderChangeMessage is committed and replayed (so it has every record of the
  previous epochs). A new cluster's first active controller writes the bootstrap records
  (the feature levels) first.
- A write request runs against the active controller, whose records are applied at once
  and appended at the offsets the controller expects; the response waits until the high
  watermark passes its last record. Requests on a node that is not the active controller
  are answered NOT_CONTROLLER.
- On losing leadership the controller drops what it applied but was not committed: it is
  rebuilt from the committed records, and waiting requests are answered NOT_CONTROLLER.
- A timer fences brokers whose session expired.
- Snapshots: at start-up, or when a voter that fell behind installs the leader's, the
  controller is replaced by one loaded from the snapshot (``handle_load_snapshot``); when
  this node writes a snapshot (SnapshotGenerator), the committed records it covers are
  dropped from memory (``snapshot_written``), so what is kept to rebuild the controller is
  the latest snapshot plus the committed records after it.
"""
from __future__ import annotations

import logging

from kbroker.controller.features import bootstrap_records
from kbroker.controller.quorum_controller import QuorumController
from kbroker.controller.result import ControllerConfig
from kbroker.metadata.serde import MetadataParseError, deserialize, serialize
from kbroker.metadata.snapshot import SnapshotFormatError, decode_snapshot
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.raft.client import Listener, NotLeaderError
from kbroker.raft.replicated_log import DATA
from kbroker.server.apis import ApiHandler
from kbroker.server.request_context import error_response_for

log = logging.getLogger(__name__)


def API_NAME(key: int) -> str:
    from kbroker.protocol import API_INFO
    return API_INFO[key].name if key in API_INFO else str(key)

#: controller APIs and the QuorumController method that serves each (None: a read)
WRITES = {
    ApiKey.BROKER_REGISTRATION: "register_broker",
    ApiKey.BROKER_HEARTBEAT: "broker_heartbeat",
    ApiKey.UNREGISTER_BROKER: "unregister_broker",
    ApiKey.CREATE_TOPICS: "create_topics",
    ApiKey.CREATE_PARTITIONS: "create_partitions",
    ApiKey.DELETE_TOPICS: "delete_topics",
    ApiKey.ALTER_PARTITION: "alter_partition",
    ApiKey.ELECT_LEADERS: "elect_leaders",
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: "alter_partition_reassignments",
    ApiKey.INCREMENTAL_ALTER_CONFIGS: "incremental_alter_configs",
    ApiKey.ALTER_CONFIGS: "alter_configs",
    ApiKey.ALLOCATE_PRODUCER_IDS: "allocate_producer_ids",
    ApiKey.ALTER_CLIENT_QUOTAS: "alter_client_quotas",
    ApiKey.CREATE_ACLS: "create_acls",
    ApiKey.DELETE_ACLS: "delete_acls",
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: "alter_user_scram_credentials",
    ApiKey.UPDATE_FEATURES: "update_features",
}
READS = {
    ApiKey.DESCRIBE_CONFIGS: "describe_configs",
    ApiKey.LIST_PARTITION_REASSIGNMENTS: "list_partition_reassignments",
}
_WITH_NOW = {"register_broker", "broker_heartbeat"}


class QuorumControllerHost(Listener):
    def __init__(self, config: ControllerConfig, bootstrap: list | None = None, seed: int | None = None):
        self.config = config
        self.seed = seed
        #: what a new cluster's first active controller writes: the records of the
        #: bootstrap.checkpoint ``kbroker storage format`` wrote (Kafka's BootstrapMetadata),
        #: else the latest metadata.version
        self.bootstrap_records = list(bootstrap) if bootstrap else bootstrap_records()
        self.raft = None                  # the RaftManager, set by attach()
        self.controller = QuorumController(config, seed)
        #: the latest snapshot this node has (its last contained offset, its records), and the
        #: (offset, ApiMessageAndVersion) of every committed record after it
        self.snapshot: tuple[int, list] | None = None
        self.committed: list = []
        self.next_commit_offset = 0       # the first offset not yet committed and replayed
        self.leader_id = -1
        self.epoch = -1
        self.active = False
        self._waiting: list = []          # (last offset, ctx, response, request) until committed
        self._last_scheduled_offset = -1  # the last offset schedule_append handed out

    def attach(self, raft_manager) -> None:
        self.raft = raft_manager

    # -- raft Listener (raft thread) ----------------------------------------------------------
    def handle_commit(self, batches) -> None:
        c = self.controller
        for b in batches:
            if b.control_type == DATA:
                for i, value in enumerate(b.records):
                    off = b.base_offset + i
                    try:
                        rec = deserialize(value)
                    except MetadataParseError as e:
                        log.error("metadata record at offset %d cannot be decoded, skipped: %s", off, e)
                        continue
                    self.committed.append((off, rec))
                    if off > c.last_applied_offset:
                        c.replay(rec, off)
            c.last_applied_offset = max(c.last_applied_offset, b.last_offset)
            self.next_commit_offset = b.next_offset
        c.handle_commit(self.next_commit_offset - 1)
        self._answer_committed()
        self._maybe_activate()

    def handle_leader_change(self, leader_id: int, epoch: int) -> None:
        was_active = self.active
        self.leader_id, self.epoch = leader_id, epoch
        if was_active:
            log.info("controller %d is no longer active (leader %d, epoch %d)", self.config.node_id,
                     leader_id, epoch)
            self._renounce()
        self._maybe_activate()

    def handle_control_append(self, last_offset: int) -> None:
        """The raft leader appended control records of its own (a VotersRecord, KIP-853):
        the controller's next records go after them."""
        c = self.controller
        c.last_applied_offset = max(c.last_applied_offset, last_offset)

    def handle_load_snapshot(self, snapshot_id, data) -> None:
        try:
            records = decode_snapshot(data)
        except SnapshotFormatError as e:
            # the raft client only hands over whole snapshots (fsynced, or fetched to the end)
            raise RuntimeError(f"metadata snapshot {tuple(snapshot_id)} cannot be loaded: {e}") from e
        if self.active:
            self._renounce_waiting()
            self.active = False
        self.snapshot = (snapshot_id.offset - 1, records)
        self.committed = []
        self.next_commit_offset = snapshot_id.offset
        self.controller = self._rebuild()
        log.info("controller %d loaded snapshot %s (%d records)", self.config.node_id, tuple(snapshot_id),
                 len(records))

    def snapshot_written(self, snapshot_id, records) -> None:
        """This node wrote a snapshot of the committed state below ``snapshot_id.offset``
        (raft thread): keep it instead of the committed records it covers."""
        if self.snapshot is not None and self.snapshot[0] >= snapshot_id.offset - 1:
            return
        self.snapshot = (snapshot_id.offset - 1, records)
        self.committed = [(o, r) for o, r in self.committed if o >= snapshot_id.offset]

    def _rebuild(self) -> QuorumController:
        """A controller holding exactly the committed state (snapshot + committed records)."""
        if self.snapshot is None:
            c = QuorumController(self.config, self.seed)
        else:
            c = QuorumController.from_snapshot(self.snapshot[1], self.snapshot[0], self.config, self.seed)
        for off, rec in self.committed:
            c.replay(rec, off)
        c.last_applied_offset = max(c.last_applied_offset, self.next_commit_offset - 1)
        c.handle_commit(self.next_commit_offset - 1)
        return c

    # -- activation ---------------------------------------------------------------------------
    def _maybe_activate(self) -> None:
        if self.active or self.raft is None or self.leader_id != self.config.node_id:
            return
        client = self.raft.client
        st = client.quorum.state
        start = getattr(st, "epoch_start_offset", None)
        if not client.is_leader or start is None or self.next_commit_offset <= start:
            return
        # everything this node appended (also by a controller it renounced while leading)
        # must be committed and replayed first: the new controller writes after it
        if self.next_commit_offset <= max(self._last_scheduled_offset, client.log.end_offset - 1):
            return
        c = self.controller
        c.last_applied_offset = max(c.last_applied_offset, client.log.end_offset - 1)
        now = self.raft.now_ms()
        c.activate(now)
        self.active = True
        log.info("controller %d is active in epoch %d from offset %d", self.config.node_id, self.epoch,
                 c.next_write_offset)
        if "metadata.version" not in c.features.finalized:
            self._append(c.bootstrap(self.bootstrap_records), None)
        self._schedule_fencing()

    def _renounce(self) -> None:
        self.active = False
        self._renounce_waiting()
        self.controller = self._rebuild()
        self._maybe_activate()

    def _renounce_waiting(self) -> None:
        for _, ctx, _, body in self._waiting:
            self._answer_error(ctx, ErrorCode.NOT_CONTROLLER, body)
        self._waiting.clear()   # still the raft leader: active again once its appends are committed

    # -- writes -------------------------------------------------------------------------------
    def _append(self, result, ctx, body=None) -> None:
        if not result.records:
            if ctx is not None and result.response is not None:
                ctx.respond(result.response)
            return
        try:
            last = self.raft.client.schedule_append(self.epoch, [serialize(r) for r in result.records],
                                                    self.raft.now_ms())
        except NotLeaderError:
            log.info("controller %d lost leadership before appending; renouncing", self.config.node_id)
            self._renounce()
            if ctx is not None:
                self._answer_error(ctx, ErrorCode.NOT_CONTROLLER, body)
            return
        self._last_scheduled_offset = max(self._last_scheduled_offset, last)
        if last != result.last_offset:
            log.error("metadata records landed at %d, the controller expected %d; renouncing",
                      last, result.last_offset)
            self._renounce()
            if ctx is not None:
                self._answer_error(ctx, ErrorCode.NOT_CONTROLLER, body)
            return
        if ctx is not None:
            self._waiting.append((last, ctx, result.response, body))

    def _answer_committed(self) -> None:
        if not self._waiting:
            return
        done = self.next_commit_offset - 1
        keep = []
        for item in self._waiting:
            if item[0] <= done:
                item[1].respond(item[2])
            else:
                keep.append(item)
        self._waiting = keep

    @staticmethod
    def _answer_error(ctx, code: int, body=None) -> None:
        resp = error_response_for(ctx.api_key, ctx.api_version, code, body)
        if resp is None:
            ctx.close_connection()
        else:
            ctx.respond(resp)

    def _schedule_fencing(self) -> None:
        """Fence brokers whose session expired; runs again at the next expiry."""
        if not self.active:
            return
        res = self.controller.fence_stale_brokers(self.raft.now_ms())
        self._append(res, None)
        nxt = self.controller.next_session_expiry_ms()
        delay = 1000 if nxt is None else max(10, nxt - self.raft.now_ms())
        self.raft.submit_later(delay, self._schedule_fencing)

    # -- request handlers (handler threads) ------------------------------------------------------
    def handle_request(self, ctx, body) -> None:
        self.raft.submit(lambda: self._on_request(ctx, body))

    def _on_request(self, ctx, body) -> None:
        key = ctx.api_key
        if not self.active:
            self._answer_error(ctx, ErrorCode.NOT_CONTROLLER, body)
            return
        name = WRITES.get(key)
        c = self.controller
        if name is None:
            ctx.respond(getattr(c, READS[key])(body))
            return
        fn = getattr(c, name)
        try:
            if name in _WITH_NOW:
                result = fn(body, self.raft.now_ms())
            elif name in ("alter_partition", "update_features"):
                result = fn(body, ctx.api_version)
            else:
                result = fn(body)
        except Exception:
            # a controller bug: its in-memory state may be half changed, so drop it and
            # rebuild from the committed records (Kafka renounces on an unexpected error)
            log.exception("controller %d failed on %s; renouncing", self.config.node_id, API_NAME(key))
            self._answer_error(ctx, ErrorCode.UNKNOWN_SERVER_ERROR, body)
            self._renounce()
            return
        self._append(result, ctx, body)

    @property
    def handlers(self) -> dict[int, ApiHandler]:
        from kbroker.protocol import API_INFO

        def handle(_target, ctx, body):
            self.handle_request(ctx, body)
        return {k: ApiHandler(API_INFO[k].min_version, API_INFO[k].max_version, handle)
                for k in list(WRITES) + list(READS)}

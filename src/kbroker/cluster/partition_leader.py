"""PartitionLeader: the leader's view of one partition — followers, ISR, high watermark.

Kafka: the leader half of ``kafka.cluster.Partition`` (KIP-497 AlterPartition, KIP-903
broker epochs in the ISR, KIP-966's "no high watermark below min ISR").

The ISR is owned by the controller. The leader proposes a change (AlterPartition with the
partition epoch it knows) and acts on it only once committed; while a proposal is in
flight the partition is in a pending state and makes no other proposal:

- ``CommittedPartitionState(isr)``: the controller's ISR as the leader last learned it.
- ``PendingExpandIsr``: a follower caught up; the *maximal* ISR already counts it, so the
  high watermark waits for it before the controller confirms (safe: stricter).
- ``PendingShrinkIsr``: followers fell behind; the maximal ISR still counts them until the
  controller confirms (the high watermark must not run ahead of a replica the controller
  may still consider in sync and elect).

Invariant this gives (checked by the simulation tests): the controller's ISR is always a
subset of the leader's maximal ISR, so every replica that can be elected holds every
record below the high watermark.

Pure: the caller passes the clock and the leader log's offsets, submits the returned
proposals to an AlterPartitionManager, and feeds the results back through
``on_alter_partition_result``. Thread-safety is the caller's (Kafka's
leaderIsrUpdateLock): one lock around every call.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from kbroker.cluster.replica import ReplicaState
from kbroker.metadata.image import RECOVERED, RECOVERING
from kbroker.protocol import ErrorCode

log = logging.getLogger(__name__)


class BrokerRegistry(Protocol):
    """What the leader needs of the cluster metadata about other brokers."""

    def alive_broker_epoch(self, broker_id: int) -> int | None: ...
    def is_fenced(self, broker_id: int) -> bool: ...
    def is_shutting_down(self, broker_id: int) -> bool: ...


class NotLeaderOrFollowerError(Exception):
    """A fetch from a replica this partition does not have, or with a stale broker epoch."""


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """What AlterPartition carries and answers: ISR members with their broker epochs."""
    leader: int
    leader_epoch: int
    isr_with_epochs: tuple[tuple[int, int], ...]   # (broker id, broker epoch or -1)
    partition_epoch: int
    leader_recovery_state: int = 0

    @property
    def isr(self) -> frozenset[int]:
        return frozenset(b for b, _ in self.isr_with_epochs)


@dataclass(frozen=True, slots=True)
class CommittedPartitionState:
    isr: frozenset[int]
    leader_recovery_state: int = 0
    is_inflight = False

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr


@dataclass(frozen=True, slots=True)
class PendingExpandIsr:
    new_in_sync_replica_id: int
    sent: LeaderAndIsr
    last_committed: CommittedPartitionState
    is_inflight = True

    @property
    def isr(self) -> frozenset[int]:
        return self.last_committed.isr

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.last_committed.isr | {self.new_in_sync_replica_id}

    @property
    def leader_recovery_state(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class PendingShrinkIsr:
    out_of_sync_replica_ids: frozenset[int]
    sent: LeaderAndIsr
    last_committed: CommittedPartitionState
    is_inflight = True

    @property
    def isr(self) -> frozenset[int]:
        return self.last_committed.isr

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.last_committed.isr

    @property
    def leader_recovery_state(self) -> int:
        return 0


#: errors after which the proposal is dropped and the last committed state restored: the
#: controller says the request was not applied and the partition epoch is right
_REVERT = frozenset({ErrorCode.OPERATION_NOT_ATTEMPTED, ErrorCode.INELIGIBLE_REPLICA})
#: errors after which the leader stays pending until new metadata arrives
_AWAIT_METADATA = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID,
                             ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.INVALID_UPDATE_VERSION,
                             ErrorCode.INVALID_REQUEST, ErrorCode.NEW_LEADER_ELECTED})


@dataclass
class PartitionLeader:
    local_broker_id: int
    brokers: BrokerRegistry
    replica_lag_time_max_ms: int = 30000
    min_insync_replicas: int = 1
    local_broker_epoch: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    leader_epoch_start_offset: int = -1
    replicas: tuple[int, ...] = ()
    state: object = field(default_factory=lambda: CommittedPartitionState(frozenset()))
    remote: dict[int, ReplicaState] = field(default_factory=dict)
    is_leader: bool = False

    # -- metadata ---------------------------------------------------------------------
    def make_leader(self, now_ms: int, *, leader_epoch: int, partition_epoch: int, replicas, isr,
                    leader_end_offset: int, leader_recovery_state: int = 0) -> bool:
        """Apply the controller's partition state with the local replica as leader.
        Returns True if this replica was not the leader before. A state with an older
        partition epoch than the one applied is ignored (Kafka skips it). A partition
        marked RECOVERING (elected uncleanly) is RECOVERED once this replica leads: its log
        is the partition's now (Kafka's makeLeader); the ISR expansions it proposes say so,
        and the controller refuses an ISR of more than the leader while RECOVERING."""
        if self.is_leader and partition_epoch < self.partition_epoch:
            log.info("Skipped the become-leader state change with partition epoch %d since the "
                     "current partition epoch %d is newer", partition_epoch, self.partition_epoch)
            return False
        is_new_leader = not self.is_leader
        is_new_leader_epoch = is_new_leader or leader_epoch > self.leader_epoch
        followers = [r for r in replicas if r != self.local_broker_id]
        self.remote = {r: self.remote.get(r, ReplicaState()) for r in followers}
        self.replicas = tuple(replicas)
        if leader_recovery_state == RECOVERING:
            log.info("The partition was marked as RECOVERING (an unclean election); marking it RECOVERED")
        committed = CommittedPartitionState(frozenset(isr), RECOVERED)
        cur = self.state
        if (not is_new_leader_epoch and cur.is_inflight and cur.sent.partition_epoch == partition_epoch
                and cur.last_committed == committed):
            # The state this node already committed, learned again from the metadata log,
            # while a proposal made from it is still queued: the controller may yet apply
            # it, so keep counting it (Kafka resets to committed here and relies on the
            # caught-up followers rule of the high watermark to cover the gap until the
            # next metadata arrives; keeping the proposal closes that gap).
            self.state = cur
        else:
            self.state = committed
        if is_new_leader_epoch:
            self.leader_epoch_start_offset = leader_end_offset
            for r, st in self.remote.items():
                # Stricter than Kafka, which keeps the followers' log end offsets when the
                # same broker is leader again: a leader that missed the epochs in between
                # (cut off, its metadata late) would count a follower's offset from before
                # it truncated following another leader, and commit records that follower
                # no longer has (the replication simulation found it: seed 3397). A new
                # leader epoch forgets them; each follower's next fetch tells.
                self.remote[r] = st.reset(now_ms, leader_end_offset, True, r in self.state.isr)
            self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.is_leader = True
        return is_new_leader

    def make_follower(self) -> None:
        self.is_leader = False
        self.remote.clear()

    # -- followers' fetches -----------------------------------------------------------
    def update_follower_fetch_state(self, now_ms: int, replica_id: int, fetch_offset: int,
                                    log_start_offset: int, leader_end_offset: int, high_watermark: int,
                                    broker_epoch: int = -1, leader_log_start_offset: int = -1):
        """Record a follower's fetch. Returns the ISR expansion to submit, if any.

        Stricter than Kafka: a follower whose log start offset (from its fetch) is below
        the leader's does not join the ISR yet (it takes the leader's with the answer, one
        fetch later). Its log below the leader's start is not covered by the diverging-epoch
        check (the leader's epoch cache starts there, Kafka's endOffsetFor answers the
        leader's start for any older epoch), so it may hold batches other than the ones
        committed there; elected at once, it would serve them (the replication simulation
        found it: DeleteRecords, then a restarted former leader joining and being elected)."""
        st = self.remote.get(replica_id)
        if st is None:
            raise NotLeaderOrFollowerError(f"replica {replica_id} is not a replica of this partition")
        cached = self.brokers.alive_broker_epoch(replica_id)
        if broker_epoch != -1 and cached is not None and cached > broker_epoch:
            raise NotLeaderOrFollowerError(f"Received stale fetch state update. broker epoch={broker_epoch} "
                                           f"vs expected={cached}")
        self.remote[replica_id] = st.update_fetch_state(fetch_offset, log_start_offset, now_ms,
                                                        leader_end_offset, broker_epoch)
        if 0 <= log_start_offset < leader_log_start_offset:
            return None
        return self._maybe_expand_isr(replica_id, high_watermark)

    def _is_isr_eligible(self, replica_id: int) -> bool:
        st = self.remote.get(replica_id)
        if st is None:
            return False
        cached = self.brokers.alive_broker_epoch(replica_id)
        if st.broker_epoch is None or cached is None:
            return False
        return (not self.brokers.is_fenced(replica_id) and not self.brokers.is_shutting_down(replica_id)
                and (st.broker_epoch == -1 or st.broker_epoch == cached))

    def _maybe_expand_isr(self, replica_id: int, high_watermark: int):
        cur = self.state
        if cur.is_inflight or replica_id in cur.isr or not self._is_isr_eligible(replica_id):
            return None
        end = self.remote[replica_id].log_end_offset
        if end < high_watermark or end < self.leader_epoch_start_offset:
            return None
        proposal = PendingExpandIsr(replica_id, self._leader_and_isr(cur.isr | {replica_id}), cur)
        self.state = proposal
        return proposal

    def out_of_sync_replicas(self, now_ms: int, leader_end_offset: int) -> frozenset[int]:
        cur = self.state
        if cur.is_inflight:
            return frozenset()
        out = set()
        for r in cur.isr:
            if r == self.local_broker_id:
                continue
            st = self.remote.get(r)
            if st is None or not st.is_caught_up(leader_end_offset, now_ms, self.replica_lag_time_max_ms):
                out.add(r)
        return frozenset(out)

    def maybe_shrink_isr(self, now_ms: int, leader_end_offset: int):
        """Propose dropping followers that have not caught up within replica.lag.time.max.ms
        (called every replica.lag.time.max.ms / 2). Returns the proposal, if any."""
        out = self.out_of_sync_replicas(now_ms, leader_end_offset)
        if not out or not self.is_leader:
            return None
        cur = self.state
        log.info("Shrinking ISR from %s to %s. Out of sync replicas: %s", sorted(cur.isr),
                 sorted(cur.isr - out), sorted(out))
        proposal = PendingShrinkIsr(out, self._leader_and_isr(cur.isr - out), cur)
        self.state = proposal
        return proposal

    def _leader_and_isr(self, isr) -> LeaderAndIsr:
        with_epochs = []
        for b in sorted(isr):
            if b == self.local_broker_id:
                e = self.local_broker_epoch
            else:
                st = self.remote.get(b)
                e = st.broker_epoch if st is not None and st.broker_epoch is not None else -1
            with_epochs.append((b, e))
        return LeaderAndIsr(self.local_broker_id, self.leader_epoch, tuple(with_epochs), self.partition_epoch,
                            self.state.leader_recovery_state)

    # -- the controller's answer ------------------------------------------------------
    def on_alter_partition_result(self, proposal, result: LeaderAndIsr | None, error: int = ErrorCode.NONE) -> str:
        """Apply the answer to ``proposal``: 'committed', 'ignored' (the state moved on, or
        the answer is stale), 'reverted' (back to the last committed state), 'await'
        (stay pending until new metadata) or 'retry' (submit ``proposal`` again)."""
        if self.state is not proposal:
            return "ignored"
        if result is not None:
            if result.leader_epoch != self.leader_epoch or result.partition_epoch < self.partition_epoch:
                return "ignored"
            self.state = CommittedPartitionState(result.isr, result.leader_recovery_state)
            self.partition_epoch = result.partition_epoch
            log.info("ISR updated to %s and version updated to %d", sorted(result.isr), self.partition_epoch)
            return "committed"
        if error in _REVERT:
            self.state = proposal.last_committed
            return "reverted"
        if error in _AWAIT_METADATA:
            return "await"
        return "retry"

    # -- high watermark and acks --------------------------------------------------------
    def is_under_min_isr(self) -> bool:
        return len(self.state.isr) < self.min_insync_replicas

    def high_watermark_candidate(self, now_ms: int, leader_end_offset: int) -> int | None:
        """The offset the high watermark may move up to (the log only moves it forward):
        the least log end offset over the maximal ISR and over followers caught up and
        eligible to join it. None while the ISR is below min.insync.replicas."""
        if self.is_under_min_isr():
            return None
        hw = leader_end_offset
        maximal = self.state.maximal_isr
        for r, st in self.remote.items():
            if st.log_end_offset < hw and (
                    r in maximal or (st.is_caught_up(leader_end_offset, now_ms, self.replica_lag_time_max_ms)
                                     and self._is_isr_eligible(r))):
                hw = st.log_end_offset
        return hw

    def check_enough_replicas_reach_offset(self, required_offset: int, high_watermark: int) -> tuple[bool, int]:
        """For acks=all: (done, error) once the high watermark passes ``required_offset``."""
        if high_watermark >= required_offset:
            if self.min_insync_replicas <= len(self.state.maximal_isr):
                return True, ErrorCode.NONE
            return True, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return False, ErrorCode.NONE

    def check_append(self, required_acks: int) -> int:
        """Before appending: NOT_ENOUGH_REPLICAS for acks=all below min.insync.replicas."""
        if required_acks == -1 and len(self.state.isr) < self.min_insync_replicas:
            return ErrorCode.NOT_ENOUGH_REPLICAS
        return ErrorCode.NONE

"""KIP-848 consumer groups: the group, its members, reconciliation and the server-side assignors.

Kafka 3.9 ``group-coordinator`` module: ``modern/consumer/ConsumerGroup.java``,
``ConsumerGroupMember.java``, ``CurrentAssignmentBuilder.java``,
``modern/TargetAssignmentBuilder.java``, ``assignor/UniformAssignor.java`` /
``RangeAssignor.java`` and the consumer-group half of ``GroupMetadataManager``
(``consumerGroupHeartbeat``, ``consumerGroupLeave``, the fencing helpers).

Vocabulary (KIP-848):

* **group epoch**: bumped whenever the group's subscriptions or the metadata of
  the subscribed topics change (a member joins, leaves, changes its topics; a
  subscribed topic gets partitions).
* **target assignment** (with its **assignment epoch**): what the server-side
  assignor computed for the group epoch; the group is *Assigning* while the
  group epoch is ahead of it.
* **member epoch**: a member moves to the assignment epoch once it owns
  exactly its target (minus partitions another member still has to release).
  Reconciliation is *revoke before assign*: a member first gives up what it
  must lose (state UNREVOKED_PARTITIONS, still at its old epoch), then gets the
  new partitions at the new epoch, but only partitions nobody else owns
  (state UNRELEASED_PARTITIONS while it waits for them). ``partition_epochs``
  (topic id → partition → epoch of the owning member) is what makes a partition
  "owned": it covers assigned and pending-revocation partitions, and a
  partition is never owned by two members (checked, as Kafka does).
* An ``Assignment`` is ``{topic_id (uuid.UUID): frozenset(partition ids)}``
  with no empty sets.

State lives in __consumer_offsets as six record types (``storage``), and the
in-memory group is only ever changed by :meth:`ConsumerGroup.replay` of those
records: the coordinator computes a heartbeat's records with
:func:`consumer_group_heartbeat` (which does not touch the group), replays them,
then appends them; loading replays the same records, so a reload rebuilds the
same state.

Thread-safety: a :class:`ConsumerGroup` is guarded by its ``lock`` (the
coordinator holds it for every read and write); members, topic metadata and
assignments are immutable values.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import uuid
from typing import Callable, Iterable, Mapping, NamedTuple

from kbroker.coordinator.group import storage
from kbroker.coordinator.group.offsets import OffsetStore
from kbroker.protocol import ErrorCode

log = logging.getLogger(__name__)

__all__ = [
    "LEAVE_GROUP_MEMBER_EPOCH", "LEAVE_GROUP_STATIC_MEMBER_EPOCH", "MemberState", "ConsumerGroupState",
    "TopicMetadata", "ConsumerGroupMember", "ConsumerGroup", "ConsumerGroupError", "HeartbeatRequest",
    "HeartbeatOutcome", "consumer_group_heartbeat", "fence_member", "compute_next_assignment",
    "uniform_assign", "range_assign", "ASSIGNORS", "assignor_name", "build_target_assignment",
    "CONSUMER_GROUP_TYPE",
]

E = ErrorCode
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
CONSUMER_GROUP_TYPE = "consumer"

Assignment = Mapping[uuid.UUID, frozenset]
EMPTY_ASSIGNMENT: Assignment = {}


class MemberState(enum.IntEnum):
    """``ConsumerGroupMember.MemberState`` (its byte is stored in the current-assignment record)."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127

    @classmethod
    def from_value(cls, v: int) -> "MemberState":
        try:
            return cls(v)
        except ValueError:
            return cls.UNKNOWN


class ConsumerGroupState:
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


def freeze(assignment: Mapping | None) -> dict:
    """Normalise ``{topic_id: iterable of partitions}``: frozensets, no empty entries."""
    if not assignment:
        return {}
    return {tid: frozenset(ps) for tid, ps in assignment.items() if ps}


def assignment_to_str(a: Assignment) -> str:
    return "{" + ", ".join(f"{tid}-{sorted(ps)}" for tid, ps in a.items()) + "}"


@dataclasses.dataclass(frozen=True)
class TopicMetadata:
    """A subscribed topic as the group saw it (ConsumerGroupPartitionMetadataValue.TopicMetadata)."""

    topic_id: uuid.UUID
    name: str
    num_partitions: int


@dataclasses.dataclass(frozen=True, eq=True)
class ConsumerGroupMember:
    """One member: its subscription (ConsumerGroupMemberMetadataValue) and its current
    assignment (ConsumerGroupCurrentMemberAssignmentValue). Immutable: changes make a copy."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple = ()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned_partitions: Mapping = dataclasses.field(default_factory=dict)
    partitions_pending_revocation: Mapping = dataclasses.field(default_factory=dict)

    __hash__ = None  # mappings inside: compare, never hash

    def with_(self, **changes) -> "ConsumerGroupMember":
        return dataclasses.replace(self, **changes)

    def update_member_epoch(self, epoch: int) -> "ConsumerGroupMember":
        """Kafka's ``Builder.updateMemberEpoch``: the previous epoch follows."""
        return self.with_(previous_member_epoch=self.member_epoch, member_epoch=epoch)

    def is_reconciled_to(self, assignment_epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == assignment_epoch

    @property
    def is_static(self) -> bool:
        return self.instance_id is not None


class ConsumerGroupError(Exception):
    """A heartbeat refused with ``code`` (and Kafka's message)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


# ======================================================================================
# the group
# ======================================================================================

class ConsumerGroup:
    """One KIP-848 group (see the module docstring). Hard state = what the records hold;
    soft state (``partition_epochs``, ``static_members``, subscription counts) follows it."""

    group_type = CONSUMER_GROUP_TYPE
    protocol_type = CONSUMER_GROUP_TYPE

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.lock = threading.RLock()
        self.offsets = OffsetStore()
        self.dead = False
        # hard state (records)
        self.group_epoch = 0
        self.subscription_metadata: dict[str, TopicMetadata] = {}
        self.members: dict[str, ConsumerGroupMember] = {}
        self.assignment_epoch = 0
        self.target_assignment: dict[str, Assignment] = {}
        # soft state
        self.static_members: dict[str, str] = {}
        self.partition_epochs: dict[uuid.UUID, dict[int, int]] = {}
        self.subscribed_topic_counts: dict[str, int] = {}
        self.metadata_image_epoch = -1  # the metadata image the subscription metadata was computed from
        self.timers: dict = {}  # (kind, member_id) -> timer task; the coordinator's
        self.current_state_timestamp_ms = -1

    def is_state(self, state) -> bool:
        """Compare with a state name or a classic ``GroupState`` (DEAD / EMPTY / STABLE share names)."""
        return self.state == getattr(state, "value", state)

    # -- state -----------------------------------------------------------------------------
    @property
    def state(self) -> str:
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if not m.is_reconciled_to(self.assignment_epoch):
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def is_empty(self) -> bool:
        return not self.members

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def static_member(self, instance_id: str | None) -> ConsumerGroupMember | None:
        mid = self.static_members.get(instance_id) if instance_id is not None else None
        return self.members.get(mid) if mid is not None else None

    def current_partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        """Epoch of the member owning the partition, or -1 if it is free."""
        return self.partition_epochs.get(topic_id, {}).get(partition, -1)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return self.subscribed_topic_counts.get(topic, 0) > 0

    def preferred_server_assignor(self, default: str, members: Iterable[ConsumerGroupMember] | None = None) -> str:
        """The assignor most members ask for (ties: by name), else ``default``."""
        counts: dict[str, int] = {}
        for m in (self.members.values() if members is None else members):
            if m.server_assignor is not None:
                counts[m.server_assignor] = counts.get(m.server_assignor, 0) + 1
        if not counts:
            return default
        return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]

    def target_for(self, member_id: str) -> Assignment:
        return self.target_assignment.get(member_id, EMPTY_ASSIGNMENT)

    # -- replay ----------------------------------------------------------------------------
    def replay(self, rec: "storage.ParsedRecord") -> None:
        """Apply one KIP-848 record (key versions 3..8) of this group."""
        kv, value = rec.key_version, rec.value
        if kv == 3:
            if value is None:
                self.dead = True
            else:
                self.group_epoch = value.epoch
        elif kv == 4:
            self.subscription_metadata = {} if value is None else {
                t.topic_name: TopicMetadata(t.topic_id, t.topic_name, t.num_partitions) for t in value.topics}
        elif kv == 5:
            mid = rec.key.member_id
            if value is None:
                self._remove_member(mid)
            else:
                old = self.members.get(mid) or ConsumerGroupMember(mid)
                self._update_member(old.with_(
                    instance_id=value.instance_id, rack_id=value.rack_id, client_id=value.client_id,
                    client_host=value.client_host, subscribed_topic_names=tuple(value.subscribed_topic_names),
                    subscribed_topic_regex=value.subscribed_topic_regex,
                    rebalance_timeout_ms=value.rebalance_timeout_ms, server_assignor=value.server_assignor))
        elif kv == 6:
            self.assignment_epoch = -1 if value is None else value.assignment_epoch
        elif kv == 7:
            mid = rec.key.member_id
            if value is None:
                self.target_assignment.pop(mid, None)
            else:
                self.target_assignment[mid] = freeze({tp.topic_id: tp.partitions for tp in value.topic_partitions})
        elif kv == 8:
            mid = rec.key.member_id
            old = self.members.get(mid)
            if old is None:
                if value is None:
                    return
                old = ConsumerGroupMember(mid)
            if value is None:
                # The member is leaving: its member-metadata tombstone follows.
                self._update_member(old.with_(member_epoch=LEAVE_GROUP_MEMBER_EPOCH,
                                              previous_member_epoch=LEAVE_GROUP_MEMBER_EPOCH,
                                              assigned_partitions={}, partitions_pending_revocation={}))
            else:
                self._update_member(old.with_(
                    member_epoch=value.member_epoch, previous_member_epoch=value.previous_member_epoch,
                    state=MemberState.from_value(value.state),
                    assigned_partitions=freeze({tp.topic_id: tp.partitions for tp in value.assigned_partitions}),
                    partitions_pending_revocation=freeze(
                        {tp.topic_id: tp.partitions for tp in value.partitions_pending_revocation})))

    def _update_member(self, new: ConsumerGroupMember) -> None:
        old = self.members.get(new.member_id)
        self.members[new.member_id] = new
        self._update_subscriptions(old, new)
        if old is not None and old.instance_id is not None and old.instance_id != new.instance_id \
                and self.static_members.get(old.instance_id) == old.member_id:
            del self.static_members[old.instance_id]
        if new.instance_id is not None:
            self.static_members[new.instance_id] = new.member_id
        self._update_partition_epochs(old, new)

    def _remove_member(self, member_id: str) -> None:
        old = self.members.pop(member_id, None)
        if old is None:
            return
        self._update_subscriptions(old, None)
        if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
            del self.static_members[old.instance_id]
        self._update_partition_epochs(old, None)

    def _update_subscriptions(self, old: ConsumerGroupMember | None, new: ConsumerGroupMember | None) -> None:
        counts = self.subscribed_topic_counts
        if old is not None:
            for t in old.subscribed_topic_names:
                n = counts.get(t, 0) - 1
                if n > 0:
                    counts[t] = n
                else:
                    counts.pop(t, None)
        if new is not None:
            for t in new.subscribed_topic_names:
                counts[t] = counts.get(t, 0) + 1

    def _update_partition_epochs(self, old: ConsumerGroupMember | None, new: ConsumerGroupMember | None) -> None:
        if old is not None:
            for a in (old.assigned_partitions, old.partitions_pending_revocation):
                for tid, ps in a.items():
                    epochs = self.partition_epochs.get(tid)
                    if epochs is None:
                        continue
                    for p in ps:
                        if epochs.get(p) == old.member_epoch:
                            del epochs[p]
                    if not epochs:
                        del self.partition_epochs[tid]
        if new is not None:
            for a in (new.assigned_partitions, new.partitions_pending_revocation):
                for tid, ps in a.items():
                    epochs = self.partition_epochs.setdefault(tid, {})
                    for p in ps:
                        if p in epochs:
                            # Kafka raises IllegalStateException: two owners of one partition.
                            log.error("group %s: partition %s-%d already owned at epoch %d; member %s at epoch %d",
                                      self.group_id, tid, p, epochs[p], new.member_id, new.member_epoch)
                        epochs[p] = new.member_epoch

    # -- snapshots (undo a change whose records could not be written) ----------------------
    def snapshot(self) -> tuple:
        return (self.dead, self.group_epoch, dict(self.subscription_metadata), dict(self.members),
                self.assignment_epoch, dict(self.target_assignment), dict(self.static_members),
                {t: dict(e) for t, e in self.partition_epochs.items()}, dict(self.subscribed_topic_counts),
                self.metadata_image_epoch)

    def restore(self, snap: tuple) -> None:
        (self.dead, self.group_epoch, self.subscription_metadata, self.members, self.assignment_epoch,
         self.target_assignment, self.static_members, self.partition_epochs, self.subscribed_topic_counts,
         self.metadata_image_epoch) = snap

    def tombstones(self) -> list:
        """Records deleting the whole group (``ConsumerGroup.createGroupTombstoneRecords``)."""
        gid = self.group_id
        recs = []
        for mid in self.members:
            recs += [storage.consumer_group_current_assignment_tombstone(gid, mid),
                     storage.consumer_group_target_assignment_tombstone(gid, mid),
                     storage.consumer_group_member_subscription_tombstone(gid, mid)]
        for mid in self.target_assignment:
            if mid not in self.members:
                recs.append(storage.consumer_group_target_assignment_tombstone(gid, mid))
        recs += [storage.consumer_group_target_assignment_epoch_tombstone(gid),
                 storage.consumer_group_subscription_metadata_tombstone(gid),
                 storage.consumer_group_epoch_tombstone(gid)]
        return recs

    def state_fingerprint(self) -> tuple:
        """Hard and soft state as comparable values (tests: replay rebuilds identical state)."""
        return (self.group_epoch, sorted(self.subscription_metadata.items()),
                sorted((m.member_id, dataclasses.astuple(m)) for m in self.members.values()),
                self.assignment_epoch, sorted(self.target_assignment.items()),
                sorted(self.static_members.items()),
                sorted((str(t), sorted(e.items())) for t, e in self.partition_epochs.items()),
                sorted(self.subscribed_topic_counts.items()))


# ======================================================================================
# subscription metadata
# ======================================================================================

def compute_subscription_metadata(topic_names: Iterable[str], topics_image: Mapping) -> dict[str, TopicMetadata]:
    """``topics_image``: name → object with ``topic_id`` and ``num_partitions`` (the metadata image)."""
    out = {}
    for name in topic_names:
        t = topics_image.get(name)
        if t is not None:
            out[name] = TopicMetadata(t.topic_id, name, t.num_partitions)
    return out


def _subscribed_names(group: ConsumerGroup, old: ConsumerGroupMember | None,
                      new: ConsumerGroupMember | None) -> set[str]:
    counts = dict(group.subscribed_topic_counts)
    if old is not None:
        for t in old.subscribed_topic_names:
            counts[t] = counts.get(t, 0) - 1
    if new is not None:
        for t in new.subscribed_topic_names:
            counts[t] = counts.get(t, 0) + 1
    return {t for t, n in counts.items() if n > 0}


# ======================================================================================
# reconciliation (Kafka's CurrentAssignmentBuilder, 3.9)
# ======================================================================================

def _owns_revoked_partitions(owned: list | None, pending: Assignment) -> bool:
    if owned is None:
        return True
    for tid, ps in owned:
        pend = pending.get(tid)
        if pend and any(p in pend for p in ps):
            return True
    return False


def compute_next_assignment(member: ConsumerGroupMember, member_epoch: int, assigned: Assignment,
                            target_epoch: int, target: Assignment,
                            current_partition_epoch: Callable[[uuid.UUID, int], int]) -> ConsumerGroupMember:
    """One reconciliation step toward ``target`` at ``target_epoch``: revoke first (stay at
    ``member_epoch``), else take the new epoch with every free target partition."""
    has_unreleased = False
    new_assigned: dict = {}
    pending_revocation: dict = {}
    pending_assignment: dict = {}
    for tid in set(target) | set(assigned):
        tgt = target.get(tid, frozenset())
        cur = assigned.get(tid, frozenset())
        keep = cur & tgt
        revoke = cur - keep
        add = set(tgt - keep)
        unreleased = {p for p in add if current_partition_epoch(tid, p) != -1}
        if unreleased:
            has_unreleased = True
            add -= unreleased
        if keep:
            new_assigned[tid] = keep
        if revoke:
            pending_revocation[tid] = frozenset(revoke)
        if add:
            pending_assignment[tid] = add
    if pending_revocation:
        return member.with_(state=MemberState.UNREVOKED_PARTITIONS).update_member_epoch(member_epoch).with_(
            assigned_partitions=new_assigned, partitions_pending_revocation=pending_revocation)
    for tid, ps in pending_assignment.items():
        new_assigned[tid] = new_assigned.get(tid, frozenset()) | ps
    state = MemberState.UNRELEASED_PARTITIONS if has_unreleased else MemberState.STABLE
    return member.with_(state=state).update_member_epoch(target_epoch).with_(
        assigned_partitions=freeze(new_assigned), partitions_pending_revocation={})


def reconcile(member: ConsumerGroupMember, target_epoch: int, target: Assignment,
              current_partition_epoch: Callable[[uuid.UUID, int], int], owned: list | None) -> ConsumerGroupMember:
    """Kafka's ``CurrentAssignmentBuilder.build``. ``owned``: [(topic_id, partitions)] the
    member reported, or None if the heartbeat did not carry them."""
    state = member.state
    if state is MemberState.STABLE:
        if member.member_epoch != target_epoch:
            return compute_next_assignment(member, member.member_epoch, member.assigned_partitions, target_epoch,
                                           target, current_partition_epoch)
        return member
    if state is MemberState.UNREVOKED_PARTITIONS:
        if _owns_revoked_partitions(owned, member.partitions_pending_revocation):
            return member
        return compute_next_assignment(member, member.member_epoch, member.assigned_partitions, target_epoch,
                                       target, current_partition_epoch)
    if state is MemberState.UNRELEASED_PARTITIONS:
        return compute_next_assignment(member, member.member_epoch, member.assigned_partitions, target_epoch,
                                       target, current_partition_epoch)
    # UNKNOWN: only a member that owns nothing can start over.
    if owned is None or owned:
        raise ConsumerGroupError(E.FENCED_MEMBER_EPOCH, "The consumer group member is in a unknown state. "
                                 "The member must abandon all its partitions and rejoin.")
    return compute_next_assignment(member, target_epoch, member.assigned_partitions, target_epoch, target,
                                   current_partition_epoch)


# ======================================================================================
# server-side assignors
# ======================================================================================

# A member spec for the assignors: (subscribed topic ids, current target assignment).
class MemberSpec(NamedTuple):
    subscribed_topic_ids: frozenset
    assignment: Assignment


def uniform_assign(members: Mapping[str, MemberSpec], topics: Mapping[uuid.UUID, int]) -> dict[str, dict]:
    """Kafka's "uniform" assignor (our algorithm, same contract): every partition of a
    subscribed topic goes to one subscriber; partition counts per member differ by at most
    one where subscriptions allow; members keep as much of their current assignment as that
    balance permits (sticky).

    1. keep each member's current partitions that are still subscribed and exist (first
       claim wins, members in id order);
    2. hand out the rest, topics with the fewest subscribers first, each partition to the
       least-loaded subscriber;
    3. move partitions from the most to the least loaded member (one subscribed to the
       partition's topic) while they differ by more than one.
    """
    mids = sorted(members)
    out: dict[str, set] = {m: set() for m in mids}
    taken: set = set()
    subscribers: dict[uuid.UUID, list[str]] = {}
    for m in mids:
        for tid in members[m].subscribed_topic_ids:
            if tid in topics:
                subscribers.setdefault(tid, []).append(m)
    for m in mids:
        subs = members[m].subscribed_topic_ids
        for tid, ps in sorted(members[m].assignment.items(), key=lambda kv: str(kv[0])):
            if tid not in subs or tid not in topics:
                continue
            n = topics[tid]
            for p in sorted(ps):
                if p < n and (tid, p) not in taken:
                    taken.add((tid, p))
                    out[m].add((tid, p))
    for tid in sorted(subscribers, key=lambda t: (len(subscribers[t]), str(t))):
        subs = subscribers[tid]
        for p in range(topics[tid]):
            if (tid, p) in taken:
                continue
            m = min(subs, key=lambda x: (len(out[x]), x))
            out[m].add((tid, p))
            taken.add((tid, p))
    subs_of = {m: members[m].subscribed_topic_ids for m in mids}
    for _ in range(len(taken) + 1):
        order = sorted(mids, key=lambda x: (len(out[x]), x))
        moved = False
        for recv in order:
            for donor in reversed(order):
                if len(out[donor]) - len(out[recv]) <= 1:
                    break
                movable = sorted((tp for tp in out[donor] if tp[0] in subs_of[recv]), key=lambda tp: (str(tp[0]), tp[1]))
                if movable:
                    tp = movable[-1]
                    out[donor].discard(tp)
                    out[recv].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    return {m: _group_by_topic(tps) for m, tps in out.items()}


def range_assign(members: Mapping[str, MemberSpec], topics: Mapping[uuid.UUID, int]) -> dict[str, dict]:
    """Kafka 3.9's server-side "range" assignor: per topic, each subscriber (in member-id
    order) gets ``n // k`` partitions, the first ``n % k`` one more, as contiguous ranges,
    keeping (sticky) the lowest partitions it already had up to that quota."""
    out: dict[str, dict] = {m: {} for m in members}
    per_topic: dict[uuid.UUID, list[str]] = {}
    for m in sorted(members):
        for tid in members[m].subscribed_topic_ids:
            if tid in topics:
                per_topic.setdefault(tid, []).append(m)
    for tid, subs in per_topic.items():
        n = topics[tid]
        min_quota, extra = divmod(n, len(subs))
        sticky: set[int] = set()
        unfilled: list[tuple[str, int]] = []
        for m in subs:
            current = sorted(p for p in members[m].assignment.get(tid, ()) if p < n)
            keep = current[:min_quota]
            for p in keep:
                sticky.add(p)
                out[m].setdefault(tid, set()).add(p)
            remaining = min_quota - len(current)
            if remaining < 0 and extra > 0:
                extra -= 1
                p = current[min_quota]
                sticky.add(p)
                out[m].setdefault(tid, set()).add(p)
            else:
                unfilled.append((m, remaining))
        free = [p for p in range(n) if p not in sticky]
        i = 0
        for m, remaining in unfilled:
            if extra > 0:
                remaining += 1
                extra -= 1
            if remaining > 0:
                out[m].setdefault(tid, set()).update(free[i:i + remaining])
                i += remaining
    return {m: freeze(a) for m, a in out.items()}


def _group_by_topic(tps: Iterable[tuple]) -> dict:
    a: dict = {}
    for tid, p in tps:
        a.setdefault(tid, set()).add(p)
    return freeze(a)


ASSIGNORS: dict[str, Callable] = {"uniform": uniform_assign, "range": range_assign}

_ASSIGNOR_CLASSES = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range",
}


def assignor_name(configured: str) -> str:
    """``group.consumer.assignors`` entries: Kafka's class names or the short names."""
    name = _ASSIGNOR_CLASSES.get(configured, configured)
    if name not in ASSIGNORS:
        raise ValueError(f"unknown consumer group assignor {configured!r} (known: {sorted(ASSIGNORS)})")
    return name


def build_target_assignment(group: ConsumerGroup, group_epoch: int, assignor: Callable,
                            members: Mapping[str, ConsumerGroupMember],
                            subscription_metadata: Mapping[str, TopicMetadata],
                            inherit: Mapping[str, str] | None = None) -> tuple[list, dict[str, Assignment]]:
    """Kafka's ``TargetAssignmentBuilder.build``: run the assignor over ``members`` (the group's
    members after this heartbeat) and return (records of the changed member targets + the new
    assignment epoch, the new target by member). ``inherit``: new member id → old member id
    whose target it takes over (a static member replacing its previous incarnation)."""
    inherit = inherit or {}
    topics = {t.topic_id: t.num_partitions for t in subscription_metadata.values()}
    specs = {}
    for mid, m in members.items():
        ids = frozenset(subscription_metadata[n].topic_id for n in m.subscribed_topic_names
                        if n in subscription_metadata)
        current = group.target_assignment.get(mid)
        if current is None and mid in inherit:
            current = group.target_assignment.get(inherit[mid])
        specs[mid] = MemberSpec(ids, current or EMPTY_ASSIGNMENT)
    new = assignor(specs, topics) if specs else {}
    records = []
    for mid in members:
        a = freeze(new.get(mid))
        new[mid] = a
        old = None if mid in inherit else group.target_assignment.get(mid)
        if old != a:
            records.append(storage.consumer_group_target_assignment_record(group.group_id, mid, a))
    records.append(storage.consumer_group_target_assignment_epoch_record(group.group_id, group_epoch))
    return records, new


# ======================================================================================
# the heartbeat (Kafka's GroupMetadataManager.consumerGroupHeartbeat)
# ======================================================================================

class HeartbeatRequest(NamedTuple):
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: list | None
    server_assignor: str | None
    owned: list | None  # [(topic_id, [partitions])] or None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 0
    subscribed_topic_regex: str | None = None


@dataclasses.dataclass
class HeartbeatOutcome:
    """What the coordinator must do: replay+append ``records``, answer, and arm timers.

    ``rebalance_timeout``: None (leave as is), ("schedule", epoch, timeout_ms) or ("cancel",).
    ``cancel_timers``: member ids whose session and rebalance timers go (left, replaced, fenced).
    ``assignment``: the member's assignment to send back, or None (not sent).
    """

    records: list
    member_id: str
    member_epoch: int
    assignment: Assignment | None = None
    schedule_session: bool = True
    rebalance_timeout: tuple | None = None
    cancel_timers: list = dataclasses.field(default_factory=list)
    metadata_image_epoch: int = -1


def validate_heartbeat(req: HeartbeatRequest, assignors: Iterable[str]) -> None:
    """Kafka's ``throwIfConsumerGroupHeartbeatRequestIsInvalid``."""
    def not_empty(v, what):
        if v is not None and not v.strip():
            raise ConsumerGroupError(E.INVALID_REQUEST, f"{what} can't be empty.")

    not_empty(req.group_id, "GroupId")
    not_empty(req.instance_id, "InstanceId")
    not_empty(req.rack_id, "RackId")
    if req.api_version >= 1:
        # KIP-1082: from version 1 the consumer generates its member id.
        not_empty(req.member_id or "", "MemberId")
    if req.subscribed_topic_regex:
        # Regular-expression subscriptions (version 1, resolved by the coordinator in Kafka 4.0)
        # are not supported here; "" (what librdkafka sends with topic names) means none.
        raise ConsumerGroupError(E.INVALID_REQUEST, "SubscribedTopicRegex is not supported by this broker.")
    epoch = req.member_epoch
    if epoch > 0 or epoch == LEAVE_GROUP_MEMBER_EPOCH:
        not_empty(req.member_id, "MemberId")
    elif epoch == 0:
        if req.rebalance_timeout_ms == -1:
            raise ConsumerGroupError(E.INVALID_REQUEST, "RebalanceTimeoutMs must be provided in first request.")
        if req.owned is None or req.owned:
            raise ConsumerGroupError(E.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining.")
        if not req.subscribed_topic_names:
            raise ConsumerGroupError(E.INVALID_REQUEST, "SubscribedTopicNames must be set in first request.")
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        not_empty(req.member_id, "MemberId")
        if req.instance_id is None:
            raise ConsumerGroupError(E.INVALID_REQUEST, "InstanceId can't be null.")
    else:
        raise ConsumerGroupError(E.INVALID_REQUEST, "MemberEpoch is invalid.")
    names = list(assignors)
    if req.server_assignor is not None and req.server_assignor not in names:
        raise ConsumerGroupError(E.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {req.server_assignor} is not supported. "
                                 f"Supported assignors: {', '.join(names)}.")


def _is_subset(owned: list | None, assigned: Assignment) -> bool:
    if owned is None:
        return False
    for tid, ps in owned:
        a = assigned.get(tid)
        if a is None:
            if ps:
                return False
            continue
        if any(p not in a for p in ps):
            return False
    return True


def _check_member_epoch(member: ConsumerGroupMember, received: int, owned: list | None) -> None:
    if received > member.member_epoch:
        raise ConsumerGroupError(E.FENCED_MEMBER_EPOCH, f"The consumer group member has a greater member epoch "
                                 f"({received}) than the one known by the group coordinator ({member.member_epoch})."
                                 " The member must abandon all its partitions and rejoin.")
    if received < member.member_epoch:
        # The response carrying the bumped epoch may have been lost.
        if received != member.previous_member_epoch or not _is_subset(owned, member.assigned_partitions):
            raise ConsumerGroupError(E.FENCED_MEMBER_EPOCH, f"The consumer group member has a smaller member epoch "
                                     f"({received}) than the one known by the group coordinator "
                                     f"({member.member_epoch}). The member must abandon all its partitions and rejoin.")


def consumer_group_heartbeat(group: ConsumerGroup, req: HeartbeatRequest, *, topics_image: Mapping,
                             image_epoch: int, max_size: int, default_assignor: str,
                             new_member_id: Callable[[], str] = lambda: str(uuid.uuid4())) -> HeartbeatOutcome:
    """The records and answer of one (validated, non-leave) heartbeat. Does not change ``group``.

    ``group``: the group (new and empty if the heartbeat creates it). Raises
    :class:`ConsumerGroupError` for refusals.
    """
    gid = group.group_id
    records: list = []
    member_id = req.member_id
    epoch = req.member_epoch
    create = epoch == 0
    if len(group.members) >= max_size and (not member_id or member_id not in group.members):
        raise ConsumerGroupError(E.GROUP_MAX_SIZE_REACHED,
                                 f"The consumer group has reached its maximum capacity of {max_size} members.")
    if not member_id:
        member_id = new_member_id()
    cancel: list = []
    inherit: dict[str, str] = {}
    freed: dict = {}  # partitions released by this heartbeat's own records
    static_replaced = False
    if req.instance_id is None:
        member = group.members.get(member_id)
        if member is None:
            if not create:
                raise ConsumerGroupError(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {gid}.")
            member = ConsumerGroupMember(member_id)
            log.info("[GroupId %s] Member %s joins the consumer group.", gid, member_id)
        elif create and member.member_epoch != 0:
            # A known member rejoining from scratch (e.g. after FENCED_MEMBER_EPOCH with its
            # old id): it owns nothing now, so it restarts at epoch 0 with nothing assigned.
            freed = {tid: ps | member.partitions_pending_revocation.get(tid, frozenset())
                     for tid, ps in member.assigned_partitions.items()}
            for tid, ps in member.partitions_pending_revocation.items():
                freed.setdefault(tid, ps)
            member = member.with_(member_epoch=0, previous_member_epoch=0, state=MemberState.STABLE,
                                  assigned_partitions={}, partitions_pending_revocation={})
            records.append(storage.consumer_group_current_assignment_record(gid, member))
            log.info("[GroupId %s] Member %s rejoins the consumer group.", gid, member_id)
        else:
            _check_member_epoch(member, epoch, req.owned)
    else:
        current = group.static_member(req.instance_id)
        if create:
            if current is None:
                member = group.members.get(member_id) or ConsumerGroupMember(member_id)
                log.info("[GroupId %s] Static member %s with instance id %s joins the consumer group.", gid,
                         member_id, req.instance_id)
            elif current.member_id == member_id and current.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                raise ConsumerGroupError(E.UNRELEASED_INSTANCE_ID, f"Static member {member_id} with instance id "
                                         f"{req.instance_id} cannot join the group because the instance id is "
                                         f"owned by {current.member_id} member.")
            else:
                if current.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                    raise ConsumerGroupError(E.UNRELEASED_INSTANCE_ID, f"Static member {member_id} with instance id "
                                             f"{req.instance_id} cannot join the group because the instance id is "
                                             f"owned by {current.member_id} member.")
                # The new incarnation takes over the old one's partitions and target.
                static_replaced = True
                member = ConsumerGroupMember(member_id, assigned_partitions=current.assigned_partitions,
                                             member_epoch=0, previous_member_epoch=0)
                records += [storage.consumer_group_current_assignment_tombstone(gid, current.member_id),
                            storage.consumer_group_target_assignment_tombstone(gid, current.member_id),
                            storage.consumer_group_member_subscription_tombstone(gid, current.member_id)]
                cancel.append(current.member_id)
                inherit[member_id] = current.member_id
                freed = dict(current.assigned_partitions)
                log.info("[GroupId %s] Static member %s with instance id %s re-joins the consumer group.", gid,
                         member_id, req.instance_id)
        else:
            if current is None:
                raise ConsumerGroupError(E.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown.")
            if current.member_id != member_id:
                raise ConsumerGroupError(E.FENCED_INSTANCE_ID, f"Static member {member_id} with instance id "
                                         f"{req.instance_id} was fenced by member {current.member_id}.")
            member = current
            _check_member_epoch(member, epoch, req.owned)

    # 1. the member's subscription; the group epoch moves when subscriptions or topic metadata change.
    updated = member.with_(
        instance_id=req.instance_id if req.instance_id is not None else member.instance_id,
        rack_id=req.rack_id if req.rack_id is not None else member.rack_id,
        rebalance_timeout_ms=req.rebalance_timeout_ms if req.rebalance_timeout_ms != -1
        else member.rebalance_timeout_ms,
        server_assignor=req.server_assignor if req.server_assignor is not None else member.server_assignor,
        subscribed_topic_names=tuple(req.subscribed_topic_names) if req.subscribed_topic_names is not None
        else member.subscribed_topic_names,
        client_id=req.client_id, client_host=req.client_host)
    # ``previous``: the member whose subscription this one replaces (the old incarnation of a
    # replaced static member), None for a new member.
    previous = group.members.get(inherit[member_id]) if static_replaced else group.members.get(member_id)
    bump = False
    if static_replaced or _subscription_changed(previous, updated):
        records.append(storage.consumer_group_member_subscription_record(gid, updated))
        if previous is None or set(updated.subscribed_topic_names) != set(previous.subscribed_topic_names):
            log.info("[GroupId %s] Member %s updated its subscribed topics to: %s.", gid, member_id,
                     list(updated.subscribed_topic_names))
            bump = True
    group_epoch = group.group_epoch
    subscription_metadata = group.subscription_metadata
    if bump or image_epoch != group.metadata_image_epoch:
        subscription_metadata = compute_subscription_metadata(_subscribed_names(group, previous, updated),
                                                              topics_image)
        if subscription_metadata != group.subscription_metadata:
            bump = True
            records.append(storage.consumer_group_subscription_metadata_record(gid, subscription_metadata.values()))
        if bump:
            group_epoch += 1
            records.append(storage.consumer_group_epoch_record(gid, group_epoch))
            log.info("[GroupId %s] Bumped group epoch to %d.", gid, group_epoch)

    # 2. a new target assignment when the group epoch is ahead of it (or a static member was replaced).
    target_epoch = group.assignment_epoch
    target = group.target_for(member_id)
    if group_epoch > target_epoch or static_replaced:
        members = {mid: m for mid, m in group.members.items() if mid not in inherit.values()}
        members[member_id] = updated
        assignor = group.preferred_server_assignor(default_assignor, members.values())
        recs, new_target = build_target_assignment(group, group_epoch, ASSIGNORS[assignor], members,
                                                   subscription_metadata, inherit)
        records += recs
        target = new_target.get(member_id, EMPTY_ASSIGNMENT)
        target_epoch = group_epoch
        log.info("[GroupId %s] Computed a new target assignment for epoch %d with '%s' assignor.", gid,
                 group_epoch, assignor)

    # 3. reconcile the member toward its target.
    rebalance_timeout = None
    reconciled = updated
    if not updated.is_reconciled_to(target_epoch):
        if freed:
            # Partitions this heartbeat's own records release are free for it (the records
            # are replayed only after this computation).
            def partition_epoch(tid, p, _g=group, _f=freed):
                if p in _f.get(tid, ()):
                    return -1
                return _g.current_partition_epoch(tid, p)
        else:
            partition_epoch = group.current_partition_epoch
        reconciled = reconcile(updated, target_epoch, target, partition_epoch, req.owned)
        if reconciled != updated or static_replaced:
            records.append(storage.consumer_group_current_assignment_record(gid, reconciled))
            log.info("[GroupId %s] Member %s new assignment state: epoch=%d, previousEpoch=%d, state=%s, "
                     "assigned=%s, revoking=%s.", gid, member_id, reconciled.member_epoch,
                     reconciled.previous_member_epoch, reconciled.state.name,
                     assignment_to_str(reconciled.assigned_partitions),
                     assignment_to_str(reconciled.partitions_pending_revocation))
            if reconciled.state is MemberState.UNREVOKED_PARTITIONS:
                rebalance_timeout = ("schedule", reconciled.member_epoch, reconciled.rebalance_timeout_ms)
            else:
                rebalance_timeout = ("cancel",)
    elif member_id not in group.members and not any(r.key_version == 8 for r in records):
        records.append(storage.consumer_group_current_assignment_record(gid, reconciled))

    send_assignment = req.owned is not None or epoch == 0 or \
        reconciled.assigned_partitions != member.assigned_partitions
    return HeartbeatOutcome(records, member_id, reconciled.member_epoch,
                            reconciled.assigned_partitions if send_assignment else None,
                            True, rebalance_timeout, cancel, image_epoch)


def _subscription_changed(old: ConsumerGroupMember | None, new: ConsumerGroupMember) -> bool:
    if old is None:
        return True
    return (old.instance_id, old.rack_id, old.client_id, old.client_host, old.subscribed_topic_names,
            old.subscribed_topic_regex, old.rebalance_timeout_ms, old.server_assignor) != \
        (new.instance_id, new.rack_id, new.client_id, new.client_host, new.subscribed_topic_names,
         new.subscribed_topic_regex, new.rebalance_timeout_ms, new.server_assignor)


def fence_member(group: ConsumerGroup, member: ConsumerGroupMember, topics_image: Mapping) -> list:
    """Records removing ``member`` and bumping the group epoch (``consumerGroupFenceMember``)."""
    gid = group.group_id
    records = [storage.consumer_group_current_assignment_tombstone(gid, member.member_id),
               storage.consumer_group_target_assignment_tombstone(gid, member.member_id),
               storage.consumer_group_member_subscription_tombstone(gid, member.member_id)]
    metadata = compute_subscription_metadata(_subscribed_names(group, member, None), topics_image)
    if metadata != group.subscription_metadata:
        records.append(storage.consumer_group_subscription_metadata_record(gid, metadata.values()))
    records.append(storage.consumer_group_epoch_record(gid, group.group_epoch + 1))
    return records


def static_member_temporary_leave(group: ConsumerGroup, member: ConsumerGroupMember) -> list:
    """A static member leaving with epoch -2: it keeps its partitions for a session timeout."""
    leaving = member.with_(member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH, partitions_pending_revocation={})
    return [storage.consumer_group_current_assignment_record(group.group_id, leaving)]

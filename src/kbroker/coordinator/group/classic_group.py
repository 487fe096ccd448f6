"""A classic-protocol consumer group: members, generation, state (Kafka's
``core/.../coordinator/group/GroupMetadata.scala`` + ``MemberMetadata.scala``;
3.9: ``group-coordinator/.../classic/ClassicGroup.java``).

State machine (the transitions the coordinator drives; anything else is a bug
and raises)::

    Empty ──join──▶ PreparingRebalance ──all joined / rebalance timeout──▶ CompletingRebalance
      ▲                 ▲   ▲                                                   │ leader's SyncGroup
      │                 │   └──────── member joins / leaves / fails ────────────┤ (stored)
      │  last member    │                                                       ▼
      └── leaves ───────┴────────── member joins / leaves / fails ◀──────── Stable
    any state ──▶ Dead   (group deleted, expired, or its partition unloaded)

Generation ids grow by one per completed join phase (also into Empty). The
leader is a member that joined the current generation; the protocol is the
one every member supports that most members list first (a vote).

Static membership (KIP-345): ``static_members`` maps group.instance.id to the
current member id; a new member id for a known instance id replaces the old
member in place (the old one is fenced: FENCED_INSTANCE_ID).

Thread-safety: every field is guarded by ``lock`` (a reentrant lock, Kafka's
``group.lock``); the coordinator holds it for every read and write, and the
delayed operations (join, sync, heartbeat) of this group use it as their lock.
"""
from __future__ import annotations

import enum
import threading
from typing import Callable

from kbroker.coordinator.group.offsets import OffsetStore
from kbroker.protocol.messages.consumer_protocol_subscription import ConsumerProtocolSubscription

__all__ = ["GroupState", "ClassicMember", "ClassicGroup", "CONSUMER_PROTOCOL_TYPE"]

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_VALID_PREVIOUS = {
    GroupState.DEAD: {GroupState.STABLE, GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE,
                      GroupState.EMPTY, GroupState.DEAD},
    GroupState.COMPLETING_REBALANCE: {GroupState.PREPARING_REBALANCE},
    GroupState.STABLE: {GroupState.COMPLETING_REBALANCE},
    GroupState.PREPARING_REBALANCE: {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY},
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE},
}


class ClassicMember:
    """One member: its protocols (name → metadata, in the client's preference
    order), timeouts, current assignment and the JoinGroup / SyncGroup
    callbacks it is waiting on (None when not waiting)."""

    __slots__ = ("member_id", "group_instance_id", "client_id", "client_host", "rebalance_timeout_ms",
                 "session_timeout_ms", "protocol_type", "protocols", "assignment", "awaiting_join_callback",
                 "awaiting_sync_callback", "is_new", "heartbeat_satisfied", "is_leaving")

    def __init__(self, member_id: str, group_instance_id: str | None, client_id: str, client_host: str,
                 rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
                 protocols: list[tuple[str, bytes]]) -> None:
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = protocols
        self.assignment = b""
        self.awaiting_join_callback: Callable | None = None
        self.awaiting_sync_callback: Callable | None = None
        self.is_new = False
        self.heartbeat_satisfied = False
        self.is_leaving = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.awaiting_join_callback is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.awaiting_sync_callback is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, md in self.protocols:
            if name == protocol:
                return md
        raise KeyError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        """Same protocols, same order, same metadata (a rejoin with nothing changed)."""
        return len(protocols) == len(self.protocols) and all(
            a[0] == b[0] and bytes(a[1]) == bytes(b[1]) for a, b in zip(protocols, self.protocols))

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """Kafka's ``hasSatisfiedHeartbeat``: members mid-rebalance need no heartbeat."""
        if self.is_leaving:
            return True
        if self.is_new:
            return self.heartbeat_satisfied
        if self.is_awaiting_join or self.is_awaiting_sync:
            return True
        return self.heartbeat_satisfied


class ClassicGroup:
    """One classic group's membership state and committed offsets (see the module docstring)."""

    group_type = "classic"

    def __init__(self, group_id: str, state: GroupState = GroupState.EMPTY, now_ms: int = -1) -> None:
        self.group_id = group_id
        self.lock = threading.RLock()
        self.state = state
        self.current_state_timestamp_ms: int = now_ms
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, ClassicMember] = {}   # insertion order = join order
        self.static_members: dict[str, str] = {}       # group.instance.id -> member id
        self.pending_members: set[str] = set()         # got MEMBER_ID_REQUIRED, not joined yet
        self.pending_sync_members: set[str] = set()    # joined this generation, not synced yet
        self.num_members_awaiting_join = 0
        self.supported_protocols: dict[str, int] = {}  # protocol -> members supporting it
        self.new_member_added = False
        self.subscribed_topics: set[str] | None = None
        self.offsets = OffsetStore()
        #: The rebalance's DelayedSync, if one is scheduled (cancelled on the next rebalance).
        self.delayed_sync = None

    # -- state ------------------------------------------------------------------------
    def is_state(self, state: GroupState) -> bool:
        return self.state is state

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise RuntimeError(f"group {self.group_id}: illegal transition {self.state.value} -> {state.value}")
        self.state = state
        self.current_state_timestamp_ms = now_ms

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[GroupState.PREPARING_REBALANCE]

    @property
    def is_empty_state(self) -> bool:
        return self.state is GroupState.EMPTY

    # -- members ------------------------------------------------------------------------
    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def get(self, member_id: str) -> ClassicMember:
        return self.members[member_id]

    def size(self) -> int:
        return len(self.members)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_members

    def has_static_member(self, group_instance_id: str | None) -> bool:
        return group_instance_id is not None and group_instance_id in self.static_members

    def static_member_id(self, group_instance_id: str | None) -> str | None:
        return None if group_instance_id is None else self.static_members.get(group_instance_id)

    def is_static_member_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        """A known instance id presented with a member id that is not its current one."""
        if group_instance_id is None:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def add(self, member: ClassicMember, join_callback: Callable | None = None) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if member.protocol_type != self.protocol_type:
            raise RuntimeError("member protocol type differs from the group's")
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        for name in member.protocol_names():
            self.supported_protocols[name] = self.supported_protocols.get(name, 0) + 1
        member.awaiting_join_callback = join_callback
        if member.is_awaiting_join:
            self.num_members_awaiting_join += 1
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> ClassicMember | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            for name in member.protocol_names():
                self.supported_protocols[name] -= 1
                if not self.supported_protocols[name]:
                    del self.supported_protocols[name]
            if member.is_awaiting_join:
                self.num_members_awaiting_join -= 1
            if member.group_instance_id is not None and \
                    self.static_members.get(member.group_instance_id) == member_id:
                del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)
        return member

    def update_member(self, member: ClassicMember, protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
                      session_timeout_ms: int, join_callback: Callable | None) -> None:
        for name in member.protocol_names():
            self.supported_protocols[name] -= 1
            if not self.supported_protocols[name]:
                del self.supported_protocols[name]
        for name, _ in protocols:
            self.supported_protocols[name] = self.supported_protocols.get(name, 0) + 1
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if join_callback is not None and not member.is_awaiting_join:
            self.num_members_awaiting_join += 1
        elif join_callback is None and member.is_awaiting_join:
            self.num_members_awaiting_join -= 1
        member.awaiting_join_callback = join_callback

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str,
                              fence: Callable[[ClassicMember], None]) -> ClassicMember:
        """Give the instance's member a new member id; ``fence(member)`` first
        answers the old incarnation's waiting JoinGroup / SyncGroup."""
        member = self.members.pop(old_member_id)
        fence(member)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        if old_member_id in self.pending_sync_members:
            self.pending_sync_members.discard(old_member_id)
            self.pending_sync_members.add(new_member_id)
        return member

    def add_pending_member(self, member_id: str) -> None:
        self.pending_members.add(member_id)

    def not_yet_rejoined_members(self) -> list[ClassicMember]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_members_awaiting_join and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else pick any member that did; False if none did."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.is_awaiting_join:
            return True
        for mid, m in self.members.items():
            if m.is_awaiting_join:
                self.leader_id = mid
                return True
        return False

    # -- protocols ---------------------------------------------------------------------------
    def supports_protocols(self, protocol_type: str, protocol_names: list[str]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocol_names)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(self.supported_protocols.get(p, 0) == n
                                                          for p in protocol_names)

    def select_protocol(self) -> str:
        """The protocol all members support that most of them prefer (ties: first counted)."""
        if not self.members:
            raise RuntimeError("cannot select a protocol for an empty group")
        n = len(self.members)
        candidates = {p for p, c in self.supported_protocols.items() if c == n}
        votes: dict[str, int] = {}
        for m in self.members.values():
            v = m.vote(candidates)
            votes[v] = votes.get(v, 0) + 1
        best = max(votes.values())
        return next(p for p, c in votes.items() if c == best)

    def compute_subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol only; None = unknown)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        try:
            for m in self.members.values():
                md = memoryview(m.metadata(self.protocol_name))
                # Version 0's layout prefixes every later version's.
                sub = ConsumerProtocolSubscription.decode(md[2:], 0)
                topics.update(sub.topics)
        except Exception:
            return None
        return topics

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return self.subscribed_topics is not None and topic in self.subscribed_topics

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def current_member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        """(member_id, group_instance_id, metadata of the selected protocol) for the leader."""
        if self.protocol_name is None:
            raise RuntimeError("no protocol selected")
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values()]

    def has_received_sync_from_all_members(self) -> bool:
        return not self.pending_sync_members

    # -- callbacks ------------------------------------------------------------------------------
    def maybe_invoke_join_callback(self, member: ClassicMember, result) -> bool:
        cb = member.awaiting_join_callback
        if cb is None:
            return False
        member.awaiting_join_callback = None
        self.num_members_awaiting_join -= 1
        cb(result)
        return True

    def maybe_invoke_sync_callback(self, member: ClassicMember, result) -> bool:
        cb = member.awaiting_sync_callback
        if cb is None:
            return False
        member.awaiting_sync_callback = None
        cb(result)
        return True

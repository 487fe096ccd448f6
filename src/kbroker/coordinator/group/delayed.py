"""The classic protocol's delayed operations (Kafka: ``DelayedJoin.scala``,
``InitialDelayedJoin``, ``DelayedHeartbeat.scala``, ``DelayedSync.scala``).

Each one uses its group's lock as its operation lock, so ``try_complete`` /
expiry run with the group locked, and the coordinator (which owns the logic)
is called back. Watch keys:

* ``join_key(group_id)``: the rebalance's DelayedJoin / InitialDelayedJoin
  (rebalance purgatory): completes when every member has rejoined, or on the
  rebalance timeout.
* ``sync_key(group_id)``: the DelayedSync (rebalance purgatory): members that
  have not sent SyncGroup within the rebalance timeout are removed.
* ``member_key(group_id, member_id)``: a member's DelayedHeartbeat (heartbeat
  purgatory): the session timeout (or, for a pending member id, its deadline
  to rejoin).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from kbroker.server.purgatory import DelayedOperation

if TYPE_CHECKING:  # pragma: no cover
    from kbroker.coordinator.group.classic_group import ClassicGroup
    from kbroker.coordinator.group.coordinator import GroupCoordinator

__all__ = ["DelayedJoin", "InitialDelayedJoin", "DelayedHeartbeat", "DelayedSync",
           "join_key", "sync_key", "member_key"]


def join_key(group_id: str) -> tuple:
    return ("join", group_id)


def sync_key(group_id: str) -> tuple:
    return ("sync", group_id)


def member_key(group_id: str, member_id: str) -> tuple:
    return ("member", group_id, member_id)


class DelayedJoin(DelayedOperation):
    """Waits for all members to (re)join, at most the group's rebalance timeout."""

    def __init__(self, coordinator: "GroupCoordinator", group: "ClassicGroup", rebalance_timeout_ms: int) -> None:
        super().__init__(rebalance_timeout_ms, lock=group.lock)
        self.coordinator = coordinator
        self.group = group

    def try_complete(self) -> bool:
        if self.group.has_all_members_joined():
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.coordinator._on_complete_join(self.group)

    def on_expiration(self) -> None:
        pass


class InitialDelayedJoin(DelayedJoin):
    """The first rebalance of an Empty group waits ``group.initial.rebalance.delay.ms``
    and again as long as new members keep arriving, up to the rebalance timeout."""

    def __init__(self, coordinator, purgatory, group, configured_delay_ms: int, delay_ms: int,
                 remaining_ms: int) -> None:
        super().__init__(coordinator, group, delay_ms)
        self.purgatory = purgatory
        self.configured_delay_ms = configured_delay_ms
        self.remaining_ms = remaining_ms

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        group = self.group
        with group.lock:
            if group.new_member_added and self.remaining_ms != 0:
                group.new_member_added = False
                delay = min(self.configured_delay_ms, self.remaining_ms)
                remaining = max(self.remaining_ms - self.delay_ms, 0)
                self.purgatory.try_complete_else_watch(
                    InitialDelayedJoin(self.coordinator, self.purgatory, group, self.configured_delay_ms,
                                       delay, remaining), [join_key(group.group_id)])
            else:
                self.coordinator._on_complete_join(group)


class DelayedHeartbeat(DelayedOperation):
    """A member's session: expires unless a heartbeat (or rebalance step) satisfies it."""

    def __init__(self, coordinator, group, member_id: str, is_pending: bool, timeout_ms: int) -> None:
        super().__init__(timeout_ms, lock=group.lock)
        self.coordinator = coordinator
        self.group = group
        self.member_id = member_id
        self.is_pending = is_pending

    def try_complete(self) -> bool:
        if self.coordinator._heartbeat_satisfied(self.group, self.member_id, self.is_pending):
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self.coordinator._on_expire_heartbeat(self.group, self.member_id, self.is_pending)


class DelayedSync(DelayedOperation):
    """Members that joined ``generation_id`` must send SyncGroup within the rebalance timeout."""

    def __init__(self, coordinator, group, generation_id: int, timeout_ms: int) -> None:
        super().__init__(timeout_ms, lock=group.lock)
        self.coordinator = coordinator
        self.group = group
        self.generation_id = generation_id

    def try_complete(self) -> bool:
        if self.coordinator._pending_sync_done(self.group, self.generation_id):
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self.coordinator._on_expire_pending_sync(self.group, self.generation_id)

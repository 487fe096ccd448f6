"""ReplicaState: what a partition leader knows of one follower (Kafka's ``Replica``).

Offsets are the follower's as reported by its fetches; times are the leader's clock in
ms. ``last_caught_up_time_ms`` is the last time the follower was known to have every
record the leader had (Kafka's rule: a fetch at or past the leader's end offset catches
up at that fetch's time; a fetch at or past the leader's end offset *as of the previous
fetch* catches up at the previous fetch's time).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

UNKNOWN_OFFSET = -1


@dataclass(frozen=True, slots=True)
class ReplicaState:
    log_start_offset: int = UNKNOWN_OFFSET
    log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0
    broker_epoch: int | None = None   # from the follower's fetches (KIP-903); None: none seen

    def update_fetch_state(self, fetch_offset: int, log_start_offset: int, fetch_time_ms: int,
                           leader_end_offset: int, broker_epoch: int) -> "ReplicaState":
        """The state after a fetch at ``fetch_offset`` (the follower's log end offset)."""
        if fetch_offset >= leader_end_offset:
            caught_up = max(self.last_caught_up_time_ms, fetch_time_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            caught_up = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        else:
            caught_up = self.last_caught_up_time_ms
        return ReplicaState(log_start_offset, fetch_offset,
                            max(leader_end_offset, self.last_fetch_leader_log_end_offset),
                            fetch_time_ms, caught_up, broker_epoch)

    def reset(self, now_ms: int, leader_end_offset: int, is_new_leader: bool,
              is_follower_in_sync: bool) -> "ReplicaState":
        """On (re-)election of the local replica as leader: an in-sync follower counts as
        caught up now, any other as never (so it cannot hold the high watermark back)."""
        caught_up = now_ms if is_follower_in_sync else 0
        if is_new_leader:
            return ReplicaState(last_caught_up_time_ms=caught_up)
        return replace(self, last_fetch_leader_log_end_offset=leader_end_offset,
                       last_fetch_time_ms=now_ms if is_follower_in_sync else 0,
                       last_caught_up_time_ms=caught_up)

    def is_caught_up(self, leader_end_offset: int, now_ms: int, replica_lag_time_max_ms: int) -> bool:
        return (leader_end_offset == self.log_end_offset
                or now_ms - self.last_caught_up_time_ms <= replica_lag_time_max_ms)

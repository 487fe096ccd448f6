"""DelayedProduce and DelayedFetch: operations parked in the purgatory.

Kafka: ``core/.../server/DelayedProduce.scala``, ``DelayedFetch.scala``.
Both answer exactly once from ``on_complete`` (the purgatory's guarantee),
on whichever thread completes them: a handler thread appending records, or
the expiration reaper.
"""
from __future__ import annotations

from dataclasses import dataclass

from kbroker.protocol import ErrorCode
from kbroker.server.purgatory import DelayedOperation


@dataclass
class FetchPartitionStatus:
    """What one partition of a fetch asks for."""

    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    log_start_offset: int = -1
    last_fetched_epoch: int = -1
    #: where fetch_offset lives (LogOffsetMetadata), filled by DelayedFetch on first check
    fetch_offset_metadata: object = None
    #: a follower's fetch: its broker epoch (ReplicaState, Fetch v15+; -1 unknown)
    replica_epoch: int = -1


class DelayedProduce(DelayedOperation):
    """acks=all: waits until the high watermark passes every appended offset.

    Partitions still waiting when the timeout fires answer REQUEST_TIMED_OUT
    (Kafka presets that code, so an expired operation already carries it).
    """

    def __init__(self, delay_ms: int, replica_manager, results: dict, respond):
        super().__init__(delay_ms)
        self.replica_manager = replica_manager
        self.results = results
        self.respond = respond
        self.pending = {tp for tp, r in results.items() if r.error == ErrorCode.NONE and r.last_offset >= 0}

    def try_complete(self) -> bool:
        rm = self.replica_manager
        for tp in list(self.pending):
            part = rm.get_partition(tp)
            if part is None or not part.is_leader:
                self.results[tp].error = ErrorCode.NOT_LEADER_OR_FOLLOWER
                self.pending.discard(tp)
            elif part.log.high_watermark > self.results[tp].last_offset:
                if part.leader_state is not None:
                    # replicated: NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below min.insync
                    err = part.acks_all_error(self.results[tp].last_offset + 1)
                    if err is None:
                        continue
                    self.results[tp].error = err
                self.pending.discard(tp)
        if not self.pending:
            return self.force_complete()
        return False

    def on_expiration(self) -> None:
        pass

    def on_complete(self) -> None:
        for tp in self.pending:
            self.results[tp].error = ErrorCode.REQUEST_TIMED_OUT
        self.respond(self.results)


class DelayedFetch(DelayedOperation):
    """Waits for fetch.min.bytes of new data (or an error / a changed partition),
    or for max_wait_ms; then reads again and answers."""

    def __init__(self, delay_ms: int, replica_manager, fetch_infos, min_bytes: int, max_bytes: int,
                 isolation_level: int, replica_id: int, respond):
        super().__init__(delay_ms)
        self.replica_manager = replica_manager
        self.fetch_infos = fetch_infos
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.isolation_level = isolation_level
        self.replica_id = replica_id
        self.respond = respond

    def try_complete(self) -> bool:
        """Kafka's DelayedFetch.tryComplete cases: partition gone, offset now out of
        range or on another segment than the end (truncation / roll): complete; else
        count the bytes between the fetch offset and the end (HW for consumers, the
        last stable offset for read_committed ones)."""
        rm = self.replica_manager
        accumulated = 0
        for tp, st in self.fetch_infos:
            part = rm.get_partition(tp)
            if part is None or not part.is_leader:
                return self.force_complete()  # UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER now
            lg = part.log
            try:
                # published metadata: no lookup and no log lock per waiting fetch per append
                if self.replica_id >= 0:
                    em = lg.log_end_offset_metadata
                elif self.isolation_level == 1:
                    em = lg.last_stable_offset_metadata()   # the HW's unless a transaction is open
                else:
                    em = lg.high_watermark_metadata
            except Exception:
                return self.force_complete()
            end = em.message_offset
            if end == st.fetch_offset:
                continue
            if st.fetch_offset > end or st.fetch_offset < lg.log_start_offset:
                return self.force_complete()  # out of range now
            try:
                fm = st.fetch_offset_metadata
                if fm is None:
                    fm = st.fetch_offset_metadata = lg.convert_to_offset_metadata(st.fetch_offset)
            except Exception:
                return self.force_complete()
            if fm.segment_base_offset != em.segment_base_offset:
                return self.force_complete()  # rolled or truncated: let the read sort it out
            accumulated += min(st.max_bytes, em.relative_position_in_segment - fm.relative_position_in_segment)
            if accumulated >= self.min_bytes:
                return self.force_complete()
        return False

    def on_expiration(self) -> None:
        pass

    def on_complete(self) -> None:
        results = self.replica_manager.read_from_local_log(
            self.fetch_infos, self.max_bytes, True, self.isolation_level, self.replica_id)
        self.respond(results)

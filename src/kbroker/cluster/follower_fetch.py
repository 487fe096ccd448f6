"""The leader's side of a follower's Fetch: read, diverging epoch, follower state, high watermark.

Kafka: ``Partition.fetchRecords`` for a follower (``isFromFollower``) and
``Partition.updateFollowerFetchState`` / ``maybeIncrementLeaderHW``. Pure apart from
the log it reads (kbroker.log.Log, or anything with the same methods): the caller
passes the clock, holds the partition's lock (Kafka's leaderIsrUpdateLock) around
:func:`handle_follower_fetch`, submits the returned ISR proposal to its
AlterPartitionManager and completes the DelayedProduces the high watermark passed.

Order, as Kafka's:

1. ``current_leader_epoch`` newer than ours: UNKNOWN_LEADER_EPOCH; older:
   FENCED_LEADER_EPOCH (the follower must learn the new metadata first).
2. ``last_fetched_epoch`` given: if our log ends that epoch below the fetch offset, or
   only knows a smaller epoch, the answer is ``diverging_epoch`` = (the largest epoch
   of ours at or below it, where it ends here) and no records; the follower truncates
   there. The follower's state is *not* updated from such a fetch: its fetch offset
   is not a position in our log. An epoch we cannot place: OFFSET_OUT_OF_RANGE.
3. Read up to the log end offset (followers are not bounded by the high watermark);
   outside [log start, log end]: OFFSET_OUT_OF_RANGE.
4. The follower's log end offset is its fetch offset: its state (caught-up time), an
   ISR expansion when it reached the high watermark (and, stricter than Kafka, once its
   log start offset is not below ours: see PartitionLeader.update_follower_fetch_state),
   then the high watermark = the least log end offset over the (maximal) ISR, moved
   forward only.

The answer carries the high watermark read *before* this fetch moved it (the follower
learns a new one on its next fetch), the log start offset, and the records.
"""
from __future__ import annotations

from dataclasses import dataclass

from kbroker.cluster.partition_leader import NotLeaderOrFollowerError, PartitionLeader
from kbroker.log.errors import OffsetOutOfRangeError
from kbroker.log.info import LogOffsetMetadata
from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.fetch import EpochEndOffset, PartitionData

UNDEFINED_EPOCH = -1


@dataclass(frozen=True, slots=True)
class FollowerFetchResult:
    """What :func:`handle_follower_fetch` did: the partition's answer, the ISR proposal
    to submit (or None), and the new high watermark if it moved (else None)."""
    data: PartitionData
    proposal: object = None
    new_high_watermark: int | None = None


def read_for_follower(log, *, leader_epoch: int, current_leader_epoch: int, fetch_offset: int,
                      last_fetched_epoch: int, max_bytes: int,
                      min_one_message: bool = True) -> tuple[PartitionData, int | None]:
    """Steps 1-3: the answer, and the leader's log end offset of the read (None when the
    fetch must not update the follower's state: an error or a diverging epoch).
    ``min_one_message``: a first batch larger than ``max_bytes`` is returned whole (KIP-74:
    only for the first partition of a response that has records; the caller clears it)."""
    hw = log.high_watermark
    lso = log.log_start_offset

    def answer(error=ErrorCode.NONE, **kw):
        return PartitionData(error_code=error, high_watermark=hw, log_start_offset=lso,
                             last_stable_offset=hw, **kw)

    if current_leader_epoch != UNDEFINED_EPOCH:
        if current_leader_epoch > leader_epoch:
            return answer(ErrorCode.UNKNOWN_LEADER_EPOCH), None
        if current_leader_epoch < leader_epoch:
            return answer(ErrorCode.FENCED_LEADER_EPOCH), None
    if last_fetched_epoch != UNDEFINED_EPOCH:
        epoch, end = log.end_offset_for_epoch(last_fetched_epoch)
        if epoch == UNDEFINED_EPOCH or end < 0:
            return answer(ErrorCode.OFFSET_OUT_OF_RANGE), None
        if epoch < last_fetched_epoch or end < fetch_offset:
            return answer(diverging_epoch=EpochEndOffset(epoch=epoch, end_offset=end)), None
    leo = log.log_end_offset
    try:
        info = log.read(fetch_offset, max_bytes, min_one_message=min_one_message)
    except OffsetOutOfRangeError:
        return answer(ErrorCode.OFFSET_OUT_OF_RANGE), None
    return answer(records=info.records), leo


def handle_follower_fetch(leader: PartitionLeader, log, now_ms: int, *, replica_id: int, broker_epoch: int,
                          current_leader_epoch: int, fetch_offset: int, last_fetched_epoch: int,
                          log_start_offset: int, max_bytes: int, min_one_message: bool = True) -> FollowerFetchResult:
    """A follower's fetch of one partition led here (module docstring, steps 1-4)."""
    if not leader.is_leader:
        return FollowerFetchResult(PartitionData(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                                 high_watermark=-1))
    data, leader_end = read_for_follower(log, leader_epoch=leader.leader_epoch,
                                         current_leader_epoch=current_leader_epoch, fetch_offset=fetch_offset,
                                         last_fetched_epoch=last_fetched_epoch, max_bytes=max_bytes,
                                         min_one_message=min_one_message)
    if leader_end is None:
        return FollowerFetchResult(data)
    try:
        proposal = leader.update_follower_fetch_state(now_ms, replica_id, fetch_offset, log_start_offset,
                                                      leader_end, log.high_watermark, broker_epoch,
                                                      leader_log_start_offset=data.log_start_offset)
    except NotLeaderOrFollowerError:
        return FollowerFetchResult(PartitionData(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                                 high_watermark=-1))
    return FollowerFetchResult(data, proposal, maybe_increment_high_watermark(leader, log, now_ms))


def maybe_increment_high_watermark(leader: PartitionLeader, log, now_ms: int) -> int | None:
    """Kafka's maybeIncrementLeaderHW: move the log's high watermark up to the least log
    end offset over the maximal ISR (PartitionLeader.high_watermark_candidate). Call
    after a follower fetch, a local append, and an ISR change. Returns the new high
    watermark if it moved."""
    if not leader.is_leader:
        return None
    candidate = leader.high_watermark_candidate(now_ms, log.log_end_offset)
    if candidate is None or candidate <= log.high_watermark:
        return None
    if log.maybe_increment_high_watermark(LogOffsetMetadata(candidate)) is None:
        return None
    return log.high_watermark

"""KafkaMetadataLog: the ReplicatedLog over our on-disk Kafka-format ``Log`` (Kafka's
``KafkaMetadataLog``), i.e. ``<metadata.log.dir>/__cluster_metadata-0`` with the same
segments, indexes, leader-epoch checkpoint and recovery as any partition.

Mapping: ``end_offset`` is the log end offset; ``durable_end_offset`` the recovery point
(everything below it fsynced); the epoch cache is the log's leader-epoch cache, fed by
stamping each appended batch's epoch (``leader_epoch=``), leader and follower alike.
Batches are built by the Raft client with their final base offsets, so nothing is
reassigned (``assign_offsets=False``). Snapshot files (KIP-630) are not written yet: the
snapshot methods raise NotImplementedError (MemoryLog has them).
"""
from __future__ import annotations

import os

from kbroker.log.log import Log
from kbroker.raft.messages import METADATA_PARTITION, METADATA_TOPIC
from kbroker.raft.replicated_log import DATA, Batch, OffsetAndEpoch, ReplicatedLog, build_batch, decode_batches


class KafkaMetadataLog(ReplicatedLog):
    def __init__(self, log: Log) -> None:
        self.log = log

    @classmethod
    def open(cls, metadata_log_dir: str, **kw) -> "KafkaMetadataLog":
        d = os.path.join(metadata_log_dir, "%s-%d" % (METADATA_TOPIC, METADATA_PARTITION))
        return cls(Log.open(d, **kw))

    @property
    def start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def durable_end_offset(self) -> int:
        return self.log.recovery_point

    def _append(self, b: Batch) -> None:
        if b.base_offset != self.end_offset:
            raise ValueError("append at %d but the log ends at %d" % (b.base_offset, self.end_offset))
        latest = self.log.latest_epoch
        if latest is not None and b.epoch < latest:
            raise ValueError("epoch %d after epoch %d" % (b.epoch, latest))
        self.log.append(bytearray(b.data), leader_epoch=b.epoch, assign_offsets=False)

    def append_as_leader(self, records, epoch, control_type=DATA, timestamp_ms=0):
        b = build_batch(self.end_offset, epoch, records, control_type, timestamp_ms)
        self._append(b)
        return b

    def append_as_follower(self, batches):
        for b in batches:
            if b.next_offset <= self.end_offset:
                continue
            self._append(b)

    def truncate_to(self, offset):
        self.log.truncate_to(offset)

    def read(self, start_offset, max_bytes):
        if start_offset >= self.end_offset:
            return []
        info = self.log.read(start_offset, max_bytes)
        recs = info.records
        data = recs.read_bytes() if hasattr(recs, "read_bytes") else bytes(recs)
        return decode_batches(data)

    def flush(self):
        self.log.flush()

    def epoch_entries(self):
        return [OffsetAndEpoch(off, epoch) for epoch, off in self.log.leader_epoch_cache.epoch_entries()]

    def update_high_watermark(self, offset):
        self.high_watermark = offset
        self.log.update_high_watermark(offset)

    def close(self, sync: bool = True) -> None:
        self.log.close(sync)

"""KafkaMetadataLog: the ReplicatedLog over our on-disk Kafka-format ``Log`` (Kafka's
``KafkaMetadataLog``), i.e. ``<metadata.log.dir>/__cluster_metadata-0`` with the same
segments, indexes, leader-epoch checkpoint and recovery as any partition.

Mapping: ``end_offset`` is the log end offset; ``durable_end_offset`` the recovery point
(everything below it fsynced); the epoch cache is the log's leader-epoch cache, fed by
stamping each appended batch's epoch (``leader_epoch=``), leader and follower alike.
Batches are built by the Raft client with their final base offsets, so nothing is
reassigned (``assign_offsets=False``).

Snapshots (KIP-630) are files ``<offset %020d>-<epoch %010d>.checkpoint`` in the partition
directory, as Kafka names them, written to ``.checkpoint.part``, fsynced and renamed; their
bytes are what the state's owner gave (Kafka's are record batches framed by SnapshotHeader
and SnapshotFooter control records). Taking one moves the log start offset to it (the
records below are deleted, DeleteRecords-style); installing one fetched from the leader
empties the log and restarts it at the snapshot's offset. Opening the log again finds the
latest snapshot and starts the log there.
"""
from __future__ import annotations

import os
import re

from kbroker.log.log import Log
from kbroker.raft.messages import METADATA_PARTITION, METADATA_TOPIC
from kbroker.raft.replicated_log import DATA, Batch, OffsetAndEpoch, ReplicatedLog, build_batch, decode_batches


SNAPSHOT_SUFFIX = ".checkpoint"
_SNAPSHOT_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")


def snapshot_file_name(snapshot_id: OffsetAndEpoch) -> str:
    return "%020d-%010d%s" % (snapshot_id.offset, snapshot_id.epoch, SNAPSHOT_SUFFIX)


class KafkaMetadataLog(ReplicatedLog):
    def __init__(self, log: Log) -> None:
        self.log = log
        self._snapshots = sorted(OffsetAndEpoch(int(m.group(1)), int(m.group(2)))
                                 for m in map(_SNAPSHOT_NAME.match, os.listdir(log.dir)) if m)
        for f in os.listdir(log.dir):
            if f.endswith(SNAPSHOT_SUFFIX + ".part"):
                os.unlink(os.path.join(log.dir, f))      # a snapshot whose writer crashed
        snap = self.latest_snapshot_id()
        if snap is not None and self.start_offset < snap.offset:
            if self.end_offset < snap.offset:
                log.truncate_fully_and_start_at(snap.offset)
            else:
                log.update_high_watermark(snap.offset)
                log.delete_records(snap.offset)

    @classmethod
    def open(cls, metadata_log_dir: str, **kw) -> "KafkaMetadataLog":
        d = os.path.join(metadata_log_dir, "%s-%d" % (METADATA_TOPIC, METADATA_PARTITION))
        return cls(Log.open(d, **kw))

    # -- snapshots -------------------------------------------------------------------------
    def latest_snapshot_id(self):
        return self._snapshots[-1] if self._snapshots else None

    def read_snapshot(self, snapshot_id):
        if snapshot_id not in self._snapshots:
            return None
        with open(os.path.join(self.log.dir, snapshot_file_name(snapshot_id)), "rb") as f:
            return f.read()

    def _write_snapshot(self, snapshot_id, data) -> None:
        path = os.path.join(self.log.dir, snapshot_file_name(snapshot_id))
        part = path + ".part"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(part, path)
        d = os.open(self.log.dir, os.O_RDONLY)
        try:
            os.fsync(d)
        finally:
            os.close(d)
        # keep only the newest snapshot (Kafka keeps older ones until log retention passes them)
        for old in self._snapshots:
            if old != snapshot_id:
                try:
                    os.unlink(os.path.join(self.log.dir, snapshot_file_name(old)))
                except FileNotFoundError:
                    pass
        self._snapshots = [snapshot_id]

    def create_snapshot(self, snapshot_id, data):
        off = snapshot_id.offset
        if off > self.durable_end_offset or off < self.start_offset:
            raise ValueError("snapshot at %d outside the durable log [%d, %d)"
                             % (off, self.start_offset, self.durable_end_offset))
        self._write_snapshot(snapshot_id, bytes(data))
        if self.log.high_watermark < off:
            self.log.update_high_watermark(off)
        self.log.delete_records(off)

    def install_snapshot(self, snapshot_id, data):
        self._write_snapshot(snapshot_id, bytes(data))
        self.log.truncate_fully_and_start_at(snapshot_id.offset)
        self.log.flush()

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

"""SnapshotGenerator: this node's snapshots of the committed metadata (KIP-630).

Kafka: ``metadata/.../image/publisher/SnapshotGenerator.java`` fed by the node's
``MetadataLoader``. Every node (controller or broker) snapshots its own copy of
``__cluster_metadata``: it follows the committed records into an immutable
:class:`~kbroker.metadata.image.MetadataImage` and, once
``metadata.log.max.record.bytes.between.snapshots`` bytes of records were committed since
the last snapshot, or ``metadata.log.max.snapshot.interval.ms`` passed with at least one
new record (0 turns the time trigger off), writes the image as a snapshot at the next
offset. The raft client then deletes the log before it; a follower or observer whose
fetch falls below the leader's log start pulls the snapshot with FetchSnapshot.

Threads: the Listener methods run on the raft thread. The image is immutable, so
encoding the snapshot (the expensive part) runs on a short-lived worker thread; the file
is written and the log trimmed back on the raft thread (``RaftManager.submit``), where
the client's state lives. At most one snapshot is in flight.
"""
from __future__ import annotations

import logging
import threading
import time

from kbroker.metadata.delta import MetadataDelta
from kbroker.metadata.image import MetadataImage
from kbroker.metadata.serde import MetadataParseError, deserialize
from kbroker.metadata.snapshot import decode_snapshot, encode_snapshot
from kbroker.raft.client import Listener
from kbroker.raft.replicated_log import DATA

log = logging.getLogger(__name__)


class SnapshotGenerator(Listener):
    def __init__(self, node_id: int, max_bytes_between: int, max_interval_ms: int,
                 on_written=(), now_ms=None):
        self.node_id = node_id
        self.max_bytes_between = max_bytes_between
        self.max_interval_ms = max_interval_ms
        #: callables (snapshot id, records) told on the raft thread after a snapshot is written
        self.on_written = list(on_written)
        self._now_ms = now_ms or (lambda: time.monotonic_ns() // 1_000_000)
        self.raft = None                     # the RaftManager, set by attach()
        self.image = MetadataImage()
        self.next_offset = 0                 # the first offset not in ``image``
        self.bytes_since = 0                 # record bytes committed since the last snapshot
        self.last_snapshot_ms = self._now_ms()
        self.in_flight = False
        self.snapshots_written = 0

    def attach(self, raft_manager) -> None:
        self.raft = raft_manager

    # -- raft Listener (raft thread) ------------------------------------------------------------
    def handle_commit(self, batches) -> None:
        delta = MetadataDelta(self.image)
        for b in batches:
            if b.control_type == DATA:
                for i, value in enumerate(b.records):
                    self.bytes_since += len(value)
                    try:
                        delta.replay(deserialize(value), b.base_offset + i, b.epoch)
                    except MetadataParseError as e:
                        log.error("metadata record at offset %d cannot be decoded, skipped: %s",
                                  b.base_offset + i, e)
            self.next_offset = b.next_offset
        self.image = delta.apply()
        self._maybe_snapshot()

    def handle_load_snapshot(self, snapshot_id, data) -> None:
        delta = MetadataDelta(MetadataImage())
        for r in decode_snapshot(data):
            delta.replay(r)
        self.image = delta.apply()
        self.next_offset = snapshot_id.offset
        self.bytes_since = 0
        self.last_snapshot_ms = self._now_ms()

    # -- snapshots --------------------------------------------------------------------------
    def _due(self) -> bool:
        if self.bytes_since >= self.max_bytes_between:
            return True
        return (self.max_interval_ms > 0 and self.bytes_since > 0
                and self._now_ms() - self.last_snapshot_ms >= self.max_interval_ms)

    def _maybe_snapshot(self) -> None:
        if self.in_flight or self.raft is None or not self._due():
            return
        client = self.raft.client
        offset = self.next_offset
        if offset <= client.log.start_offset:
            return
        epoch = client.epoch_at(offset - 1)
        raft_control = getattr(client, "snapshot_control_records", lambda _o: [])(offset)
        image = self.image
        self.in_flight = True
        self.bytes_since = 0
        self.last_snapshot_ms = self._now_ms()

        def encode():
            try:
                records = image.to_records()
                data = encode_snapshot(records, int(time.time() * 1000), epoch=epoch, raft_control=raft_control)
            except Exception:
                log.exception("node %d: encoding the metadata snapshot at offset %d failed", self.node_id, offset)
                self.raft.submit(self._done)
                return
            self.raft.submit(lambda: self._write(offset, records, data))
        threading.Thread(target=encode, name=f"snapshot-{self.node_id}", daemon=True).start()

    def _done(self) -> None:
        self.in_flight = False

    def _write(self, offset: int, records: list, data: bytes) -> None:
        """On the raft thread: the file, then the log before it is deleted."""
        try:
            client = self.raft.client
            if offset > client.log.durable_end_offset:
                client.log.flush()
            t0 = time.monotonic()
            snap = client.create_snapshot(offset, data)
            if snap is None:
                return
            self.snapshots_written += 1
            log.info("node %d wrote metadata snapshot %s: %d records, %d bytes, %.1f ms", self.node_id,
                     tuple(snap), len(records), len(data), (time.monotonic() - t0) * 1000)
            for fn in self.on_written:
                fn(snap, records)
        except Exception:
            log.exception("node %d: writing the metadata snapshot at offset %d failed", self.node_id, offset)
        finally:
            self._done()

"""KRaft snapshot files: metadata records framed as Kafka's ``RecordsSnapshotWriter`` writes them.

Kafka: ``raft/.../snapshot/RecordsSnapshotWriter.java``, ``RecordsSnapshotReader.java``.
A snapshot (``<offset>-<epoch>.checkpoint``, or the ``bootstrap.checkpoint`` of a new
cluster) is a sequence of uncompressed v2 record batches, offsets counting from 0 inside
the file, every batch's partitionLeaderEpoch the snapshot's epoch:

- offset 0: a control batch with one record, key (version 0, SNAPSHOT_HEADER=3), value a
  SnapshotHeaderRecord v0 (``last_contained_log_timestamp``);
- then data batches of at most ``max_batch_records`` records each (null keys, values framed
  by :mod:`kbroker.metadata.serde`);
- last: a control batch with one record, key (0, SNAPSHOT_FOOTER=4), value a
  SnapshotFooterRecord v0.

The content is the state after every committed record *below* the snapshot's offset, as
the records that rebuild it from empty (``MetadataImage.to_records``). Pure: bytes in,
bytes out, the time passed in.
"""
from __future__ import annotations

import struct

from kbroker.kernels import records as _records
from kbroker.metadata.serde import ApiMessageAndVersion, deserialize, serialize
from kbroker.protocol.messages.snapshot_footer_record import SnapshotFooterRecord
from kbroker.protocol.messages.snapshot_header_record import SnapshotHeaderRecord

SNAPSHOT_HEADER, SNAPSHOT_FOOTER = 3, 4
MAX_BATCH_RECORDS = 1000


class SnapshotFormatError(ValueError):
    """The bytes are not a whole snapshot (damaged batch, no header or footer)."""


def control_key(control_type: int) -> bytes:
    """A control record's key: version 0, then the ControlRecordType id."""
    return struct.pack(">hh", 0, control_type)


def encode_snapshot(records: list[ApiMessageAndVersion], now_ms: int, *, epoch: int = 0,
                    last_contained_log_timestamp: int = 0,
                    max_batch_records: int = MAX_BATCH_RECORDS, raft_control=()) -> bytes:
    """The bytes of a snapshot file holding ``records`` (see the module docstring).
    ``raft_control``: (control type, value) records the first batch carries after the header
    (KIP-853: KRaftVersionRecord and VotersRecord, as Kafka's RecordsSnapshotWriter writes)."""
    def control(offset: int, ctype: int, value: bytes) -> bytes:
        return _records.encode_batch([(now_ms, control_key(ctype), value, ())], base_offset=offset,
                                     partition_leader_epoch=epoch, is_control=True)

    header = SnapshotHeaderRecord(version=0, last_contained_log_timestamp=last_contained_log_timestamp)
    first = [(now_ms, control_key(SNAPSHOT_HEADER), header.encode(0), ())]
    first += [(now_ms, control_key(t), v, ()) for t, v in raft_control]
    out = [_records.encode_batch(first, base_offset=0, partition_leader_epoch=epoch, is_control=True)]
    offset = len(first)
    for i in range(0, len(records), max_batch_records):
        chunk = records[i:i + max_batch_records]
        out.append(_records.encode_batch([(now_ms, None, serialize(r), ()) for r in chunk], base_offset=offset,
                                         partition_leader_epoch=epoch))
        offset += len(chunk)
    out.append(control(offset, SNAPSHOT_FOOTER, SnapshotFooterRecord(version=0).encode(0)))
    return b"".join(out)


def decode_snapshot(data, *, require_footer: bool = True) -> list[ApiMessageAndVersion]:
    """The metadata records of a snapshot's bytes, in order; control records (header, footer,
    KRaft version/voters) are skipped. SnapshotFormatError if a batch is damaged, the first
    batch is not the header, or (``require_footer``) the footer is missing."""
    out: list[ApiMessageAndVersion] = []
    seen_header = seen_footer = False
    try:
        for batch in _records.iter_batches(data):
            batch.validate()
            if seen_footer:
                raise SnapshotFormatError("records after the snapshot footer")
            if batch.is_control:
                for r in batch.records:
                    ctype = struct.unpack(">hh", bytes(r.key[:4]))[1] if r.key is not None and len(r.key) >= 4 else -1
                    if not seen_header and ctype != SNAPSHOT_HEADER:
                        raise SnapshotFormatError("the snapshot does not start with a SnapshotHeader")
                    seen_header = True
                    if ctype == SNAPSHOT_FOOTER:
                        seen_footer = True
                continue
            if not seen_header:
                raise SnapshotFormatError("the snapshot does not start with a SnapshotHeader")
            out.extend(deserialize(r.value) for r in batch.records)
    except SnapshotFormatError:
        raise
    except Exception as e:      # a damaged batch or record
        raise SnapshotFormatError(f"damaged snapshot: {e}") from e
    if require_footer and not seen_footer:
        raise SnapshotFormatError("the snapshot has no SnapshotFooter (truncated)")
    return out

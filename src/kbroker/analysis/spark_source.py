"""Spark data source ``"kbroker"``: read kbroker (Kafka-format) log segments.

::

    from kbroker.analysis.spark_source import register
    register(spark)
    df = spark.read.format("kbroker").load("/var/lib/kbroker/data")        # every partition
    df = spark.read.format("kbroker").load("/var/lib/kbroker/data/orders-3")  # one partition

Columns (Spark's Kafka source uses the same names)::

    topic           string
    partition       int
    offset          long
    timestamp       long     ms since the epoch, as stored (-1 = none); cast
                             with timestamp_millis() for a TIMESTAMP
    timestamp_type  int      0 CreateTime, 1 LogAppendTime (the batch's)
    key             binary   null for a null key
    value           binary   null for a tombstone
    headers         array<struct<key: string, value: binary>>

Layout read (Kafka's): ``<data dir>/<topic>-<partition>/<20-digit base
offset>.log``; other files (indexes, ``*.deleted``, ``*.cleaned``, ``*.swap``)
and directories not named ``<topic>-<partition>`` (e.g. Kafka's
``*-delete``/``*-future`` dirs) are ignored. One Spark partition per segment
file. Each segment is mmap'd and walked batch by batch (12-byte log overhead:
int64 base_offset, int32 batch_length); a short or zero-filled tail (a crash
mid-append, preallocated space) ends the segment. Batches are decoded by
kbroker's record-batch kernel (``kbroker.kernels.records``), CRCs checked;
control batches (transaction markers) are skipped. A corrupt batch fails the
read with ``CorruptRecordError`` naming the file and position, unless the
option ``ignoreCorrupt`` is ``"true"``, which ends that segment there.

Options: ``topic`` (only this topic), ``ignoreCorrupt`` ("false"),
``isolationLevel`` ("read_uncommitted"; "read_committed" skips the records of
aborted transactions, found in the partition's ``.txnindex`` files as a Kafka
consumer finds them in a fetch response; the data of transactions still open
when the files were written is read, since there is no last stable offset in
the files alone).
Rows are read on the executors, so ``kbroker`` must be importable there
(installed, or on ``PYTHONPATH`` / ``spark.executorEnv.PYTHONPATH``).
"""
from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

SCHEMA = ("topic string, partition int, offset long, timestamp long, timestamp_type int, "
          "key binary, value binary, headers array<struct<key: string, value: binary>>")

_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
_PARTITION_DIR_RE = re.compile(r"^(.+)-(\d+)$")
_LOG_OVERHEAD = 12          # int64 base_offset + int32 batch_length
_FRAME = struct.Struct(">qi")
#: a ``.txnindex`` entry (kbroker/log/txn_index.py): version, producer id, first offset,
#: last (marker) offset, last stable offset
_ABORTED_TXN = struct.Struct(">hqqqq")


@dataclass(frozen=True)
class SegmentPartition(InputPartition):
    """One ``.log`` segment file = one Spark partition."""
    path: str
    topic: str
    partition: int
    base_offset: int


def _partition_dir(path: str) -> tuple[str, int] | None:
    m = _PARTITION_DIR_RE.match(os.path.basename(os.path.normpath(path)))
    return (m.group(1), int(m.group(2))) if m else None


def find_segments(path: str, topic: str | None = None) -> list[SegmentPartition]:
    """Segments under a partition directory or a data directory, ordered by
    (topic, partition, base offset)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"kbroker data source: {path} is not a directory")
    tp = _partition_dir(path)
    if tp is not None and any(_SEGMENT_RE.match(n) for n in os.listdir(path)):
        dirs = [(path, *tp)]
    else:
        dirs = []
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            m = _PARTITION_DIR_RE.match(name)
            if m and os.path.isdir(full):
                dirs.append((full, m.group(1), int(m.group(2))))
    out = []
    for d, t, p in dirs:
        if topic is not None and t != topic:
            continue
        for name in os.listdir(d):
            m = _SEGMENT_RE.match(name)
            if m:
                out.append(SegmentPartition(os.path.join(d, name), t, p, int(m.group(1))))
    out.sort(key=lambda s: (s.topic, s.partition, s.base_offset))
    return out


def iter_segment_batches(path: str, ignore_corrupt: bool = False) -> Iterator:
    """Decoded batches of one segment file (data and control), in file order."""
    from kbroker.kernels import records
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = 0
            while size - pos >= _LOG_OVERHEAD:
                _, length = _FRAME.unpack_from(mm, pos)
                if length <= 0 or length > size - pos - _LOG_OVERHEAD:
                    break           # zero-filled or partially written tail
                frame = mm[pos:pos + _LOG_OVERHEAD + length]   # a copy: no views into the map
                try:
                    batches = records.decode_batches(frame)
                except records.CorruptRecordError as e:
                    if ignore_corrupt:
                        break
                    raise records.CorruptRecordError(f"{path} at position {pos}: {e}") from None
                yield from batches
                pos += _LOG_OVERHEAD + length


def aborted_transactions(part: SegmentPartition) -> list[tuple[int, int]]:
    """(first offset, producer id) of every aborted transaction that may have data in
    ``part``: the entries of the ``.txnindex`` of this segment and the later ones of its
    partition whose ABORT marker is at or after the segment's base offset."""
    d = os.path.dirname(part.path)
    out = []
    for name in os.listdir(d):
        if name.endswith(".txnindex") and name[:20].isdigit() and int(name[:20]) >= part.base_offset:
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            data = data[: len(data) // _ABORTED_TXN.size * _ABORTED_TXN.size]   # a torn last entry
            out += [(first, pid) for _, pid, first, last, _ in _ABORTED_TXN.iter_unpack(data)
                    if last >= part.base_offset]
    return sorted(out)


def segment_rows(part: SegmentPartition, ignore_corrupt: bool = False,
                 read_committed: bool = False) -> Iterator[tuple]:
    """Rows (see SCHEMA) of one segment; control batches skipped; with ``read_committed``,
    the batches of aborted transactions too (a producer is aborted from the first offset
    of one of its aborted transactions to its ABORT marker, as in Kafka's consumer)."""
    pending = aborted_transactions(part) if read_committed else []
    k = 0
    aborting: set = set()
    for batch in iter_segment_batches(part.path, ignore_corrupt):
        if pending and batch.is_transactional:
            last = batch.next_offset - 1
            while k < len(pending) and pending[k][0] <= last:
                aborting.add(pending[k][1])
                k += 1
            if batch.is_control:
                if batch.records and bytes(batch.records[0].key or b"")[:4] == b"\x00\x00\x00\x00":
                    aborting.discard(batch.producer_id)     # ABORT (ControlRecordType 0)
                continue
            if batch.producer_id in aborting:
                continue
        if batch.is_control:
            continue
        tt = batch.timestamp_type
        for r in batch.records:
            yield (part.topic, part.partition, r.offset, r.timestamp, tt,
                   None if r.key is None else bytes(r.key),
                   None if r.value is None else bytes(r.value),
                   [(k, None if v is None else bytes(v)) for k, v in r.headers])


class KbrokerReader(DataSourceReader):
    def __init__(self, path: str, topic: str | None, ignore_corrupt: bool, read_committed: bool = False) -> None:
        self.path = path
        self.topic = topic
        self.ignore_corrupt = ignore_corrupt
        self.read_committed = read_committed

    def partitions(self) -> list[SegmentPartition]:
        segs = find_segments(self.path, self.topic)
        # Spark needs at least one partition; an empty one yields no rows
        return segs or [SegmentPartition("", "", -1, -1)]

    def read(self, partition: SegmentPartition) -> Iterator[tuple]:
        if not partition.path:
            return iter(())
        return segment_rows(partition, self.ignore_corrupt, self.read_committed)


class KbrokerDataSource(DataSource):
    """``spark.read.format("kbroker").load(path)``; see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "kbroker"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> KbrokerReader:
        path = self.options.get("path")
        if not path:
            raise ValueError("kbroker data source needs a path: .load(<partition or data dir>)")
        ignore = str(self.options.get("ignoreCorrupt", "false")).lower() == "true"
        isolation = str(self.options.get("isolationLevel", "read_uncommitted")).lower()
        if isolation not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"kbroker data source: isolationLevel must be read_uncommitted or read_committed, "
                             f"not {isolation!r}")
        return KbrokerReader(path, self.options.get("topic"), ignore, isolation == "read_committed")


def register(spark) -> None:
    """Register the ``"kbroker"`` format on ``spark``."""
    spark.dataSource.register(KbrokerDataSource)

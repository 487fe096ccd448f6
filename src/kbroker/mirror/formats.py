"""MM2's internal record formats, byte for byte (connect/mirror-client and connect/mirror):
Kafka protocol ``Struct`` encoding (big-endian INT16/INT32/INT64, STRING = INT16 length +
UTF-8), so records written here are read by Apache Kafka's MirrorMaker 2 tools and back.

* OffsetSync (``mm2-offset-syncs.<cluster>.internal``): key ``topic STRING, partition
  INT32``; value ``upstreamOffset INT64, offset INT64`` (no version header).
* Checkpoint (``<source>.checkpoints.internal``): key ``group STRING, topic STRING,
  partition INT32``; value ``version INT16`` (0) then ``upstreamOffset INT64, offset INT64,
  metadata STRING``. ``topic`` is the *downstream* (renamed) topic.
* Heartbeat (``heartbeats``): key ``sourceClusterAlias STRING, targetClusterAlias STRING``;
  value ``version INT16`` (0) then ``timestamp INT64``.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from kbroker.client.metadata import TopicPartition

VERSION = 0
_H = struct.Struct(">h")
_I = struct.Struct(">i")
_Q = struct.Struct(">q")
_QQ = struct.Struct(">qq")


class FormatError(ValueError):
    """A record that is not in the expected MM2 format (Kafka's SchemaException)."""


def _str(s: str) -> bytes:
    b = s.encode()
    return _H.pack(len(b)) + b


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf):
        if buf is None:
            raise FormatError("null key or value")
        self.buf, self.pos = bytes(buf), 0

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise FormatError(f"truncated record: need {n} bytes at {self.pos} of {len(self.buf)}")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def int16(self) -> int:
        return _H.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _I.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _Q.unpack(self._take(8))[0]

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise FormatError("null STRING")
        return self._take(n).decode()

    def version(self) -> int:
        v = self.int16()
        if v != VERSION:
            raise FormatError(f"unknown version {v}")
        return v


class OffsetSync(NamedTuple):
    """Upstream offset ``upstream_offset`` of source ``topic_partition`` was written at
    ``downstream_offset`` of the remote partition."""

    topic_partition: TopicPartition
    upstream_offset: int
    downstream_offset: int

    def record_key(self) -> bytes:
        return _str(self.topic_partition.topic) + _I.pack(self.topic_partition.partition)

    def record_value(self) -> bytes:
        return _QQ.pack(self.upstream_offset, self.downstream_offset)

    @classmethod
    def deserialize(cls, key, value) -> "OffsetSync":
        k, v = _Reader(key), _Reader(value)
        tp = TopicPartition(k.string(), k.int32())
        return cls(tp, v.int64(), v.int64())


class Checkpoint(NamedTuple):
    """Group ``group_id`` committed ``upstream_offset`` on the source; on the target it
    resumes at ``downstream_offset`` of ``topic_partition`` (the remote topic's name)."""

    group_id: str
    topic_partition: TopicPartition
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""

    def record_key(self) -> bytes:
        return _str(self.group_id) + _str(self.topic_partition.topic) + _I.pack(self.topic_partition.partition)

    def record_value(self) -> bytes:
        return _H.pack(VERSION) + _QQ.pack(self.upstream_offset, self.downstream_offset) + _str(self.metadata or "")

    @classmethod
    def deserialize(cls, key, value) -> "Checkpoint":
        k, v = _Reader(key), _Reader(value)
        group, tp = k.string(), TopicPartition(k.string(), k.int32())
        v.version()
        return cls(group, tp, v.int64(), v.int64(), v.string())


class Heartbeat(NamedTuple):
    source_cluster_alias: str
    target_cluster_alias: str
    timestamp: int

    def record_key(self) -> bytes:
        return _str(self.source_cluster_alias) + _str(self.target_cluster_alias)

    def record_value(self) -> bytes:
        return _H.pack(VERSION) + _Q.pack(self.timestamp)

    @classmethod
    def deserialize(cls, key, value) -> "Heartbeat":
        k, v = _Reader(key), _Reader(value)
        src, tgt = k.string(), k.string()
        v.version()
        return cls(src, tgt, v.int64())

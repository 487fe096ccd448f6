#!/usr/bin/env python
"""Dump log segments and their indexes, like Kafka's ``kafka-dump-log.sh``.

    python tools/dump_log.py --files DIR/00000000000000000000.log [--print-data-log]
    python tools/dump_log.py --files DIR/00000000000000000000.index,DIR/00000000000000000000.timeindex

Reads the files directly (read-only mmap; safe on a running broker's closed
segments; on the active segment the tail may be mid-write and shows as
invalid bytes). Output lines follow Kafka's DumpLogSegments:

``.log``: one line per batch::

    baseOffset: 0 lastOffset: 2 count: 3 baseSequence: -1 lastSequence: -1 producerId: -1
    producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false
    deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1700000000002 size: 93
    magic: 2 compresscodec: none crc: 1234567 isvalid: true

(one line; magic 0/1 messages print ``offset: N`` instead of the v2 fields), and with
``--print-data-log`` or ``--deep-iteration`` one ``| offset: ...`` line per record.

``.index``: ``offset: O position: P`` (absolute offset, byte position in the .log).
``.timeindex``: ``timestamp: T offset: O``.
``.txnindex``: ``version: 0 producerId: P firstOffset: F lastOffset: L lastStableOffset: S``.

``.checkpoint`` (a KRaft snapshot, or ``bootstrap.checkpoint``) is dumped as a ``.log``. KRaft
control records show decoded, as Kafka does (`` SnapshotHeader {"version":0,...}``,
``SnapshotFooter``, ``KRaftVersion``, ``KRaftVoters``, and ``LeaderChange``, which Kafka 3.9
shows as ``controlType: LEADER_CHANGE(2)``). ``--cluster-metadata-decoder`` (implies
``--print-data-log``) prints each ``__cluster_metadata`` record's value through
:mod:`kbroker.metadata.serde` as Kafka's JSON converters do::

    | offset: 1 CreateTime: 1700000000000 keySize: -1 valueSize: 23 sequence: -1 headerKeys: []
      payload: {"type":"FEATURE_LEVEL_RECORD","version":0,"data":{"name":"metadata.version","featureLevel":21}}

(one line); a value that does not decode prints ``payload: Error at OFFSET, skipping. REASON``.

Entry point for the ``kbroker dump-log`` subcommand: ``main(argv) -> int`` (exit code).
"""
from __future__ import annotations

import argparse
import base64
import json
import mmap
import os
import re
import struct
import sys
import uuid
from decimal import Decimal

from kbroker.kernels import records

_CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_TS_TYPES = {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}
_LOG_OVERHEAD = 12            # base_offset int64 + batch_length int32
_MAGIC_OFFSET = 16
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")   # see kbroker/_core/ref/records.py
_LEGACY_HEADER = struct.Struct(">qiIbb")      # offset, size, crc, magic, attributes
_INDEX_ENTRY = struct.Struct(">ii")           # relative offset, position
_TIME_INDEX_ENTRY = struct.Struct(">qi")      # timestamp, relative offset
_INT_MAX = (1 << 31) - 1


def base_offset_of(path: str) -> int:
    """Segment files are named by their base offset (20 digits)."""
    stem = os.path.basename(path).split(".")[0]
    try:
        return int(stem)
    except ValueError:
        raise SystemExit(f"{path}: not a segment file name (expected <20-digit base offset>.<suffix>)") from None


class _Mapped:
    """The whole file as a read-only memoryview (empty for an empty file)."""

    def __init__(self, path: str):
        self._f = open(path, "rb")
        size = os.fstat(self._f.fileno()).st_size
        self._mm = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.view = memoryview(self._mm) if self._mm is not None else memoryview(b"")

    def close(self) -> None:
        self.view.release()
        if self._mm is not None:
            self._mm.close()
        self._f.close()

    def __enter__(self):
        return self.view

    def __exit__(self, *exc):
        self.close()


def _increment_sequence(seq: int, delta: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: wraps at Integer.MAX_VALUE."""
    if seq > _INT_MAX - delta:
        return delta - (_INT_MAX - seq) - 1
    return seq + delta


def _text(b) -> str:
    return bytes(b).decode("utf-8", errors="replace")


def _java_double(x: float) -> str:
    """Java's Double.toString (what Jackson prints for a float64 field)."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        return repr(float(x))
    sign, digit_tuple, exp = Decimal(repr(float(x))).as_tuple()
    exponent = exp + len(digit_tuple) - 1
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    return f"{'-' if sign else ''}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def _json_value(value, ftype: str, struct_cls, version: int):
    if value is None:
        return None
    if ftype.startswith("[]"):
        return [_json_value(v, ftype[2:], struct_cls, version) for v in value]
    if struct_cls is not None:
        return message_json(value, version)
    if ftype == "uuid":
        raw = value.bytes if isinstance(value, uuid.UUID) else bytes(value)
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")
    if ftype in ("bytes", "records"):
        return base64.b64encode(bytes(value)).decode() if ftype == "bytes" else ""
    if ftype == "float64":
        return float(value)
    return value


def message_json(message, version: int) -> dict:
    """``message`` at ``version`` as Kafka's generated JsonConverter writes it: camelCase field
    names, fields present at that version, tagged fields only when not at their default."""
    out = {}
    default = None
    for f in type(message)._fields:
        if not f.present(version):
            continue
        value = getattr(message, f.attr)
        if f.is_tagged(version):
            if default is None:
                default = type(message)()
            if value == getattr(default, f.attr):
                continue
        out[f.name[:1].lower() + f.name[1:]] = _json_value(value, f.type, f.struct, version)
    return out


def _dumps(obj) -> str:
    """Compact JSON as Jackson's ObjectNode.toString writes it (doubles as Java prints them)."""
    if isinstance(obj, dict):
        return "{" + ",".join(f"{_dumps(str(k))}:{_dumps(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(_dumps(v) for v in obj) + "]"
    if isinstance(obj, bool) or obj is None:
        return json.dumps(obj)
    if isinstance(obj, float):
        return _java_double(obj)
    if isinstance(obj, int):
        return str(obj)
    return json.dumps(str(obj), ensure_ascii=False)


def _record_type_name(message) -> str:
    """Kafka's MetadataRecordType name: TopicRecord -> TOPIC_RECORD."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", type(message).NAME).upper()


def metadata_payload(rec) -> str:
    """Kafka's ClusterMetadataLogMessageParser: the record value as JSON, or an error line."""
    from kbroker.metadata.serde import MetadataParseError, deserialize

    try:
        if rec.value is None:
            raise MetadataParseError("the record has a null value")
        m = deserialize(bytes(rec.value))
        return _dumps({"type": _record_type_name(m.message), "version": m.version,
                       "data": message_json(m.message, m.version)})
    except Exception as e:  # any undecodable value is reported, never a crash (Kafka catches Throwable)
        return f"Error at {rec.offset}, skipping. {e}".replace("\n", " ")


def _kraft_control(ctype: int):
    """(label, message class) of the KRaft control record types."""
    from kbroker.protocol.messages.kraft_version_record import KRaftVersionRecord
    from kbroker.protocol.messages.leader_change_message import LeaderChangeMessage
    from kbroker.protocol.messages.snapshot_footer_record import SnapshotFooterRecord
    from kbroker.protocol.messages.snapshot_header_record import SnapshotHeaderRecord
    from kbroker.protocol.messages.voters_record import VotersRecord

    return {2: ("LeaderChange", LeaderChangeMessage), 3: ("SnapshotHeader", SnapshotHeaderRecord),
            4: ("SnapshotFooter", SnapshotFooterRecord), 5: ("KRaftVersion", KRaftVersionRecord),
            6: ("KRaftVoters", VotersRecord)}.get(ctype)


_CONTROL_NAMES = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER",
                  4: "SNAPSHOT_FOOTER", 5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}


def _control_text(rec) -> str:
    """Kafka's control record dump: the type from the key, the marker from the value."""
    key = bytes(rec.key or b"")
    if len(key) < 4:
        return " unknownControlRecordType"
    ctype = struct.unpack_from(">h", key, 2)[0]
    if ctype in (0, 1):
        value = bytes(rec.value or b"")
        epoch = struct.unpack_from(">i", value, 2)[0] if len(value) >= 6 else -1
        return f" endTxnMarker: {'ABORT' if ctype == 0 else 'COMMIT'} coordinatorEpoch: {epoch}"
    kraft = _kraft_control(ctype)
    if kraft is not None:
        label, cls = kraft
        try:
            msg = cls.decode(bytes(rec.value or b""), 0)   # ControlRecordUtils' current versions are all 0
            version = getattr(msg, "version", 0)
            if not cls.VALID_VERSIONS[0] <= version <= cls.VALID_VERSIONS[1]:
                version = 0
            return f" {label} {_dumps(message_json(msg, version))}"
        except Exception as e:
            return f" {label} Error at {rec.offset}, skipping. {e}".replace("\n", " ")
    return f" controlType: {_CONTROL_NAMES.get(ctype, 'UNKNOWN')}({ctype})"


def _batch_line(mv, pos: int, size: int, magic: int, batch, valid: bool) -> str:
    if magic >= 2:
        (base_offset, _, ple, _, crc, attributes, lod, base_ts, max_ts, pid, pepoch, bseq,
         count) = _V2_HEADER.unpack_from(mv, pos)
        last_seq = -1 if bseq < 0 else _increment_sequence(bseq, lod)
        horizon = f"OptionalLong[{base_ts}]" if attributes & 0x40 else "OptionalLong.empty"
        head = (f"baseOffset: {base_offset} lastOffset: {base_offset + lod} count: {count} "
                f"baseSequence: {bseq} lastSequence: {last_seq} producerId: {pid} producerEpoch: {pepoch} "
                f"partitionLeaderEpoch: {ple} isTransactional: {str(bool(attributes & 0x10)).lower()} "
                f"isControl: {str(bool(attributes & 0x20)).lower()} deleteHorizonMs: {horizon}")
        ts_type, ts, codec = (attributes >> 3) & 1, max_ts, attributes & 0x07
    else:
        _, _, crc, _, attributes = _LEGACY_HEADER.unpack_from(mv, pos)
        last = batch.last_offset if batch is not None else struct.unpack_from(">q", mv, pos)[0]
        head = f"offset: {last}"
        ts_type = -1 if magic == 0 else (attributes >> 3) & 1
        ts = batch.max_timestamp if batch is not None and magic > 0 else -1
        codec = attributes & 0x07
    return (f"{head} position: {pos} {_TS_TYPES[ts_type]}: {ts} size: {size} magic: {magic} "
            f"compresscodec: {_CODECS.get(codec, str(codec))} crc: {crc} isvalid: {str(valid).lower()}")


def _record_lines(batch, magic: int, print_data: bool, metadata: bool = False):
    ts_type = _TS_TYPES[batch.timestamp_type if magic > 0 else -1]
    for i, rec in enumerate(batch.records):
        key_size = -1 if rec.key is None else len(rec.key)
        value_size = -1 if rec.value is None else len(rec.value)
        line = f"| offset: {rec.offset} {ts_type}: {rec.timestamp} keySize: {key_size} valueSize: {value_size}"
        if magic >= 2:
            seq = -1 if batch.base_sequence < 0 else _increment_sequence(batch.base_sequence,
                                                                           rec.offset - batch.base_offset)
            line += f" sequence: {seq} headerKeys: [{','.join(k for k, _ in rec.headers)}]"
            if batch.is_control:
                line += _control_text(rec)
        if print_data and not (magic >= 2 and batch.is_control):
            if metadata:
                line += f" payload: {metadata_payload(rec)}"
            else:
                if rec.key is not None:
                    line += f" key: {_text(rec.key)}"
                if rec.value is not None:
                    line += f" payload: {_text(rec.value)}"
        yield line


_SNAPSHOT_NAME = re.compile(r"(\d{20})-(\d{10})\.checkpoint")


def dump_log_segment(path: str, out, print_data: bool = False, deep: bool = False,
                     max_bytes: int | None = None, metadata: bool = False) -> int:
    """Print every batch of a ``.log`` file or a KRaft ``.checkpoint`` snapshot; returns the
    number of invalid bytes at its end."""
    name = os.path.basename(path)
    if name == "bootstrap.checkpoint":
        print("KRaft bootstrap snapshot", file=out)
    elif name.endswith(".checkpoint"):
        m = _SNAPSHOT_NAME.fullmatch(name)
        if m is None:
            raise SystemExit(f"{path}: not a snapshot file name (expected <20-digit offset>-<10-digit epoch>.checkpoint)")
        print(f"Snapshot end offset: {int(m.group(1))}, epoch: {int(m.group(2))}", file=out)
    else:
        print(f"Log starting offset: {base_offset_of(path)}", file=out)
    with _Mapped(path) as mv:
        end = len(mv) if max_bytes is None else min(len(mv), max_bytes)
        pos = 0
        while end - pos >= _MAGIC_OFFSET + 1:
            base_offset, length = struct.unpack_from(">qi", mv, pos)
            if length == 0 and base_offset == 0:
                break  # preallocated zeros after the last batch
            size = _LOG_OVERHEAD + length
            magic = mv[pos + _MAGIC_OFFSET]
            if length < 14 or pos + size > end or magic > 2:
                break
            batch = None
            valid = False
            try:
                batch = next(iter(records.iter_batches(mv[pos:pos + size], check_crc=False)), None)
                valid = batch is not None and batch.is_valid()
            except records.CorruptRecordError:
                batch = None
            if magic >= 2 and size < records.RECORD_BATCH_OVERHEAD:
                break
            print(_batch_line(mv, pos, size, magic, batch, valid), file=out)
            if (print_data or deep) and batch is not None:
                for line in _record_lines(batch, magic, print_data, metadata):
                    print(line, file=out)
            pos += size
        trailing = len(mv) - pos if max_bytes is None else 0
        if trailing and any(mv[pos:len(mv)]):
            print(f"Found {trailing} invalid bytes at the end of {os.path.basename(path)}", file=out)
            return trailing
    return 0


def dump_offset_index(path: str, out) -> int:
    """Print the entries of an ``.index`` file (stops at the zero padding); returns the count."""
    base = base_offset_of(path)
    n = 0
    with _Mapped(path) as mv:
        count = len(mv) // _INDEX_ENTRY.size
        for i in range(count):
            rel, position = _INDEX_ENTRY.unpack_from(mv, i * _INDEX_ENTRY.size)
            if rel == 0 and i > 0:
                break  # Kafka's DumpLogSegments: the base offset again after the first entry is padding
            if rel == 0 and position == 0 and count > 1 and _INDEX_ENTRY.unpack_from(mv, 8) == (0, 0):
                break  # a preallocated index with no entries (a real (0, 0) entry has a successor or is alone)
            print(f"offset: {base + rel} position: {position}", file=out)
            n += 1
    return n


def dump_time_index(path: str, out) -> int:
    """Print the entries of a ``.timeindex`` file (stops at the zero padding); returns the count."""
    base = base_offset_of(path)
    n = 0
    with _Mapped(path) as mv:
        for i in range(len(mv) // _TIME_INDEX_ENTRY.size):
            ts, rel = _TIME_INDEX_ENTRY.unpack_from(mv, i * _TIME_INDEX_ENTRY.size)
            if ts == 0 and rel == 0:
                break  # zero padding
            print(f"timestamp: {ts} offset: {base + rel}", file=out)
            n += 1
    return n


def dump_txn_index(path: str, out) -> int:
    """Print the aborted transactions of a ``.txnindex`` file; returns the count."""
    from kbroker.log.txn_index import TransactionIndex
    entries = TransactionIndex(path).entries
    for e in entries:
        print(f"version: 0 producerId: {e.producer_id} firstOffset: {e.first_offset} "
              f"lastOffset: {e.last_offset} lastStableOffset: {e.last_stable_offset}", file=out)
    return len(entries)


def dump_file(path: str, out, print_data: bool = False, deep: bool = False, max_bytes: int | None = None,
              metadata: bool = False) -> None:
    print(f"Dumping {path}", file=out)
    if path.endswith((".log", ".checkpoint")):
        dump_log_segment(path, out, print_data or metadata, deep or metadata, max_bytes, metadata)
    elif path.endswith(".index"):
        dump_offset_index(path, out)
    elif path.endswith(".timeindex"):
        dump_time_index(path, out)
    elif path.endswith(".txnindex"):
        dump_txn_index(path, out)
    else:
        print(f"Ignoring unknown file {path}", file=out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbroker dump-log", description="Dump log segments and indexes.")
    p.add_argument("--files", required=True, help="comma-separated .log/.index/.timeindex/.txnindex/.checkpoint files")
    p.add_argument("--print-data-log", action="store_true", help="print record keys and payloads")
    p.add_argument("--deep-iteration", action="store_true", help="print every record (not only batches)")
    p.add_argument("--max-bytes", type=int, default=None, help="stop reading a .log after this many bytes")
    p.add_argument("--cluster-metadata-decoder", action="store_true",
                   help="decode record values as __cluster_metadata records (implies --print-data-log)")
    return p


def main(argv: list[str] | None = None, out=None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    status = 0
    for path in [f for f in args.files.split(",") if f]:
        if not os.path.isfile(path):
            print(f"Error: {path} does not exist", file=sys.stderr)
            status = 1
            continue
        dump_file(path, out, args.print_data_log, args.deep_iteration, args.max_bytes,
                  args.cluster_metadata_decoder)
    return status


if __name__ == "__main__":
    sys.exit(main())

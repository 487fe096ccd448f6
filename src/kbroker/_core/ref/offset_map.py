"""Pure-Python twin of ``kbroker._core.offset_map`` (same API, same results, same bytes).

See the compiled kernel's docstring for the map's layout, the hash, the
record batch v2 header table and the filter's rules. The twin models the
fixed slot array with a dict keyed by the 128-bit hash, bounded by the same
slot count: ``put``/``get``/``size``/``build``/``filter_batches`` give the
same answers as the linear-probing table (probe statistics are not modelled).
"""
from __future__ import annotations

import struct

from kbroker._core import compression as _compression
from kbroker._core.errors import CorruptRecordError
from kbroker._core.ref.crc32c import crc32c

__all__ = ["OffsetMap", "filter_batches", "murmur3_128", "BYTES_PER_ENTRY", "DEFAULT_LOAD_FACTOR"]

BYTES_PER_ENTRY = 24
DEFAULT_LOAD_FACTOR = 0.9

OVERHEAD = 61
LOG_OVERHEAD = 12
MIN_BATCH_LENGTH = 49
MIN_RECORD_SIZE = 7
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40
INT64_MAX = (1 << 63) - 1
M64 = (1 << 64) - 1

_q = struct.Struct(">q")
_i = struct.Struct(">i")
_h = struct.Struct(">h")
_I = struct.Struct(">I")
_LE2 = struct.Struct("<QQ")
_LE1 = struct.Struct("<Q")


# -- MurmurHash3_x64_128, seed 0 --------------------------------------------------------
_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def murmur3_128(key) -> tuple[int, int]:
    """(h1, h2) of MurmurHash3_x64_128(key, seed 0) as unsigned 64-bit ints."""
    data = bytes(key)
    n = len(data)
    h1 = h2 = 0
    nblocks = n // 16
    for i in range(nblocks):
        k1, k2 = _LE2.unpack_from(data, i * 16)
        k1 = (_rotl((k1 * _C1) & M64, 31) * _C2) & M64
        h1 ^= k1
        h1 = (((_rotl(h1, 27) + h2) & M64) * 5 + 0x52DCE729) & M64
        k2 = (_rotl((k2 * _C2) & M64, 33) * _C1) & M64
        h2 ^= k2
        h2 = (((_rotl(h2, 31) + h1) & M64) * 5 + 0x38495AB5) & M64
    tail = data[nblocks * 16:]
    rem = len(tail)
    if rem > 8:
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= (_rotl((k2 * _C2) & M64, 33) * _C1) & M64
    if rem > 0:
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= (_rotl((k1 * _C1) & M64, 31) * _C2) & M64
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & M64
    h2 = (h2 + h1) & M64
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 = (h1 + h2) & M64
    h2 = (h2 + h1) & M64
    return (h1, h2)


class OffsetMap:
    """Key hash -> latest offset (see the compiled kernel). Not thread-safe."""

    def __init__(self, memory: int, load_factor: float = 0.9):
        if memory < BYTES_PER_ENTRY:
            raise ValueError(f"offset map memory {memory} is below one {BYTES_PER_ENTRY}-byte slot")
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load factor {load_factor} must be in (0, 1]")
        self._n = memory // BYTES_PER_ENTRY
        self.load_factor = load_factor
        self._max_entries = int(self._n * load_factor)
        self.clear()

    def clear(self) -> None:
        self._d: dict[tuple[int, int], int] = {}
        self._latest = -1
        self.lookups = 0

    @property
    def slots(self) -> int:
        return self._n

    @property
    def size(self) -> int:
        return len(self._d)

    def __len__(self) -> int:
        return len(self._d)

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @property
    def is_full(self) -> bool:
        return len(self._d) >= self._max_entries

    @property
    def utilization(self) -> float:
        return len(self._d) / self._n

    @property
    def latest_offset(self) -> int:
        return self._latest

    def update_latest_offset(self, offset: int) -> None:
        self._latest = offset

    def _put_hash(self, h, offset: int) -> None:
        self.lookups += 1
        if h not in self._d and len(self._d) >= self._n:
            raise ValueError("Attempt to add a new entry to a full offset map.")
        self._d[h] = offset
        self._latest = offset

    def _get_hash(self, h) -> int:
        self.lookups += 1
        return self._d.get(h, -1)

    def put(self, key, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset {offset} must be >= 0")
        self._put_hash(murmur3_128(key), offset)

    def get(self, key) -> int:
        return self._get_hash(murmur3_128(key))

    def build(self, buf, start_offset: int) -> tuple[bool, int, int]:
        mv = memoryview(buf).cast("B")
        n = len(mv)
        pos = 0
        records_read = 0
        while True:
            size = _batch_size(mv, pos, n)
            if size == 0:
                break
            base = _q.unpack_from(mv, pos)[0]
            last = base + _i.unpack_from(mv, pos + 23)[0]
            if last < start_offset:
                pos += size
                continue
            attrs = _h.unpack_from(mv, pos + 21)[0]
            if not attrs & CONTROL_MASK:
                sec, rpos, rend = _records_section(mv, pos, size, attrs)
                count = _i.unpack_from(mv, pos + 57)[0]
                _check_count(count, rend - rpos)
                for i in range(count):
                    r = _read_record(sec, rpos, rend)
                    if r is None:
                        raise CorruptRecordError(f"invalid record {i} in the batch at offset {base}")
                    records_read += 1
                    rpos = r[0]
                    off = base + r[4]
                    if r[5] >= 0 and off >= start_offset:
                        if len(self._d) >= self._max_entries:
                            return (True, pos, records_read - 1)
                        self._put_hash(murmur3_128(sec[r[6]: r[6] + r[5]]), off)
                if rpos != rend:
                    raise CorruptRecordError(f"bytes left after the records of the batch at offset {base}")
            self._latest = last
            pos += size
        return (False, pos, records_read)


def _batch_size(mv, pos: int, n: int) -> int:
    if n - pos < LOG_OVERHEAD:
        return 0
    blen = _i.unpack_from(mv, pos + 8)[0]
    if blen < MIN_BATCH_LENGTH:
        raise CorruptRecordError(f"record batch length {blen} is too small at position {pos}")
    size = LOG_OVERHEAD + blen
    if size > n - pos:
        return 0
    if mv[pos + 16] != 2:
        raise CorruptRecordError(f"unsupported magic {mv[pos + 16]} at position {pos}")
    if _i.unpack_from(mv, pos + 23)[0] < 0:
        raise CorruptRecordError(f"negative last_offset_delta at position {pos}")
    if crc32c(mv[pos + 21: pos + size]) != _I.unpack_from(mv, pos + 17)[0]:
        raise CorruptRecordError(f"record batch at offset {_q.unpack_from(mv, pos)[0]} has a bad CRC")
    return size


def _records_section(mv, pos: int, size: int, attrs: int):
    """(buffer, start, end) of the batch's records, decompressed if needed."""
    codec = attrs & COMPRESSION_MASK
    if codec == 0:
        return mv, pos + OVERHEAD, pos + size
    data = _compression.decompress(codec, bytes(mv[pos + OVERHEAD: pos + size]))
    return memoryview(data), 0, len(data)


def _check_count(count: int, nbytes: int) -> None:
    if count < 0 or count > nbytes // MIN_RECORD_SIZE:
        raise CorruptRecordError(f"record count {count} does not fit in {nbytes} bytes")


def _read_varint(buf, pos: int, end: int, max_bytes: int, bits: int):
    """Zigzag varint of at most max_bytes bytes -> (value, new pos) or None."""
    result = shift = 0
    for _ in range(max_bytes):
        if pos >= end:
            return None
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            result &= (1 << bits) - 1
            return ((result >> 1) ^ -(result & 1)), pos
        shift += 7
    return None


def _zigzag_bytes(v: int, bits: int) -> bytes:
    u = ((v << 1) ^ (v >> (bits - 1))) & ((1 << bits) - 1)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _read_record(buf, pos: int, end: int):
    """(record end, start, ts_pos, after_ts, offset_delta, key_len, key_pos,
    null_value, ts_delta) or None if malformed."""
    start = pos
    r = _read_varint(buf, pos, end, 5, 32)
    if r is None:
        return None
    length, pos = r
    if length < 6 or length > end - pos:
        return None
    rend = pos + length
    pos += 1
    ts_pos = pos
    r = _read_varint(buf, pos, rend, 10, 64)
    if r is None:
        return None
    ts_delta, pos = r
    after_ts = pos
    r = _read_varint(buf, pos, rend, 5, 32)
    if r is None or r[0] < 0:
        return None
    off_delta, pos = r
    r = _read_varint(buf, pos, rend, 5, 32)
    if r is None or r[0] < -1 or r[0] > rend - r[1]:
        return None
    klen, pos = r
    key_pos = pos
    if klen > 0:
        pos += klen
    r = _read_varint(buf, pos, rend, 5, 32)
    if r is None or r[0] < -1 or r[0] > rend - r[1]:
        return None
    return (rend, start, ts_pos, after_ts, off_delta, klen, key_pos, r[0] < 0, ts_delta)


def _wrap64(v: int) -> int:
    v &= M64
    return v - (1 << 64) if v >= 1 << 63 else v


def filter_batches(buf, offset_map: OffsetMap, now_ms: int, delete_retention_ms: int,
                   retain_empty=None) -> tuple[bytes, int, int, int]:
    """See the compiled kernel's ``filter_batches``."""
    mv = memoryview(buf).cast("B")
    n = len(mv)
    latest = offset_map._latest
    out = bytearray()
    pos = 0
    records_read = records_kept = 0
    while True:
        size = _batch_size(mv, pos, n)
        if size == 0:
            break
        h = mv[pos: pos + OVERHEAD]
        attrs = _h.unpack_from(h, 21)[0]
        if attrs & CONTROL_MASK:
            out += mv[pos: pos + size]
            pos += size
            continue
        base = _q.unpack_from(h, 0)[0]
        last = base + _i.unpack_from(h, 23)[0]
        count = _i.unpack_from(h, 57)[0]
        base_ts = _q.unpack_from(h, 27)[0]
        has_horizon = bool(attrs & DELETE_HORIZON_MASK)
        lat = bool(attrs & TIMESTAMP_TYPE_MASK)
        codec = attrs & COMPRESSION_MASK
        sec, rstart, rend_all = _records_section(mv, pos, size, attrs)
        _check_count(count, rend_all - rstart)
        recs = []
        need_horizon = False
        rpos = rstart
        for i in range(count):
            r = _read_record(sec, rpos, rend_all)
            if r is None:
                raise CorruptRecordError(f"invalid record {i} in the batch at offset {base}")
            rpos = r[0]
            off = base + r[4]
            if off > latest:
                keep = True
            elif r[5] < 0:
                keep = False
            else:
                found = offset_map._get_hash(murmur3_128(sec[r[6]: r[6] + r[5]]))
                keep = off >= found and (not r[7] or not has_horizon or now_ms < base_ts)
            if keep:
                recs.append(r)
                if r[7]:
                    need_horizon = True
        if rpos != rend_all:
            raise CorruptRecordError(f"bytes left after the records of the batch at offset {base}")
        records_read += count
        kept = len(recs)
        records_kept += kept
        need_horizon = need_horizon and not has_horizon
        if kept == count and not need_horizon:
            out += mv[pos: pos + size]
        elif kept:
            if need_horizon:
                d = delete_retention_ms
                horizon = INT64_MAX if d > 0 and now_ms > INT64_MAX - d else now_ms + d
                shift = _wrap64(base_ts - horizon)
                new_attrs = attrs | DELETE_HORIZON_MASK
            else:
                horizon, shift, new_attrs = base_ts, 0, attrs
            body = bytearray()
            max_ts = None
            for (rend, start, ts_pos, after_ts, _od, _kl, _kp, _nv, ts_delta) in recs:
                if shift == 0:
                    body += sec[start: rend]
                else:
                    nd = _wrap64(ts_delta + shift)
                    rest = sec[after_ts: rend]
                    ts_bytes = _zigzag_bytes(nd, 64)
                    body += _zigzag_bytes(1 + len(ts_bytes) + len(rest), 32)
                    body.append(sec[ts_pos - 1])
                    body += ts_bytes
                    body += rest
                ts = _wrap64(base_ts + ts_delta)
                if max_ts is None or ts > max_ts:
                    max_ts = ts
            if codec:
                body = _compression.compress(codec, bytes(body))
            hdr = bytearray(h)
            _i.pack_into(hdr, 8, OVERHEAD - LOG_OVERHEAD + len(body))
            _h.pack_into(hdr, 21, new_attrs)
            _q.pack_into(hdr, 27, horizon)
            if not lat:
                _q.pack_into(hdr, 35, max_ts)
            _i.pack_into(hdr, 57, kept)
            batch = hdr + body
            _I.pack_into(batch, 17, crc32c(batch[21:]))
            out += batch
        else:
            pid = _q.unpack_from(h, 43)[0]
            if pid >= 0 and retain_empty is not None and retain_empty.get(pid) == last:
                hdr = bytearray(h)
                _i.pack_into(hdr, 8, MIN_BATCH_LENGTH)
                _h.pack_into(hdr, 21, attrs & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK))
                _q.pack_into(hdr, 27, -1)
                _i.pack_into(hdr, 57, 0)
                _I.pack_into(hdr, 17, crc32c(hdr[21:]))
                out += hdr
        pos += size
    return (bytes(out), pos, records_read, records_kept)

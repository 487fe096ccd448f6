"""Wire primitives shared by the generated message codecs (kbroker/protocol/messages/).

Kafka's protocol types (https://kafka.apache.org/protocol.html#protocol_types), all big-endian:

  ===================  =======================================================
  int8/16/32/64        two's complement, 1/2/4/8 bytes
  uint16 / uint32      unsigned, 2/4 bytes
  float64              IEEE 754 double, 8 bytes
  bool                 1 byte, 0 = false, anything else reads as true
  uuid                 16 bytes (kbroker: ``uuid.UUID``; Kafka's ZERO_UUID is all zero)
  string               int16 length N (-1 = null) + N bytes UTF-8
  compact string       unsigned varint N+1 (0 = null) + N bytes UTF-8   (flexible versions)
  bytes / records      int32 length N (-1 = null) + N bytes
  compact bytes        unsigned varint N+1 (0 = null) + N bytes          (flexible versions)
  array                int32 count N (-1 = null) + N elements
  compact array        unsigned varint N+1 (0 = null) + N elements      (flexible versions)
  tagged fields        unsigned varint count + (uvarint tag, uvarint size, size bytes)*
  ===================  =======================================================

Reading: every ``r_*`` helper takes ``(buf, pos)`` with ``buf`` a ``memoryview`` of format
'B' and returns ``(value, new_pos)``. Helpers check every length against the bytes left and
raise :class:`ProtocolDecodeError`; fixed-width reads use ``struct.Struct.unpack_from`` whose
``struct.error`` on a short buffer the generated ``decode`` converts to
:class:`ProtocolDecodeError`, so that is the only exception a decode lets out. Counts are
checked against the remaining bytes before any loop, so hostile input cannot make us
allocate or iterate in proportion to a claimed count (franz-go's ``kbin`` rule).

Writing: ``w_*`` helpers append to a shared ``bytearray`` ``w``; ``records`` values may be
:class:`kbroker.records.region.FileRegion` objects, which the writer emits as separate
items of ``parts`` (the bytes written so far are flushed first) so the network layer can
``sendfile`` them. Large in-memory records (>= ``RECORDS_INLINE_MAX``) are also emitted as
their own part, avoiding one copy on the fetch path.

Strings decode like Java's ``new String(bytes, UTF_8)``: malformed UTF-8 is replaced by
U+FFFD rather than rejected (Kafka's behaviour).
"""
from __future__ import annotations

import struct
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type only: kbroker.protocol does no I/O
    from kbroker.records.region import FileRegion  # noqa: F401

__all__ = [
    "ProtocolDecodeError", "ProtocolEncodeError", "UnsupportedVersionError",
    "ProtocolStruct", "FieldInfo", "ZERO_UUID",
]


class ProtocolDecodeError(ValueError):
    """Bytes that do not decode as the expected message at the given version.

    The only exception ``decode`` raises on bad input (short read, negative length other
    than the null marker, a length or count larger than the bytes left, a known tag at a
    version that lacks it, an unsupported version). The network layer closes the
    connection on it, as Kafka's SocketServer does for an unparseable request.
    """


class UnsupportedVersionError(ProtocolDecodeError):
    """Decoding a message at a version outside its validVersions."""


class ProtocolEncodeError(ValueError):
    """A message that cannot be written at the requested version: a non-default value in
    a non-ignorable field the version lacks (Kafka's UnsupportedVersionException), null in
    a non-nullable field, a value out of its type's range, or tagged fields in a
    non-flexible version."""


ZERO_UUID = uuid.UUID(int=0)

# Precompiled fixed-width codecs.
S_I8 = struct.Struct(">b")
S_I16 = struct.Struct(">h")
S_U16 = struct.Struct(">H")
S_I32 = struct.Struct(">i")
S_U32 = struct.Struct(">I")
S_I64 = struct.Struct(">q")
S_F64 = struct.Struct(">d")
S_BOOL = struct.Struct(">?")
S_UUID = struct.Struct(">16s")

_i16_unpack = S_I16.unpack_from
_i32_unpack = S_I32.unpack_from
_i16_pack = S_I16.pack
_i32_pack = S_I32.pack

STRING_MAX = 0x7FFF
#: records/bytes payloads at least this big are emitted as their own part by encode_parts.
RECORDS_INLINE_MAX = 4096

_MISSING = object()


class FieldInfo(tuple):
    """Schema of one field, for generic tooling (repr, tests, dict conversion).

    ``versions``/``nullable``/``tagged`` are inclusive ``(lo, hi)`` pairs or None;
    ``type`` is a Kafka type name ('int32', 'string', 'records', 'uuid', ..., 'struct',
    or '[]<elem>'); ``struct`` the generated class for struct and struct-array fields.
    """

    __slots__ = ()
    _names = ("attr", "name", "type", "versions", "nullable", "tagged", "tag",
              "default", "ignorable", "struct", "flexible")

    def __new__(cls, attr, name, type, versions, nullable, tagged, tag, default,
                ignorable, struct=None, flexible=_MISSING):
        return tuple.__new__(cls, (attr, name, type, versions, nullable, tagged, tag,
                                   default, ignorable, struct, flexible))

    attr = property(lambda s: s[0])
    name = property(lambda s: s[1])
    type = property(lambda s: s[2])
    versions = property(lambda s: s[3])
    nullable = property(lambda s: s[4])
    tagged = property(lambda s: s[5])
    tag = property(lambda s: s[6])
    default = property(lambda s: s[7])
    ignorable = property(lambda s: s[8])
    struct = property(lambda s: s[9])
    #: field-level flexibleVersions override ((lo, hi) or None for "none"); _MISSING if unset
    flexible = property(lambda s: s[10])

    def present(self, version: int) -> bool:
        lo, hi = self[3]
        return lo <= version <= hi

    def is_tagged(self, version: int) -> bool:
        t = self[5]
        return t is not None and t[0] <= version <= t[1] and self.present(version)

    def is_nullable(self, version: int) -> bool:
        n = self[4]
        return n is not None and n[0] <= version <= n[1]

    def __repr__(self):
        return "FieldInfo(%s)" % ", ".join(
            "%s=%r" % (k, v) for k, v in zip(self._names, self) if v is not _MISSING)


class ProtocolStruct:
    """Base of every generated message and nested struct.

    Subclasses define ``__slots__`` (one per field plus ``_unknown_tagged_fields``, a
    ``{tag: bytes}`` dict or None) and ``_fields`` (a tuple of :class:`FieldInfo`).
    Equality compares every slot; memoryview records compare equal to bytes of the same
    content.
    """

    __slots__ = ()
    _fields: tuple = ()

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        for name in self.__slots__:
            a = getattr(self, name)
            b = getattr(other, name)
            if a is b:
                continue
            if name == "_unknown_tagged_fields":
                if (a or None) != (b or None):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # mutable

    def __repr__(self):
        parts = []
        for f in self._fields:
            v = getattr(self, f[0])
            if isinstance(v, memoryview):
                v = "<%d bytes>" % v.nbytes
            elif isinstance(v, (bytes, bytearray)) and len(v) > 64:
                v = "<%d bytes>" % len(v)
            parts.append("%s=%r" % (f[0], v))
        if self._unknown_tagged_fields:
            parts.append("_unknown_tagged_fields=%r" % (self._unknown_tagged_fields,))
        return "%s(%s)" % (type(self).__name__, ", ".join(parts))


def decode_failed(cls_name: str, version: int, exc: BaseException) -> ProtocolDecodeError:
    """Wrap a low-level exception (struct.error, IndexError, ...) from a decode."""
    err = ProtocolDecodeError("malformed %s v%d: %s: %s" % (
        cls_name, version, type(exc).__name__, exc))
    err.__cause__ = exc
    return err


def encode_failed(cls_name: str, version: int, exc: BaseException) -> ProtocolEncodeError:
    err = ProtocolEncodeError("cannot encode %s v%d: %s: %s" % (
        cls_name, version, type(exc).__name__, exc))
    err.__cause__ = exc
    return err


def as_view(buf) -> memoryview:
    """A format-'B' memoryview over ``buf`` (bytes, bytearray, memoryview, mmap)."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def short(what: str, need: int, have: int) -> ProtocolDecodeError:
    return ProtocolDecodeError("%s: need %d bytes, %d left" % (what, need, have))


# ---------------------------------------------------------------------------- varints

def r_uvarint(buf, pos):
    """Unsigned varint (at most 5 bytes, value < 2**32)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 35:
            raise ProtocolDecodeError("unsigned varint longer than 5 bytes")


def w_uvarint(w, n):
    if n < 0:
        raise ProtocolEncodeError("negative unsigned varint %d" % n)
    while n >= 0x80:
        w.append((n & 0x7F) | 0x80)
        n >>= 7
    w.append(n)


def uvarint_bytes(n) -> bytes:
    w = bytearray()
    w_uvarint(w, n)
    return bytes(w)


# ---------------------------------------------------------------------------- lengths

def r_alen(buf, pos):
    """int32 array count; -1 = null. Rejects counts larger than the bytes left."""
    n = _i32_unpack(buf, pos)[0]
    pos += 4
    if n < 0:
        if n == -1:
            return -1, pos
        raise ProtocolDecodeError("negative array length %d" % n)
    if n > len(buf) - pos:
        raise short("array of %d elements" % n, n, len(buf) - pos)
    return n, pos


def r_calen(buf, pos):
    """Compact array count (uvarint N+1, 0 = null) -> N or -1."""
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uvarint(buf, pos)
    n -= 1
    if n > len(buf) - pos:
        raise short("array of %d elements" % n, n, len(buf) - pos)
    return n, pos


def w_alen(w, n):
    w += _i32_pack(n)


def w_calen(w, n):
    n += 1
    if n < 0x80:
        w.append(n)
    else:
        w_uvarint(w, n)


def null_error(what):
    return ProtocolDecodeError("non-nullable %s was serialized as null" % what)


# ---------------------------------------------------------------------------- strings

# The string readers and r_cnrecords check and slice inline (no helper call per string
# or records field of every message).

def r_str(buf, pos):
    n = _i16_unpack(buf, pos)[0]
    if n < 0:
        raise null_error("string")
    pos += 2
    end = pos + n
    if end > len(buf):
        raise short("string", n, len(buf) - pos)
    return str(buf[pos:end], "utf-8", "replace"), end


def r_nstr(buf, pos):
    n = _i16_unpack(buf, pos)[0]
    if n < 0:
        return None, pos + 2
    pos += 2
    end = pos + n
    if end > len(buf):
        raise short("string", n, len(buf) - pos)
    return str(buf[pos:end], "utf-8", "replace"), end


def r_cstr(buf, pos):
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uvarint(buf, pos)
    if n == 0:
        raise null_error("string")
    n -= 1
    if n > STRING_MAX:
        raise ProtocolDecodeError("string had invalid length %d" % n)
    end = pos + n
    if end > len(buf):
        raise short("string", n, len(buf) - pos)
    return str(buf[pos:end], "utf-8", "replace"), end


def r_cnstr(buf, pos):
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uvarint(buf, pos)
    if n == 0:
        return None, pos
    n -= 1
    if n > STRING_MAX:
        raise ProtocolDecodeError("string had invalid length %d" % n)
    end = pos + n
    if end > len(buf):
        raise short("string", n, len(buf) - pos)
    return str(buf[pos:end], "utf-8", "replace"), end


def _encode_text(s):
    b = s.encode("utf-8")
    if len(b) > STRING_MAX:
        raise ProtocolEncodeError("string of %d bytes is longer than %d" % (len(b), STRING_MAX))
    return b


#: Encoded forms (length prefix + UTF-8) of short strings, per wire form: topic names,
#: client ids, group ids and hosts repeat in every request and response, so each is
#: encoded once. Keys are exact ``str`` objects of at most _CACHE_MAX_CHARS characters;
#: a table is cleared when it reaches _CACHE_MAX_ENTRIES (bounded memory under clients
#: that send ever new names). Lock-free: a racing miss only encodes twice.
_STR_CACHE: dict = {}
_CSTR_CACHE: dict = {}
_CACHE_MAX_CHARS = 255
_CACHE_MAX_ENTRIES = 8192


def _remember(cache, s, encoded):
    if type(s) is str and len(s) <= _CACHE_MAX_CHARS:
        if len(cache) >= _CACHE_MAX_ENTRIES:
            cache.clear()
        cache[s] = encoded


def _str_bytes(s):
    """``s`` as a non-compact string (int16 length + UTF-8); ``s`` not None."""
    b = _encode_text(s)
    e = _i16_pack(len(b)) + b
    _remember(_STR_CACHE, s, e)
    return e


def _cstr_bytes(s):
    """``s`` as a compact string (uvarint length + 1, then UTF-8); ``s`` not None."""
    b = _encode_text(s)
    n = len(b) + 1
    if n < 0x80:
        e = bytes((n,)) + b
    else:
        e = uvarint_bytes(n) + b
    _remember(_CSTR_CACHE, s, e)
    return e


def w_str(w, s):
    if s is None:
        raise ProtocolEncodeError("null in a non-nullable string field")
    e = _STR_CACHE.get(s) if type(s) is str else None
    w += e if e is not None else _str_bytes(s)


def w_nstr(w, s):
    if s is None:
        w += b"\xff\xff"
        return
    e = _STR_CACHE.get(s) if type(s) is str else None
    w += e if e is not None else _str_bytes(s)


def w_cstr(w, s):
    if s is None:
        raise ProtocolEncodeError("null in a non-nullable string field")
    e = _CSTR_CACHE.get(s) if type(s) is str else None
    w += e if e is not None else _cstr_bytes(s)


def w_cnstr(w, s):
    if s is None:
        w.append(0)
        return
    w_cstr(w, s)


# ---------------------------------------------------------------------------- bytes

def _r_blob(buf, pos, n):
    end = pos + n
    if end > len(buf):
        raise short("bytes", n, len(buf) - pos)
    return bytes(buf[pos:end]), end


def r_bytes(buf, pos):
    n = _i32_unpack(buf, pos)[0]
    if n < 0:
        raise null_error("bytes")
    return _r_blob(buf, pos + 4, n)


def r_nbytes(buf, pos):
    n = _i32_unpack(buf, pos)[0]
    if n < 0:
        return None, pos + 4
    return _r_blob(buf, pos + 4, n)


def r_cbytes(buf, pos):
    n, pos = r_uvarint(buf, pos)
    if n == 0:
        raise null_error("bytes")
    return _r_blob(buf, pos, n - 1)


def r_cnbytes(buf, pos):
    n, pos = r_uvarint(buf, pos)
    if n == 0:
        return None, pos
    return _r_blob(buf, pos, n - 1)


def w_bytes(w, b):
    if b is None:
        raise ProtocolEncodeError("null in a non-nullable bytes field")
    w += _i32_pack(len(b))
    w += b


def w_nbytes(w, b):
    if b is None:
        w += b"\xff\xff\xff\xff"
        return
    w += _i32_pack(len(b))
    w += b


def w_cbytes(w, b):
    if b is None:
        raise ProtocolEncodeError("null in a non-nullable bytes field")
    w_uvarint(w, len(b) + 1)
    w += b


def w_cnbytes(w, b):
    if b is None:
        w.append(0)
        return
    w_uvarint(w, len(b) + 1)
    w += b


# ---------------------------------------------------------------------------- records

def _r_view(buf, pos, n):
    end = pos + n
    if end > len(buf):
        raise short("records", n, len(buf) - pos)
    return buf[pos:end], end


def r_records(buf, pos):
    """Records (int32 length): a zero-copy memoryview slice of ``buf``."""
    n = _i32_unpack(buf, pos)[0]
    if n < 0:
        raise null_error("records")
    return _r_view(buf, pos + 4, n)


def r_nrecords(buf, pos):
    n = _i32_unpack(buf, pos)[0]
    if n < 0:
        return None, pos + 4
    return _r_view(buf, pos + 4, n)


def r_crecords(buf, pos):
    n, pos = r_uvarint(buf, pos)
    if n == 0:
        raise null_error("records")
    return _r_view(buf, pos, n - 1)


def r_cnrecords(buf, pos):
    # r_uvarint inline: a Produce partition's records length takes 2-3 bytes
    n = buf[pos]
    pos += 1
    if n >= 0x80:
        n &= 0x7F
        shift = 7
        while True:
            b = buf[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift >= 35:
                raise ProtocolDecodeError("unsigned varint longer than 5 bytes")
    if n == 0:
        return None, pos
    n -= 1
    end = pos + n
    if end > len(buf):
        raise short("records", n, len(buf) - pos)
    return buf[pos:end], end


def records_size(value) -> int:
    """Byte size of a records value: bytes-like, FileRegion, or a list/tuple of them."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    if isinstance(value, (list, tuple)) and not hasattr(value, "fileno") and not hasattr(value, "position"):
        return sum(records_size(p) for p in value)
    size = getattr(value, "size", None)
    if isinstance(size, int) and hasattr(value, "position"):
        return size
    raise ProtocolEncodeError("records value must be bytes-like, a FileRegion or a list of "
                              "them, not %s" % type(value).__name__)


def _emit_records(w, parts, value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        if len(value) < RECORDS_INLINE_MAX:
            w += value
        else:
            if w:
                parts.append(bytes(w))
                w.clear()
            parts.append(value)
        return
    if isinstance(value, (list, tuple)) and not hasattr(value, "position"):
        for p in value:
            _emit_records(w, parts, p)
        return
    # FileRegion (or anything with position/size): a separate part, sent with sendfile.
    if w:
        parts.append(bytes(w))
        w.clear()
    parts.append(value)


def w_records(w, parts, value, compact, nullable):
    if value is None:
        if not nullable:
            raise ProtocolEncodeError("null in a non-nullable records field")
        if compact:
            w.append(0)
        else:
            w += b"\xff\xff\xff\xff"
        return
    n = records_size(value)
    if compact:
        w_uvarint(w, n + 1)
    else:
        w += _i32_pack(n)
    if n:
        _emit_records(w, parts, value)


# ---------------------------------------------------------------------------- tagged fields

def r_tags(buf, pos):
    """A tagged-field section with no known tags: ``({tag: bytes} or None, pos)``."""
    n = buf[pos]
    if n == 0:
        return None, pos + 1
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uvarint(buf, pos)
    if n > len(buf) - pos:
        raise short("%d tagged fields" % n, n, len(buf) - pos)
    unknown = {}
    for _ in range(n):
        tag, pos = r_uvarint(buf, pos)
        size, pos = r_uvarint(buf, pos)
        end = pos + size
        if end > len(buf):
            raise short("tagged field %d" % tag, size, len(buf) - pos)
        unknown[tag] = bytes(buf[pos:end])
        pos = end
    return unknown, pos


def r_tag_header(buf, pos):
    """Count of a tagged-field section (checked against the bytes left)."""
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uvarint(buf, pos)
    if n > len(buf) - pos:
        raise short("%d tagged fields" % n, n, len(buf) - pos)
    return n, pos


def r_tag_entry(buf, pos):
    """(tag, end_of_value, value_pos) of one tagged field."""
    tag, pos = r_uvarint(buf, pos)
    size, pos = r_uvarint(buf, pos)
    end = pos + size
    if end > len(buf):
        raise short("tagged field %d" % tag, size, len(buf) - pos)
    return tag, end, pos


def w_tags(w, known, unknown):
    """Write a tagged-field section: ``known`` is a list of (tag, bytes) or None,
    ``unknown`` a {tag: bytes} dict or None. Tags go out in ascending order (as Kafka's
    RawTaggedFieldWriter interleaves them), so a decoded message re-encodes identically."""
    if not known and not unknown:
        w.append(0)
        return
    items = list(known) if known else []
    if unknown:
        items.extend(unknown.items())
        items.sort(key=_tag_key)
    w_uvarint(w, len(items))
    for tag, data in items:
        w_uvarint(w, tag)
        w_uvarint(w, len(data))
        w += data


def _tag_key(item):
    return item[0]


def no_tags_check(unknown, cls_name, version):
    if unknown:
        raise ProtocolEncodeError("tagged fields were set, but version %d of %s does not "
                                  "support them" % (version, cls_name))


def non_default(field_name, version):
    return ProtocolEncodeError("attempted to write a non-default %s at version %d"
                               % (field_name, version))


# ---------------------------------------------------------------------------- arrays of primitives

def r_prim_array(buf, pos, n, code, width):
    """n fixed-width elements in one unpack (n already checked against the bytes left)."""
    if n == 0:
        return [], pos
    end = pos + n * width
    if end > len(buf):
        raise short("array", n * width, len(buf) - pos)
    return list(struct.unpack_from(">%d%s" % (n, code), buf, pos)), end


def w_prim_array(w, values, code):
    if values:
        w += struct.pack(">%d%s" % (len(values), code), *values)


def r_uuid_array(buf, pos, n):
    end = pos + 16 * n
    if end > len(buf):
        raise short("uuid array", 16 * n, len(buf) - pos)
    UUID = uuid.UUID
    out = [UUID(bytes=bytes(buf[p:p + 16])) for p in range(pos, end, 16)]
    return out, end


def w_uuid_array(w, values):
    for u in values:
        w += u.bytes


def uuid_from(b) -> uuid.UUID:
    return uuid.UUID(bytes=b)


# ---------------------------------------------------------------------------- framing helpers

#: low-level exceptions a generated decode converts to ProtocolDecodeError
DECODE_ERRORS = (struct.error, IndexError, ValueError, OverflowError, MemoryError, RecursionError)
#: exceptions a generated encode converts to ProtocolEncodeError (wrong type/range of a value)
ENCODE_ERRORS = (struct.error, TypeError, AttributeError, ValueError, OverflowError)


def join_parts(parts) -> bytes:
    """Concatenate encode_parts output; refuses FileRegion items (they need sendfile)."""
    for p in parts:
        if not isinstance(p, (bytes, bytearray, memoryview)):
            raise ProtocolEncodeError("message holds a %s; use encode_parts() and send the "
                                      "parts" % type(p).__name__)
    return b"".join(parts)

"""The string and records readers of kbroker.protocol.primitives (inlined: no helper
call per field) answer as the straightforward readers do: values, end offsets, and the
same ProtocolDecodeError for a null, negative, overlong or truncated field."""
import struct

import pytest

from kbroker.protocol import primitives as P
from kbroker.protocol.primitives import ProtocolDecodeError


def _text(buf, pos, n):
    end = pos + n
    if end > len(buf):
        raise P.short("string", n, len(buf) - pos)
    return str(buf[pos:end], "utf-8", "replace"), end


def _view(buf, pos, n):
    end = pos + n
    if end > len(buf):
        raise P.short("records", n, len(buf) - pos)
    return buf[pos:end], end


def ref_r_str(buf, pos):
    n = P._i16_unpack(buf, pos)[0]
    if n < 0:
        raise P.null_error("string")
    return _text(buf, pos + 2, n)


def ref_r_nstr(buf, pos):
    n = P._i16_unpack(buf, pos)[0]
    if n < 0:
        return None, pos + 2
    return _text(buf, pos + 2, n)


def _compact(buf, pos, nullable):
    n, pos = P.r_uvarint(buf, pos)
    if n == 0:
        if nullable:
            return None, pos
        raise P.null_error("string")
    n -= 1
    if n > P.STRING_MAX:
        raise ProtocolDecodeError("string had invalid length %d" % n)
    return _text(buf, pos, n)


def ref_r_cnrecords(buf, pos):
    n, pos = P.r_uvarint(buf, pos)
    if n == 0:
        return None, pos
    return _view(buf, pos, n - 1)


READERS = [(P.r_str, ref_r_str), (P.r_nstr, ref_r_nstr),
           (P.r_cstr, lambda b, p: _compact(b, p, False)), (P.r_cnstr, lambda b, p: _compact(b, p, True)),
           (P.r_cnrecords, ref_r_cnrecords)]


def _inputs():
    for s in ("", "t", "topic-7", "é" * 100, "x" * 200):
        b = s.encode()
        yield b"\x00" + P._i16_pack(len(b)) + b
        yield b"\x00" + P.uvarint_bytes(len(b) + 1) + b
    big = b"r" * 20000                           # a three-byte compact length (records)
    yield b"\x00" + P.uvarint_bytes(len(big) + 1) + big
    yield b"\x00\xff\xff"                        # int16 -1 / a compact 0x7f..
    yield b"\x00\x00"                            # compact null
    yield b"\x00\x80\x00"                        # a two-byte compact 0
    yield b"\x00" + P.uvarint_bytes(0x8001 + 1) + b"a" * 10   # over STRING_MAX
    yield b"\x00\xff\xff\xff\xff\xff\x01"        # a varint longer than 5 bytes


def _outcome(fn, buf):
    try:
        v, end = fn(memoryview(buf), 1)
    except (ProtocolDecodeError, IndexError, struct.error) as e:
        return type(e), str(e)
    return (bytes(v) if isinstance(v, memoryview) else v), end


@pytest.mark.parametrize("new,ref", READERS, ids=[r[0].__name__ for r in READERS])
def test_readers_answer_as_the_reference(new, ref):
    for buf in _inputs():
        cuts = range(len(buf) + 1) if len(buf) < 500 else [*range(8), *range(len(buf) - 3, len(buf) + 1)]
        for cut in cuts:                         # (every) truncation too
            assert _outcome(new, buf[:cut]) == _outcome(ref, buf[:cut]), (buf[:cut], cut)

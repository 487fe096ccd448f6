"""Kafka record compression codecs, shared by the records kernel and its twin.

Codec ids are the low three bits of a record batch's ``attributes``
(Kafka's ``CompressionType``):

    ====  ======  =========================================================
    id    name    wire format (what Kafka's Java client writes)
    ====  ======  =========================================================
    0     none
    1     gzip    RFC 1952 gzip stream (``GZIPOutputStream``); several
                  concatenated members are accepted on decompress
    2     snappy  xerial/snappy-java stream framing (``SnappyOutputStream``):
                  ``\\x82SNAPPY\\x00`` + int32 version 1 + int32 compat 1,
                  then chunks of [int32 BE length][raw snappy block].
                  Decompress also accepts a plain raw snappy block
                  (librdkafka and some clients write that)
    3     lz4     LZ4 frame format, independent 64 KiB blocks
                  (``KafkaLZ4BlockOutputStream``)
    4     zstd    Zstandard frame(s)
    ====  ======  =========================================================

Decompression is bounded: output larger than ``max_size`` bytes (default
:data:`MAX_DECOMPRESSED_SIZE`) raises :class:`CorruptRecordError`, so a
hostile "compression bomb" in a produce request cannot exhaust memory.
Any failure of a codec library on bad input is turned into
:class:`CorruptRecordError`; an unknown codec id raises
:class:`UnsupportedCompressionError`.

``UnsupportedMagicError`` (kbroker._core.errors) is re-exported here.
"""
from __future__ import annotations

import struct
import threading
import zlib

import cramjam
import lz4.frame
import zstandard

from kbroker._core.errors import (  # noqa: F401  (UnsupportedMagicError re-exported)
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionError,
    UnsupportedMagicError,
)

__all__ = [
    "NO_COMPRESSION", "GZIP", "SNAPPY", "LZ4", "ZSTD", "CODEC_NAMES",
    "MAX_DECOMPRESSED_SIZE", "compress", "decompress",
    "UnsupportedMagicError",
]

NO_COMPRESSION = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

#: Upper bound on one decompressed records section (64 MiB). Kafka's default
#: message.max.bytes is ~1 MiB compressed; 64x that is far beyond real data.
MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01"
#: snappy-java SnappyOutputStream.DEFAULT_BLOCK_SIZE
XERIAL_BLOCK_SIZE = 32 * 1024

_I32 = struct.Struct(">i")
# zstandard's (de)compressor objects are not safe for concurrent use, and the
# broker's handler threads validate compressed batches in parallel: one each per thread.
_zstd_local = threading.local()


def _zstd_pair():
    pair = getattr(_zstd_local, "pair", None)
    if pair is None:
        pair = _zstd_local.pair = (zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor())
    return pair


# -- compress ---------------------------------------------------------------

def _gzip_compress(data, level):
    c = zlib.compressobj(6 if level is None else level, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def _snappy_xerial_compress(data):
    mv = memoryview(data)
    out = [XERIAL_HEADER]
    for i in range(0, len(mv), XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(mv[i:i + XERIAL_BLOCK_SIZE]))
        out.append(_I32.pack(len(block)))
        out.append(block)
    return b"".join(out)


def _lz4_compress(data, level):
    return lz4.frame.compress(
        data,
        compression_level=0 if level is None else level,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        store_size=False,
    )


def _zstd_compress(data, level):
    if level is None:
        return _zstd_pair()[0].compress(data)
    return zstandard.ZstdCompressor(level=level).compress(data)


def compress(codec: int, data, level: int | None = None) -> bytes:
    """Compress ``data`` (bytes-like) with codec id ``codec`` as Kafka's Java
    client would frame it. ``codec`` 0 returns ``bytes(data)``."""
    if codec == GZIP:
        return _gzip_compress(data, level)
    if codec == SNAPPY:
        return _snappy_xerial_compress(data)
    if codec == LZ4:
        return _lz4_compress(data, level)
    if codec == ZSTD:
        return _zstd_compress(data, level)
    if codec == NO_COMPRESSION:
        return bytes(data)
    raise UnsupportedCompressionError(f"unknown compression codec id {codec}")


# -- decompress -------------------------------------------------------------

def _too_big(max_size):
    return CorruptRecordError(
        f"decompressed records exceed {max_size} bytes")


def _gzip_decompress(data, max_size):
    out = []
    total = 0
    rest = bytes(data)
    while True:
        d = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header
        chunk = d.decompress(rest, max_size - total + 1)
        total += len(chunk)
        out.append(chunk)
        if total > max_size:
            raise _too_big(max_size)
        if not d.eof:
            if d.unconsumed_tail:
                raise _too_big(max_size)
            raise CorruptRecordError("truncated gzip stream")
        rest = d.unused_data
        if not rest:
            return b"".join(out)


def _snappy_raw_decompress(data, max_size):
    # The raw format starts with the uncompressed length as an unsigned
    # varint: check it before letting the library allocate.
    n = 0
    shift = 0
    for i in range(5):
        if i >= len(data):
            raise CorruptRecordError("truncated snappy block")
        b = data[i]
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    else:
        raise CorruptRecordError("bad snappy length prefix")
    if n > max_size:
        raise _too_big(max_size)
    return bytes(cramjam.snappy.decompress_raw(data))


def _snappy_decompress(data, max_size):
    mv = memoryview(data)
    if bytes(mv[:8]) != XERIAL_MAGIC:
        return _snappy_raw_decompress(mv, max_size)
    # xerial framing: 8 magic + int32 version + int32 min-compatible version
    if len(mv) < 16:
        raise CorruptRecordError("truncated xerial snappy header")
    pos = 16
    end = len(mv)
    out = []
    total = 0
    while pos < end:
        if pos + 4 > end:
            raise CorruptRecordError("truncated xerial snappy chunk length")
        (n,) = _I32.unpack_from(mv, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise CorruptRecordError("bad xerial snappy chunk length")
        chunk = _snappy_raw_decompress(mv[pos:pos + n], max_size - total)
        total += len(chunk)
        out.append(chunk)
        pos += n
    return b"".join(out)


#: LZ4 cannot expand more than ~255x (a match length grows one byte per
#: 255 output bytes) plus one block; below this bound no streaming is needed.
_LZ4_MAX_RATIO = 256
_LZ4_MAX_BLOCK = 4 * 1024 * 1024


def _lz4_decompress(data, max_size):
    data = bytes(data)
    if len(data) * _LZ4_MAX_RATIO + _LZ4_MAX_BLOCK > max_size:
        return _lz4_decompress_bounded(data, max_size)
    out = []
    pos = 0
    mv = memoryview(data)
    while pos < len(data):
        ctx = lz4.frame.create_decompression_context()
        chunk, read, eof = lz4.frame.decompress_chunk(ctx, mv[pos:])
        if not eof:
            raise CorruptRecordError("truncated lz4 frame")
        out.append(chunk)
        pos += read
    if not out:
        raise CorruptRecordError("empty lz4 frame")
    return out[0] if len(out) == 1 else b"".join(out)


def _lz4_decompress_bounded(data, max_size):
    out = []
    total = 0
    rest = data
    while rest:
        d = lz4.frame.LZ4FrameDecompressor()
        chunk = d.decompress(rest, max_length=max_size - total + 1)
        total += len(chunk)
        out.append(chunk)
        if total > max_size:
            raise _too_big(max_size)
        if not d.eof:
            if not d.needs_input:
                raise _too_big(max_size)
            raise CorruptRecordError("truncated lz4 frame")
        rest = d.unused_data
    if not out:
        raise CorruptRecordError("empty lz4 frame")
    return b"".join(out)


#: A zstd block is at most 128 KiB and an RLE block takes 4 input bytes, so
#: one input byte yields at most 32 KiB: feeding the decompressor input in
#: pieces of (budget left / 32 KiB) bytes keeps each step within the budget.
_ZSTD_MAX_RATIO = 32 * 1024


def _zstd_decompress(data, max_size):
    mv = memoryview(bytes(data))
    out = []
    total = 0
    pos = 0
    end = len(mv)
    if end == 0:
        raise CorruptRecordError("empty zstd data")
    while pos < end:
        d = _zstd_pair()[1].decompressobj()
        while not d.eof:
            if pos >= end:
                raise CorruptRecordError("truncated zstd frame")
            step = max(64, (max_size - total) // _ZSTD_MAX_RATIO)
            piece = mv[pos:pos + step]
            pos += len(piece)
            chunk = d.decompress(piece)
            total += len(chunk)
            if total > max_size:
                raise _too_big(max_size)
            out.append(chunk)
        # input fed past the end of this frame comes back as unused_data
        pos -= len(d.unused_data)
    return b"".join(out)


def decompress(codec: int, data, max_size: int = MAX_DECOMPRESSED_SIZE) -> bytes:
    """Decompress a records section compressed with codec id ``codec``.

    Raises CorruptRecordError on malformed input or output beyond
    ``max_size`` bytes, UnsupportedCompressionError on an unknown codec.
    """
    try:
        if codec == LZ4:
            return _lz4_decompress(data, max_size)
        if codec == GZIP:
            return _gzip_decompress(data, max_size)
        if codec == SNAPPY:
            return _snappy_decompress(data, max_size)
        if codec == ZSTD:
            return _zstd_decompress(data, max_size)
        if codec == NO_COMPRESSION:
            return bytes(data)
    except CorruptRecordError:
        raise
    except (zlib.error, RuntimeError, ValueError, OSError, EOFError,
            zstandard.ZstdError, MemoryError, OverflowError) as e:
        # lz4 raises RuntimeError, cramjam DecompressionError (an Exception
        # subclass, caught below), zstandard ZstdError.
        raise CorruptRecordError(
            f"bad {CODEC_NAMES[codec]} data: {type(e).__name__}: {e}") from None
    except Exception as e:  # cramjam.DecompressionError and friends
        if type(e).__name__ == "DecompressionError":
            raise CorruptRecordError(f"bad {CODEC_NAMES[codec]} data: {e}") from None
        raise
    raise UnsupportedCompressionError(f"unknown compression codec id {codec}")

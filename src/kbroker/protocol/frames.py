"""Request/response frames: size prefix + header + body (no I/O here).

Wire layout of one frame (https://kafka.apache.org/protocol.html#protocol_common)::

    int32   size            bytes that follow (header + body)
    header  RequestHeader   v0: api_key int16, api_version int16, correlation_id int32
                            v1: + client_id nullable string (int16 length)
                            v2: + tagged fields (client_id stays a non-compact string)
            ResponseHeader  v0: correlation_id int32;  v1: + tagged fields
    body    the message at api_version

The header version follows from the api key and version (kbroker.protocol.api_keys):
request v2 for flexible versions else v1 (v0 only for ControlledShutdown v0); response v1
for flexible versions else v0, except ApiVersionsResponse, always v0 (KIP-511).

The functions below take the frame *without* its int32 size prefix on the read side (the
network layer strips it while splitting the stream) and produce it *with* the prefix on the
write side. Models Kafka's RequestHeader.parse / RequestContext / AbstractResponse.toSend.
"""
from __future__ import annotations

import struct

from kbroker.protocol.api_keys import API_INFO
from kbroker.protocol.headers import RequestHeader, ResponseHeader
from kbroker.protocol.primitives import (
    DECODE_ERRORS, ENCODE_ERRORS, ProtocolDecodeError, ProtocolEncodeError, S_I16, S_I32,
    as_view, records_size,
)

__all__ = [
    "UnknownApiKeyError", "parse_request_header", "decode_request", "encode_request",
    "encode_request_parts", "encode_response", "encode_response_parts",
    "parse_response_header", "decode_response", "frame_size",
]

_hh = S_I16.unpack_from
_i32_pack = S_I32.pack


class UnknownApiKeyError(ProtocolDecodeError):
    """The request header names an api key this protocol table does not know
    (Kafka: InvalidRequestException "Unknown API key", and the connection is closed)."""


def parse_request_header(buf) -> tuple[RequestHeader, int]:
    """Decode the request header at the start of ``buf`` (a frame without its size prefix).

    Returns ``(header, body_offset)``. The header version is chosen from the api key and
    version, as Kafka's ``RequestHeader.parse`` does; the version is *not* checked against
    the supported range (the caller answers ApiVersions at an unknown version with
    UNSUPPORTED_VERSION and closes the connection for other APIs). A null client id reads
    as "" (Kafka's quirk). Raises ProtocolDecodeError (UnknownApiKeyError for an unknown
    api key).
    """
    mv = as_view(buf)
    try:
        api_key = _hh(mv, 0)[0]
        api_version = _hh(mv, 2)[0]
    except DECODE_ERRORS as e:
        raise ProtocolDecodeError("request header shorter than 4 bytes") from e
    info = API_INFO.get(api_key)
    if info is None:
        raise UnknownApiKeyError("unknown api key %d" % api_key)
    hv = info.request_header_version(api_version)
    header, pos = RequestHeader.decode_from(mv, 0, hv)
    if header.client_id is None:
        header.client_id = ""
    return header, pos


def decode_request(buf):
    """``(header, body)`` of a request frame (without its size prefix).

    Raises ProtocolDecodeError, or UnsupportedVersionError (a subclass) when the version is
    outside the API's validVersions."""
    mv = as_view(buf)
    header, pos = parse_request_header(mv)
    cls = API_INFO[header.request_api_key].request_class
    body, _ = cls.decode_from(mv, pos, header.request_api_version)
    return header, body


def _header_bytes(header, version: int) -> bytes:
    return header.encode(version)


def encode_response_parts(correlation_id: int, api_key: int, api_version: int, response) -> list:
    """A size-prefixed response frame as a list of bytes / FileRegion parts.

    The first item always holds size + header + the start of the body, so a network layer
    can write the list with writev/sendfile without further copies."""
    hv = _RESPONSE_HEADER_VERSION.get(api_key * 65536 + api_version)
    if hv is None:
        hv = _response_header_version(api_key, api_version)
    body = response.encode_parts(api_version)
    try:
        if len(body) == 1:
            first = body[0]
            if type(first) is bytes:         # the usual response: one bytes part
                if hv:                       # correlation id + empty tagged fields
                    return [_pack_sized_v1(len(first) + 5, correlation_id, 0) + first]
                return [_pack_sized_v0(len(first) + 4, correlation_id) + first]
        header = _pack_header_v1(correlation_id, 0) if hv else _i32_pack(correlation_id)
    except ENCODE_ERRORS as e:
        raise ProtocolEncodeError("bad correlation id %r" % (correlation_id,)) from e
    return _frame(header, body)


#: {api key * 65536 + version: response header version}, filled on first use
_RESPONSE_HEADER_VERSION: dict = {}
_pack_header_v1 = struct.Struct(">iB").pack
_pack_sized_v0 = struct.Struct(">ii").pack
_pack_sized_v1 = struct.Struct(">iiB").pack


def _response_header_version(api_key: int, api_version: int) -> int:
    info = API_INFO[api_key]
    hv = info.response_header_version(api_version)
    if info.is_version_supported(api_version):      # keeps the table bounded
        _RESPONSE_HEADER_VERSION[api_key * 65536 + api_version] = hv
    return hv


def encode_response(correlation_id: int, api_key: int, api_version: int, response) -> bytes:
    """A size-prefixed response frame as bytes (no FileRegion records)."""
    parts = encode_response_parts(correlation_id, api_key, api_version, response)
    if len(parts) == 1:
        return parts[0]
    return _join(parts)


def encode_request_parts(api_key: int, api_version: int, correlation_id: int, client_id,
                         request) -> list:
    """A size-prefixed request frame (for clients and tests) as a list of parts."""
    info = API_INFO[api_key]
    hv = info.request_header_version(api_version)
    header = RequestHeader(request_api_key=api_key, request_api_version=api_version,
                           correlation_id=correlation_id,
                           client_id=client_id if hv >= 1 else "").encode(hv)
    return _frame(header, request.encode_parts(api_version))


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id, request) -> bytes:
    parts = encode_request_parts(api_key, api_version, correlation_id, client_id, request)
    if len(parts) == 1:
        return parts[0]
    return _join(parts)


def parse_response_header(buf, api_key: int, api_version: int) -> tuple[ResponseHeader, int]:
    """``(header, body_offset)`` of a response frame (without its size prefix)."""
    hv = API_INFO[api_key].response_header_version(api_version)
    return ResponseHeader.decode_from(as_view(buf), 0, hv)


def decode_response(buf, api_key: int, api_version: int):
    """``(header, body)`` of a response frame (without its size prefix)."""
    mv = as_view(buf)
    header, pos = parse_response_header(mv, api_key, api_version)
    body, _ = API_INFO[api_key].response_class.decode_from(mv, pos, api_version)
    return header, body


def frame_size(parts) -> int:
    """Total bytes of a parts list (bytes-like items and FileRegions)."""
    return sum(records_size(p) for p in parts)


def _frame(header: bytes, body: list) -> list:
    first = body[0]
    if len(body) == 1 and type(first) is bytes:     # the usual response: one bytes part
        return [b"".join((_i32_pack(len(header) + len(first)), header, first))]
    size = len(header) + frame_size(body)
    if isinstance(first, bytes):
        return [b"".join((_i32_pack(size), header, first))] + body[1:]
    return [_i32_pack(size) + header] + body


def _join(parts) -> bytes:
    for p in parts:
        if not isinstance(p, (bytes, bytearray, memoryview)):
            raise ProtocolEncodeError("frame holds a %s; use the *_parts function" % type(p).__name__)
    return b"".join(parts)

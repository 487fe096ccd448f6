"""Kafka's wire protocol, generated from Kafka 3.9's JSON message specs. Sans I/O.

- ``kbroker.protocol.messages.<api>``: one generated module per API (e.g. ``produce``
  holds ProduceRequest, ProduceResponse and their nested structs) and per data message
  (ConsumerProtocolSubscription, ...). Each top-level class has ``encode(version)``,
  ``encode_parts(version)`` (bytes and FileRegion parts), ``decode(buf, version)`` and
  ``decode_from(buf, pos, version) -> (msg, end)``.
- ``kbroker.protocol.headers``: RequestHeader / ResponseHeader (generated).
- ``kbroker.protocol.api_keys``: ``ApiKey`` enum and ``API_INFO`` version table (generated).
- ``kbroker.protocol.frames``: header version choice, size-prefixed frames.
- ``kbroker.protocol.errors``: ``ErrorCode`` (Kafka's Errors.java).
- ``kbroker.protocol.primitives``: wire helpers and the one decode error,
  ``ProtocolDecodeError``.

Regenerate with ``python tools/gen_protocol.py`` (tests/test_protocol_generated.py checks
the committed output is current).
"""
from kbroker.protocol.api_keys import API_INFO, ApiInfo, ApiKey
from kbroker.protocol.errors import ErrorCode, error_code
from kbroker.protocol.frames import (
    UnknownApiKeyError, decode_request, decode_response, encode_request, encode_request_parts,
    encode_response, encode_response_parts, parse_request_header, parse_response_header,
)
from kbroker.protocol.headers import RequestHeader, ResponseHeader
from kbroker.protocol.primitives import (
    ProtocolDecodeError, ProtocolEncodeError, UnsupportedVersionError,
)

__all__ = [
    "API_INFO", "ApiInfo", "ApiKey", "ErrorCode", "error_code", "ProtocolDecodeError",
    "ProtocolEncodeError", "UnsupportedVersionError", "UnknownApiKeyError", "RequestHeader",
    "ResponseHeader", "parse_request_header", "decode_request", "decode_response",
    "encode_request", "encode_request_parts", "encode_response", "encode_response_parts",
    "parse_response_header",
]

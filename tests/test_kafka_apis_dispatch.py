"""KafkaApis reads the usual request header itself, and frames.encode_response_parts packs
size + response header in one go: both must give exactly what the generated header codec
gives (kbroker.protocol.headers), which stays the reference for everything unusual.

KafkaApis is driven with Request objects made as the network layer makes them and a
channel that records what the handler side asks of it; no sockets.
"""
from __future__ import annotations

import random
import struct

import pytest

from kbroker.network.channel import Request
from kbroker.protocol import (
    API_INFO, ApiKey, ErrorCode, ProtocolEncodeError, decode_response, encode_response_parts,
    parse_request_header,
)
from kbroker.protocol.headers import RequestHeader, ResponseHeader
from kbroker.protocol.messages import api_versions as av, controlled_shutdown as cs, produce as pr
from kbroker.protocol.primitives import join_parts
from kbroker.server.apis import ApiHandler
from kbroker.server.kafka_apis import KafkaApis


class _Channel:
    """What KafkaApis and RequestContext call on a RequestChannel, recorded."""

    def __init__(self) -> None:
        self.closed = []
        self.sent = []

    def close_connection(self, request) -> None:
        self.closed.append(request)

    def send_response(self, request, parts, throttle_ms: int = 0) -> None:
        self.sent.append((request, b"".join(parts)))

    def send_no_op_response(self, request, throttle_ms: int = 0) -> None:
        self.sent.append((request, None))


def _apis():
    seen = []
    channel = _Channel()

    def record(_broker, ctx, body):
        seen.append((ctx, body))

    handlers = {key: ApiHandler(info.min_version, info.max_version, record)
                for key, info in API_INFO.items()
                if key in (ApiKey.API_VERSIONS, ApiKey.CONTROLLED_SHUTDOWN, ApiKey.METADATA)}
    return KafkaApis(None, channel, handlers), channel, seen


def _request(payload: bytes) -> Request:
    return Request(0, "c-1", "PLAINTEXT", ("127.0.0.1", 1), memoryview(bytearray(payload)), 1)


def _header(key: int, version: int, corr: int, client_id: bytes | None, tags: bytes = b"\0") -> bytes:
    """A request header written by hand: client id as raw bytes (None: null)."""
    hv = API_INFO[key].request_header_version(version)
    out = struct.pack(">hhi", key, version, corr)
    if hv >= 1:
        out += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    if hv >= 2:
        out += tags
    return out


def _api_versions_body(version: int) -> bytes:
    return av.ApiVersionsRequest(client_software_name="kb", client_software_version="1").encode(version)


@pytest.mark.parametrize("version", range(0, 5))
@pytest.mark.parametrize("client_id", [b"rdkafka", b"", None, "ünï-☃".encode(), b"\xff\xfebad utf-8"])
def test_client_id_and_body_as_the_header_codec_reads_them(version, client_id):
    payload = _header(18, version, 77, client_id) + _api_versions_body(version)
    ref, pos = parse_request_header(payload)
    apis, channel, seen = _apis()
    apis.handle(_request(payload))
    assert not channel.closed
    (ctx, body), = seen
    assert (ctx.api_key, ctx.api_version, ctx.correlation_id, ctx.client_id) == (
        18, version, 77, ref.client_id)
    assert body == av.ApiVersionsRequest.decode_from(memoryview(payload), pos, version)[0]
    h = ctx.header                                       # made on demand, as parsed
    assert (h.request_api_key, h.request_api_version, h.correlation_id, h.client_id) == (
        ref.request_api_key, ref.request_api_version, ref.correlation_id, ref.client_id)


def test_header_with_tagged_fields_is_read_by_the_generated_codec():
    tags = RequestHeader(request_api_key=18, request_api_version=3, correlation_id=5, client_id="c",
                         _unknown_tagged_fields={7: b"xyz"}).encode(2)[8 + 2 + 1:]
    assert tags[0] == 1                                  # one tagged field
    payload = _header(18, 3, 5, b"c", tags) + _api_versions_body(3)
    apis, channel, seen = _apis()
    apis.handle(_request(payload))
    (ctx, body), = seen
    assert ctx.client_id == "c" and body.client_software_name == "kb"
    assert ctx.header._unknown_tagged_fields == {7: b"xyz"}


def test_header_v0_has_no_client_id():
    payload = _header(7, 0, 9, None) + cs.ControlledShutdownRequest(broker_id=3).encode(0)
    apis, channel, seen = _apis()
    apis.handle(_request(payload))
    (ctx, body), = seen
    assert ctx.client_id == "" and body.broker_id == 3 and ctx.correlation_id == 9


@pytest.mark.parametrize("payload", [
    struct.pack(">hhih", 18, 2, 1, 50) + b"short",      # client id longer than the frame
    struct.pack(">hhi", 18, 2, 1) + b"\0",               # half a client id length
    struct.pack(">hhih", 18, 3, 1, 2) + b"ab",           # v2 header without its tag section
    struct.pack(">hhih", 18, 3, 1, 2) + b"ab\x05\x01",   # a tag section cut short
    struct.pack(">hhih", 999, 0, 1, -1),                 # unknown api key
])
def test_malformed_header_closes_the_connection(payload):
    apis, channel, seen = _apis()
    apis.handle(_request(payload))
    assert seen == [] and channel.sent == [] and len(channel.closed) == 1


def test_random_headers_agree_with_the_header_codec():
    """Client ids of random lengths and bytes, null ones, lengths past the frame end, random
    tag sections: the handler sees the codec's client id, or the connection is closed
    exactly when the codec refuses the header."""
    rng = random.Random(23)
    for _ in range(3000):
        version = rng.randrange(0, 5)
        cid_len = rng.choice([-1, 0, 1, 5, 40])
        payload = bytearray(struct.pack(">hhih", 18, version, rng.randrange(1 << 31), cid_len))
        payload += bytes(rng.randrange(256) for _ in range(max(cid_len, 0)))
        if version >= 3 and rng.random() < 0.9:
            payload += rng.choice([b"\0", b"\x01\x02\x01z", b"\x01\x02\x05"])
        if rng.random() < 0.9:
            payload += _api_versions_body(version)
        if rng.random() < 0.2:
            del payload[rng.randrange(8, len(payload) + 1):]
        try:
            ref, pos = parse_request_header(bytes(payload))
            ref_body = av.ApiVersionsRequest.decode_from(memoryview(bytes(payload)), pos, version)[0]
        except Exception:
            ref = None
        apis, channel, seen = _apis()
        apis.handle(_request(bytes(payload)))
        if ref is None:
            assert seen == [] and len(channel.closed) == 1, payload
        else:
            (ctx, body), = seen
            assert not channel.closed
            assert ctx.client_id == ref.client_id and ctx.correlation_id == ref.correlation_id, payload
            assert body == ref_body


def test_unsupported_version_of_a_known_api_is_still_answered():
    payload = _header(18, 99, 4, b"x") + b"\0\0\0"
    apis, channel, seen = _apis()
    apis.handle(_request(payload))
    (request, frame), = channel.sent
    header, resp = decode_response(frame[4:], 18, 0)
    assert header.correlation_id == 4 and resp.error_code == ErrorCode.UNSUPPORTED_VERSION


def _reference_frame(corr: int, key: int, version: int, body) -> bytes:
    hv = API_INFO[key].response_header_version(version)
    payload = ResponseHeader(correlation_id=corr).encode(hv) + join_parts(body.encode_parts(version))
    return struct.pack(">i", len(payload)) + payload


def test_response_frames_are_the_header_codec_bytes_for_every_api_and_version():
    checked = 0
    for key, info in API_INFO.items():
        for version in range(info.min_version, info.max_version + 1):
            body = info.response_class()
            try:
                body.encode_parts(version)
            except Exception:
                continue                         # a default body that has no encoding here
            for corr in (0, 1, -1, (1 << 31) - 1, -(1 << 31)):
                parts = encode_response_parts(corr, key, version, body)
                assert join_parts(parts) == _reference_frame(corr, key, version, body), (key, version)
            checked += 1
    assert checked > 300


def test_response_with_a_bad_correlation_id_is_an_encode_error():
    for corr in (1 << 31, -(1 << 31) - 1, "7"):
        with pytest.raises(ProtocolEncodeError):        # response header v0
            encode_response_parts(corr, 18, 3, av.ApiVersionsResponse(error_code=0, api_keys=[]))
        with pytest.raises(ProtocolEncodeError):        # response header v1
            encode_response_parts(corr, 0, 9, pr.ProduceResponse(responses=[]))

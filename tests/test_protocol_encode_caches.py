"""The encoders' caches (primitives' encoded strings, frames' response header packers)
change no byte on the wire and stay bounded."""
import pytest

from kbroker.protocol import primitives as P
from kbroker.protocol.api_keys import API_INFO
from kbroker.protocol.frames import decode_response, encode_response_parts
from kbroker.protocol.messages.produce import PartitionProduceResponse, ProduceResponse, TopicProduceResponse

STRINGS = ["", "t", "topic-07", "é" * 40, "x" * 126, "x" * 127, "x" * 200, "ü" * 300, "日本語"]


def _plain(s, compact):
    b = s.encode("utf-8")
    if compact:
        return P.uvarint_bytes(len(b) + 1) + b
    return len(b).to_bytes(2, "big") + b


@pytest.mark.parametrize("s", STRINGS)
def test_cached_strings_encode_as_before(s):
    for _ in range(2):                      # a miss, then a hit
        for fn, compact in ((P.w_cstr, True), (P.w_cnstr, True), (P.w_str, False), (P.w_nstr, False)):
            w = bytearray(b"?")
            fn(w, s)
            assert bytes(w) == b"?" + _plain(s, compact), (fn.__name__, s)


def test_null_and_bad_strings_still_raise():
    for fn in (P.w_cstr, P.w_str):
        with pytest.raises(P.ProtocolEncodeError):
            fn(bytearray(), None)
    w = bytearray()
    P.w_cnstr(w, None)
    P.w_nstr(w, None)
    assert bytes(w) == b"\x00\xff\xff"
    for fn in (P.w_cstr, P.w_str):
        with pytest.raises(P.ProtocolEncodeError):
            fn(bytearray(), "x" * (P.STRING_MAX + 1))
        with pytest.raises(UnicodeEncodeError):
            fn(bytearray(), "\ud800")
        with pytest.raises(AttributeError):
            fn(bytearray(), 5)


def test_string_caches_stay_bounded():
    for i in range(P._CACHE_MAX_ENTRIES + 10):
        P.w_cstr(bytearray(), "name-%d" % i)
        P.w_str(bytearray(), "name-%d" % i)
    assert 0 < len(P._CSTR_CACHE) <= P._CACHE_MAX_ENTRIES
    assert 0 < len(P._STR_CACHE) <= P._CACHE_MAX_ENTRIES
    long_name = "y" * (P._CACHE_MAX_CHARS + 1)
    P.w_cstr(bytearray(), long_name)
    assert long_name not in P._CSTR_CACHE


@pytest.mark.parametrize("api_key", sorted(API_INFO))
def test_response_header_matches_its_version(api_key):
    info = API_INFO[api_key]
    cls = info.response_class
    for v in range(info.min_version, info.max_version + 1):
        if not _encodable(cls, v):
            continue
        hv = info.response_header_version(v)
        body = cls().encode(v)
        for _ in range(2):                  # the packer is made, then reused
            frame = b"".join(encode_response_parts(0x01020304, api_key, v, cls()))
            assert int.from_bytes(frame[:4], "big") == len(frame) - 4
            assert frame[4:8] == b"\x01\x02\x03\x04"
            assert frame[8:8 + hv] == (b"\x00" if hv == 1 else b"")
            assert frame[8 + hv:] == body


def _encodable(cls, v):
    try:
        cls().encode(v)
    except P.ProtocolEncodeError:
        return False
    return True


def test_produce_response_round_trips_at_every_version():
    for v in range(3, 13):
        resp = ProduceResponse(responses=[TopicProduceResponse(name="t" * 130, partition_responses=[
            PartitionProduceResponse(index=1, error_code=0, base_offset=42)])], throttle_time_ms=0)
        frame = b"".join(encode_response_parts(7, 0, v, resp))
        header, body = decode_response(frame[4:], 0, v)
        assert header.correlation_id == 7
        assert body.responses[0].name == "t" * 130
        assert body.responses[0].partition_responses[0].base_offset == 42

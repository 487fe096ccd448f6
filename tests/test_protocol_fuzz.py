"""Hostile input: random and mutated bytes into every decoder raise only ProtocolDecodeError.

No IndexError, struct.error, MemoryError or UnicodeDecodeError may escape, and a claimed
length/count larger than the bytes left is rejected before anything is allocated.
"""
from __future__ import annotations

import random
import time
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from kbroker.protocol import ProtocolDecodeError, decode_request, parse_request_header
from kbroker.protocol.messages.fetch import FetchRequest
from kbroker.protocol.messages.metadata import MetadataRequest
from kbroker.protocol.messages.produce import ProduceRequest

from protocol_random import all_message_classes, build, versions_of

CLASSES = all_message_classes()
CASES = [(cls, v) for cls in CLASSES for v in versions_of(cls)]


def decode_only_raises_protocol_error(cls, data, v):
    try:
        cls.decode(data, v)
    except ProtocolDecodeError:
        pass


def mutate(rnd, data: bytes) -> bytes:
    b = bytearray(data)
    op = rnd.randrange(5)
    if op == 0 and b:
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
    elif op == 1 and b:
        del b[rnd.randrange(len(b)):]
    elif op == 2 and len(b) >= 4:
        i = rnd.randrange(len(b) - 3)
        b[i:i + 4] = rnd.choice((b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\x80\x00\x00\x00", b"\xff\xff\xff\xff"))
    elif op == 3 and b:
        i = rnd.randrange(len(b))
        b[i:i + 1] = rnd.choice((b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x80\x80", b"\xfe"))
    else:
        b += rnd.randbytes(rnd.randint(1, 8))
    return bytes(b)


def test_mutated_valid_messages_every_class():
    """For every (message, version): mutations of a valid encoding."""
    deadline = time.monotonic() + 20
    for cls, v in CASES:
        rnd = random.Random(zlib.crc32(("%s/%d" % (cls.__name__, v)).encode()))
        good = build(cls, v, rnd).encode(v)
        for _ in range(8):
            decode_only_raises_protocol_error(cls, mutate(rnd, good), v)
        assert time.monotonic() < deadline


def test_random_bytes_every_class():
    rnd = random.Random(1234)
    for cls, v in CASES:
        for n in (0, 1, 3, 7, 16, 64):
            decode_only_raises_protocol_error(cls, rnd.randbytes(n), v)


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), data=st.binary(max_size=80))
def test_hypothesis_random_bytes(case, data):
    cls, v = case
    decode_only_raises_protocol_error(cls, data, v)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=120))
def test_request_frames(data):
    for buf in (data, b"\x00\x00\x00\x09" + data, b"\x00\x01\x00\x0c" + data, b"\x00\x03\x00\x0c" + data):
        try:
            decode_request(buf)
        except ProtocolDecodeError:
            pass


def test_hostile_counts_are_rejected_without_allocation():
    # ProduceRequest v3: transactional_id null, acks, timeout, then topic count 2**31-1.
    data = b"\xff\xff" + b"\x00\x01" + b"\x00\x00\x00\x10" + b"\x7f\xff\xff\xff" + b"\x00" * 8
    with pytest.raises(ProtocolDecodeError):
        ProduceRequest.decode(data, 3)
    # compact count 2**32-2 (flexible version)
    data = b"\x00" + b"\x00\x01" + b"\x00\x00\x00\x10" + b"\xff\xff\xff\xff\x0f" + b"\x00" * 8
    with pytest.raises(ProtocolDecodeError):
        ProduceRequest.decode(data, 9)
    # an over-long varint
    with pytest.raises(ProtocolDecodeError):
        ProduceRequest.decode(b"\x80\x80\x80\x80\x80\x80\x01", 9)
    # records longer than the buffer
    good = ProduceRequest.decode(ProduceRequest().encode(9), 9)
    assert good == ProduceRequest()
    # negative array length other than -1
    with pytest.raises(ProtocolDecodeError, match="negative"):
        MetadataRequest.decode(b"\xff\xff\xff\xfe", 1)
    # null where the version does not allow it
    with pytest.raises(ProtocolDecodeError, match="null"):
        MetadataRequest.decode(b"\xff\xff\xff\xff", 0)
    assert MetadataRequest.decode(b"\xff\xff\xff\xff\x01", 4).topics is None


def test_invalid_utf8_is_replaced_like_java():
    # FetchRequest v12 rack id as invalid UTF-8: Java's new String(..., UTF_8) replaces it.
    body = bytearray(FetchRequest(rack_id="ab").encode(12))
    i = body.rindex(b"ab")
    body[i:i + 2] = b"\xff\xfe"
    assert FetchRequest.decode(bytes(body), 12).rack_id == "\ufffd\ufffd"


def test_unknown_api_key():
    with pytest.raises(ProtocolDecodeError, match="unknown api key"):
        parse_request_header(b"\x7f\x00\x00\x00\x00\x00\x00\x01\x00\x00")
    with pytest.raises(ProtocolDecodeError):
        parse_request_header(b"\x00")

"""The common Produce answer, every partition a plain success, encoded in one pass.

Most Produce requests answer NONE for every partition, with no record errors, no error
message, no current leader (KIP-951) and no throttle time. For those,
:func:`encode_success_response` writes the ProduceResponse body (versions 3-12) straight
from the replica manager's results, with the generated codec's own primitives
(``w_calen``/``w_alen``, ``w_cstr``/``w_str``) and field layouts, instead of building a
PartitionProduceResponse (and its LeaderIdAndEpoch), a TopicProduceResponse and a
ProduceResponse and walking them. It returns None for anything else, which the handler
answers through the generic codec. ``tests/test_produce_response.py`` checks the bytes
against ``ProduceResponse.encode`` for every supported version.
"""
from __future__ import annotations

import struct

from kbroker.protocol.primitives import w_alen, w_calen, w_cstr, w_str

#: index, error code, base offset, log append time, log start offset (v5+)
_PARTITION_V5 = struct.Struct(">ihqqq").pack
#: index, error code, base offset, log append time (v2-v4)
_PARTITION_V2 = struct.Struct(">ihqq").pack

#: what follows a successful partition's fixed fields, by version: v8 record_errors
#: (int32 0) and error_message (int16 -1, null); v9+ the compact forms (an empty array
#: is 1, a null string 0) and an empty tagged-field section (no current_leader, v10+)
_PARTITION_TAIL = {8: b"\x00\x00\x00\x00\xff\xff", 9: b"\x01\x00\x00", 10: b"\x01\x00\x00",
                   11: b"\x01\x00\x00", 12: b"\x01\x00\x00"}

#: throttle_time_ms 0, then (v9+) the response's empty tagged-field section (no node_endpoints)
_THROTTLE_0 = b"\x00\x00\x00\x00"
_THROTTLE_0_TAGS = b"\x00\x00\x00\x00\x00"


class EncodedBody:
    """A response body already encoded (``encode_parts`` as the generated messages have)."""

    __slots__ = ("body",)

    def __init__(self, body: bytes):
        self.body = body

    def encode_parts(self, version: int) -> list:
        return [self.body]


def encode_success_response(v: int, by_topic: dict, results: dict) -> bytes | None:
    """The ProduceResponse body at version ``v`` (3-12) for ``by_topic`` ({topic:
    [(topic, partition), ...]}, the answer's order) when every partition's result
    (ProducePartitionResult) is NONE without record errors; else None."""
    flexible = v >= 9
    pack = _PARTITION_V5 if v >= 5 else _PARTITION_V2
    tail = _PARTITION_TAIL.get(v)
    w = bytearray()
    if flexible:
        w_calen(w, len(by_topic))
    else:
        w_alen(w, len(by_topic))
    for name, tps in by_topic.items():
        if flexible:
            w_cstr(w, name)
            w_calen(w, len(tps))
        else:
            w_str(w, name)
            w_alen(w, len(tps))
        for tp in tps:
            r = results[tp]
            if r.error or r.record_errors:
                return None
            if v >= 5:
                w += pack(tp[1], 0, r.base_offset, r.log_append_time_ms, r.log_start_offset)
            else:
                w += pack(tp[1], 0, r.base_offset, r.log_append_time_ms)
            if tail is not None:
                w += tail
        if flexible:
            w.append(0)
    w += _THROTTLE_0_TAGS if flexible else _THROTTLE_0
    return bytes(w)

"""MetadataRecordSerde framing: frame version, apiKey, version as unsigned varints."""
from __future__ import annotations

import uuid

import pytest

from kbroker.metadata.records import RECORD_CLASSES, TopicRecord
from kbroker.metadata.serde import ApiMessageAndVersion, MetadataParseError, deserialize, serialize


def test_topic_record_frame():
    tid = uuid.UUID(int=7)
    blob = serialize(ApiMessageAndVersion(TopicRecord(name="t", topic_id=tid), 0))
    # frame 1, apiKey 2, version 0, compact string "t", uuid, no tagged fields
    assert blob == b"\x01\x02\x00" + b"\x02t" + tid.bytes + b"\x00"
    back = deserialize(blob)
    assert back.version == 0 and back.message == TopicRecord(name="t", topic_id=tid)
    assert back.api_key == 2


@pytest.mark.parametrize("blob,why", [
    (b"\x02\x02\x00\x02t" + bytes(16) + b"\x00", "unknown frame version 2"),
    (b"\x01\x63\x00", "Unknown metadata id 99"),
    (b"\x01\x02\x00\x02t" + bytes(16) + b"\x00\x00", r"1 byte\(s\) of garbage"),
    (b"\x01\x02\x00\x02t" + bytes(3), "Failed to deserialize"),
    (b"\x01\x02\x09\x02t", "Failed to deserialize"),
])
def test_bad_frames(blob, why):
    with pytest.raises(MetadataParseError, match=why):
        deserialize(blob)


def test_every_record_type_round_trips():
    for key, cls in RECORD_CLASSES.items():
        r = ApiMessageAndVersion(cls(), 0)
        assert deserialize(serialize(r)) == r

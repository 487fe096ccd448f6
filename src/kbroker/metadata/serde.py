"""MetadataRecordSerde: how one ``__cluster_metadata`` record is framed in a record value.

Kafka: ``server-common/.../common/serialization/AbstractApiMessageSerde.java``. A record's
value is unsigned varint frame version (always 1), unsigned varint apiKey
(MetadataRecordType), unsigned varint record version, then the record body at that
version. The key is null. Anything after the body is garbage and rejected, as Kafka does.
"""
from __future__ import annotations

from dataclasses import dataclass

from kbroker.metadata.records import RECORD_CLASSES
from kbroker.protocol.primitives import ProtocolDecodeError, ProtocolStruct, r_uvarint, w_uvarint

FRAME_VERSION = 1


class MetadataParseError(ValueError):
    """A metadata record value that cannot be decoded (Kafka's MetadataParseException)."""


@dataclass(frozen=True)
class ApiMessageAndVersion:
    """One metadata record and the version it is (or will be) written at."""
    message: ProtocolStruct
    version: int

    @property
    def api_key(self) -> int:
        return API_KEYS[type(self.message)]


API_KEYS = {cls: key for key, cls in RECORD_CLASSES.items()}


def serialize(record: ApiMessageAndVersion) -> bytes:
    """The record value for ``record``: frame header then body."""
    w = bytearray()
    w_uvarint(w, FRAME_VERSION)
    w_uvarint(w, record.api_key)
    w_uvarint(w, record.version)
    return bytes(w) + bytes(record.message.encode(record.version))


def deserialize(value) -> ApiMessageAndVersion:
    """Decode a record value; MetadataParseError names what is wrong."""
    buf = memoryview(value).cast("B") if not isinstance(value, memoryview) else value
    try:
        frame, pos = r_uvarint(buf, 0)
        if frame != FRAME_VERSION:
            raise MetadataParseError("Could not deserialize metadata record due to unknown frame version %d "
                                     "(only frame version %d is supported)" % (frame, FRAME_VERSION))
        api_key, pos = r_uvarint(buf, pos)
        version, pos = r_uvarint(buf, pos)
        cls = RECORD_CLASSES.get(api_key)
        if cls is None:
            raise MetadataParseError("Unknown metadata id %d" % api_key)
        message, end = cls.decode_from(buf, pos, version)
    except (ProtocolDecodeError, IndexError) as e:
        raise MetadataParseError("Failed to deserialize metadata record: %s" % e) from e
    except ValueError as e:  # UnsupportedVersionError and friends
        if isinstance(e, MetadataParseError):
            raise
        raise MetadataParseError("Failed to deserialize metadata record: %s" % e) from e
    if end != len(buf):
        raise MetadataParseError("Found %d byte(s) of garbage after %s" % (len(buf) - end, cls.__name__))
    return ApiMessageAndVersion(message, version)

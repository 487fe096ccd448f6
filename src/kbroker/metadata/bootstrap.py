"""Bootstrap metadata: the feature levels a new KRaft cluster starts from.

Kafka: ``metadata/.../metadata/bootstrap/BootstrapMetadata.java``, ``Formatter``'s feature
rules, ``server-common/.../MetadataVersion.java`` (3.9), ``raft/.../DynamicVoters.java``.
``kbroker storage format`` writes them to ``bootstrap.checkpoint`` in each directory it formats
(the file I/O is in :mod:`kbroker.server.kraft_storage`; this module is pure, like the rest of
kbroker.metadata: bytes in, bytes out, the time passed in); the first active controller
appends them to an empty ``__cluster_metadata`` log.

``bootstrap.checkpoint`` is a snapshot-format file (:mod:`kbroker.metadata.snapshot`), as
Kafka's ``BatchFileWriter`` writes it: three v2 record batches, uncompressed,
partitionLeaderEpoch 0, no producer, every timestamp the time of writing:

- offset 0: control batch, one record with key (version 0, type 3) and value a
  SnapshotHeaderRecord v0 (``version`` 0, ``last_contained_log_timestamp`` 0);
- offsets 1..n: data batch, one record per metadata record (null key, value framed by
  :mod:`kbroker.metadata.serde`): FeatureLevelRecord(metadata.version) first, then every other
  feature whose level is above 0, by name (kraft.version never has a record);
- offset n+1: control batch, one record with key (0, 4) and value a SnapshotFooterRecord v0.
"""
from __future__ import annotations

import base64
import re
import uuid
from dataclasses import dataclass

from kbroker.kernels import records as _records
from kbroker.metadata.records.feature_level_record import FeatureLevelRecord
from kbroker.metadata.serde import ApiMessageAndVersion
from kbroker.metadata.snapshot import (  # noqa: F401  (encode_snapshot: the file format)
    SNAPSHOT_FOOTER, SNAPSHOT_HEADER, control_key, decode_snapshot, encode_snapshot,
)
from kbroker.protocol.messages.snapshot_footer_record import SnapshotFooterRecord
from kbroker.protocol.messages.snapshot_header_record import SnapshotHeaderRecord

BOOTSTRAP_FILE = "bootstrap.checkpoint"
METADATA_VERSION = "metadata.version"
KRAFT_VERSION = "kraft.version"
TRANSACTION_VERSION = "transaction.version"

#: Kafka's ControlRecordType ids (the second int16 of a control record's key)
CONTROL_TYPES = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER",
                 4: "SNAPSHOT_FOOTER", 5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}


class FormatterError(ValueError):
    """A request ``kbroker storage format`` refuses (Kafka's FormatterException); one line."""


@dataclass(frozen=True, order=True)
class MetadataVersion:
    """One KRaft ``metadata.version`` (Kafka's MetadataVersion enum entries with a feature level)."""
    feature_level: int
    release: str        # "3.9"
    sub_version: str    # "IV0"

    def __str__(self) -> str:
        return f"{self.release}-{self.sub_version}"

    @property
    def is_production(self) -> bool:
        return self.feature_level <= LATEST_PRODUCTION.feature_level


#: Kafka 3.9's MetadataVersion values from the first KRaft one (feature level 1) on.
METADATA_VERSIONS = tuple(MetadataVersion(level, *name.split("-")) for level, name in enumerate((
    "3.0-IV1", "3.1-IV0", "3.2-IV0", "3.3-IV0", "3.3-IV1", "3.3-IV2", "3.3-IV3", "3.4-IV0",
    "3.5-IV0", "3.5-IV1", "3.5-IV2", "3.6-IV0", "3.6-IV1", "3.6-IV2", "3.7-IV0", "3.7-IV1",
    "3.7-IV2", "3.7-IV3", "3.7-IV4", "3.8-IV0", "3.9-IV0", "4.0-IV0", "4.0-IV1"), start=1))
_BY_LEVEL = {mv.feature_level: mv for mv in METADATA_VERSIONS}
LATEST_PRODUCTION = _BY_LEVEL[21]            # 3.9-IV0
MINIMUM_BOOTSTRAP_VERSION = _BY_LEVEL[4]     # 3.3-IV0: the first that stores metadata.version in the log
SCRAM_MINIMUM_VERSION = _BY_LEVEL[11]        # 3.5-IV2: the first with SCRAM credentials in the log

#: Features other than metadata.version that format knows (Kafka 3.9's Features.PRODUCTION_FEATURES):
#: name -> ((level, the metadata.version from which it is the default), ...) and the highest
#: production level. transaction.version 2 (KIP-890 part 2) is production here and a new
#: cluster's default, as in Kafka 4.0; Kafka ties its default to 4.0-IV2, kbroker to its own
#: latest production metadata.version (3.9-IV0), with which it implements it.
FEATURES = {
    KRAFT_VERSION: (((0, 1), (1, 21)), 1),
    TRANSACTION_VERSION: (((0, 1), (1, 21), (2, 21)), 2),
}


def metadata_version_from_string(text: str) -> MetadataVersion:
    """Kafka's ``MetadataVersion.fromVersionString``: ``3.9`` (the release's latest production
    version) or ``3.9-IV0``; versions before KRaft are 'too old', unknown ones invalid."""
    s = text.strip()
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)*(?:-(IV\d+))?", s)
    if m is None:
        raise FormatterError(f"Version {text} is not a valid version")
    release = f"{m.group(1)}.{m.group(2)}"
    if (int(m.group(1)), int(m.group(2))) < (3, 0) or s.startswith("0.") or (release, m.group(3)) == ("3.0", "IV0"):
        raise FormatterError(f"{METADATA_VERSION} {s} is too old to be supported.")
    matches = [mv for mv in METADATA_VERSIONS if mv.release == release
               and (m.group(3) == mv.sub_version if m.group(3) else mv.is_production)]
    if not matches:
        raise FormatterError(f"Version {text} is not a valid version")
    return matches[-1]


def metadata_version_from_level(level: int) -> MetadataVersion:
    try:
        return _BY_LEVEL[level]
    except KeyError:
        raise FormatterError(f"No MetadataVersion with feature level {level}") from None


def feature_default(name: str, mv: MetadataVersion) -> int:
    """Kafka's ``Features.defaultValue``: the highest level whose bootstrap version is <= mv."""
    level = 0
    for lvl, since in FEATURES[name][0]:
        if since <= mv.feature_level:
            level = lvl
        else:
            break
    return level


def effective_feature_levels(release: MetadataVersion | None, features: dict[str, int], *,
                             dynamic_quorum: bool = False) -> tuple[MetadataVersion, dict[str, int]]:
    """Kafka 3.9's Formatter.calculateEffectiveReleaseVersion + calculateEffectiveFeatureLevels:
    (metadata.version, {feature: level}) with defaults filled in; FormatterError if refused."""
    features = dict(features)
    if METADATA_VERSION in features:
        if release is not None:
            raise FormatterError(f"Use --release-version instead of --feature {METADATA_VERSION}=X "
                                 "to avoid ambiguity.")
        release = metadata_version_from_level(features.pop(METADATA_VERSION))
    elif release is None:
        release = LATEST_PRODUCTION
    if not release.is_production:
        raise FormatterError(f"{METADATA_VERSION} {release} is not yet stable.")
    for name in features:
        if name not in FEATURES:
            raise FormatterError(f"Unsupported feature: {name}. Supported features are: "
                                 + ", ".join(sorted(FEATURES)))
    levels = {METADATA_VERSION: release.feature_level}
    for name in sorted(FEATURES):
        if name == KRAFT_VERSION:
            level = features.get(name, 1 if dynamic_quorum else 0)
            if name in features and (level == 0) == dynamic_quorum:
                raise FormatterError(
                    f"Cannot set kraft.version to {level} {'if' if dynamic_quorum else 'unless'} KIP-853 "
                    "configuration is present. Try removing the --feature flag for kraft.version.")
        else:
            level = features.get(name, feature_default(name, release))
        levels[name] = level
    for name, level in levels.items():
        if name == METADATA_VERSION:
            continue
        known = {lvl for lvl, _ in FEATURES[name][0]}
        if level not in known or level > FEATURES[name][1]:
            raise FormatterError(f"No feature:{name} with feature level {level}")
        if level >= 1 and release.feature_level < MINIMUM_BOOTSTRAP_VERSION.feature_level:
            raise FormatterError(f"{name} could not be set to {level} because it depends on "
                                 f"metadata.version=4 ({MINIMUM_BOOTSTRAP_VERSION})")
        if name == KRAFT_VERSION and level >= 1 and release.feature_level < 21:   # KRaftVersion.dependencies
            raise FormatterError(f"{name} could not be set to {level} because it depends on "
                                 f"{METADATA_VERSION} level 21")
    return release, levels


def bootstrap_records(release: MetadataVersion, levels: dict[str, int]) -> list[ApiMessageAndVersion]:
    """Kafka's ``BootstrapMetadata.fromVersions``: metadata.version's FeatureLevelRecord, then
    each other feature above level 0 by name (kraft.version is in no record)."""
    if release.feature_level < MINIMUM_BOOTSTRAP_VERSION.feature_level:
        raise FormatterError(f"Bootstrap metadata.version before {MINIMUM_BOOTSTRAP_VERSION} are not "
                             "supported. Can't load metadata from format command")
    out = [ApiMessageAndVersion(FeatureLevelRecord(name=METADATA_VERSION, feature_level=release.feature_level), 0)]
    for name in sorted(levels):
        if name not in (METADATA_VERSION, KRAFT_VERSION) and levels[name] > 0:
            out.append(ApiMessageAndVersion(FeatureLevelRecord(name=name, feature_level=levels[name]), 0))
    return out


def uuid_from_str(text: str) -> uuid.UUID:
    """Kafka's ``Uuid.fromString``: 22 characters of URL-safe base64 (ValueError otherwise)."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) != 16:
        raise ValueError(f"invalid Uuid {text!r}")
    return uuid.UUID(bytes=raw)


#: Kafka's Snapshots.BOOTSTRAP_SNAPSHOT_ID (end offset 0, epoch 0) as a file name
BOOTSTRAP_SNAPSHOT = "00000000000000000000-0000000000.checkpoint"


@dataclass(frozen=True)
class DynamicVoter:
    """One ``--initial-controllers`` entry, ``id@host:port:directory-id`` (Kafka's DynamicVoter)."""
    node_id: int
    host: str
    port: int
    directory_id: str


def parse_dynamic_voters(text: str) -> dict[int, DynamicVoter]:
    """Kafka's DynamicVoters.parse: comma-separated entries -> {node id: voter};
    FormatterError with Kafka's message if one is malformed."""
    voters: dict[int, DynamicVoter] = {}
    for entry in text.strip().split(","):
        entry = entry.strip()
        if not entry:
            continue
        at = entry.find("@")
        if at < 0:
            raise FormatterError("No @ found in dynamic voter string.")
        if at == 0:
            raise FormatterError("Invalid @ at beginning of dynamic voter string.")
        try:
            node_id = int(entry[:at])
        except ValueError:
            raise FormatterError("Failed to parse node id in dynamic voter string.") from None
        if node_id < 0:
            raise FormatterError(f"Invalid negative node id {node_id} in dynamic voter string.")
        rest = entry[at + 1:]
        if not rest:
            raise FormatterError("No hostname found after node id.")
        if rest.startswith("["):
            end = rest.find("]")
            if end < 0:
                raise FormatterError("Hostname began with left bracket, but no right bracket was found.")
            host, rest = rest[1:end], rest[end + 1:]
        else:
            colon = rest.find(":")
            if colon < 0:
                raise FormatterError("No colon following hostname could be found.")
            host, rest = rest[:colon], rest[colon:]
        if not rest.startswith(":"):
            raise FormatterError("Port section must start with a colon.")
        port_text, colon, dir_text = rest[1:].partition(":")
        if not colon:
            raise FormatterError("No colon following port could be found.")
        try:
            port = int(port_text)
        except ValueError:
            raise FormatterError("Failed to parse port in dynamic voter string.") from None
        if not 0 <= port <= 65535:
            raise FormatterError(f"Invalid port {port} in dynamic voter string.")
        try:
            uuid_from_str(dir_text)
        except ValueError:
            raise FormatterError("Failed to parse directory ID in dynamic voter string.") from None
        if node_id in voters:
            raise FormatterError(f"Node id {node_id} was specified more than once.")
        voters[node_id] = DynamicVoter(node_id, host, port, dir_text)
    if not voters:
        raise FormatterError("No voters given.")
    return dict(sorted(voters.items()))


def encode_voters_snapshot(voters: dict[int, DynamicVoter], listener_name: str, kraft_version: int,
                           now_ms: int) -> bytes:
    """The bootstrap snapshot of a KIP-853 dynamic quorum (Kafka's Formatter.writeDynamicQuorumSnapshot
    through RecordsSnapshotWriter): one control batch at offset 0 holding SnapshotHeader,
    KRaftVersionRecord and VotersRecord (each voter with one endpoint on ``listener_name`` and
    kraft.version support 0..1), then the SnapshotFooter control batch."""
    from kbroker.protocol.messages.kraft_version_record import KRaftVersionRecord
    from kbroker.protocol.messages.voters_record import Endpoint, KRaftVersionFeature, Voter, VotersRecord

    now = now_ms
    header = SnapshotHeaderRecord(version=0, last_contained_log_timestamp=now)
    voters_record = VotersRecord(version=0, voters=[
        Voter(voter_id=v.node_id, voter_directory_id=uuid_from_str(v.directory_id),
              endpoints=[Endpoint(name=listener_name, host=v.host, port=v.port)],
              kraft_version_feature=KRaftVersionFeature(min_supported_version=0, max_supported_version=1))
        for v in voters.values()])
    control = [(now, control_key(SNAPSHOT_HEADER), header.encode(0), ())]
    if kraft_version >= 1:
        control.append((now, control_key(5), KRaftVersionRecord(version=0, kraft_version=kraft_version).encode(0), ()))
        control.append((now, control_key(6), voters_record.encode(0), ()))
    first = _records.encode_batch(control, base_offset=0, partition_leader_epoch=0, is_control=True)
    footer = _records.encode_batch([(now, control_key(SNAPSHOT_FOOTER), SnapshotFooterRecord(version=0).encode(0), ())],
                                   base_offset=len(control), partition_leader_epoch=0, is_control=True)
    return first + footer


def decode_bootstrap(data: bytes, source: str) -> list[ApiMessageAndVersion]:
    """The metadata records of a bootstrap (snapshot-format) file's bytes; control batches are
    skipped (Kafka's BootstrapDirectory.readFromBinaryFile). ValueError if they are damaged or
    hold no metadata.version."""
    out = decode_snapshot(data, require_footer=False)
    if not any(isinstance(r.message, FeatureLevelRecord) and r.message.name == METADATA_VERSION for r in out):
        raise FormatterError(f"No FeatureLevelRecord for {METADATA_VERSION} was found in the bootstrap "
                             f"metadata from the binary bootstrap metadata file: {source}")
    return out

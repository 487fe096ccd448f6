"""FeatureControlManager: finalized feature levels, ``metadata.version`` above all.

Kafka: ``FeatureControlManager`` and ``server-common/.../MetadataVersion``. The
metadata.version decides which record versions the controller writes and whether
brokers must register log directories. A new cluster starts from
``bootstrap_records(level)`` (what ``kbroker storage format`` writes).

UpdateFeatures (KIP-584/KIP-778, ``update_features``) changes finalized levels as Kafka's
controller does: every update is checked against this controller's supported range and
every registered broker's; a lower level needs SAFE_DOWNGRADE (UNSAFE_DOWNGRADE of
metadata.version is refused, as in Kafka), a higher one UPGRADE; metadata.version never
goes below 3.3-IV0, nor down across a version that changed the metadata format; one bad
update fails them all, and the rest are written as one atomic batch of FeatureLevelRecords.
kbroker controllers do not register (no ControllerRegistrationRecord), so the other
controllers of the quorum are taken to support what this one does (they run the same
release).
"""
from __future__ import annotations

import logging

from kbroker.controller.result import ApiError, ControllerResult
from kbroker.metadata.image import METADATA_VERSION
from kbroker.metadata.records import FeatureLevelRecord
from kbroker.metadata.serde import ApiMessageAndVersion
from kbroker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

# MetadataVersion feature levels (Kafka 3.9)
IBP_3_0_IV1 = 1
IBP_3_3_IV0 = 4        # MINIMUM_BOOTSTRAP_VERSION
IBP_3_3_IV2 = 6        # BrokerRegistrationChangeRecord for fencing
IBP_3_3_IV3 = 7        # in-controlled-shutdown broker state
IBP_3_4_IV0 = 8        # RegisterBrokerRecord v2
IBP_3_5_IV2 = 11       # SCRAM credentials in the metadata log (UserScramCredentialRecord)
IBP_3_7_IV2 = 17       # directory assignment (log dirs in registrations and partitions)
IBP_3_9_IV0 = 21
LATEST = IBP_3_9_IV0
MINIMUM_BOOTSTRAP = IBP_3_3_IV0

#: metadata.version level -> release name (Kafka's MetadataVersion.version())
METADATA_VERSION_NAMES = {
    1: "3.0-IV1", 2: "3.1-IV0", 3: "3.2-IV0", 4: "3.3-IV0", 5: "3.3-IV1", 6: "3.3-IV2", 7: "3.3-IV3",
    8: "3.4-IV0", 9: "3.5-IV0", 10: "3.5-IV1", 11: "3.5-IV2", 12: "3.6-IV0", 13: "3.6-IV1", 14: "3.6-IV2",
    15: "3.7-IV0", 16: "3.7-IV1", 17: "3.7-IV2", 18: "3.7-IV3", 19: "3.7-IV4", 20: "3.8-IV0", 21: "3.9-IV0",
}
#: metadata.version levels whose release changed the metadata format (Kafka's
#: MetadataVersion.didMetadataChange): a downgrade across one of them could lose metadata
METADATA_CHANGED = frozenset({1, 3, 5, 6, 7, 8, 11, 13, 14, 15, 17})
#: UpdateFeatures' upgrade types (Kafka's FeatureUpdate.UpgradeType)
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


def metadata_changed(a: int, b: int) -> bool:
    """Kafka's MetadataVersion.checkIfMetadataChanged: some level in (low, high] changed
    the metadata format."""
    low, high = min(a, b), max(a, b)
    return any(v in METADATA_CHANGED for v in range(low + 1, high + 1))


def bootstrap_records(metadata_version: int = LATEST) -> list:
    """The records a freshly formatted cluster's log starts with."""
    return [ApiMessageAndVersion(FeatureLevelRecord(name=METADATA_VERSION, feature_level=metadata_version), 0)]


class FeatureControlManager:
    def __init__(self, node_id: int = -1):
        self.finalized: dict = {}
        self.node_id = node_id        # this controller's (UpdateFeatures' messages name it)

    def replay(self, r, offset: int = -1) -> None:
        if r.feature_level:
            self.finalized[r.name] = r.feature_level
        else:
            self.finalized.pop(r.name, None)

    @property
    def metadata_version(self) -> int:
        return self.finalized.get(METADATA_VERSION, IBP_3_0_IV1)

    # record versions the controller writes at this metadata.version
    def register_broker_record_version(self) -> int:
        mv = self.metadata_version
        return 3 if mv >= IBP_3_7_IV2 else 2 if mv >= IBP_3_4_IV0 else 1 if mv >= IBP_3_3_IV3 else 0

    def partition_record_version(self) -> int:
        return 1 if self.metadata_version >= IBP_3_7_IV2 else 0

    def directory_assignment(self) -> bool:
        return self.metadata_version >= IBP_3_7_IV2

    def registration_change_record(self) -> bool:
        return self.metadata_version >= IBP_3_3_IV2

    def controlled_shutdown_state(self) -> bool:
        return self.metadata_version >= IBP_3_3_IV3

    def scram_supported(self) -> bool:
        """Kafka's MetadataVersion.isScramSupported."""
        return self.metadata_version >= IBP_3_5_IV2

    # --- UpdateFeatures ---------------------------------------------------------------
    def update_features(self, updates: dict, upgrade_types: dict, validate_only: bool,
                        local_supported: dict, brokers_supported) -> ControllerResult:
        """Kafka's FeatureControlManager.updateFeatures. ``updates``: {feature: new level};
        ``upgrade_types``: {feature: UPGRADE / SAFE_DOWNGRADE / UNSAFE_DOWNGRADE};
        ``local_supported``: {feature: (min, max)} of this controller;
        ``brokers_supported``: [(broker id, {feature: (min, max)})] of the registered brokers.
        ``response`` is None on success, else the ApiError of the first bad update (and no
        record is written)."""
        records = []
        for name, level in updates.items():
            err = self._update_feature(name, level, upgrade_types.get(name, UPGRADE), local_supported,
                                       brokers_supported, records)
            if err is not None:
                return ControllerResult([], err)
        if validate_only:
            return ControllerResult([], None)
        return ControllerResult(records, None, atomic=True)

    def _update_feature(self, name: str, level: int, upgrade_type: int, local_supported: dict,
                        brokers_supported, records: list):
        if upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
            return _invalid_update(name, level, "The controller does not support the given upgrade type.")
        current = self.metadata_version if name == METADATA_VERSION else self.finalized.get(name, 0)
        if level < 0:
            return _invalid_update(name, level, "A feature version cannot be less than 0.")
        reason = _reason_not_supported(name, level, "Local controller %d" % self.node_id, local_supported)
        if reason is None:
            for broker_id, supported in brokers_supported:
                reason = _reason_not_supported(name, level, "Broker %d" % broker_id, supported)
                if reason is not None:
                    break
        if reason is not None:
            return _invalid_update(name, level, reason)
        if level < current and upgrade_type == UPGRADE:
            return _invalid_update(name, level, "Can't downgrade the version of this feature without setting "
                                                "the upgrade type to either safe or unsafe downgrade.")
        if level > current and upgrade_type != UPGRADE:
            return _invalid_update(name, level, "Can't downgrade to a newer version.")
        if name == METADATA_VERSION:
            if level < MINIMUM_BOOTSTRAP:
                return _invalid_metadata_version(level, "Unable to set a metadata.version less than 3.3-IV0")
            if level < current and metadata_changed(current, level):
                if upgrade_type == UNSAFE_DOWNGRADE:
                    return _invalid_metadata_version(level, "Unsafe metadata downgrade is not supported in "
                                                            "this version.")
                return _invalid_metadata_version(level, "Refusing to perform the requested downgrade because "
                                                        "it might delete metadata information.")
            log.warning("%s metadata.version from %d to %d.", "Downgrading" if level < current else "Upgrading",
                        current, level)
        records.append(ApiMessageAndVersion(FeatureLevelRecord(name=name, feature_level=level), 0))
        return None


def _reason_not_supported(name: str, level: int, what: str, supported: dict):
    """Kafka's QuorumFeatures.reasonNotSupported; a feature not listed supports only 0."""
    lo, hi = supported.get(name, (0, 0))
    if lo <= level <= hi:
        return None
    if hi == 0:
        return f"{what} does not support this feature."
    return f"{what} only supports versions [{lo}, {hi}]"


def _invalid_update(name: str, level: int, message: str) -> ApiError:
    text = "Invalid update version %d for feature %s. %s" % (level, name, message)
    log.warning("%s", text)
    return ApiError(ErrorCode.INVALID_UPDATE_VERSION, text)


def _invalid_metadata_version(level: int, message: str) -> ApiError:
    text = "Invalid metadata.version %d. %s" % (level, message)
    log.warning("%s", text)
    return ApiError(ErrorCode.INVALID_UPDATE_VERSION, text)

"""FeatureControlManager: finalized feature levels, ``metadata.version`` above all.

Kafka: ``FeatureControlManager`` and ``server-common/.../MetadataVersion``. The
metadata.version decides which record versions the controller writes and whether
brokers must register log directories. A new cluster starts from
``bootstrap_records(level)`` (what ``kbroker storage format`` writes).
"""
from __future__ import annotations

from kbroker.metadata.image import METADATA_VERSION
from kbroker.metadata.records import FeatureLevelRecord
from kbroker.metadata.serde import ApiMessageAndVersion

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


def bootstrap_records(metadata_version: int = LATEST) -> list:
    """The records a freshly formatted cluster's log starts with."""
    return [ApiMessageAndVersion(FeatureLevelRecord(name=METADATA_VERSION, feature_level=metadata_version), 0)]


class FeatureControlManager:
    def __init__(self):
        self.finalized: dict = {}

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

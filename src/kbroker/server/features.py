"""The feature levels a broker works with (Kafka's ``BrokerFeatures`` / ``FinalizedFeatures``).

``SUPPORTED``: the ranges this broker implements; it registers them with the controller
(which refuses a broker that cannot serve a finalized level) and advertises them in
ApiVersions v3+. ``finalized(broker)``: the cluster's finalized levels — on a KRaft broker
the metadata image's FeatureLevelRecords (``kbroker storage format`` writes
``transaction.version`` 2 into a new cluster's bootstrap, as Kafka 4.0 does; a controller
started without a ``bootstrap.checkpoint`` bootstraps metadata.version alone, so version 1);
the single node is always a cluster of this release, with the same defaults.

``transaction.version`` 2 (KIP-890 part 2) turns on the versions that carry it: EndTxn v5,
Produce v12 and TxnOffsetCommit v5 are advertised only while it is finalized at 2 or more
(:data:`TV2_VERSIONS`), so a client chooses transaction version 2 by sending them.
"""
from __future__ import annotations

from kbroker.protocol import ApiKey

METADATA_VERSION = "metadata.version"
TRANSACTION_VERSION = "transaction.version"

SUPPORTED: dict[str, tuple[int, int]] = {METADATA_VERSION: (1, 21), TRANSACTION_VERSION: (0, 2)}
#: a new cluster's finalized levels (the single node's)
DEFAULT_FINALIZED: dict[str, int] = {METADATA_VERSION: 21, TRANSACTION_VERSION: 2}

#: api key -> (the first version of transaction version 2, the last one before it)
TV2_VERSIONS = {int(ApiKey.END_TXN): (5, 4), int(ApiKey.PRODUCE): (12, 11), int(ApiKey.TXN_OFFSET_COMMIT): (5, 4)}


def finalized(broker) -> dict[str, int]:
    """{feature: finalized level} (levels of 0 are left out, as in Kafka)."""
    if getattr(broker, "offsets_topic_on_demand", False):       # a KRaft broker
        image = broker.metadata_cache.kraft_image
        return {k: v for k, v in image.features.finalized.items() if v}
    return dict(DEFAULT_FINALIZED)


def finalized_epoch(broker) -> int:
    """ApiVersions' FinalizedFeaturesEpoch: the metadata offset the levels were read at."""
    if getattr(broker, "offsets_topic_on_demand", False):
        return broker.metadata_cache.kraft_image.offset
    return 0


def transaction_version(broker) -> int:
    return finalized(broker).get(TRANSACTION_VERSION, 0)


def advertised_versions(broker, versions: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """``versions`` as ApiVersions may show them: without transaction version 2's versions
    while it is not finalized (Kafka 4.0's ApiVersionsResponse does the same)."""
    if broker is None or transaction_version(broker) >= 2:
        return versions
    out = dict(versions)
    for key, (first, before) in TV2_VERSIONS.items():
        if key in out and out[key][1] >= first:
            out[key] = (out[key][0], before)
    return out

"""UpdateFeatures on the QuorumController (Kafka's FeatureControlManager.updateFeatures):
levels checked against this controller's and every registered broker's supported ranges,
upgrade/downgrade types, metadata.version's floor and format changes, validate-only, and
one bad update failing the whole request."""
from __future__ import annotations

from kbroker.controller.features import (
    IBP_3_3_IV0, LATEST, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE, UPGRADE, metadata_changed,
)
from kbroker.protocol import ErrorCode
from kbroker.protocol.messages import broker_registration as BR
from kbroker.protocol.messages import update_features as UF
from tests.controller.harness import Harness, registration

SUPPORTED = {"metadata.version": (1, LATEST), "transaction.version": (0, 2)}
TV = "transaction.version"
MV = "metadata.version"


def _harness(broker_tv=(0, 2), **kw):
    h = Harness(supported_features=dict(SUPPORTED), node_id=3000, **kw)
    for b in (1, 2):
        req = registration(b)
        tv = broker_tv if b == 1 else (0, 2)
        req.features = list(req.features) + [BR.Feature(name=TV, min_supported_version=tv[0],
                                                        max_supported_version=tv[1])]
        assert h.write(h.c.register_broker(req, h.now)).response.error_code == 0
    return h


def _update(h, version=1, validate_only=False, **levels):
    ups = []
    for name, spec in levels.items():
        level, kind = spec if isinstance(spec, tuple) else (spec, UPGRADE)
        ups.append(UF.FeatureUpdateKey(feature=name.replace("_", "."), max_version_level=level,
                                       allow_downgrade=kind != UPGRADE, upgrade_type=kind))
    req = UF.UpdateFeaturesRequest(timeout_ms=1000, feature_updates=ups, validate_only=validate_only)
    before = len(h.log)
    r = h.write(h.c.update_features(req, version))
    return r.response, h.log[before:]


def test_upgrade_downgrade_and_delete_transaction_version():
    h = _harness()
    resp, written = _update(h, transaction_version=2)
    assert resp.error_code == ErrorCode.NONE and [(x.feature, x.error_code) for x in resp.results] == [(TV, 0)]
    assert [(m.message.name, m.message.feature_level) for _, m in written] == [(TV, 2)]
    assert h.c.features.finalized[TV] == 2
    # a lower level needs a downgrade type; a higher one must be an upgrade
    resp, written = _update(h, transaction_version=1)
    assert resp.error_code == ErrorCode.INVALID_UPDATE_VERSION and written == [] and resp.results == []
    assert "Can't downgrade the version of this feature" in resp.error_message
    assert resp.error_message.startswith("The update failed for all features since the following feature had an error")
    resp, _ = _update(h, transaction_version=(0, SAFE_DOWNGRADE))
    assert resp.error_code == ErrorCode.NONE and TV not in h.c.features.finalized    # level 0 deletes it
    resp, _ = _update(h, transaction_version=(1, SAFE_DOWNGRADE))
    assert resp.error_code == ErrorCode.INVALID_UPDATE_VERSION
    assert "Can't downgrade to a newer version" in resp.error_message
    # v0's AllowDowngrade is a safe downgrade
    _update(h, transaction_version=2)
    resp, _ = _update(h, version=0, transaction_version=(1, SAFE_DOWNGRADE))
    assert resp.error_code == ErrorCode.NONE and h.c.features.finalized[TV] == 1


def test_levels_every_node_must_support():
    h = _harness(broker_tv=(0, 1))
    resp, written = _update(h, transaction_version=2)
    assert resp.error_code == ErrorCode.INVALID_UPDATE_VERSION and written == []
    assert "Broker 1 only supports versions [0, 1]" in resp.error_message
    resp, _ = _update(h, transaction_version=3)
    assert "Local controller 3000 only supports versions [0, 2]" in resp.error_message
    resp, _ = _update(h, **{"group_version": 1})
    assert "does not support this feature" in resp.error_message
    resp, _ = _update(h, transaction_version=-1)
    assert "cannot be less than 0" in resp.error_message
    assert _update(h, transaction_version=1)[0].error_code == ErrorCode.NONE


def test_metadata_version_floor_and_format_changes():
    h = _harness()
    assert h.c.features.metadata_version == LATEST
    resp, _ = _update(h, metadata_version=(IBP_3_3_IV0 - 1, SAFE_DOWNGRADE))
    assert "Unable to set a metadata.version less than 3.3-IV0" in resp.error_message
    # 3.9-IV0 (21) down to 3.7-IV2 (17): no release in between changed the metadata format
    assert not metadata_changed(LATEST, 17) and metadata_changed(LATEST, 16)
    resp, written = _update(h, metadata_version=(17, SAFE_DOWNGRADE))
    assert resp.error_code == ErrorCode.NONE
    assert [(m.message.name, m.message.feature_level) for _, m in written] == [(MV, 17)]
    assert h.c.features.metadata_version == 17
    resp, _ = _update(h, metadata_version=(16, SAFE_DOWNGRADE))
    assert "Refusing to perform the requested downgrade because it might delete metadata" in resp.error_message
    resp, _ = _update(h, metadata_version=(16, UNSAFE_DOWNGRADE))
    assert "Unsafe metadata downgrade is not supported" in resp.error_message
    assert _update(h, metadata_version=LATEST)[0].error_code == ErrorCode.NONE
    assert h.c.features.metadata_version == LATEST


def test_validate_only_and_one_bad_update_fail_alone():
    h = _harness()
    resp, written = _update(h, validate_only=True, transaction_version=2)
    assert resp.error_code == ErrorCode.NONE and written == [] and h.c.features.finalized.get(TV, 0) == 0
    resp, written = _update(h, transaction_version=2, metadata_version=(LATEST + 1))
    assert resp.error_code == ErrorCode.INVALID_UPDATE_VERSION and written == []
    assert h.c.features.finalized.get(TV, 0) == 0
    resp, written = _update(h, transaction_version=2, metadata_version=LATEST)
    assert resp.error_code == ErrorCode.NONE and len(written) == 2
    assert sorted(x.feature for x in resp.results) == [MV, TV]

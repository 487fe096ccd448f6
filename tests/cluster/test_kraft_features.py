"""UpdateFeatures on a KRaft cluster of real processes (1 controller + 1 broker): sent to the
broker, forwarded to the controller, written as FeatureLevelRecords; the broker's ApiVersions
follows the finalized levels (transaction.version 2's Produce v12 comes and goes with it)."""
from __future__ import annotations

import time

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import api_versions as av
from kbroker.protocol.messages import update_features as UF
from kbroker.testing import KRaftControllerQuorum, raw_request
from tests.cluster.test_kraft_cluster import FAST, _brokers, _wait

TV = "transaction.version"


def _versions(port):
    r = raw_request(port, ApiKey.API_VERSIONS, 3, av.ApiVersionsRequest(client_software_name="t",
                                                                           client_software_version="1"))
    finalized = {f.name: f.max_version_level for f in r.finalized_features}
    produce_max = next(k.max_version for k in r.api_keys if k.api_key == ApiKey.PRODUCE)
    update = [(k.min_version, k.max_version) for k in r.api_keys if k.api_key == ApiKey.UPDATE_FEATURES]
    return finalized, produce_max, update


def _update(port, level, upgrade_type=1, validate_only=False):
    req = UF.UpdateFeaturesRequest(timeout_ms=10000, validate_only=validate_only, feature_updates=[
        UF.FeatureUpdateKey(feature=TV, max_version_level=level, upgrade_type=upgrade_type)])
    return raw_request(port, ApiKey.UPDATE_FEATURES, 1, req, timeout_s=20)


def test_update_features_through_a_broker(tmp_path):
    q = KRaftControllerQuorum(str(tmp_path), n=1, overrides=FAST, brokers=1)
    try:
        q.start()
        port = q.broker_ports[2]
        _wait(lambda: _brokers(port) == [2], what="broker 2 unfenced")
        finalized, produce_max, update = _versions(port)
        assert finalized[TV] == 2 and produce_max >= 12 and update == [(0, 1)]
        # a downgrade must say so; then transaction version 2's versions are no longer offered
        r = _update(port, 0)
        assert r.error_code == ErrorCode.INVALID_UPDATE_VERSION and "downgrade" in r.error_message
        r = _update(port, 0, upgrade_type=2, validate_only=True)
        assert r.error_code == ErrorCode.NONE
        time.sleep(0.5)
        assert _versions(port)[0][TV] == 2                   # validate-only changed nothing
        r = _update(port, 0, upgrade_type=2)
        assert r.error_code == ErrorCode.NONE and [(x.feature, x.error_code) for x in r.results] == [(TV, 0)]
        _wait(lambda: _versions(port)[:2] == ({"metadata.version": 21}, 11), what="transaction.version 0 seen")
        r = _update(port, 3)
        assert r.error_code == ErrorCode.INVALID_UPDATE_VERSION and "only supports versions [0, 2]" in r.error_message
        assert _update(port, 2).error_code == ErrorCode.NONE
        _wait(lambda: _versions(port)[0].get(TV) == 2 and _versions(port)[1] >= 12, what="transaction.version 2 again")
    finally:
        q.stop()

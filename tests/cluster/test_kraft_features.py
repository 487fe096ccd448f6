"""UpdateFeatures on a KRaft cluster of real processes (1 controller + 1 broker): sent to the
broker, forwarded to the controller, written as FeatureLevelRecords; the broker's ApiVersions
follows the finalized levels (transaction.version 2's Produce v12 comes and goes with it);
``kbroker features`` (kafka-features.sh) describes and changes them."""
from __future__ import annotations

import io
import time

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import api_versions as av
from kbroker.protocol.messages import update_features as UF
from kbroker.testing import KRaftControllerQuorum, raw_request
from kbroker.tools import features as tool
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


def _tool(*argv):
    out, err = io.StringIO(), io.StringIO()
    rc = tool.main(list(argv), out, err)
    return rc, out.getvalue() + err.getvalue()


def test_kbroker_features_tool(tmp_path):
    q = KRaftControllerQuorum(str(tmp_path), n=1, overrides=FAST, brokers=1)
    try:
        q.start()
        bs = f"127.0.0.1:{q.broker_ports[2]}"
        _wait(lambda: _brokers(q.broker_ports[2]) == [2], what="broker 2 unfenced")
        rc, out = _tool("--bootstrap-server", bs, "describe")
        assert rc == 0
        lines = out.splitlines()
        assert lines[0].startswith("Feature: metadata.version\tSupportedMinVersion: 3.0-IV1\t"
                                   "SupportedMaxVersion: 3.9-IV0\tFinalizedVersionLevel: 3.9-IV0\tEpoch: ")
        assert lines[1].startswith("Feature: transaction.version\tSupportedMinVersion: 0\tSupportedMaxVersion: 2\t"
                                   "FinalizedVersionLevel: 2\tEpoch: ")
        assert _tool("--bootstrap-server", bs, "downgrade", "--feature", "transaction.version=1", "--dry-run") == \
            (0, "transaction.version can be downgraded to 1.\n")
        rc, out = _tool("--bootstrap-server", bs, "upgrade", "--feature", "transaction.version=1")
        assert rc == 1 and out.startswith("Could not upgrade transaction.version to 1. ")
        assert "Can't downgrade the version of this feature" in out
        assert _tool("--bootstrap-server", bs, "disable", "--feature", "transaction.version") == \
            (0, "transaction.version was disabled.\n")
        _wait(lambda: "FinalizedVersionLevel: 0" in _tool("--bootstrap-server", bs, "describe")[1].splitlines()[1],
              what="transaction.version 0 described")
        # metadata.version by release name: 3.7 is 3.7-IV4 (19), and no format change lies above it
        assert _tool("--bootstrap-server", bs, "downgrade", "--metadata", "3.7") == \
            (0, "metadata.version was downgraded to 19.\n")
        rc, out = _tool("--bootstrap-server", bs, "downgrade", "--metadata", "3.6")
        assert rc == 1 and "Refusing to perform the requested downgrade" in out
        assert _tool("--bootstrap-server", bs, "upgrade", "--metadata", "3.9",
                     "--feature", "transaction.version=2") == \
            (0, "metadata.version was upgraded to 21.\ntransaction.version was upgraded to 2.\n")
        rc, out = _tool("--bootstrap-server", bs, "upgrade", "--metadata", "2.8")
        assert rc == 1 and "Unknown metadata.version 2.8" in out
    finally:
        q.stop()

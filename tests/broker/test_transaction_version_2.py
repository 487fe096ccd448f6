"""Transaction version 2 (KIP-890 part 2) against a real broker, with raw requests as a
Kafka 4 producer sends them: no AddPartitionsToTxn (Produce v12 makes the leader add the
partition), EndTxn v5 bumps the epoch and names it, the markers carry it; so a late
EndTxn or Produce of the previous transaction is fenced instead of ending or joining the
next one (the anomaly of tests/chaos/test_txn_anomalies.py that version 1 leaves open)."""
from __future__ import annotations

import time
import uuid

from kbroker.protocol import ApiKey as K, ErrorCode as E
from kbroker.protocol.messages import api_versions as av
from kbroker.protocol.messages.end_txn import EndTxnRequest
from tests.broker.kafka_helpers import create_topic
from tests.broker.raw_client import RawClient
from tests.broker.test_transaction_coordinator_broker import _init
from tests.broker.test_transactions_log import list_latest, produce
from tests.broker.test_txn_verification import _batch, _wait_state


def _end(c, tid, pid, epoch, commit):
    r = c.call(K.END_TXN, 5, EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                           committed=commit))
    return E(r.error_code), r.producer_id, r.producer_epoch


def _produce(c, topic, pid, epoch, seq, value, tid):
    """Produce v12, retried while the previous transaction's markers are being written
    (the coordinator's CONCURRENT_TRANSACTIONS reaches the producer as NOT_ENOUGH_REPLICAS)."""
    deadline = time.monotonic() + 15
    while True:
        err, _ = produce(c, topic, 0, _batch(pid, epoch, seq, value), tid, version=12)
        if err != E.NOT_ENOUGH_REPLICAS or time.monotonic() > deadline:
            return E(err)
        time.sleep(0.05)


def test_api_versions_advertises_transaction_version_2(broker):
    with RawClient(broker.port) as c:
        r = c.call(K.API_VERSIONS, 3, av.ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    assert {f.name: f.max_version_level for f in r.finalized_features}["transaction.version"] == 2
    assert {f.name: (f.min_version, f.max_version) for f in r.supported_features}["transaction.version"] == (0, 2)
    versions = {a.api_key: a.max_version for a in r.api_keys}
    assert (versions[K.END_TXN], versions[K.PRODUCE], versions[K.TXN_OFFSET_COMMIT]) == (5, 12, 5)


def test_epoch_bump_per_transaction_fences_the_previous_ones_requests(broker):
    topic = "tv2-" + uuid.uuid4().hex[:8]
    create_topic(broker.bootstrap, topic, partitions=1)
    tid = "tv2-" + uuid.uuid4().hex[:8]
    with RawClient(broker.port) as c:
        err, pid, e = _init(c, tid)
        assert err == E.NONE
        # T1: the partition is added by the leader (no AddPartitionsToTxn), committed at epoch e
        assert _produce(c, topic, pid, e, 0, b"t1", tid) == E.NONE
        assert _end(c, tid, pid, e, True) == (E.NONE, pid, e + 1)
        _wait_state(c, tid, "CompleteCommit")
        assert _end(c, tid, pid, e, True) == (E.NONE, pid, e + 1)      # a retry of T1's commit
        # T2 at the bumped epoch; T1's late requests are fenced and T2 stays open
        assert _produce(c, topic, pid, e + 1, 0, b"t2", tid) == E.NONE
        assert _end(c, tid, pid, e, True)[0] == E.PRODUCER_FENCED       # T1's EndTxn, late
        assert _produce(c, topic, pid, e, 1, b"late", tid) == E.INVALID_PRODUCER_EPOCH
        assert list_latest(c, topic, 0, 1) < list_latest(c, topic, 0, 0)  # T2 holds the LSO
        assert _end(c, tid, pid, e + 1, False) == (E.NONE, pid, e + 2)
        _wait_state(c, tid, "CompleteAbort")
        assert list_latest(c, topic, 0, 1) == list_latest(c, topic, 0, 0) == 4   # t1, COMMIT, t2, ABORT


def test_transaction_version_2_versions_are_advertised_only_when_finalized():
    """A KRaft cluster formatted with transaction.version 0 (or 1) hides EndTxn v5,
    Produce v12 and TxnOffsetCommit v5, so Kafka 4 producers stay on version 1."""
    from types import SimpleNamespace

    from kbroker.metadata.image import FeaturesImage, MetadataImage
    from kbroker.server import features

    def kraft_broker(levels):
        image = MetadataImage(features=FeaturesImage(levels))
        return SimpleNamespace(offsets_topic_on_demand=True, metadata_cache=SimpleNamespace(kraft_image=image))

    versions = {K.END_TXN: (0, 5), K.PRODUCE: (3, 12), K.TXN_OFFSET_COMMIT: (0, 5), K.FETCH: (4, 17)}
    old = features.advertised_versions(kraft_broker({"metadata.version": 21}), versions)
    assert old == {K.END_TXN: (0, 4), K.PRODUCE: (3, 11), K.TXN_OFFSET_COMMIT: (0, 4), K.FETCH: (4, 17)}
    new = kraft_broker({"metadata.version": 21, "transaction.version": 2})
    assert features.advertised_versions(new, versions) == versions
    assert features.finalized(new) == {"metadata.version": 21, "transaction.version": 2}

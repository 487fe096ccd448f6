"""Client quotas on a KRaft cluster (1 controller + 1 broker): AlterClientQuotas sent to the
broker is forwarded to the controller and written as ClientQuotaRecords; the broker describes
them from its metadata image and throttles with them (throttle_time_ms on a Produce); a
removal reaches the broker the same way."""
from __future__ import annotations

import time

from kbroker.client.admin import Admin
from kbroker.kernels import records
from kbroker.protocol import ApiKey as K, ErrorCode as E
from kbroker.protocol.messages.produce import PartitionProduceData, ProduceRequest, TopicProduceData
from kbroker.testing import KRaftControllerQuorum
from tests.broker.raw_client import RawClient
from kbroker.client.errors import KafkaError
from tests.cluster.test_kraft_data_plane import FAST


def _wait(cond, timeout_s=60.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except KafkaError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout_s}s")


def _produce_throttle(port, client_id, topic):
    batch = records.encode_batch([(int(time.time() * 1000), None, b"v" * 1000, [])] * 20)
    with RawClient(port, client_id=client_id) as c:
        r = c.call(K.PRODUCE, 9, ProduceRequest(transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
            TopicProduceData(name=topic, partition_data=[PartitionProduceData(index=0, records=batch)])]))
    assert r.responses[0].partition_responses[0].error_code == E.NONE, r
    return r.throttle_time_ms


def test_quotas_go_through_the_metadata_log(tmp_path):
    q = KRaftControllerQuorum(str(tmp_path), n=1, brokers=1,
                              overrides={**FAST, "quota.window.num": 2, "quota.window.size.seconds": 1})
    try:
        q.start()
        adm = Admin({"bootstrap.servers": q.bootstrap})
        _wait(lambda: adm.describe_cluster().brokers, what="broker registered")
        adm.create_topics(["qt"])
        port = int(q.bootstrap.split(":")[-1])
        ent = (("client-id", "limited"),)
        assert adm.alter_client_quotas([(ent, {"producer_byte_rate": 10_000})]) == {ent: None}
        bad = (("user", "u"),)
        res = adm.alter_client_quotas([(bad, {"producer_byte_rate": 2.5})], raise_on_error=False)
        assert "fractional" in str(res[bad])
        _wait(lambda: adm.describe_client_quotas() == {ent: {"producer_byte_rate": 10_000.0}},
              what="quota visible on the broker")
        _wait(lambda: _produce_throttle(port, "limited", "qt") > 0, what="throttled by the quota")
        assert _produce_throttle(port, "unlimited", "qt") == 0
        assert adm.alter_client_quotas([(ent, {"producer_byte_rate": None})]) == {ent: None}
        _wait(lambda: adm.describe_client_quotas() == {}, what="quota removed")
        time.sleep(1.1)
        assert _produce_throttle(port, "limited", "qt") == 0
        adm.close()
    finally:
        q.stop()

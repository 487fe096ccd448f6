"""controller_mutation_rate (KIP-599) against a real broker: partitions created and deleted
count against the client's token bucket (quota x samples x window tokens, refilled at quota/s).
Strict versions (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+: our Admin) refuse a
topic while the bucket is negative with THROTTLING_QUOTA_EXCEEDED; older versions
(librdkafka's AdminClient speaks CreateTopics v4) are only throttled (throttle_time_ms).
On a KRaft cluster the broker enforces it around its forward to the controller."""
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic as CkNewTopic

from kbroker.client.admin import Admin, NewTopic
from kbroker.client.errors import KafkaError
from kbroker.protocol import ApiKey as K, ErrorCode as E
from kbroker.protocol.messages import create_topics as ct
from kbroker.quota.controller_mutation import ControllerMutationQuotaManager
from kbroker.testing import KBrokerProcess, KRaftControllerQuorum
from tests.broker.raw_client import RawClient
from tests.broker.test_quotas import _alter

WINDOWS = {"quota.window.num": 2, "quota.window.size.seconds": 1}
# 2 partitions/s: a burst of 2 x 2 x 1 s = 4 partitions


def _code(err):
    return None if err is None else err.code


def _strict_cycle(adm: Admin, bootstrap: str, prefix: str) -> None:
    """4 tokens: a 4-partition topic empties the bucket, a 9-partition one may still go (the
    bucket is not negative yet) and takes it to -9; the next is refused until ~4.5 s later."""
    assert adm.create_topics([NewTopic(prefix + "a", 4, 1)]) == {prefix + "a": None}
    assert adm.create_topics([NewTopic(prefix + "b", 9, 1)]) == {prefix + "b": None}
    res = adm.create_topics([NewTopic(prefix + "c", 1, 1), NewTopic(prefix + "d", 1, 1)], raise_on_error=False)
    assert {n: _code(e) for n, e in res.items()} == {prefix + "c": E.THROTTLING_QUOTA_EXCEEDED,
                                                      prefix + "d": E.THROTTLING_QUOTA_EXCEEDED}
    assert "throttling quota" in str(res[prefix + "c"]).lower()
    # The refusal's response carried the throttle time (~4.5 s) and muted this connection for it
    # (as in Kafka); other connections of the same client-id share the bucket: CreatePartitions
    # and DeleteTopics are refused there too while it is negative.
    for call in (lambda a: a.create_partitions({prefix + "a": 5}, raise_on_error=False),
                 lambda a: a.delete_topics([prefix + "a"], raise_on_error=False)):
        with Admin({"bootstrap.servers": bootstrap, "client.id": "mutator"}) as again:
            assert _code(call(again)[prefix + "a"]) == E.THROTTLING_QUOTA_EXCEEDED
    # the muted connection's next request waits out the throttle time; the bucket has refilled
    t0 = time.monotonic()
    assert adm.create_topics([NewTopic(prefix + "c", 1, 1)]) == {prefix + "c": None}
    assert time.monotonic() - t0 >= 3.0
    # a client without the quota is not limited
    with Admin({"bootstrap.servers": bootstrap, "client.id": "other"}) as free:
        assert free.create_topics([NewTopic(prefix + f"f{i}", 4, 1) for i in range(3)]) == {
            prefix + f"f{i}": None for i in range(3)}


@pytest.fixture(scope="module")
def broker():
    """One broker; each test limits its own client id."""
    with KBrokerProcess(overrides=WINDOWS).start() as b:
        yield b


def test_strict_versions_refuse_a_topic_while_over_the_quota(broker):
    b = broker
    _alter(b.port, [("client-id", "mutator")], {"controller_mutation_rate": 2})
    with Admin({"bootstrap.servers": b.bootstrap, "client.id": "mutator"}) as adm:
        _strict_cycle(adm, b.bootstrap, "s-")


def test_the_response_carries_the_throttle_time_of_a_refused_topic(broker):
    b = broker
    _alter(b.port, [("client-id", "raw")], {"controller_mutation_rate": 2})
    with RawClient(b.port, client_id="raw") as c:
        def create(name, n):
            return c.call(K.CREATE_TOPICS, 7, ct.CreateTopicsRequest(topics=[ct.CreatableTopic(
                name=name, num_partitions=n, replication_factor=1, assignments=[], configs=[])],
                timeout_ms=5000, validate_only=False))
        r = create("r1", 10)            # the bucket (4) was not negative: created, now -6
        assert r.topics[0].error_code == E.NONE and r.throttle_time_ms == 0, r
        r = create("r2", 1)
        assert r.topics[0].error_code == E.THROTTLING_QUOTA_EXCEEDED, r
        # -6 tokens at 2/s: 3 s (less the few ms since)
        assert 2500 <= r.throttle_time_ms <= 3000, r.throttle_time_ms


def test_librdkafka_admin_versions_are_permissive_and_throttled(broker):
    b = broker
    _alter(b.port, [("client-id", "ck")], {"controller_mutation_rate": 2})
    throttles = []
    adm = AdminClient({"bootstrap.servers": b.bootstrap, "client.id": "ck",
                       "throttle_cb": lambda ev: throttles.append(ev.throttle_time)})
    names = [f"p-{i}" for i in range(3)]
    futs = adm.create_topics([CkNewTopic(n, 4, 1) for n in names], operation_timeout=10)
    for n in names:
        futs[n].result(timeout=15)        # all created: v4 is permissive (12 partitions, burst 4)
    adm.poll(1.0)
    deadline = time.monotonic() + 10
    while not throttles and time.monotonic() < deadline:
        adm.poll(0.2)
    # -8 tokens at 2/s: ~4 s (confluent-kafka's ThrottleEvent.throttle_time is in seconds)
    assert throttles and 3.0 <= max(throttles) <= 4.1, throttles
    adm.create_partitions([NewPartitions("p-0", 6)], operation_timeout=10)["p-0"].result(timeout=15)
    del adm


def test_token_bucket_strict_and_permissive():
    now = [0]
    m = ControllerMutationQuotaManager(samples=2, window_s=1, clock_ms=lambda: now[0])
    m.update_quotas({(("user", None),): {"controller_mutation_rate": 2.0}})
    assert m.new_quota_for("alice", "c", K.CREATE_TOPICS, 5) is not None
    assert m.new_quota_for("alice", "c", K.CREATE_TOPICS, 5).strict is False
    strict = m.new_quota_for("alice", "c", K.CREATE_TOPICS, 6)
    assert strict.try_record(4) and strict.try_record(1)          # 4 tokens, then -1
    assert not strict.try_record(1) and strict.throttle_time_ms() == 500
    now[0] = 200
    assert strict.throttle_time_ms() == 300                        # less the time since
    now[0] = 500
    assert strict.try_record(1)                                    # refilled to 0: allowed
    permissive = m.new_quota_for("alice", "c", K.DELETE_TOPICS, 4)
    assert permissive.try_record(3) and permissive.throttle_time_ms() == 2000   # -4 at 2/s
    assert m.new_quota_for("bob", "c", K.DELETE_TOPICS, 5).try_record(4)         # bob's own bucket
    m.update_quotas({})
    assert m.new_quota_for("alice", "c", K.CREATE_TOPICS, 6) is None


@pytest.mark.slow
def test_a_kraft_broker_enforces_it_around_the_forward(tmp_path):
    from tests.cluster.test_kraft_data_plane import FAST
    # Kafka's default windows (11 x 1 s): 1 partition/s, a burst of 11
    q = KRaftControllerQuorum(str(tmp_path), n=1, brokers=1, overrides=FAST)
    try:
        q.start()
        with Admin({"bootstrap.servers": q.bootstrap}) as adm:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if adm.describe_cluster().brokers:
                        break
                except KafkaError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.2)
            ent = (("client-id", "mutator"),)
            assert adm.alter_client_quotas([(ent, {"controller_mutation_rate": 1})]) == {ent: None}
            while adm.describe_client_quotas() != {ent: {"controller_mutation_rate": 1.0}}:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        with Admin({"bootstrap.servers": q.bootstrap, "client.id": "mutator"}) as adm:
            # a topic the controller refuses (it exists) gives its partitions back
            pre = "k-" + uuid.uuid4().hex[:4] + "-"
            assert adm.create_topics([NewTopic(pre + "x", 1, 1)]) == {pre + "x": None}       # 10 left
            res = adm.create_topics([NewTopic(pre + "x", 8, 1)], raise_on_error=False)
            assert _code(res[pre + "x"]) == E.TOPIC_ALREADY_EXISTS                           # 10 again
            assert adm.create_topics([NewTopic(pre + "y", 10, 1)]) == {pre + "y": None}      # >= 0
            # not refused: the bucket is not negative (it would be -8 had the 8 not come back)
            assert adm.create_topics([NewTopic(pre + "z", 5, 1)]) == {pre + "z": None}       # ~ -5
            res = adm.create_topics([NewTopic(pre + "w", 1, 1)], raise_on_error=False)
            assert _code(res[pre + "w"]) == E.THROTTLING_QUOTA_EXCEEDED
        with Admin({"bootstrap.servers": q.bootstrap, "client.id": "mutator"}) as adm:   # (the other is muted)
            res = adm.delete_topics([pre + "y"], raise_on_error=False)
            assert _code(res[pre + "y"]) == E.THROTTLING_QUOTA_EXCEEDED
    finally:
        q.stop()

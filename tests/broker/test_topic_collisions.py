"""Topic names that collide with an existing one once '.' and '_' are treated alike: Metadata
auto-creation answers the creation's error for the topic (it used to close the connection
with a traceback), CreateTopics answers it before any other check, as Kafka's controller.
"""
from __future__ import annotations

import uuid

import pytest

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import create_topics as ct
from tests.broker.raw_client import advertised
from tests.broker.test_api_matrix import Env

E = ErrorCode
K = ApiKey

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def env(broker):
    e = Env(broker, advertised(broker.port))
    yield e
    e.close()


def test_metadata_auto_create_of_a_colliding_name_answers_invalid_topic(env):
    base = f"lv.coll.{uuid.uuid4().hex[:8]}"
    env.new_topic("unused")  # the connection is warm
    r = env.call(K.CREATE_TOPICS, env.top(K.CREATE_TOPICS), ct.CreateTopicsRequest(
        topics=[ct.CreatableTopic(name=base, num_partitions=1, replication_factor=1)], timeout_ms=10000))
    assert r.topics[0].error_code == E.NONE
    twin = base.replace(".", "_")
    (t,) = env.metadata([twin], allow_auto=True).topics
    assert (t.name, t.error_code, t.partitions) == (twin, E.INVALID_TOPIC_EXCEPTION, [])
    # the connection is still answered, and nothing was created
    (t,) = env.metadata([twin]).topics
    assert t.error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert env.topic_meta(base).error_code == E.NONE


def test_create_topics_of_a_colliding_name(env):
    """ReplicationControlManager.createTopics: the collision is checked with the name, before
    the partition count, configs or validate_only; an existing name is TOPIC_ALREADY_EXISTS."""
    base = f"lv_coll_{uuid.uuid4().hex[:8]}"
    v = env.top(K.CREATE_TOPICS)

    def create(name, partitions=1, validate_only=False):
        req = ct.CreateTopicsRequest(topics=[ct.CreatableTopic(name=name, num_partitions=partitions,
                                                               replication_factor=1)], timeout_ms=10000)
        req.validate_only = validate_only
        (t,) = env.call(K.CREATE_TOPICS, v, req).topics
        return t

    assert create(base).error_code == E.NONE
    twin = base.replace("_", ".")
    for kw in ({}, {"validate_only": True}, {"partitions": 0}):
        t = create(twin, **kw)
        assert t.error_code == E.INVALID_TOPIC_EXCEPTION, kw
        assert t.error_message == f"Topic '{twin}' collides with existing topic: {base}"
    assert create(base, partitions=0).error_code == E.TOPIC_ALREADY_EXISTS
    (t,) = env.metadata([twin]).topics
    assert t.error_code == E.UNKNOWN_TOPIC_OR_PARTITION

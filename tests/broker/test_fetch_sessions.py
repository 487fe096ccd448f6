"""KIP-227 fetch sessions keyed by topic id (Fetch v13+), over raw Fetch requests.

Kafka 3.9 (FetchSession.scala CachedPartition, KafkaApis.handleFetchRequest,
ReplicaManager.readFromLog): a session opened with topic ids keys its partitions by
(topic id, partition). A topic deleted and re-created under the same name is another
partition: the old id's cached partition answers INCONSISTENT_TOPIC_ID (its name is
now held by another id) or UNKNOWN_TOPIC_OR_PARTITION (the name is gone), and never
serves the new topic's records; forgetting it by its old id removes it.
"""
from __future__ import annotations

import time
import uuid

import pytest

from kbroker.protocol import ApiKey as K, ErrorCode as E
from kbroker.protocol.messages import create_topics as ct, delete_topics as dt
from tests.broker.test_api_matrix import EXPECTED, Env, decode_records, fetch_parts, fetch_request

V = EXPECTED[K.FETCH][1]  # 16: topic ids


@pytest.fixture
def env(broker):
    e = Env(broker, EXPECTED)
    yield e
    e.close()


def _values(pd) -> list[bytes]:
    return [r.value for r in decode_records(pd.records)]


def _delete(env: Env, name: str) -> None:
    r = env.call(K.DELETE_TOPICS, env.top(K.DELETE_TOPICS),
                 dt.DeleteTopicsRequest(topics=[dt.DeleteTopicState(name=name)], timeout_ms=10000))
    assert r.responses[0].error_code == E.NONE, r


def _recreate(env: Env, name: str, deadline_s: float = 30.0) -> uuid.UUID:
    """Create ``name`` again once its deletion has completed (bounded wait)."""
    deadline = time.monotonic() + deadline_s
    while True:
        r = env.call(K.CREATE_TOPICS, env.top(K.CREATE_TOPICS), ct.CreateTopicsRequest(
            topics=[ct.CreatableTopic(name=name, num_partitions=1, replication_factor=1)], timeout_ms=10000))
        err = r.topics[0].error_code
        if err == E.NONE:
            return env.topic_id(name)
        assert err == E.TOPIC_ALREADY_EXISTS and time.monotonic() < deadline, r
        time.sleep(0.05)


def test_recreated_topic_is_not_served_under_the_old_id(env):
    name, old_id = env.new_topic("recreate")
    env.produce(name, 0, [b"old-0", b"old-1"])

    def fetch(topics, **kw):
        r = env.call(K.FETCH, V, fetch_request(V, topics, **kw))
        assert r.error_code == E.NONE, r
        return r, fetch_parts(V, r, {})

    r, parts = fetch([(name, old_id, [(0, 0)])], session_id=0, epoch=0)
    sid = r.session_id
    assert sid != 0 and _values(parts[(old_id, 0)]) == [b"old-0", b"old-1"]
    r, parts = fetch([(name, old_id, [(0, 2)])], session_id=sid, epoch=1)
    assert parts == {}

    _delete(env, name)
    new_id = _recreate(env, name)
    assert new_id != old_id
    env.produce(name, 0, [b"new-0", b"new-1", b"new-2"])

    # the session's (old id, 0) is not the re-created topic: an error, no records
    r, parts = fetch([], session_id=sid, epoch=2)
    assert set(parts) == {(old_id, 0)}, parts
    p = parts[(old_id, 0)]
    assert (p.error_code, p.high_watermark, _values(p)) == (E.INCONSISTENT_TOPIC_ID, -1, []), p
    # still an error on the next incremental fetch (errors are always sent)
    r, parts = fetch([], session_id=sid, epoch=3)
    assert parts[(old_id, 0)].error_code == E.INCONSISTENT_TOPIC_ID

    # the client switches to the new id and forgets the old one
    r, parts = fetch([(name, new_id, [(0, 0)])], session_id=sid, epoch=4,
                     forgotten=[(name, old_id, [0])])
    assert set(parts) == {(new_id, 0)}, parts
    assert _values(parts[(new_id, 0)]) == [b"new-0", b"new-1", b"new-2"]
    r, parts = fetch([(name, new_id, [(0, 3)])], session_id=sid, epoch=5)
    assert parts == {}, parts

    # a full fetch naming the old id: the id is unknown
    r, parts = fetch([(name, old_id, [(0, 0)])])
    assert parts[(old_id, 0)].error_code == E.UNKNOWN_TOPIC_ID


def test_deleted_topic_in_a_session(env):
    name, tid = env.new_topic("gone")
    env.produce(name, 0, [b"x"])
    r = env.call(K.FETCH, V, fetch_request(V, [(name, tid, [(0, 1)])], session_id=0, epoch=0))
    sid = r.session_id
    assert sid != 0
    _delete(env, name)
    r = env.call(K.FETCH, V, fetch_request(V, [], session_id=sid, epoch=1))
    p = fetch_parts(V, r, {})[(tid, 0)]
    assert (r.error_code, p.error_code, _values(p)) == (E.NONE, E.UNKNOWN_TOPIC_OR_PARTITION, [])
    # forgetting the deleted topic by its id empties the session
    r = env.call(K.FETCH, V, fetch_request(V, [], session_id=sid, epoch=2, forgotten=[(name, tid, [0])]))
    assert (r.error_code, r.responses) == (E.NONE, [])


def test_session_does_not_switch_between_names_and_ids(env):
    """FetchManager.newContext: an incremental request of the other kind (v12 names vs v13+
    ids) is FETCH_SESSION_TOPIC_ID_ERROR."""
    name, tid = env.new_topic("switch")
    r = env.call(K.FETCH, 12, fetch_request(12, [(name, None, [(0, 0)])], session_id=0, epoch=0))
    assert r.error_code == E.NONE and r.session_id != 0
    r2 = env.call(K.FETCH, V, fetch_request(V, [], session_id=r.session_id, epoch=1))
    assert (r2.error_code, r2.responses) == (E.FETCH_SESSION_TOPIC_ID_ERROR, [])
    r = env.call(K.FETCH, V, fetch_request(V, [(name, tid, [(0, 0)])], session_id=0, epoch=0))
    assert r.error_code == E.NONE and r.session_id != 0
    r2 = env.call(K.FETCH, 12, fetch_request(12, [], session_id=r.session_id, epoch=1))
    assert (r2.error_code, r2.responses) == (E.FETCH_SESSION_TOPIC_ID_ERROR, [])

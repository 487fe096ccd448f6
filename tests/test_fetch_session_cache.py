"""FetchSessionCache eviction (Kafka's tryEvict, without its size rule): followers'
sessions are privileged; a full cache makes room for a consumer's new session only by
evicting another consumer's, for a follower's by evicting a consumer's first."""
from collections import OrderedDict

from kbroker.server.fetch_session import CachedPartition, FetchSessionCache


def _open(cache, follower: bool) -> int:
    ctx = cache.new_context(0, 0, OrderedDict({("t", 0): CachedPartition(0, 100, topic="t")}), [], follower)
    return ctx.session_id


def test_a_consumer_never_evicts_a_followers_session():
    cache = FetchSessionCache(max_entries=2)
    f1, f2 = _open(cache, True), _open(cache, True)
    assert f1 and f2
    assert _open(cache, False) == 0                    # full of followers: sessionless
    assert cache.count(privileged=True) == 2 and cache.count(privileged=False) == 0


def test_a_follower_evicts_a_consumers_session_first():
    cache = FetchSessionCache(max_entries=2)
    c1 = _open(cache, False)
    f1 = _open(cache, True)
    f2 = _open(cache, True)                             # evicts the consumer's, not the older follower's
    assert c1 not in cache._sessions and {f1, f2} == set(cache._sessions)
    f3 = _open(cache, True)                             # only followers left: the least recently used
    assert set(cache._sessions) == {f2, f3}
    c2 = _open(cache, False)
    assert c2 == 0


def test_stats_count_sessions_and_cached_partitions():
    cache = FetchSessionCache()
    _open(cache, True)
    _open(cache, False)
    assert cache.stats() == (2, 2)

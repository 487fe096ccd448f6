"""kbroker.quota: Kafka's windowed rate, quota resolution, throttle times, alter/describe rules."""
import pytest

from kbroker.protocol import ErrorCode as E
from kbroker.quota import entity as Q
from kbroker.quota.manager import ClientQuotaManager, QuotaManagers
from kbroker.quota.rate import SampledRate


def test_rate_is_measured_over_at_least_samples_minus_one_windows():
    r = SampledRate(samples=11, window_ms=1000)
    r.record(100, 0)
    assert r.window_size_ms(0) == 10_000          # 10 full windows assumed at the start
    assert r.measure(0) == pytest.approx(10.0)
    r.record(100, 5_500)
    # 5.5 s elapsed, counted as 5 full windows short of 10: 200 B over 10.5 s
    assert r.measure(5_500) == pytest.approx(200 / 10.5)
    # 20 s later every sample has expired: nothing recorded in the monitored window
    assert r.measure(30_000) == 0.0


def test_rate_rolls_over_samples_plus_one_slots():
    r = SampledRate(samples=2, window_ms=100)
    for t in range(0, 1000, 50):
        r.record(1, t)
    assert len(r._samples) == 3
    # kept: the windows from 700, 800 and 900; the one from 700 last saw an event at 750,
    # 249 ms ago (>= 2 windows): reset. 4 events since 800, 199 ms (>= 1 full window)
    assert r.measure(999) == pytest.approx(4 / 0.199)


def test_throttle_time_is_kafkas_formula():
    m = ClientQuotaManager("producer_byte_rate", samples=11, window_s=1, clock_ms=lambda: 0)
    m.update_quotas({(("client-id", "c"),): {"producer_byte_rate": 10.0}})
    assert m.record_and_get_throttle_ms("ANONYMOUS", "c", 50, now_ms=0) == 0   # 5 B/s
    # 250 B over the 10 s window: 25 B/s; X = (25 - 10) / 10 * 10 s
    assert m.record_and_get_throttle_ms("ANONYMOUS", "c", 200, now_ms=0) == 15_000
    assert m.record_and_get_throttle_ms("ANONYMOUS", "other", 10**6, now_ms=0) == 0   # no quota


def test_request_quota_throttle_is_capped_at_one_window():
    qm = QuotaManagers(samples=11, window_s=1, clock_ms=lambda: 0)
    qm.update_quotas({(("user", None),): {"request_percentage": 1.0}})
    assert qm.request.enabled and not qm.produce.enabled
    assert qm.request.record_and_get_throttle_ms("alice", "c", 500.0, now_ms=0) == 1000


def test_resolution_follows_kafkas_precedence_and_sensor_sharing():
    m = ClientQuotaManager("producer_byte_rate")
    quotas = {
        (("client-id", None),): {"producer_byte_rate": 1.0},
        (("client-id", "c1"),): {"producer_byte_rate": 2.0},
        (("user", None),): {"producer_byte_rate": 3.0},
        (("client-id", None), ("user", None)): {"producer_byte_rate": 4.0},
        (("client-id", "c1"), ("user", None)): {"producer_byte_rate": 5.0},
        (("user", "alice"),): {"producer_byte_rate": 6.0},
        (("client-id", None), ("user", "alice")): {"producer_byte_rate": 7.0},
        (("client-id", "c1"), ("user", "alice")): {"producer_byte_rate": 8.0},
    }
    m.update_quotas(quotas)
    assert m.quota("alice", "c1") == (("alice", "c1"), 8.0)
    assert m.quota("alice", "c2") == (("alice", "c2"), 7.0)
    assert m.quota("bob", "c1") == (("bob", "c1"), 5.0)
    assert m.quota("bob", "c2") == (("bob", "c2"), 4.0)
    del quotas[(("client-id", None), ("user", "alice"))]
    del quotas[(("client-id", "c1"), ("user", "alice"))]
    m.update_quotas(quotas)
    assert m.quota("alice", "c2") == (("alice", ""), 6.0)      # one sensor for all of alice's clients
    del quotas[(("client-id", None), ("user", None))]
    del quotas[(("client-id", "c1"), ("user", None))]
    m.update_quotas(quotas)
    assert m.quota("bob", "c2") == (("bob", ""), 3.0)
    del quotas[(("user", None),)]
    del quotas[(("user", "alice"),)]
    m.update_quotas(quotas)
    assert m.quota("bob", "c1") == (("", "c1"), 2.0)
    assert m.quota("bob", "c9") == (("", "c9"), 1.0)
    m.update_quotas({})
    assert m.quota("bob", "c9") is None and not m.enabled


@pytest.mark.parametrize("entity, ops, message", [
    ([], [("producer_byte_rate", 1.0, False)], "Invalid empty client quota entity"),
    ([("user", "a"), ("user", "b")], [], "duplicate entity entry user"),
    ([("group", "g")], [], "Unhandled client quota entity type: group"),
    ([("user", "")], [], "Empty user not supported"),
    ([("ip", "127.0.0.1"), ("user", "a")], [], "IP entity should"),
    ([("user", "a")], [("connection_creation_rate", 5.0, False)], "Invalid configuration key connection_creation_rate"),
    ([("ip", None)], [("producer_byte_rate", 5.0, False)], "Invalid configuration key producer_byte_rate"),
    ([("user", "a")], [("producer_byte_rate", 0.0, False)], "must be greater than 0"),
    ([("user", "a")], [("producer_byte_rate", 1.5, False)], "cannot be a fractional value"),
    ([("user", "a")], [("producer_byte_rate", 1.0, False), ("producer_byte_rate", 2.0, False)], "Duplicate quota key"),
])
def test_invalid_alterations_are_refused_with_kafkas_messages(entity, ops, message):
    results, changes = Q.plan_alterations({}, [(entity, ops)])
    assert changes == []
    assert results[0][1] == E.INVALID_REQUEST and message in results[0][2]


def test_alterations_apply_only_changes_and_removals_drop_empty_entities():
    cur = {(("user", "a"),): {"producer_byte_rate": 10.0}}
    results, changes = Q.plan_alterations(cur, [
        ([("user", "a")], [("producer_byte_rate", 10.0, False), ("request_percentage", 12.5, False)]),
        ([("client-id", None), ("user", None)], [("consumer_byte_rate", 7.0, False)]),
        ([("user", "a")], [])])                 # a duplicate entity
    assert [r[1] for r in results] == [E.NONE, E.NONE, E.INVALID_REQUEST]
    assert changes == [((("user", "a"),), "request_percentage", 12.5),
                       ((("client-id", None), ("user", None)), "consumer_byte_rate", 7.0)]
    new = Q.apply_changes(cur, changes)
    results, changes = Q.plan_alterations(new, [([("user", "a")], [("producer_byte_rate", 0, True),
                                                                   ("request_percentage", 0, True)])])
    assert Q.apply_changes(new, changes) == {(("client-id", None), ("user", None)): {"consumer_byte_rate": 7.0}}


def test_describe_filters_as_kafkas_image():
    quotas = {(("user", "a"),): {"producer_byte_rate": 1.0},
              (("client-id", "c"), ("user", "a")): {"producer_byte_rate": 2.0},
              (("user", None),): {"producer_byte_rate": 3.0},
              (("ip", "1.2.3.4"),): {"connection_creation_rate": 4.0}}
    keys = lambda comps, strict: sorted((k for k, _ in Q.describe(quotas, comps, strict)), key=repr)
    assert keys([("user", Q.MATCH_EXACT, "a")], True) == [(("user", "a"),)]
    assert keys([("user", Q.MATCH_EXACT, "a")], False) == [(("client-id", "c"), ("user", "a")), (("user", "a"),)]
    assert keys([("user", Q.MATCH_SPECIFIED, None), ("client-id", Q.MATCH_SPECIFIED, None)], True) == [
        (("client-id", "c"), ("user", "a"))]
    assert keys([("user", Q.MATCH_DEFAULT, None)], False) == [(("user", None),)]
    assert keys([("ip", Q.MATCH_SPECIFIED, None)], False) == [(("ip", "1.2.3.4"),)]
    assert len(keys([], False)) == 4
    for comps, code in ([("user", Q.MATCH_EXACT, None)], E.INVALID_REQUEST), \
                       ([("user", Q.MATCH_DEFAULT, "x")], E.INVALID_REQUEST), \
                       ([("user", 0, "a"), ("user", 1, None)], E.INVALID_REQUEST), \
                       ([("ip", 2, None), ("user", 2, None)], E.INVALID_REQUEST), \
                       ([("topic", 2, None)], E.UNSUPPORTED_VERSION):
        with pytest.raises(Q.QuotaError) as ei:
            Q.describe(quotas, comps, False)
        assert ei.value.code == code


def test_a_quota_change_keeps_the_recorded_rates():
    """Kafka updates the bound of a client's existing quota metric: altering any quota (here
    another client's, then this one's) neither resets a throttled client's rate nor its window."""
    m = ClientQuotaManager("producer_byte_rate", samples=11, window_s=1, clock_ms=lambda: 0)
    quotas = {(("client-id", "c"),): {"producer_byte_rate": 10.0}}
    m.update_quotas(quotas)
    assert m.record_and_get_throttle_ms("ANONYMOUS", "c", 250, now_ms=0) == 15_000
    m.update_quotas({**quotas, (("client-id", "other"),): {"producer_byte_rate": 1.0}})
    assert m.rate("ANONYMOUS", "c", now_ms=0) == pytest.approx(25.0)
    assert m.record_and_get_throttle_ms("ANONYMOUS", "c", 0, now_ms=0) == 15_000
    m.update_quotas({(("client-id", "c"),): {"producer_byte_rate": 5.0}})      # the new bound applies at once
    assert m.record_and_get_throttle_ms("ANONYMOUS", "c", 0, now_ms=0) == 40_000

"""GroupCoordinator state machine, offsets, replay and retention, with an injected
clock (no sleeping: timers run on ``advance_timers``) and an in-memory
``__consumer_offsets``; plus the wire handlers at every version."""
from __future__ import annotations

import struct
import threading
import types

import pytest

from kbroker.coordinator.group import storage
from kbroker.coordinator.group.classic_group import GroupState
from kbroker.coordinator.group.coordinator import GroupConfig, GroupCoordinator
from kbroker.coordinator.group.offsets import OffsetAndMetadata
from kbroker.coordinator.group.storage import InMemoryOffsetsLog
from kbroker.coordinator.records import GroupMetadataValue, OffsetCommitKey, OffsetCommitValue
from kbroker.protocol import ApiKey, ErrorCode as E
from kbroker.protocol.messages.consumer_protocol_subscription import ConsumerProtocolSubscription

T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


def sub(*topics, version=0) -> bytes:
    """A consumer-protocol subscription (int16 version prefix + struct)."""
    return struct.pack(">h", version) + ConsumerProtocolSubscription(topics=list(topics)).encode(version)


CFG = GroupConfig(offsets_topic_num_partitions=4, group_initial_rebalance_delay_ms=0,
                  group_min_session_timeout_ms=1000, group_max_session_timeout_ms=60000,
                  offsets_retention_ms=3_600_000, offsets_retention_check_interval_ms=600000)


class Env:
    def __init__(self, cfg=CFG, log=None, clock=None, start=True):
        self.clock = clock or Clock()
        self.log = log if log is not None else InMemoryOffsetsLog()
        self.c = GroupCoordinator(cfg, self.log, time_ms=self.clock, reaper_enabled=False)
        if start:
            self.c.startup(background=False, enable_retention=False)

    def tick(self, ms=0):
        self.clock.now += ms
        self.c.advance_timers()

    def join(self, group, member_id="", instance=None, protocols=None, session=10000, rebalance=30000,
             ptype="consumer", v=9, client_id="cli"):
        out = []
        self.c.join_group(group, member_id, instance, require_known_member_id=(v >= 4 and instance is None),
                          supports_skip_assignment=v >= 9, client_id=client_id, client_host="/127.0.0.1",
                          rebalance_timeout_ms=rebalance, session_timeout_ms=session, protocol_type=ptype,
                          protocols=protocols if protocols is not None else [("range", sub("t"))], callback=out.append)
        return out

    def join_new(self, group, **kw):
        """Full new-member join (MEMBER_ID_REQUIRED round trip); returns the pending result list."""
        first = self.join(group, **kw)
        if kw.get("instance") is None and kw.get("v", 9) >= 4:
            assert first and first[0].error == E.MEMBER_ID_REQUIRED
            return self.join(group, member_id=first[0].member_id, **kw)
        return first

    def sync(self, group, gen, member_id, assignments=None, instance=None, ptype=None, pname=None):
        out = []
        self.c.sync_group(group, gen, member_id, instance, ptype, pname, assignments or {}, out.append)
        return out

    def commit(self, group, offsets, member_id="", gen=-1, instance=None, api_version=9):
        out = []
        oms = {tp: OffsetAndMetadata(o, -1, "", self.clock.now) for tp, o in offsets.items()}
        self.c.commit_offsets(group, member_id, instance, gen, oms, out.append, api_version=api_version)
        return out

    def fetch(self, group, tps=None, require_stable=False):
        err, res = self.c.fetch_offsets(group, tps, require_stable)
        assert err == E.NONE
        return {tp: (r.committed_offset, r.error) for tp, r in res.items()}

    def stable_group(self, group, n=1, **kw):
        """n members joined and synced; returns [(member_id, result)] and the generation."""
        pend = [self.join_new(group, **kw) for _ in range(n)]
        self.tick()
        results = [p[0] for p in pend]
        assert all(r.error == E.NONE for r in results), results
        gen = results[0].generation_id
        leader = results[0].leader_id
        assignment = {r.member_id: b"A-" + r.member_id.encode() for r in results}
        syncs = []
        for r in results:
            syncs.append(self.sync(group, gen, r.member_id, assignment if r.member_id == leader else {}))
        for s, r in zip(syncs, results):
            assert s and s[0].error == E.NONE and s[0].assignment == b"A-" + r.member_id.encode()
        return [r.member_id for r in results], gen

    def state(self, group):
        g = self.c.group(group)
        return None if g is None else g.state


@pytest.fixture
def env():
    e = Env()
    yield e
    e.c.shutdown()


# -- partitioning -------------------------------------------------------------------------

def test_java_string_hashcode_and_partition():
    assert storage.java_string_hashcode("hello") == 99162322
    assert storage.java_string_hashcode("") == 0
    # Integer.MIN_VALUE: Utils.abs maps it to 0
    assert storage.java_string_hashcode("polygenelubricants") == -(2 ** 31)
    assert storage.partition_for("polygenelubricants", 50) == 0
    # a non-BMP character counts as two UTF-16 units (a surrogate pair)
    assert storage.java_string_hashcode("\U0001F600") == 0xD83D * 31 + 0xDE00
    assert storage.java_string_hashcode("console-consumer-1") == _java_hash_slow("console-consumer-1")
    assert storage.partition_for("my-group", 50) == abs(_java_hash_slow("my-group")) % 50


def _java_hash_slow(s):
    h = 0
    for ch in s.encode("utf-16-be"):
        pass
    units = [int.from_bytes(s.encode("utf-16-be")[i:i + 2], "big") for i in range(0, len(s.encode("utf-16-be")), 2)]
    for u in units:
        h = (h * 31 + u) % 2 ** 32
    return h - 2 ** 32 if h >= 2 ** 31 else h


# -- joining -------------------------------------------------------------------------------------

def test_member_id_required_round_trip_then_stable(env):
    first = env.join("g")
    assert len(first) == 1 and first[0].error == E.MEMBER_ID_REQUIRED
    mid = first[0].member_id
    assert mid.startswith("cli-")
    g = env.c.group("g")
    assert g.is_pending_member(mid) and g.size() == 0
    second = env.join("g", member_id=mid)
    assert second == []  # waits in the join phase (initial delay 0: the timer completes it)
    assert env.state("g") is GroupState.PREPARING_REBALANCE
    env.tick()
    r = second[0]
    assert r.error == E.NONE and r.generation_id == 1 and r.leader_id == mid and r.member_id == mid
    assert r.protocol_name == "range" and r.protocol_type == "consumer"
    assert [m[0] for m in r.members] == [mid]
    assert env.state("g") is GroupState.COMPLETING_REBALANCE
    s = env.sync("g", 1, mid, {mid: b"assign"})
    assert s[0].error == E.NONE and s[0].assignment == b"assign"
    assert env.state("g") is GroupState.STABLE
    assert env.c.heartbeat("g", mid, None, 1) == E.NONE
    err, summary = env.c.describe_group("g")
    assert err == E.NONE and summary.state == "Stable" and summary.protocol == "range"
    assert summary.members[0].assignment == b"assign" and summary.members[0].metadata == sub("t")


def test_old_clients_join_without_member_id_round_trip(env):
    r = env.join("g", v=3)
    env.tick()
    assert r[0].error == E.NONE and r[0].generation_id == 1


def test_unknown_member_on_unknown_group(env):
    assert env.join("nope", member_id="x-1")[0].error == E.UNKNOWN_MEMBER_ID
    assert env.sync("nope", 1, "x-1")[0].error == E.UNKNOWN_MEMBER_ID
    assert env.c.heartbeat("nope", "x-1", None, 1) == E.UNKNOWN_MEMBER_ID


def test_second_member_triggers_rebalance(env):
    (m1,), gen = env.stable_group("g")
    p2 = env.join_new("g")
    assert p2 == [] and env.state("g") is GroupState.PREPARING_REBALANCE
    assert env.c.heartbeat("g", m1, None, gen) == E.REBALANCE_IN_PROGRESS
    assert env.sync("g", gen, m1)[0].error == E.REBALANCE_IN_PROGRESS
    p1 = env.join("g", member_id=m1)
    # all members rejoined: the DelayedJoin completes at once
    assert p1 and p2
    r1, r2 = p1[0], p2[0]
    assert r1.generation_id == r2.generation_id == gen + 1
    assert r1.leader_id == m1 and len(r1.members) == 2 and r2.members == []
    # follower's SyncGroup waits for the leader's
    s2 = env.sync("g", gen + 1, r2.member_id)
    assert s2 == []
    s1 = env.sync("g", gen + 1, m1, {m1: b"a1", r2.member_id: b"a2"})
    assert s1[0].assignment == b"a1" and s2[0].assignment == b"a2"
    assert env.state("g") is GroupState.STABLE


def test_illegal_generation_and_unknown_member(env):
    (m1,), gen = env.stable_group("g")
    assert env.c.heartbeat("g", m1, None, gen + 5) == E.ILLEGAL_GENERATION
    assert env.sync("g", gen - 1, m1)[0].error == E.ILLEGAL_GENERATION
    assert env.c.heartbeat("g", "nobody", None, gen) == E.UNKNOWN_MEMBER_ID
    assert env.join("g", member_id="nobody")[0].error == E.UNKNOWN_MEMBER_ID
    assert env.commit("g", {("t", 0): 5}, member_id=m1, gen=gen + 1)[0][("t", 0)] == E.ILLEGAL_GENERATION
    assert env.commit("g", {("t", 0): 5}, member_id="nobody", gen=gen)[0][("t", 0)] == E.UNKNOWN_MEMBER_ID
    # a non-member commit (generation -1) to a non-empty group
    assert env.commit("g", {("t", 0): 5})[0][("t", 0)] == E.UNKNOWN_MEMBER_ID


def test_stable_follower_rejoin_gets_current_generation(env):
    (m1, m2), gen = env.stable_group("g", n=2)
    r = env.join("g", member_id=m2)
    assert r[0].error == E.NONE and r[0].generation_id == gen and r[0].members == []
    assert env.state("g") is GroupState.STABLE
    # the leader rejoining forces a rebalance
    assert env.join("g", member_id=m1) == []
    assert env.state("g") is GroupState.PREPARING_REBALANCE


def test_completing_rebalance_rejoin_same_metadata_returns_generation(env):
    p = env.join_new("g")
    env.tick()
    mid = p[0].member_id
    again = env.join("g", member_id=mid)
    assert again[0].generation_id == 1 and again[0].leader_id == mid and len(again[0].members) == 1
    # commit during CompletingRebalance
    assert env.commit("g", {("t", 0): 1}, member_id=mid, gen=1)[0][("t", 0)] == E.REBALANCE_IN_PROGRESS


def test_session_timeout_removes_member_and_rebalances(env):
    (m1, m2), gen = env.stable_group("g", n=2, session=5000)
    for _ in range(3):
        env.tick(3000)
        assert env.c.heartbeat("g", m1, None, gen) in (E.NONE, E.REBALANCE_IN_PROGRESS)
    # m2 never heartbeats: gone after 5 s; m1 learns of the rebalance
    assert not env.c.group("g").has(m2)
    assert env.c.heartbeat("g", m1, None, gen) == E.REBALANCE_IN_PROGRESS
    r = env.join("g", member_id=m1, session=5000)
    assert r[0].generation_id == gen + 1 and len(r[0].members) == 1


def test_last_member_session_timeout_empties_group(env):
    (m1,), gen = env.stable_group("g", session=2000)
    env.tick(1999)
    assert env.state("g") is GroupState.STABLE
    env.tick(2)  # no members left: the join phase completes at once, into Empty
    assert env.state("g") is GroupState.EMPTY
    assert env.c.group("g").generation_id == gen + 1


def test_rebalance_timeout_drops_members_that_do_not_rejoin(env):
    (m1, m2), gen = env.stable_group("g", n=2, rebalance=4000, session=30000)
    p1 = env.join("g", member_id=m1, rebalance=4000, session=30000)
    assert p1 == []
    env.tick(3999)
    assert p1 == []
    env.tick(2)
    assert p1[0].error == E.NONE and p1[0].generation_id == gen + 1 and len(p1[0].members) == 1
    assert not env.c.group("g").has(m2)


def test_pending_sync_expiry_removes_members(env):
    (m1, m2), gen = env.stable_group("g", n=2, rebalance=3000)
    p1 = env.join("g", member_id=m1, rebalance=3000)
    p2 = env.join("g", member_id=m2, rebalance=3000)
    assert p1 and p2
    leader = p1[0].leader_id
    follower = m2 if leader == m1 else m1
    s = env.sync("g", gen + 1, leader, {m1: b"x", m2: b"y"})
    assert s[0].error == E.NONE
    env.tick(3001)  # the follower never synced
    assert not env.c.group("g").has(follower)
    assert env.state("g") is GroupState.PREPARING_REBALANCE


def test_pending_member_expires(env):
    first = env.join("g", session=2000)
    mid = first[0].member_id
    env.tick(2001)
    assert not env.c.group("g").is_pending_member(mid)


def test_initial_rebalance_delay_waits_for_more_members():
    e = Env(GroupConfig(offsets_topic_num_partitions=4, group_initial_rebalance_delay_ms=3000,
                        group_min_session_timeout_ms=1000))
    try:
        p1 = e.join("g", v=3)
        e.tick(2000)
        p2 = e.join("g", v=3)
        e.tick(1001)  # first delay over, but a member arrived: delay again
        assert p1 == [] and p2 == []
        e.tick(3000)
        assert p1[0].generation_id == 1 and len(p1[0].members) == 2
    finally:
        e.c.shutdown()


def test_invalid_session_timeout_and_group_id(env):
    assert env.join("g", session=999)[0].error == E.INVALID_SESSION_TIMEOUT
    assert env.join("g", session=60001)[0].error == E.INVALID_SESSION_TIMEOUT
    assert env.join("")[0].error == E.INVALID_GROUP_ID
    assert env.c.heartbeat("", "m", None, 1) == E.INVALID_GROUP_ID


def test_inconsistent_group_protocol(env):
    env.stable_group("g")
    assert env.join("g", ptype="connect")[0].error == E.INCONSISTENT_GROUP_PROTOCOL
    assert env.join("g", protocols=[("roundrobin", sub("t"))])[0].error == E.INCONSISTENT_GROUP_PROTOCOL
    assert env.join("h", ptype="")[0].error == E.INCONSISTENT_GROUP_PROTOCOL
    assert env.join("h", protocols=[])[0].error == E.INCONSISTENT_GROUP_PROTOCOL
    (m1,), gen = env.stable_group("k")
    assert env.sync("k", gen, m1, pname="roundrobin")[0].error == E.INCONSISTENT_GROUP_PROTOCOL
    assert env.sync("k", gen, m1, ptype="connect")[0].error == E.INCONSISTENT_GROUP_PROTOCOL


def test_protocol_vote(env):
    a = env.join_new("g", protocols=[("range", b"1"), ("roundrobin", b"2"), ("sticky", b"3")])
    b = env.join_new("g", protocols=[("roundrobin", b"1"), ("range", b"2")])
    c = env.join_new("g", protocols=[("sticky", b"0"), ("roundrobin", b"1"), ("range", b"2")])
    env.tick()
    # candidates: range, roundrobin (sticky is not supported by b); votes: range 1, roundrobin 2
    assert a[0].protocol_name == b[0].protocol_name == c[0].protocol_name == "roundrobin"
    leader = [r for r in (a, b, c) if r[0].members][0]
    assert sorted(md for _, _, md in leader[0].members) == [b"1", b"1", b"2"]


def test_group_max_size():
    e = Env(GroupConfig(offsets_topic_num_partitions=4, group_initial_rebalance_delay_ms=0,
                        group_min_session_timeout_ms=1000, group_max_size=2))
    try:
        e.stable_group("g", n=2)
        r = e.join("g")
        assert r[0].error == E.GROUP_MAX_SIZE_REACHED
    finally:
        e.c.shutdown()


# -- static membership ---------------------------------------------------------------------------

def test_static_member_rejoins_without_rebalance(env):
    (m1, m2), gen = env.stable_group("g", n=2, instance=None)
    # a static group: two instances
    e = env
    pa = e.join("s", instance="ia")
    pb = e.join("s", instance="ib")
    e.tick()
    ra, rb = pa[0], pb[0]
    assert ra.member_id.startswith("ia-") and rb.member_id.startswith("ib-")
    leader = ra.leader_id
    e.sync("s", ra.generation_id, leader, {ra.member_id: b"A", rb.member_id: b"B"})
    other = rb.member_id if leader == ra.member_id else ra.member_id
    e.sync("s", ra.generation_id, other)
    gen = ra.generation_id
    assert e.state("s") is GroupState.STABLE
    # instance ib restarts: joins with no member id -> new id, same generation, no rebalance
    again = e.join("s", instance="ib", v=8)
    assert again[0].error == E.NONE and again[0].generation_id == gen
    new_id = again[0].member_id
    assert new_id != rb.member_id and e.state("s") is GroupState.STABLE
    assert again[0].leader_id == leader or rb.member_id != leader
    # the old incarnation is fenced
    assert e.c.heartbeat("s", rb.member_id, "ib", gen) == E.FENCED_INSTANCE_ID
    assert e.sync("s", gen, rb.member_id, instance="ib")[0].error == E.FENCED_INSTANCE_ID
    assert e.join("s", member_id=rb.member_id, instance="ib")[0].error == E.FENCED_INSTANCE_ID
    assert e.commit("s", {("t", 0): 1}, member_id=rb.member_id, gen=gen, instance="ib")[0][("t", 0)] == \
        E.FENCED_INSTANCE_ID
    # the new one keeps its assignment
    s = e.sync("s", gen, new_id, instance="ib")
    assert s[0].assignment == (b"B" if rb.member_id != leader else b"A")
    assert e.c.heartbeat("s", new_id, "ib", gen) == E.NONE
    # leave by instance id
    err, res = e.c.leave_group("s", [("", "ib"), ("", "nope")])
    assert err == E.NONE and [x[2] for x in res] == [E.NONE, E.UNKNOWN_MEMBER_ID]
    assert e.state("s") is GroupState.PREPARING_REBALANCE


def test_static_leader_skip_assignment_v9(env):
    p = env.join("s", instance="ia")
    env.tick()
    r = p[0]
    env.sync("s", r.generation_id, r.member_id, {r.member_id: b"A"})
    again = env.join("s", instance="ia", v=9)
    a = again[0]
    assert a.error == E.NONE and a.skip_assignment and a.leader_id == a.member_id and len(a.members) == 1
    # before v9: the old leader id is returned so the client does not assign
    again8 = env.join("s", instance="ia", v=8)
    b = again8[0]
    assert not b.skip_assignment and b.leader_id == a.member_id and b.member_id != a.member_id
    assert b.members == []


def test_static_member_not_removed_by_rebalance_timeout(env):
    pa = env.join("s", instance="ia", rebalance=2000)
    pb = env.join("s", instance="ib", rebalance=2000)
    env.tick()
    ra, rb = pa[0], pb[0]
    env.sync("s", ra.generation_id, ra.leader_id, {ra.member_id: b"A", rb.member_id: b"B"})
    # a dynamic member joins; ib does not rejoin within the rebalance timeout but stays (static)
    env.join_new("s")
    env.join("s", member_id=ra.member_id, instance="ia", rebalance=2000)
    env.tick(30001)
    g = env.c.group("s")
    # ib expired by its session timeout (10 s), not by the rebalance
    assert not g.has(rb.member_id)


# -- leave -----------------------------------------------------------------------------------------

def test_leave_group(env):
    (m1, m2), gen = env.stable_group("g", n=2)
    err, res = env.c.leave_group("g", [(m1, None), ("ghost", None)])
    assert err == E.NONE and [r[2] for r in res] == [E.NONE, E.UNKNOWN_MEMBER_ID]
    assert env.state("g") is GroupState.PREPARING_REBALANCE
    err, res = env.c.leave_group("unknown-group", [(m1, None)])
    assert err == E.NONE and res[0][2] == E.UNKNOWN_MEMBER_ID
    # a pending member id may leave too
    first = env.join("h")
    err, res = env.c.leave_group("h", [(first[0].member_id, None)])
    assert res[0][2] == E.NONE and not env.c.group("h").is_pending_member(first[0].member_id)


def test_leave_completes_pending_join(env):
    (m1, m2), gen = env.stable_group("g", n=2)
    p1 = env.join("g", member_id=m1)
    assert p1 == []
    env.c.leave_group("g", [(m2, None)])
    assert p1[0].error == E.NONE and p1[0].generation_id == gen + 1


# -- coordinator status ----------------------------------------------------------------------------

class BlockingLog(InMemoryOffsetsLog):
    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def read_batches(self, partition):
        assert self.gate.wait(10)
        return super().read_batches(partition)


def test_load_in_progress_not_coordinator_and_not_available():
    log = BlockingLog()
    e = Env(log=log, start=False)
    try:
        assert e.join("g")[0].error == E.COORDINATOR_NOT_AVAILABLE
        assert e.c.heartbeat("g", "m", None, 1) == E.COORDINATOR_NOT_AVAILABLE
        p = e.c.partition_for("g")
        e.c.startup([p], background=True, enable_retention=False)
        assert e.join("g")[0].error == E.COORDINATOR_LOAD_IN_PROGRESS
        assert e.c.heartbeat("g", "m", None, 1) == E.NONE  # answered blindly while loading
        assert e.sync("g", 1, "m")[0].error == E.REBALANCE_IN_PROGRESS
        assert e.c.fetch_offsets("g", [("t", 0)])[0] == E.COORDINATOR_LOAD_IN_PROGRESS
        assert e.c.list_groups()[0] == E.COORDINATOR_LOAD_IN_PROGRESS
        other = next(g for g in (f"x{i}" for i in range(100)) if e.c.partition_for(g) != p)
        assert e.join(other)[0].error == E.NOT_COORDINATOR
        assert e.commit(other, {("t", 0): 1})[0][("t", 0)] == E.NOT_COORDINATOR
        log.gate.set()
        assert e.c.wait_loaded(10)
        assert e.join("g")[0].error == E.MEMBER_ID_REQUIRED
        e.c.unload_partition(p)
        assert e.join("g")[0].error == E.NOT_COORDINATOR
    finally:
        log.gate.set()
        e.c.shutdown()


def test_unload_answers_waiting_members(env):
    (m1, m2), gen = env.stable_group("g", n=2)
    p1 = env.join("g", member_id=m1)
    env.c.unload_partition(env.c.partition_for("g"))
    assert p1[0].error == E.NOT_COORDINATOR


# -- offsets -------------------------------------------------------------------------------------------

def test_simple_group_commit_and_fetch(env):
    res = env.commit("simple", {("t", 0): 10, ("t", 1): 20})
    assert res == [{("t", 0): E.NONE, ("t", 1): E.NONE}]
    assert env.fetch("simple", [("t", 0), ("t", 1), ("t", 2)]) == {
        ("t", 0): (10, E.NONE), ("t", 1): (20, E.NONE), ("t", 2): (-1, E.NONE)}
    assert env.fetch("simple") == {("t", 0): (10, E.NONE), ("t", 1): (20, E.NONE)}
    assert env.fetch("never", [("t", 0)]) == {("t", 0): (-1, E.NONE)}
    err, listed = env.c.list_groups()
    assert [g.group_id for g in listed] == ["simple"] and listed[0].state == "Empty"


def test_commit_to_missing_group_with_generation(env):
    assert env.commit("ghost", {("t", 0): 1}, member_id="m", gen=3)[0][("t", 0)] == E.GROUP_ID_NOT_FOUND
    assert env.commit("ghost", {("t", 0): 1}, member_id="m", gen=3, api_version=8)[0][("t", 0)] == \
        E.ILLEGAL_GENERATION


def test_member_commit_and_metadata_too_large(env):
    (m1,), gen = env.stable_group("g")
    out = []
    oms = {("t", 0): OffsetAndMetadata(5, 3, "meta", T0), ("t", 1): OffsetAndMetadata(6, -1, "x" * 4097, T0)}
    env.c.commit_offsets("g", m1, None, gen, oms, out.append)
    assert out[0] == {("t", 0): E.NONE, ("t", 1): E.OFFSET_METADATA_TOO_LARGE}
    err, res = env.c.fetch_offsets("g", [("t", 0)])
    assert res[("t", 0)].committed_offset == 5 and res[("t", 0)].leader_epoch == 3 and res[("t", 0)].metadata == "meta"


def test_commit_append_failure_maps_errors(env):
    env.log.fail_appends(E.NOT_LEADER_OR_FOLLOWER)
    assert env.commit("s", {("t", 0): 1})[0][("t", 0)] == E.NOT_COORDINATOR
    env.log.fail_appends(E.RECORD_LIST_TOO_LARGE)
    assert env.commit("s", {("t", 0): 1})[0][("t", 0)] == E.INVALID_COMMIT_OFFSET_SIZE
    env.log.fail_appends(E.NOT_ENOUGH_REPLICAS)
    assert env.commit("s", {("t", 0): 1})[0][("t", 0)] == E.COORDINATOR_NOT_AVAILABLE
    assert env.fetch("s", [("t", 0)]) == {("t", 0): (-1, E.NONE)}


def test_require_stable_sees_pending_commit(env):
    env.commit("s", {("t", 0): 1})
    env.log.hold_callbacks(True)
    out = env.commit("s", {("t", 0): 2})
    assert out == []
    assert env.fetch("s", [("t", 0)], require_stable=True) == {("t", 0): (-1, E.UNSTABLE_OFFSET_COMMIT)}
    assert env.fetch("s", [("t", 0)]) == {("t", 0): (1, E.NONE)}
    env.log.hold_callbacks(False)
    env.log.release_callbacks()
    assert out[0][("t", 0)] == E.NONE
    assert env.fetch("s", [("t", 0)], require_stable=True) == {("t", 0): (2, E.NONE)}


def test_sync_store_failure_propagates_and_rebalances(env):
    p = env.join_new("g")
    env.tick()
    mid = p[0].member_id
    env.log.fail_appends(E.KAFKA_STORAGE_ERROR)
    s = env.sync("g", 1, mid, {mid: b"a"})
    assert s[0].error == E.NOT_COORDINATOR
    assert env.state("g") is GroupState.PREPARING_REBALANCE


# -- delete ----------------------------------------------------------------------------------------------

def test_delete_groups(env):
    env.stable_group("busy")
    env.commit("idle", {("t", 0): 7})
    out = []
    env.c.delete_groups(["busy", "idle", "missing"], out.append)
    assert out[0] == {"busy": E.NON_EMPTY_GROUP, "idle": E.NONE, "missing": E.GROUP_ID_NOT_FOUND}
    assert env.c.group("idle") is None
    assert env.fetch("idle", [("t", 0)]) == {("t", 0): (-1, E.NONE)}
    # the tombstones survive a reload
    e2 = Env(log=env.log, clock=env.clock)
    try:
        assert e2.c.group("idle") is None and e2.c.group("busy") is not None
    finally:
        e2.c.shutdown()


def test_offset_delete(env):
    out = []
    env.c.delete_offsets("missing", [("t", 0)], lambda err, res: out.append((err, res)))
    assert out[-1] == (E.GROUP_ID_NOT_FOUND, {})
    env.commit("simple", {("t", 0): 1, ("u", 0): 2})
    env.c.delete_offsets("simple", [("t", 0)], lambda err, res: out.append((err, res)))
    assert out[-1] == (E.NONE, {("t", 0): E.NONE})
    assert env.fetch("simple") == {("u", 0): (2, E.NONE)}
    # a consumer group subscribed to t: t is protected, u is not
    (m1,), gen = env.stable_group("cg", protocols=[("range", sub("t"))])
    env.commit("cg", {("t", 0): 1, ("u", 0): 1}, member_id=m1, gen=gen)
    env.c.delete_offsets("cg", [("t", 0), ("u", 0)], lambda err, res: out.append((err, res)))
    assert out[-1] == (E.NONE, {("t", 0): E.GROUP_SUBSCRIBED_TO_TOPIC, ("u", 0): E.NONE})
    # a non-consumer protocol group that is not empty
    env.stable_group("conn", ptype="connect", protocols=[("default", b"x")])
    env.c.delete_offsets("conn", [("t", 0)], lambda err, res: out.append((err, res)))
    assert out[-1] == (E.NON_EMPTY_GROUP, {})


# -- replay -----------------------------------------------------------------------------------------------

def snapshot(c: GroupCoordinator):
    out = {}
    for gid in sorted(c.group_ids()):
        g = c.group(gid)
        with g.lock:
            out[gid] = (
                g.state, g.generation_id, g.protocol_type, g.protocol_name, g.leader_id,
                sorted((m.member_id, m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
                        m.rebalance_timeout_ms, m.assignment, m.metadata(g.protocol_name) if g.protocol_name else b"")
                       for m in g.members.values()),
                dict(g.static_members),
                {tp: (c_.offset, c_.record_offset) for tp, c_ in g.offsets.committed.items()},
            )
    return out


def test_replay_rebuilds_identical_state(env):
    (m1, m2), gen = env.stable_group("g", n=2)
    env.commit("g", {("t", 0): 11, ("t", 1): 12}, member_id=m1, gen=gen)
    env.commit("g", {("t", 0): 13}, member_id=m2, gen=gen)
    pa = env.join("s", instance="ia")
    env.tick()
    env.sync("s", pa[0].generation_id, pa[0].member_id, {pa[0].member_id: b"A"})
    env.commit("simple", {("u", 3): 99})
    env.commit("gone", {("u", 0): 1})
    env.c.delete_groups(["gone"], lambda r: None)
    env.c.delete_offsets("simple", [("x", 0)], lambda *a: None)
    env.commit("emptied", {("t", 0): 5})
    before = snapshot(env.c)
    e2 = Env(log=env.log, clock=env.clock)
    try:
        assert snapshot(e2.c) == before
        # the members come back and keep heartbeating the same generation
        assert e2.c.heartbeat("g", m1, None, gen) == E.NONE
        assert e2.c.heartbeat("s", pa[0].member_id, "ia", pa[0].generation_id) == E.NONE
        # ... and expire if they do not
        e2.tick(10001)
        assert e2.c.group("g").size() == 0 and e2.state("g") is GroupState.EMPTY
    finally:
        e2.c.shutdown()


def test_records_decode_with_generated_schemas(env):
    (m1,), gen = env.stable_group("g")
    env.commit("g", {("t", 0): 42}, member_id=m1, gen=gen)
    p = env.c.partition_for("g")
    recs = [r for b in env.log.read_batches(p) for r in b]
    kinds = []
    for r in recs:
        kv = struct.unpack_from(">h", r.key)[0]
        vv = struct.unpack_from(">h", r.value)[0]
        kinds.append((kv, vv))
        if kv == 1:
            k = OffsetCommitKey.decode(r.key[2:], 1)
            v = OffsetCommitValue.decode(r.value[2:], vv)
            assert (k.group, k.topic, k.partition, v.offset, v.commit_timestamp) == ("g", "t", 0, 42, T0)
        elif kv == 2:
            v = GroupMetadataValue.decode(r.value[2:], vv)
            assert v.protocol_type == "consumer" and v.generation == gen and v.members[0].member_id == m1
    assert kinds == [(2, 3), (1, 3)]


def test_expire_timestamp_uses_value_version_1(env):
    out = []
    env.c.commit_offsets("s", "", None, -1, {("t", 0): OffsetAndMetadata(1, -1, "", T0, T0 + 1000)}, out.append)
    p = env.c.partition_for("s")
    r = [r for b in env.log.read_batches(p) for r in b][-1]
    assert struct.unpack_from(">h", r.value)[0] == 1
    env.tick(1000)
    assert env.c.cleanup_group_metadata() == 1
    assert env.c.group("s") is None


# -- retention -----------------------------------------------------------------------------------------------

def test_retention_expires_simple_group(env):
    env.commit("s", {("t", 0): 1})
    env.clock.now += 3_599_999
    assert env.c.cleanup_group_metadata() == 0
    env.commit("s", {("t", 1): 1})
    env.clock.now += 1
    assert env.c.cleanup_group_metadata() == 1
    assert env.fetch("s") == {("t", 1): (1, E.NONE)}
    env.clock.now += 3_600_000
    assert env.c.cleanup_group_metadata() == 1
    assert env.c.group("s") is None
    e2 = Env(log=env.log, clock=env.clock)
    try:
        assert e2.c.group("s") is None
    finally:
        e2.c.shutdown()


def test_retention_counts_from_when_group_became_empty(env):
    (m1,), gen = env.stable_group("g", session=2000)
    env.commit("g", {("t", 0): 1}, member_id=m1, gen=gen)
    # the group stays Stable and subscribed to t for a long time: nothing expires
    for _ in range(3):
        env.tick(1500)
        env.c.heartbeat("g", m1, None, gen)
    env.clock.now += 3_600_000
    env.c.heartbeat("g", m1, None, gen)
    assert env.c.cleanup_group_metadata() == 0
    env.c.leave_group("g", [(m1, None)])
    env.tick()
    assert env.state("g") is GroupState.EMPTY
    env.clock.now += 3_599_000
    assert env.c.cleanup_group_metadata() == 0
    env.clock.now += 1000
    assert env.c.cleanup_group_metadata() == 1
    assert env.c.group("g") is None


def test_retention_task_runs_on_timer():
    e = Env(start=False)
    try:
        e.c.startup(background=False, enable_retention=True)
        e.commit("s", {("t", 0): 1})
        e.tick(3_600_000)  # interval 600 s: the task has run (and re-armed) several times
        assert e.c.group("s") is None
    finally:
        e.c.shutdown()


# -- LogOffsetsLog over a real log --------------------------------------------------------------------------

def test_log_offsets_log_round_trip(tmp_path):
    from kbroker.log import Log

    logs = {}

    def log_for(p):
        if p not in logs:
            logs[p] = Log.open(str(tmp_path / f"__consumer_offsets-{p}"))
        return logs[p]

    e = Env(log=storage.LogOffsetsLog(log_for))
    try:
        (m1,), gen = e.stable_group("g")
        e.commit("g", {("t", 0): 5}, member_id=m1, gen=gen)
        e.commit("g", {("t", 0): 6}, member_id=m1, gen=gen)
        before = snapshot(e.c)
    finally:
        e.c.shutdown()
    for lg in logs.values():
        lg.close()
    logs.clear()
    e2 = Env(log=storage.LogOffsetsLog(log_for))
    try:
        assert snapshot(e2.c) == before
        assert e2.fetch("g", [("t", 0)]) == {("t", 0): (6, E.NONE)}
    finally:
        e2.c.shutdown()
        for lg in logs.values():
            lg.close()


# -- wire handlers at every version ------------------------------------------------------------------------------

class FakeCtx:
    def __init__(self, api_key, version):
        self.api_key = api_key
        self.api_version = version
        self.client_id = "client"
        self.client_host = "127.0.0.1"
        self.request = types.SimpleNamespace(listener_name="PLAINTEXT")
        self.responses = []

    def respond(self, body, version=None):
        body.encode(self.api_version)  # must be encodable at the request's version
        self.responses.append(body)


def _broker(env):
    topics = {"t": types.SimpleNamespace(num_partitions=2)}
    return types.SimpleNamespace(group_coordinator=env.c, node=(1, "127.0.0.1", 9092), node_id=1,
                                 endpoint=lambda listener_name=None: ("127.0.0.1", 9092),
                                 metadata=types.SimpleNamespace(image=types.SimpleNamespace(topics=topics)))


def call(broker, api_key, version, req):
    from kbroker.protocol.api_keys import API_INFO
    from kbroker.server.apis.group import HANDLERS
    import importlib

    info = API_INFO[api_key]
    mod = importlib.import_module("kbroker.protocol.messages." + info.module)
    req_cls = getattr(mod, info.request_name)
    decoded = req_cls.decode(req.encode(version), version)
    ctx = FakeCtx(api_key, version)
    HANDLERS[api_key].handle(broker, ctx, decoded)
    return ctx


def test_handlers_versions_cover_specs():
    from kbroker.protocol.api_keys import API_INFO
    from kbroker.server.apis.group import HANDLERS

    for key, h in HANDLERS.items():
        assert (h.min_version, h.max_version) == (API_INFO[key].min_version, API_INFO[key].max_version), key


@pytest.mark.parametrize("version", range(0, 7))
def test_find_coordinator_versions(env, version):
    from kbroker.protocol.messages.find_coordinator import FindCoordinatorRequest

    b = _broker(env)
    if version < 4:
        ctx = call(b, ApiKey.FIND_COORDINATOR, version, FindCoordinatorRequest(key="g"))
        r = ctx.responses[0]
        assert (r.error_code, r.node_id, r.host, r.port) == (E.NONE, 1, "127.0.0.1", 9092)
        if version >= 1:
            # no transaction coordinator yet: a fatal answer, so transactional clients fail at once
            ctx = call(b, ApiKey.FIND_COORDINATOR, version, FindCoordinatorRequest(key="tx", key_type=1))
            assert ctx.responses[0].error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    else:
        ctx = call(b, ApiKey.FIND_COORDINATOR, version, FindCoordinatorRequest(coordinator_keys=["a", "b"]))
        cs = ctx.responses[0].coordinators
        assert [(c.key, c.error_code, c.node_id) for c in cs] == [("a", E.NONE, 1), ("b", E.NONE, 1)]
        ctx = call(b, ApiKey.FIND_COORDINATOR, version,
                   FindCoordinatorRequest(coordinator_keys=["x"], key_type=1))
        assert ctx.responses[0].coordinators[0].error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@pytest.mark.parametrize("version", range(0, 10))
def test_join_sync_heartbeat_leave_commit_fetch_versions(env, version):
    from kbroker.protocol.messages.heartbeat import HeartbeatRequest
    from kbroker.protocol.messages.join_group import JoinGroupRequest, JoinGroupRequestProtocol
    from kbroker.protocol.messages.leave_group import LeaveGroupRequest, MemberIdentity
    from kbroker.protocol.messages.offset_commit import (
        OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    )
    from kbroker.protocol.messages.offset_fetch import (
        OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    )
    from kbroker.protocol.messages.sync_group import SyncGroupRequest, SyncGroupRequestAssignment

    b = _broker(env)
    jv = min(version, 9)
    join = JoinGroupRequest(group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=10000 if jv >= 1 else -1,
                            member_id="", protocol_type="consumer",
                            protocols=[JoinGroupRequestProtocol(name="range", metadata=sub("t"))])
    ctx = call(b, ApiKey.JOIN_GROUP, jv, join)
    if jv >= 4:
        r = ctx.responses[0]
        assert r.error_code == E.MEMBER_ID_REQUIRED
        join.member_id = r.member_id
        ctx = call(b, ApiKey.JOIN_GROUP, jv, join)
    assert ctx.responses == []
    env.tick()
    r = ctx.responses[0]
    assert r.error_code == E.NONE and r.generation_id == 1 and r.leader == r.member_id
    assert r.protocol_name == "range" and len(r.members) == 1
    mid, gen = r.member_id, r.generation_id
    sv = min(version, 5)
    sync = SyncGroupRequest(group_id="g", generation_id=gen, member_id=mid,
                            assignments=[SyncGroupRequestAssignment(member_id=mid, assignment=b"xyz")])
    if sv >= 5:
        sync.protocol_type, sync.protocol_name = "consumer", "range"
    ctx = call(b, ApiKey.SYNC_GROUP, sv, sync)
    s = ctx.responses[0]
    assert s.error_code == E.NONE and bytes(s.assignment) == b"xyz"
    if sv >= 5:
        assert (s.protocol_type, s.protocol_name) == ("consumer", "range")
    hv = min(version, 4)
    ctx = call(b, ApiKey.HEARTBEAT, hv, HeartbeatRequest(group_id="g", generation_id=gen, member_id=mid))
    assert ctx.responses[0].error_code == E.NONE
    ctx = call(b, ApiKey.HEARTBEAT, hv, HeartbeatRequest(group_id="g", generation_id=gen + 1, member_id=mid))
    assert ctx.responses[0].error_code == E.ILLEGAL_GENERATION

    # OffsetCommit (v0/v1 carry no generation for v0) and an unknown topic
    parts = [OffsetCommitRequestPartition(partition_index=0, committed_offset=100 + version,
                                          committed_metadata="m"),
             OffsetCommitRequestPartition(partition_index=5, committed_offset=1)]
    commit = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=gen, member_id=mid,
                                 topics=[OffsetCommitRequestTopic(name="t", partitions=parts),
                                         OffsetCommitRequestTopic(name="nope", partitions=[
                                             OffsetCommitRequestPartition(partition_index=0, committed_offset=1)])])
    ctx = call(b, ApiKey.OFFSET_COMMIT, version, commit)
    errs = [(t.name, p.partition_index, p.error_code) for t in ctx.responses[0].topics for p in t.partitions]
    want0 = E.UNKNOWN_MEMBER_ID if version == 0 else E.NONE  # v0: no member id, group not empty
    assert errs == [("t", 0, want0), ("t", 5, E.UNKNOWN_TOPIC_OR_PARTITION), ("nope", 0, E.UNKNOWN_TOPIC_OR_PARTITION)]

    # OffsetFetch
    if version >= 8:
        req = OffsetFetchRequest(groups=[
            OffsetFetchRequestGroup(group_id="g", topics=[OffsetFetchRequestTopics(name="t", partition_indexes=[0, 1])]),
            OffsetFetchRequestGroup(group_id="g", topics=None)])
        ctx = call(b, ApiKey.OFFSET_FETCH, version, req)
        gs = ctx.responses[0].groups
        assert [(p.partition_index, p.committed_offset) for p in gs[0].topics[0].partitions] == \
            [(0, 100 + version), (1, -1)]
        assert [(t.name, [p.committed_offset for p in t.partitions]) for t in gs[1].topics] == [("t", [100 + version])]
    else:
        req = OffsetFetchRequest(group_id="g", topics=[OffsetFetchRequestTopic(name="t", partition_indexes=[0, 1])])
        ctx = call(b, ApiKey.OFFSET_FETCH, version, req)
        ps = ctx.responses[0].topics[0].partitions
        want = -1 if version == 0 else 100 + version
        assert [(p.partition_index, p.committed_offset, p.error_code) for p in ps] == [(0, want, 0), (1, -1, 0)]
        if want != -1:
            assert ps[0].metadata == "m"

    # LeaveGroup
    lv = min(version, 5)
    if lv < 3:
        ctx = call(b, ApiKey.LEAVE_GROUP, lv, LeaveGroupRequest(group_id="g", member_id=mid))
        assert ctx.responses[0].error_code == E.NONE
        ctx = call(b, ApiKey.LEAVE_GROUP, lv, LeaveGroupRequest(group_id="g", member_id=mid))
        assert ctx.responses[0].error_code == E.UNKNOWN_MEMBER_ID
    else:
        ctx = call(b, ApiKey.LEAVE_GROUP, lv, LeaveGroupRequest(
            group_id="g", members=[MemberIdentity(member_id=mid), MemberIdentity(member_id="zz")]))
        assert [m.error_code for m in ctx.responses[0].members] == [E.NONE, E.UNKNOWN_MEMBER_ID]


@pytest.mark.parametrize("version", range(0, 6))
def test_describe_and_list_groups_versions(env, version):
    from kbroker.protocol.messages.describe_groups import DescribeGroupsRequest
    from kbroker.protocol.messages.list_groups import ListGroupsRequest

    b = _broker(env)
    (m1,), gen = env.stable_group("g")
    env.commit("simple", {("t", 0): 1})
    req = DescribeGroupsRequest(groups=["g", "missing"], include_authorized_operations=version >= 3)
    ctx = call(b, ApiKey.DESCRIBE_GROUPS, version, req)
    g, missing = ctx.responses[0].groups
    assert (g.group_state, g.protocol_type, g.protocol_data) == ("Stable", "consumer", "range")
    assert g.members[0].member_id == m1 and bytes(g.members[0].member_assignment) == b"A-" + m1.encode()
    assert (missing.error_code, missing.group_state) == (E.NONE, "Dead")
    ctx = call(b, ApiKey.LIST_GROUPS, version, ListGroupsRequest())
    listed = sorted((x.group_id, x.protocol_type) for x in ctx.responses[0].groups)
    assert listed == [("g", "consumer"), ("simple", "")]
    if version >= 4:
        ctx = call(b, ApiKey.LIST_GROUPS, version, ListGroupsRequest(states_filter=["stable"]))
        assert [(x.group_id, x.group_state) for x in ctx.responses[0].groups] == [("g", "Stable")]
    if version >= 5:
        ctx = call(b, ApiKey.LIST_GROUPS, version, ListGroupsRequest(types_filter=["consumer"]))
        assert ctx.responses[0].groups == []
        ctx = call(b, ApiKey.LIST_GROUPS, version, ListGroupsRequest(types_filter=["Classic"]))
        assert {x.group_type for x in ctx.responses[0].groups} == {"classic"}


@pytest.mark.parametrize("version", range(0, 3))
def test_delete_groups_and_offset_delete_handlers(env, version):
    from kbroker.protocol.messages.delete_groups import DeleteGroupsRequest
    from kbroker.protocol.messages.offset_delete import (
        OffsetDeleteRequest, OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
    )

    b = _broker(env)
    env.commit("simple", {("t", 0): 1, ("t", 1): 1})
    req = OffsetDeleteRequest(group_id="simple", topics=[
        OffsetDeleteRequestTopic(name="t", partitions=[OffsetDeleteRequestPartition(partition_index=0),
                                                       OffsetDeleteRequestPartition(partition_index=9)]),
        OffsetDeleteRequestTopic(name="nope", partitions=[OffsetDeleteRequestPartition(partition_index=0)])])
    ctx = call(b, ApiKey.OFFSET_DELETE, 0, req)
    r = ctx.responses[0]
    assert r.error_code == E.NONE
    assert [(t.name, p.partition_index, p.error_code) for t in r.topics for p in t.partitions] == [
        ("t", 0, E.NONE), ("t", 9, E.UNKNOWN_TOPIC_OR_PARTITION), ("nope", 0, E.UNKNOWN_TOPIC_OR_PARTITION)]
    req.group_id = "missing"
    assert call(b, ApiKey.OFFSET_DELETE, 0, req).responses[0].error_code == E.GROUP_ID_NOT_FOUND
    env.stable_group("busy")
    ctx = call(b, ApiKey.DELETE_GROUPS, version, DeleteGroupsRequest(groups_names=["simple", "busy", "missing"]))
    assert [(x.group_id, x.error_code) for x in ctx.responses[0].results] == [
        ("simple", E.NONE), ("busy", E.NON_EMPTY_GROUP), ("missing", E.GROUP_ID_NOT_FOUND)]

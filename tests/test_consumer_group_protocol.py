"""KIP-848 consumer groups in the GroupCoordinator, with an injected clock (timers run
only on ``advance_timers``), an in-memory ``__consumer_offsets`` and a fake metadata
image: member epochs, reconciliation (revoke before assign), the uniform and range
assignors, session and rebalance timeouts, fencing and static membership, replay,
and how consumer groups meet the classic APIs."""
from __future__ import annotations

import random
import types
import uuid


from kbroker.coordinator.group import storage
from kbroker.coordinator.group.consumer_group import (
    ConsumerGroup, HeartbeatRequest, MemberSpec, MemberState, range_assign, uniform_assign,
)
from kbroker.coordinator.group.coordinator import GroupConfig, GroupCoordinator
from kbroker.coordinator.group.offsets import OffsetAndMetadata
from kbroker.coordinator.group.storage import InMemoryOffsetsLog
from kbroker.protocol import ErrorCode as E

T0 = 1_700_000_000_000
SESSION_MS = 45000
REBALANCE_MS = 30000
CFG = GroupConfig(offsets_topic_num_partitions=4, group_initial_rebalance_delay_ms=0,
                  group_min_session_timeout_ms=1000, group_max_session_timeout_ms=60000,
                  consumer_group_session_timeout_ms=SESSION_MS, consumer_group_heartbeat_interval_ms=5000)


class Clock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


class Image:
    """A metadata image: ``topics`` name → (topic_id, num_partitions); ``epoch`` moves on change."""

    def __init__(self):
        self.topics = {}
        self.epoch = 0

    def add(self, name, partitions):
        self.topics[name] = types.SimpleNamespace(name=name, topic_id=uuid.uuid4(), num_partitions=partitions)
        self.epoch += 1
        return self.topics[name].topic_id


class Env:
    def __init__(self, cfg=CFG, log=None, image=None):
        self.clock = Clock()
        self.log = log if log is not None else InMemoryOffsetsLog()
        self.image = image or Image()
        self.c = GroupCoordinator(cfg, self.log, time_ms=self.clock, reaper_enabled=False,
                                  metadata_image=lambda: self.image)
        self.c.startup(background=False, enable_retention=False)

    def tick(self, ms=0):
        self.clock.now += ms
        self.c.advance_timers()

    def hb(self, group, member_id, epoch, topics=None, owned=None, instance=None, assignor=None,
           rebalance_ms=-1, version=1):
        out = []
        self.c.consumer_group_heartbeat(HeartbeatRequest(
            group, member_id, epoch, instance, None, rebalance_ms, topics, assignor, owned, "cli", "/127.0.0.1",
            api_version=version), lambda err, msg, outcome: out.append((err, msg, outcome)))
        assert len(out) == 1
        return out[0]


class Client:
    """A consumer speaking the KIP-848 protocol; it revokes and takes partitions at once."""

    def __init__(self, env, group, topics, instance=None, assignor=None, member_id=None):
        self.env, self.group, self.topics = env, group, list(topics)
        self.instance, self.assignor = instance, assignor
        self.member_id = member_id or str(uuid.uuid4())
        self.epoch = 0
        self.owned: dict = {}

    def owned_list(self):
        return [(tid, sorted(ps)) for tid, ps in self.owned.items()]

    def heartbeat(self, full=False):
        joining = self.epoch == 0
        err, msg, out = self.env.hb(
            self.group, self.member_id, self.epoch,
            topics=self.topics if (joining or full) else None,
            owned=[] if joining else self.owned_list(), instance=self.instance, assignor=self.assignor,
            rebalance_ms=REBALANCE_MS if (joining or full) else -1)
        if err != E.NONE:
            return err
        self.epoch = out.member_epoch
        if out.assignment is not None:
            self.owned = {tid: set(ps) for tid, ps in out.assignment.items()}
        return E.NONE

    def leave(self, epoch=-1):
        err, _, out = self.env.hb(self.group, self.member_id, epoch, instance=self.instance)
        return err

    def parts(self, tid=None):
        return sorted((t, p) for t, ps in self.owned.items() for p in ps if tid is None or t == tid)


def converge(clients, rounds=20):
    """Heartbeat everyone round-robin until nothing changes for a round (bounded)."""
    for _ in range(rounds):
        before = [(c.epoch, c.parts()) for c in clients]
        for c in clients:
            assert c.heartbeat() == E.NONE
            check_exclusive(clients)
        if [(c.epoch, c.parts()) for c in clients] == before:
            return
    raise AssertionError("did not converge")


def check_exclusive(clients):
    """No partition is owned by two clients at any time (revoke before assign)."""
    seen = {}
    for c in clients:
        for tp in c.parts():
            assert tp not in seen, f"{tp} owned by {seen[tp]} and {c.member_id}"
            seen[tp] = c.member_id


def group_of(env, gid) -> ConsumerGroup:
    g = env.c.group(gid)
    assert isinstance(g, ConsumerGroup)
    return g


# -- epochs and reconciliation ---------------------------------------------------------------

def test_first_member_gets_everything_at_epoch_one():
    env = Env()
    tid = env.image.add("t", 6)
    a = Client(env, "g", ["t"])
    assert a.heartbeat() == E.NONE
    assert a.epoch == 1 and a.parts() == [(tid, p) for p in range(6)]
    g = group_of(env, "g")
    assert g.state == "Stable" and g.group_epoch == 1 and g.assignment_epoch == 1


def test_second_member_waits_until_first_revokes():
    env = Env()
    tid = env.image.add("t", 6)
    a, b = Client(env, "g", ["t"]), Client(env, "g", ["t"])
    a.heartbeat()
    assert b.heartbeat() == E.NONE
    g = group_of(env, "g")
    # b is at the new epoch but its partitions are still a's: nothing yet.
    assert b.epoch == 2 and b.parts() == [] and g.members[b.member_id].state is MemberState.UNRELEASED_PARTITIONS
    assert g.state == "Reconciling"
    # a is asked to revoke (it stays at epoch 1 until it has).
    err, _, out = env.hb("g", a.member_id, 1, owned=a.owned_list())
    assert err == E.NONE and out.member_epoch == 1 and len(out.assignment[tid]) == 3
    ma = g.members[a.member_id]
    assert ma.state is MemberState.UNREVOKED_PARTITIONS and len(ma.partitions_pending_revocation[tid]) == 3
    # a still reports the revoked partitions: no progress, and b gets nothing.
    err, _, out = env.hb("g", a.member_id, 1, owned=a.owned_list())
    assert out.member_epoch == 1
    b.heartbeat()
    assert b.parts() == []
    # a acknowledges the revocation: it moves to epoch 2; then b gets the released ones.
    a.owned = {tid: set(out.assignment[tid])} if out.assignment else {tid: set(ma.assigned_partitions[tid])}
    err, _, out = env.hb("g", a.member_id, 1, owned=a.owned_list())
    assert err == E.NONE and out.member_epoch == 2
    a.epoch = 2
    b.heartbeat()
    assert b.epoch == 2 and len(b.parts()) == 3
    check_exclusive([a, b])
    assert g.state == "Stable"


def test_three_members_converge_without_double_ownership():
    env = Env()
    tid = env.image.add("t", 6)
    clients = [Client(env, "g", ["t"]) for _ in range(3)]
    for c in clients:
        c.heartbeat()
        check_exclusive(clients)
    converge(clients)
    assert sorted(len(c.parts()) for c in clients) == [2, 2, 2]
    assert sorted(tp for c in clients for tp in c.parts()) == [(tid, p) for p in range(6)]
    g = group_of(env, "g")
    assert g.state == "Stable" and all(c.epoch == g.group_epoch for c in clients)


def test_lost_response_previous_epoch_is_accepted_other_epochs_fenced():
    env = Env()
    env.image.add("t", 4)
    a, b = Client(env, "g", ["t"]), Client(env, "g", ["t"])
    a.heartbeat()
    b.heartbeat()
    converge([a, b])
    g = group_of(env, "g")
    m = g.members[a.member_id]
    assert m.member_epoch == 2 and m.previous_member_epoch == 1
    # previous epoch with a subset of the assignment: the bump was lost, accepted
    err, _, out = env.hb("g", a.member_id, 1, owned=a.owned_list())
    assert err == E.NONE and out.member_epoch == 2
    # previous epoch with a partition it no longer has: fenced
    other = next(iter(b.owned))
    err, msg, _ = env.hb("g", a.member_id, 1, owned=[(other, sorted(b.owned[other]))])
    assert err == E.FENCED_MEMBER_EPOCH and "smaller member epoch" in msg
    # a greater epoch than the coordinator's: fenced
    err, msg, _ = env.hb("g", a.member_id, 7, owned=a.owned_list())
    assert err == E.FENCED_MEMBER_EPOCH and "greater member epoch" in msg
    # a fenced member rejoins from scratch with its id and epoch 0
    a.epoch, a.owned = 0, {}
    assert a.heartbeat() == E.NONE
    converge([a, b])
    assert sorted(len(c.parts()) for c in (a, b)) == [2, 2]


def test_heartbeat_errors():
    env = Env(GroupConfig(**{**CFG.__dict__, "consumer_group_max_size": 2}))
    env.image.add("t", 2)
    # bad first heartbeats
    assert env.hb("g", "m", 0, topics=["t"], owned=[])[0] == E.INVALID_REQUEST  # no rebalance timeout
    assert env.hb("g", "m", 0, topics=["t"], owned=None, rebalance_ms=1000)[0] == E.INVALID_REQUEST
    assert env.hb("g", "m", 0, topics=[], owned=[], rebalance_ms=1000)[0] == E.INVALID_REQUEST
    assert env.hb("g", "", 0, topics=["t"], owned=[], rebalance_ms=1000)[0] == E.INVALID_REQUEST  # v1: id needed
    assert env.hb("g", "m", -3, topics=["t"], owned=[], rebalance_ms=1000)[0] == E.INVALID_REQUEST
    assert env.hb("", "m", 0, topics=["t"], owned=[], rebalance_ms=1000)[0] == E.INVALID_REQUEST
    err, msg, _ = env.hb("g", "m", 0, topics=["t"], owned=[], rebalance_ms=1000, assignor="sticky")
    assert err == E.UNSUPPORTED_ASSIGNOR and "uniform, range" in msg
    # version 0: the coordinator hands out the member id
    err, _, out = env.hb("g", "", 0, topics=["t"], owned=[], rebalance_ms=1000, version=0)
    assert err == E.NONE and len(out.member_id) > 10 and out.member_epoch == 1
    # unknown group / member
    assert env.hb("nope", "m", 3, owned=[])[0] == E.GROUP_ID_NOT_FOUND
    assert env.hb("g", "ghost", 1, owned=[])[0] == E.UNKNOWN_MEMBER_ID
    assert env.hb("g", "ghost", -1)[0] == E.UNKNOWN_MEMBER_ID
    # group.consumer.max.size
    assert Client(env, "g", ["t"]).heartbeat() == E.NONE
    assert Client(env, "g", ["t"]).heartbeat() == E.GROUP_MAX_SIZE_REACHED


def test_leave_moves_partitions_and_empty_group_can_be_deleted():
    env = Env()
    env.image.add("t", 4)
    a, b = Client(env, "g", ["t"]), Client(env, "g", ["t"])
    a.heartbeat()
    b.heartbeat()
    converge([a, b])
    epoch = group_of(env, "g").group_epoch
    assert b.leave() == E.NONE
    b.owned = {}
    converge([a])
    assert len(a.parts()) == 4 and a.epoch == epoch + 1
    out = []
    env.c.delete_groups(["g"], out.append)
    assert out[0]["g"] == E.NON_EMPTY_GROUP
    assert a.leave() == E.NONE
    assert group_of(env, "g").state == "Empty"
    out = []
    env.c.delete_groups(["g"], out.append)
    assert out[0]["g"] == E.NONE and env.c.group("g") is None


# -- timers ------------------------------------------------------------------------------------

def test_session_expiry_fences_member_and_moves_partitions():
    env = Env()
    env.image.add("t", 4)
    a, b = Client(env, "g", ["t"]), Client(env, "g", ["t"])
    a.heartbeat()
    b.heartbeat()
    converge([a, b])
    for _ in range(3):  # a keeps heartbeating, b goes silent
        env.tick(SESSION_MS // 3)
        assert a.heartbeat() == E.NONE
    env.tick(1)
    g = group_of(env, "g")
    assert list(g.members) == [a.member_id]
    converge([a])
    assert len(a.parts()) == 4
    assert b.heartbeat() == E.UNKNOWN_MEMBER_ID


def test_rebalance_timeout_fences_member_that_does_not_revoke():
    env = Env()
    env.image.add("t", 4)
    a, b = Client(env, "g", ["t"]), Client(env, "g", ["t"])
    a.heartbeat()
    b.heartbeat()
    err, _, _ = env.hb("g", a.member_id, 1, owned=a.owned_list())  # told to revoke, never does
    assert group_of(env, "g").members[a.member_id].state is MemberState.UNREVOKED_PARTITIONS
    for _ in range(4):
        env.tick(REBALANCE_MS // 4 - 1)
        assert env.hb("g", a.member_id, 1, owned=a.owned_list())[0] == E.NONE  # still owns them
        b.heartbeat()
    env.tick(10)
    g = group_of(env, "g")
    assert a.member_id not in g.members
    converge([b])
    assert len(b.parts()) == 4


# -- static membership ------------------------------------------------------------------------

def test_static_member_rejoins_with_its_partitions():
    env = Env()
    env.image.add("t", 4)
    a = Client(env, "g", ["t"], instance="i-a")
    b = Client(env, "g", ["t"], instance="i-b")
    a.heartbeat()
    b.heartbeat()
    converge([a, b])
    g = group_of(env, "g")
    epoch, a_parts = g.group_epoch, a.parts()
    # another process with the same instance id while a is alive
    intruder = Client(env, "g", ["t"], instance="i-a")
    assert intruder.heartbeat() == E.UNRELEASED_INSTANCE_ID
    # a leaves temporarily (-2), keeps its partitions; its replacement takes them over
    assert a.leave(epoch=-2) == E.NONE
    assert g.members[a.member_id].member_epoch == -2
    a2 = Client(env, "g", ["t"], instance="i-a")
    assert a2.heartbeat() == E.NONE
    assert a2.parts() == a_parts and g.group_epoch == epoch  # no rebalance
    assert a.member_id not in g.members and g.static_members["i-a"] == a2.member_id
    # the old incarnation is fenced
    err, _, _ = env.hb("g", a.member_id, a.epoch, owned=[], instance="i-a")
    assert err == E.FENCED_INSTANCE_ID
    converge([a2, b])
    check_exclusive([a2, b])


def test_static_member_session_expiry_after_temporary_leave():
    env = Env()
    env.image.add("t", 2)
    a = Client(env, "g", ["t"], instance="i-a")
    b = Client(env, "g", ["t"])
    a.heartbeat()
    b.heartbeat()
    converge([a, b])
    a.leave(epoch=-2)
    for _ in range(2):
        env.tick(SESSION_MS // 2)
        b.heartbeat()
    env.tick(1)
    converge([b])
    assert len(b.parts()) == 2 and "i-a" not in group_of(env, "g").static_members


# -- assignors ----------------------------------------------------------------------------------

def test_range_assignor_shape_is_co_partitioned():
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    members = {m: MemberSpec(frozenset({t1, t2}), {}) for m in ("a", "b", "c")}
    out = range_assign(members, {t1: 4, t2: 4})
    assert out["a"] == {t1: {0, 1}, t2: {0, 1}}
    assert out["b"] == {t1: {2}, t2: {2}}
    assert out["c"] == {t1: {3}, t2: {3}}
    # sticky: a new member d takes from the ends, a/b/c keep their lowest partitions
    members = {m: MemberSpec(frozenset({t1, t2}), out.get(m, {})) for m in ("a", "b", "c", "d")}
    out2 = range_assign(members, {t1: 4, t2: 4})
    assert all(len(out2[m][t1]) == 1 for m in members)
    assert out2["a"][t1] == {0} and out2["b"][t1] == {2} and out2["c"][t1] == {3} and out2["d"][t1] == {1}


def test_range_assignor_selected_by_server_assignor():
    env = Env()
    tid = env.image.add("t", 4)
    clients = [Client(env, "g", ["t"], assignor="range", member_id=f"m{i}") for i in range(2)]
    for c in clients:
        c.heartbeat()
    converge(clients)
    assert clients[0].parts() == [(tid, 0), (tid, 1)] and clients[1].parts() == [(tid, 2), (tid, 3)]


def _check_uniform(members, topics, out):
    owners = {}
    for m, a in out.items():
        for tid, ps in a.items():
            assert tid in members[m].subscribed_topic_ids
            for p in ps:
                assert (tid, p) not in owners
                owners[(tid, p)] = m
    subscribed = {t for s in members.values() for t in s.subscribed_topic_ids}
    assert set(owners) == {(t, p) for t in subscribed if t in topics for p in range(topics[t])}


def test_uniform_assignor_balanced_and_sticky():
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    topics = {t1: 7, t2: 3}
    members = {m: MemberSpec(frozenset({t1, t2}), {}) for m in ("a", "b", "c")}
    out = uniform_assign(members, topics)
    _check_uniform(members, topics, out)
    counts = sorted(sum(len(ps) for ps in a.values()) for a in out.values())
    assert counts == [3, 3, 4]
    # a fourth member: balance 3/3/2/2 and the three keep everything they can
    members4 = {m: MemberSpec(frozenset({t1, t2}), out.get(m, {})) for m in ("a", "b", "c", "d")}
    out4 = uniform_assign(members4, topics)
    _check_uniform(members4, topics, out4)
    assert sorted(sum(len(ps) for ps in a.values()) for a in out4.values()) == [2, 2, 3, 3]
    moved = sum(len(set(out[m].get(t, ())) - set(out4[m].get(t, ()))) for m in out for t in topics)
    assert moved == 2  # exactly what d needs


def test_uniform_assignor_heterogeneous_random():
    rng = random.Random(7)
    for _ in range(50):
        tids = [uuid.uuid4() for _ in range(rng.randint(1, 4))]
        topics = {t: rng.randint(1, 9) for t in tids}
        members = {f"m{i}": MemberSpec(frozenset(rng.sample(tids, rng.randint(1, len(tids)))), {})
                   for i in range(rng.randint(1, 6))}
        out = uniform_assign(members, topics)
        _check_uniform(members, topics, out)
        if all(s.subscribed_topic_ids == set(tids) for s in members.values()):
            counts = [sum(len(ps) for ps in a.values()) for a in out.values()]
            assert max(counts) - min(counts) <= 1


def test_new_partitions_bump_the_group_epoch():
    env = Env()
    env.image.add("t", 2)
    a = Client(env, "g", ["t"])
    a.heartbeat()
    env.image.topics["t"] = types.SimpleNamespace(name="t", topic_id=env.image.topics["t"].topic_id,
                                                  num_partitions=5)
    env.image.epoch += 1
    converge([a])
    assert len(a.parts()) == 5 and group_of(env, "g").group_epoch == 2


# -- records and replay -------------------------------------------------------------------------

def test_replay_rebuilds_identical_state():
    env = Env()
    env.image.add("t", 6)
    env.image.add("u", 3)
    a = Client(env, "g", ["t", "u"], instance="i-a")
    b = Client(env, "g", ["t"])
    c = Client(env, "g", ["u"], assignor="range")
    for x in (a, b, c):
        x.heartbeat()
    env.hb("g", a.member_id, a.epoch, owned=a.owned_list())  # leave a mid-revocation
    b.heartbeat()
    commits = []
    env.c.commit_offsets("g", b.member_id, None, b.epoch, {("t", 0): OffsetAndMetadata(42, -1, "x", T0)},
                         commits.append, api_version=9)
    assert commits == [{("t", 0): E.NONE}]
    g = group_of(env, "g")
    before = g.state_fingerprint()
    kinds = {storage.parse_record(r.key, r.value).key_version for p in env.log.partitions()
             for bt in env.log.read_batches(p) for r in bt}
    assert {1, 3, 4, 5, 6, 7, 8} <= kinds
    env2 = Env(log=env.log, image=env.image)
    g2 = group_of(env2, "g")
    assert g2.state_fingerprint() == before
    assert g2.state == g.state and g2.offsets.get(("t", 0)).committed_offset == 42
    # the reloaded coordinator keeps serving the members at their epochs
    b.env = env2
    assert b.heartbeat() == E.NONE


def test_failed_append_reverts_group_state():
    env = Env()
    env.image.add("t", 2)
    a = Client(env, "g", ["t"])
    a.heartbeat()
    g = group_of(env, "g")
    before = g.state_fingerprint()
    env.log.fail_appends(E.NOT_LEADER_OR_FOLLOWER)
    b = Client(env, "g", ["t"])
    assert b.heartbeat() == E.NOT_COORDINATOR
    assert g.state_fingerprint() == before


# -- classic APIs and consumer groups ------------------------------------------------------------

def _join(env, group, ptype="consumer"):
    out = []
    env.c.join_group(group, "", None, require_known_member_id=False, supports_skip_assignment=True,
                     client_id="cli", client_host="/h", rebalance_timeout_ms=10000, session_timeout_ms=10000,
                     protocol_type=ptype, protocols=[("range", b"\x00\x00\x00\x00\x00\x00\x00\x00")],
                     callback=out.append)
    env.tick(0)
    return out


def test_group_id_in_use_by_the_other_protocol():
    env = Env()
    env.image.add("t", 2)
    a = Client(env, "cg", ["t"])
    a.heartbeat()
    # classic JoinGroup to a live consumer group
    out = _join(env, "cg")
    assert out and out[0].error == E.INCONSISTENT_GROUP_PROTOCOL
    assert env.c.heartbeat("cg", "x", None, 1) == E.UNKNOWN_MEMBER_ID
    # consumer heartbeat to a live classic group
    out = _join(env, "classic")
    assert out[0].error == E.NONE
    err, msg, _ = env.hb("classic", "m", 0, topics=["t"], owned=[], rebalance_ms=1000)
    assert err == E.GROUP_ID_NOT_FOUND
    err, msg, _ = env.hb("classic", "m", 3, owned=[])
    assert err == E.GROUP_ID_NOT_FOUND and "not a consumer group" in msg
    # ListGroups / DescribeGroups see both kinds
    err, groups = env.c.list_groups()
    kinds = {g.group_id: (g.group_type, g.protocol_type) for g in groups}
    assert kinds["cg"] == ("consumer", "consumer") and kinds["classic"] == ("classic", "consumer")
    err, groups = env.c.list_groups(types_filter=["consumer"], states_filter=["stable"])
    assert [g.group_id for g in groups] == ["cg"]
    err, summary = env.c.describe_group("cg")
    assert summary.state == "Stable" and summary.protocol_type == "consumer" and len(summary.members) == 1
    err, msg, d = env.c.consumer_group_describe("classic")
    assert err == E.GROUP_ID_NOT_FOUND


def test_empty_classic_group_becomes_consumer_group_keeping_offsets():
    env = Env()
    tid = env.image.add("t", 2)
    done = []
    env.c.commit_offsets("simple", "", None, -1, {("t", 1): OffsetAndMetadata(7, -1, "", T0)}, done.append)
    assert done == [{("t", 1): E.NONE}]
    a = Client(env, "simple", ["t"])
    assert a.heartbeat() == E.NONE and a.parts() == [(tid, 0), (tid, 1)]
    err, res = env.c.fetch_offsets("simple", [("t", 1)])
    assert res[("t", 1)].committed_offset == 7
    # and back: the empty consumer group gives way to a classic JoinGroup
    a.leave()
    out = _join(env, "simple")
    assert out[0].error == E.NONE
    err, res = env.c.fetch_offsets("simple", [("t", 1)])
    assert res[("t", 1)].committed_offset == 7


def test_offset_commit_uses_member_epoch():
    env = Env()
    env.image.add("t", 2)
    a = Client(env, "g", ["t"])
    a.heartbeat()

    def commit(member, epoch, version=9):
        out = []
        env.c.commit_offsets("g", member, None, epoch, {("t", 0): OffsetAndMetadata(1, -1, "", T0)}, out.append,
                             api_version=version)
        return out[0][("t", 0)]

    assert commit(a.member_id, a.epoch) == E.NONE
    assert commit(a.member_id, a.epoch + 1) == E.STALE_MEMBER_EPOCH
    assert commit("ghost", a.epoch) == E.UNKNOWN_MEMBER_ID
    assert commit(a.member_id, a.epoch, version=8) == E.UNSUPPORTED_VERSION
    assert commit("", -1) == E.UNKNOWN_MEMBER_ID  # group not empty: only members commit
    a.leave()
    assert commit("", -1) == E.NONE


def test_consumer_protocol_can_be_disabled():
    cfg = GroupConfig(**{**CFG.__dict__, "rebalance_protocols": ("classic",)})
    assert not cfg.consumer_protocol_enabled and CFG.consumer_protocol_enabled

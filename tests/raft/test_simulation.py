"""The KRaft quorum under the deterministic simulation (kbroker/raft/simulation.py).

Each test runs a range of seeds; a failure names its seed. Reproduce one seed with
``python -m kbroker.raft.simulation SEED -v`` (prints the trace), or run just that seed
here with ``KBROKER_RAFT_SEED=SEED pytest tests/raft/test_simulation.py`` (every
parametrized range then runs only that seed, with its own configuration).
The default suite runs about 1,500 seeds; ``-m slow`` adds a 20,000-seed sweep.
"""
import logging
import os

import pytest

from kbroker.raft.simulation import InvariantViolation, SimConfig, Simulation

ONE_SEED = os.environ.get("KBROKER_RAFT_SEED")


@pytest.fixture(autouse=True)
def _quiet():
    # rejected requests are logged at WARNING by design; thousands of seeds make that noise
    logger = logging.getLogger("kbroker.raft")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(old)


def seeds(start, count):
    return [int(ONE_SEED)] if ONE_SEED else range(start, start + count)


def run_range(start, count, **kw):
    stats = []
    for s in seeds(start, count):
        stats.append(Simulation(s, SimConfig(**kw)).run())
    return stats


CHUNK = 100


@pytest.mark.parametrize("start", range(1, 1 + 10 * CHUNK, CHUNK))
def test_three_voters_and_an_observer(start):
    stats = run_range(start, CHUNK)
    # the runs really did exercise faults and progress
    assert sum(s["crashes"] for s in stats) > 0 and sum(s["partitions"] for s in stats) > 0
    assert all(s["committed"] > 0 for s in stats)


@pytest.mark.parametrize("start", [100_001, 100_101])
def test_five_voters_and_two_observers(start):
    run_range(start, CHUNK, voters=5, observers=2)


def test_one_voter():
    run_range(200_001, CHUNK, voters=1, observers=1)


def test_small_fetches_and_a_lossy_network():
    # one batch per fetch: a follower back from a long partition needs a while to catch up
    run_range(300_001, CHUNK, fetch_max_bytes=1, drop=0.2, duplicate=0.1, max_delay_ms=80, liveness_ms=60000)


@pytest.mark.parametrize("start,kw", [
    (600_001, dict(snapshot_every=20)),
    (600_101, dict(snapshot_every=5, fetch_max_bytes=1, crash_every_ms=500)),
    (600_201, dict(snapshot_every=7, voters=5, observers=2)),
])
def test_snapshots(start, kw):
    """Nodes snapshot their applied state and drop the log before it; lagging replicas
    and restarted nodes catch up through FetchSnapshot (KIP-630)."""
    stats = run_range(start, CHUNK, **kw)
    if not ONE_SEED:
        assert sum(s.get("snapshots", 0) for s in stats) > 50


@pytest.mark.parametrize("start,kw", [
    (700_001, dict(reconfigure_every_ms=300, observers=2)),
    (700_101, dict(reconfigure_every_ms=400, voters=5, observers=1, drop=0.2)),
])
def test_dynamic_voters(start, kw):
    """KIP-853: the voters start as a VotersRecord in their logs and the leader adds and
    removes one voter at a time (itself too) under the same faults; the committed prefix
    must stay on a majority of the committed voter set and the quorum must recover."""
    stats = run_range(start, CHUNK, **kw)
    if not ONE_SEED:
        assert sum(s.get("reconfigurations", 0) for s in stats) > 200


def test_a_seed_is_reproducible():
    a = Simulation(42).run()
    b = Simulation(42).run()
    assert a == b
    sim1, sim2 = Simulation(42), Simulation(42)
    sim1.run()
    sim2.run()
    assert sim1.trace == sim2.trace and sim1.committed == sim2.committed


def test_every_message_goes_through_the_codecs():
    st = Simulation(7).run()
    assert st["messages"] > 100 and st["bytes"] > 1000


# -- the checkers can fail: protocol bugs injected through test-only hooks are caught ----------------

def first_failure(bug, limit, **kw):
    for s in range(1, limit + 1):
        try:
            Simulation(s, SimConfig(bugs=frozenset([bug]), **kw)).run()
        except InvariantViolation as e:
            return str(e)
    return None


def test_catches_a_replica_that_votes_twice_in_an_epoch():
    err = first_failure("vote_twice", 200)
    assert err is not None and "voted twice in epoch" in err and "reproduce:" in err
    # and what it leads to, two leaders in one epoch, is caught too
    err = first_failure("vote_twice", 200, voters=5, observers=0)
    assert err is not None and ("two leaders in epoch" in err or "voted twice" in err)


def test_catches_votes_granted_to_a_candidate_with_a_stale_log():
    err = first_failure("vote_ignores_log", 50)
    assert err is not None and ("committed entry" in err or "below the high watermark" in err)


def test_catches_a_follower_that_acknowledges_before_fsync():
    err = first_failure("no_fsync", 100)
    assert err is not None


def test_catches_a_follower_that_does_not_truncate_a_diverging_log():
    err = first_failure("no_truncate", 50)
    assert err is not None


def test_the_checkers_themselves():
    from types import SimpleNamespace as NS

    from kbroker.raft.quorum_state import ElectionState
    sim = Simulation(1)
    n1, n2 = sim.nodes[1], sim.nodes[2]
    for n in (n1, n2):
        n.state = NS(applied=[])
        n.client = NS(is_leader=True, quorum=NS(epoch=5), high_watermark=0)
    sim.check(n1)
    with pytest.raises(InvariantViolation, match="two leaders in epoch 5: 1 and 2"):
        sim.check(n2)
    n2.client.is_leader = False
    n2.client.high_watermark = 1
    with pytest.raises(InvariantViolation, match="applied 0 records but its high watermark is 1"):
        sim.check(n2)
    n2.state.applied.append(None)
    sim.check(n2)
    n2.client.high_watermark = 0
    n2.state.applied.clear()
    with pytest.raises(InvariantViolation, match="high watermark went back"):
        sim.check(n2)
    n2.last_hw = 0
    n2.store.write(ElectionState(3, voted_id=1))
    sim.check(n2)
    n2.store.state = ElectionState(3, voted_id=3)
    with pytest.raises(InvariantViolation, match="voted twice"):
        sim.check(n2)

    import pickle

    from kbroker.raft.replicated_log import OffsetAndEpoch
    from kbroker.raft.simulation import AppliedState
    sim.committed[:] = [(1, 2, b"lc"), (1, -1, b"a")]
    st = AppliedState(sim, n1)
    st.handle_load_snapshot(OffsetAndEpoch(2, 1), pickle.dumps(sim.committed[:2]))
    with pytest.raises(InvariantViolation, match="not the committed prefix"):
        st.handle_load_snapshot(OffsetAndEpoch(2, 1), pickle.dumps([(1, 2, b"lc"), (1, -1, b"b")]))


def test_on_disk_logs(tmp_path):
    """The same runs on KafkaMetadataLog (our Log: segments, epoch checkpoint, recovery after
    a process crash; snapshot files) instead of MemoryLog."""
    for s in seeds(400_001, 15):
        st = Simulation(s, SimConfig(disk_dir=str(tmp_path / str(s)))).run()
        assert st["committed"] > 0
    snaps = 0
    for s in seeds(400_101, 15):
        snaps += Simulation(s, SimConfig(disk_dir=str(tmp_path / str(s)), snapshot_every=10)).run().get("snapshots", 0)
    assert snaps > 0 or ONE_SEED

"""BrokerRegistration / BrokerHeartbeat / UnregisterBroker on a simulated clock."""
from __future__ import annotations

import uuid

from kbroker.controller.features import IBP_3_3_IV0
from kbroker.metadata import records as R
from kbroker.protocol.errors import ErrorCode as E
from kbroker.protocol.messages.unregister_broker import UnregisterBrokerRequest

from tests.controller.harness import Harness


def test_registration_epoch_is_the_offset_of_its_record():
    h = Harness()
    r = h.register(1)
    assert r.response.error_code == 0
    assert r.response.broker_epoch == r.first_offset == r.last_offset
    assert isinstance(r.records[-1].message, R.RegisterBrokerRecord)
    assert h.c.cluster.registration(1).fenced            # registered fenced
    assert h.c.cluster.registration(1).epoch == r.first_offset


def test_wrong_cluster_id_and_unsupported_metadata_version():
    h = Harness()
    assert h.register(1, cluster_id="other").response.error_code == E.INCONSISTENT_CLUSTER_ID
    assert h.register(1, mv=(1, 7)).response.error_code == E.UNSUPPORTED_VERSION
    assert h.register(1, log_dirs=[]).response.error_code == E.INVALID_REGISTRATION
    assert h.c.cluster.registration(1) is None and len(h.log) == 1


def test_old_metadata_version_needs_no_log_dirs_and_fences_with_fence_records():
    h = Harness(metadata_version=IBP_3_3_IV0)
    assert h.register(1, log_dirs=[]).response.error_code == 0
    r = h.heartbeat(1)
    assert isinstance(r.records[0].message, R.UnfenceBrokerRecord)
    h.now += 9000
    r = h.write(h.c.fence_stale_brokers(h.now))
    assert isinstance(r.records[-1].message, R.FenceBrokerRecord)
    assert h.broker_image() == h.c.image()


def test_duplicate_registration_while_session_valid():
    h = Harness()
    h.start_brokers([1])
    other = uuid.UUID(int=12345)
    assert h.register(1, incarnation=other).response.error_code == E.DUPLICATE_BROKER_REGISTRATION
    # same incarnation re-registering: amended, epoch and fencing kept
    before = h.epochs[1]
    r = h.register(1)
    assert r.response.error_code == 0 and r.response.broker_epoch == before
    assert not h.c.cluster.registration(1).fenced
    # once the session lapsed a new incarnation may register; it gets a new epoch
    h.now += 9000
    r = h.register(1, incarnation=other)
    assert r.response.error_code == 0 and r.response.broker_epoch > before
    assert h.c.cluster.registration(1).fenced


def test_new_incarnation_after_lapsed_session_moves_leadership_first():
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 2, assignments=[[1, 2]])
    h.now += 5000
    h.heartbeat(2)
    h.now += 4000      # broker 1's session lapsed, not yet fenced by the timer
    r = h.register(1, incarnation=uuid.UUID(int=999))
    assert r.response.error_code == 0
    p = h.partition("t")
    assert p.leader == 2 and p.isr == (2,)
    assert h.c.state() == h.replayed().state()


def test_heartbeat_unfences_only_when_caught_up_and_not_asking_to_stay_fenced():
    h = Harness()
    reg = h.register(1).response.broker_epoch
    r = h.heartbeat(1, offset=reg - 1)
    assert r.response.is_fenced and not r.response.is_caught_up and not r.records
    r = h.heartbeat(1, offset=reg, want_fence=True)
    assert r.response.is_fenced and r.response.is_caught_up and not r.records
    r = h.heartbeat(1, offset=reg)
    assert not r.response.is_fenced and r.response.is_caught_up
    assert isinstance(r.records[0].message, R.BrokerRegistrationChangeRecord) and r.records[0].message.fenced == -1
    assert not h.c.cluster.registration(1).fenced


def test_stale_broker_epoch():
    h = Harness()
    h.start_brokers([1])
    assert h.heartbeat(1, epoch=h.epochs[1] + 1).response.error_code == E.STALE_BROKER_EPOCH
    assert h.heartbeat(7, epoch=3).response.error_code == E.STALE_BROKER_EPOCH


def test_fencing_timeline_on_a_simulated_clock():
    """broker.session.timeout.ms 9000: a broker that stops heartbeating is fenced at 9 s,
    its leaderships move to an ISR member with a higher leader epoch; heartbeating again
    unfences it and an offline partition comes back with it as leader."""
    h = Harness()
    h.start_brokers([1, 2, 3])
    h.create_topic("a", 1, 2, assignments=[[1, 2]])
    h.create_topic("solo", 1, 1, assignments=[[1]])
    ep = h.partition("a").leader_epoch
    for t in range(1000, 9000, 1000):          # 2 and 3 keep heartbeating, 1 is silent
        h.now = t
        h.heartbeat(2)
        h.heartbeat(3)
        assert not h.write(h.c.fence_stale_brokers(h.now)).records
    assert h.c.next_session_expiry_ms() == 9000
    h.now = 8999
    assert not h.write(h.c.fence_stale_brokers(h.now)).records
    h.now = 9000
    r = h.write(h.c.fence_stale_brokers(h.now))
    assert r.records and h.c.cluster.registration(1).fenced
    a = h.partition("a")
    assert a.leader == 2 and a.isr == (2,) and a.leader_epoch == ep + 1
    solo = h.partition("solo")
    assert solo.leader == -1 and solo.isr == (1,)       # the last ISR member stays
    img = h.broker_image()
    assert [b.id for b in img.cluster.alive_brokers()] == [2, 3]
    # broker 1 comes back
    h.now = 12000
    r = h.heartbeat(1)
    assert not r.response.is_fenced
    solo2 = h.partition("solo")
    assert solo2.leader == 1 and solo2.leader_epoch == solo.leader_epoch + 1
    assert h.partition("a").leader == 2      # no automatic move back (preferred election does that)
    assert h.c.state() == h.replayed().state() and h.broker_image() == h.c.image()


def test_controlled_shutdown_moves_leaders_then_lets_it_go():
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 2, 2, assignments=[[1, 2], [2, 1]])
    r = h.heartbeat(1, want_shut_down=True)
    assert not r.response.should_shut_down and not r.response.is_fenced
    reg = h.c.cluster.registration(1)
    assert reg.in_controlled_shutdown
    assert h.partition("t", 0).leader == 2 and h.partition("t", 0).isr == (2,)
    assert h.partition("t", 1).isr == (2,)
    assert not h.c.replication.has_leaderships(1)
    # broker 2 has not yet seen the leader moves: not yet
    h.heartbeat(2, offset=r.first_offset - 1)
    assert not h.heartbeat(1, want_shut_down=True).response.should_shut_down
    h.heartbeat(2)       # caught up
    r = h.heartbeat(1, want_shut_down=True)
    assert r.response.should_shut_down and r.response.is_fenced
    assert h.c.cluster.registration(1).fenced
    # a shutting-down broker may not join an ISR
    assert h.c.state() == h.replayed().state()


def test_shutdown_without_leaderships_is_immediate():
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 1, assignments=[[2]])
    r = h.heartbeat(1, want_shut_down=True)
    assert r.response.should_shut_down and r.response.is_fenced


def test_unregister_broker():
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 2, assignments=[[1, 2]])
    r = h.write(h.c.unregister_broker(UnregisterBrokerRequest(broker_id=1)))
    assert r.response.error_code == 0
    assert isinstance(r.records[-1].message, R.UnregisterBrokerRecord)
    assert h.c.cluster.registration(1) is None and h.partition("t").leader == 2
    r = h.write(h.c.unregister_broker(UnregisterBrokerRequest(broker_id=1)))
    assert r.response.error_code == E.BROKER_ID_NOT_REGISTERED
    assert h.broker_image() == h.c.image()


def test_a_shut_down_broker_stays_fenced_until_it_registers_again():
    h = Harness()
    h.start_brokers([1, 2])
    h.create_topic("t", 1, 2, assignments=[[1, 2]])
    h.heartbeat(1, want_shut_down=True)
    h.heartbeat(2)
    assert h.heartbeat(1, want_shut_down=True).response.should_shut_down
    n = len(h.log)
    for _ in range(3):     # late heartbeats of the exiting process change nothing
        r = h.heartbeat(1)
        assert r.response.is_fenced and not r.records
    assert len(h.log) == n
    h.now += 9000
    h.heartbeat(2)
    r = h.register(1, incarnation=uuid.UUID(int=4242))
    assert r.response.error_code == 0
    reg = h.c.cluster.registration(1)
    assert reg.fenced and not reg.in_controlled_shutdown
    assert not h.heartbeat(1).response.is_fenced

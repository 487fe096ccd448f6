"""Consumer groups with real clients against a real kbroker process.

confluent-kafka (librdkafka), kafka-python, aiokafka and kcat -G: partitions split
across a group, a SIGKILLed consumer's partitions move after its session timeout,
committed offsets survive broker restarts (SIGTERM and SIGKILL), cooperative-sticky
rebalances revoke only what moves, static members rejoin without a rebalance.
Every wait is bounded in time.
"""
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

import confluent_kafka as ck  # noqa: E402
from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests.broker.kafka_helpers import create_topic, needs_kcat, produce  # noqa: E402

SESSION_MS = 6000  # the broker's default group.min.session.timeout.ms


def _name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _fill(bootstrap, topic, partitions, per_partition):
    msgs = [(p, b"k", b"%d-%d" % (p, i), None) for p in range(partitions) for i in range(per_partition)]
    reports = produce(bootstrap, topic, msgs, acks="all", **{"linger.ms": 2})
    assert all(err is None for err, *_ in reports)


def _consumer(bootstrap, group, **conf):
    base = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 2000}
    base.update(conf)
    return Consumer(base)


def _poll_until(consumers, cond, timeout_s, sink=None):
    """Poll every consumer round-robin until cond() or the deadline; returns cond()."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            m = c.poll(0.05)
            if m is not None and m.error() is None and sink is not None:
                sink.append(m)
        if cond():
            return True
    return cond()


def _parts(c):
    return sorted(tp.partition for tp in c.assignment())


def _positions(c):
    return {tp.partition: tp.offset for tp in c.position(c.assignment())}


def _at_end(c, end_offset):
    """Has ``c`` consumed every partition it owns up to ``end_offset``?"""
    return all(o == end_offset for o in _positions(c).values())


def _wait_stable(bootstrap, group, consumers, members, timeout_s=30):
    """Poll ``consumers`` until the coordinator describes ``group`` as Stable with
    ``members`` members (no rebalance in flight)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        d = admin.describe_consumer_groups([group])[group].result(timeout=10)
        state = (d.state, len(d.members))
        if state == (ck.ConsumerGroupState.STABLE, members):
            return
        _poll_until(consumers, lambda: False, 0.2)
    raise AssertionError(f"group {group} not stable with {members} members: {state}")


# -- confluent-kafka ---------------------------------------------------------------------

def test_confluent_group_splits_partitions_and_commits(broker):
    topic, group = _name("gs"), _name("grp")
    create_topic(broker.bootstrap, topic, partitions=6)
    _fill(broker.bootstrap, topic, 6, 10)
    cs = [_consumer(broker.bootstrap, group) for _ in range(3)]
    try:
        for c in cs:
            c.subscribe([topic])
        got = []
        # without commits, a partition read before a rebalance is read again by its next owner:
        # wait until every owner has read its partitions to the end (its positions are 10), so
        # that the commits below are of the current owners' positions
        ok = _poll_until(cs, lambda: sorted(p for c in cs for p in _parts(c)) == list(range(6))
                         and all(len(_parts(c)) == 2 and _at_end(c, 10) for c in cs), 40, got)
        assert ok, ([_parts(c) for c in cs], [_positions(c) for c in cs], len(got))
        assert {m.value() for m in got} == {b"%d-%d" % (p, i) for p in range(6) for i in range(10)}
        for c in cs:
            c.commit(asynchronous=False)
        committed = cs[0].committed([TopicPartition(topic, p) for p in range(6)], timeout=10)
        assert [tp.offset for tp in committed] == [10] * 6
    finally:
        for c in cs:
            c.close()


_CHILD = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "session.timeout.ms": %d,
                  "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest"})
    c.subscribe([sys.argv[3]])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        c.poll(0.2)
        print("ASSIGNED", sorted(tp.partition for tp in c.assignment()), flush=True)
""" % SESSION_MS)


def test_sigkill_consumer_partitions_move_after_session_timeout(broker, tmp_path):
    topic, group = _name("gk"), _name("grp")
    create_topic(broker.bootstrap, topic, partitions=4)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    out = open(tmp_path / "child.out", "w+")
    child = subprocess.Popen([sys.executable, str(script), broker.bootstrap, group, topic], stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True)
    c = _consumer(broker.bootstrap, group)
    try:
        c.subscribe([topic])
        assert _poll_until([c], lambda: len(_parts(c)) == 2, 40), _parts(c)
        t_kill = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert _poll_until([c], lambda: _parts(c) == [0, 1, 2, 3], 40), _parts(c)
        moved_after = time.monotonic() - t_kill
        # moved by the session timeout, not before it (no LeaveGroup from a killed process)
        assert moved_after >= SESSION_MS / 1000 * 0.8, moved_after
    finally:
        c.close()
        if child.poll() is None:
            child.kill()
            child.wait()
        out.close()


def _consume_committing(bootstrap, group, topic, n, timeout_s=30):
    """Consume n messages, committing each synchronously; returns their values."""
    c = _consumer(bootstrap, group)
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None or m.error() is not None:
            continue
        got.append(m.value())
        c.commit(message=m, asynchronous=False)
    c.close()
    return got


def _consume_rest(bootstrap, group, topic, expect, timeout_s=30):
    c = _consumer(bootstrap, group)
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.value())
        if len(got) >= expect:
            # keep polling a little: anything more would be a duplicate
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                m = c.poll(0.1)
                if m is not None and m.error() is None:
                    got.append(m.value())
            break
    c.close()
    return got


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_committed_offsets_survive_broker_restart(fresh_broker, how):
    conf = {"group.initial.rebalance.delay.ms": 0, "kbroker.log.fsync.every.append": "true"}
    b = fresh_broker(**conf)
    topic, group = _name("gr"), _name("grp")
    create_topic(b.bootstrap, topic, partitions=2)
    _fill(b.bootstrap, topic, 2, 50)
    first = _consume_committing(b.bootstrap, group, topic, 37)
    assert len(first) == 37
    if how == "sigterm":
        assert b.terminate() == 0
    else:
        b.kill()
    b2 = fresh_broker(**conf)
    rest = _consume_rest(b2.bootstrap, group, topic, 100 - 37)
    everything = sorted(b"%d-%d" % (p, i) for p in range(2) for i in range(50))
    assert len(rest) == len(set(rest)), "duplicates after the last commit"
    assert sorted(first + rest) == everything


def test_cooperative_sticky_revokes_only_what_moves(broker):
    topic, group = _name("gc"), _name("grp")
    create_topic(broker.bootstrap, topic, partitions=4)
    events = {"a": [], "b": []}

    def cbs(name):
        return dict(on_assign=lambda c, ps: events[name].append(("assign", sorted(p.partition for p in ps))),
                    on_revoke=lambda c, ps: events[name].append(("revoke", sorted(p.partition for p in ps))))

    conf = {"partition.assignment.strategy": "cooperative-sticky"}
    a = _consumer(broker.bootstrap, group, **conf)
    b = _consumer(broker.bootstrap, group, **conf)
    try:
        a.subscribe([topic], **cbs("a"))
        assert _poll_until([a], lambda: _parts(a) == [0, 1, 2, 3], 30), _parts(a)
        b.subscribe([topic], **cbs("b"))
        assert _poll_until([a, b], lambda: len(_parts(a)) == 2 and len(_parts(b)) == 2, 40), \
            (_parts(a), _parts(b), events)
        revoked = [p for kind, ps in events["a"] if kind == "revoke" for p in ps]
        assert sorted(revoked) == _parts(b), events  # only the partitions that moved
        assert set(_parts(a)).isdisjoint(revoked)
    finally:
        a.close()
        b.close()


def test_static_member_rejoins_without_rebalance(broker):
    topic, group = _name("gst"), _name("grp")
    create_topic(broker.bootstrap, topic, partitions=4)
    events = []
    conf = {"session.timeout.ms": 10000}
    a = _consumer(broker.bootstrap, group, **{"group.instance.id": "inst-a", **conf})
    b = _consumer(broker.bootstrap, group, **{"group.instance.id": "inst-b", **conf})
    b2 = None
    try:
        a.subscribe([topic], on_revoke=lambda c, ps: events.append(("revoke", len(ps))),
                    on_assign=lambda c, ps: events.append(("assign", len(ps))))
        b.subscribe([topic])
        assert _poll_until([a, b], lambda: len(_parts(a)) == 2 and len(_parts(b)) == 2, 40)
        a_parts, b_parts = _parts(a), _parts(b)
        # wait for the group to settle, then forget what happened so far
        _wait_stable(broker.bootstrap, group, [a, b], 2)
        assert (_parts(a), _parts(b)) == (a_parts, b_parts)
        events.clear()
        b.close()  # a static member does not leave the group on close
        b2 = _consumer(broker.bootstrap, group, **{"group.instance.id": "inst-b", **conf})
        b2.subscribe([topic])
        assert _poll_until([a, b2], lambda: _parts(b2) == b_parts, 30), _parts(b2)
        _poll_until([a, b2], lambda: False, 2.0)
        assert events == [], events  # a was never asked to give anything back
        assert _parts(a) == a_parts
    finally:
        a.close()
        if b2 is not None:
            b2.close()


def test_twenty_consumers_hundred_partitions_stabilise(broker):
    topic, group = _name("g20"), _name("grp")
    create_topic(broker.bootstrap, topic, partitions=100)
    cs = [_consumer(broker.bootstrap, group, **{"session.timeout.ms": 30000}) for _ in range(20)]
    try:
        t0 = time.monotonic()
        for c in cs:
            c.subscribe([topic])
        ok = _poll_until(cs, lambda: all(len(_parts(c)) == 5 for c in cs), 90)
        assert ok, [len(_parts(c)) for c in cs]
        assert sorted(p for c in cs for p in _parts(c)) == list(range(100))
        print(f"20 consumers / 100 partitions stable after {time.monotonic() - t0:.1f}s")
    finally:
        for c in cs:
            c.close()


# -- kcat -G ----------------------------------------------------------------------------------

@needs_kcat
def test_kcat_balanced_consumer(broker):
    topic, group = _name("gkc"), _name("grp")
    create_topic(broker.bootstrap, topic, partitions=2)
    _fill(broker.bootstrap, topic, 2, 10)
    r = subprocess.run(["kcat", "-b", broker.bootstrap, "-G", group, "-o", "beginning", "-e",
                        "-X", "session.timeout.ms=6000", "-f", "%p:%o:%s\n", topic],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    lines = sorted(r.stdout.decode().split())
    assert lines == sorted(f"{p}:{i}:{p}-{i}" for p in range(2) for i in range(10))
    c = _consumer(broker.bootstrap, _name("other"))
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(2)], timeout=10)
    finally:
        c.close()
    # a different group has nothing; kcat's own group committed on exit
    assert [tp.offset for tp in committed] == [ck.OFFSET_INVALID] * 2
    c = _consumer(broker.bootstrap, group)
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(2)], timeout=10)
    finally:
        c.close()
    assert [tp.offset for tp in committed] == [10, 10]


# -- kafka-python and aiokafka ----------------------------------------------------------------

def test_kafka_python_group(broker):
    import kafka
    import threading

    topic, group = _name("gkp"), _name("grp")
    create_topic(broker.bootstrap, topic, partitions=4)
    _fill(broker.bootstrap, topic, 4, 5)
    conf = dict(bootstrap_servers=broker.bootstrap, group_id=group, auto_offset_reset="earliest",
                enable_auto_commit=False, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
    cs = [kafka.KafkaConsumer(topic, **conf) for _ in range(2)]
    got, lock, stop = [], threading.Lock(), threading.Event()
    at_end = {}  # consumer index -> has it read every partition it owns to the end (offset 5)?

    # One thread per consumer, as applications run them: kafka-python's poll() joins the
    # group inline, and a poll that times out in the middle of a join (two consumers
    # sharing one thread) can leave its heartbeat thread disabled (a client quirk).
    def loop(i, c):
        deadline = time.monotonic() + 40
        while not stop.is_set() and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                with lock:
                    got.extend(r.value for r in recs)
            owned = c.assignment()
            # on the consumer's own thread; a position not known within 1 s counts as not done
            try:
                done = bool(owned) and all(c.position(tp, timeout_ms=1000) == 5 for tp in owned)
            except kafka.errors.IllegalStateError:  # unassigned meanwhile: a rebalance
                done = False
            with lock:
                at_end[i] = done

    threads = [threading.Thread(target=loop, args=(i, c), daemon=True) for i, c in enumerate(cs)]
    try:
        for t in threads:
            t.start()
        # without commits, a partition that moves is read again by its next owner: wait until
        # each owner has read what it owns to the end, so the commits below are complete
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            with lock:
                done = len(at_end) == 2 and all(at_end.values())
            if done and all(len(c.assignment()) == 2 for c in cs):
                break
            stop.wait(0.1)
        stop.set()
        for t in threads:
            t.join(10)
        assert sorted(tp.partition for c in cs for tp in c.assignment()) == [0, 1, 2, 3]
        assert all(len(c.assignment()) == 2 for c in cs)
        assert set(got) == {b"%d-%d" % (p, i) for p in range(4) for i in range(5)}
        for c in cs:
            c.commit()
        assert [cs[0].committed(kafka.TopicPartition(topic, p)) for p in range(4)] == [5] * 4
    finally:
        stop.set()
        for c in cs:
            c.close()


def test_aiokafka_group(broker):
    import aiokafka
    topic, group = _name("gak"), _name("grp")
    create_topic(broker.bootstrap, topic, partitions=4)
    _fill(broker.bootstrap, topic, 4, 5)

    async def run():
        conf = dict(bootstrap_servers=broker.bootstrap, group_id=group, auto_offset_reset="earliest",
                    enable_auto_commit=False, session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
        cs = [aiokafka.AIOKafkaConsumer(topic, **conf) for _ in range(2)]
        got = []
        try:
            for c in cs:
                await c.start()
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                for c in cs:
                    batches = await c.getmany(timeout_ms=100)
                    for recs in batches.values():
                        got.extend(r.value for r in recs)
                # without commits a moved partition is read again by its next owner: stop when
                # every owner has read what it owns to the end, so the commits below are complete
                if all(len(c.assignment()) == 2 for c in cs):
                    try:
                        positions = [await c.position(tp) for c in cs for tp in c.assignment()]
                    except aiokafka.errors.IllegalStateError:  # unassigned meanwhile: a rebalance
                        continue
                    if positions == [5] * 4:
                        break
            parts = sorted(tp.partition for c in cs for tp in c.assignment())
            for c in cs:
                await c.commit()
            committed = [await cs[0].committed(aiokafka.TopicPartition(topic, p)) for p in range(4)]
            return parts, got, committed
        finally:
            for c in cs:
                await c.stop()

    parts, got, committed = asyncio.run(asyncio.wait_for(run(), 60))
    assert parts == [0, 1, 2, 3]
    assert set(got) == {b"%d-%d" % (p, i) for p in range(4) for i in range(5)}
    assert committed == [5] * 4

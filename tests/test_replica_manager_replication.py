"""A KRaft broker's ReplicaManager as a partition leader, without processes: a follower's
Fetch (replica id >= 0) is answered by the follower read (records up to the log end, a
diverging epoch, the follower's state), moves the high watermark and completes acks=all;
min.insync.replicas refuses acks=all before the append; the ISR shrink check proposes
dropping a follower that stopped fetching, and the committed answer lets the high
watermark move without it."""
from __future__ import annotations

import pytest

from kbroker.kernels import records as rec
from kbroker.metadata import records as R
from kbroker.metadata.image import TOPIC_RESOURCE
from kbroker.protocol import ErrorCode
from kbroker.server.delayed import FetchPartitionStatus
from kbroker.server.replica_manager import region_size
from kbroker.server.replication import MetadataBrokerRegistry

from tests.test_kraft_publisher import Node, T1

TP = ("a", 3)        # led by broker 1 (this node), replicas [1, 3], ISR [1, 3]


class FakeSender:
    """AlterPartitionSender's interface: proposals recorded, answered by the test."""

    def __init__(self):
        self.sent = []

    def submit(self, topic, topic_id, partition, leader_and_isr, on_done):
        self.sent.append((topic, partition, leader_and_isr, on_done))


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    rm = n.replica_manager
    rm.broker_registry = MetadataBrokerRegistry(lambda: n.image)
    rm.alter_partition = FakeSender()
    rm.replica_fetcher_manager = None
    try:
        yield n
    finally:
        n.close()


def _produce(rm, acks, timeout_ms=10000, value=b"v"):
    out = {}
    rm.append_records(timeout_ms, acks, {TP: bytearray(rec.encode_batch([(0, b"k", value, [])]))}, out.update,
                      produce_version=9)
    return out


def _follower_fetch(rm, offset, last_fetched_epoch=0, leader_epoch=0, broker_epoch=-1, max_wait_ms=0):
    out = {}
    st = FetchPartitionStatus(offset, 1 << 20, current_leader_epoch=leader_epoch, log_start_offset=0,
                              last_fetched_epoch=last_fetched_epoch, replica_epoch=broker_epoch)
    rm.fetch_messages(max_wait_ms, 1, 1 << 20, 0, [(TP, st)], out.update, replica_id=3)
    return out


def test_follower_fetch_moves_the_high_watermark_and_completes_acks_all(node):
    node.publisher.publish(None, node.image)
    rm = node.replica_manager
    part = rm.get_partition(TP)
    assert part.leader_state is not None and part.leader_state.is_leader
    assert part.log.leader_epoch_cache.latest_epoch == 0          # the new epoch's start, assigned at once
    waiting = _produce(rm, -1)
    assert waiting == {}                                           # acks=all waits for follower 3
    assert part.log.high_watermark == 0
    # the follower fetches from 0: gets the batch; the high watermark stays (its fetch offset is 0)
    r = _follower_fetch(rm, 0)[TP]
    assert r.error == ErrorCode.NONE and r.records is not None and r.high_watermark == 0
    assert waiting == {}
    # a follower whose last epoch ends elsewhere gets a diverging epoch, no records, at once
    r = _follower_fetch(rm, 5, last_fetched_epoch=0, max_wait_ms=5000)[TP]
    assert r.diverging_epoch == (0, 1) and r.records is None
    # its next fetch at 1 says it has the batch: the high watermark moves, acks=all answered
    _follower_fetch(rm, 1)
    assert part.log.high_watermark == 1
    assert waiting[TP].error == ErrorCode.NONE and waiting[TP].base_offset == 0
    # a follower fetch parks in the purgatory until a leader append (min_bytes 1)
    parked = _follower_fetch(rm, 1, max_wait_ms=10000)
    assert parked == {}
    assert _produce(rm, 1)[TP].error == ErrorCode.NONE
    assert parked[TP].records is not None and parked[TP].high_watermark == 1
    # stale or future leader epochs
    assert _follower_fetch(rm, 1, leader_epoch=1)[TP].error == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_min_insync_replicas_refuses_acks_all_before_the_append(node):
    node.publisher.publish(None, node.image)
    node.publish(R.ConfigRecord(resource_type=TOPIC_RESOURCE, resource_name="a", name="min.insync.replicas",
                                value="3"))
    rm = node.replica_manager
    r = _produce(rm, -1)[TP]
    assert r.error == ErrorCode.NOT_ENOUGH_REPLICAS
    assert rm.get_partition(TP).log.log_end_offset == 0            # nothing appended
    assert _produce(rm, 1)[TP].error == ErrorCode.NONE              # acks=1 still appends


def test_isr_shrink_proposal_then_committed_answer_moves_the_high_watermark(node, monkeypatch):
    import kbroker.server.replica_manager as rm_module
    clock = [1_700_000_000_000]
    monkeypatch.setattr(rm_module, "_now_ms", lambda: clock[0])
    node.replica_manager.replica_lag_time_max_ms = 50
    node.publisher.publish(None, node.image)
    rm = node.replica_manager
    part = rm.get_partition(TP)
    waiting = _produce(rm, -1)
    assert waiting == {}
    rm.maybe_shrink_isr()
    assert rm.alter_partition.sent == []             # follower 3 counts as caught up for 50 ms
    clock[0] += 100
    rm.maybe_shrink_isr()
    (topic, p, leader_and_isr, on_done), = rm.alter_partition.sent
    assert (topic, p, sorted(leader_and_isr.isr)) == ("a", 3, [1])
    assert part.isr == {1, 3} and waiting == {}       # acts on the committed change only
    from kbroker.cluster.partition_leader import LeaderAndIsr
    on_done(LeaderAndIsr(1, 0, ((1, -1),), leader_and_isr.partition_epoch + 1), ErrorCode.NONE)
    assert part.isr == {1}
    assert part.log.high_watermark == 1 and waiting[TP].error == ErrorCode.NONE
    # the metadata record of that change arrives later: same state
    node.publish(R.PartitionChangeRecord(topic_id=T1, partition_id=3, isr=[1]))
    assert rm.get_partition(TP).isr == {1} and rm.get_partition(TP).leader_state is part.leader_state


def test_follower_fetch_exceeds_max_bytes_only_by_the_first_partitions_first_batch(node):
    """KIP-74 for followers (replica.fetch.response.max.bytes): once the response's byte
    budget is spent, later partitions get no records, not one batch each."""
    from tests.test_kraft_publisher import T2, part as partition_record

    node.publisher.publish(None, node.image)
    node.publish(R.TopicRecord(name="b", topic_id=T2), partition_record(0, [1, 3], 1, topic=T2),
                 partition_record(1, [1, 3], 1, topic=T2))
    rm = node.replica_manager
    big = b"x" * 2000
    for p in (0, 1):
        out = {}
        rm.append_records(1000, 1, {("b", p): bytearray(rec.encode_batch([(0, b"k", big, [])]))}, out.update,
                          produce_version=9)
        assert out[("b", p)].error == ErrorCode.NONE
    out = {}
    infos = [(("b", p), FetchPartitionStatus(0, 1 << 20, current_leader_epoch=0, log_start_offset=0,
                                             last_fetched_epoch=-1)) for p in (0, 1)]
    rm.fetch_messages(0, 1, 500, 0, infos, out.update, replica_id=3)
    first, second = out[("b", 0)], out[("b", 1)]
    assert first.error == second.error == ErrorCode.NONE
    assert region_size(first.records) > 2000          # the first batch, whole
    assert region_size(second.records) == 0           # over the budget: nothing


class _FetchCtx:
    """What handle_fetch needs of a RequestContext: the answer, through the v17 codec."""
    api_version = 17
    authz = None
    quota_exempt = False

    def __init__(self):
        self.answers = []

    def respond(self, body):
        from kbroker.protocol.messages.fetch import FetchResponse

        for t in body.responses:
            for p in t.partitions:
                if p.records is not None and not isinstance(p.records, (bytes, bytearray)):
                    p.records = p.records.read_bytes()
        self.answers.append(FetchResponse.decode(body.encode(17), 17))


def test_follower_fetches_in_an_incremental_fetch_session(node, tmp_path):
    """KIP-227 for followers: the first Fetch is full and opens a (privileged) session in
    the leader's cache; the next ones list only the partitions whose fetch offset moved,
    the leader still reads every partition of the session (the follower's state, the high
    watermark) and answers only the ones with news; the follower's logs stay identical."""
    import types

    from kbroker.cluster.replica_fetcher import FetcherConfig, ReplicaFetcher
    from kbroker.log import LogConfig
    from kbroker.log.log import Log
    from kbroker.server.apis.fetch import handle_fetch
    from kbroker.server.fetch_session import FetchSessionCache
    from tests._log_util import read_all
    from tests.test_kraft_publisher import T2, part as partition_record

    node.publisher.publish(None, node.image)
    node.publish(R.TopicRecord(name="b", topic_id=T2), partition_record(0, [1, 3], 1, topic=T2),
                 partition_record(1, [1, 3], 1, topic=T2))
    rm = node.replica_manager
    rm.replica_fetcher_manager = object()            # a replicating broker
    broker = types.SimpleNamespace(replica_manager=rm, metadata=node.metadata_cache,
                                   fetch_sessions=FetchSessionCache(), config={"fetch.max.bytes": 50 << 20})
    b0, b1 = ("b", 0), ("b", 1)
    acked = {}
    rm.append_records(10000, -1, {b0: bytearray(rec.encode_batch([(0, b"k", b"x0", [])]))}, acked.update,
                      produce_version=9)
    assert acked == {}
    out = {}
    rm.append_records(1000, 1, {b1: bytearray(rec.encode_batch([(0, b"k", b"y0", [])]))}, out.update,
                      produce_version=9)
    f = ReplicaFetcher(3, 1, lambda: -1, FetcherConfig(wait_max_ms=0))
    logs = {tp: Log.open(str(tmp_path / "follower" / f"b-{tp[1]}"), LogConfig({})) for tp in (b0, b1)}
    for tp, lg in logs.items():
        f.add_partition(tp, T2, 0, lg)

    def round_trip():
        req = f.poll(0)
        listed = sorted(p.partition for t in req.topics for p in t.partitions)
        forgotten = sorted(p for t in req.forgotten_topics_data for p in t.partitions)
        ctx = _FetchCtx()
        handle_fetch(broker, ctx, req)
        (resp,) = ctx.answers
        answered = sorted(p.partition_index for t in resp.responses for p in t.partitions)
        return req, listed, forgotten, resp, answered, f.on_fetch_response(0, resp)

    req, listed, forgotten, resp, answered, outcome = round_trip()
    assert (req.session_id, req.session_epoch, listed) == (0, 0, [0, 1])         # full: opens a session
    sid = resp.session_id
    assert sid > 0 and answered == [0, 1] and outcome == {b0: "appended", b1: "appended"}
    assert broker.fetch_sessions.count(privileged=True) == 1 and broker.fetch_sessions.count(privileged=False) == 0
    # both fetch offsets moved: both listed; the leader learns them, the high watermarks move
    req, listed, forgotten, resp, answered, outcome = round_trip()
    assert (req.session_id, req.session_epoch, listed, forgotten) == (sid, 1, [0, 1], [])
    assert rm.get_partition(b0).log.high_watermark == 1 and acked[b0].error == ErrorCode.NONE
    # new records in b-0 only: nothing changed on the follower's side, nothing listed; the
    # leader answers b-0's records and both new high watermarks
    rm.append_records(1000, 1, {b0: bytearray(rec.encode_batch([(0, b"k", b"x1", [])]))}, out.update,
                      produce_version=9)
    req, listed, forgotten, resp, answered, outcome = round_trip()
    assert (req.session_epoch, listed, answered) == (2, [], [0, 1])
    assert outcome == {b0: "appended", b1: "empty"}
    # only b-0's offset moved: only b-0 listed; b-1 is still read at its cached offset
    req, listed, forgotten, resp, answered, outcome = round_trip()
    assert (req.session_epoch, listed) == (3, [0])
    assert rm.get_partition(b0).log.high_watermark == 2
    for tp, lg in logs.items():
        assert read_all(lg) == read_all(rm.get_partition(tp).log)
    # a partition no longer fetched is forgotten
    f.remove_partition(b1)
    req, listed, forgotten, resp, answered, outcome = round_trip()
    assert (req.session_epoch, listed, forgotten) == (4, [], [1])
    assert list(broker.fetch_sessions._sessions[sid].partitions) == [(T2, 0)]
    # a session error (the leader lost the session): the next Fetch is full, at once
    broker.fetch_sessions._sessions.clear()
    req, listed, forgotten, resp, answered, outcome = round_trip()
    assert resp.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND and outcome == {b0: "session"}
    req, listed, forgotten, resp, answered, outcome = round_trip()
    assert (req.session_id, req.session_epoch, listed) == (0, 0, [0])
    assert resp.session_id > 0 and broker.fetch_sessions.count(privileged=True) == 1

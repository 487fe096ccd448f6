"""ReplicaFetcher (a follower's fetch loop) against the leader's follower-fetch path
(kbroker/cluster/follower_fetch.py), with real Logs in temp dirs and every Fetch
going through its v17 codec."""
import threading
import uuid

import pytest

from kbroker.cluster.follower_fetch import handle_follower_fetch, read_for_follower
from kbroker.cluster.partition_leader import PartitionLeader
from kbroker.cluster.replica_fetcher import FetcherConfig, FetchStateKind, ReplicaFetcher, complete_batches
from kbroker.kernels import records
from kbroker.log import LogConfig
from kbroker.log.log import Log
from kbroker.protocol import ErrorCode
from kbroker.protocol.messages.fetch import (
    EpochEndOffset, FetchableTopicResponse, FetchRequest, FetchResponse, PartitionData,
)
from tests._log_util import Clock, read_all

TID = uuid.UUID(int=7)
TP = ("t", 0)
V = 17


def open_log(path):
    return Log.open(str(path), LogConfig({"segment.bytes": 600}), time_ms=Clock())


def produce(lg, n, epoch, pid=-1, seq=-1):
    kw = dict(producer_id=pid, producer_epoch=0, base_sequence=seq) if pid >= 0 else {}
    buf = bytearray(records.encode_batch([(Clock().now, b"k", b"v%d" % i, []) for i in range(n)], **kw))
    return lg.append_as_leader(buf, leader_epoch=epoch)


class Registry:
    def alive_broker_epoch(self, b):
        return 10 + b

    def is_fenced(self, b):
        return False

    def is_shutting_down(self, b):
        return False


def leader_for(lg, epoch, isr=(1, 2)):
    pl = PartitionLeader(1, Registry(), replica_lag_time_max_ms=1000, local_broker_epoch=11)
    lg.assign_epoch_start_offset(epoch, lg.log_end_offset)
    pl.make_leader(0, leader_epoch=epoch, partition_epoch=epoch, replicas=(1, 2), isr=isr,
                   leader_end_offset=lg.log_end_offset)
    return pl


def serve(pl, lg, req_bytes, now=0):
    """The leader answers a Fetch (as bytes, decoded at v17) the way a broker would."""
    req = FetchRequest.decode(req_bytes, V)
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            r = handle_follower_fetch(pl, lg, now, replica_id=req.replica_state.replica_id,
                                      broker_epoch=req.replica_state.replica_epoch,
                                      current_leader_epoch=p.current_leader_epoch, fetch_offset=p.fetch_offset,
                                      last_fetched_epoch=p.last_fetched_epoch, log_start_offset=p.log_start_offset,
                                      max_bytes=p.partition_max_bytes)
            d = r.data
            d.partition_index = p.partition
            if d.records is not None and not isinstance(d.records, (bytes, bytearray)):
                d.records = d.records.read_bytes()
            parts.append(d)
        topics.append(FetchableTopicResponse(topic_id=t.topic_id, partitions=parts))
    return FetchResponse.decode(FetchResponse(responses=topics).encode(V), V)


def round_trip(f, pl, lg, now=0):
    req = f.poll(now)
    assert req is not None
    return f.on_fetch_response(now, serve(pl, lg, req.encode(V), now))


def test_fetch_request_carries_kafkas_v17_fields(tmp_path):
    cfg = FetcherConfig(wait_max_ms=250, min_bytes=3, response_max_bytes=5000, max_bytes=700, backoff_ms=40)
    f = ReplicaFetcher(2, 1, lambda: 12, cfg)
    flog = open_log(tmp_path / "f" / "t-0")
    flog.append_as_follower(records.encode_batch([(1, b"k", b"v", [])], partition_leader_epoch=3))
    f.add_partition(TP, TID, 4, flog)
    req = FetchRequest.decode(f.poll(0).encode(V), V)
    assert (req.replica_state.replica_id, req.replica_state.replica_epoch) == (2, 12)
    assert (req.max_wait_ms, req.min_bytes, req.max_bytes) == (250, 3, 5000)
    (t,) = req.topics
    (p,) = t.partitions
    assert t.topic_id == TID
    assert (p.partition, p.current_leader_epoch, p.fetch_offset, p.last_fetched_epoch, p.log_start_offset,
            p.partition_max_bytes) == (0, 4, 1, 3, 0, 700)
    assert f.poll(0) is None            # one Fetch in flight


def test_follower_copies_the_leader_and_takes_its_high_watermark(tmp_path):
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    produce(llog, 3, 0)
    pl = leader_for(llog, 1)
    produce(llog, 2, 1, pid=9, seq=0)
    f = ReplicaFetcher(2, 1, lambda: 12, FetcherConfig(max_bytes=10_000))
    f.add_partition(TP, TID, 1, flog)
    assert round_trip(f, pl, llog) == {TP: "appended"}
    assert read_all(flog) == read_all(llog)
    assert flog.leader_epoch_cache.epoch_entries() == [(0, 0), (1, 3)]
    assert flog.producer_state.last_entry(9).last_seq == 1
    assert llog.high_watermark == 0 and flog.high_watermark == 0
    # the leader learned the follower's end at its next fetch: high watermark 5
    assert round_trip(f, pl, llog) == {TP: "empty"}
    assert llog.high_watermark == 5
    assert flog.high_watermark == 0            # the answer carried the one before
    round_trip(f, pl, llog)
    assert flog.high_watermark == 5
    assert f.state(TP).last_fetched_epoch == 1 and f.state(TP).fetch_offset == 5


def test_leader_high_watermark_waits_for_the_isr_only(tmp_path):
    llog = open_log(tmp_path / "l" / "t-0")
    pl = leader_for(llog, 1, isr=(1,))             # follower 2 out of sync
    produce(llog, 4, 1)
    from kbroker.cluster.follower_fetch import maybe_increment_high_watermark
    assert maybe_increment_high_watermark(pl, llog, 0) == 4
    # a fetch from 2 at the high watermark proposes it into the ISR
    r = handle_follower_fetch(pl, llog, 10, replica_id=2, broker_epoch=12, current_leader_epoch=1,
                              fetch_offset=4, last_fetched_epoch=1, log_start_offset=0, max_bytes=1000)
    assert r.proposal is not None and r.proposal.new_in_sync_replica_id == 2


def test_diverging_epoch_truncates_the_follower_then_it_catches_up(tmp_path):
    """The follower led epoch 1 and wrote 0..5 of which only 0..2 reached the new
    leader; the new leader (epoch 2) wrote 3..4. The follower must drop its 3..5."""
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    produce(flog, 3, 1)
    llog.append_as_follower(flog.read(0, 10_000).records.read_bytes())
    produce(flog, 3, 1)                             # never replicated
    pl = leader_for(llog, 2)
    produce(llog, 2, 2)
    f = ReplicaFetcher(2, 1, lambda: 12)
    f.add_partition(TP, TID, 2, flog)
    assert f.state(TP).last_fetched_epoch == 1 and f.state(TP).fetch_offset == 6
    assert round_trip(f, pl, llog) == {TP: "truncated"}
    assert flog.log_end_offset == 3 and f.state(TP).fetch_offset == 3
    assert pl.remote[2].log_end_offset == -1        # a diverged fetch does not count
    assert round_trip(f, pl, llog) == {TP: "appended"}
    assert read_all(flog) == read_all(llog)
    assert flog.leader_epoch_cache.epoch_entries() == [(1, 0), (2, 3)]


def test_diverging_epoch_the_follower_never_had(tmp_path):
    """Follower epochs 1, 3; leader epochs 1, 2: the leader answers (1, end of 1 here);
    the follower has epoch 1 too and cuts at the smaller end."""
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    produce(llog, 2, 1)
    flog.append_as_follower(llog.read(0, 10_000).records.read_bytes())
    produce(flog, 2, 3)
    produce(llog, 2, 2)
    f = ReplicaFetcher(2, 1, lambda: 12)
    f.add_partition(TP, TID, 4, flog)
    pl = leader_for(llog, 4)
    p, _ = read_for_follower(llog, leader_epoch=4, current_leader_epoch=4, fetch_offset=4, last_fetched_epoch=3,
                             max_bytes=1000)
    assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (2, 4)
    assert round_trip(f, pl, llog) == {TP: "truncated"}
    # we have no epoch 2: cut to where our largest epoch below it (1) ends, ask again
    assert flog.log_end_offset == 2 and f.state(TP).last_fetched_epoch == 1
    assert round_trip(f, pl, llog) == {TP: "appended"}
    assert read_all(flog) == read_all(llog)


def test_epoch_errors(tmp_path):
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    pl = leader_for(llog, 5)
    f = ReplicaFetcher(2, 1, lambda: 12, FetcherConfig(backoff_ms=100))
    f.add_partition(TP, TID, 6, flog)                 # we know a newer epoch than the leader
    assert round_trip(f, pl, llog, now=0) == {TP: "backoff"}
    assert f.poll(50) is None and f.next_deadline_ms() == 100
    f.add_partition(TP, TID, 4, flog)                 # stale metadata: ignored
    assert f.state(TP).current_leader_epoch == 6
    f.remove_partition(TP)
    f.add_partition(TP, TID, 4, flog)                 # now older than the leader's
    assert round_trip(f, pl, llog, now=200) == {TP: "fenced"}
    assert f.poll(10_000) is None and f.next_deadline_ms() is None
    f.add_partition(TP, TID, 5, flog)                 # new metadata
    assert f.state(TP).state is FetchStateKind.FETCHING
    assert round_trip(f, pl, llog, now=300) == {TP: "empty"}
    pl.make_follower()
    assert round_trip(f, pl, llog, now=400) == {TP: "backoff"}    # NOT_LEADER_OR_FOLLOWER
    assert f.state(TP).delayed_until_ms == 400 + 100


def test_failed_request_backs_off_and_stale_answers_are_ignored(tmp_path):
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    pl = leader_for(llog, 1)
    produce(llog, 2, 1)
    f = ReplicaFetcher(2, 1, lambda: 12, FetcherConfig(backoff_ms=100))
    f.add_partition(TP, TID, 1, flog)
    f.poll(0)
    assert f.on_fetch_response(5, None) == {TP: "backoff"}
    assert f.poll(50) is None
    req = f.poll(105)
    resp = serve(pl, llog, req.encode(V))
    f.remove_partition(TP)
    f.add_partition(TP, TID, 2, flog)                 # re-added meanwhile
    assert f.on_fetch_response(110, resp) == {TP: "stale"}
    assert flog.log_end_offset == 0


def test_corrupt_data_from_the_leader_is_refused_and_retried(tmp_path):
    flog = open_log(tmp_path / "f" / "t-0")
    f = ReplicaFetcher(2, 1, lambda: 12, FetcherConfig(backoff_ms=100))
    f.add_partition(TP, TID, 1, flog)
    f.poll(0)
    bad = bytearray(records.encode_batch([(1, b"k", b"v", [])], partition_leader_epoch=1))
    bad[-1] ^= 1
    resp = FetchResponse(responses=[FetchableTopicResponse(topic_id=TID, partitions=[
        PartitionData(partition_index=0, high_watermark=1, log_start_offset=0, records=bytes(bad))])])
    assert f.on_fetch_response(0, resp) == {TP: "backoff"}
    assert flog.log_end_offset == 0 and f.state(TP).delayed_until_ms == 100


@pytest.mark.parametrize("case", ["behind_start", "ahead_of_end"])
def test_offset_out_of_range(tmp_path, case):
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    if case == "behind_start":
        llog.truncate_fully_and_start_at(50)          # the leader's log starts at 50
        pl = leader_for(llog, 1)
        produce(llog, 2, 1)
    else:
        produce(flog, 5, 0)                           # an unclean leader has less than we do
        pl = leader_for(llog, 1)
        produce(llog, 2, 1)
        flog.leader_epoch_cache.clear()               # (no epochs: no diverging-epoch check)
    f = ReplicaFetcher(2, 1, lambda: 12)
    f.add_partition(TP, TID, 1, flog)
    assert round_trip(f, pl, llog) == {TP: "out_of_range"}
    assert f.poll(0) is None and f.offset_queries() == [(TP, 1)]
    assert f.on_leader_offsets(0, TP, 1, llog.log_start_offset, llog.log_end_offset) == "truncated"
    if case == "behind_start":
        assert (flog.log_start_offset, flog.log_end_offset) == (50, 50)
    else:
        assert flog.log_end_offset == 0           # 2 is inside our batch 0..4: all of it goes
    assert round_trip(f, pl, llog) == {TP: "appended"}
    assert flog.log_end_offset == llog.log_end_offset


def test_complete_batches_drops_a_partial_tail():
    b = records.encode_batch([(1, b"k", b"v", [])])
    assert bytes(complete_batches(b + b[:20])) == b
    assert bytes(complete_batches(b[:5])) == b""


def test_follower_takes_the_leaders_log_start_offset_up_to_its_high_watermark(tmp_path):
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    pl = leader_for(llog, 1)
    produce(llog, 3, 1)
    produce(llog, 3, 1)
    f = ReplicaFetcher(2, 1, lambda: 12)
    f.add_partition(TP, TID, 1, flog)
    round_trip(f, pl, llog)
    round_trip(f, pl, llog)
    assert llog.high_watermark == 6
    llog.delete_records(4)                  # DeleteRecords on the leader
    round_trip(f, pl, llog)
    assert (flog.high_watermark, flog.log_start_offset) == (6, 4)
    req = FetchRequest.decode(f.poll(0).encode(V), V)
    assert req.topics[0].partitions[0].log_start_offset == 4


def test_an_empty_follower_whose_start_falls_inside_the_leaders_first_batch(tmp_path):
    """DeleteRecords left the leader's log start (2) inside its batch 0..4: the empty
    follower restarted at 2 gets that whole batch and restarts its log at 0 to take it
    (Kafka's UnexpectedAppendOffsetException handling)."""
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    pl = leader_for(llog, 1, isr=(1,))
    produce(llog, 5, 1)
    from kbroker.cluster.follower_fetch import maybe_increment_high_watermark
    maybe_increment_high_watermark(pl, llog, 0)
    llog.delete_records(2)
    f = ReplicaFetcher(2, 1, lambda: 12)
    f.add_partition(TP, TID, 1, flog)
    assert round_trip(f, pl, llog) == {TP: "out_of_range"}
    f.on_leader_offsets(0, TP, 1, llog.log_start_offset, llog.log_end_offset)
    assert (flog.log_start_offset, flog.log_end_offset) == (2, 2)
    assert round_trip(f, pl, llog) == {TP: "appended"}
    assert flog.log_end_offset == 5 and read_all(flog, 2) == read_all(llog, 2)
    round_trip(f, pl, llog)
    assert (flog.log_start_offset, flog.high_watermark) == (2, 5)


def test_a_follower_below_the_leaders_log_start_joins_the_isr_only_after_taking_it(tmp_path):
    """Below the leader's log start the diverging-epoch check sees nothing (the leader's
    epoch cache starts there): a follower joins the ISR once its log start caught up."""
    llog = open_log(tmp_path / "l" / "t-0")
    pl = leader_for(llog, 1, isr=(1,))
    produce(llog, 5, 1)
    from kbroker.cluster.follower_fetch import maybe_increment_high_watermark
    maybe_increment_high_watermark(pl, llog, 0)
    llog.delete_records(5)
    kw = dict(replica_id=2, broker_epoch=12, current_leader_epoch=1, fetch_offset=5, last_fetched_epoch=1,
              max_bytes=1000)
    r = handle_follower_fetch(pl, llog, 10, log_start_offset=0, **kw)
    assert r.proposal is None and r.data.log_start_offset == 5
    r = handle_follower_fetch(pl, llog, 20, log_start_offset=5, **kw)
    assert r.proposal is not None and r.proposal.new_in_sync_replica_id == 2


class FakeSendThread:
    """InterNodeSendThread's interface: each send recorded with the thread that made it;
    the test answers through the recorded callback."""

    def __init__(self, name, nodes, config):
        self.sent = []
        self.cond = threading.Condition()

    def send(self, node_id, api_key, request, callback, *, timeout_s=None, version=None):
        with self.cond:
            self.sent.append((threading.current_thread(), request, callback))
            self.cond.notify_all()

    def close(self, timeout_s=5.0):
        pass


def test_fetcher_thread_sends_the_next_fetch_from_the_answer_without_a_thread_hop(tmp_path, monkeypatch):
    """The answer's callback (the send thread) appends and sends the next Fetch, carrying
    the new fetch offset, before it returns: the leader's high watermark (and acks=all)
    waits for that fetch, so no wake-up of the fetcher thread may sit in between."""
    import kbroker.server.replica_fetcher_manager as rfm

    monkeypatch.setattr(rfm, "InterNodeSendThread", FakeSendThread)
    llog, flog = open_log(tmp_path / "l" / "t-0"), open_log(tmp_path / "f" / "t-0")
    pl = leader_for(llog, 0)
    produce(llog, 3, 0)
    t = rfm.ReplicaFetcherThread("fetcher", 2, 1, ("127.0.0.1", 1), lambda: 12, FetcherConfig(max_bytes=10_000), 30000)
    try:
        t.add_partition(TP, TID, 0, flog)
        sender = t.sender
        with sender.cond:
            assert sender.cond.wait_for(lambda: sender.sent, 30)
        thread, req, cb = sender.sent[0]
        assert thread is not threading.current_thread()          # the first one: the fetcher thread
        cb(serve(pl, llog, req.encode(V)), None)
        assert read_all(flog) == read_all(llog)
        assert len(sender.sent) == 2
        thread, req, cb = sender.sent[1]
        assert thread is threading.current_thread()              # sent from the callback
        assert req.topics[0].partitions[0].fetch_offset == 3
        cb(serve(pl, llog, req.encode(V)), None)                 # the leader learns the follower's end
        assert llog.high_watermark == 3
        # a failed request: the partition backs off, the fetcher thread takes over (no send here)
        thread, req, cb = sender.sent[2]
        cb(None, ConnectionError("gone"))
        assert len(sender.sent) == 3 and t.fetcher.state(TP).delayed_until_ms > 0
    finally:
        t.stop()


def test_a_leader_elected_uncleanly_proposes_its_isr_expansions_as_recovered(tmp_path):
    """KIP-704: the controller marks an unclean election RECOVERING and refuses an ISR of
    more than the leader in that state; the new leader takes the partition as RECOVERED
    (Kafka's makeLeader), so the followers that truncated to its log can rejoin."""
    llog = open_log(tmp_path / "l" / "t-0")
    pl = PartitionLeader(1, Registry(), replica_lag_time_max_ms=1000, local_broker_epoch=11)
    llog.assign_epoch_start_offset(3, 0)
    pl.make_leader(0, leader_epoch=3, partition_epoch=5, replicas=(1, 2), isr=(1,), leader_end_offset=0,
                   leader_recovery_state=1)
    produce(llog, 2, 3)
    from kbroker.cluster.follower_fetch import maybe_increment_high_watermark
    maybe_increment_high_watermark(pl, llog, 0)
    r = handle_follower_fetch(pl, llog, 10, replica_id=2, broker_epoch=12, current_leader_epoch=3,
                              fetch_offset=2, last_fetched_epoch=3, log_start_offset=0, max_bytes=1000)
    assert r.proposal is not None
    assert r.proposal.sent.isr == {1, 2} and r.proposal.sent.leader_recovery_state == 0

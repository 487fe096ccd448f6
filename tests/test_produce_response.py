"""The all-success Produce answer encoded in one pass (server.apis.produce_response)
is byte for byte what the generated ProduceResponse codec writes, at every version the
broker serves (3-12), and anything else is left to the codec."""
import pytest

from kbroker.protocol import ErrorCode as E
from kbroker.protocol.messages.produce import ProduceResponse
from kbroker.server.apis.produce import HANDLERS, _response
from kbroker.server.apis.produce_response import encode_success_response
from kbroker.server.replica_manager import ProducePartitionResult

VERSIONS = range(3, 13)


def _shapes():
    """(by_topic, results) answers of several shapes: one partition; two topics; a topic
    name needing a two-byte compact length and non-ASCII; 200 partitions (a two-byte
    compact array count); LogAppendTime and large offsets; a partition named twice."""
    def ok(base, append_time=-1, start=0):
        return ProducePartitionResult(E.NONE, base, append_time, start, last_offset=base + 15)

    yield {"t": [("t", 0)]}, {("t", 0): ok(0)}
    yield ({"a": [("a", 3), ("a", 1)], "b": [("b", 0)]},
           {("a", 3): ok(16), ("a", 1): ok(2**40, 1_700_000_000_000, 7), ("b", 0): ok(5)})
    long = "é" * 70 + "x" * 10        # 150 bytes in UTF-8
    yield {long: [(long, 2)]}, {(long, 2): ok(9, 1_700_000_000_123, 3)}
    many = [("m", i) for i in range(200)]
    yield {"m": many}, {tp: ok(tp[1] * 16) for tp in many}
    yield {"d": [("d", 0), ("d", 0)]}, {("d", 0): ok(1)}


@pytest.mark.parametrize("v", VERSIONS)
def test_success_bytes_match_the_generated_codec(v):
    assert (HANDLERS[0].min_version, HANDLERS[0].max_version) == (3, 12)
    for by_topic, results in _shapes():
        generic = _response(None, None, v, by_topic, results)
        assert encode_success_response(v, by_topic, results) == generic.encode(v)
        # and it reads back as the same answer
        back = ProduceResponse.decode(encode_success_response(v, by_topic, results), v)
        assert [(t.name, [(p.index, p.error_code, p.base_offset) for p in t.partition_responses])
                for t in back.responses] == [(n, [(tp[1], 0, results[tp].base_offset) for tp in tps])
                                             for n, tps in by_topic.items()]


@pytest.mark.parametrize("v", VERSIONS)
def test_anything_but_plain_success_is_left_to_the_codec(v):
    ok = ProducePartitionResult(E.NONE, 0, -1, 0, last_offset=0)
    for bad in (ProducePartitionResult(E.NOT_LEADER_OR_FOLLOWER),
                ProducePartitionResult(E.INVALID_RECORD, log_start_offset=0, error_message="bad",
                                       record_errors=[(0, "bad")]),
                ProducePartitionResult(E.NONE, 0, -1, 0, record_errors=[(0, "x")])):
        assert encode_success_response(v, {"t": [("t", 0), ("t", 1)]}, {("t", 0): ok, ("t", 1): bad}) is None


@pytest.fixture
def broker(tmp_path):
    import types
    import uuid

    from kbroker.log.manager import LogManager
    from kbroker.server.metadata import TopicImage
    from kbroker.server.purgatory import DelayedOperationPurgatory
    from kbroker.server.replica_manager import ReplicaManager

    lm = LogManager([str(tmp_path)], background=False)
    lm.startup()
    rm = ReplicaManager(None, lm, 0, DelayedOperationPurgatory("Produce", reaper_enabled=False),
                        DelayedOperationPurgatory("Fetch", reaper_enabled=False))
    rm.apply_topic(TopicImage("t", uuid.uuid4(), 2))
    yield types.SimpleNamespace(replica_manager=rm, metadata_cache=None, authorizer=None)
    lm.shutdown()


def _handle(broker, v, on_response=None, partitions=(0, 1, 5)):
    """Run handle_produce on one request; (the frame's body, what on_response got)."""
    import types

    from kbroker.kernels import records as rec
    from kbroker.protocol.headers import RequestHeader
    from kbroker.protocol.messages import produce as pr
    from kbroker.server.apis.produce import handle_produce
    from kbroker.server.request_context import RequestContext

    batch = rec.encode_batch([(1_700_000_000_000, b"k", b"v", [])])
    req = pr.ProduceRequest(acks=-1, timeout_ms=1000, topic_data=[pr.TopicProduceData(name="t", partition_data=[
        pr.PartitionProduceData(index=i, records=bytearray(batch)) for i in partitions])])
    sent, handed = [], []

    class Channel:
        def send_response(self, request, parts, *throttle):
            sent.append(b"".join(bytes(p) for p in parts))

    header = RequestHeader(request_api_key=0, request_api_version=v, correlation_id=9, client_id="c")
    request = types.SimpleNamespace(payload=req.encode(v), connection_id="c1", client_address=None)
    ctx = RequestContext(request, header, Channel(),
                         on_response=(lambda c, body: handed.append(body)) if on_response else None)
    handle_produce(broker, ctx, req)
    (frame,) = sent
    return frame[8 + (v >= 9):], handed    # size, correlation id, (v9+) header tags


@pytest.mark.parametrize("v", [3, 8, 9, 12])
def test_the_handler_answers_through_either_path_with_the_same_bytes(broker, v):
    """Plain successes take the one-pass encoding; a partition error (an unknown
    partition), or a context that wants the response object, the generic codec. The
    offsets go on from one request to the next."""
    fast, handed = _handle(broker, v, partitions=(0, 1))
    assert handed == []
    r = ProduceResponse.decode(fast, v)
    assert [(p.index, p.error_code, p.base_offset) for p in r.responses[0].partition_responses] == [(0, 0, 0), (1, 0, 0)]
    generic, handed = _handle(broker, v, on_response=True, partitions=(0, 1))
    assert len(handed) == 1 and handed[0].encode(v) == generic
    assert [p.base_offset for p in ProduceResponse.decode(generic, v).responses[0].partition_responses] == [1, 1]
    mixed, handed = _handle(broker, v)
    r = ProduceResponse.decode(mixed, v)
    assert [(p.index, p.error_code, p.base_offset) for p in r.responses[0].partition_responses] == [
        (0, 0, 2), (1, 0, 2), (5, E.UNKNOWN_TOPIC_OR_PARTITION, -1)]

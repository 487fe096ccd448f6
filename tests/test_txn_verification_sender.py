"""KIP-890 part 1 on the leader: the verifier's error mapping and the verify_only
AddPartitionsToTxn sender's batching (kbroker/server/txn_verification.py), with a fake
inter-node sender."""
from kbroker.protocol import ErrorCode as E
from kbroker.protocol.messages import add_partitions_to_txn as apt
from kbroker.server.txn_verification import (
    AddPartitionsToTxnSender, TransactionVerifier, map_coordinator_error, produce_result_for,
)


class FakeSend:
    def __init__(self):
        self.sent = []   # (node, request, callback)

    def send(self, node, api_key, request, callback, timeout_s=None):
        self.sent.append((node, request, callback))


def _sender():
    s = AddPartitionsToTxnSender(lambda: {5: ("127.0.0.1", 1)})
    fake = FakeSend()
    s._sender_for_send = lambda: fake
    return s, fake


def _answer(request, codes=None, error_code=0):
    """A response to ``request``: ``codes`` {(tid, topic, partition): code}, default NONE."""
    codes = codes or {}
    results = []
    for t in request.transactions:
        results.append(apt.AddPartitionsToTxnResult(transactional_id=t.transactional_id, topic_results=[
            apt.AddPartitionsToTxnTopicResult(name=topic.name, results_by_partition=[
                apt.AddPartitionsToTxnPartitionResult(
                    partition_index=p, partition_error_code=codes.get((t.transactional_id, topic.name, p), 0))
                for p in topic.partitions]) for topic in t.topics]))
    return apt.AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=error_code, results_by_transaction=results)


def test_one_request_in_flight_per_node_and_the_rest_batched():
    s, fake = _sender()
    got = {}
    s.verify(5, "a", 1, 0, [("t", 0)], lambda e: got.setdefault("a", e))
    s.verify(5, "b", 2, 0, [("t", 1), ("u", 0)], lambda e: got.setdefault("b", e))
    s.verify(5, "c", 3, 0, [("t", 2)], lambda e: got.setdefault("c", e))
    assert len(fake.sent) == 1                    # b and c wait for a's answer
    node, req, cb = fake.sent[0]
    assert node == 5 and [t.transactional_id for t in req.transactions] == ["a"]
    assert req.transactions[0].verify_only
    cb(_answer(req), None)
    assert got == {"a": {("t", 0): E.NONE}}
    _, req2, cb2 = fake.sent[1]                   # b and c in one request
    assert sorted(t.transactional_id for t in req2.transactions) == ["b", "c"]
    cb2(_answer(req2, {("b", "u", 0): E.TRANSACTION_ABORTABLE}), None)
    assert got["b"] == {("t", 1): E.NONE, ("u", 0): E.TRANSACTION_ABORTABLE}
    assert got["c"] == {("t", 2): E.NONE}
    assert len(fake.sent) == 2


def test_a_queued_transactional_id_seen_again():
    s, fake = _sender()
    got = []
    s.verify(5, "busy", 9, 0, [("t", 0)], lambda e: None)            # in flight
    s.verify(5, "x", 1, 3, [("t", 0)], lambda e: got.append(("old", e)))
    s.verify(5, "x", 1, 3, [("t", 0)], lambda e: got.append(("retry", e)))    # same epoch: NETWORK_EXCEPTION
    assert got == [("old", {("t", 0): E.NETWORK_EXCEPTION})]
    s.verify(5, "x", 1, 2, [("t", 0)], lambda e: got.append(("stale", e)))    # lower epoch: refused at once
    assert got[-1] == ("stale", {("t", 0): E.INVALID_PRODUCER_EPOCH})
    s.verify(5, "x", 1, 4, [("t", 0)], lambda e: got.append(("new", e)))      # higher epoch fences the queued
    assert got[-1] == ("retry", {("t", 0): E.INVALID_PRODUCER_EPOCH})


def test_failed_requests():
    s, fake = _sender()
    got = []
    s.verify(5, "a", 1, 0, [("t", 0)], got.append)
    fake.sent[0][2](None, TimeoutError("no answer"))
    assert got[-1] == {("t", 0): E.NETWORK_EXCEPTION}
    s.verify(5, "a", 1, 0, [("t", 0)], got.append)
    req = fake.sent[1][1]
    fake.sent[1][2](_answer(req, error_code=E.CLUSTER_AUTHORIZATION_FAILED), None)
    assert got[-1] == {("t", 0): E.INVALID_TXN_STATE}
    s.verify(5, "a", 1, 0, [("t", 0)], got.append)       # in flight
    s.verify(5, "b", 1, 0, [("t", 1)], got.append)       # queued behind it
    s.close()                                             # what is queued fails (retriable)
    assert got[-1] == {("t", 1): E.NETWORK_EXCEPTION}


def test_error_mapping_for_the_producer():
    assert map_coordinator_error(E.PRODUCER_FENCED, True) == E.INVALID_PRODUCER_EPOCH
    assert map_coordinator_error(E.TRANSACTION_ABORTABLE, False) == E.INVALID_TXN_STATE
    assert map_coordinator_error(E.TRANSACTION_ABORTABLE, True) == E.TRANSACTION_ABORTABLE
    for retriable in (E.CONCURRENT_TRANSACTIONS, E.NETWORK_EXCEPTION, E.COORDINATOR_LOAD_IN_PROGRESS,
                      E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR):
        r = produce_result_for(retriable)
        assert r.error == E.NOT_ENOUGH_REPLICAS and retriable.name in r.error_message
    assert produce_result_for(E.INVALID_TXN_STATE).error_message == "Partition was not added to the transaction"


def test_the_verifier_asks_the_local_coordinator_or_the_sender():
    class Coordinator:
        def handle_verify_partitions(self, tid, pid, epoch, partitions):
            return {tp: E.PRODUCER_FENCED for tp in partitions}

    s, fake = _sender()
    v = TransactionVerifier(1, lambda: True, lambda tid: {"here": 1, "there": 5}.get(tid), Coordinator, s)
    got = []
    v.verify("here", 7, 0, [("t", 0)], got.append, True)
    assert got == [{("t", 0): E.INVALID_PRODUCER_EPOCH}] and not fake.sent
    v.verify("there", 7, 0, [("t", 0)], got.append, False)
    assert fake.sent[0][0] == 5
    v.verify("nowhere", 7, 0, [("t", 0)], got.append, False)
    assert got[-1] == {("t", 0): E.COORDINATOR_NOT_AVAILABLE}

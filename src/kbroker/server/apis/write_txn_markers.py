"""WriteTxnMarkers (api 27): the transaction coordinator asks each partition leader to
write the COMMIT or ABORT marker that ends a producer's transaction there.

Kafka: ``KafkaApis.handleWriteTxnMarkersRequest``. For every marker, every partition
gets one control batch (``kbroker.records.control``) appended as leader with
AppendOrigin.COORDINATOR and acks=all (``ReplicaManager.append_txn_markers``,
``request.timeout.ms``); the log checks the producer epoch (older: INVALID_PRODUCER_EPOCH)
and the coordinator epoch (older than the producer's last marker:
TRANSACTION_COORDINATOR_FENCED), ends the producer's ongoing transaction, writes the
``.txnindex`` entry of an abort and moves the last stable offset. A partition this broker
does not host answers UNKNOWN_TOPIC_OR_PARTITION. With an authorizer (KRaft brokers) the sender
needs ALTER or CLUSTER_ACTION on the cluster (brokers: super.users or a CLUSTER_ACTION ACL),
else every partition answers CLUSTER_AUTHORIZATION_FAILED. Errors are per partition; the response
is sent when every marker of the request is answered.

Once a marker is written to a ``__consumer_offsets`` partition, the group coordinator's
``on_transaction_completed(producer_id, [tp, ...], is_commit)`` (when it has one) makes
the transaction's offset commits visible or drops them, as Kafka's
``GroupCoordinator.onTransactionCompleted``.
"""
from __future__ import annotations

import logging
import threading
from typing import NamedTuple

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.write_txn_markers import (
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    WriteTxnMarkersResponse,
)
from kbroker.server.apis import ApiHandler
from kbroker.server.authz import ALTER, CLUSTER_ACTION, authz

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"


def handle_write_txn_markers(broker, ctx, req) -> None:
    markers = list(req.markers)
    answers: list[dict | None] = [None] * len(markers)
    pending = [len(markers)]
    lock = threading.Lock()
    timeout_ms = broker.config["request.timeout.ms"]
    rm = broker.replica_manager

    def respond() -> None:
        out = []
        for m, results in zip(markers, answers):
            topics = []
            for t in m.topics:
                parts = [WritableTxnMarkerPartitionResult(partition_index=p,
                                                          error_code=results[(t.name, p)].error)
                         for p in t.partition_indexes]
                topics.append(WritableTxnMarkerTopicResult(name=t.name, partitions=parts))
            out.append(WritableTxnMarkerResult(producer_id=m.producer_id, topics=topics))
        ctx.respond(WriteTxnMarkersResponse(markers=out))

    auth = authz(broker, ctx) if getattr(broker.config, "cluster_mode", False) else None
    if auth is not None and not auth.cluster(ALTER) and not auth.cluster(CLUSTER_ACTION):
        # KafkaApis: ALTER on the cluster, else CLUSTER_ACTION (what brokers hold); a denied
        # request is answered CLUSTER_AUTHORIZATION_FAILED for every partition. (Zero-config
        # mode has no inter-broker listener: its markers come to itself over its first
        # listener, unauthenticated, so it does not check.)
        denied = _Denied(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        answers[:] = [{(t.name, p): denied for t in m.topics for p in t.partition_indexes} for m in markers]
        respond()
        return

    if not markers:
        respond()
        return

    def answered(i: int, m, results: dict) -> None:
        _on_markers_written(broker, m, results)
        with lock:
            answers[i] = results
            pending[0] -= 1
            done = pending[0] == 0
        if done:
            respond()

    for i, m in enumerate(markers):
        tps = list(dict.fromkeys((t.name, p) for t in m.topics for p in t.partition_indexes))
        rm.append_txn_markers(timeout_ms, m.producer_id, m.producer_epoch, m.coordinator_epoch,
                              bool(m.transaction_result), tps,
                              lambda results, i=i, m=m: answered(i, m, results))


class _Denied(NamedTuple):
    """A partition's result that was never appended (what ``respond`` reads: ``.error``)."""
    error: int


def _on_markers_written(broker, m, results: dict) -> None:
    """Tell the group coordinator which of its partitions got this marker."""
    tps = [tp for tp, r in results.items() if tp[0] == OFFSETS_TOPIC and r.error == ErrorCode.NONE]
    if not tps:
        return
    hook = getattr(getattr(broker, "group_coordinator", None), "on_transaction_completed", None)
    if hook is None:
        return
    try:
        hook(m.producer_id, tps, bool(m.transaction_result))
    except Exception:
        log.exception("group coordinator failed to complete the transaction of producer %d", m.producer_id)


HANDLERS = {ApiKey.WRITE_TXN_MARKERS: ApiHandler(0, 1, handle_write_txn_markers)}

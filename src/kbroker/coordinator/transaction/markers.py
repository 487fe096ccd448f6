"""The transaction coordinator's marker channel over the wire: WriteTxnMarkers (api 27)
to each partition's leader.

Kafka: ``TransactionMarkerChannelManager`` (an InterBrokerSendThread). Markers go over
the network even when the leader is this broker, as Kafka's do: the leader's
WriteTxnMarkers handler appends the control batch and answers per partition; the
coordinator (:mod:`.coordinator`) decides what a partition error means.

Threads: one :class:`~kbroker.server.inter_node.InterNodeSendThread`, created on the
first send (the broker's own endpoint is known only once its listeners are bound);
callbacks run on it and only re-enter the coordinator, which never blocks there.
"""
from __future__ import annotations

import logging
from typing import Callable

from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.write_txn_markers import (
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest,
)

log = logging.getLogger(__name__)

__all__ = ["WireMarkerChannel"]


class WireMarkerChannel:
    """A :class:`~kbroker.coordinator.transaction.coordinator.MarkerChannel` over the network.

    ``leader_for((topic, partition))``: the leader's node id, -1 if there is none right
    now (retried), None if the partition does not exist (nothing to mark: reported
    NONE, as Kafka drops markers of deleted topics). ``endpoints()``: node id ->
    (host, port) of the brokers' inter-broker listener; ``client_config``: its security
    (TLS, SASL), as :class:`~kbroker.server.inter_node.BrokerSender` takes it.
    """

    def __init__(self, leader_for: Callable[[tuple], int | None], endpoints: Callable[[], dict],
                 name: str = "txn-marker-sender", request_timeout_ms: int = 30000,
                 client_config: dict | None = None) -> None:
        self._leader_for = leader_for
        self._request_timeout_s = request_timeout_ms / 1000.0
        from kbroker.server.inter_node import BrokerSender
        self._brokers = BrokerSender(name, endpoints, request_timeout_ms, client_config)

    def _sender_for_send(self):
        """The sender to the brokers, None once closed (tests replace this seam)."""
        return self._brokers.get()

    def write_markers(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      partitions: set, callback: Callable[[dict], None]) -> None:
        by_leader: dict[int, list] = {}
        gone = {}
        for tp in partitions:
            leader = self._leader_for(tp)
            if leader is None:
                log.info("marker for %s-%d dropped: the partition no longer exists", tp[0], tp[1])
                gone[tp] = int(ErrorCode.NONE)
            else:
                by_leader.setdefault(leader, []).append(tp)
        if gone:
            callback(gone)
        no_leader = by_leader.pop(-1, None)
        if no_leader:
            callback({tp: int(ErrorCode.NOT_LEADER_OR_FOLLOWER) for tp in no_leader})
        if not by_leader:
            return
        sender = self._sender_for_send()
        for leader, tps in by_leader.items():
            if sender is None:
                callback({tp: int(ErrorCode.REQUEST_TIMED_OUT) for tp in tps})
                continue
            topics: dict[str, list[int]] = {}
            for t, p in sorted(tps):
                topics.setdefault(t, []).append(p)
            req = WriteTxnMarkersRequest(markers=[WritableTxnMarker(
                producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=commit,
                topics=[WritableTxnMarkerTopic(name=t, partition_indexes=ps) for t, ps in topics.items()],
                coordinator_epoch=coordinator_epoch)])
            sender.send(leader, ApiKey.WRITE_TXN_MARKERS, req,
                        lambda resp, exc, tps=tps, leader=leader: self._answered(leader, producer_id, tps, resp,
                                                                                 exc, callback),
                        timeout_s=self._request_timeout_s)

    @staticmethod
    def _answered(leader: int, producer_id: int, tps: list, resp, exc, callback) -> None:
        errors = {tp: int(ErrorCode.REQUEST_TIMED_OUT) for tp in tps}  # unanswered: retried
        if exc is not None:
            log.debug("WriteTxnMarkers to node %d failed: %s", leader, exc)
        else:
            for m in resp.markers:
                if m.producer_id != producer_id:
                    continue
                for t in m.topics:
                    for p in t.partitions:
                        if (t.name, p.partition_index) in errors:
                            errors[(t.name, p.partition_index)] = p.error_code
        callback(errors)

    def close(self) -> None:
        self._brokers.close()

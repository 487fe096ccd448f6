"""Sender: the producer's background I/O thread (Kafka's Sender).

Each pass (``run_once``): ask the accumulator which leaders have ready batches, connect
to those not ready, drain batches for as many ProduceRequests as each ready leader has
room for (max.in.flight.requests.per.connection minus those in flight; each request
holds at most one batch per partition), queue them all, expire batches older than
delivery.timeout.ms, then ``NetworkClient.poll``, which writes every queued request in
one sendmsg and waits until a response, a wakeup (a new or full batch, a flush) or the
next linger deadline. Taking the GIL once per pass rather than once per batch is what
lets one Python sender thread keep up with a busy application thread.

Responses: NONE completes the batch (offset = base_offset + delta per record);
a retriable error puts the batch back at the head of its partition's deque (after
retry.backoff.ms, if retries and delivery.timeout.ms allow) and refreshes metadata on
NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION / LEADER_NOT_AVAILABLE; anything
else fails the batch with the error named by its code. acks=0 batches complete with
offset -1 once written to the socket.

Ordering: with max.in.flight.requests.per.connection=1 a partition is muted while its
batch is in flight, so retries cannot reorder records. With idempotence, the broker
orders by sequence number instead and up to 5 batches per partition may be in flight.

Idempotence (enable.idempotence=true, KIP-98 client side): before the first produce the
sender gets a producer id / epoch with InitProducerId; every drained batch gets the
partition's next sequence number, stamped into the built batch header (producer_id at
byte 43, producer_epoch at 51, base_sequence at 53; the CRC-32C over bytes 21.. is
recomputed). A retried batch keeps its sequence. DUPLICATE_SEQUENCE_NUMBER counts as
success. Retried batches go back in sequence order (Accumulator.reenqueue).
OUT_OF_ORDER_SEQUENCE_NUMBER is retried for a batch that is not the next in line (its
partition's last acknowledged sequence + 1: an earlier batch is still being retried, as
after a leader change), else it fails the batch, as do UNKNOWN_PRODUCER_ID and
INVALID_PRODUCER_EPOCH (Kafka 2.5+ would bump the epoch; we do not).

Thread-safety: everything here runs in the sender thread, except ``wakeup``/``initiate_close``.
"""
from __future__ import annotations

import logging
import threading
import time

from kbroker.client import errors as E
from kbroker.client.metadata import BrokerMetadata, TopicPartition
from kbroker.client.producer.transaction_manager import (  # noqa: F401  (stamp_producer_state: tests)
    TransactionManager, stamp_producer_state,
)
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages.init_producer_id import InitProducerIdRequest
from kbroker.protocol.messages.produce import PartitionProduceData, ProduceRequest, TopicProduceData

log = logging.getLogger(__name__)

_PRODUCE = int(ApiKey.PRODUCE)
_REFRESH_CODES = frozenset((ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_ENOUGH_REPLICAS,
                            ErrorCode.KAFKA_STORAGE_ERROR))
class Sender(threading.Thread):
    def __init__(self, config, client, metadata, accumulator):
        super().__init__(name=f"kbroker-producer-network-thread | {config['client.id']}", daemon=True)
        self.client = client
        self.metadata = metadata
        self.accumulator = accumulator
        self.acks = config["acks"]
        self.retries = config["retries"]
        self.request_timeout_ms = config["request.timeout.ms"]
        self.delivery_timeout_s = config["delivery.timeout.ms"] / 1000.0
        self.guarantee_order = config["max.in.flight.requests.per.connection"] == 1
        tid = config["transactional.id"]
        self.transactional_id = tid
        self.txn = TransactionManager(tid, config["transaction.timeout.ms"], config["retry.backoff.ms"] / 1000.0) \
            if config["enable.idempotence"] or tid is not None else None
        self.running = True
        self.force_close = False
        self.in_flight_batches: set = set()

    def wakeup(self) -> None:
        self.client.wakeup()

    def initiate_close(self, force: bool = False) -> None:
        self.accumulator.closed = True
        self.force_close = force
        self.running = False
        self.wakeup()

    # -- thread body --------------------------------------------------------------------
    def run(self) -> None:
        try:
            while self.running:
                self._run_once_logged()
            # graceful close: send what is queued and wait for what is in flight
            while not self.force_close and self.accumulator.has_incomplete():
                self._run_once_logged()
        finally:
            err = E.IllegalStateError("Producer is closed forcefully.")
            for b in self.accumulator.abort_all():
                self.accumulator.complete(b, -1, -1, err)
            for b in list(self.in_flight_batches):
                self.accumulator.complete(b, -1, -1, err)
            self.in_flight_batches.clear()
            self.client.close()

    def _run_once_logged(self) -> None:
        """One pass; an unexpected error is logged and the thread keeps going (Kafka's
        Sender.run catches and logs the same way)."""
        try:
            self.run_once()
        except Exception:
            log.exception("Uncaught error in kafka producer I/O thread")
            time.sleep(0.01)

    def run_once(self) -> None:
        now = time.monotonic()
        if self.txn is not None and self.txn.is_transactional:
            if self._transactional_pass(now):
                self.client.poll(0.05)
                return
        elif self.txn is not None and not self.txn.has_producer_id():
            if self.txn.fatal is not None:
                self._fail_all(self.txn.fatal)
                self.client.poll(0.1)
                return
            self._maybe_init_producer_id()
            self.client.poll(0.05)
            return
        cluster = self.metadata.cluster
        ready, next_check, unknown = self.accumulator.ready(cluster, now)
        if unknown:
            self.metadata.add_topics(*unknown)
            self.metadata.request_update()
        capacity = {}
        not_ready = False
        for n in ready:
            room = self.client.available_requests(n)
            if room:
                capacity[n] = room
            elif not self.client.maybe_connect(n):
                not_ready = True    # connecting (or backing off): look again soon
        timeout = next_check
        if capacity:
            requests = self.accumulator.drain(cluster, capacity, now, self.guarantee_order)
            for node, reqs in requests.items():
                for bs in reqs:
                    self._send_produce(node, bs)
            # what stayed queued is either not ready (next_check covers it; a batch made
            # since ready() woke the client) or waits for room, which a response makes
        for b in self.accumulator.expired_batches(now):
            self._finish(b, -1, -1, self.accumulator.expire_error(b, now))
        if not_ready:
            timeout = min(timeout, 0.05)
        self.client.poll(max(0.0, timeout))

    def _transactional_pass(self, now: float) -> bool:
        """Send the next transactional request if one is due; True if no batch may be
        drained in this pass (Kafka's Sender.maybeSendAndPollTransactionalRequest)."""
        txn = self.txn
        err = txn.in_error()
        if err is not None:
            self._fail_all(err)           # undrained batches of a doomed transaction
        h = txn.next_request(now, self.accumulator.has_incomplete())
        if h is not None:
            self._send_transactional(h)
        return txn.blocks_produce() or err is not None

    def _send_transactional(self, h) -> None:
        txn = self.txn
        if h.api_key == ApiKey.FIND_COORDINATOR:
            node = self.client.least_loaded_node()
        else:
            cnode, host, port = txn.coordinators[(h.key_type, h.key)]
            node = (1 << 31) - 1 - cnode          # the coordinator's own connection, as Kafka's client
            self.metadata.extra_nodes[node] = BrokerMetadata(node, host, port, None)
        if node is None or not self.client.is_ready(node):
            if node is not None:
                self.client.maybe_connect(node)
            txn.not_sent(h)               # connecting: sent on a later pass
            return
        have = self.client.api_version(node, h.api_key)
        version = have if h.version is None or have is None else min(h.version, have)
        if h.api_key == ApiKey.INIT_PRODUCER_ID:
            txn.transaction_v2 = self._transaction_v2(node)
        elif txn.transaction_v2 and h.version is not None and h.version > (have or 0):
            # transaction version 2's EndTxn v5 / TxnOffsetCommit v5 (above our default caps)
            version = min(h.version, self.client.broker_max_version(node, h.api_key) or 0)

        def done(resp, exc, h=h):
            txn.on_response(h, resp, exc)
            self.wakeup()
        try:
            self.client.send(node, h.api_key, h.build(version), done, version=version)
        except E.KafkaError as e:
            txn.on_response(h, None, e)

    def _transaction_v2(self, node: int) -> bool:
        """The coordinator finalizes transaction.version >= 2 and offers EndTxn v5 and
        Produce v12 (Kafka's client: TransactionManager.isTransactionV2Enabled)."""
        c = self.client
        return (c.finalized_feature(node, "transaction.version") >= 2
                and (c.broker_max_version(node, ApiKey.END_TXN) or 0) >= 5
                and (c.broker_max_version(node, ApiKey.PRODUCE) or 0) >= 12)

    def _fail_all(self, err) -> None:
        for b in self.accumulator.abort_all():
            self._finish(b, -1, -1, err)

    def _maybe_init_producer_id(self) -> None:
        txn = self.txn
        if txn.init_in_flight:
            return
        node = self.client.least_loaded_node()
        if node is None:
            return
        if not self.client.is_ready(node):
            self.client.maybe_connect(node)
            return
        if self.client.api_version(node, ApiKey.INIT_PRODUCER_ID) is None:
            txn.fatal = E.for_code(ErrorCode.UNSUPPORTED_VERSION,
                                   "the broker does not support InitProducerId, which "
                                   "enable.idempotence=true requires")
            return
        txn.init_in_flight = True

        def done(resp, exc):
            txn.init_in_flight = False
            if exc is not None:
                return          # retried on the next pass
            if resp.error_code:
                err = E.for_code(resp.error_code)
                if not err.retriable:
                    txn.fatal = err
                return
            txn.producer_id, txn.producer_epoch = resp.producer_id, resp.producer_epoch
        self.client.send(node, ApiKey.INIT_PRODUCER_ID,
                         InitProducerIdRequest(transactional_id=None,
                                               transaction_timeout_ms=2147483647), done)

    def _send_produce(self, node: int, batches) -> None:
        topics: dict[str, list] = {}
        by_tp = {}
        for b in batches:
            if self.txn is not None:
                self.txn.assign(b)
            topics.setdefault(b.tp.topic, []).append(PartitionProduceData(index=b.tp.partition, records=b.buffer))
            by_tp[b.tp] = b
            self.in_flight_batches.add(b)
        req = ProduceRequest(transactional_id=self.transactional_id, acks=self.acks, timeout_ms=self.request_timeout_ms,
                             topic_data=[TopicProduceData(name=t, partition_data=p) for t, p in topics.items()])
        expect = self.acks != 0

        def on_response(resp, exc, by_tp=by_tp):
            self._handle_produce_response(by_tp, resp, exc)
        try:
            # written by the poll that ends this pass: every request drained in the pass
            # goes out in one sendmsg
            version = None
            if self.txn is not None and self.txn.transaction_v2 and self.transactional_id is not None:
                version = min(12, self.client.broker_max_version(node, _PRODUCE) or 0)   # the leader adds
            self.client.send(node, _PRODUCE, req, on_response, expect_response=expect,
                             defer_write=True, version=version)
        except E.KafkaError as e:
            self._handle_produce_response(by_tp, None, e)

    def _handle_produce_response(self, by_tp, resp, exc) -> None:
        now = time.monotonic()
        if exc is not None:
            for b in by_tp.values():
                self._complete_or_retry(b, ErrorCode.NETWORK_EXCEPTION, -1, -1, now, exc)
            return
        if resp is None:         # acks=0: written to the socket
            for b in by_tp.values():
                self._finish(b, -1, -1, None)
            return
        seen = set()
        for t in resp.responses:
            for p in t.partition_responses:
                tp = TopicPartition(t.name, p.index)
                b = by_tp.get(tp)
                if b is None:
                    continue
                seen.add(tp)
                msg = getattr(p, "error_message", None)
                self._complete_or_retry(b, p.error_code, p.base_offset,
                                        getattr(p, "log_append_time_ms", -1), now,
                                        None if not p.error_code else E.for_code(p.error_code, msg))
        for tp, b in by_tp.items():
            if tp not in seen:
                self._finish(b, -1, -1, E.KafkaError(
                    f"ProduceResponse has no result for {tp.topic}-{tp.partition}", ErrorCode.UNKNOWN_SERVER_ERROR))

    def _complete_or_retry(self, b, code, base_offset, log_append_time, now, err) -> None:
        if code == ErrorCode.NONE or (code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and self.txn is not None):
            if self.txn is not None and b.base_sequence >= 0:
                self.txn.acked(b.tp, b.producer_epoch, b.base_sequence + b.record_count - 1)
            self._finish(b, base_offset, log_append_time, None)
            return
        if code in _REFRESH_CODES or code == ErrorCode.NETWORK_EXCEPTION:
            self.metadata.request_update()
        retriable = err.retriable if isinstance(err, E.KafkaError) else True
        if code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and self.txn is not None and not retriable:
            # Kafka's TransactionManager.canRetry: a batch that is not the next in line (an
            # earlier one of its partition is not acknowledged yet, e.g. being retried after
            # a leader change) is retried; the next in line failing this way is fatal to it
            retriable = (b.producer_epoch == self.txn.producer_epoch
                         and b.base_sequence != self.txn.next_acked_sequence(b.tp))
        if (retriable and b.attempts < self.retries and self.running
                and now - b.created < self.delivery_timeout_s):
            self.in_flight_batches.discard(b)
            if self.guarantee_order:
                self.accumulator.unmute(b.tp)
            self.accumulator.reenqueue(b, now)
            return
        if retriable and now - b.created >= self.delivery_timeout_s:
            err = self.accumulator.expire_error(b, now)
        self._finish(b, -1, -1, err)

    def _finish(self, b, base_offset, log_append_time, err) -> None:
        if b.result.is_done():
            return
        if err is not None and self.txn is not None and self.txn.is_transactional:
            self.txn.batch_failed(err)
        self.in_flight_batches.discard(b)
        if self.guarantee_order:
            self.accumulator.unmute(b.tp)
        self.accumulator.complete(b, base_offset, log_append_time, err)

"""KIP-890 part 1 on the partition leader: verify a transactional produce with the
transaction coordinator before appending it.

Kafka: ``ReplicaManager.handleProduceAppend`` / ``maybeStartTransactionVerificationForPartitions``
and ``AddPartitionsToTxnManager`` (3.9 / 4.0).

A Produce with a ``transactional_id`` whose batches are transactional: for each
partition led here where the producer has no ongoing transaction, the log hands out a
verification guard (:mod:`kbroker.log.txn_verification`); those partitions are sent to
the coordinator of the transactional id as AddPartitionsToTxn v4+ with ``verify_only``
(one request in flight per coordinator node, the transactions that arrive meanwhile
batched into the next one: Kafka's AddPartitionsToTxnManager), or asked of the local
coordinator directly when it is this broker. Partitions the coordinator does not
confirm are answered with its error, mapped as Kafka maps it for the producer; the
others are appended with their guards, and the log refuses (INVALID_TXN_STATE) a batch
whose guard was cleared meanwhile by a marker or another transactional write. With
verification on, every client append of a transactional batch needs a guard or an
ongoing transaction (so a marker that lands between this check and the append is
caught too); ``transaction.partition.verification.enable=false`` turns all of it off.

Transaction version 2 (KIP-890 part 2): a Produce v12 (TxnOffsetCommit v5) comes from a
producer that sends no AddPartitionsToTxn (AddOffsetsToTxn); the leader *adds* the
partition to the transaction instead of verifying it (AddPartitionsToTxn v5 with
``verify_only`` false, or the local coordinator's ``handle_add_partitions`` at
transaction version 2), whatever the verification flag says — without the add the
partition would never get its marker.

Errors (Kafka's mapping): PRODUCER_FENCED -> INVALID_PRODUCER_EPOCH; TRANSACTION_ABORTABLE
stays for Produce v11+ (clients that know it) and is INVALID_TXN_STATE below;
CONCURRENT_TRANSACTIONS, NETWORK_EXCEPTION, COORDINATOR_LOAD_IN_PROGRESS,
COORDINATOR_NOT_AVAILABLE and NOT_COORDINATOR become NOT_ENOUGH_REPLICAS (retried by
every client without a metadata refresh).

Threads: the local answer runs inline; wire answers run on the sender thread, which
then appends (as Kafka's callback does on a request handler thread). ``_lock`` guards
the per-node queues only; no callback runs under it.
"""
from __future__ import annotations

import logging
import struct
import threading
from typing import Callable

from kbroker.log.txn_verification import SENTINEL
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.server.inter_node import BrokerSender

log = logging.getLogger(__name__)

__all__ = ["TransactionVerifier", "AddPartitionsToTxnSender", "start_coordinator_verification", "SENTINEL"]

E = ErrorCode
TRANSACTION_VERSION_2 = 2
_HEADER = struct.Struct(">qhi")      # producer id, producer epoch, base sequence (bytes 43..57)

#: coordinator answers that older producers may not retry: NOT_ENOUGH_REPLICAS (retriable, no metadata refresh)
_RETRY_AS_NOT_ENOUGH_REPLICAS = frozenset({E.CONCURRENT_TRANSACTIONS, E.NETWORK_EXCEPTION,
                                           E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE,
                                           E.NOT_COORDINATOR})


def transactional_batches(entries: dict) -> tuple[dict, set]:
    """{tp: (producer id, epoch, base sequence)} of the partitions whose (first)
    batch is a transactional v2 batch with a producer id, and the set of
    (producer id, epoch) seen (Kafka checks there is only one). Malformed records are
    left to the append path."""
    found = {}
    producers = set()
    for tp, buf in entries.items():
        if buf is None or len(buf) < 61 or buf[16] != 2 or not buf[22] & 0x10:
            continue
        pid, epoch, seq = _HEADER.unpack_from(buf, 43)
        if pid < 0:
            continue
        found[tp] = (pid, epoch, seq)
        producers.add((pid, epoch))
    return found, producers


def map_coordinator_error(code: int, generic_error_supported: bool) -> ErrorCode:
    """AddPartitionsToTxnManager's mapping of one partition's verify_only answer."""
    err = E(code) if code in E._value2member_map_ else E.UNKNOWN_SERVER_ERROR
    if err == E.PRODUCER_FENCED:
        return E.INVALID_PRODUCER_EPOCH
    if err == E.TRANSACTION_ABORTABLE and not generic_error_supported:
        return E.INVALID_TXN_STATE
    return err


def produce_result_for(err: ErrorCode):
    """ReplicaManager.handleProduceAppend's answer to a partition that failed verification."""
    from kbroker.server.replica_manager import ProducePartitionResult
    if err == E.INVALID_TXN_STATE:
        return ProducePartitionResult(err, error_message="Partition was not added to the transaction")
    if err in _RETRY_AS_NOT_ENOUGH_REPLICAS:
        return ProducePartitionResult(
            E.NOT_ENOUGH_REPLICAS,
            error_message=f"Unable to verify the partition has been added to the transaction. "
                          f"Underlying error: {err.name}")
    return ProducePartitionResult(err)


def start_coordinator_verification(broker, tp, producer_id: int, producer_epoch: int):
    """TxnOffsetCommit: the guard of the group's ``__consumer_offsets`` partition for the
    producer (SENTINEL: its transaction is open there already), None if the partition is
    not hosted here (the group coordinator answers). Its batch is the coordinator's, whose
    sequence the log does not check, so no sequence is recorded for it."""
    rm = getattr(broker, "replica_manager", None)
    part = None if rm is None else rm.get_partition(tp)
    if part is None:
        return None
    return part.log.maybe_start_transaction_verification(producer_id, 0x7FFFFFFF, producer_epoch)


class TransactionVerifier:
    """The produce side (``ReplicaManager.txn_verifier``).

    ``enabled()``: transaction.partition.verification.enable, read per request (dynamic).
    ``coordinator_node(transactional_id)``: the node id of its coordinator (None: not
    known now). ``local_coordinator()``: this broker's TransactionCoordinator or None.
    ``sender``: an :class:`AddPartitionsToTxnSender` for coordinators on other nodes
    (None on a single node)."""

    def __init__(self, node_id: int, enabled: Callable[[], bool], coordinator_node: Callable[[str], int | None],
                 local_coordinator: Callable[[], object], sender: "AddPartitionsToTxnSender | None" = None) -> None:
        self.node_id = node_id
        self._enabled = enabled
        self._coordinator_node = coordinator_node
        self._local_coordinator = local_coordinator
        self.sender = sender

    def enabled(self) -> bool:
        """transaction.partition.verification.enable, now."""
        return bool(self._enabled())

    def handle_produce_append(self, rm, timeout_ms: int, required_acks: int, entries: dict, respond,
                              transactional_id: str, internal_topics_allowed: bool, produce_version: int) -> bool:
        """Verify, then append through ``rm.append_records`` with the guards. False when
        verification is off or no batch is transactional (the caller appends as usual)."""
        add = produce_version >= 12          # transaction version 2: the leader adds the partition
        if not add and not self._enabled():
            return False
        batches, producers = transactional_batches(entries)
        if not producers:
            return False
        if len(producers) > 1:
            from kbroker.server.replica_manager import ProducePartitionResult
            respond({tp: ProducePartitionResult(E.INVALID_PRODUCER_ID_MAPPING,
                                                error_message="Transactional records contained more than one "
                                                              "producer ID") for tp in entries})
            return True
        (pid, epoch), = producers
        guards = {}
        for tp, (_pid, _epoch, seq) in batches.items():
            part = rm.get_partition(tp)
            if part is None or not part.is_leader:
                continue  # the append answers the partition's error
            guard = part.log.maybe_start_transaction_verification(pid, seq, epoch)
            if guard is not SENTINEL:
                guards[tp] = guard

        def append(errors: dict) -> None:
            early = {tp: produce_result_for(err) for tp, err in errors.items() if err != E.NONE}
            rest = {tp: buf for tp, buf in entries.items() if tp not in early}
            done = respond if not early else (lambda results: respond({**results, **early}))
            rm.append_records(timeout_ms, required_acks, rest, done, internal_topics_allowed=internal_topics_allowed,
                              produce_version=produce_version, transactional_id=transactional_id,
                              verification_guards=guards)

        if not guards:
            append({})
        else:
            self.verify(transactional_id, pid, epoch, list(guards), append, produce_version > 10, add=add)
        return True

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list,
               callback: Callable[[dict], None], generic_error_supported: bool, *, add: bool = False) -> None:
        """``callback({tp: error})`` (mapped for the producer) once the coordinator answered.
        ``add``: add the partitions to the transaction (transaction version 2) rather than
        verify that they are in it."""
        def mapped(codes: dict) -> None:
            callback({tp: map_coordinator_error(c, generic_error_supported) for tp, c in codes.items()})

        node = self._coordinator_node(transactional_id)
        if node is None or node < 0:
            return mapped({tp: E.COORDINATOR_NOT_AVAILABLE for tp in partitions})
        coordinator = self._local_coordinator() if node == self.node_id else None
        if coordinator is not None:
            if add:
                return coordinator.handle_add_partitions(transactional_id, producer_id, producer_epoch, partitions,
                                                         lambda err: mapped({tp: err for tp in partitions}),
                                                         TRANSACTION_VERSION_2)
            return mapped(coordinator.handle_verify_partitions(transactional_id, producer_id, producer_epoch,
                                                               partitions))
        if self.sender is None:
            return mapped({tp: E.COORDINATOR_NOT_AVAILABLE for tp in partitions})
        self.sender.verify(node, transactional_id, producer_id, producer_epoch, partitions, mapped, add=add)

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()


class _Txn:
    __slots__ = ("transactional_id", "producer_id", "producer_epoch", "partitions", "callback", "add")

    def __init__(self, transactional_id, producer_id, producer_epoch, partitions, callback, add=False) -> None:
        self.add = add
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.partitions = partitions
        self.callback = callback

    def fail(self, err: ErrorCode) -> None:
        self.callback({tp: err for tp in self.partitions})


class AddPartitionsToTxnSender:
    """verify_only AddPartitionsToTxn to coordinators on other nodes (Kafka's
    AddPartitionsToTxnManager): one request in flight per node; transactions queued
    meanwhile go in the next. A second verification of a transactional id already
    queued: the older epoch is answered INVALID_PRODUCER_EPOCH, the same epoch
    NETWORK_EXCEPTION (the client is retrying), as Kafka does.

    ``endpoints()``: node id -> (host, port) of the brokers' inter-broker listener;
    ``client_config``: its security (TLS, SASL), as BrokerSender takes it."""

    def __init__(self, endpoints: Callable[[], dict], name: str = "AddPartitionsToTxnSender",
                 request_timeout_ms: int = 30000, client_config: dict | None = None) -> None:
        self._timeout_s = request_timeout_ms / 1000.0
        self._brokers = BrokerSender(name, endpoints, request_timeout_ms, client_config)
        self._lock = threading.Lock()
        self._queued: dict[int, dict[str, _Txn]] = {}
        self._inflight: set[int] = set()

    def verify(self, node: int, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list,
               callback: Callable[[dict], None], *, add: bool = False) -> None:
        """``add``: a transaction version 2 add (``verify_only`` false, request v5)."""
        txn = _Txn(transactional_id, producer_id, producer_epoch, partitions, callback, add)
        failed = []
        with self._lock:
            queue = self._queued.setdefault(node, {})
            old = queue.get(transactional_id)
            if old is not None:
                if old.producer_epoch <= producer_epoch:
                    failed.append((old, E.INVALID_PRODUCER_EPOCH if old.producer_epoch < producer_epoch
                                   else E.NETWORK_EXCEPTION))
                    queue[transactional_id] = txn
                else:
                    failed.append((txn, E.INVALID_PRODUCER_EPOCH))
            else:
                queue[transactional_id] = txn
            batch = self._take_locked(node)
        for t, err in failed:
            t.fail(err)
        if batch:
            self._send(node, batch)

    def _take_locked(self, node: int) -> dict | None:
        if node in self._inflight or not self._queued.get(node):
            return None
        self._inflight.add(node)
        return self._queued.pop(node)

    def _sender_for_send(self):
        """The sender to the brokers, None once closed (tests replace this seam)."""
        return self._brokers.get()

    def _send(self, node: int, batch: dict) -> None:
        from kbroker.protocol.messages.add_partitions_to_txn import (
            AddPartitionsToTxnRequest, AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
        )
        txns = []
        for t in batch.values():
            topics: dict[str, list[int]] = {}
            for topic, p in sorted(t.partitions):
                topics.setdefault(topic, []).append(p)
            txns.append(AddPartitionsToTxnTransaction(
                transactional_id=t.transactional_id, producer_id=t.producer_id, producer_epoch=t.producer_epoch,
                verify_only=not t.add, topics=[AddPartitionsToTxnTopic(name=n, partitions=ps) for n, ps in topics.items()]))
        sender = self._sender_for_send()
        if sender is None:
            self._answered(node, batch, None, RuntimeError("closed"))
            return
        sender.send(node, ApiKey.ADD_PARTITIONS_TO_TXN, AddPartitionsToTxnRequest(transactions=txns),
                    lambda resp, exc: self._answered(node, batch, resp, exc), timeout_s=self._timeout_s)

    def _answered(self, node: int, batch: dict, resp, exc) -> None:
        try:
            if exc is not None:
                log.warning("AddPartitionsToTxn (verify) to node %d failed: %s", node, exc)
                for t in batch.values():
                    t.fail(E.NETWORK_EXCEPTION)
            elif resp.error_code != 0:
                err = E(resp.error_code) if resp.error_code in E._value2member_map_ else E.UNKNOWN_SERVER_ERROR
                if err == E.CLUSTER_AUTHORIZATION_FAILED:  # not the producer's business
                    err = E.INVALID_TXN_STATE
                log.error("AddPartitionsToTxn (verify) to node %d answered %s", node, err.name)
                for t in batch.values():
                    t.fail(err)
            else:
                answered = {}
                for r in resp.results_by_transaction:
                    codes = {}
                    for topic in r.topic_results:
                        for p in topic.results_by_partition:
                            codes[(topic.name, p.partition_index)] = p.partition_error_code
                    answered[r.transactional_id] = codes
                for tid, t in batch.items():
                    codes = answered.get(tid)
                    if codes is None:
                        t.fail(E.NETWORK_EXCEPTION)
                    else:
                        t.callback({tp: codes.get(tp, E.NONE) for tp in t.partitions})
        finally:
            with self._lock:
                self._inflight.discard(node)
                nxt = self._take_locked(node)
            if nxt:
                self._send(node, nxt)

    def close(self) -> None:
        self._brokers.close()
        with self._lock:
            queued, self._queued = self._queued, {}
        for q in queued.values():
            for t in q.values():
                t.fail(E.NETWORK_EXCEPTION)

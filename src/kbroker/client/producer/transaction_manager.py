"""TransactionManager: the producer's idempotence and transaction state (Kafka's
``clients/.../producer/internals/TransactionManager``).

Idempotence (enable.idempotence, no transactional.id): a producer id / epoch from
InitProducerId, per-partition sequence numbers stamped into each drained batch.

Transactions (transactional.id set, KIP-98): the state machine

    UNINITIALIZED -init_transactions-> INITIALIZING -> READY -begin-> IN_TRANSACTION
    IN_TRANSACTION -commit-> COMMITTING -> READY;  -abort-> ABORTING -> READY
    any -retriable failure-> (retried);  -abortable error-> ABORTABLE_ERROR -abort-> ...
    -fenced / fatal error-> FATAL_ERROR (only close is left)

Requests go to the transaction coordinator (FindCoordinator key_type 1 on the
transactional id) one at a time, in Kafka's order: InitProducerId, AddPartitionsToTxn for
the partitions the application sent to since the last one (a partition's batches are not
drained until it is in the transaction), AddOffsetsToTxn then TxnOffsetCommit to the
*group* coordinator, EndTxn once every batch of the transaction is acknowledged. Every
batch is stamped transactional. AddPartitionsToTxn is sent at v3 (the client form), EndTxn
at the broker's version up to v4.

Transaction version 2 (KIP-890 part 2, as Kafka's Java client 4.0): when the coordinator
finalizes ``transaction.version`` >= 2 and offers EndTxn v5 (checked as InitProducerId is
sent: ``transaction_v2``), no AddPartitionsToTxn or AddOffsetsToTxn is sent — batches go
as Produce v12 and offsets as TxnOffsetCommit v5, whose receivers add the partition to
the transaction — and every EndTxn (v5) bumps the epoch: its response names the producer
id and epoch of the next transaction, whose sequence numbers start again at 0. A
transaction counts as started once one of its batches is drained (it may reach the
partition leader), so an abort then always goes to the coordinator, which bumps the
epoch even if nothing arrived (a late produce of it is then fenced).

Threads: the application thread calls the public methods (they take ``_lock`` and return a
TransactionalRequestResult to wait on); the sender thread calls ``next_request`` and the
response handlers. Sequence numbers are touched only by the sender thread.
"""
from __future__ import annotations

import collections
import enum
import struct
import threading
import time
from typing import Callable, NamedTuple

from kbroker.client import errors as E
from kbroker.client.metadata import TopicPartition
from kbroker.kernels import crc32c
from kbroker.protocol import ApiKey, ErrorCode
from kbroker.protocol.messages import add_offsets_to_txn as aot
from kbroker.protocol.messages import add_partitions_to_txn as apt
from kbroker.protocol.messages import end_txn as et
from kbroker.protocol.messages import txn_offset_commit as toc
from kbroker.protocol.messages.find_coordinator import FindCoordinatorRequest
from kbroker.protocol.messages.init_producer_id import InitProducerIdRequest

_PID_EPOCH_SEQ = struct.Struct(">qhi")
_CRC = struct.Struct(">I")
_ATTRS = struct.Struct(">h")
TRANSACTIONAL_FLAG = 0x10
GROUP, TRANSACTION = 0, 1

_COORDINATOR_MOVED = frozenset((ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR))
_RETRY = frozenset((ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS,
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.REQUEST_TIMED_OUT))
_FENCED = frozenset((ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
                     ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ErrorCode.INVALID_TXN_STATE,
                     ErrorCode.INVALID_PRODUCER_ID_MAPPING, ErrorCode.UNSUPPORTED_VERSION))


def stamp_producer_state(buf: bytes, producer_id: int, epoch: int, base_sequence: int,
                         transactional: bool = False) -> bytes:
    """Return a v2 batch with producer id/epoch/base sequence (and the transactional
    attribute) set and its CRC redone."""
    b = bytearray(buf)
    if transactional:
        _ATTRS.pack_into(b, 21, _ATTRS.unpack_from(b, 21)[0] | TRANSACTIONAL_FLAG)
    _PID_EPOCH_SEQ.pack_into(b, 43, producer_id, epoch, base_sequence)
    _CRC.pack_into(b, 17, crc32c.crc32c(memoryview(b)[21:]))
    return bytes(b)


class State(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


class ConsumerGroupMetadata(NamedTuple):
    """What TxnOffsetCommit needs of a consumer (Kafka's ConsumerGroupMetadata);
    ``Consumer.group_metadata()`` returns it."""
    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class TransactionalRequestResult:
    """Completed by the sender thread; ``wait`` raises the failure."""

    def __init__(self, operation: str):
        self.operation = operation
        self._done = threading.Event()
        self.error: Exception | None = None

    def done(self, error: Exception | None = None) -> None:
        if not self._done.is_set():
            self.error = error
            self._done.set()

    def is_done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None) -> None:
        if not self._done.wait(timeout_s):
            raise E.KafkaTimeoutError(f"Timeout expired after {timeout_s}s while awaiting {self.operation}")
        if self.error is not None:
            raise self.error


class _Handler(NamedTuple):
    """One transactional request: to the coordinator of (key_type, key); ``build(version)``
    makes the request at send time (most ignore the version), ``handle(resp)`` runs on its response (sender thread)."""
    key_type: int
    key: str
    api_key: int
    build: Callable
    handle: Callable
    result: TransactionalRequestResult | None
    version: int | None = None


class TransactionManager:
    def __init__(self, transactional_id: str | None = None, transaction_timeout_ms: int = 60000,
                 retry_backoff_s: float = 0.1):
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.retry_backoff_s = retry_backoff_s
        self.producer_id = -1
        self.producer_epoch = -1
        self.next_sequence: dict[TopicPartition, int] = {}
        #: per partition, the last sequence acknowledged at the current epoch (sender thread)
        self.last_acked_sequence: dict[TopicPartition, int] = {}
        self.init_in_flight = False        # idempotent-only InitProducerId
        self.fatal: E.KafkaError | None = None
        # -- transactions ---------------------------------------------------------------
        self._lock = threading.Lock()
        self.state = State.UNINITIALIZED
        self.last_error: Exception | None = None
        self.partitions_in_txn: set = set()
        #: the coordinator knows of this transaction (partitions or offsets were added): only
        #: then does commit/abort send EndTxn (an empty transaction ends locally, as Kafka's)
        self.transaction_started = False
        self.pending_partitions: set = set()     # sent to, not yet in an AddPartitionsToTxn
        self.adding_partitions: set = set()      # in the AddPartitionsToTxn in flight
        self._queue: collections.deque = collections.deque()
        self.in_flight: _Handler | None = None
        self.backoff_until = 0.0
        #: (key_type, key) -> coordinator node id, as FindCoordinator answered
        self.coordinators: dict[tuple[int, str], int] = {}
        #: transaction version 2 (see the module docstring): set by the sender with InitProducerId
        self.transaction_v2 = False

    @property
    def is_transactional(self) -> bool:
        return self.transactional_id is not None

    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    def acked(self, tp: TopicPartition, epoch: int, last_sequence: int) -> None:
        """A batch ending at ``last_sequence`` was acknowledged (sender thread)."""
        if epoch == self.producer_epoch:
            cur = self.last_acked_sequence.get(tp, -1)
            if last_sequence > cur:
                self.last_acked_sequence[tp] = last_sequence

    def next_acked_sequence(self, tp: TopicPartition) -> int:
        """The sequence of the batch next in line to be acknowledged on ``tp``."""
        return (self.last_acked_sequence.get(tp, -1) + 1) & 0x7FFFFFFF

    def assign(self, batch) -> None:
        """Stamp a drained batch with the producer id, epoch and its first sequence (sender
        thread); a retried batch keeps what it had."""
        if batch.base_sequence >= 0:
            return
        seq = self.next_sequence.get(batch.tp, 0)
        batch.producer_id, batch.producer_epoch, batch.base_sequence = \
            self.producer_id, self.producer_epoch, seq
        self.next_sequence[batch.tp] = (seq + batch.record_count) & 0x7FFFFFFF
        batch.buffer = stamp_producer_state(batch.buffer, self.producer_id, self.producer_epoch, seq,
                                            self.is_transactional)
        if self.transaction_v2 and not self.transaction_started:
            with self._lock:     # the batch may reach its leader, which adds it to the transaction
                self.transaction_started = True

    # -- the application thread ---------------------------------------------------------------
    def _require(self, *states: State, op: str) -> None:
        if self.state is State.FATAL_ERROR:
            raise E.KafkaError(f"Cannot execute transactional method because we are in an error state: "
                               f"{self.last_error}", getattr(self.last_error, "code", ErrorCode.UNKNOWN_SERVER_ERROR))
        if self.state not in states:
            if self.state is State.ABORTABLE_ERROR:
                raise E.KafkaError(f"Cannot {op}: the transaction must be aborted after an error: "
                                   f"{self.last_error}", getattr(self.last_error, "code", ErrorCode.UNKNOWN_SERVER_ERROR))
            raise E.IllegalStateError(f"Invalid transition attempted from state {self.state.value} ({op})")

    def initialize(self) -> TransactionalRequestResult:
        with self._lock:
            if self.state is State.INITIALIZING and self._queue:
                return self._queue[0].result
            self._require(State.UNINITIALIZED, op="initialize transactions")
            self.state = State.INITIALIZING
            r = TransactionalRequestResult("InitProducerId")
            self._queue.append(self._init_producer_id(r))
            return r

    def begin(self) -> None:
        with self._lock:
            self._require(State.READY, op="begin a transaction")
            self.state = State.IN_TRANSACTION

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        """Called by send() before a record is appended."""
        if tp in self.partitions_in_txn:
            return
        with self._lock:
            self._require(State.IN_TRANSACTION, op="send")
            if self.transaction_v2:      # the partition leader adds it (Produce v12)
                self.partitions_in_txn.add(tp)
                return
            if tp not in self.partitions_in_txn and tp not in self.adding_partitions:
                self.pending_partitions.add(tp)

    def send_offsets(self, offsets: dict, group: ConsumerGroupMetadata) -> TransactionalRequestResult:
        with self._lock:
            self._require(State.IN_TRANSACTION, op="send offsets to the transaction")
            r = TransactionalRequestResult("AddOffsetsToTxn")
            if self.transaction_v2:      # TxnOffsetCommit v5 adds the group's partition itself
                self._queue.append(self._txn_offset_commit(offsets, group, r))
            else:
                self._queue.append(self._add_offsets(offsets, group, r))
            return r

    def begin_commit(self) -> TransactionalRequestResult:
        with self._lock:
            self._require(State.IN_TRANSACTION, op="commit the transaction")
            self.state = State.COMMITTING_TRANSACTION
            r = TransactionalRequestResult("EndTxn(commit)")
            if not self._started_at_coordinator():
                self._complete_transaction()
                r.done()
                return r
            self._queue.append(self._end_txn(True, r))
            return r

    def _started_at_coordinator(self) -> bool:
        """Anything of this transaction reached (or may reach) the coordinator. Lock held."""
        return bool(self.transaction_started or self.pending_partitions or self.adding_partitions
                    or self.in_flight is not None or any(h.api_key != ApiKey.END_TXN for h in self._queue))

    def begin_abort(self) -> TransactionalRequestResult:
        with self._lock:
            self._require(State.IN_TRANSACTION, State.ABORTABLE_ERROR, op="abort the transaction")
            self.state = State.ABORTING_TRANSACTION
            self.pending_partitions.clear()
            # requests queued for the aborted transaction (offsets) fail with it
            for h in list(self._queue):
                if h.api_key != ApiKey.END_TXN and h.result is not None:
                    h.result.done(E.KafkaError("Transaction aborted", ErrorCode.UNKNOWN_SERVER_ERROR))
            self._queue = collections.deque(h for h in self._queue if h.api_key == ApiKey.END_TXN)
            r = TransactionalRequestResult("EndTxn(abort)")
            if not self.transaction_started and self.in_flight is None:
                # nothing reached the coordinator: the transaction never began there
                self._complete_transaction()
                r.done()
                return r
            self._queue.append(self._end_txn(False, r))
            return r

    def batch_failed(self, err: Exception) -> None:
        """A batch of the transaction failed (sender thread, before the batch completes):
        the transaction can only be aborted now, and a commit already asked for fails
        (Kafka's TransactionManager.handleFailedBatch); a fenced producer is fatal."""
        with self._lock:
            if self.state not in (State.IN_TRANSACTION, State.COMMITTING_TRANSACTION):
                return
            code = getattr(err, "code", ErrorCode.UNKNOWN_SERVER_ERROR)
            fatal = code in (ErrorCode.PRODUCER_FENCED, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            failure = self._fail(code, f"a batch of the transaction failed: {err}", fatal)
            for h in [h for h in self._queue if h.api_key == ApiKey.END_TXN]:
                self._queue.remove(h)                # the commit that waited for the batch
                if h.result is not None:
                    h.result.done(failure)

    def in_error(self) -> Exception | None:
        """The error batches fail with while the transaction cannot go on."""
        if self.state in (State.ABORTABLE_ERROR, State.FATAL_ERROR):
            return self.last_error
        return None

    # -- the sender thread ----------------------------------------------------------------------
    def blocks_produce(self) -> bool:
        """No batch may be drained: a partition of a queued batch is not in the transaction yet."""
        return bool(self.pending_partitions or self.adding_partitions) or self.state in (
            State.UNINITIALIZED, State.INITIALIZING)

    def next_request(self, now: float, batches_incomplete: bool):
        """The next request to send as (key_type, key, handler), or None: one at a time,
        FindCoordinator first when the handler's coordinator is not known."""
        with self._lock:
            if self.in_flight is not None or now < self.backoff_until:
                return None
            if self.pending_partitions and self.state is State.IN_TRANSACTION:
                self.adding_partitions, self.pending_partitions = set(self.pending_partitions), set()
                h = self._add_partitions(sorted(self.adding_partitions))
            elif self._queue:
                h = self._queue[0]
                if h.api_key == ApiKey.END_TXN and (batches_incomplete or self.adding_partitions):
                    return None
                self._queue.popleft()
                if h.api_key == ApiKey.END_TXN and not self.transaction_started:
                    # the coordinator never saw this transaction (its first AddPartitionsToTxn was
                    # retried after an abort began): end it here, as Kafka's nextRequest does
                    if self.state is not State.FATAL_ERROR:
                        self._complete_transaction()
                    if h.result is not None:
                        h.result.done()
                    return None
            else:
                return None
            if (h.key_type, h.key) not in self.coordinators and h.api_key != ApiKey.FIND_COORDINATOR:
                self._requeue(h)
                h = self._find_coordinator(h.key_type, h.key)
            self.in_flight = h
            return h

    def _requeue(self, h: _Handler) -> None:
        if h.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            self.pending_partitions |= self.adding_partitions
            self.adding_partitions = set()
        else:
            self._queue.appendleft(h)

    def not_sent(self, h: _Handler) -> None:
        """The handler could not be sent (no connection yet): queue it again."""
        with self._lock:
            self.in_flight = None
            self._retry(h, backoff=False)

    def on_response(self, h: _Handler, resp, exc) -> None:
        """Sender thread: the handler's response, or a network failure (retried)."""
        with self._lock:
            self.in_flight = None
            if exc is not None:
                self.coordinators.pop((h.key_type, h.key), None)
                self._retry(h)
                return
            h.handle(resp)

    def _retry(self, h: _Handler, backoff: bool = True) -> None:
        if h.api_key != ApiKey.FIND_COORDINATOR:
            self._requeue(h)
        if backoff:
            self.backoff_until = time.monotonic() + self.retry_backoff_s

    def _fail(self, code: int, message: str | None, fatal: bool) -> E.KafkaError:
        err = E.for_code(code, message)
        if self.state is not State.FATAL_ERROR:
            self.state = State.FATAL_ERROR if fatal else State.ABORTABLE_ERROR
            self.last_error = err
        if fatal:
            for h in self._queue:
                if h.result is not None:
                    h.result.done(err)
            self._queue.clear()
        return err

    def _complete_transaction(self) -> None:
        self.state = State.READY
        self.transaction_started = False
        self.partitions_in_txn = set()
        self.pending_partitions = set()
        self.adding_partitions = set()
        self.last_error = None

    # -- the requests ------------------------------------------------------------------------------
    def _find_coordinator(self, key_type: int, key: str) -> _Handler:
        def handle(resp):
            if resp.coordinators:          # v4+
                c = resp.coordinators[0]
                code, node, host, port, msg = c.error_code, c.node_id, c.host, c.port, c.error_message
            else:
                code, node, host, port, msg = resp.error_code, resp.node_id, resp.host, resp.port, \
                    getattr(resp, "error_message", None)
            if code == ErrorCode.NONE:
                self.coordinators[(key_type, key)] = (node, host, port)
            elif E.for_code(code).retriable:
                self.backoff_until = time.monotonic() + self.retry_backoff_s
            else:
                self._fail(code, msg, fatal=key_type == TRANSACTION)
        def build(version=None):
            if version is not None and version >= 4:
                return FindCoordinatorRequest(key_type=key_type, coordinator_keys=[key])
            return FindCoordinatorRequest(key=key, key_type=key_type)
        return _Handler(key_type, key, ApiKey.FIND_COORDINATOR, build, handle, None)

    def _init_producer_id(self, result) -> _Handler:
        def handle(resp):
            code = resp.error_code
            if code == ErrorCode.NONE:
                self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
                self.next_sequence = {}
                self.last_acked_sequence = {}
                self._complete_transaction()
                result.done()
            elif code in _COORDINATOR_MOVED:
                self.coordinators.pop((TRANSACTION, self.transactional_id), None)
                self._retry(h, backoff=False)
            elif code in _RETRY:
                self._retry(h)
            else:
                result.done(self._fail(code, None, fatal=True))
        h = _Handler(TRANSACTION, self.transactional_id, ApiKey.INIT_PRODUCER_ID,
                     lambda version=None: InitProducerIdRequest(transactional_id=self.transactional_id,
                                                   transaction_timeout_ms=self.transaction_timeout_ms,
                                                   producer_id=-1, producer_epoch=-1),
                     handle, result)
        return h

    def _add_partitions(self, tps: list) -> _Handler:
        def build(version=None):
            by_topic: dict = {}
            for tp in tps:
                by_topic.setdefault(tp[0], []).append(tp[1])
            return apt.AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=self.transactional_id, v3_and_below_producer_id=self.producer_id,
                v3_and_below_producer_epoch=self.producer_epoch,
                v3_and_below_topics=[apt.AddPartitionsToTxnTopic(name=t, partitions=ps)
                                     for t, ps in sorted(by_topic.items())])

        def handle(resp):
            results = resp.results_by_topic_v3_and_below
            codes = {TopicPartition(t.name, p.partition_index): p.partition_error_code
                     for t in results for p in t.results_by_partition}
            bad = {tp: c for tp, c in codes.items() if c != ErrorCode.NONE}
            if not bad:
                self.partitions_in_txn |= self.adding_partitions
                self.transaction_started = True
                self.adding_partitions = set()
                return
            worst = next(iter(bad.values()))
            if any(c in _COORDINATOR_MOVED for c in bad.values()):
                self.coordinators.pop((TRANSACTION, self.transactional_id), None)
                self._retry(h, backoff=False)
            elif all(c in _RETRY for c in bad.values()):
                self._retry(h)
            else:
                real = [c for c in bad.values() if c != ErrorCode.OPERATION_NOT_ATTEMPTED] or [worst]
                self.adding_partitions = set()
                self._fail(real[0], f"AddPartitionsToTxn failed for {sorted(bad)}", fatal=real[0] in _FENCED)
        h = _Handler(TRANSACTION, self.transactional_id, ApiKey.ADD_PARTITIONS_TO_TXN, build, handle, None,
                     version=3)
        return h

    def _add_offsets(self, offsets: dict, group: ConsumerGroupMetadata, result) -> _Handler:
        def handle(resp):
            code = resp.error_code
            if code == ErrorCode.NONE:
                self.transaction_started = True
                self._queue.appendleft(self._txn_offset_commit(offsets, group, result))
            elif code in _COORDINATOR_MOVED:
                self.coordinators.pop((TRANSACTION, self.transactional_id), None)
                self._retry(h, backoff=False)
            elif code in _RETRY:
                self._retry(h)
            else:
                result.done(self._fail(code, None, fatal=code in _FENCED))
        h = _Handler(TRANSACTION, self.transactional_id, ApiKey.ADD_OFFSETS_TO_TXN,
                     lambda version=None: aot.AddOffsetsToTxnRequest(transactional_id=self.transactional_id,
                                                        producer_id=self.producer_id,
                                                        producer_epoch=self.producer_epoch, group_id=group.group_id),
                     handle, result)
        return h

    def _txn_offset_commit(self, offsets: dict, group: ConsumerGroupMetadata, result) -> _Handler:
        def build(version=None):
            by_topic: dict = {}
            for tp, om in offsets.items():
                offset, meta, epoch = (om, "", -1) if isinstance(om, int) else \
                    (om.offset, om.metadata, getattr(om, "leader_epoch", -1))
                by_topic.setdefault(tp[0], []).append(toc.TxnOffsetCommitRequestPartition(
                    partition_index=tp[1], committed_offset=offset, committed_leader_epoch=epoch,
                    committed_metadata=meta))
            return toc.TxnOffsetCommitRequest(
                transactional_id=self.transactional_id, group_id=group.group_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, generation_id=group.generation_id, member_id=group.member_id,
                group_instance_id=group.group_instance_id,
                topics=[toc.TxnOffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in sorted(by_topic.items())])

        def handle(resp):
            codes = [p.error_code for t in resp.topics for p in t.partitions]
            bad = [c for c in codes if c != ErrorCode.NONE]
            if not bad:
                self.transaction_started = True
                result.done()
            elif any(c in _COORDINATOR_MOVED for c in bad):
                self.coordinators.pop((GROUP, group.group_id), None)
                self._retry(h, backoff=False)
            elif all(c in _RETRY for c in bad):
                self._retry(h)
            else:
                result.done(self._fail(bad[0], "TxnOffsetCommit failed", fatal=bad[0] in _FENCED))
        h = _Handler(GROUP, group.group_id, ApiKey.TXN_OFFSET_COMMIT, build, handle, result,
                     version=5 if self.transaction_v2 else None)
        return h

    def _end_txn(self, commit: bool, result) -> _Handler:
        def handle(resp):
            code = resp.error_code
            if code == ErrorCode.NONE:
                if getattr(resp, "producer_epoch", -1) >= 0 and self.transaction_v2:
                    # transaction version 2: the next transaction's id and epoch; its sequences restart
                    self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
                    self.next_sequence = {}
                    self.last_acked_sequence = {}
                self._complete_transaction()
                result.done()
            elif code in _COORDINATOR_MOVED:
                self.coordinators.pop((TRANSACTION, self.transactional_id), None)
                self._retry(h, backoff=False)
            elif code in _RETRY:
                self._retry(h)
            else:
                result.done(self._fail(code, None, fatal=True))
        h = _Handler(TRANSACTION, self.transactional_id, ApiKey.END_TXN,
                     lambda version=None: et.EndTxnRequest(transactional_id=self.transactional_id, producer_id=self.producer_id,
                                              producer_epoch=self.producer_epoch, committed=commit),
                     handle, result, version=5 if self.transaction_v2 else None)
        return h

"""TransactionCoordinator: transactional ids, their producer ids/epochs and transactions.

Kafka: ``core/.../coordinator/transaction/TransactionCoordinator.scala``,
``TransactionStateManager.scala`` (loading, appends, expiry) and
``TransactionMarkerChannelManager.scala`` / ``TransactionMarkerRequestCompletionHandler``
(markers), 4.0: transaction version 1 semantics for clients below EndTxn v5, and
transaction version 2 (KIP-890 part 2) for those that send EndTxn v5 (and whose
partitions the leaders add through AddPartitionsToTxn v5 on Produce v12 / TxnOffsetCommit
v5): every EndTxn bumps the producer epoch, the markers carry the bumped epoch and the
response names it, so a late request of an earlier transaction (its epoch is older) can
no longer end or join the next one; a retry of the last EndTxn is recognised by its
epoch being one below the current one.

Ownership. A transactional id lives in ``__transaction_state`` partition
``abs(java hashCode(id)) % transaction.state.log.num.partitions``; the
:class:`~kbroker.coordinator.runtime.CoordinatorRuntime` holds the partition table,
loads partitions (replaying :mod:`.log` records into :class:`TransactionMetadata`)
and appends. Every change is two-phase (see :mod:`.metadata`): prepare under the
metadata's lock (``pending_state`` blocks concurrent changes: CONCURRENT_TRANSACTIONS),
append the record, complete on success or clear the pending state on failure, answer.

EndTxn writes PrepareCommit/PrepareAbort and answers; then the coordinator sends a
WriteTxnMarkers request for every partition of the transaction to its leader (through
the :class:`MarkerChannel`), retries retriable failures after
``MARKER_RETRY_BACKOFF_MS``, removes each partition once its marker is written, and
writes CompleteCommit/CompleteAbort when none is left (retried until written, or until
the partition is no longer ours). Until then the id answers CONCURRENT_TRANSACTIONS.
A partition loaded with transactions in PrepareCommit/PrepareAbort resends their markers.

Timers (runtime clock): Ongoing transactions older than their timeout are aborted
with a bumped epoch (the producer is fenced) every
``transaction.abort.timed.out.transaction.cleanup.interval.ms``; ids idle (Empty or
Complete*) for ``transactional.id.expiration.ms`` get a tombstone every
``transaction.remove.expired.transaction.cleanup.interval.ms``.

Locking: ``_lock`` guards ``_txns`` and ``_coordinator_epochs`` only (a leaf lock);
each TransactionMetadata has its own reentrant lock. Callbacks (answers, appends'
completions, marker results) run without ``_lock``; no callback is called while a
metadata lock is held, except the runtime's append, whose completion may run inline
(the lock is reentrant).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Protocol

from kbroker.coordinator.runtime import CoordinatorRuntime
from kbroker.coordinator.transaction import log as txnlog
from kbroker.coordinator.transaction.metadata import (
    NO_PRODUCER_EPOCH, NO_PRODUCER_ID, SHORT_MAX, IllegalTransitionError, TransactionMetadata, TransactionState,
    TxnTransitMetadata, supports_epoch_bump,
)
from kbroker.protocol import ErrorCode
from kbroker.server.init_producer_id import InitProducerIdResult
from kbroker.server.timer import TimerTask

log = logging.getLogger(__name__)

__all__ = ["TransactionConfig", "TransactionCoordinator", "MarkerChannel", "TransactionDescription",
           "ListedTransaction", "build_transaction_coordinator"]

E = ErrorCode
NONE = E.NONE
S = TransactionState

MARKER_RETRY_BACKOFF_MS = 100
COMPLETION_RETRY_BACKOFF_MS = 100

#: WriteTxnMarkers partition errors (TransactionMarkerRequestCompletionHandler)
_MARKER_RETRIABLE = frozenset({E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS,
                               E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.REQUEST_TIMED_OUT, E.KAFKA_STORAGE_ERROR})
_MARKER_CANCEL = frozenset({E.INVALID_PRODUCER_EPOCH, E.TRANSACTION_COORDINATOR_FENCED})
_MARKER_SKIP = frozenset({E.UNSUPPORTED_FOR_MESSAGE_FORMAT, E.UNSUPPORTED_VERSION})


@dataclass(frozen=True)
class TransactionConfig:
    """The broker settings the coordinator uses (Kafka's names and defaults)."""

    transaction_state_log_num_partitions: int = 50
    transaction_max_timeout_ms: int = 900000
    transactional_id_expiration_ms: int = 604800000
    abort_timed_out_transaction_cleanup_interval_ms: int = 10000
    remove_expired_transaction_cleanup_interval_ms: int = 3600000

    @classmethod
    def from_kafka_config(cls, config) -> "TransactionConfig":
        return cls(
            transaction_state_log_num_partitions=config["transaction.state.log.num.partitions"],
            transaction_max_timeout_ms=config["transaction.max.timeout.ms"],
            transactional_id_expiration_ms=config["transactional.id.expiration.ms"],
            abort_timed_out_transaction_cleanup_interval_ms=config[
                "transaction.abort.timed.out.transaction.cleanup.interval.ms"],
            remove_expired_transaction_cleanup_interval_ms=config[
                "transaction.remove.expired.transaction.cleanup.interval.ms"],
        )


class MarkerChannel(Protocol):
    """Sends COMMIT/ABORT markers to partition leaders (WriteTxnMarkers, api 27).

    ``write_markers`` sends one transaction's marker for ``partitions`` and calls
    ``callback({partition: error_code})`` once per leader answered (subsets that
    together cover every partition exactly once), possibly inline, possibly later on
    another thread. A request that fails as a whole reports a retriable code
    (REQUEST_TIMED_OUT) for its partitions; a partition whose topic no longer exists
    is reported NONE (there is nothing to mark, as Kafka drops it).
    """

    def write_markers(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      partitions: set, callback: Callable[[dict], None]) -> None: ...


class TransactionDescription(NamedTuple):
    error: ErrorCode
    state: str = ""
    timeout_ms: int = 0
    start_time_ms: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    partitions: tuple = ()


class ListedTransaction(NamedTuple):
    transactional_id: str
    producer_id: int
    state: str


def _append_error(code: int) -> ErrorCode:
    """TransactionStateManager.appendTransactionToLog's mapping of append errors."""
    code = E(code) if code in E._value2member_map_ else E.UNKNOWN_SERVER_ERROR
    if code in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_ENOUGH_REPLICAS, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                E.REQUEST_TIMED_OUT):
        return E.COORDINATOR_NOT_AVAILABLE
    if code in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return E.NOT_COORDINATOR
    if code in (E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE):
        return E.UNKNOWN_SERVER_ERROR
    return code


class _Task(TimerTask):
    def __init__(self, delay_ms: int, fn: Callable[[], None], what: str) -> None:
        super().__init__(delay_ms)
        self.fn = fn
        self.what = what

    def run(self) -> None:
        try:
            self.fn()
        except Exception:
            log.exception("transaction coordinator: %s failed", self.what)


class _PendingCompletion:
    """A transaction whose markers are being written (Kafka's PendingCompleteTxn)."""

    __slots__ = ("transactional_id", "metadata", "coordinator_epoch", "commit", "transit", "done")

    def __init__(self, transactional_id: str, metadata: TransactionMetadata, coordinator_epoch: int, commit: bool,
                 transit: TxnTransitMetadata) -> None:
        self.transactional_id = transactional_id
        self.metadata = metadata
        self.coordinator_epoch = coordinator_epoch
        self.commit = commit
        self.transit = transit
        self.done = False


class _TxnShard:
    def __init__(self, coordinator: "TransactionCoordinator") -> None:
        self.coordinator = coordinator

    def load(self, partition: int, records) -> int:
        return self.coordinator._load_transactions(partition, records)

    def on_loaded(self, partition: int) -> None:
        self.coordinator._resume_pending_markers(partition)

    def unload(self, partition: int) -> None:
        self.coordinator._unload_transactions(partition)


class TransactionCoordinator:
    """See the module docstring. Public methods are thread-safe; answers come through callbacks.

    ``txn_log``: a :class:`~kbroker.coordinator.runtime.CoordinatorLog` over
    ``__transaction_state``. ``generate_producer_id``: the broker's producer id allocator.
    ``marker_channel``: a :class:`MarkerChannel`. ``time_ms``/``reaper_enabled``: as the
    group coordinator (tests inject a fake clock and call :meth:`advance_timers`).
    ``coordinator_epoch_for(partition)``: the ``__transaction_state`` partition's leader
    epoch, Kafka's coordinator epoch (it survives restarts, so partition leaders can fence
    markers of an older coordinator); without it, one more than the previous load here.
    """

    def __init__(self, config: TransactionConfig, txn_log, generate_producer_id: Callable[[], int],
                 marker_channel: MarkerChannel, *, time_ms: Callable[[], int] | None = None,
                 reaper_enabled: bool = True, broker_id: int = 0,
                 coordinator_epoch_for: Callable[[int], int | None] | None = None) -> None:
        self.config = config
        self._coordinator_epoch_for = coordinator_epoch_for
        self._generate_producer_id = generate_producer_id
        self.marker_channel = marker_channel
        self._runtime = CoordinatorRuntime(
            "transaction-state", txnlog.TRANSACTION_STATE_TOPIC, config.transaction_state_log_num_partitions,
            txn_log, _TxnShard(self), time_ms=time_ms, reaper_enabled=reaper_enabled, broker_id=broker_id)
        self._time_ms = self._runtime.time_ms
        self._timer = self._runtime.new_purgatory("TransactionTimers", "txn-timers").timer
        self._lock = threading.Lock()
        self._txns: dict[str, TransactionMetadata] = {}
        self._coordinator_epochs: dict[int, int] = {}
        self._pending_epochs: dict[int, int] = {}

    # ==================================================================================
    # lifecycle and partitions
    # ==================================================================================

    def now_ms(self) -> int:
        return self._time_ms()

    def partition_for(self, transactional_id: str) -> int:
        return self._runtime.partition_for(transactional_id)

    def is_serving(self, transactional_id: str) -> bool:
        """True if this coordinator owns the id's partition (loaded or loading)."""
        return self._runtime.owns(self.partition_for(transactional_id))

    @property
    def is_active(self) -> bool:
        return self._runtime.is_active

    def startup(self, partitions: Iterable[int] | None = None, *, background: bool = True,
                enable_expiration: bool = True) -> None:
        """Become active, load ``partitions`` (default: all) and start the expiry timers."""
        self._runtime.startup(partitions, background=background)
        if enable_expiration:
            self._schedule_periodic(self.config.abort_timed_out_transaction_cleanup_interval_ms, self._abort_task,
                           "abort of timed-out transactions")
            self._schedule_periodic(self.config.remove_expired_transaction_cleanup_interval_ms, self._expire_task,
                           "removal of expired transactional ids")

    def wait_loaded(self, timeout_s: float = 30.0) -> bool:
        return self._runtime.wait_loaded(timeout_s)

    def load_partition(self, partition: int, coordinator_epoch: int | None = None) -> int:
        """Replay ``__transaction_state-<partition>`` and serve its ids. ``coordinator_epoch``:
        the partition's leader epoch (sent with markers; a marker of an older epoch is
        refused by the partition leaders); default: one more than the last load here."""
        if coordinator_epoch is not None:
            with self._lock:
                self._pending_epochs[partition] = coordinator_epoch
        return self._runtime.load_partition(partition)

    def _next_coordinator_epoch(self, partition: int) -> int:
        """``_lock`` held: the epoch of a load without an explicit one."""
        if self._coordinator_epoch_for is not None:
            epoch = self._coordinator_epoch_for(partition)
            if epoch is not None and epoch >= 0:
                return epoch
        return self._coordinator_epochs.get(partition, -1) + 1

    def unload_partition(self, partition: int) -> None:
        self._runtime.unload_partition(partition)

    def shutdown(self) -> None:
        """Unload everything, stop the timers and the marker channel. Idempotent."""
        self._runtime.shutdown()
        close = getattr(self.marker_channel, "close", None)
        if close is not None:
            close()

    def advance_timers(self) -> None:
        """Run every timer task due by the clock (tests with ``reaper_enabled=False``)."""
        self._runtime.advance_timers()

    def _schedule(self, delay_ms: int, fn: Callable[[], None], what: str) -> None:
        self._timer.add(_Task(delay_ms, fn, what))

    def _schedule_periodic(self, delay_ms: int, fn: Callable[[], None], what: str) -> None:
        """Re-arming tasks (the expiry checks) stop when the coordinator shuts down."""
        if self._runtime.is_active:
            self._timer.add(_Task(delay_ms, fn, what))

    def _abort_task(self) -> None:
        try:
            self.abort_timed_out_transactions()
        finally:
            self._schedule_periodic(self.config.abort_timed_out_transaction_cleanup_interval_ms, self._abort_task,
                           "abort of timed-out transactions")

    def _expire_task(self) -> None:
        try:
            self.remove_expired_transactional_ids()
        finally:
            self._schedule_periodic(self.config.remove_expired_transaction_cleanup_interval_ms, self._expire_task,
                           "removal of expired transactional ids")

    # -- the runtime's shard ----------------------------------------------------------------

    def _load_transactions(self, partition: int, records) -> int:
        loaded: dict[str, TxnTransitMetadata] = {}
        for rec in records:
            try:
                r = txnlog.read_record(rec.key, rec.value)
            except Exception as e:
                log.warning("__transaction_state-%d offset %d: unreadable record skipped (%s)", partition,
                            rec.offset, e)
                continue
            if r is None:
                continue
            if r.transit is None:
                loaded.pop(r.transactional_id, None)
            else:
                loaded[r.transactional_id] = r.transit
        with self._lock:
            for tid in [t for t in self._txns if self.partition_for(t) == partition]:
                del self._txns[tid]
            for tid, t in loaded.items():
                self._txns[tid] = TransactionMetadata.from_transit(tid, t)
            epoch = self._pending_epochs.pop(partition, None)
            self._coordinator_epochs[partition] = self._next_coordinator_epoch(partition) if epoch is None else epoch
        return len(loaded)

    def _resume_pending_markers(self, partition: int) -> None:
        """Transactions loaded in PrepareCommit/PrepareAbort: write their markers again."""
        with self._lock:
            epoch = self._coordinator_epochs.get(partition, 0)
            txns = [(tid, md) for tid, md in self._txns.items() if self.partition_for(tid) == partition]
        for tid, md in txns:
            with md.lock:
                if md.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT) or md.pending_state is not None:
                    continue
                pending = _PendingCompletion(tid, md, epoch, md.state is S.PREPARE_COMMIT,
                                             md.prepare_complete(self._time_ms()))
            log.info("transactional id %s loaded in %s: sending its markers again", tid, md.state.state_name)
            self._send_markers(pending, None)

    def _unload_transactions(self, partition: int) -> None:
        with self._lock:
            for tid in [t for t in self._txns if self.partition_for(t) == partition]:
                del self._txns[tid]

    # -- lookup -----------------------------------------------------------------------------

    def _lookup(self, transactional_id: str) -> tuple[ErrorCode | None, TransactionMetadata | None, int]:
        """(partition error, metadata or None, coordinator epoch) — Kafka's getTransactionState."""
        p = self.partition_for(transactional_id)
        err = self._runtime.partition_error(p)
        if err is not None:
            return err, None, -1
        with self._lock:
            return None, self._txns.get(transactional_id), self._coordinator_epochs.get(p, 0)

    def _still_owner(self, transactional_id: str, md: TransactionMetadata, coordinator_epoch: int) -> bool:
        p = self.partition_for(transactional_id)
        if self._runtime.partition_error(p) is not None:
            return False
        with self._lock:
            return self._txns.get(transactional_id) is md and self._coordinator_epochs.get(p) == coordinator_epoch

    def metadata(self, transactional_id: str) -> TransactionMetadata | None:
        """The in-memory metadata (tests and tools; take ``md.lock`` to read it)."""
        with self._lock:
            return self._txns.get(transactional_id)

    def transactional_ids(self) -> list[str]:
        with self._lock:
            return list(self._txns)

    # -- appends ----------------------------------------------------------------------------

    def _append_transit(self, transactional_id: str, coordinator_epoch: int, md: TransactionMetadata,
                        transit: TxnTransitMetadata, callback: Callable[[ErrorCode], None], *,
                        keep_pending_on_error: bool = False) -> None:
        """Write ``transit`` (its pending state set); complete it or clear the pending state,
        then ``callback(error)``. A change of owner or coordinator epoch meanwhile answers
        NOT_COORDINATOR and leaves the metadata alone (Kafka's appendTransactionToLog)."""
        kv = txnlog.tombstone(transactional_id) if transit.state is S.DEAD else txnlog.record(transactional_id,
                                                                                              transit)

        def on_append(code: int, _base: int) -> None:
            err = NONE if code == 0 else _append_error(code)
            with md.lock:
                owner = self._still_owner(transactional_id, md, coordinator_epoch)
                if err == NONE:
                    if not owner:
                        log.info("transactional id %s: the coordinator changed while writing %s", transactional_id,
                                 transit.state.state_name)
                        err = E.NOT_COORDINATOR
                    elif transit.state is S.DEAD:
                        md.pending_state = None
                        md.state = S.DEAD
                        with self._lock:
                            if self._txns.get(transactional_id) is md:
                                del self._txns[transactional_id]
                    else:
                        try:
                            md.complete_transition_to(transit)
                        except IllegalTransitionError:
                            log.exception("transactional id %s", transactional_id)
                            md.pending_state = None
                            err = E.UNKNOWN_SERVER_ERROR
                elif owner and not keep_pending_on_error:
                    log.info("transactional id %s: writing %s failed (%s); transition aborted", transactional_id,
                             transit.state.state_name, err.name)
                    md.pending_state = None
            callback(err)

        self._runtime.append(self.partition_for(transactional_id), [kv], on_append)

    # ==================================================================================
    # InitProducerId
    # ==================================================================================

    def handle_init_producer_id(self, transactional_id: str, transaction_timeout_ms: int,
                                expected: tuple[int, int] | None,
                                callback: Callable[[InitProducerIdResult], None]) -> None:
        """InitProducerId for a transactional id (the request checks are done by the caller:
        :func:`kbroker.server.init_producer_id.handle_init_producer_id`)."""
        def fail(err: ErrorCode) -> None:
            callback(InitProducerIdResult(int(err)))

        err, md, cepoch = self._lookup(transactional_id)
        if err is not None:
            return fail(err)
        if md is None:
            try:
                pid = self._generate_producer_id()
            except Exception:
                log.exception("no producer id for transactional id %s", transactional_id)
                return fail(E.UNKNOWN_SERVER_ERROR)
            created = TransactionMetadata(transactional_id, pid, NO_PRODUCER_ID, NO_PRODUCER_EPOCH,
                                          NO_PRODUCER_EPOCH, transaction_timeout_ms, S.EMPTY,
                                          txn_last_update_timestamp=self._time_ms())
            with self._lock:
                md = self._txns.setdefault(transactional_id, created)
        with md.lock:
            r = self._prepare_init_producer_id(md, transaction_timeout_ms, expected)
        if not isinstance(r, TxnTransitMetadata):
            return fail(r)
        if r.state is S.PREPARE_EPOCH_FENCE:
            # abort the Ongoing transaction with the bumped epoch; the client retries (and bumps again)
            def aborted(error: ErrorCode, *_ids) -> None:
                if error != NONE:
                    with md.lock:
                        if md.pending_state is S.PREPARE_EPOCH_FENCE:  # refused before its write
                            md.pending_state = None
                fail(error if error != NONE else E.CONCURRENT_TRANSACTIONS)

            self._end_transaction(transactional_id, r.producer_id, r.producer_epoch, False, False, aborted)
            return

        def written(error: ErrorCode) -> None:
            if error == NONE:
                log.info("initialized transactional id %s with producer id %d and epoch %d", transactional_id,
                         r.producer_id, r.producer_epoch)
                callback(InitProducerIdResult(int(NONE), r.producer_id, r.producer_epoch))
            else:
                fail(error)

        self._append_transit(transactional_id, cepoch, md, r, written)

    def _prepare_init_producer_id(self, md: TransactionMetadata, timeout_ms: int,
                                  expected: tuple[int, int] | None) -> TxnTransitMetadata | ErrorCode:
        """Kafka's prepareInitProducerIdTransit (md.lock held)."""
        if md.pending_transition_in_progress:
            return E.CONCURRENT_TRANSACTIONS
        if expected is not None:
            pid, epoch = expected
            valid = (md.producer_epoch == NO_PRODUCER_EPOCH or pid == md.producer_id
                     or (pid == md.previous_producer_id and epoch >= 32766))
            if not valid:
                return E.PRODUCER_FENCED
        if md.state in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            return E.CONCURRENT_TRANSACTIONS
        if md.state in (S.COMPLETE_ABORT, S.COMPLETE_COMMIT, S.EMPTY):
            if md.is_producer_epoch_exhausted and (expected is None or expected[1] == md.producer_epoch):
                try:
                    new_pid = self._generate_producer_id()
                except Exception:
                    log.exception("no producer id for transactional id %s", md.transactional_id)
                    return E.UNKNOWN_SERVER_ERROR
                return md.prepare_producer_id_rotation(new_pid, timeout_ms, self._time_ms(), expected is not None)
            r = md.prepare_increment_producer_epoch(timeout_ms, None if expected is None else expected[1],
                                                    self._time_ms())
            return r if isinstance(r, TxnTransitMetadata) else E(r)
        if md.state is S.ONGOING:
            return md.prepare_fence_producer_epoch()
        log.error("transactional id %s found in state %s: should never happen", md.transactional_id,
                  md.state.state_name)
        return E.UNKNOWN_SERVER_ERROR

    # ==================================================================================
    # AddPartitionsToTxn / AddOffsetsToTxn
    # ==================================================================================

    def handle_add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                              partitions: Iterable[tuple[str, int]], callback: Callable[[ErrorCode], None],
                              client_transaction_version: int = 0) -> None:
        """Add ``partitions`` ((topic, partition) pairs) to the ongoing transaction (starting
        one if needed); ``callback(error)`` once written. ``client_transaction_version`` 2:
        a partition leader's implicit add for a transaction version 2 producer."""
        if not transactional_id:
            return callback(E.INVALID_REQUEST)
        err, md, cepoch = self._lookup(transactional_id)
        if err is not None:
            return callback(err)
        if md is None:
            return callback(E.INVALID_PRODUCER_ID_MAPPING)
        parts = set(partitions)
        with md.lock:
            if md.producer_id != producer_id:
                return callback(E.INVALID_PRODUCER_ID_MAPPING)
            if md.producer_epoch != producer_epoch:
                return callback(E.PRODUCER_FENCED)
            if md.pending_transition_in_progress or md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                return callback(E.CONCURRENT_TRANSACTIONS)
            if md.state is S.ONGOING and parts <= md.topic_partitions:
                return callback(NONE)
            try:
                transit = md.prepare_add_partitions(parts, self._time_ms(), client_transaction_version)
            except IllegalTransitionError:
                log.exception("transactional id %s", transactional_id)
                return callback(E.INVALID_TXN_STATE)
        self._append_transit(transactional_id, cepoch, md, transit, callback)

    def handle_verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                 partitions: Iterable[tuple[str, int]]) -> dict:
        """KIP-890 part 1 (AddPartitionsToTxn v4+ ``verify_only``): is each partition in the
        ongoing transaction? {partition: error}: NONE or TRANSACTION_ABORTABLE, or one
        error for all (INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED, CONCURRENT_TRANSACTIONS,
        the coordinator's)."""
        parts = list(partitions)
        if not transactional_id:
            return {tp: E.INVALID_REQUEST for tp in parts}
        err, md, _ = self._lookup(transactional_id)
        if err is None and md is None:
            err = E.INVALID_PRODUCER_ID_MAPPING
        if err is None:
            with md.lock:
                if md.producer_id != producer_id:
                    err = E.INVALID_PRODUCER_ID_MAPPING
                elif md.producer_epoch != producer_epoch:
                    err = E.PRODUCER_FENCED
                elif md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                    err = E.CONCURRENT_TRANSACTIONS
                else:
                    return {tp: (NONE if tp in md.topic_partitions else E.TRANSACTION_ABORTABLE) for tp in parts}
        return {tp: err for tp in parts}

    # ==================================================================================
    # EndTxn and the markers
    # ==================================================================================

    def handle_end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                               callback: Callable[..., None], client_transaction_version: int = 0, *,
                               with_producer: bool = False) -> None:
        """EndTxn: write PrepareCommit/PrepareAbort, answer, then write the markers.
        ``callback(error)``, or ``callback(error, producer_id, producer_epoch)`` with
        ``with_producer`` (EndTxn v5: the producer's id and epoch for its next transaction,
        -1/-1 on error). ``client_transaction_version`` 2 (EndTxn v5): bump the epoch."""
        def answer(err: ErrorCode, pid: int = NO_PRODUCER_ID, epoch: int = NO_PRODUCER_EPOCH) -> None:
            if with_producer:
                callback(err, pid, epoch)
            else:
                callback(err)

        if not transactional_id:
            return answer(E.INVALID_REQUEST)
        self._end_transaction(transactional_id, producer_id, producer_epoch, commit, True, answer,
                              client_transaction_version)

    def _end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                         from_client: bool, callback: Callable[..., None], client_transaction_version: int = 0
                         ) -> None:
        """``callback(error, producer_id, producer_epoch)`` (the ids only with NONE)."""
        err, md, cepoch = self._lookup(transactional_id)
        if err is not None:
            return callback(err)
        if md is None:
            return callback(E.INVALID_PRODUCER_ID_MAPPING)
        is_epoch_fence = False
        with md.lock:
            fencing = md.pending_state is S.PREPARE_EPOCH_FENCE
            state = md.state
            # Kafka's endTransaction epoch rules: with transaction version 2 the epoch of a
            # new EndTxn equals the current one, and a retry of the last one is one below
            tv2 = not fencing and supports_epoch_bump(md.client_transaction_version)
            retry_on_overflow = (tv2 and md.previous_producer_id == producer_id and producer_epoch == SHORT_MAX - 1
                                 and md.producer_epoch == 0)
            retry_on_bump = self._end_txn_epoch_bumped(md, producer_epoch)
            if tv2:
                if state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                    valid_epoch = retry_on_bump
                elif state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                    valid_epoch = retry_on_bump or retry_on_overflow
                else:
                    valid_epoch = producer_epoch == md.producer_epoch
            else:
                valid_epoch = (not from_client or producer_epoch == md.producer_epoch) \
                    and producer_epoch >= md.producer_epoch
            # transaction version 2's empty abort: none of the transaction's requests reached
            # the coordinator (a produce lost or still on its way); bump the epoch all the same,
            # so that such a request arriving later is fenced
            empty_abort = (from_client and supports_epoch_bump(client_transaction_version) and not commit
                           and state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
                           and producer_epoch == md.producer_epoch)
            if md.producer_id != producer_id and not retry_on_overflow:
                return callback(E.INVALID_PRODUCER_ID_MAPPING)
            busy = md.pending_transition_in_progress and not (fencing and not from_client)
            # version 2 checks for a pending transition before the epoch (KAFKA-18464): an
            # empty abort right after a commit waits for it instead of being fenced by its bump
            if busy and supports_epoch_bump(client_transaction_version):
                return callback(E.CONCURRENT_TRANSACTIONS)
            if not (valid_epoch or empty_abort):
                return callback(E.PRODUCER_FENCED)
            if busy:
                return callback(E.CONCURRENT_TRANSACTIONS)
            if state is S.ONGOING or empty_abort:
                next_state = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
                if fencing:
                    if commit:
                        return callback(E.CONCURRENT_TRANSACTIONS)
                    # the fence's bumped epoch goes into the PrepareAbort record
                    is_epoch_fence = True
                    md.pending_state = None
                    md.producer_epoch = producer_epoch
                    md.last_producer_epoch = NO_PRODUCER_EPOCH
                    client_transaction_version = 0     # the fence's bump is the only one
                next_pid = NO_PRODUCER_ID
                if supports_epoch_bump(client_transaction_version) and md.is_producer_epoch_exhausted:
                    try:   # this bump uses the last epoch: the Complete record moves to a new producer id
                        next_pid = self._generate_producer_id()
                    except Exception:
                        log.exception("no producer id for transactional id %s", transactional_id)
                        return callback(E.UNKNOWN_SERVER_ERROR)
                transit = md.prepare_abort_or_commit(next_state, self._time_ms(), client_transaction_version,
                                                     next_pid)
            elif state is S.COMPLETE_COMMIT or state is S.COMPLETE_ABORT:
                if commit == (state is S.COMPLETE_COMMIT):
                    # a retry of an EndTxn that completed
                    return callback(NONE, md.producer_id, md.producer_epoch)
                return self._invalid_state(transactional_id, state, commit, callback)
            elif state is S.PREPARE_COMMIT or state is S.PREPARE_ABORT:
                if commit == (state is S.PREPARE_COMMIT):
                    return callback(E.CONCURRENT_TRANSACTIONS)
                return self._invalid_state(transactional_id, state, commit, callback)
            else:  # Empty (Dead and PrepareEpochFence are never current)
                return self._invalid_state(transactional_id, state, commit, callback)

        def written(error: ErrorCode) -> None:
            if error != NONE:
                if is_epoch_fence:
                    with md.lock:
                        md.has_failed_epoch_fence = True
                return callback(error)
            with md.lock:
                if md.producer_id != producer_id:
                    error = E.INVALID_PRODUCER_ID_MAPPING
                elif md.producer_epoch != producer_epoch and not self._end_txn_epoch_bumped(md, producer_epoch):
                    error = E.PRODUCER_FENCED
                elif md.pending_transition_in_progress:
                    error = E.CONCURRENT_TRANSACTIONS
                elif md.state is not (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT):
                    error = E.INVALID_TXN_STATE
                else:
                    # the producer's next transaction: after an overflow, the new id at epoch 0
                    ids = (md.producer_id, md.producer_epoch) if md.next_producer_id == NO_PRODUCER_ID \
                        else (md.next_producer_id, 0)
                    pending = _PendingCompletion(transactional_id, md, cepoch, commit,
                                                 md.prepare_complete(self._time_ms()))
            if error != NONE:
                return callback(error)
            callback(NONE, *ids)
            self._send_markers(pending, None)

        self._append_transit(transactional_id, cepoch, md, transit, written)

    @staticmethod
    def _end_txn_epoch_bumped(md: TransactionMetadata, producer_epoch: int) -> bool:
        """Kafka's endTxnEpochBumped: transaction version 2 and the current epoch is the
        request's plus one (the request is a retry of the EndTxn that bumped it)."""
        return (md.pending_state is not S.PREPARE_EPOCH_FENCE and supports_epoch_bump(md.client_transaction_version)
                and md.producer_epoch == producer_epoch + 1)

    @staticmethod
    def _invalid_state(transactional_id: str, state: TransactionState, commit: bool, callback) -> None:
        log.debug("transactional id %s: %s in state %s is not valid", transactional_id,
                  "commit" if commit else "abort", state.state_name)
        callback(E.INVALID_TXN_STATE)

    def _send_markers(self, pending: _PendingCompletion, partitions: set | None) -> None:
        """Send the markers of ``partitions`` (default: every partition still unmarked)."""
        md = pending.metadata
        if not self._still_owner(pending.transactional_id, md, pending.coordinator_epoch):
            log.info("transactional id %s is no longer coordinated here; its markers are not sent",
                     pending.transactional_id)
            return
        with md.lock:
            if partitions is None:
                partitions = set(md.topic_partitions)
            pid, epoch = md.producer_id, md.producer_epoch
        if not partitions:
            self._maybe_write_completion(pending)
            return
        self.marker_channel.write_markers(pid, epoch, pending.commit, pending.coordinator_epoch, set(partitions),
                                          lambda errors: self._on_marker_result(pending, errors))

    def _on_marker_result(self, pending: _PendingCompletion, errors: dict) -> None:
        md = pending.metadata
        tid = pending.transactional_id
        if not self._still_owner(tid, md, pending.coordinator_epoch):
            log.info("transactional id %s is no longer coordinated here; its markers are cancelled", tid)
            return
        retry = set()
        with md.lock:
            for tp, code in errors.items():
                err = E(code) if code in E._value2member_map_ else E.UNKNOWN_SERVER_ERROR
                if err == NONE or err in _MARKER_SKIP:
                    if err != NONE:
                        log.info("transactional id %s: the marker of %s failed with %s; dropped", tid, tp, err.name)
                    md.remove_partition(tp)
                elif err in _MARKER_CANCEL:
                    log.info("transactional id %s: the marker of %s failed with %s; the transaction's markers "
                             "are cancelled", tid, tp, err.name)
                    return
                else:
                    if err not in _MARKER_RETRIABLE:
                        log.error("transactional id %s: unexpected marker error %s for %s; retrying", tid, err.name,
                                  tp)
                    retry.add(tp)
        if retry:
            self._schedule(MARKER_RETRY_BACKOFF_MS, lambda: self._send_markers(pending, retry),
                           f"retry of markers for {tid}")
        else:
            self._maybe_write_completion(pending)

    def _maybe_write_completion(self, pending: _PendingCompletion) -> None:
        md = pending.metadata
        with md.lock:
            if md.topic_partitions or pending.done:
                return
            pending.done = True
        self._write_completion(pending)

    def _write_completion(self, pending: _PendingCompletion) -> None:
        tid = pending.transactional_id

        def written(error: ErrorCode) -> None:
            if error == NONE:
                log.debug("transactional id %s completed (%s)", tid, pending.transit.state.state_name)
            elif error in (E.NOT_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS):
                log.info("transactional id %s: no longer its coordinator; completion not written", tid)
            else:
                log.warning("transactional id %s: writing %s failed (%s); retrying", tid,
                            pending.transit.state.state_name, error.name)
                self._schedule(COMPLETION_RETRY_BACKOFF_MS, lambda: self._write_completion(pending),
                               f"retry of completion for {tid}")

        if not self._still_owner(tid, pending.metadata, pending.coordinator_epoch):
            return
        self._append_transit(tid, pending.coordinator_epoch, pending.metadata, pending.transit, written,
                             keep_pending_on_error=True)

    # ==================================================================================
    # DescribeTransactions / ListTransactions
    # ==================================================================================

    def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        if not self._runtime.is_active:
            return TransactionDescription(E.COORDINATOR_NOT_AVAILABLE)
        if not transactional_id:
            return TransactionDescription(E.INVALID_REQUEST)
        err, md, _ = self._lookup(transactional_id)
        if err is not None:
            return TransactionDescription(err)
        if md is None:
            return TransactionDescription(E.TRANSACTIONAL_ID_NOT_FOUND)
        with md.lock:
            if md.state is S.DEAD:
                return TransactionDescription(E.TRANSACTIONAL_ID_NOT_FOUND)
            return TransactionDescription(NONE, md.state.state_name, md.txn_timeout_ms, md.txn_start_timestamp,
                                          md.producer_id, md.producer_epoch, tuple(sorted(md.topic_partitions)))

    def list_transactions(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
                          duration_filter_ms: int = -1) -> tuple[ErrorCode, list[str], list[ListedTransaction]]:
        """(error, unknown state filters, transactions) — Kafka's listTransactionStates: nothing
        while a partition loads; state filters that name no state match nothing;
        ``duration_filter_ms`` >= 0: only transactions started longer ago than that (an id
        with no transaction has start -1, so it passes, as in Kafka)."""
        if not self._runtime.is_active:
            return E.COORDINATOR_NOT_AVAILABLE, [], []
        if self._runtime.any_loading():
            return E.COORDINATOR_LOAD_IN_PROGRESS, [], []
        state_filters = list(state_filters)
        states = set()
        unknown = []
        for name in state_filters:
            s = S.from_name(name)
            if s is None:
                unknown.append(name)
            else:
                states.add(s)
        pids = set(producer_id_filters)
        now = self._time_ms()
        with self._lock:
            txns = [md for tid, md in self._txns.items()
                    if self._runtime.partition_error(self.partition_for(tid)) is None]
        out = []
        for md in txns:
            with md.lock:  # Kafka's shouldInclude
                if md.state is S.DEAD:
                    continue
                if pids and md.producer_id not in pids:
                    continue
                if state_filters and md.state not in states:
                    continue
                if duration_filter_ms >= 0 and now - md.txn_start_timestamp <= duration_filter_ms:
                    continue
                out.append(ListedTransaction(md.transactional_id, md.producer_id, md.state.state_name))
        return NONE, unknown, out

    # ==================================================================================
    # expiry
    # ==================================================================================

    def abort_timed_out_transactions(self) -> int:
        """Abort (with a bumped epoch, fencing the producer) every Ongoing transaction older
        than its timeout; returns how many aborts started."""
        now = self._time_ms()
        with self._lock:
            txns = list(self._txns.items())
        started = 0
        for tid, md in txns:
            if self._runtime.partition_error(self.partition_for(tid)) is not None:
                continue
            with md.lock:
                if (md.state is not S.ONGOING or md.pending_transition_in_progress
                        or md.txn_start_timestamp + md.txn_timeout_ms >= now):
                    continue
                transit = md.prepare_fence_producer_epoch()
            log.info("aborting transaction of %s (producer id %d): it timed out after %d ms", tid,
                     transit.producer_id, md.txn_timeout_ms)
            started += 1

            def done(error: ErrorCode, *_ids, tid=tid, md=md) -> None:
                if error != NONE:
                    log.info("aborting the timed-out transaction of %s failed: %s", tid, error.name)
                    with md.lock:
                        if md.pending_state is S.PREPARE_EPOCH_FENCE:
                            md.pending_state = None

            self._end_transaction(tid, transit.producer_id, transit.producer_epoch, False, False, done)
        return started

    def remove_expired_transactional_ids(self) -> int:
        """Write a tombstone for every id idle longer than transactional.id.expiration.ms
        (Empty, CompleteCommit or CompleteAbort); returns how many were started."""
        now = self._time_ms()
        with self._lock:
            txns = list(self._txns.items())
        started = 0
        for tid, md in txns:
            err, _, cepoch = self._lookup(tid)
            if err is not None:
                continue
            with md.lock:
                if (not md.state.is_expiration_allowed or md.pending_transition_in_progress
                        or md.txn_last_update_timestamp > now - self.config.transactional_id_expiration_ms):
                    continue
                transit = md.prepare_dead()
            started += 1
            self._append_transit(tid, cepoch, md, transit, lambda error, tid=tid: log.log(
                logging.INFO if error == NONE else logging.WARNING, "expiring transactional id %s: %s", tid,
                error.name))
        return started


# ==================================================================================
# the broker's wiring
# ==================================================================================

def transaction_state_topic_configs(config) -> dict:
    """``__transaction_state``'s topic configs (Kafka's TransactionLog: compacted, uncompressed)."""
    return {
        "cleanup.policy": "compact",
        "compression.type": "uncompressed",
        "segment.bytes": str(config["transaction.state.log.segment.bytes"]),
        "min.insync.replicas": str(config["transaction.state.log.min.isr"]),
        "unclean.leader.election.enable": "false",
    }


def build_transaction_coordinator(broker) -> TransactionCoordinator:
    """Start a coordinator over ``__transaction_state`` with markers sent over the wire,
    and the replica manager's KIP-890 verifier (broker start-up).

    Single node: the topic is created now and this broker leads every partition, so all
    of them load in the background. A KRaft broker (``offsets_topic_on_demand``): the
    topic is created through the controller on the first FindCoordinator(TRANSACTION)
    (``broker.topic_manager.create_transaction_state_topic``); the broker's metadata
    publisher loads/unloads each partition as this broker starts/stops leading it
    (:func:`on_leader` / :func:`on_stop`); markers and verifications go to the leaders
    the metadata names; producer ids come from the broker's producer id manager
    (blocks from the controller on a KRaft broker)."""
    from kbroker.coordinator.runtime import ReplicaCoordinatorLog
    from kbroker.coordinator.transaction.markers import WireMarkerChannel
    from kbroker.server.txn_verification import AddPartitionsToTxnSender, TransactionVerifier

    c = broker.config
    cfg = TransactionConfig.from_kafka_config(c)
    kraft = getattr(broker, "offsets_topic_on_demand", False)
    if kraft:
        topic = broker.metadata.image.topics.get(txnlog.TRANSACTION_STATE_TOPIC)
    else:
        topic = broker.topic_manager.create_internal(txnlog.TRANSACTION_STATE_TOPIC,
                                                     cfg.transaction_state_log_num_partitions,
                                                     transaction_state_topic_configs(c))
    if topic is not None and topic.num_partitions != cfg.transaction_state_log_num_partitions:
        # the topic outlives the setting (Kafka: the existing topic wins)
        cfg = TransactionConfig(**{**cfg.__dict__, "transaction_state_log_num_partitions": topic.num_partitions})
    txn_log = ReplicaCoordinatorLog(broker.replica_manager, txnlog.TRANSACTION_STATE_TOPIC, c["request.timeout.ms"])

    if kraft:
        cache = broker.metadata_cache

        def leader_for(tp) -> int | None:
            leader = cache.leader_of(tp[0], tp[1])
            return None if leader is None else (leader[0] if leader[0] >= 0 else -1)

        listener = c.inter_broker_listener_name
        client_config = c.inter_broker_client_config()

        def endpoints() -> dict:
            # each broker's inter.broker.listener.name endpoint (a broker without one is skipped)
            return {i: (h, p) for i, h, p, _r in cache.alive_brokers(listener)}
    else:
        def leader_for(tp) -> int | None:
            t = broker.metadata.image.topics.get(tp[0])
            if t is None or not 0 <= tp[1] < t.num_partitions:
                return None
            return broker.node_id

        # the single node's markers come to itself: over its listener named
        # inter.broker.listener.name (default PLAINTEXT) when it has one, else its first
        own = c.inter_broker_listener_name
        own = own if any(l.name == own for l in c.advertised_listeners) else None
        client_config = c.inter_broker_client_config() if own else None

        def endpoints() -> dict:
            return {broker.node_id: broker.endpoint(own)}

    channel = WireMarkerChannel(leader_for, endpoints, name=f"txn-marker-sender-{broker.node_id}",
                                request_timeout_ms=c["request.timeout.ms"], client_config=client_config)

    def coordinator_epoch_for(partition: int) -> int | None:
        part = broker.replica_manager.get_partition((txnlog.TRANSACTION_STATE_TOPIC, partition))
        return None if part is None else part.leader_epoch

    coordinator = TransactionCoordinator(cfg, txn_log, broker.producer_id_manager.generate_producer_id, channel,
                                         broker_id=broker.node_id, coordinator_epoch_for=coordinator_epoch_for)
    coordinator.startup(() if kraft else range(cfg.transaction_state_log_num_partitions), background=True)

    def enabled() -> bool:
        return broker.dynamic_config.current["transaction.partition.verification.enable"]

    if kraft:
        def coordinator_node(tid: str) -> int | None:
            leader = cache.leader_of(txnlog.TRANSACTION_STATE_TOPIC, coordinator.partition_for(tid))
            return None if leader is None else leader[0]

        sender = AddPartitionsToTxnSender(endpoints, name=f"AddPartitionsToTxnSender-{broker.node_id}",
                                          request_timeout_ms=c["request.timeout.ms"], client_config=client_config)
    else:
        def coordinator_node(_tid: str) -> int | None:
            return broker.node_id

        sender = None
    broker.replica_manager.txn_verifier = TransactionVerifier(broker.node_id, enabled, coordinator_node,
                                                              lambda: coordinator, sender)
    return coordinator


def on_leader(coordinator: TransactionCoordinator, partition: int) -> None:
    """This broker now leads ``__transaction_state-<partition>``: load it in the background
    (requests for its ids meanwhile: COORDINATOR_LOAD_IN_PROGRESS)."""
    coordinator._runtime.schedule_load(partition)


def on_stop(coordinator: TransactionCoordinator, partition: int) -> None:
    """This broker no longer leads ``__transaction_state-<partition>``: its ids go (their
    pending markers are abandoned to the new leader, which resends them on load)."""
    coordinator.unload_partition(partition)

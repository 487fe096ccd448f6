"""TransactionMetadata: one transactional id's state and its legal transitions.

Kafka: ``core/.../coordinator/transaction/TransactionMetadata.scala`` (4.0). Transaction
version 0/1 (``client_transaction_version`` < 2): the epoch is bumped by InitProducerId
and by fencing only. Transaction version 2 (KIP-890 part 2, a client's EndTxn v5): every
PrepareCommit/PrepareAbort bumps the epoch (``last_producer_epoch`` keeps the one the
client used, so its retry is recognised), the markers carry the bumped epoch, and when
that bump reaches the last usable epoch a new producer id is allocated, recorded as
``next_producer_id`` in the Prepare record and made current (epoch 0) by the Complete one.

A transition is two-phase, as in Kafka: ``prepare_*`` checks it against the current
state, sets ``pending_state`` (so no second transition can start) and returns a
:class:`TxnTransitMetadata` — the record to write; once that record is written,
``complete_transition_to`` makes it the current state (or, if the write failed, the
caller clears ``pending_state``). Everything here runs under ``lock`` (the caller's).

States (``TransactionStatus`` in the log, by id)::

    0 Empty  1 Ongoing  2 PrepareCommit  3 PrepareAbort  4 CompleteCommit
    5 CompleteAbort  6 Dead  7 PrepareEpochFence

PrepareEpochFence is never written: it marks the bumped epoch of a producer being
fenced (InitProducerId or a timeout meeting an Ongoing transaction), which the abort
that follows writes with PrepareAbort.
"""
from __future__ import annotations

import enum
import threading
from typing import NamedTuple

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
SHORT_MAX = 32767

__all__ = ["TransactionState", "TxnTransitMetadata", "TransactionMetadata", "IllegalTransitionError",
           "is_epoch_exhausted", "supports_epoch_bump", "NO_PRODUCER_ID", "NO_PRODUCER_EPOCH"]


class TransactionState(enum.Enum):
    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    @property
    def id(self) -> int:
        return self.value[0]

    @property
    def state_name(self) -> str:
        """Kafka's name (DescribeTransactions / ListTransactions)."""
        return self.value[1]

    @classmethod
    def from_id(cls, state_id: int) -> "TransactionState":
        for s in cls:
            if s.id == state_id:
                return s
        raise ValueError(f"unknown transaction state id {state_id}")

    @classmethod
    def from_name(cls, name: str) -> "TransactionState | None":
        for s in cls:
            if s.state_name == name:
                return s
        return None

    @property
    def valid_previous_states(self) -> frozenset:
        return _VALID_PREVIOUS[self]

    @property
    def is_expiration_allowed(self) -> bool:
        return self in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)


S = TransactionState
_VALID_PREVIOUS = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    # transaction version 2's empty abort (nothing of the transaction reached the coordinator)
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}


def is_epoch_exhausted(epoch: int) -> bool:
    return epoch >= SHORT_MAX - 1


class IllegalTransitionError(Exception):
    """A transition the state machine forbids: a coordinator bug, never a client's error."""


class TxnTransitMetadata(NamedTuple):
    """The target of a transition: what is written to ``__transaction_state``."""

    producer_id: int
    prev_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    topic_partitions: frozenset
    txn_start_timestamp: int
    txn_last_update_timestamp: int
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = 0


def supports_epoch_bump(transaction_version: int) -> bool:
    """Transaction version 2: an epoch bump on every EndTxn (Kafka's TransactionVersion)."""
    return transaction_version >= 2


class TransactionMetadata:
    """One transactional id (see the module docstring). ``lock`` guards every field."""

    def __init__(self, transactional_id: str, producer_id: int, previous_producer_id: int, producer_epoch: int,
                 last_producer_epoch: int, txn_timeout_ms: int, state: TransactionState,
                 topic_partitions=(), txn_start_timestamp: int = -1, txn_last_update_timestamp: int = -1,
                 next_producer_id: int = NO_PRODUCER_ID, client_transaction_version: int = 0) -> None:
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.previous_producer_id = previous_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.txn_timeout_ms = txn_timeout_ms
        self.state = state
        self.topic_partitions: set = set(topic_partitions)
        self.txn_start_timestamp = txn_start_timestamp
        self.txn_last_update_timestamp = txn_last_update_timestamp
        #: transaction version 2: the producer id the Complete record switches to (epoch overflow)
        self.next_producer_id = next_producer_id
        #: the transaction version of the client's last transition (2: epoch bump per EndTxn)
        self.client_transaction_version = client_transaction_version
        self.pending_state: TransactionState | None = None
        #: a fence's bumped epoch may not have been written: do not bump again on the next try
        self.has_failed_epoch_fence = False
        self.lock = threading.RLock()

    def __repr__(self) -> str:
        return (f"TransactionMetadata({self.transactional_id!r}, pid={self.producer_id}, epoch={self.producer_epoch}, "
                f"last_epoch={self.last_producer_epoch}, state={self.state.state_name}, "
                f"pending={self.pending_state.state_name if self.pending_state else None}, "
                f"partitions={sorted(self.topic_partitions)})")

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    def remove_partition(self, tp) -> None:
        """A marker for ``tp`` was written (only while PrepareCommit/PrepareAbort)."""
        if self.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            raise IllegalTransitionError(f"{self}: removing a partition whose marker was written in state "
                                         f"{self.state.state_name}")
        self.topic_partitions.discard(tp)

    # -- prepare ----------------------------------------------------------------------------

    def prepare_fence_producer_epoch(self) -> TxnTransitMetadata:
        if self.producer_epoch == SHORT_MAX:
            raise IllegalTransitionError("cannot fence a producer whose epoch is Short.MaxValue")
        bumped = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(S.PREPARE_EPOCH_FENCE, self.producer_id, bumped, NO_PRODUCER_EPOCH, self.txn_timeout_ms,
                             frozenset(self.topic_partitions), self.txn_start_timestamp, self.txn_last_update_timestamp)

    def prepare_increment_producer_epoch(self, new_txn_timeout_ms: int, expected_epoch: int | None,
                                         now_ms: int) -> "TxnTransitMetadata | int":
        """InitProducerId's epoch bump (KIP-360 retries included). Returns the transit, or
        the error code PRODUCER_FENCED (as an int) for a fenced expected epoch."""
        from kbroker.server.init_producer_id import prepare_increment_producer_epoch
        if self.is_producer_epoch_exhausted:
            raise IllegalTransitionError(f"no producer epochs left for producer id {self.producer_id}")
        r = prepare_increment_producer_epoch(self.producer_epoch, self.last_producer_epoch, expected_epoch)
        if not isinstance(r, tuple):
            return int(r)
        epoch, last_epoch = r
        return self._prepare(S.EMPTY, self.producer_id, epoch, last_epoch, new_txn_timeout_ms, frozenset(), -1, now_ms)

    def prepare_producer_id_rotation(self, new_producer_id: int, new_txn_timeout_ms: int, now_ms: int,
                                     record_last_epoch: bool) -> TxnTransitMetadata:
        if self.state in (S.ONGOING, S.PREPARE_ABORT, S.PREPARE_COMMIT):
            raise IllegalTransitionError("cannot rotate producer ids while a transaction is pending")
        return self._prepare(S.EMPTY, new_producer_id, 0, self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
                             new_txn_timeout_ms, frozenset(), -1, now_ms)

    def prepare_add_partitions(self, partitions, now_ms: int, client_transaction_version: int | None = None
                               ) -> TxnTransitMetadata:
        start = now_ms if self.state in (S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT) else self.txn_start_timestamp
        return self._prepare(S.ONGOING, self.producer_id, self.producer_epoch, self.last_producer_epoch,
                             self.txn_timeout_ms, frozenset(self.topic_partitions | set(partitions)), start, now_ms,
                             tv=client_transaction_version)

    def prepare_abort_or_commit(self, new_state: TransactionState, now_ms: int, client_transaction_version: int = 0,
                                next_producer_id: int = NO_PRODUCER_ID) -> TxnTransitMetadata:
        """Transaction version 2 bumps the epoch (the caller made sure it cannot overflow:
        ``next_producer_id`` is the new producer id when this bump uses the last epoch). An
        abort from Empty/CompleteCommit/CompleteAbort is version 2's empty abort: a
        transaction none of whose requests reached the coordinator; it starts now."""
        epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        if supports_epoch_bump(client_transaction_version):
            epoch, last_epoch = self.producer_epoch + 1, self.producer_epoch
        start = self.txn_start_timestamp
        if self.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            start = now_ms
        return self._prepare(new_state, self.producer_id, epoch, last_epoch, self.txn_timeout_ms,
                             frozenset(self.topic_partitions), start, now_ms,
                             next_producer_id=next_producer_id, tv=client_transaction_version)

    def prepare_complete(self, now_ms: int) -> TxnTransitMetadata:
        new_state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        self.has_failed_epoch_fence = False  # the PrepareX record with the fenced epoch was written
        pid, epoch = self.producer_id, self.producer_epoch
        if supports_epoch_bump(self.client_transaction_version) and self.next_producer_id != NO_PRODUCER_ID:
            pid, epoch = self.next_producer_id, 0    # the epoch overflowed: the markers are written, switch
        return self._prepare(new_state, pid, epoch, self.producer_epoch, self.txn_timeout_ms, frozenset(),
                             self.txn_start_timestamp, now_ms, next_producer_id=NO_PRODUCER_ID)

    def prepare_dead(self) -> TxnTransitMetadata:
        return self._prepare(S.DEAD, self.producer_id, self.producer_epoch, self.last_producer_epoch,
                             self.txn_timeout_ms, frozenset(), self.txn_start_timestamp,
                             self.txn_last_update_timestamp)

    def _prepare(self, state: TransactionState, producer_id: int, epoch: int, last_epoch: int, timeout_ms: int,
                 partitions: frozenset, start_ts: int, update_ts: int, *, next_producer_id: int | None = None,
                 tv: int | None = None) -> TxnTransitMetadata:
        if self.pending_state is not None:
            raise IllegalTransitionError(f"{self}: preparing {state.state_name} while "
                                         f"{self.pending_state.state_name} is pending")
        if producer_id < 0:
            raise IllegalTransitionError(f"illegal producer id {producer_id}")
        if state is not S.DEAD and epoch < 0:
            raise IllegalTransitionError(f"illegal producer epoch {epoch}")
        if self.state not in state.valid_previous_states:
            raise IllegalTransitionError(f"{self}: {state.state_name} cannot follow {self.state.state_name}")
        self.pending_state = state
        return TxnTransitMetadata(producer_id, self.producer_id, epoch, last_epoch, timeout_ms, state, partitions,
                                  start_ts, update_ts,
                                  self.next_producer_id if next_producer_id is None else next_producer_id,
                                  self.client_transaction_version if tv is None else tv)

    # -- complete ---------------------------------------------------------------------------

    def complete_transition_to(self, t: TxnTransitMetadata) -> None:
        """The record of ``t`` is written: make it the current state (Kafka's checks)."""
        to = self.pending_state
        if to is None or to is not t.state:
            raise IllegalTransitionError(f"{self}: completing {t.state.state_name} without it pending")
        if to is S.EMPTY:
            bumped = t.producer_epoch == self.producer_epoch + 1 or (
                t.producer_epoch == 0 and t.producer_id != self.producer_id) or t.producer_epoch == self.producer_epoch
            if not bumped or t.topic_partitions or t.txn_start_timestamp != -1:
                self._fail(t)
            self.txn_timeout_ms = t.txn_timeout_ms
            self.producer_epoch = t.producer_epoch
            self.last_producer_epoch = t.last_producer_epoch
            self.producer_id = t.producer_id
            self.previous_producer_id = t.prev_producer_id
        elif to is S.ONGOING:
            if (not self._valid_producer_epoch(t) or not self.topic_partitions <= t.topic_partitions
                    or t.txn_timeout_ms != self.txn_timeout_ms):
                self._fail(t)
            self.txn_start_timestamp = t.txn_start_timestamp
            self.topic_partitions |= t.topic_partitions
        elif to in (S.PREPARE_ABORT, S.PREPARE_COMMIT):
            empty_abort = self.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
            if (not self._valid_producer_epoch(t) or set(self.topic_partitions) != set(t.topic_partitions)
                    or t.txn_timeout_ms != self.txn_timeout_ms
                    or (t.txn_start_timestamp != self.txn_start_timestamp and not empty_abort)):
                self._fail(t)
            self.txn_start_timestamp = t.txn_start_timestamp
            if supports_epoch_bump(t.client_transaction_version):
                self.producer_epoch = t.producer_epoch
                self.last_producer_epoch = t.last_producer_epoch
                self.next_producer_id = t.next_producer_id
        elif to in (S.COMPLETE_ABORT, S.COMPLETE_COMMIT):
            if (not self._valid_producer_epoch(t) or t.txn_timeout_ms != self.txn_timeout_ms
                    or t.txn_start_timestamp == -1):
                self._fail(t)
            self.txn_start_timestamp = t.txn_start_timestamp
            self.topic_partitions.clear()
            if supports_epoch_bump(t.client_transaction_version):
                self.producer_epoch = t.producer_epoch
                self.last_producer_epoch = t.last_producer_epoch
                self.previous_producer_id = t.prev_producer_id
                self.producer_id = t.producer_id
                self.next_producer_id = t.next_producer_id
        elif to is S.DEAD:
            if (self.state not in S.DEAD.valid_previous_states or self.topic_partitions
                    or t.producer_epoch != self.producer_epoch):
                self._fail(t)
        else:  # PrepareEpochFence is never written
            self._fail(t)
        self.state = to
        self.client_transaction_version = t.client_transaction_version
        self.txn_last_update_timestamp = t.txn_last_update_timestamp
        self.pending_state = None

    def _valid_producer_epoch(self, t: TxnTransitMetadata) -> bool:
        """Kafka's validProducerEpoch: a transaction version 2 Prepare record carries the
        bumped epoch (its last epoch is the current one); a Complete record after an
        overflow carries the new producer id at epoch 0 (its previous id is the current one)."""
        tv2 = supports_epoch_bump(t.client_transaction_version)
        overflow_complete = tv2 and t.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT) and t.producer_epoch == 0 \
            and t.producer_id != self.producer_id
        epoch = t.last_producer_epoch if overflow_complete or (
            tv2 and t.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)) else t.producer_epoch
        pid = t.prev_producer_id if overflow_complete else t.producer_id
        return epoch == self.producer_epoch and pid == self.producer_id

    def _fail(self, t: TxnTransitMetadata):
        raise IllegalTransitionError(f"{self}: transition to {t} is not valid")

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def from_transit(cls, transactional_id: str, t: TxnTransitMetadata) -> "TransactionMetadata":
        """The metadata a replayed record describes (``last_producer_epoch`` is not in the log)."""
        return cls(transactional_id, t.producer_id, t.prev_producer_id, t.producer_epoch, t.last_producer_epoch,
                   t.txn_timeout_ms, t.state, () if t.state is S.EMPTY else t.topic_partitions,
                   t.txn_start_timestamp, t.txn_last_update_timestamp, t.next_producer_id,
                   t.client_transaction_version)

"""KIP-890 part 1 on the log: verification guards of transactional producers.

Kafka: ``VerificationGuard``, ``VerificationStateEntry`` and their use in
``UnifiedLog`` (``maybeStartTransactionVerification``, ``batchMissingRequiredVerification``)
and ``ProducerStateManager`` (``verificationStates``).

Before a leader appends a client's transactional batch for a producer with no ongoing
transaction in the partition, the broker asks the transaction coordinator whether the
partition is in the producer's ongoing transaction. It first takes the partition's
guard for that producer (:meth:`VerificationStates.start`, a new object unless one is
pending); the append then goes ahead only if that guard is still the producer's guard
(:meth:`VerificationStates.check`, under the log's append lock, with the append). Any
transactional batch written for the producer (a data batch opens its transaction, a
marker ends it; any origin) clears the guard, so an answer that raced a marker — the
ABA case: verified, aborted, a new transaction without this partition — finds its
guard gone and the batch is refused with INVALID_TXN_STATE, instead of opening a
transaction the coordinator does not know (a hanging transaction that holds the last
stable offset forever). Guards left unused expire with ``producer.id.expiration.ms``.

Ownership: a :class:`VerificationStates` belongs to one log and is used only under
that log's append lock.
"""
from __future__ import annotations

from kbroker.log.producer_state import InvalidTxnStateError, OutOfOrderSequenceError

__all__ = ["VerificationGuard", "SENTINEL", "VerificationStates"]


class VerificationGuard:
    """A unique token: two guards are equal only if they are the same object."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "VerificationGuard(SENTINEL)" if self is SENTINEL else f"VerificationGuard({id(self):#x})"


#: "no verification was done for this append": never a producer's guard, so an append
#: that needs verification and carries it is refused
SENTINEL = VerificationGuard()


class _Entry:
    """Kafka's VerificationStateEntry: the guard, when it was made, and the lowest
    sequence (and its epoch) that asked for verification."""

    __slots__ = ("guard", "timestamp_ms", "lowest_sequence", "epoch")

    def __init__(self, timestamp_ms: int, sequence: int, epoch: int) -> None:
        self.guard = VerificationGuard()
        self.timestamp_ms = timestamp_ms
        self.lowest_sequence = sequence
        self.epoch = epoch

    def maybe_update(self, sequence: int, epoch: int) -> None:
        if epoch == self.epoch and sequence < self.lowest_sequence:
            self.lowest_sequence = sequence
        if epoch > self.epoch:
            self.epoch = epoch
            self.lowest_sequence = sequence


class VerificationStates:
    """producer id -> pending verification (the log's append lock held for every call)."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def start(self, producer_id: int, sequence: int, epoch: int, now_ms: int) -> VerificationGuard:
        """The producer's guard, made now unless one is pending (Kafka's
        maybeCreateVerificationStateEntry)."""
        e = self._entries.get(producer_id)
        if e is None:
            e = self._entries[producer_id] = _Entry(now_ms, sequence, epoch)
        else:
            e.maybe_update(sequence, epoch)
        return e.guard

    def guard(self, producer_id: int) -> VerificationGuard:
        e = self._entries.get(producer_id)
        return SENTINEL if e is None else e.guard

    def check(self, infos, guard: VerificationGuard, has_ongoing_transaction) -> None:
        """Refuse the append (InvalidTxnStateError) if a transactional data batch of
        ``infos`` belongs to a producer with no ongoing transaction of its epoch
        (``has_ongoing_transaction(pid, epoch)``) whose guard is not ``guard``; or
        (OutOfOrderSequenceError) if its sequence is above the lowest one that asked for
        verification of that producer (Kafka's VerificationStateEntry.lowestSequence)."""
        for info in infos:
            if info.is_transactional and not info.is_control:
                pid = info.producer_id
                e = self._entries.get(pid)
                if e is not None and info.base_sequence > e.lowest_sequence:
                    # a later batch must not go in before the lowest one still being verified
                    # (its retry would then loop on OUT_OF_ORDER_SEQUENCE_NUMBER)
                    raise OutOfOrderSequenceError(
                        f"Out of order sequence number for producer {pid}: {info.base_sequence} (incoming seq. "
                        f"number), {e.lowest_sequence} (earliest seen sequence)")
                if not has_ongoing_transaction(pid, info.producer_epoch):
                    if e is None or e.guard is not guard or guard is SENTINEL:
                        raise InvalidTxnStateError("Record was not part of an ongoing transaction")

    def clear(self, producer_ids) -> None:
        """Transactional batches of ``producer_ids`` were written: their guards are spent."""
        entries = self._entries
        for pid in producer_ids:
            entries.pop(pid, None)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> int:
        expired = [pid for pid, e in self._entries.items() if now_ms - e.timestamp_ms >= expiration_ms]
        for pid in expired:
            del self._entries[pid]
        return len(expired)

"""InitProducerId decision logic (Kafka's KafkaApis.handleInitProducerIdRequest +
TransactionCoordinator.handleInitProducerId), without I/O beyond the id allocator.

Idempotent producers (``transactional_id`` None), as Kafka: the broker
"blindly accepts the request" and returns a fresh producer id with epoch 0,
also when a v3+ request carries the producer's current (producer_id,
producer_epoch). The KIP-360 epoch bump of an idempotent producer is done
client-side: the client bumps its own epoch and restarts at sequence 0, which
the partition's ProducerStateManager accepts; only when the epoch would
overflow does it send InitProducerId again, and gets a new id.

Order of checks (Kafka's): the request's (producer_id, producer_epoch) must
both be -1 or both be set, else INVALID_REQUEST; then a null transactional id
gets a new id; an empty one is INVALID_REQUEST; a transaction timeout outside
``(0, transaction.max.timeout.ms]`` is INVALID_TRANSACTION_TIMEOUT; anything
else belongs to the transaction coordinator.

Transactions seam: pass ``transaction_coordinator`` (the
:class:`~kbroker.coordinator.transaction.TransactionCoordinator`, or any object with
``handle_init_producer_id(transactional_id, transaction_timeout_ms,
expected: tuple[int, int] | None, callback)``) and ``respond``: the coordinator
answers through ``respond(InitProducerIdResult)``, possibly later, and
:func:`handle_init_producer_id` returns None. Without a coordinator the answer is
COORDINATOR_NOT_AVAILABLE (retriable: a transactional client keeps retrying until
its max.block.ms and then fails ``initTransactions``).
:func:`prepare_increment_producer_epoch` is the coordinator's epoch-bump rule
(TransactionMetadata uses it).

Thread-safety: stateless apart from the (thread-safe) ProducerIdManager.
"""
from __future__ import annotations

import logging
from typing import Callable, NamedTuple

from kbroker.protocol.errors import ErrorCode

__all__ = ["InitProducerIdResult", "handle_init_producer_id", "prepare_increment_producer_epoch",
           "TRANSACTION_MAX_TIMEOUT_MS_DEFAULT", "SHORT_MAX"]

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
SHORT_MAX = 32767
TRANSACTION_MAX_TIMEOUT_MS_DEFAULT = 900_000


class InitProducerIdResult(NamedTuple):
    """The InitProducerId response body fields (besides throttle_time_ms)."""

    error_code: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


def _error(code: ErrorCode) -> InitProducerIdResult:
    return InitProducerIdResult(int(code))


def handle_init_producer_id(generate_producer_id: Callable[[], int], transactional_id: str | None,
                            transaction_timeout_ms: int, producer_id: int = NO_PRODUCER_ID,
                            producer_epoch: int = NO_PRODUCER_EPOCH, *,
                            transaction_max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS_DEFAULT,
                            transaction_coordinator=None,
                            respond: Callable[[InitProducerIdResult], None] | None = None
                            ) -> InitProducerIdResult | None:
    """Decide an InitProducerId request (any version; v0-v2 carry no producer id/epoch:
    pass the defaults). ``generate_producer_id`` is ``ProducerIdManager.generate_producer_id``.
    Returns the answer, or None when the transaction coordinator answers through
    ``respond`` (see the module docstring).
    Authorization (IDEMPOTENT_WRITE / TRANSACTIONAL_ID) is the handler's job, before this."""
    if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
        return _error(ErrorCode.INVALID_REQUEST)
    expected = None if producer_id == NO_PRODUCER_ID else (producer_id, producer_epoch)
    if transactional_id is None:
        try:
            return InitProducerIdResult(int(ErrorCode.NONE), generate_producer_id(), 0)
        except Exception:
            log.exception("Failed to generate producer id for idempotent producer")
            return _error(ErrorCode.UNKNOWN_SERVER_ERROR)
    if transactional_id == "":
        return _error(ErrorCode.INVALID_REQUEST)
    if not 0 < transaction_timeout_ms <= transaction_max_timeout_ms:
        return _error(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    if transaction_coordinator is None:
        return _error(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    transaction_coordinator.handle_init_producer_id(transactional_id, transaction_timeout_ms, expected, respond)
    return None


def prepare_increment_producer_epoch(producer_epoch: int, last_producer_epoch: int,
                                     expected_epoch: int | None) -> tuple[int, int] | ErrorCode:
    """The transaction coordinator's epoch bump for a known transactional id (Kafka's
    TransactionMetadata.prepareIncrementProducerEpoch). Returns ``(new_epoch,
    new_last_epoch)`` or PRODUCER_FENCED. ``expected_epoch`` is the request's epoch
    (None for v0-v2 or a fresh start). A retry whose expected epoch is the previous
    one gets the current epoch again. The caller must first rotate to a new producer
    id (epoch 0) when ``producer_epoch >= SHORT_MAX - 1`` (the epoch is exhausted)."""
    if producer_epoch >= SHORT_MAX - 1:
        raise ValueError(f"producer epoch {producer_epoch} is exhausted; rotate the producer id instead")
    bumped = producer_epoch + 1
    if expected_epoch is None or producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == producer_epoch:
        return bumped, (NO_PRODUCER_EPOCH if expected_epoch is None else producer_epoch)
    if expected_epoch == last_producer_epoch:
        return producer_epoch, last_producer_epoch
    return ErrorCode.PRODUCER_FENCED

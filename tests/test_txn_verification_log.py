"""KIP-890 part 1 in the log: verification guards (kbroker/log/txn_verification.py and
Log.maybe_start_transaction_verification / append(verification_guard=...))."""
import pytest

from kbroker.kernels import records
from kbroker.log.producer_state import InvalidTxnStateError
from kbroker.log.txn_verification import SENTINEL
from tests.test_log_transactions import hw_to_end, open_log, plain, tbatch


def append(lg, buf, guard):
    return lg.append(buf, records.validate_batches(buf), verification_guard=guard)


def test_a_guard_lets_the_first_batch_open_the_transaction_and_is_spent_by_it(tmp_path):
    lg = open_log(tmp_path / "t-0")
    guard = lg.maybe_start_transaction_verification(1, 0, 0)
    assert guard is not SENTINEL and lg.verification_guard(1) is guard
    # a second produce before the first appended shares the pending guard
    assert lg.maybe_start_transaction_verification(1, 0, 0) is guard
    append(lg, tbatch(1, 0), guard)
    assert lg.has_ongoing_transaction(1) and lg.verification_guard(1) is SENTINEL
    # inside the open transaction no verification is needed: SENTINEL
    assert lg.maybe_start_transaction_verification(1, 1, 0) is SENTINEL
    append(lg, tbatch(1, 1), SENTINEL)
    assert lg.log_end_offset == 2


def test_a_marker_between_verification_and_append_clears_the_guard(tmp_path):
    """The ABA race KIP-890 closes: verified, then the transaction is aborted (marker),
    then the verified append arrives: it must not open a transaction nobody will end."""
    lg = open_log(tmp_path / "t-0")
    append(lg, tbatch(1, 0), lg.maybe_start_transaction_verification(1, 0, 0))
    lg.append_end_txn_marker(1, 0, 0, False)            # the first transaction aborted
    guard = lg.maybe_start_transaction_verification(1, 1, 0)
    assert guard is not SENTINEL
    lg.append_end_txn_marker(1, 0, 0, False)            # a (retried) abort lands meanwhile
    with pytest.raises(InvalidTxnStateError):
        append(lg, tbatch(1, 1), guard)
    hw_to_end(lg)
    assert not lg.has_ongoing_transaction(1) and lg.last_stable_offset == lg.log_end_offset
    # a late batch that skipped verification (SENTINEL: the transaction looked open) is refused too
    with pytest.raises(InvalidTxnStateError):
        append(lg, tbatch(1, 1), SENTINEL)
    # verification off (no guard passed): the old behaviour, the batch opens a transaction
    append(lg, tbatch(1, 1), None)
    assert lg.has_ongoing_transaction(1)


def test_plain_and_idempotent_batches_need_no_guard(tmp_path):
    lg = open_log(tmp_path / "t-0")
    append(lg, plain(), SENTINEL)
    append(lg, tbatch(7, 0, transactional=False), SENTINEL)
    assert lg.log_end_offset == 2


def test_unused_guards_expire_with_the_producer_ids(tmp_path):
    lg = open_log(tmp_path / "t-0", **{})
    lg.maybe_start_transaction_verification(3, 0, 0)
    now = lg._time_ms()
    lg.remove_expired_producers(now + lg.producer_state.producer_id_expiration_ms - 1)
    assert lg.verification_guard(3) is not SENTINEL
    lg.remove_expired_producers(now + lg.producer_state.producer_id_expiration_ms)
    assert lg.verification_guard(3) is SENTINEL


def test_a_later_sequence_waits_for_the_lowest_one_being_verified(tmp_path):
    """Two batches of a new transaction in flight (sequences 0 and 1): if 1 is verified
    first it must not be appended before 0 (0's retry would loop on out-of-order)."""
    from kbroker.log.producer_state import OutOfOrderSequenceError
    lg = open_log(tmp_path / "t-0")
    guard = lg.maybe_start_transaction_verification(1, 0, 0)
    assert lg.maybe_start_transaction_verification(1, 1, 0) is guard
    with pytest.raises(OutOfOrderSequenceError):
        append(lg, tbatch(1, 1), guard)
    append(lg, tbatch(1, 0), guard)
    append(lg, tbatch(1, 1), SENTINEL)
    assert lg.log_end_offset == 2


def test_an_open_transaction_of_an_older_epoch_does_not_count(tmp_path):
    """Kafka 4's hasOngoingTransaction(producerId, producerEpoch): a batch of a newer epoch
    needs verification even while the older epoch's transaction looks open here."""
    lg = open_log(tmp_path / "t-0")
    append(lg, tbatch(1, 0), lg.maybe_start_transaction_verification(1, 0, 0))
    assert lg.has_ongoing_transaction(1, 0) and not lg.has_ongoing_transaction(1, 1)
    assert lg.maybe_start_transaction_verification(1, 1, 0) is SENTINEL
    assert lg.maybe_start_transaction_verification(1, 0, 1) is not SENTINEL
    with pytest.raises(InvalidTxnStateError):
        append(lg, tbatch(1, 0, epoch=1), SENTINEL)

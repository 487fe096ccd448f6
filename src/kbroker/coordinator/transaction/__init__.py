"""The transaction coordinator: transactional ids and their transactions in ``__transaction_state``.

- ``metadata``: :class:`TransactionMetadata`, Kafka's states and two-phase transitions.
- ``log``: the ``__transaction_state`` record codecs (TransactionLogKey/Value).
- ``coordinator``: :class:`TransactionCoordinator` on the coordinator runtime
  (InitProducerId, AddPartitionsToTxn, EndTxn and markers, Describe/ListTransactions,
  expiry), :func:`build_transaction_coordinator`.
- ``markers``: :class:`WireMarkerChannel`, WriteTxnMarkers to partition leaders.

The wire handlers are in ``kbroker.server.apis.transaction``.
"""
from kbroker.coordinator.transaction.coordinator import (  # noqa: F401
    TransactionConfig, TransactionCoordinator, build_transaction_coordinator,
)
from kbroker.coordinator.transaction.metadata import TransactionMetadata, TransactionState  # noqa: F401

__all__ = ["TransactionConfig", "TransactionCoordinator", "TransactionMetadata", "TransactionState",
           "build_transaction_coordinator"]

"""Coordinators over internal topics: consumer groups (``__consumer_offsets``) and
transactions (``__transaction_state``).

- ``runtime``: :class:`CoordinatorRuntime`, the partition table, loading, append path
  and timers both share, and the :class:`CoordinatorLog` seam to the broker's partitions.
- ``group``: the group coordinator; ``transaction``: the transaction coordinator.
- ``records``: the generated record key/value codecs of both topics.
"""

"""Partition choice, as Kafka's BuiltInPartitioner (Kafka 3.3+, KIP-480 / KIP-794).

Keyed records: ``toPositive(murmur2(key_bytes)) % num_partitions`` over *all* partitions
(available or not), so a key always lands on the same partition as with the Java client,
librdkafka's ``murmur2_random`` partitioner and kafka-python's DefaultPartitioner.
``toPositive`` is ``x & 0x7fffffff``.

Unkeyed records (or partitioner.ignore.keys=true): sticky. Each topic sticks to one
partition until about batch.size bytes were produced to it, then moves to another
partition picked at random among those with a leader (KIP-794's uniform sticky
partitioner, without its load-based weighting). This keeps batches full at low rates.

``sticky`` (topic -> StickyState) is shared with the Cython send path
(``producer_append.SendPath``), which reads the partition and adds produced bytes, and
calls ``on_append`` once a partition got ``sticky_batch_size`` bytes.

Thread-safety: ``partition`` / ``on_append`` are called by application threads in
``Producer.send`` without a lock; concurrent senders may race on a topic's sticky
state, which only affects which partition an unkeyed record picks (never correctness).
"""
from __future__ import annotations

import random

from kbroker.kernels import murmur2

partition_for_key = murmur2.partition_for_key


class StickyState:
    __slots__ = ("partition", "produced_bytes")

    def __init__(self, partition: int):
        self.partition = partition
        self.produced_bytes = 0


class BuiltInPartitioner:
    def __init__(self, batch_size: int, ignore_keys: bool = False):
        # Kafka switches after batch.size bytes (sticky_batch_size); at least 1 byte
        self.sticky_batch_size = max(1, batch_size)
        self.ignore_keys = ignore_keys
        self.sticky: dict[str, StickyState] = {}

    def partition(self, topic: str, key_bytes, cluster) -> int:
        parts = cluster.topics[topic]
        if key_bytes is not None and not self.ignore_keys:
            return partition_for_key(key_bytes, len(parts))
        st = self.sticky.get(topic)
        if st is None or st.partition >= len(parts):
            st = self.sticky[topic] = StickyState(self._next(topic, cluster, -1))
        return st.partition

    def on_append(self, topic: str, partition: int, appended_bytes: int, cluster,
                  batch_closed: bool) -> None:
        """Account bytes sent to the sticky partition; switch once it got a batch's worth
        (or when the batch it was filling is closed)."""
        st = self.sticky.get(topic)
        if st is None or st.partition != partition:
            return
        st.produced_bytes += appended_bytes
        if st.produced_bytes >= self.sticky_batch_size or batch_closed:
            st.partition = self._next(topic, cluster, st.partition)
            st.produced_bytes = 0

    @staticmethod
    def _next(topic: str, cluster, current: int) -> int:
        avail = cluster.available_partitions(topic)
        if not avail:
            avail = list(range(len(cluster.topics[topic])))
        if len(avail) > 1 and current in avail:
            avail = [p for p in avail if p != current]
        return random.choice(avail)

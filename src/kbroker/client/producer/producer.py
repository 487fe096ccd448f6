"""Producer: the public producer API (Kafka's KafkaProducer).

``send`` runs in the caller's thread: serialize key and value (key.serializer /
value.serializer, else bytes/str/None), wait for the topic's metadata (up to
max.block.ms), pick the partition (BuiltInPartitioner or partitioner.class), append to
the RecordAccumulator and return a ``RecordFuture`` at once. Without serializers or a
partitioner.class, a record with bytes key/value and no headers for a known topic whose
batch has room takes one Cython call (``producer_append.SendPath``); everything else,
and the first record of each batch, takes the general path below. The Sender thread does all
network I/O. Delivery callbacks ``on_delivery(err, metadata)`` (confluent-kafka's
argument order) run in the sender thread: keep them short.

Transactions (``transactional.id``): ``init_transactions``, ``begin_transaction``,
``send_offsets_to_transaction``, ``commit_transaction``, ``abort_transaction``, as Kafka's
KafkaProducer (and confluent-kafka) name them; the TransactionManager drives the
coordinator requests from the sender thread. A transactional producer takes the general
send path (each new partition must join the transaction before its batch is drained).

Thread-safety: ``send``, ``flush`` and ``close`` may be called from any thread.
"""
from __future__ import annotations

import time

from kbroker.client import errors as E
from kbroker.client.config import PRODUCER, ClientConfig
from kbroker.client.metadata import Metadata, TopicPartition
from kbroker.client.network_client import NetworkClient
from kbroker.client.producer.accumulator import RecordAccumulator, _fast_append
from kbroker.client.producer.partitioner import BuiltInPartitioner, partition_for_key
from kbroker.client.producer.sender import Sender
from kbroker.kernels import producer_append
from kbroker.protocol import ErrorCode

_time_ns = time.time_ns


def _to_bytes(v, what):
    if v is None or type(v) is bytes:
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"{what} must be bytes, str or None without a {what}.serializer; got {type(v).__name__}")


class Producer:
    """``Producer({"bootstrap.servers": "host:port", "linger.ms": 5, ...})``."""

    def __init__(self, config: dict | None = None, **kwargs):
        self.config = cfg = ClientConfig(PRODUCER, config, **kwargs)
        self._key_ser = cfg["key.serializer"]
        self._value_ser = cfg["value.serializer"]
        self._custom_partitioner = cfg["partitioner.class"]
        self._max_block_s = cfg["max.block.ms"] / 1000.0
        self.metadata = Metadata(cfg)
        self.client = NetworkClient(cfg, self.metadata)
        self.accumulator = RecordAccumulator(cfg, self.client.wakeup)
        self._open_batches = self.accumulator.open
        self.partitioner = BuiltInPartitioner(cfg["batch.size"], cfg["partitioner.ignore.keys"])
        self.sender = Sender(cfg, self.client, self.metadata, self.accumulator)
        self._closed = False
        #: the Cython send path, or None when serializers / partitioner.class are set
        #: (and after close): send() then always takes the general path
        self._fast_send = None
        self._txn = self.sender.txn if cfg["transactional.id"] is not None else None
        if (self._key_ser is None and self._value_ser is None and self._custom_partitioner is None
                and self._txn is None):
            self._fast_send = producer_append.SendPath(
                self.metadata, self._open_batches, self.partitioner.sticky,
                self.partitioner.sticky_batch_size, self.partitioner.ignore_keys,
                partition_for_key, self.partitioner.on_append).send
        self.sender.start()

    # -- send ---------------------------------------------------------------------------
    def send(self, topic: str, value=None, key=None, partition: int | None = None,
             timestamp_ms: int | None = None, headers=None, on_delivery=None):
        """Queue one record; returns a RecordFuture resolving to RecordMetadata.

        headers: list of (str, bytes|None) or a dict. Raises KafkaTimeoutError if the
        topic's metadata is not available within max.block.ms, BufferExhaustedError if
        buffer.memory stays full that long, RecordTooLargeError for an oversized record.
        ``on_delivery(err, metadata)`` runs in the sender thread once the record is done;
        after a failure metadata holds the topic and partition and -1 elsewhere."""
        fast = self._fast_send
        if fast is not None and not headers:
            fut = fast(topic, value, key, partition, timestamp_ms, on_delivery)
            if fut is not None:
                return fut
        if self._closed:
            raise E.IllegalStateError("Cannot perform operation after producer has been closed")
        if self._key_ser is not None:
            key = self._key_ser(key)
        if self._value_ser is not None:
            value = self._value_ser(value)
        if key is not None and type(key) is not bytes:
            key = _to_bytes(key, "key")
        if value is not None and type(value) is not bytes:
            value = _to_bytes(value, "value")
        if headers:
            headers = [(k, _to_bytes(v, "header value")) for k, v in
                       (headers.items() if isinstance(headers, dict) else headers)]
        else:
            headers = ()
        cluster = self.metadata.cluster
        parts = cluster.topics.get(topic)
        deadline = None
        if parts is None or (partition is not None and partition >= len(parts)):
            deadline = time.monotonic() + self._max_block_s
            cluster = self._wait_on_metadata(topic, partition, deadline)
            parts = cluster.topics[topic]
        sticky = False
        if partition is None:
            if self._custom_partitioner is not None:
                partition = self._custom_partitioner(topic, key, len(parts))
            else:
                partition = self.partitioner.partition(topic, key, cluster)
                sticky = key is None or self.partitioner.ignore_keys
        elif partition < 0:
            raise ValueError(f"Invalid partition given with record: {partition} is not in the range [0...{len(parts)}].")
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        if self._txn is not None:
            self._txn.maybe_add_partition(TopicPartition(topic, partition))
            self.client.wakeup()
        # a plain tuple finds the TopicPartition key (same hash and equality), and is cheaper
        # the accumulator's lock-free fast path, inlined
        fut = _fast_append(self._open_batches, (topic, partition), timestamp_ms, key, value,
                           headers, on_delivery)
        if fut is None:
            block = self._max_block_s if deadline is None else max(0.0, deadline - time.monotonic())
            fut = self.accumulator.append((topic, partition), timestamp_ms, key, value,
                                          headers, block, on_delivery)
        if sticky:
            self.partitioner.on_append(topic, partition, (len(value) if value is not None else 0) + 20,
                                       cluster, False)
        return fut

    produce = send

    def _wait_on_metadata(self, topic: str, partition, deadline: float):
        self.metadata.add_topics(topic)
        while True:
            cluster = self.metadata.cluster
            parts = cluster.topics.get(topic)
            if parts is not None and (partition is None or partition < len(parts)):
                return cluster
            err = cluster.topic_errors.get(topic)
            if err is not None:
                exc = E.for_code(err)
                if not exc.retriable:
                    raise E.for_code(err, f"topic {topic}: {exc.message}")
            version = self.metadata.request_update_for_topic(topic)
            self.client.wakeup()
            left = deadline - time.monotonic()
            if left <= 0 or not self.metadata.wait_for_update(version, left):
                ms = int(self._max_block_s * 1000)
                if parts is not None and partition is not None:
                    raise E.KafkaTimeoutError(
                        f"Partition {partition} of topic {topic} with partition count {len(parts)} "
                        f"is not present in metadata after {ms} ms.")
                raise E.KafkaTimeoutError(f"Topic {topic} not present in metadata after {ms} ms.")

    def partitions_for(self, topic: str) -> list[int]:
        cluster = self._wait_on_metadata(topic, None, time.monotonic() + self._max_block_s)
        return [p.partition for p in cluster.topics[topic]]

    # -- transactions ---------------------------------------------------------------------
    def _transactional(self):
        if self._txn is None:
            raise E.IllegalStateError("Transactional method invoked on a non-transactional producer.")
        if self._closed:
            raise E.IllegalStateError("Cannot perform operation after producer has been closed")
        return self._txn

    def _await(self, result, timeout) -> None:
        self.client.wakeup()
        result.wait(self._max_block_s if timeout is None else timeout)

    def init_transactions(self, timeout: float | None = None) -> None:
        """Register the transactional.id with its coordinator: fences any earlier producer
        with the same id and completes (aborts) a transaction it left open."""
        self._await(self._transactional().initialize(), timeout)

    def begin_transaction(self) -> None:
        self._transactional().begin()

    def send_offsets_to_transaction(self, offsets: dict, group_metadata, timeout: float | None = None) -> None:
        """Commit consumer ``offsets`` ({TopicPartition: offset or OffsetAndMetadata}: the next
        record to read) as part of the transaction; ``group_metadata`` is
        ``Consumer.group_metadata()`` (or a group id)."""
        from kbroker.client.producer.transaction_manager import ConsumerGroupMetadata

        if isinstance(group_metadata, str):
            group_metadata = ConsumerGroupMetadata(group_metadata)
        self._await(self._transactional().send_offsets(dict(offsets), group_metadata), timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit: every record sent in the transaction becomes visible to
        read_committed consumers, atomically."""
        txn = self._transactional()
        err = txn.in_error()
        if err is not None:
            raise err
        self.flush(timeout)
        self._await(txn.begin_commit(), timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort: records not yet sent fail with TransactionAbortedError, those written are
        marked aborted (read_committed consumers skip them)."""
        txn = self._transactional()
        result = txn.begin_abort()
        aborted = E.KafkaError("Failing batch since transaction was aborted", ErrorCode.UNKNOWN_SERVER_ERROR)
        for b in self.accumulator.abort_all():
            self.accumulator.complete(b, -1, -1, aborted)
        self._await(result, timeout)

    # -- flush / close ------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait for it to complete (KafkaTimeoutError)."""
        self.accumulator.begin_flush()
        try:
            if not self.accumulator.await_flush(timeout):
                raise E.KafkaTimeoutError(f"Failed to flush accumulated records within {timeout}s")
        finally:
            self.accumulator.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting records, deliver what is queued within ``timeout`` seconds
        (None = wait for all), then fail whatever is left and stop the sender."""
        if self._closed:
            return
        self._closed = True
        self._fast_send = None
        self.sender.initiate_close()
        self.sender.join(timeout)
        if self.sender.is_alive():
            self.sender.initiate_close(force=True)
            self.sender.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

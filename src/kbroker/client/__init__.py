"""kbroker.client: a Kafka client (producer, consumer, admin) on kbroker's generated
protocol and Cython record kernels. Configuration uses Kafka's property names.

The errors are imported with the package; ``Admin``, ``Consumer``, ``Producer`` and
their companions load on first use (PEP 562): the broker imports
``kbroker.client.errors`` and ``network_client`` for its inter-node senders, and must
not pay for the producer, consumer and admin modules (and numpy, which the producer's
partitioner uses) on every start-up.
"""
from kbroker.client.errors import *  # noqa: F401,F403  (KafkaError and one class per error code)
from kbroker.client.errors import (
    BufferExhaustedError, IllegalStateError, KafkaConfigError, KafkaConnectionError, KafkaError,
    KafkaTimeoutError, NoOffsetForPartitionError, RecordTooLargeError,
)

#: name -> the submodule that defines it (loaded by __getattr__ on first access)
_LAZY = {
    "Admin": "admin", "ConfigResource": "admin", "NewTopic": "admin",
    "Consumer": "consumer", "ConsumerRecord": "consumer", "ConsumerRecords": "consumer",
    "OffsetAndMetadata": "consumer", "OffsetAndTimestamp": "consumer",
    "TopicPartition": "metadata",
    "Producer": "producer", "RecordFuture": "producer", "RecordMetadata": "producer",
}

__all__ = [
    "Admin", "ConfigResource", "NewTopic", "Consumer", "ConsumerRecord", "ConsumerRecords",
    "OffsetAndMetadata", "OffsetAndTimestamp", "Producer", "RecordFuture", "RecordMetadata", "TopicPartition",
    "KafkaError", "KafkaConfigError", "KafkaTimeoutError", "KafkaConnectionError",
    "BufferExhaustedError", "IllegalStateError", "NoOffsetForPartitionError", "RecordTooLargeError",
]


def __getattr__(name: str):
    sub = _LAZY.get(name)
    if sub is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{sub}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

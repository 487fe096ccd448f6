"""kbroker.client: a Kafka client (producer, consumer, admin) on kbroker's generated
protocol and Cython record kernels. Configuration uses Kafka's property names."""
from kbroker.client.errors import *  # noqa: F401,F403  (KafkaError and one class per error code)
from kbroker.client.errors import (
    BufferExhaustedError, IllegalStateError, KafkaConfigError, KafkaConnectionError, KafkaError,
    KafkaTimeoutError, NoOffsetForPartitionError, RecordTooLargeError,
)
from kbroker.client.admin import Admin, ConfigResource, NewTopic
from kbroker.client.consumer import (
    Consumer, ConsumerRecord, ConsumerRecords, OffsetAndMetadata, OffsetAndTimestamp,
)
from kbroker.client.metadata import TopicPartition
from kbroker.client.producer import Producer, RecordFuture, RecordMetadata

__all__ = [
    "Admin", "ConfigResource", "NewTopic", "Consumer", "ConsumerRecord", "ConsumerRecords",
    "OffsetAndMetadata", "OffsetAndTimestamp", "Producer", "RecordFuture", "RecordMetadata", "TopicPartition",
    "KafkaError", "KafkaConfigError", "KafkaTimeoutError", "KafkaConnectionError",
    "BufferExhaustedError", "IllegalStateError", "NoOffsetForPartitionError", "RecordTooLargeError",
]

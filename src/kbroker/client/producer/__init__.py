"""The producer: Producer -> serializers -> partitioner -> RecordAccumulator -> Sender."""
from kbroker.client.producer.future import RecordFuture, RecordMetadata
from kbroker.client.producer.producer import Producer

__all__ = ["Producer", "RecordFuture", "RecordMetadata"]

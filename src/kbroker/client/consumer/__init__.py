"""The consumer: Consumer -> Fetcher (positions, Fetch) + GroupCoordinator (groups, offsets)."""
from kbroker.client.consumer.consumer import Consumer, ConsumerRecords
from kbroker.client.consumer.coordinator import OffsetAndMetadata
from kbroker.client.consumer.fetcher import ConsumerRecord, OffsetAndTimestamp

__all__ = ["Consumer", "ConsumerRecords", "ConsumerRecord", "OffsetAndMetadata", "OffsetAndTimestamp"]

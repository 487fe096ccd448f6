"""Stub for the consumer_records kernel (kbroker/_core/consumer_records.pyx); the twin
kbroker/_core/ref/consumer_records.py has the same API."""
from typing import Any, TypeVar

T = TypeVar("T", bound=tuple)

def build(record_type: type[T], recs: list[Any], start: int, stop: int, topic: str,
          partition: int, timestamp_type: int, leader_epoch: int) -> list[T]: ...

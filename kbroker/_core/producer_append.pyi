"""Stub for the producer_append kernel (kbroker/_core/producer_append.pyx); the twin
kbroker/_core/ref/producer_append.py has the same API."""
from collections.abc import Sequence
from typing import Any

Header = tuple[str, bytes | None]

class OpenBatch:
    builder: Any          # a records.BatchBuilder
    result: Any           # opaque to the kernel: the future's first item
    record_count: int
    closed: bool
    def __init__(self, builder: Any, result: Any, future_type: type[tuple]) -> None: ...
    def try_append(self, timestamp: int, key: bytes | None, value: bytes | None,
                   headers: Sequence[Header]) -> tuple | None: ...
    def close(self) -> None: ...

def append(open_batches: dict[Any, OpenBatch], tp: Any, timestamp: int, key: bytes | None,
           value: bytes | None, headers: Sequence[Header]) -> tuple | None: ...

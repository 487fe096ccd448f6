"""Stub for the producer_append kernel (kbroker/_core/producer_append.pyx); the twin
kbroker/_core/ref/producer_append.py has the same API."""
from collections.abc import Callable, Sequence
from typing import Any

Header = tuple[str, bytes | None]

class CallbackList(list):
    """(future, callback, untracked) triples; re-tracks untracked callbacks on dealloc."""

class OpenBatch:
    builder: Any          # a records.BatchBuilder
    result: Any           # the future's first item; has done, callbacks, add_callback (see module)
    record_count: int
    closed: bool
    def __init__(self, builder: Any, result: Any, future_type: type[tuple]) -> None: ...
    def try_append(self, timestamp: int, key: bytes | None, value: bytes | None,
                   headers: Sequence[Header], callback: Callable[[Any, Any], Any] | None = None
                   ) -> tuple | None: ...
    def close(self) -> None: ...

def append(open_batches: dict[Any, OpenBatch], tp: Any, timestamp: int, key: bytes | None,
           value: bytes | None, headers: Sequence[Header],
           callback: Callable[[Any, Any], Any] | None = None) -> tuple | None: ...

def run_callbacks(callbacks: list, result: Any, metadata_type: type[tuple],
                  on_error: Callable[[], Any]) -> None: ...

class SendPath:
    def __init__(self, metadata: Any, open_batches: dict[Any, OpenBatch], sticky: dict[str, Any],
                 sticky_batch_size: int, ignore_keys: bool,
                 partition_for_key: Callable[[bytes, int], int],
                 on_sticky_full: Callable[..., Any]) -> None: ...
    def send(self, topic: str, value: bytes | None, key: bytes | None, partition: int | None,
             timestamp_ms: int | None, callback: Callable[[Any, Any], Any] | None) -> tuple | None: ...

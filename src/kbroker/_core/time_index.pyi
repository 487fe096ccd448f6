"""Stub for the compiled time index kernel (twin: kbroker._core.ref.time_index)."""
from typing_extensions import Buffer

from kbroker._core.offset_index import MmapIndex

NO_TIMESTAMP: int

class TimeIndex(MmapIndex):
    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset); (-1, base_offset) when empty."""
    def sanity_check(self) -> None: ...
    def entry(self, n: int) -> tuple[int, int]: ...
    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the largest entry with timestamp <= target, else (-1, base_offset)."""
    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool: ...
    def append_raw(self, data: Buffer) -> None: ...
    def truncate_to(self, offset: int) -> None: ...

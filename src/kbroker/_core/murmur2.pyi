"""Stub for the compiled murmur2 kernel (twin: kbroker._core.ref.murmur2)."""
from collections.abc import Iterable

import numpy
import numpy.typing as npt
from typing_extensions import Buffer

def murmur2(data: Buffer) -> int:
    """Java Utils.murmur2(byte[]): signed int32."""

def partition_for_key(key: Buffer, num_partitions: int) -> int:
    """(murmur2(key) & 0x7fffffff) % num_partitions; 1 <= num_partitions < 2**31."""

def murmur2_bulk(keys: Iterable[Buffer]) -> npt.NDArray[numpy.int32]: ...
def partitions_for_keys(keys: Iterable[Buffer], num_partitions: int) -> npt.NDArray[numpy.int32]: ...

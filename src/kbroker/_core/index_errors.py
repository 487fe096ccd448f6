"""Errors raised by the index and log-scan kernels (shared by the Cython kernels and their twins).

Kept beside ``errors.py`` so ``kbroker._core`` stays import-free of the rest of
``kbroker``; ``kbroker.log.errors`` re-exports them under the same names.
"""


class CorruptIndexError(Exception):
    """An index file failed its sanity check (Kafka's CorruptIndexException).

    Indexes are never checksummed: a corrupt one is deleted and rebuilt from
    the ``.log`` it indexes.
    """


class InvalidOffsetError(ValueError):
    """An index append that would break ordering: an offset not larger than
    the last entry's (Kafka's InvalidOffsetException), or a relative offset
    that does not fit in 32 bits."""


class IndexFullError(ValueError):
    """An append to an index that has no free slot left (the segment should
    have rolled first)."""


class IndexClosedError(ValueError):
    """Use of an index after ``close`` / ``close_handler`` / ``delete_if_exists``
    (a lock-free reader holding a segment that was deleted meanwhile; it retries)."""

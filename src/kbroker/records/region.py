"""FileRegion: a byte range of an open file, the unit of zero-copy fetch."""
from __future__ import annotations

import os
from typing import NamedTuple


class FileRegion(NamedTuple):
    """``size`` bytes of ``file`` starting at ``position``.

    Produced by the log (``Log.read``) and carried unchanged through the
    protocol encoder (a ``records`` field may hold one) to the network
    processor, which sends it with ``os.sendfile``. ``file`` is any object
    with ``fileno()``; the log keeps it open while the region is in flight
    (segments are deleted by rename + delayed removal, so an fd stays valid).
    """

    file: object
    position: int
    size: int

    def read_bytes(self) -> bytes:
        """Copy the region into memory (tests and non-socket consumers only)."""
        return os.pread(self.file.fileno(), self.size, self.position)




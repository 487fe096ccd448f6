"""Helpers for the storage-engine tests."""
from kbroker.kernels import records


def batch(n=1, ts=1000, value=b"v" * 100, key=b"k"):
    """One v2 batch of ``n`` records (offsets assigned by the log)."""
    return bytearray(records.encode_batch([(ts, key, value, [])] * n))


class Clock:
    def __init__(self, now=1_700_000_000_000):
        self.now = now

    def __call__(self):
        return self.now


def read_all(lg, start=None):
    """Decode every batch from ``start`` to the log end: [(offset, value)]."""
    out = []
    off = lg.log_start_offset if start is None else start
    while off < lg.log_end_offset:
        info = lg.read(off, 1 << 20)
        data = info.records.read_bytes()
        bs = records.decode_batches(data)
        assert bs, f"no batch at {off}"
        for b in bs:
            for r in b.records:
                if r.offset >= off:
                    out.append((r.offset, r.value))
        off = bs[-1].base_offset + bs[-1].last_offset_delta + 1
    return out

"""Writer process for test_log_crash.py: appends until killed.

argv: log_dir seed. Opens a LogManager in fsync-every-append mode (no
background thread), appends batches whose record values are their own
offsets, and after each append returns (= fsynced) prints
``<first_offset> <last_offset>`` on stdout, flushed.
"""
import random
import sys

from kbroker.kernels import records
from kbroker.log import LogConfig, LogManager, LogManagerConfig


def main() -> None:
    log_dir, seed = sys.argv[1], int(sys.argv[2])
    rnd = random.Random(seed)
    mc = LogManagerConfig(log_dirs=(log_dir,), fsync_every_append=True)
    lm = LogManager(None, LogConfig({"segment.bytes": 256 * 1024, "index.interval.bytes": 1024}),
                    manager_config=mc, background=False)
    lm.startup()
    lg = lm.get_or_create_log(("crash", 0))
    print(f"ready {lg.log_end_offset}", flush=True)
    out = sys.stdout
    while True:
        n_batches = rnd.choice((1, 1, 1, 3))
        buf = bytearray()
        off = lg.log_end_offset
        for _ in range(n_batches):
            n = rnd.randint(1, 20)
            pad = b"x" * rnd.choice((0, 10, 500, 5000))
            recs = [(1000 + off + i, None, b"%d|" % (off + i) + pad, []) for i in range(n)]
            buf += records.encode_batch(recs)
            off += n
        # as ReplicaManager appends (validated, with the batch infos): the broker's path
        info = lg.append(buf, records.validate_batches(buf))
        out.write(f"{info.first_offset} {info.last_offset}\n")
        out.flush()


if __name__ == "__main__":
    main()

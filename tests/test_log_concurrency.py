"""The high watermark under concurrent appends, and lock-free reads of a Log.

* The high watermark only moves forward on the replication path, whatever order
  concurrent appends' proposals arrive in (Kafka's maybeIncrementHighWatermark).
* Readers (read, offset metadata, timestamp lookups) do not take the append lock,
  and stay correct against a concurrent append, roll, retention and index trim.
"""
import random
import threading
import time

import pytest

from kbroker.kernels import records
from kbroker.log import Log, LogConfig, LogOffsetMetadata, OffsetOutOfRangeError
from kbroker.log.errors import KafkaStorageError, SegmentClosedError
from kbroker.records.region import FileRegion
from kbroker.server.replica_manager import Partition
from _log_util import Clock, batch

JOIN_S = 10.0   # generous: a blocked reader shows up as a timeout, not a hang


def open_log(tmp_path, clock=None, **overrides):
    return Log.open(str(tmp_path / "topic-0"), LogConfig(overrides), time_ms=clock or Clock())


# -- high watermark ----------------------------------------------------------------------------

class _StaleLeoLog:
    """A Log whose first log-end-offset read by a Partition runs ``during`` (another
    handler thread's append and high-watermark update) before it returns the value it
    read: the interleaving where the older LEO is applied after the newer one."""

    def __init__(self, lg, during):
        self._lg = lg
        self._during = during

    def _stale(self, value):
        during, self._during = self._during, None
        if during is not None:
            during()
        return value

    @property
    def log_end_offset(self):
        return self._stale(self._lg.log_end_offset)

    @property
    def log_end_offset_metadata(self):
        return self._stale(self._lg.log_end_offset_metadata)

    def maybe_increment_high_watermark_to_end(self):
        # the end read, then the other handler runs, then the move is applied
        return self._lg.maybe_increment_high_watermark(self.log_end_offset_metadata)

    def __getattr__(self, name):
        return getattr(self._lg, name)


def test_high_watermark_never_moves_back_when_an_older_leo_is_applied_last(tmp_path):
    lg = open_log(tmp_path)
    lg.append(batch(10))                       # handler A's append: LEO 10
    other = Partition("topic", 0, None, lg, node_id=1)

    def handler_b():                           # B appends and moves the HW first
        lg.append(batch(10))                   # LEO 20
        assert other.maybe_increment_high_watermark()
        assert lg.high_watermark == 20

    part_a = Partition("topic", 0, None, _StaleLeoLog(lg, handler_b), node_id=1)
    moved = part_a.maybe_increment_high_watermark()   # A applies the LEO 10 it read before B ran
    assert (lg.log_end_offset, lg.high_watermark) == (20, 20)
    assert not moved
    # acknowledged records are visible: a consumer read up to the HW sees all 20
    assert len(records.decode_batches(lg.read(0, 1 << 20, lg.high_watermark).records.read_bytes())) == 2
    lg.close()


def test_maybe_increment_high_watermark_only_moves_forward(tmp_path):
    lg = open_log(tmp_path)
    lg.append(batch(5))
    m5 = lg.log_end_offset_metadata
    lg.append(batch(5))
    m10 = lg.log_end_offset_metadata
    assert lg.maybe_increment_high_watermark(m10) == LogOffsetMetadata(0)     # the old one
    assert lg.maybe_increment_high_watermark(m5) is None
    assert lg.maybe_increment_high_watermark(m10) is None
    assert lg.high_watermark == 10 and lg.high_watermark_metadata == m10
    with pytest.raises(ValueError):
        lg.maybe_increment_high_watermark(LogOffsetMetadata(11))
    # same offset, newer segment (after a roll): the metadata follows, as Kafka's
    lg.roll()
    m10_new = lg.log_end_offset_metadata
    assert m10_new.segment_base_offset == 10
    assert lg.maybe_increment_high_watermark(m10_new) == m10
    assert lg.high_watermark_metadata == m10_new
    # the explicit path may move it back (truncation, restart)
    assert lg.update_high_watermark(3) == 3
    assert lg.high_watermark_metadata == LogOffsetMetadata(3, 0, 0)
    lg.close()


# -- reads do not take the append lock ---------------------------------------------------------

def _in_thread(fn):
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_reads_proceed_while_the_append_lock_is_held(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 4096})
    for i in range(40):
        lg.append(batch(2, ts=1000 + i))
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.num_segments > 2
    reads = {
        "read": lambda: lg.read(7, 10_000, lg.high_watermark).records.size,
        "read at the high watermark": lambda: lg.read(80, 10_000, lg.high_watermark).records,
        "convert_to_offset_metadata": lambda: lg.convert_to_offset_metadata(33),
        "high_watermark_metadata": lambda: lg.high_watermark_metadata,
        "fetch_offset_by_timestamp": lambda: lg.fetch_offset_by_timestamp(1020),
        "max timestamp": lambda: lg.fetch_offset_by_timestamp(-3),
        "earliest": lambda: lg.fetch_offset_by_timestamp(-2),
        "end_offset_for_epoch": lambda: lg.end_offset_for_epoch(0),
    }
    with lg._lock:      # a writer holds the append lock (a slow fsync, a roll...)
        started = [(name, *_in_thread(fn)) for name, fn in reads.items()]
        deadline = time.monotonic() + JOIN_S
        for name, t, _ in started:
            t.join(max(0.0, deadline - time.monotonic()))
        blocked = [name for name, t, _ in started if t.is_alive()]
    assert not blocked, f"blocked on the append lock: {blocked}"
    for name, t, out in started:
        t.join(JOIN_S)
        assert "error" not in out, (name, out)
    vals = {name: out["value"] for name, _, out in started}
    assert vals["read"] > 0 and vals["read at the high watermark"] == b""
    assert vals["convert_to_offset_metadata"].message_offset == 33
    assert vals["fetch_offset_by_timestamp"].offset == 40
    assert vals["max timestamp"].offset == 78
    lg.close()


def test_a_reader_on_a_stale_view_meets_closed_segments_and_retries(tmp_path):
    lg = open_log(tmp_path, **{"segment.bytes": 2048, "file.delete.delay.ms": 0, "retention.bytes": 0})
    for _ in range(30):
        lg.append(batch(2))
    lg.update_high_watermark(lg.log_end_offset)
    old = lg.view
    assert lg.delete_old_segments() > 0       # closed and unlinked at once (delay 0)
    with pytest.raises(SegmentClosedError):
        lg._read(old, 0, 10_000, None, True)  # never a pread on a reused descriptor
    with pytest.raises(OffsetOutOfRangeError):  # the public read retries on the new view
        lg.read(0, 10_000)
    lg.append(batch(2))
    end = lg.log_end_offset
    lg.close()
    with pytest.raises(KafkaStorageError):      # the log itself is closed: no retry helps
        lg.read(end - 2, 10_000)


# -- stress: append + read + roll + retention --------------------------------------------------

T0 = Clock().now     # record timestamps: T0 + offset (retention by time never fires)


def _value(offset: int) -> bytes:
    return b"%012d" % offset + b"x" * 40


def test_concurrent_append_read_roll_retention(tmp_path):
    """One writer (appends, explicit rolls, high-watermark updates), readers at random
    offsets, a retention thread, for a bounded time: every read returns whole, valid
    batches starting at the batch holding the fetch offset, with the right contents."""
    lg = open_log(tmp_path, **{"segment.bytes": 8192, "index.interval.bytes": 256, "retention.bytes": 40_000,
                               "file.delete.delay.ms": 20, "segment.index.bytes": 4096})
    deadline = time.monotonic() + 3.0
    stop = threading.Event()
    errors: list = []
    stats = {"reads": 0, "batches": 0, "ts": 0, "meta": 0, "appends": 0}

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                stop.set()
        return run

    @guard
    def writer():
        rnd = random.Random(1)
        nxt = 0
        while not stop.is_set() and time.monotonic() < deadline:
            n = rnd.randint(1, 5)
            buf = bytearray(records.encode_batch([(T0 + nxt + i, None, _value(nxt + i), []) for i in range(n)]))
            info = lg.append(buf, records.validate_batches(buf) if rnd.random() < 0.5 else None)
            assert info.first_offset == nxt
            nxt += n
            lg.maybe_increment_high_watermark(lg.log_end_offset_metadata)
            if rnd.random() < 0.01:
                lg.roll()
            stats["appends"] += 1

    @guard
    def retention():
        while not stop.is_set() and time.monotonic() < deadline:
            lg.delete_old_segments()
            lg.delete_pending_segments()
            time.sleep(0.002)

    def check_region(off, hw, info):
        r = info.records
        if r == b"":
            return
        assert isinstance(r, FileRegion)
        data = r.read_bytes()
        assert len(data) == r.size
        bs = records.decode_batches(data, check_crc=True)   # whole batches, valid CRCs
        assert bs
        first = bs[0]
        assert first.base_offset <= off <= first.base_offset + first.last_offset_delta
        expect = first.base_offset
        for b in bs:
            assert b.base_offset == expect
            for rec in b.records:
                assert rec.value == _value(rec.offset) and rec.timestamp == T0 + rec.offset
            expect = b.base_offset + b.last_offset_delta + 1
        assert expect <= hw                       # never past the bound asked for
        stats["batches"] += len(bs)

    def reader(seed):
        @guard
        def run():
            rnd = random.Random(seed)
            while not stop.is_set() and time.monotonic() < deadline:
                hw = lg.high_watermark
                start = lg.log_start_offset
                if hw <= start:
                    continue
                off = rnd.randint(start, hw - 1)
                what = rnd.random()
                try:
                    if what < 0.7:
                        check_region(off, hw, lg.read(off, rnd.choice([1 << 20, 4096]), hw))
                        stats["reads"] += 1
                    elif what < 0.85:
                        found = lg.fetch_offset_by_timestamp(T0 + off)
                        assert found is not None and found.offset >= off
                        assert found.timestamp == T0 + found.offset
                        assert found.offset < lg.log_end_offset
                        stats["ts"] += 1
                    else:
                        m = lg.convert_to_offset_metadata(off)
                        seg_bytes = [s for s in lg.segments if s.base_offset == m.segment_base_offset]
                        stats["meta"] += 1
                        if seg_bytes:
                            assert m.relative_position_in_segment <= seg_bytes[0].size
                except OffsetOutOfRangeError:
                    assert off < lg.log_start_offset    # retention moved the start meanwhile
        return run

    threads = [threading.Thread(target=f, daemon=True)
               for f in (writer, retention, reader(2), reader(3), reader(4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S + 3.0)
    stop.set()
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
    assert stats["reads"] > 50 and stats["appends"] > 50, stats
    assert lg.log_start_offset > 0           # retention and rolls did happen
    lg.close()

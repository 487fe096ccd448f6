"""A clean stop of many logs writes only files that carry information (issue 23: a
clean stop of 10,000 partitions was mostly file creation), and a clean restart after
it is still clean and complete: records, offsets, offset and time lookups, leader
epochs and idempotent producers' sequences all survive, with no recovery.

What a clean stop may leave out: the index files of a segment of at most
index.interval.bytes that has none yet (empty; its max timestamp is read back from the
.log, LogSegment.close), and the producer snapshot of a one-segment log without any
producer state (Log._no_producer_state_to_keep_locked).
"""
import os
import time

import pytest

from kbroker.kernels import records
from kbroker.log import LogConfig, LogManager
from kbroker.log.producer_state import OutOfOrderSequenceError
from tests._log_util import batch, read_all

PLAIN = 150         # one small non-idempotent batch each
IDEMPOTENT = 30     # three idempotent batches each (producer 5000 + p, sequences 0..2)
LARGE = 20          # past index.interval.bytes: index entries, so index files
EPOCH = 3


NOW = int(time.time() * 1000)      # idempotent producers: recent, or the load expires them


def _ibatch(pid, seq, ts):
    ts += NOW
    return bytearray(records.encode_batch([(ts, b"k", b"i%d" % seq, [])], producer_id=pid,
                                          producer_epoch=0, base_sequence=seq))


def _files(d):
    return sorted(os.listdir(d))


@pytest.fixture
def stopped(tmp_path):
    """A LogManager with the three kinds of logs, cleanly shut down."""
    dirs = [str(tmp_path / "d")]
    lm = LogManager(dirs, LogConfig(), background=False)
    lm.startup()
    for p in range(PLAIN):
        lm.get_or_create_log(("plain", p)).append(batch(1, ts=1000 + p), leader_epoch=EPOCH)
    for p in range(IDEMPOTENT):
        lg = lm.get_or_create_log(("idem", p))
        for seq in range(3):
            lg.append(_ibatch(5000 + p, seq, 2000 + seq), leader_epoch=EPOCH)
    for p in range(LARGE):
        lg = lm.get_or_create_log(("large", p))
        for i in range(60):                 # 60 x ~170 bytes > index.interval.bytes (4096)
            lg.append(batch(1, ts=3000 + i), leader_epoch=EPOCH)
    lm.shutdown()
    return dirs


def test_clean_stop_writes_no_file_without_information(stopped):
    d = stopped[0]
    plain = _files(os.path.join(d, "plain-0"))
    assert plain == ["00000000000000000000.log", "leader-epoch-checkpoint"], plain
    idem = _files(os.path.join(d, "idem-0"))
    assert idem == ["00000000000000000000.log", "00000000000000000003.snapshot", "leader-epoch-checkpoint"]
    large = _files(os.path.join(d, "large-0"))
    assert large == ["00000000000000000000.index", "00000000000000000000.log",
                     "00000000000000000000.timeindex", "leader-epoch-checkpoint"], large
    # the clean-shutdown marker is there, so the next start is a clean one
    assert ".kafka_cleanshutdown" in os.listdir(d)


def test_clean_restart_after_a_lean_stop_keeps_everything(stopped):
    lm = LogManager(stopped, LogConfig(), background=False)
    lm.startup()
    try:
        assert lm.load_stats["clean_dirs"] == 1
        for p in range(PLAIN):
            lg = lm.get_log(("plain", p))
            assert lg.recovered_segments_on_load == 0
            assert lg.log_end_offset == 1 and read_all(lg) == [(0, b"v" * 100)]
            assert lg.leader_epoch_cache.epoch_entries() == [(EPOCH, 0)]
            assert lg.end_offset_for_epoch(EPOCH) == (EPOCH, 1)
            seg = lg.active_segment
            assert (seg.max_timestamp_so_far, seg.offset_of_max_timestamp_so_far) == (1000 + p, 0)
            if p % 2 == 0:          # a time lookup creates the index files; odd ones stay lean
                assert lg.fetch_offset_by_timestamp(1000 + p).offset == 0
                assert lg.fetch_offset_by_timestamp(1001 + p) is None
        for p in range(IDEMPOTENT):
            lg = lm.get_log(("idem", p))
            assert lg.recovered_segments_on_load == 0 and lg.log_end_offset == 3
            assert lg.producer_state.last_entry(5000 + p).last_seq == 2
            dup = lg.append(_ibatch(5000 + p, 2, 2002), leader_epoch=EPOCH)     # a retry
            assert (dup.first_offset, dup.batch_count) == (2, 0)
            with pytest.raises(OutOfOrderSequenceError):
                lg.append(_ibatch(5000 + p, 5, 2005), leader_epoch=EPOCH)
            assert lg.append(_ibatch(5000 + p, 3, 2003), leader_epoch=EPOCH).first_offset == 3
            assert lg.fetch_offset_by_timestamp(NOW + 2001).offset == 1
        for p in range(LARGE):
            lg = lm.get_log(("large", p))
            assert lg.recovered_segments_on_load == 0 and lg.log_end_offset == 60
            assert lg.active_segment.offset_index.entries > 0
            assert [o for o, _ in read_all(lg, 37)] == list(range(37, 60))
            assert lg.fetch_offset_by_timestamp(3041).offset == 41
        # new producer ids and records after the restart; a second clean stop and start
        lm.get_log(("plain", 0)).append(_ibatch(9000, 0, 5000), leader_epoch=EPOCH + 1)
    finally:
        lm.shutdown()
    d = stopped[0]
    # read, but not written or looked up by time: the second stop writes nothing for it either
    assert _files(os.path.join(d, "plain-1")) == ["00000000000000000000.log", "leader-epoch-checkpoint"]
    lm = LogManager(stopped, LogConfig(), background=False)
    lm.startup()
    try:
        lg = lm.get_log(("plain", 0))
        assert lg.recovered_segments_on_load == 0 and lg.log_end_offset == 2
        assert lg.producer_state.last_entry(9000).last_seq == 0
        assert lg.leader_epoch_cache.epoch_entries() == [(EPOCH, 0), (EPOCH + 1, 1)]
        assert lm.get_log(("idem", 0)).producer_state.last_entry(5000).last_seq == 3
        assert read_all(lm.get_log(("plain", 1))) == [(0, b"v" * 100)]
    finally:
        lm.shutdown()


def test_a_lean_stop_then_a_crash_recovers_everything(stopped):
    """After a clean stop that left files out, new records and a crash (no shutdown):
    recovery rebuilds what it needs, and the idempotent producers continue."""
    lm = LogManager(stopped, LogConfig(), background=False)
    lm.startup()
    for p in range(0, PLAIN, 10):
        lm.get_log(("plain", p)).append(batch(1, ts=4000), leader_epoch=EPOCH + 1)
    for p in range(IDEMPOTENT):
        lm.get_log(("idem", p)).append(_ibatch(5000 + p, 3, 2003), leader_epoch=EPOCH + 1)
    # a crash: no shutdown, so no clean-shutdown marker (it was removed at load)
    assert ".kafka_cleanshutdown" not in os.listdir(stopped[0])
    lm2 = LogManager(stopped, LogConfig(), background=False)
    lm2.startup()
    try:
        assert lm2.load_stats["clean_dirs"] == 0
        for p in range(0, PLAIN, 10):
            lg = lm2.get_log(("plain", p))
            assert [o for o, _ in read_all(lg)] == [0, 1]
            assert lg.leader_epoch_cache.epoch_entries() == [(EPOCH, 0), (EPOCH + 1, 1)]
            assert lg.fetch_offset_by_timestamp(3999).offset == 1
        for p in range(IDEMPOTENT):
            lg = lm2.get_log(("idem", p))
            assert lg.log_end_offset == 4 and lg.producer_state.last_entry(5000 + p).last_seq == 3
            assert lg.append(_ibatch(5000 + p, 3, 2003)).batch_count == 0          # a retry
    finally:
        lm2.shutdown()

"""LogCleaner: compaction of real logs on disk, checked against a pure-Python model."""
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _log_util import Clock, read_all
from kbroker.kernels import records
from kbroker.log.checkpoints import OffsetCheckpointFile
from kbroker.log.cleaner import CLEANER_OFFSET_CHECKPOINT, CleanerConfig, LogCleaner
from kbroker.log.config import LogConfig, LogManagerConfig
from kbroker.log.log import Log
from kbroker.log.manager import LogManager
from kbroker.log.segment import LogSegment

MiB = 1 << 20


def open_log(d, clock, **overrides):
    cfg = {"cleanup.policy": "compact", "segment.bytes": 1500, "min.cleanable.dirty.ratio": 0.01,
           "file.delete.delay.ms": 0, "delete.retention.ms": 1000, **overrides}
    return Log.open(os.path.join(str(d), "t-0"), LogConfig(cfg), time_ms=clock)


def append(lg, clock, items, compression=0):
    """items: [(key, value)] as one batch; returns [(offset, key, value)]."""
    info = lg.append(bytearray(records.encode_batch([(clock.now, k, v, []) for k, v in items],
                                                    compression=compression)))
    lg.update_high_watermark(lg.log_end_offset)
    return [(info.first_offset + i, k, v) for i, (k, v) in enumerate(items)]


def cleaner_for(d, lg, clock, **kw):
    return LogCleaner([str(d)], lambda: {lg.topic_partition: lg},
                      CleanerConfig(dedupe_buffer_size=kw.pop("dedupe", MiB), **kw), time_ms=clock)


def expected(history, end, now=None, horizons=None):
    """What a consumer reads after cleaning [.., end): the last record of each key below end
    (tombstones too, as the model keeps them until their horizon), everything from end on."""
    last = {}
    for off, k, v in history:
        if off < end:
            last[k] = off
    return [(off, v) for off, k, v in history if off >= end or last[k] == off]


def checkpoint_of(d, lg):
    return OffsetCheckpointFile(os.path.join(str(d), CLEANER_OFFSET_CHECKPOINT)).read().get(lg.topic_partition)


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(5, 150), n_keys=st.integers(1, 30),
       codec=st.sampled_from([0, 1, 4]), rounds=st.integers(1, 3))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
def test_compaction_matches_model(tmp_path_factory, seed, n, n_keys, codec, rounds):
    d = tmp_path_factory.mktemp("c")
    rnd = random.Random(seed)
    clock = Clock()
    lg = open_log(d, clock)
    cl = cleaner_for(d, lg, clock)
    history = []
    for _ in range(rounds):
        for _ in range(n):
            items = [(b"k%d" % rnd.randrange(n_keys), b"v%d" % rnd.randrange(10**6))
                     for _ in range(rnd.randint(1, 4))]
            history += append(lg, clock, items, codec)
        cl.clean_once()
    end = checkpoint_of(d, lg)
    if end is None:                                   # only the active segment: nothing to clean
        assert lg.num_segments == 1
        end = 0
    assert end == lg.segments[-1].base_offset         # everything but the active segment is clean
    assert read_all(lg) == expected(history, end)
    # the offsets the model says survive, and only those; reopening (recovery) changes nothing
    lg.close()
    lg2 = Log.open(lg.dir, lg.config, time_ms=clock, had_clean_shutdown=False)
    assert read_all(lg2) == expected(history, end)
    assert lg2.log_end_offset == history[-1][0] + 1
    lg2.close()


def test_tombstones_survive_until_delete_retention(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"delete.retention.ms": 10_000})
    cl = cleaner_for(tmp_path, lg, clock)
    h = append(lg, clock, [(b"a", b"1"), (b"b", b"2")])
    h += append(lg, clock, [(b"a", None)])
    for i in range(40):
        h += append(lg, clock, [(b"c", b"x" * 50)])
    assert cl.clean_once() is not None
    got = dict((o, v) for o, v in read_all(lg))
    assert 0 not in got and got[2] is None and got[1] == b"2"      # tombstone kept, old "a" gone
    for i in range(40):
        h += append(lg, clock, [(b"c", b"y" * 50)])
    clock.now += 9_999
    cl.clean_once()
    assert 2 in dict(read_all(lg))                                  # still inside its horizon
    for i in range(40):
        h += append(lg, clock, [(b"c", b"z" * 50)])
    clock.now += 1
    cl.clean_once()
    got = dict(read_all(lg))
    assert 2 not in got and got[1] == b"2"                           # gone at the horizon


def test_dirty_ratio_and_compaction_lags(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"min.cleanable.dirty.ratio": 0.5})
    cl = cleaner_for(tmp_path, lg, clock)
    for i in range(100):
        append(lg, clock, [(b"k%d" % i, b"v" * 40)])      # distinct keys: cleaning keeps them all
    ltc = cl.clean_once()
    assert ltc is not None and ltc.cleanable_ratio > 0.5
    end = checkpoint_of(tmp_path, lg)
    # a little new dirty data: ratio far below 0.5 -> nothing to do
    while lg.segments[-1].base_offset == end:
        append(lg, clock, [(b"k1", b"v" * 40)])
    assert cl.grab_filthiest_log() is None and cl.clean_once() is None
    # max.compaction.lag.ms: the dirty segment is old enough -> cleaned despite the ratio
    lg.config = LogConfig(dict(lg.config.originals, **{"max.compaction.lag.ms": 1000}))
    clock.now += 1001
    ltc = cl.grab_filthiest_log()
    assert ltc is not None and ltc.need_compaction_now and ltc.cleanable_ratio < 0.5
    cl.done_cleaning(ltc, None)
    # min.compaction.lag.ms: segments younger than the lag are uncleanable
    lg.config = LogConfig(dict(lg.config.originals, **{"min.compaction.lag.ms": 60_000,
                                                          "min.cleanable.dirty.ratio": 0.01}))
    for i in range(30):
        append(lg, clock, [(b"k%d" % (i % 5), b"w" * 40)])
    assert cl.clean_once() is None
    clock.now += 60_001
    assert cl.clean_once() is not None
    assert checkpoint_of(tmp_path, lg) == lg.segments[-1].base_offset


def test_active_segment_and_high_watermark_bound_cleaning(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"segment.bytes": 10 * MiB})
    cl = cleaner_for(tmp_path, lg, clock)
    for i in range(50):
        append(lg, clock, [(b"k", b"%d" % i)])
    assert cl.clean_once() is None                     # all in the active segment
    lg.roll()
    for i in range(5):
        append(lg, clock, [(b"k", b"x")])
    lg.update_high_watermark(10)                       # HW inside the first segment: nothing cleanable
    assert cl.clean_once() is None
    lg.update_high_watermark(lg.log_end_offset)
    assert cl.clean_once() is not None
    assert [o for o, _ in read_all(lg)] == [49, 50, 51, 52, 53, 54]


def test_checkpoint_written_and_used(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path, clock)
    cl = cleaner_for(tmp_path, lg, clock)
    for i in range(60):
        append(lg, clock, [(b"k%d" % (i % 7), b"v" * 30)])
    cl.clean_once()
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    end = lg.segments[-1].base_offset
    assert path.read_text() == f"0\n1\nt 0 {end}\n"
    for i in range(60):
        append(lg, clock, [(b"k%d" % (i % 7), b"v" * 30)])
    cl2 = cleaner_for(tmp_path, lg, clock)            # a new cleaner (restart) reads the file
    ltc = cl2.grab_filthiest_log()
    assert ltc.first_dirty_offset == end
    cl2.done_cleaning(ltc, None)
    # an offset past the log end is reset to the log start offset
    path.write_text(f"0\n1\nt 0 {10**9}\n")
    cl3 = cleaner_for(tmp_path, lg, clock)
    ltc = cl3.grab_filthiest_log()
    assert ltc.first_dirty_offset == lg.log_start_offset


def test_small_offset_map_cleans_a_prefix_per_round(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path, clock)
    history = []
    rnd = random.Random(7)
    for i in range(200):
        history += append(lg, clock, [(b"key%d" % rnd.randrange(60), b"v%d" % i)])
    uncleanable = lg.segments[-1].base_offset
    cl = LogCleaner([str(tmp_path)], lambda: {lg.topic_partition: lg},
                    CleanerConfig(dedupe_buffer_size=24 * 20), time_ms=clock)   # 18 keys per round
    ends = []
    for _ in range(30):
        if cl.clean_once() is None:
            break
        ends.append(checkpoint_of(tmp_path, lg))
        assert cl.last_stats.map_full or ends[-1] == uncleanable
        assert read_all(lg) == expected(history, ends[-1])
    assert len(ends) > 2 and ends == sorted(ends) and ends[-1] == uncleanable


class _Crash(Exception):
    pass


@pytest.mark.parametrize("crash_at", range(6))
def test_crash_during_swap_recovers(tmp_path, monkeypatch, crash_at):
    """Stop after each rename of the swap (.cleaned->.swap, old->.deleted, .swap->live),
    then reopen with recovery: the log is either the old one or the cleaned one."""
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"segment.bytes": 4000})
    history = []
    for i in range(120):
        history += append(lg, clock, [(b"k%d" % (i % 9), b"v%d" % i + b"." * 20)])
    before = read_all(lg)
    end = lg.segments[-1].base_offset
    after = expected(history, end)
    cl = cleaner_for(tmp_path, lg, clock)
    calls = [0]
    real = LogSegment.change_file_suffixes

    def crashing(self, old, new):
        if calls[0] == crash_at:
            raise _Crash()
        calls[0] += 1
        return real(self, old, new)

    monkeypatch.setattr(LogSegment, "change_file_suffixes", crashing)
    # a crashed process removes nothing: .cleaned / .deleted files stay for recovery
    monkeypatch.setattr(LogSegment, "delete_if_exists", lambda self: None)
    ltc = cl.grab_filthiest_log()
    from kbroker.log.cleaner import Cleaner
    try:
        Cleaner(cl.config, clock, lambda tp: None).clean(ltc)
        crashed = False
    except _Crash:
        crashed = True
    monkeypatch.undo()
    names = os.listdir(lg.dir)
    lg2 = Log.open(lg.dir, lg.config, time_ms=clock, had_clean_shutdown=False)
    got = read_all(lg2)
    # a valid state: ordered, no duplicates, between the cleaned and the old log
    offsets = [o for o, _ in got]
    assert offsets == sorted(set(offsets))
    assert set(after) <= set(got) <= set(before), (crash_at, names)
    if crash_at == 0:
        assert got == before and any(n.endswith(".cleaned") for n in names)
    if not crashed:
        assert got == after
    assert not [n for n in os.listdir(lg2.dir) if n.endswith((".cleaned", ".swap", ".deleted"))]
    assert lg2.log_end_offset == 120
    # cleaning again from the recovered state gives the cleaned log
    lg2.update_high_watermark(lg2.log_end_offset)
    cl2 = cleaner_for(tmp_path / "other", lg2, clock)
    assert cl2.clean_once() is not None
    assert read_all(lg2) == after
    lg2.close()


def test_swap_is_dropped_if_segments_changed(tmp_path):
    clock = Clock()
    lg = open_log(tmp_path, clock)
    for i in range(80):
        append(lg, clock, [(b"k%d" % (i % 4), b"v" * 30)])
    cl = cleaner_for(tmp_path, lg, clock)
    ltc = cl.grab_filthiest_log()
    from kbroker.log.cleaner import Cleaner, CleaningAbortedError
    cleaner = Cleaner(cl.config, clock, lambda tp: None)
    real = lg.replace_segments

    def retention_first(new, old):
        lg.delete_records(lg.segments[1].base_offset)
        assert lg.delete_old_segments() == 1          # DeleteRecords + retention race the cleaner
        return real(new, old)

    lg.replace_segments = retention_first
    with pytest.raises(CleaningAbortedError):
        cleaner.clean(ltc)
    cl.done_cleaning(ltc, None)
    assert not [n for n in os.listdir(lg.dir) if n.endswith((".cleaned", ".swap"))]
    got = read_all(lg)
    assert got[-1][0] == 79 and len(got) == 80 - lg.log_start_offset   # nothing was compacted


def test_log_manager_runs_the_cleaner(tmp_path):
    clock = Clock()
    props = {"log.dirs": str(tmp_path), "log.cleaner.backoff.ms": "50", "log.cleaner.dedupe.buffer.size": str(MiB)}
    lm = LogManager.from_broker_config(props, time_ms=clock)
    assert isinstance(lm.cleaner, LogCleaner) and lm.cleaner.config.num_threads == 1
    lm.startup()
    try:
        lg = lm.get_or_create_log(("t", 0), LogConfig({"cleanup.policy": "compact", "segment.bytes": 1500,
                                                        "min.cleanable.dirty.ratio": 0.01}))
        history = []
        for i in range(100):
            history += append(lg, clock, [(b"k%d" % (i % 3), b"v%d" % i + b"-" * 30)])
        lm.cleanup_logs()                           # wakes the cleaner thread
        import time
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and checkpoint_of(tmp_path, lg) != lg.segments[-1].base_offset:
            time.sleep(0.05)
        end = checkpoint_of(tmp_path, lg)
        assert end == lg.segments[-1].base_offset
        assert read_all(lg) == expected(history, end)
    finally:
        lm.shutdown()
    off = LogManager.from_broker_config({"log.dirs": str(tmp_path), "log.cleaner.enable": "false"})
    assert off.cleaner is None
    with pytest.raises(Exception):
        LogManagerConfig.from_broker({"log.cleaner.dedupe.buffer.size": "1000"})


def _txn_append(lg, clock, pid, seq, items):
    info = lg.append(bytearray(records.encode_batch([(clock.now, k, v, []) for k, v in items], producer_id=pid,
                                                    producer_epoch=0, base_sequence=seq, is_transactional=True)))
    lg.update_high_watermark(lg.log_end_offset)
    return info


def _batches(lg):
    out = []
    for seg in lg.segments:
        with open(seg.log_path, "rb") as f:
            data = f.read()[:seg.size]
        out += records.decode_batches(data)
    return out


def test_aborted_transactions_are_removed_and_never_shadow_committed_data(tmp_path):
    """Kafka's cleaner: the batches of aborted transactions go (their keys never enter the
    offset map, so a later aborted record cannot remove a committed one); markers stay and
    so do their .txnindex entries; nothing at or above the last stable offset is cleaned."""
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"segment.bytes": 400})
    keys = [b"k%d" % i for i in range(4)]
    _txn_append(lg, clock, 1, 0, [(k, b"committed") for k in keys])
    lg.append_end_txn_marker(1, 0, 0, True)
    _txn_append(lg, clock, 2, 0, [(k, b"aborted") for k in keys])
    _txn_append(lg, clock, 2, 4, [(b"only-aborted", b"x")])
    lg.append_end_txn_marker(2, 0, 0, False)
    for i in range(12):
        append(lg, clock, [(b"filler%d" % (i % 3), b"f" * 40)])
    lso_txn = _txn_append(lg, clock, 3, 0, [(b"k0", b"open")])      # holds the LSO
    for i in range(12):
        append(lg, clock, [(b"late%d" % (i % 3), b"f" * 40)])
    lg.update_high_watermark(lg.log_end_offset)
    assert lg.last_stable_offset == lso_txn.first_offset
    aborted_before = lg.collect_aborted_transactions(0, lg.log_end_offset)
    assert [(a.producer_id, a.first_offset) for a in aborted_before] == [(2, 5)]
    cl = cleaner_for(tmp_path, lg, clock)
    assert cl.clean_once() is not None
    bs = _batches(lg)
    data = [(b.producer_id, r.key, r.value) for b in bs if not b.is_control for r in b.records]
    assert not [d for d in data if d[0] == 2]                          # the aborted transaction is gone
    assert [(k, v) for pid, k, v in data if pid == 1] == [(k, b"committed") for k in keys]
    assert (3, b"k0", b"open") in data                                  # above the LSO: untouched
    markers = [(b.producer_id, b.records[0].key) for b in bs if b.is_control]
    assert markers == [(1, b"\x00\x00\x00\x01"), (2, b"\x00\x00\x00\x00")]
    assert lg.collect_aborted_transactions(0, lg.log_end_offset) == aborted_before
    assert any(n.endswith(".txnindex") for n in os.listdir(lg.dir))
    assert not [n for n in os.listdir(lg.dir) if ".txnindex." in n]
    # a crash and recovery keep the cleaned segment's index
    lg2 = Log.open(lg.dir, lg.config, time_ms=clock, had_clean_shutdown=False)
    assert lg2.collect_aborted_transactions(0, lg2.log_end_offset) == aborted_before
    lg2.update_high_watermark(lg2.log_end_offset)
    assert lg2.last_stable_offset == lso_txn.first_offset
    lg2.close()


def test_markers_go_after_delete_retention_once_their_data_is_gone(tmp_path):
    """Kafka's cleaner: a marker whose transaction has no data left gets a delete horizon
    (delete.retention.ms), and the first cleaning after it removes the marker; the ABORT
    entry leaves the .txnindex with its data."""
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"segment.bytes": 400})
    _txn_append(lg, clock, 1, 0, [(b"k", b"committed")])
    lg.append_end_txn_marker(1, 0, 0, True)
    _txn_append(lg, clock, 2, 0, [(b"j", b"aborted")])
    lg.append_end_txn_marker(2, 0, 0, False)
    cl = cleaner_for(tmp_path, lg, clock)

    def dirty_and_clean():
        for i in range(12):
            append(lg, clock, [(b"filler%d" % (i % 3), b"f" * 40)])
        assert cl.clean_once() is not None

    def markers():
        return [(b.producer_id, b.has_delete_horizon) for b in _batches(lg) if b.is_control and b.producer_id < 5]

    dirty_and_clean()           # data of both read: markers stay, the aborted data goes
    assert markers() == [(1, False), (2, False)]
    assert len(lg.collect_aborted_transactions(0, lg.log_end_offset)) == 1
    append(lg, clock, [(b"k", b"newer")])        # the committed record's key is overwritten
    # producers expired: emptied batches are not kept for them (Kafka's lastRecordsOfActiveProducers)
    assert lg.remove_expired_producers(clock.now + 10 * 86_400_000) == [1, 2]
    # a transactional workload goes on (the cleaner runs its transaction pass for logs whose
    # producers write markers): pid 5's transaction and marker are read every time and stay
    _txn_append(lg, clock, 5, 0, [(b"z", b"z")])
    lg.append_end_txn_marker(5, 0, 0, True)
    dirty_and_clean()           # pid 1's data is read (and goes): its COMMIT stays this time
    assert not [b for b in _batches(lg) if b.producer_id == 1 and not b.is_control]
    assert markers() == [(1, False), (2, True)]   # the ABORT's data went in the first cleaning
    assert lg.collect_aborted_transactions(0, lg.log_end_offset) == []
    dirty_and_clean()
    assert markers() == [(1, True), (2, True)]    # before the horizon: both stay
    clock.now += 1001                             # delete.retention.ms = 1000
    dirty_and_clean()
    assert markers() == []
    values = [v for _, v in read_all(lg)]
    assert b"newer" in values and b"committed" not in values and b"aborted" not in values


@pytest.mark.parametrize("crash_at", range(5))
def test_crash_during_swap_keeps_the_aborted_transactions(tmp_path, monkeypatch, crash_at):
    """A crash after any rename of the swap: recovery keeps (or completes) the .txnindex
    that travels with the cleaned segment (.cleaned -> .swap -> live)."""
    from kbroker.log.cleaner import Cleaner
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"segment.bytes": 1000})
    _txn_append(lg, clock, 7, 0, [(b"k", b"aborted")])
    lg.append_end_txn_marker(7, 0, 0, False)
    for i in range(60):
        append(lg, clock, [(b"k%d" % (i % 5), b"v" * 30)])
    aborted = lg.collect_aborted_transactions(0, lg.log_end_offset)
    assert len(aborted) == 1
    cl = cleaner_for(tmp_path, lg, clock)
    calls = [0]
    real = LogSegment.change_file_suffixes

    def crashing(self, old, new):
        if calls[0] == crash_at:
            raise _Crash()
        calls[0] += 1
        return real(self, old, new)

    monkeypatch.setattr(LogSegment, "change_file_suffixes", crashing)
    monkeypatch.setattr(LogSegment, "delete_if_exists", lambda self: None)
    try:
        Cleaner(cl.config, clock, lambda tp: None).clean(cl.grab_filthiest_log())
    except _Crash:
        pass
    monkeypatch.undo()
    lg2 = Log.open(lg.dir, lg.config, time_ms=clock, had_clean_shutdown=False)
    assert lg2.collect_aborted_transactions(0, lg2.log_end_offset) == aborted, os.listdir(lg.dir)
    assert not [n for n in os.listdir(lg2.dir) if n.endswith((".cleaned", ".swap", ".deleted"))]
    lg2.close()

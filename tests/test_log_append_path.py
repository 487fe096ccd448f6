"""Log.append's two paths: one kernel call (``LogSegment.try_append``) and the general one."""
from kbroker.kernels import records
from kbroker.log import Log, LogConfig
from kbroker.log.segment import LogSegment
from _log_util import Clock, batch, read_all


def open_log(path, clock, **overrides):
    return Log.open(str(path / "topic-0"), LogConfig(overrides), time_ms=clock)


def test_broker_appends_take_the_one_call_path_unless_producer_state_must_be_checked(
        tmp_path, monkeypatch):
    """With validate_batches' infos, plain batches are written by one
    ``LogSegment.try_append``; idempotent batches (producer state to check), a
    segment that must roll, and appends without infos take the general path.
    Both write the same bytes."""
    seen = []
    real = LogSegment.try_append

    def spy(self, *a, **kw):
        r = real(self, *a, **kw)
        seen.append(r is not None)
        return r

    monkeypatch.setattr(LogSegment, "try_append", spy)
    clock = Clock()
    lg = open_log(tmp_path / "a", clock, **{"segment.ms": 1000})
    plain = batch(2, ts=clock.now)
    lg.append(bytearray(plain), records.validate_batches(plain))
    assert seen == [True]
    lg.append(bytearray(plain))                                   # no infos
    assert seen == [True]
    idem = bytearray(records.encode_batch([(clock.now, b"k", b"v", [])], producer_id=7,
                                          producer_epoch=0, base_sequence=0))
    assert lg.append(idem, records.validate_batches(idem)).first_offset == 4
    assert seen == [True]
    late = batch(1, ts=clock.now + 5000)                          # past segment.ms: roll
    assert lg.append(bytearray(late), records.validate_batches(late)).first_offset == 5
    assert seen == [True, False] and len(lg.segments) == 2
    assert lg.append(bytearray(plain), records.validate_batches(plain)).first_offset == 6
    assert seen == [True, False, True]
    other = open_log(tmp_path / "b", Clock(), **{"segment.ms": 1000})
    for b in (plain, plain, idem, late, plain):
        other.append(bytearray(b))
    assert read_all(lg) == read_all(other)
    lg.close()
    other.close()


def test_index_entries_of_the_active_segment_create_no_file_until_roll_flush_or_close(tmp_path):
    """The active segment's index entries live in anonymous memory (no file created on the
    append path). A crash (no close) loses them and recovery rebuilds the same entries;
    a roll, a flush and a clean close write exactly the entries."""
    import os

    clock = Clock()
    d = str(tmp_path / "t-0")
    lg = Log.open(d, LogConfig({"segment.ms": 1000}), time_ms=clock)
    big = batch(60, ts=clock.now)                         # ~7 KB: an index entry every append
    for _ in range(5):
        lg.append(bytearray(big), records.validate_batches(big))
    seg = lg.segments[-1]
    assert seg.offset_index.entries == 4
    assert not os.path.exists(seg.offset_index.path) and not os.path.exists(seg.time_index.path)
    want = seg.offset_index.raw_entries()
    # "crash": reopen without closing; the unflushed segment is recovered from the log
    again = Log.open(d, LogConfig({"segment.ms": 1000}), time_ms=clock, recovery_point=0,
                     had_clean_shutdown=False)
    assert again.segments[-1].offset_index.raw_entries() == want
    assert [len(b) for b in read_all(again)] == [len(b) for b in read_all(lg)]
    again.close()
    lg.flush()
    assert open(seg.offset_index.path, "rb").read(len(want)) == want
    late = batch(60, ts=clock.now + 5000)
    lg.append(bytearray(late), records.validate_batches(late))     # roll: trimmed file
    assert open(seg.offset_index.path, "rb").read() == want
    lg.append(bytearray(big), records.validate_batches(big))
    lg.append(bytearray(big), records.validate_batches(big))
    seg2 = lg.segments[-1]
    assert seg2.offset_index.entries == 2 and not os.path.exists(seg2.offset_index.path)
    want2 = seg2.offset_index.raw_entries()
    lg.close()
    assert open(seg2.offset_index.path, "rb").read() == want2
    assert os.path.getsize(seg2.time_index.path) % 12 == 0 and os.path.getsize(seg2.time_index.path) > 0


def test_high_watermark_follows_moves_it_in_the_append_view(tmp_path, monkeypatch):
    """A leader without followers (``high_watermark_follows``): the append publishes the
    new log end and the high watermark in one view, under one lock, so
    maybe_increment_high_watermark_to_end has nothing left to do; plain appends, the
    slow path (idempotent batches) and a duplicate keep the rule that the high
    watermark only moves forward and is at the end when append returns."""
    clock = Clock()
    lg = open_log(tmp_path, clock)
    changes = lg.hw_changes = [0]
    plain = batch(3, ts=clock.now)
    lg.append(bytearray(plain), records.validate_batches(plain))               # not asked: stays
    assert (lg.high_watermark, lg.log_end_offset) == (0, 3)
    info = lg.append(bytearray(plain), records.validate_batches(plain), high_watermark_follows=True)
    assert (info.first_offset, info.last_offset) == (3, 5)
    v = lg.view
    assert v.high_watermark is v.end and v.end.message_offset == 6 and changes == [1]
    calls = []
    monkeypatch.setattr(Log, "maybe_increment_high_watermark",
                        lambda self, meta: calls.append(meta) or None)
    assert lg.maybe_increment_high_watermark_to_end() is None and calls == []
    monkeypatch.undo()
    idem = records.encode_batch([(clock.now, b"k", b"v", [])], producer_id=7, producer_epoch=0,
                                base_sequence=0)
    info = lg.append(bytearray(idem), records.validate_batches(idem), high_watermark_follows=True)
    assert info.first_offset == 6 and lg.high_watermark == lg.log_end_offset == 7
    dup = lg.append(bytearray(idem), records.validate_batches(idem), high_watermark_follows=True)
    assert (dup.first_offset, dup.batch_count) == (6, 0) and lg.high_watermark == 7 and changes == [2]
    lg.close()


def test_high_watermark_follows_a_flush_when_one_is_due(tmp_path, monkeypatch):
    """flush.messages reached: the high watermark moves after the flush (records a
    consumer can read are flushed first, as Kafka's append flushes before the leader's
    high watermark moves)."""
    clock = Clock()
    lg = open_log(tmp_path, clock, **{"flush.messages": 1})
    seen = []
    real = Log.flush

    def spy(self, *a, **kw):
        seen.append(self.high_watermark)
        return real(self, *a, **kw)

    monkeypatch.setattr(Log, "flush", spy)
    plain = batch(2, ts=clock.now)
    lg.append(bytearray(plain), records.validate_batches(plain), high_watermark_follows=True)
    assert seen == [0] and lg.high_watermark == lg.log_end_offset == 2 and lg.recovery_point == 2
    lg.close()

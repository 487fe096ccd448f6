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

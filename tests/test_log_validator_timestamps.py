"""LogValidator's setMaxTimestamp step (server.log_validator.set_max_timestamps): every
batch's header ends up with the topic's timestamp type and Kafka's max timestamp (the
records' largest, -1 when none is above -1; ``now`` on a LogAppendTime topic), and a
buffer whose headers already say so comes back untouched (the common produce)."""
import pytest

from kbroker.kernels import records as rec
from kbroker.server import log_validator as lv

NOW = 1_700_000_000_999


def _batches():
    # (records' timestamps, header timestamp type, header max timestamp set afterwards)
    yield [5, 9, 7], lv.CREATE_TIME, None             # as a client writes it
    yield [5, 9, 7], lv.CREATE_TIME, 3                # a wrong header max
    yield [5, 9, 7], lv.LOG_APPEND_TIME, 100          # a LogAppendTime header on a CreateTime topic
    yield [-1, -1], lv.CREATE_TIME, None              # no timestamps: -1
    yield [-5, -1], lv.CREATE_TIME, 4                 # none above -1: -1


def _buf(ts, ts_type, header_max):
    b = bytearray(rec.encode_batch([(t, b"k", b"v", []) for t in ts], timestamp_type=ts_type))
    if header_max is not None:
        rec.set_max_timestamp(b, 0, ts_type, header_max)
    return b


@pytest.mark.parametrize("log_append_time", [False, True])
def test_headers_get_the_topic_type_and_max(log_append_time):
    for ts, ts_type, header_max in _batches():
        buf = _buf(ts, ts_type, header_max)
        two = bytes(buf) + bytes(buf)
        infos = rec.validate_batches(two)
        out = lv.set_max_timestamps(bytes(two), infos, log_append_time, NOW)
        for info, b in zip(infos, rec.decode_batches(bytes(out))):
            want_type = lv.LOG_APPEND_TIME if log_append_time else lv.CREATE_TIME
            if log_append_time:
                want_max = NOW
            elif ts_type == lv.LOG_APPEND_TIME:      # its records all carry the header's time
                want_max = header_max
            else:
                want_max = max([t for t in ts if t > -1], default=-1)
            assert want_max == (NOW if log_append_time else lv.batch_max_timestamp(info))
            assert (b.timestamp_type, b.max_timestamp) == (want_type, want_max), (ts, ts_type, header_max)
        rec.validate_batches(out)                     # CRCs recomputed


def test_a_buffer_already_right_is_returned_as_is():
    buf = _buf([5, 9, 7], lv.CREATE_TIME, None)
    assert lv.set_max_timestamps(buf, rec.validate_batches(buf), False, NOW) is buf
    ro = memoryview(bytes(buf))
    assert lv.set_max_timestamps(ro, rec.validate_batches(ro), False, NOW) is ro

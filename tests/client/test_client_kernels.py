"""kbroker.client's kernels and their twins: producer_append (lock-free append; close()
vs try_append() never loses or adds a record) and consumer_records."""
import threading

import pytest

from kbroker._core import producer_append as compiled
from kbroker._core.ref import producer_append as twin
from kbroker.client.producer.future import BatchResult, RecordFuture
from kbroker.kernels import records

IMPLS = [pytest.param(compiled, id="cython"), pytest.param(twin, id="python")]


def _batch(impl, batch_size=1000):
    result = BatchResult("t", 3)
    return impl.OpenBatch(records.BatchBuilder(batch_size=batch_size), result, RecordFuture), result


@pytest.mark.parametrize("impl", IMPLS)
def test_try_append_returns_futures_with_delta_and_sizes(impl):
    ob, result = _batch(impl)
    f0 = ob.try_append(1000, None, b"v" * 10, ())
    f1 = ob.try_append(1001, b"key", None, [("h", b"x")])
    assert type(f0) is RecordFuture and tuple(f0) == (result, 0, 1000, -1, 10)
    assert tuple(f1) == (result, 1, 1001, 3, -1)
    assert ob.record_count == 2 and not ob.closed
    result.complete(500, -1, None)
    md = f1.get(0)
    assert (md.topic, md.partition, md.offset, md.timestamp) == ("t", 3, 501, 1001)
    assert (md.serialized_key_size, md.serialized_value_size) == (3, -1)
    [batch] = records.decode_batches(ob.builder.build())
    assert [(r.offset, r.key, r.value) for r in batch.records] == [(0, None, b"v" * 10), (1, b"key", None)]


@pytest.mark.parametrize("impl", IMPLS)
def test_full_or_closed_batch_refuses(impl):
    ob, _ = _batch(impl, batch_size=200)
    n = 0
    while ob.try_append(1, None, b"x" * 50, ()) is not None:
        n += 1
        assert n < 100
    assert ob.closed and ob.record_count == n >= 1
    assert ob.try_append(1, None, b"", ()) is None and ob.record_count == n
    ob2, _ = _batch(impl)
    ob2.close()
    ob2.close()
    assert ob2.try_append(1, None, b"x", ()) is None and ob2.record_count == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_append_looks_up_the_open_batch(impl):
    ob, result = _batch(impl)
    open_batches = {("t", 3): ob}
    assert impl.append(open_batches, ("t", 4), 1, None, b"x", ()) is None
    f = impl.append(open_batches, ("t", 3), 7, None, b"x", ())
    assert f[0] is result and f[1] == 0


@pytest.mark.parametrize("impl", IMPLS)
def test_future_type_must_be_a_plain_tuple_subclass(impl):
    class WithNew(tuple):
        __slots__ = ()

        def __new__(cls, *a):
            return tuple.__new__(cls, a)
    for bad in (list, WithNew, object, 5):
        with pytest.raises(TypeError):
            impl.OpenBatch(records.BatchBuilder(), None, bad)


@pytest.mark.parametrize("impl", IMPLS)
def test_close_races_append_without_losing_records(impl):
    """An appender thread races the sender's close-then-build; a record is in the built
    batch iff its append returned a future (no record lands after the build)."""
    for _ in range(30):
        ob, _ = _batch(impl, batch_size=1 << 20)
        futures = []
        go = threading.Event()

        def appender():
            go.wait(5)
            for i in range(5000):
                f = ob.try_append(i, None, b"%d" % i, ())
                if f is None:
                    return
                futures.append(f)
        t = threading.Thread(target=appender)
        t.start()
        go.set()
        ob.close()                       # the sender's drain: close, then build at once
        buf = ob.builder.build()
        t.join(10)
        assert not t.is_alive()
        got = [r.value for b in records.decode_batches(buf) for r in b.records] if futures else []
        assert got == [b"%d" % f[2] for f in futures]
        assert ob.record_count == len(futures)


def test_record_future_is_compared_by_identity():
    r = BatchResult("t", 0)
    a, b = RecordFuture.of(r, 0, 1, -1, 1), RecordFuture.of(r, 0, 1, -1, 1)
    assert a == a and a != b and len({a, b}) == 2
    assert "pending" in repr(a)
    r.complete(10, -1, None)
    assert a.done() and a.succeeded() and not a.failed() and a.get(0).offset == 10
    seen = []
    a.add_callback(lambda err, md: seen.append(md.offset))
    assert seen == [10]


# -- consumer_records: decoded records -> ConsumerRecord tuples (kernel and twin) ----------
def test_consumer_records_kernel_matches_twin():
    from kbroker._core import consumer_records as c_impl
    from kbroker._core.ref import consumer_records as py_impl
    from kbroker.client.consumer.fetcher import ConsumerRecord
    buf = records.encode_batch([(1000 + i, b"k%d" % i if i % 2 else None, b"v%d" % i,
                                 [("h", b"x")] if i == 3 else []) for i in range(6)], base_offset=40)
    [batch] = records.decode_batches(buf)
    for start, stop in ((0, 6), (2, 4), (5, 99), (4, 2), (-3, 1)):
        a = c_impl.build(ConsumerRecord, batch.records, start, stop, "t", 1, 0, 7)
        b = py_impl.build(ConsumerRecord, batch.records, start, stop, "t", 1, 0, 7)
        assert a == b and all(type(r) is ConsumerRecord for r in a)
    r = c_impl.build(ConsumerRecord, batch.records, 3, 4, "t", 1, 0, 7)[0]
    assert (r.offset, r.timestamp, r.key, r.value, r.headers, r.leader_epoch) == \
        (43, 1003, b"k3", b"v3", [("h", b"x")], 7)
    for impl in (c_impl, py_impl):
        with pytest.raises(TypeError):
            impl.build(list, batch.records, 0, 1, "t", 1, 0, 7)

"""kbroker.client's kernels and their twins: producer_append (lock-free append; close()
vs try_append() never loses or adds a record) and consumer_records."""
import threading

import pytest

from kbroker._core import producer_append as compiled
from kbroker._core.ref import producer_append as twin
from kbroker.client.producer.future import BatchResult, RecordFuture, RecordMetadata
from kbroker.kernels import records

IMPLS = [pytest.param(compiled, id="cython"), pytest.param(twin, id="python")]


def _batch(impl, batch_size=1000):
    result = BatchResult("t", 3)
    return impl.OpenBatch(records.BatchBuilder(batch_size=batch_size), result, RecordFuture), result


def _compiled_batch():
    """A compiled OpenBatch whose result holds the compiled CallbackList (BatchResult
    takes the selected kernel's, the twin's under KBROKER_NO_EXTENSIONS=1)."""
    ob, result = _batch(compiled)
    result.callbacks = compiled.CallbackList()
    return ob, result


def _complete_compiled(result, base_offset):
    """BatchResult.complete with the compiled run_callbacks whatever kernel is selected."""
    result.base_offset, result.error, result.done = base_offset, None, True
    cbs, result.callbacks = result.callbacks, None
    compiled.run_callbacks(cbs, result, RecordMetadata, lambda: None)


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


@pytest.mark.parametrize("impl", IMPLS)
def test_callbacks_registered_by_append_run_in_order_with_metadata(impl):
    ob, result = _batch(impl)
    seen = []
    open_batches = {("t", 3): ob}
    impl.append(open_batches, ("t", 3), 1000, b"k", b"v" * 4, (), lambda e, md: seen.append(("a", e, md)))
    ob.try_append(1001, None, b"w", ())                      # no callback
    ob.try_append(1002, None, None, (), lambda e, md: seen.append(("c", e, md)))
    assert seen == [] and len(result.callbacks) == 6
    result.complete(70, -1, None)
    assert [(tag, e) for tag, e, _ in seen] == [("a", None), ("c", None)]
    a, c = seen[0][2], seen[1][2]
    assert type(a) is RecordMetadata and tuple(a) == ("t", 3, 70, 1000, 1, 4)
    assert tuple(c) == ("t", 3, 72, 1002, -1, -1) and c.offset == 72
    # the result is done: a callback registered now runs at once, in this thread
    ob.try_append(1003, None, b"x", (), lambda e, md: seen.append(("d", e, md)))
    assert seen[-1][0] == "d" and seen[-1][2].offset == 73
    assert result.callbacks is None                  # the future -> result cycle is broken


def test_compiled_futures_and_callbacks_in_flight_are_not_gc_tracked():
    """Futures are never tracked; a callback is off the collector's lists while its
    batch holds it and tracked again before it runs, also when shared by batches."""
    import functools
    import gc
    ob_a, result_a = _compiled_batch()
    ob_b, result_b = _compiled_batch()
    ran = []

    def on_delivery(tag, err, md):
        ran.append((tag, gc.is_tracked(cb), md.offset))
    cb = functools.partial(on_delivery, "cb")
    shared = functools.partial(on_delivery, "shared")
    f = ob_a.try_append(1, None, b"x", (), cb)
    ob_a.try_append(2, None, b"x", (), shared)
    ob_b.try_append(3, None, b"x", (), shared)       # already untracked by batch a
    assert not gc.is_tracked(f) and gc.is_tracked(result_a)
    assert not gc.is_tracked(cb) and not gc.is_tracked(shared)
    assert result_a.callbacks[2::3] == [True, True] and result_b.callbacks[2::3] == [False]
    gc.collect()                                     # nothing held by a batch is freed
    _complete_compiled(result_a, 10)
    assert ran == [("cb", True, 10), ("shared", True, 11)]
    assert gc.is_tracked(cb) and gc.is_tracked(shared)
    _complete_compiled(result_b, 20)
    assert ran[-1] == ("shared", True, 20) and gc.is_tracked(shared)
    assert result_a.callbacks is None and gc.is_tracked(cb)
    # a callable that is not a GC object (a static type) is left alone
    ob_c, result_c = _compiled_batch()
    ob_c.try_append(1, None, b"x", (), int)
    assert result_c.callbacks[1:] == [int, False] and not gc.is_tracked(int)


def test_an_untracked_callback_is_tracked_again_whenever_its_list_is_dropped():
    """Dropping a batch's CallbackList without running it (an abandoned batch) must
    track its callbacks again: a function freed while untracked would crash CPython.
    Only the kernel's own CallbackList gets untracked entries."""
    import gc
    ob, result = _compiled_batch()
    fn = lambda err, md: None     # noqa: E731 - a plain function, the case that would crash
    ob.try_append(1, None, b"x", (), fn)
    assert not gc.is_tracked(fn)
    result.callbacks = None                          # the list goes away unrun
    assert gc.is_tracked(fn)
    del fn                                           # freed while tracked: no crash
    result = BatchResult("t", 0)
    result.callbacks = twin.CallbackList()           # another list type: nothing untracked
    ob = compiled.OpenBatch(records.BatchBuilder(), result, RecordFuture)
    fn = lambda err, md: None     # noqa: E731
    ob.try_append(1, None, b"x", (), fn)
    assert gc.is_tracked(fn) and result.callbacks[2] is False
    result.complete(0, -1, None)


@pytest.mark.parametrize("impl", IMPLS)
def test_run_callbacks_error_log_append_time_and_raising_callback(impl):
    result = BatchResult("t", 0)
    futs = [RecordFuture.of(result, d, 10 + d, -1, 1) for d in range(3)]
    seen, errors = [], []

    def boom(e, md):
        raise RuntimeError("callback bug")
    result.base_offset, result.log_append_time, result.error = 5, 999, None
    cbs = [futs[0], lambda e, md: seen.append(md), False, futs[1], boom, False,
           futs[2], lambda e, md: seen.append(md), False]

    def on_error():
        import sys
        errors.append(sys.exc_info()[1])
    impl.run_callbacks(cbs, result, RecordMetadata, on_error)
    assert [(m.offset, m.timestamp) for m in seen] == [(5, 999), (7, 999)]
    assert [str(e) for e in errors] == ["callback bug"]
    result.error, seen[:] = ValueError("failed"), []
    impl.run_callbacks(cbs[:3], result, RecordMetadata, on_error)
    assert seen == [("t", 0, -1, -1, -1, -1)] and type(seen[0]) is RecordMetadata
    result.error, result.base_offset = None, -1            # acks=0: offset unknown
    impl.run_callbacks(cbs[:3], result, RecordMetadata, on_error)
    assert seen[-1].offset == -1
    with pytest.raises(TypeError):
        impl.run_callbacks(cbs, result, list, on_error)
    with pytest.raises(ValueError):
        impl.run_callbacks(cbs[:4], result, RecordMetadata, on_error)


@pytest.mark.parametrize("impl", IMPLS)
def test_callback_registration_races_completion_and_runs_exactly_once(impl):
    """Appends with callbacks race the batch's completion: every returned future's
    callback runs exactly once, either from the completer's list or at once."""
    for _ in range(20):
        ob, result = _batch(impl, batch_size=1 << 22)
        calls = []
        futures = []
        go = threading.Event()

        def appender():
            go.wait(5)
            for i in range(3000):
                f = ob.try_append(i, None, b"x", (), lambda e, md, i=i: calls.append(i))
                futures.append(f)
        t = threading.Thread(target=appender)
        t.start()
        go.set()
        result.complete(0, -1, None)
        t.join(10)
        assert not t.is_alive()
        assert sorted(calls) == list(range(3000)) == [f[1] for f in futures]


class _Sticky:
    __slots__ = ("partition", "produced_bytes")

    def __init__(self, partition):
        self.partition, self.produced_bytes = partition, 0


class _Metadata:
    def __init__(self, topics):
        self.cluster = type("Cluster", (), {})()
        self.cluster.topics = topics


@pytest.mark.parametrize("impl", IMPLS)
def test_send_path_picks_partition_appends_and_accounts_sticky_bytes(impl):
    import time
    from kbroker.kernels import murmur2
    meta = _Metadata({"t": [0, 1, 2], "u": [0]})
    batches = {tp: _batch(impl)[0] for tp in (("t", 0), ("t", 1), ("t", 2))}
    sticky = {"t": _Sticky(1)}
    full = []
    sp = impl.SendPath(meta, batches, sticky, 250, False, murmur2.partition_for_key,
                       lambda *a: full.append(a))
    seen = []
    f = sp.send("t", b"v" * 100, None, None, 1234, lambda e, md: seen.append(md))
    assert f[0] is batches[("t", 1)].result and tuple(f)[1:] == (0, 1234, -1, 100)
    assert sticky["t"].produced_bytes == 120 and full == []
    before = time.time_ns() // 1_000_000
    f = sp.send("t", b"v" * 100, None, None, None, None)           # time stamped now
    assert before <= f[2] <= time.time_ns() // 1_000_000 + 1
    assert sticky["t"].produced_bytes == 240 and full == []
    sp.send("t", None, None, None, 5, None)                          # a tombstone: 20 bytes
    assert sticky["t"].produced_bytes == 260
    assert full == [("t", 1, 0, meta.cluster, False)]
    k = b"some key"
    f = sp.send("t", b"x", k, None, 7, None)                         # keyed: murmur2
    assert f[0] is batches[("t", murmur2.partition_for_key(k, 3))].result
    f = sp.send("t", b"x", None, 2, 7, None)                         # explicit partition
    assert f[0] is batches[("t", 2)].result and sticky["t"].produced_bytes == 260
    batches[("t", 1)].result.complete(0, -1, None)
    assert [md.offset for md in seen] == [0]


@pytest.mark.parametrize("impl", IMPLS)
def test_send_path_leaves_everything_else_to_the_general_path(impl):
    from kbroker.kernels import murmur2
    meta = _Metadata({"t": [0, 1], "u": [0], "w": [0]})
    ob, _ = _batch(impl)
    batches = {("t", 0): ob}
    sticky = {"t": _Sticky(0), "w": _Sticky(3)}
    sp = impl.SendPath(meta, batches, sticky, 1 << 20, False, murmur2.partition_for_key,
                       lambda *a: pytest.fail("no switch expected"))
    cases = [("t", "str value", None, 0, 1), ("t", bytearray(b"x"), None, 0, 1),
             ("t", b"x", "str key", 0, 1), ("nope", b"x", None, 0, 1),   # no metadata
             ("t", b"x", None, 2, 1), ("t", b"x", None, -1, 1),         # out of range
             ("t", b"x", None, 1, 1),                                   # no open batch
             ("u", b"x", None, None, 1),                                # no sticky state
             ("w", b"x", None, None, 1),                                # sticky beyond count
             ("t", b"x", None, 1.0, 1), ("t", b"x", None, 0, 1.5),      # wrong types
             ("t", b"x", None, 2 ** 70, 1)]
    for topic, value, key, partition, ts in cases:
        assert sp.send(topic, value, key, partition, ts, None) is None, (topic, value, key, partition, ts)
    ob.close()
    assert sp.send("t", b"x", None, 0, 1, None) is None                 # closed batch
    assert ob.record_count == 0 and sticky["t"].produced_bytes == 0


_GC_CYCLE_SCRIPT = """
import functools, gc
from kbroker._core import producer_append as c
from kbroker.client.producer.future import BatchResult, RecordFuture
from kbroker.kernels import records
for _ in range(50):
    res = BatchResult("t", 0)
    res.callbacks = c.CallbackList()
    ob = c.OpenBatch(records.BatchBuilder(), res, RecordFuture)
    f1 = ob.try_append(1, None, b"x", (), lambda e, md: None)   # untracked; only the list holds it
    assert not gc.is_tracked(res.callbacks[1])
    box = [res.callbacks]
    f1.add_callback(functools.partial(print, box))            # tracked: list -> partial -> box -> list
    res.callbacks = None
    del box, f1, ob, res
    gc.collect()                                               # collects that cycle
print("survived")
"""


def test_the_cyclic_gc_collecting_a_callback_list_does_not_free_an_untracked_callback():
    """A CallbackList in a garbage cycle: the collector must not clear it (that would free
    the untracked function and crash CPython); it clears another member, and the list's
    dealloc tracks the function again first. Run in a child: a crash is a failed test."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _GC_CYCLE_SCRIPT], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stderr[-2000:])


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

"""The schema-registry header check of the records kernel (kbroker.key/value.schema.validation):
``validate_batches(key_schema=..., value_schema=...)`` in the same walk as Kafka's record
checks, on the Cython kernel and its pure-Python twin, cross-checked."""
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbroker._core.ref import records as ref_records

try:
    from kbroker._core import records as c_records
except ImportError:  # pragma: no cover
    c_records = None

IMPLS = [pytest.param(ref_records, id="python")]
if c_records is not None:
    IMPLS.insert(0, pytest.param(c_records, id="cython"))

NOW = 1_700_000_000_000


def framed(schema_id: int, payload: bytes = b"payload") -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + payload


@pytest.mark.parametrize("codec", [0, 1, 4])
@pytest.mark.parametrize("impl", IMPLS)
def test_header_check_lists_failing_records_and_distinct_ids(impl, codec):
    recs = [(NOW, None, framed(7), []),                   # ok: null key passes
            (NOW, framed(9), b"{\"x\": 1}", []),          # value: first byte '{'
            (NOW, b"k", None, []),                        # key shorter than the header
            (NOW, None, None, []),                        # a tombstone with a null key passes
            (NOW, framed(9), framed(8), []),              # ok
            (NOW, framed(-1), b"\x00\x00\x00", []),       # value: 3 bytes
            (NOW, b"\x01\x00\x00\x00\x01", framed(7), [])]  # key: magic byte 1
    raw = impl.encode_batch(recs, compression=codec)
    (info,) = impl.validate_batches(raw, timestamp_type=0, now_ms=NOW, key_schema=True, value_schema=True)
    K, V = impl.RECORD_ERROR_KEY_SCHEMA, impl.RECORD_ERROR_VALUE_SCHEMA
    assert info.record_errors == ((1, V, ord("{")), (2, K, 256 + 1), (5, V, 256 + 3), (6, K, 1))
    assert info.schema_ids == ((impl.SCHEMA_KEY, -1), (impl.SCHEMA_KEY, 9),
                               (impl.SCHEMA_VALUE, 7), (impl.SCHEMA_VALUE, 8))
    (info,) = impl.validate_batches(raw, timestamp_type=0, now_ms=NOW, value_schema=True)
    assert info.record_errors == ((1, V, ord("{")), (5, V, 256 + 3))
    assert info.schema_ids == ((impl.SCHEMA_VALUE, 7), (impl.SCHEMA_VALUE, 8))
    # off by default, and only with record checks on (a leader's append of a client's records)
    for kw in ({"timestamp_type": 0}, {"key_schema": True, "value_schema": True}):
        (info,) = impl.validate_batches(raw, **kw)
        assert (info.record_errors, info.schema_ids) == ((), ())


@pytest.mark.parametrize("impl", IMPLS)
def test_kafka_record_checks_come_first(impl):
    """One error per record: LogValidator's own (null key on a compacted topic, timestamp)
    before the schema header's, the key's header before the value's."""
    recs = [(NOW, None, b"raw", []), (NOW - 10_000, framed(1), b"raw", []), (NOW, b"raw key", b"raw", [])]
    raw = impl.encode_batch(recs)
    (info,) = impl.validate_batches(raw, timestamp_type=0, now_ms=NOW, timestamp_before_max_ms=5_000,
                                    compacted=True, key_schema=True, value_schema=True)
    assert info.record_errors == ((0, impl.RECORD_ERROR_NO_KEY, NOW),
                                  (1, impl.RECORD_ERROR_TIMESTAMP, NOW - 10_000),
                                  (2, impl.RECORD_ERROR_KEY_SCHEMA, ord("r")))


@pytest.mark.parametrize("impl", IMPLS)
def test_many_distinct_ids_in_one_batch(impl):
    """The id set grows past its inline table (16 slots) and keeps each id once."""
    recs = [(NOW, framed(i % 300), framed(1_000_000 + i % 1000), []) for i in range(3000)]
    raw = impl.encode_batch(recs)
    (info,) = impl.validate_batches(raw, timestamp_type=0, now_ms=NOW, key_schema=True, value_schema=True)
    assert info.record_errors == ()
    assert info.schema_ids == tuple([(0, i) for i in range(300)] + [(1, 1_000_000 + i) for i in range(1000)])


@pytest.mark.parametrize("impl", IMPLS)
def test_every_batch_gets_its_own_ids(impl):
    raw = impl.encode_batch([(NOW, None, framed(1), [])]) + impl.encode_batch([(NOW, None, framed(2), [])])
    infos = impl.validate_batches(raw, timestamp_type=0, now_ms=NOW, value_schema=True)
    assert [i.schema_ids for i in infos] == [((1, 1),), ((1, 2),)]


_PAYLOAD = st.one_of(
    st.none(), st.binary(max_size=8),
    st.builds(lambda i, tail: framed(i, tail), st.integers(-(1 << 31), (1 << 31) - 1), st.binary(max_size=4)))


@pytest.mark.skipif(c_records is None, reason="Cython kernel not built (KBROKER_REQUIRE_EXTENSIONS=1 fails instead)")
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(st.tuples(st.sampled_from([NOW, NOW - 10_000]), _PAYLOAD, _PAYLOAD), min_size=1,
                        max_size=40),
       key_schema=st.booleans(), value_schema=st.booleans(), compacted=st.booleans(),
       codec=st.sampled_from([0, 3]))
def test_kernel_and_twin_agree(records, key_schema, value_schema, compacted, codec):
    raw = ref_records.encode_batch([(ts, k, v, []) for ts, k, v in records], compression=codec)
    kw = dict(timestamp_type=0, now_ms=NOW, timestamp_before_max_ms=5_000, compacted=compacted,
              key_schema=key_schema, value_schema=value_schema)
    assert c_records.validate_batches(raw, **kw) == ref_records.validate_batches(raw, **kw)

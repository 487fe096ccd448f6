"""The "kbroker" Spark data source over log segments: what Spark reads equals
exactly what a record-batch decoder yields from the same files."""
import os
import pathlib

import pytest

import pyspark  # noqa: F401,E402  (the bench extra; tools/test.sh installs it)

from conftest_spark import spark  # noqa: E402,F401
from kbroker._core.ref import records as ref_records  # noqa: E402
from kbroker.analysis import spark_source  # noqa: E402
from kbroker.kernels import records  # noqa: E402

COLUMNS = ["topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers"]


@pytest.fixture(scope="module")
def kb(spark):   # noqa: F811
    spark_source.register(spark)
    return spark


def spark_rows(kb, path, **options):   # noqa: F811
    df = kb.read.format("kbroker").options(**options).load(str(path))
    assert df.columns == COLUMNS
    rows = [(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
             None if r.key is None else bytes(r.key), None if r.value is None else bytes(r.value),
             [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers])
            for r in df.collect()]
    return df, sorted(rows, key=lambda r: (r[0], r[1], r[2]))


def decoded_rows(path):
    """Independent decode: the pure-Python twin over every segment file."""
    out = []
    for d in sorted(pathlib.Path(path).iterdir()):
        if not d.is_dir():
            continue
        topic, _, part = d.name.rpartition("-")
        for seg in sorted(d.glob("*.log")):
            for b in ref_records.decode_batches(seg.read_bytes()):
                if b.is_control:
                    continue
                out += [(topic, int(part), r.offset, r.timestamp, b.timestamp_type,
                         None if r.key is None else bytes(r.key),
                         None if r.value is None else bytes(r.value),
                         [(k, None if v is None else bytes(v)) for k, v in r.headers])
                        for r in b.records]
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def test_segments_written_by_the_log_read_back_exactly(kb, tmp_path):   # noqa: F811
    import kbroker.log.log as log_mod
    from kbroker.log.config import LogConfig
    written = {}
    for topic, part in (("orders", 0), ("orders", 1), ("audit-log", 0)):
        log = log_mod.Log.open(str(tmp_path / f"{topic}-{part}"),
                               LogConfig({"segment.bytes": 4096}))
        try:
            n = 0
            for b in range(12):
                recs = [(1_700_000_000_000 + b * 10 + i,
                         None if i % 3 == 0 else f"k{b}-{i}".encode(),
                         None if i == 4 else os.urandom(40 + i),
                         [("h", f"{b}".encode()), ("empty", None)] if i % 2 else [])
                        for i in range(6)]
                log.append(bytearray(records.encode_batch(recs)))
                n += len(recs)
            written[(topic, part)] = n
        finally:
            log.close()
    segments = sorted(tmp_path.glob("*/*.log"))
    assert len(segments) > 3                           # rolled: several segments per partition

    df, got = spark_rows(kb, tmp_path)
    assert df.rdd.getNumPartitions() == len(segments)  # one Spark partition per segment
    expected = decoded_rows(tmp_path)
    assert got == expected
    assert len(got) == sum(written.values())
    for (topic, part), n in written.items():
        assert [r[2] for r in got if r[:2] == (topic, part)] == list(range(n))

    # a partition directory, and the topic option
    _, one = spark_rows(kb, tmp_path / "orders-1")
    assert one == [r for r in expected if r[:2] == ("orders", 1)]
    _, audit = spark_rows(kb, tmp_path, topic="audit-log")
    assert audit == [r for r in expected if r[0] == "audit-log"]


def test_hand_written_segment_with_control_batch_and_torn_tail(kb, tmp_path):   # noqa: F811
    """Batches built by aiokafka (an independent encoder); control batch skipped;
    a partial trailing batch and preallocated zeros end the segment."""
    import aiokafka.record.default_records as builder_mod
    part = tmp_path / "t-0"
    part.mkdir()
    expected, blob, offset = [], bytearray(), 0
    for b in range(3):
        builder = builder_mod.DefaultRecordBatchBuilder(
            magic=2, compression_type=0, is_transactional=0, producer_id=-1,
            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        for i in range(5):
            key = None if i == 0 else f"key-{b}-{i}".encode()
            value = f"value-{b}-{i}".encode() * (i + 1)
            headers = [("x", b"1"), ("y", None)] if i == 2 else []
            builder.append(i, timestamp=1_600_000_000_000 + i, key=key, value=value,
                           headers=headers)
            expected.append(("t", 0, offset + i, 1_600_000_000_000 + i, 0, key, value, headers))
        buf = bytearray(builder.build())
        buf[0:8] = offset.to_bytes(8, "big")        # base offset (outside the CRC)
        blob += buf
        offset += 5
        if b == 0:   # a transaction marker between data batches
            blob += records.encode_batch([(0, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [])],
                                         base_offset=offset, is_control=True,
                                         is_transactional=True, producer_id=7, producer_epoch=0)
            offset += 1
    # segment 1 ends in preallocated zeros; segment 2 in a torn (partial) batch
    (part / "00000000000000000000.log").write_bytes(bytes(blob) + bytes(64))
    last = records.encode_batch([(5, b"k", b"kept", [])], base_offset=offset)
    torn = records.encode_batch([(6, b"k", b"lost", [])], base_offset=offset + 1)
    (part / f"{offset:020d}.log").write_bytes(last + torn[: len(torn) - 3])
    rec = ref_records.decode_batch(last).records[0]
    expected.append(("t", 0, offset, rec.timestamp, 0, b"k", b"kept", []))
    (part / "00000000000000000000.index").write_bytes(bytes(80))   # ignored
    _, got = spark_rows(kb, part)
    assert got == expected


def test_empty_and_missing_dirs(kb, tmp_path):   # noqa: F811
    (tmp_path / "t-0").mkdir()
    _, got = spark_rows(kb, tmp_path)
    assert got == []
    with pytest.raises(Exception, match="not a directory"):
        kb.read.format("kbroker").load(str(tmp_path / "nope")).collect()


def test_corrupt_batch_fails_unless_ignored(kb, tmp_path):   # noqa: F811
    part = tmp_path / "c-0"
    part.mkdir()
    good = records.encode_batch([(1, b"a", b"b", [])], base_offset=0)
    bad = bytearray(records.encode_batch([(1, b"c", b"d", [])], base_offset=1))
    bad[-1] ^= 0xFF                                   # breaks the CRC
    (part / "00000000000000000000.log").write_bytes(good + bytes(bad))
    with pytest.raises(Exception, match="position"):
        kb.read.format("kbroker").load(str(part)).collect()
    _, got = spark_rows(kb, part, ignoreCorrupt="true")
    assert [r[2] for r in got] == [0]


def test_isolation_level_read_committed_skips_aborted_transactions(kb, tmp_path):   # noqa: F811
    """isolationLevel=read_committed: the records of aborted transactions (from the
    .txnindex, also when their ABORT marker is in a later segment) are not read."""
    import time
    import kbroker.log.log as log_mod
    from kbroker.log.config import LogConfig
    now = int(time.time() * 1000)
    lg = log_mod.Log.open(str(tmp_path / "tx-0"), LogConfig({"segment.bytes": 400}))

    def txn(pid, seq, value):
        lg.append(bytearray(records.encode_batch([(now, None, value, [])], producer_id=pid, producer_epoch=0,
                                                 base_sequence=seq, is_transactional=True)))

    def plain(value):
        lg.append(bytearray(records.encode_batch([(now, None, value, [])])))
    try:
        txn(1, 0, b"c1")
        txn(2, 0, b"a1")
        for i in range(8):
            plain(b"p%d" % i)
        txn(2, 1, b"a2")
        txn(1, 1, b"c2")
        lg.append_end_txn_marker(1, 0, 0, True, timestamp_ms=now)
        lg.append_end_txn_marker(2, 0, 0, False, timestamp_ms=now)
        plain(b"end")
        assert lg.num_segments > 2
    finally:
        lg.close()
    _, everything = spark_rows(kb, tmp_path)
    _, committed = spark_rows(kb, tmp_path, isolationLevel="read_committed")
    assert [r[6] for r in everything] == [b"c1", b"a1"] + [b"p%d" % i for i in range(8)] + [b"a2", b"c2", b"end"]
    assert [r[6] for r in committed] == [b"c1"] + [b"p%d" % i for i in range(8)] + [b"c2", b"end"]
    with pytest.raises(Exception, match="isolationLevel"):
        spark_rows(kb, tmp_path, isolationLevel="serializable")

"""kbroker.tools.dump_log (kafka-dump-log.sh) and kbroker.tools.topics (kafka-topics.sh), also run as tools/*.py."""
import io
import os
import struct
import subprocess
import sys
import uuid

import pytest

from kbroker.kernels import records
from kbroker.log.config import LogConfig
from kbroker.log.log import Log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


from kbroker.tools import dump_log  # noqa: E402
from kbroker.tools import topics as kbroker_topics  # noqa: E402

TS = 1_700_000_000_000


@pytest.fixture
def log_dir(tmp_path):
    """A partition with three known batches: 3 records, 1 gzip record with a header, 2 records
    with a producer id and sequence; index entries every 100 bytes."""
    d = str(tmp_path / "dump-0")
    lg = Log.open(d, LogConfig({"index.interval.bytes": 100}))
    b1 = records.encode_batch([(TS + i, f"k{i}".encode(), f"value-{i}".encode(), []) for i in range(3)])
    b2 = records.encode_batch([(TS + 10, None, b"zipped" * 20, [("h1", b"x"), ("h2", None)])],
                              compression=records.GZIP)
    b3 = records.encode_batch([(TS + 20, b"p", b"a", []), (TS + 21, b"q", b"b", [])],
                              producer_id=7, producer_epoch=2, base_sequence=5)
    sizes = []
    for b in (b1, b2, b3):
        sizes.append(len(b))
        lg.append(bytearray(b))
    lg.flush()
    lg.close()
    return d, sizes


def _run(fn, *args, **kw):
    out = io.StringIO()
    fn(*args, out, **kw)
    return out.getvalue().splitlines()


def _crc(path, pos):
    with open(path, "rb") as f:
        f.seek(pos + 17)
        return struct.unpack(">I", f.read(4))[0]


def test_dump_log_batches(log_dir):
    d, (s1, s2, s3) = log_dir
    path = os.path.join(d, "00000000000000000000.log")
    lines = _run(dump_log.dump_log_segment, path)
    assert lines[0] == "Log starting offset: 0"
    assert lines[1:] == [
        "baseOffset: 0 lastOffset: 2 count: 3 baseSequence: -1 lastSequence: -1 producerId: -1 "
        "producerEpoch: -1 partitionLeaderEpoch: -1 isTransactional: false isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: {TS + 2} size: {s1} magic: 2 "
        f"compresscodec: none crc: {_crc(path, 0)} isvalid: true",
        "baseOffset: 3 lastOffset: 3 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 "
        "producerEpoch: -1 partitionLeaderEpoch: -1 isTransactional: false isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: {s1} CreateTime: {TS + 10} size: {s2} magic: 2 "
        f"compresscodec: gzip crc: {_crc(path, s1)} isvalid: true",
        "baseOffset: 4 lastOffset: 5 count: 2 baseSequence: 5 lastSequence: 6 producerId: 7 "
        "producerEpoch: 2 partitionLeaderEpoch: -1 isTransactional: false isControl: false "
        f"deleteHorizonMs: OptionalLong.empty position: {s1 + s2} CreateTime: {TS + 21} size: {s3} magic: 2 "
        f"compresscodec: none crc: {_crc(path, s1 + s2)} isvalid: true",
    ]


def test_dump_log_records(log_dir):
    d, _ = log_dir
    path = os.path.join(d, "00000000000000000000.log")
    lines = _run(dump_log.dump_log_segment, path, print_data=True)
    recs = [l for l in lines if l.startswith("|")]
    assert recs == [
        f"| offset: 0 CreateTime: {TS} keySize: 2 valueSize: 7 sequence: -1 headerKeys: [] key: k0 payload: value-0",
        f"| offset: 1 CreateTime: {TS + 1} keySize: 2 valueSize: 7 sequence: -1 headerKeys: [] key: k1 payload: value-1",
        f"| offset: 2 CreateTime: {TS + 2} keySize: 2 valueSize: 7 sequence: -1 headerKeys: [] key: k2 payload: value-2",
        f"| offset: 3 CreateTime: {TS + 10} keySize: -1 valueSize: 120 sequence: -1 headerKeys: [h1,h2] "
        f"payload: {'zipped' * 20}",
        f"| offset: 4 CreateTime: {TS + 20} keySize: 1 valueSize: 1 sequence: 5 headerKeys: [] key: p payload: a",
        f"| offset: 5 CreateTime: {TS + 21} keySize: 1 valueSize: 1 sequence: 6 headerKeys: [] key: q payload: b",
    ]
    # --deep-iteration without --print-data-log: records, no contents
    deep = [l for l in _run(dump_log.dump_log_segment, path, deep=True) if l.startswith("|")]
    assert deep[0] == f"| offset: 0 CreateTime: {TS} keySize: 2 valueSize: 7 sequence: -1 headerKeys: []"


def test_dump_corrupt_and_truncated(log_dir, tmp_path):
    d, (s1, s2, s3) = log_dir
    src = os.path.join(d, "00000000000000000000.log")
    data = bytearray(open(src, "rb").read())
    data[s1 + 70] ^= 0xFF            # damage the gzip batch's payload: CRC no longer matches
    data += b"\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x01\x00\x01"   # a torn batch header
    bad_dir = tmp_path / "bad-0"
    bad_dir.mkdir()
    path = str(bad_dir / "00000000000000000000.log")
    open(path, "wb").write(data)
    lines = _run(dump_log.dump_log_segment, path)
    assert lines[1].endswith("isvalid: true")
    assert f"position: {s1} " in lines[2] and lines[2].endswith("isvalid: false")
    assert lines[3].endswith("isvalid: true")
    assert lines[4] == "Found 13 invalid bytes at the end of 00000000000000000000.log"


def test_dump_indexes(log_dir):
    d, (s1, s2, s3) = log_dir
    idx = _run(dump_log.dump_offset_index, os.path.join(d, "00000000000000000000.index"))
    # index.interval.bytes=100: an entry (the batch's last offset -> its position) for each batch
    # appended once 100 bytes have passed since the previous entry
    assert idx, "expected offset index entries"
    positions = {2: 0, 3: s1, 5: s1 + s2}
    for line in idx:
        _, off, _, pos = line.split()
        assert positions[int(off)] == int(pos), line
    tidx = _run(dump_log.dump_time_index, os.path.join(d, "00000000000000000000.timeindex"))
    assert tidx and all(l.startswith("timestamp: ") for l in tidx)
    ts = [int(l.split()[1]) for l in tidx]
    assert ts == sorted(ts) and ts[-1] <= TS + 21


def test_dump_log_cli(log_dir):
    d, _ = log_dir
    files = ",".join(os.path.join(d, f"00000000000000000000{s}") for s in (".log", ".index", ".timeindex"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "dump_log.py"), "--files", files,
                        "--print-data-log"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == f"Dumping {os.path.join(d, '00000000000000000000.log')}"
    assert sum(l.startswith("baseOffset:") for l in out) == 3
    assert sum(l.startswith("| offset:") for l in out) == 6
    assert any(l.startswith("Dumping") and l.endswith(".timeindex") for l in out)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "dump_log.py"), "--files", "/nonexistent.log"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1


@pytest.mark.timeout(60)
def test_dump_broker_segment_and_topics_tool(tmp_path):
    """kbroker_topics creates a topic on a real broker; records produced to it dump as written."""
    from kbroker.testing import KBrokerProcess
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages.produce import PartitionProduceData, ProduceRequest, TopicProduceData

    topic = f"tools-{uuid.uuid4().hex[:8]}"
    with KBrokerProcess(data_dir=str(tmp_path)) as b:
        b.start()
        out = io.StringIO()
        assert kbroker_topics.main(["--bootstrap-server", b.bootstrap, "--create", "--topic", topic,
                                    "--partitions", "2", "--config", "retention.ms=3600000"], out) == 0
        assert kbroker_topics.main(["--bootstrap-server", b.bootstrap, "--list"], out) == 0
        assert topic in out.getvalue().splitlines()
        out = io.StringIO()
        assert kbroker_topics.main(["--bootstrap-server", b.bootstrap, "--describe", "--topic", topic], out) == 0
        desc = out.getvalue().splitlines()
        assert "PartitionCount: 2" in desc[0] and "Configs: retention.ms=3600000" in desc[0]
        assert len(desc) == 3 and "Leader: 1" in desc[1]
        batch = records.encode_batch([(TS, b"key", b"hello broker", [])])
        with kbroker_topics.WireClient(b.bootstrap) as c:
            resp = c.request(ApiKey.PRODUCE, ProduceRequest(acks=-1, timeout_ms=10000, topic_data=[
                TopicProduceData(name=topic, partition_data=[PartitionProduceData(index=1, records=batch)])]),
                version=9)
        assert resp.responses[0].partition_responses[0].error_code == 0
        assert kbroker_topics.main(["--bootstrap-server", b.bootstrap, "--create", "--topic", topic], io.StringIO()) == 1
        assert kbroker_topics.main(["--bootstrap-server", b.bootstrap, "--create", "--topic", topic,
                                    "--if-not-exists"], io.StringIO()) == 0
        seg = os.path.join(tmp_path, "logs", f"{topic}-1", "00000000000000000000.log")
        lines = _run(dump_log.dump_log_segment, seg, print_data=True)
        assert lines[1].startswith("baseOffset: 0 lastOffset: 0 count: 1 ")
        assert "partitionLeaderEpoch: 0 " in lines[1] and lines[1].endswith("isvalid: true")
        assert lines[2] == f"| offset: 0 CreateTime: {TS} keySize: 3 valueSize: 12 sequence: -1 headerKeys: [] key: key payload: hello broker"
        assert kbroker_topics.main(["--bootstrap-server", b.bootstrap, "--delete", "--topic", topic], io.StringIO()) == 0
        out = io.StringIO()
        kbroker_topics.main(["--bootstrap-server", b.bootstrap, "--list"], out)
        assert topic not in out.getvalue().splitlines()


def test_topics_config_argument_parsing():
    assert kbroker_topics._kv(["a=1,b=2", "cleanup.policy=compact,delete", "x=[p,q],y=3"]) == {
        "a": "1", "b": "2", "cleanup.policy": "compact,delete", "x": "p,q", "y": "3"}
    with pytest.raises(SystemExit):
        kbroker_topics._kv(["novalue"])


def test_dump_txn_index_and_markers(tmp_path):
    """kafka-dump-log's .txnindex lines, and the marker line of a control batch."""
    d = str(tmp_path / "txn-0")
    lg = Log.open(d, LogConfig({}))
    lg.append(bytearray(records.encode_batch([(TS, None, b"t", [])], producer_id=9, producer_epoch=1,
                                             base_sequence=0, is_transactional=True)))
    lg.append_end_txn_marker(9, 1, 4, False, timestamp_ms=TS)
    lg.close()
    lines = _run(dump_log.dump_txn_index, os.path.join(d, "00000000000000000000.txnindex"))
    assert lines == ["version: 0 producerId: 9 firstOffset: 0 lastOffset: 1 lastStableOffset: 2"]
    data = [l for l in _run(dump_log.dump_log_segment, os.path.join(d, "00000000000000000000.log"),
                            print_data=True) if l.startswith("|")]
    assert data[-1].endswith("endTxnMarker: ABORT coordinatorEpoch: 4"), data

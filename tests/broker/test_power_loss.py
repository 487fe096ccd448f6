"""Power loss: only what was fsynced survives (tests/_powerloss_fs.py), unlike SIGKILL.

The broker runs with its log dir on a FUSE pass-through file system that
records what is durable (file bytes as of their last fsync, directory
entries as of their directory's last fsync). A power loss is SIGKILL, unmount,
and a restart on the durable tree alone. Invariants:

* ``kbroker.log.fsync.every.append=true``: every acknowledged record (acks=all)
  survives, at its offset, and the restarted broker appends after it.
* default (page cache only, as Kafka): acknowledged records past the last
  fsync are lost; a torn tail (part of them written back) is truncated at the
  last whole batch and the surviving records are an exact prefix.

The first test checks the layer's model itself (no broker).
"""
import mmap
import os
import struct
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kbroker.testing import KBrokerProcess
from tests._powerloss_fs import PowerLossFS
from tests.broker.kafka_helpers import consume_assigned, create_topic

N = 1200
BASE = {"num.partitions": 1, "group.initial.rebalance.delay.ms": 0}


@pytest.fixture
def plfs(tmp_path):
    fs = PowerLossFS(str(tmp_path / "fs")).start()
    yield fs
    fs.close()


@pytest.fixture
def brokers():
    procs = []
    yield procs
    for b in procs:
        b.kill()


def _start(brokers, run_dir, log_dir, **overrides):
    b = KBrokerProcess(data_dir=str(run_dir), overrides={**BASE, **overrides, "log.dirs": log_dir})
    brokers.append(b)
    os.makedirs(b.data_dir, exist_ok=True)
    return b.start()


def _value(i: int) -> bytes:
    return b"v%06d-" % i + bytes([65 + i % 26]) * 90


def _produce(bootstrap, topic, start, n, **conf):
    """(offset, value) of each acknowledged record, in send order."""
    acked, errors = [], []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2, **conf})

    def cb(err, m):
        (errors if err is not None else acked).append(err if err is not None else (m.offset(), m.value()))

    for i in range(start, start + n):
        p.produce(topic, value=_value(i), partition=0, on_delivery=cb)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    assert len(acked) == n
    return sorted(acked)


def _end_offset(bootstrap, topic) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-" + uuid.uuid4().hex})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)[1]
    finally:
        c.close()


def _read_back(bootstrap, topic, expected):
    got = consume_assigned(bootstrap, topic, [0], expected, timeout_s=60)
    return [(m.offset(), m.value()) for m in got]


def _cut(b, fs, dest):
    """SIGKILL the broker, then the power: unmount and keep only the durable state."""
    b.kill()
    return fs.power_cut(str(dest))


def _assert_clean_log(b):
    log = b.read_log()
    assert "Traceback" not in log, log[-6000:]
    assert " ERROR " not in log, log[-6000:]


def _batch_ends(data: bytes) -> list[tuple[int, int]]:
    """(end position, next offset) of each whole record batch in ``data`` (Kafka's v2 header)."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        if pos + 12 + length > len(data):
            break
        last_delta = struct.unpack_from(">i", data, pos + 23)[0]
        pos += 12 + length
        out.append((pos, base + last_delta + 1))
    return out


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(path, data, *, sync_dir):
    """Kafka's atomic checkpoint write: tmp, fsync, rename over (, fsync the dir)."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    if sync_dir:
        _fsync_dir(os.path.dirname(path))


def test_fs_layer_keeps_only_fsynced_state(tmp_path, plfs):
    """The layer itself: file bytes as of their last fsync (msync for a shared
    mapping), directory entries as of their directory's last fsync."""
    m = plfs.mountpoint
    os.mkdir(f"{m}/d")
    os.mkdir(f"{m}/c")
    _replace(f"{m}/c/ckpt", b"v1", sync_dir=True)
    _replace(f"{m}/c/ckpt", b"v2", sync_dir=False)    # the rename is not durable: v1
    fd = os.open(f"{m}/d/seg", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"synced", 0)
    os.fdatasync(fd)
    os.pwrite(fd, b"+cached", 6)                      # never synced
    with open(f"{m}/d/truncated", "wb") as f:
        f.write(b"0123456789")
        f.flush()
        os.fsync(f.fileno())
        f.truncate(3)                                 # not synced: the 10 bytes stay
    with open(f"{m}/d/unsynced", "wb") as f:
        f.write(b"x" * 100)                           # name durable, bytes not
    with open(f"{m}/d/gone", "wb") as f:
        f.write(b"gone")
        f.flush()
        os.fsync(f.fileno())
    idx = os.open(f"{m}/d/index", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(idx, 8192)
    mm = mmap.mmap(idx, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(idx)
    mm[0:4] = b"IDX1"
    mm.flush()                                        # msync
    mm[4:8] = b"IDX2"                                 # dirty page, never msynced
    _fsync_dir(f"{m}/d")
    _fsync_dir(m)
    mm.close()
    os.unlink(f"{m}/d/gone")                          # not durable: comes back
    os.rename(f"{m}/d/seg", f"{m}/d/seg2")            # not durable: old name stays
    with open(f"{m}/late", "wb") as f:                # bytes synced, name never
        f.write(b"late")
        f.flush()
        os.fsync(f.fileno())
    os.close(fd)

    durable = tmp_path / "durable"
    plfs.power_cut(str(durable))
    files = {str(p.relative_to(durable)): p.read_bytes() for p in durable.rglob("*") if p.is_file()}
    assert set(files) == {"c/ckpt", "d/seg", "d/truncated", "d/unsynced", "d/gone", "d/index"}
    assert files["c/ckpt"] == b"v1"
    assert files["d/seg"] == b"synced"
    assert files["d/truncated"] == b"0123456789"
    assert files["d/unsynced"] == b""
    assert files["d/gone"] == b"gone"
    assert files["d/index"] == b"IDX1" + bytes(8188)


@pytest.mark.parametrize("idempotence", [False, True])
def test_fsync_every_append_survives_power_loss(tmp_path, plfs, brokers, idempotence):
    """Every acknowledged record survives the power loss, with its offset.

    Topic ``a`` lives through a clean stop and restart on the same file system
    (checkpoints and the clean-shutdown marker written, the marker removed);
    topic ``b`` is created just before the cut, so nothing but its log fsyncs
    the log dir after its creation (without idempotence: an InitProducerId's
    block write would). Both roll several times (new segments, producer
    snapshots, rolled-segment flushes)."""
    conf = {"kbroker.log.fsync.every.append": "true", "log.segment.bytes": 32768}
    produce_conf = {"enable.idempotence": idempotence, "batch.num.messages": 50}
    a, t = "pa-" + uuid.uuid4().hex[:8], "pb-" + uuid.uuid4().hex[:8]
    b = _start(brokers, tmp_path / "run1", plfs.mountpoint, **conf)
    create_topic(b.bootstrap, a)
    acked = {a: _produce(b.bootstrap, a, 0, N // 2, **produce_conf)}
    assert b.terminate() == 0
    _assert_clean_log(b)
    b = _start(brokers, tmp_path / "run2", plfs.mountpoint, **conf)
    create_topic(b.bootstrap, t)
    acked[a] += _produce(b.bootstrap, a, N // 2, N - N // 2, **produce_conf)
    acked[t] = _produce(b.bootstrap, t, 0, N, **produce_conf)
    for topic in (a, t):
        assert [o for o, _ in acked[topic]] == list(range(N))

    durable = tmp_path / "durable"
    stats = _cut(b, plfs, durable)
    assert not (durable / ".kafka_cleanshutdown").exists(), "the removed marker came back"
    assert (durable / "recovery-point-offset-checkpoint").exists()
    for topic in (a, t):
        segments = sorted(p.name for p in (durable / f"{topic}-0").glob("*.log"))
        assert len(segments) >= 4, (topic, segments, stats)

    b2 = _start(brokers, tmp_path / "run3", str(durable), **conf)
    for topic in (a, t):
        assert _end_offset(b2.bootstrap, topic) == N
        assert _read_back(b2.bootstrap, topic, N) == acked[topic]
    more = _produce(b2.bootstrap, t, N, 10, **produce_conf)
    assert [o for o, _ in more] == list(range(N, N + 10))
    assert _read_back(b2.bootstrap, t, N + 10) == acked[t] + more
    assert b2.terminate() == 0
    _assert_clean_log(b2)


def test_page_cache_only_loses_acknowledged_records(tmp_path, plfs, brokers):
    """The control: without fsync on append (and no roll, no flush before the
    cut) acknowledged records are lost; part of them written back is a torn
    tail that recovery truncates at the last whole batch."""
    b = _start(brokers, tmp_path / "run1", plfs.mountpoint)
    topic = "pc-" + uuid.uuid4().hex[:8]
    create_topic(b.bootstrap, topic)
    acked = _produce(b.bootstrap, topic, 0, N, **{"batch.num.messages": 20})
    assert [o for o, _ in acked] == list(range(N))
    # The broker fsyncs a new partition's directory entries only at its first flush (as
    # Kafka); the file system's own periodic commit of them (ext4: every 5 s) is modelled
    # here, so the segment file exists after the cut with whatever of its bytes got back.
    for d in (plfs.mountpoint, os.path.join(plfs.mountpoint, f"{topic}-0")):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    b.kill()
    plfs.unmount()
    name = f"{topic}-0/00000000000000000000.log"
    with open(os.path.join(plfs.backing, name), "rb") as f:
        ends = _batch_ends(f.read())     # the page cache at the cut: every acknowledged batch
    assert ends[-1][1] == N
    # The write-back that reached the disk before the cut: 4 batches and half of the 5th.
    torn = ends[3][0] + (ends[4][0] - ends[3][0]) // 2
    survivors = ends[3][1]
    durable = tmp_path / "durable"
    stats = plfs.power_cut(str(durable), torn_glob="*.log", torn_bytes=torn)
    seg = durable / name
    assert seg.exists(), stats
    assert seg.stat().st_size == torn, "the segment had durable bytes: something fsynced it"

    b2 = _start(brokers, tmp_path / "run2", str(durable))
    assert _end_offset(b2.bootstrap, topic) == survivors
    assert _read_back(b2.bootstrap, topic, survivors) == acked[:survivors]
    log = b2.read_log()
    assert f"truncated {torn - ends[3][0]} bytes" in log and seg.name in log, log[-3000:]
    more = _produce(b2.bootstrap, topic, N, 10)
    assert [o for o, _ in more] == list(range(survivors, survivors + 10))
    assert b2.terminate() == 0
    _assert_clean_log(b2)


def test_flushed_records_of_a_new_partition_survive_power_loss(tmp_path, plfs, brokers):
    """``flush.messages=1``: each append is flushed (fsync, recovery point moved) before
    it is acknowledged. The partition is created and rolls several times after the
    broker's last log-dir write; every flush fsyncs the directory entries of the
    segments it covers and, the first time, the new directory's own entry (Kafka's
    LocalLog.flush), so every acknowledged record survives the power loss."""
    conf = {"log.flush.interval.messages": 1, "log.segment.bytes": 32768}
    topic = "pf-" + uuid.uuid4().hex[:8]
    b = _start(brokers, tmp_path / "run1", plfs.mountpoint, **conf)
    create_topic(b.bootstrap, topic)
    acked = _produce(b.bootstrap, topic, 0, N, **{"enable.idempotence": False, "batch.num.messages": 50})
    assert [o for o, _ in acked] == list(range(N))
    durable = tmp_path / "durable"
    stats = _cut(b, plfs, durable)
    segments = sorted(p.name for p in (durable / f"{topic}-0").glob("*.log"))
    assert len(segments) >= 4, (segments, stats)
    b2 = _start(brokers, tmp_path / "run2", str(durable), **conf)
    assert _end_offset(b2.bootstrap, topic) == N
    assert _read_back(b2.bootstrap, topic, N) == acked
    assert b2.terminate() == 0
    _assert_clean_log(b2)

"""ProducerIdManager (durable id blocks) and the InitProducerId decision."""
import json
import os
import threading

import pytest

import kbroker.server.producer_id_manager as pim
from kbroker.protocol.errors import ErrorCode
from kbroker.server.init_producer_id import (
    SHORT_MAX, InitProducerIdResult, handle_init_producer_id, prepare_increment_producer_epoch,
)
from kbroker.server.producer_id_manager import (
    PRODUCER_ID_BLOCK_FILE, ProducerIdFileError, ProducerIdManager, ProducerIdsBlock, ProducerIdsExhaustedError,
)


def _on_disk(tmp_path) -> dict:
    return json.loads((tmp_path / PRODUCER_ID_BLOCK_FILE).read_bytes())


def test_first_ids_and_file_format(tmp_path):
    m = ProducerIdManager(str(tmp_path), broker_id=3)
    assert not (tmp_path / PRODUCER_ID_BLOCK_FILE).exists()      # nothing reserved before the first id
    assert [m.generate_producer_id() for _ in range(5)] == [0, 1, 2, 3, 4]
    assert _on_disk(tmp_path) == {"version": 1, "broker": 3, "block_start": "0", "block_end": "999"}
    assert m.current_block == ProducerIdsBlock(3, 0, 1000)


def test_block_is_durable_before_any_of_its_ids_is_used(tmp_path):
    m = ProducerIdManager(str(tmp_path), block_size=7)
    for _ in range(40):
        pid = m.generate_producer_id()
        assert int(_on_disk(tmp_path)["block_start"]) <= pid <= int(_on_disk(tmp_path)["block_end"])
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_restarts_never_repeat_ids(tmp_path):
    seen = []
    for restart in range(5):
        m = ProducerIdManager(str(tmp_path), block_size=10)
        seen += [m.generate_producer_id() for _ in range(restart * 7 + 1)]   # 1, 8, 15, 22, 29 ids
    assert len(seen) == len(set(seen))
    assert seen == sorted(seen)
    # each restart starts a new block: the rest of the previous one is skipped
    assert seen[0] == 0 and seen[1:9] == list(range(10, 18)) and seen[9:24] == list(range(20, 35))
    assert seen[24] == 40                              # 35..39 skipped by the restart


def test_crash_between_reserve_and_use(tmp_path):
    a = ProducerIdManager(str(tmp_path), block_size=100)
    first = a.generate_producer_id()           # block [0, 99] reserved, id 0 used
    del a                                       # "crash": 1..99 never handed out
    b = ProducerIdManager(str(tmp_path), block_size=100)
    assert b.generate_producer_id() == 100 > first


def test_crash_during_reservation_hands_out_nothing(tmp_path, monkeypatch):
    m = ProducerIdManager(str(tmp_path), block_size=5)
    ids = [m.generate_producer_id() for _ in range(5)]   # block [0, 4] used up

    real_replace = os.replace

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        m.generate_producer_id()                        # block [5, 9] not durable -> no id
    assert _on_disk(tmp_path)["block_end"] == "4"
    monkeypatch.setattr(os, "replace", real_replace)
    ids.append(m.generate_producer_id())               # retried in the same process
    restarted = ProducerIdManager(str(tmp_path), block_size=5)   # stale .tmp is harmless
    ids.append(restarted.generate_producer_id())
    assert ids == [0, 1, 2, 3, 4, 5, 10]


def test_threads_get_unique_ids(tmp_path):
    m = ProducerIdManager(str(tmp_path), block_size=50, sync=False)
    out = [[] for _ in range(8)]

    def work(slot):
        for _ in range(400):
            slot.append(m.generate_producer_id())

    threads = [threading.Thread(target=work, args=(o,)) for o in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    ids = [i for o in out for i in o]
    assert len(ids) == 3200 and len(set(ids)) == 3200
    assert set(ids) == set(range(3200))                # no gaps without restarts
    assert int(_on_disk(tmp_path)["block_end"]) == 3199
    for o in out:
        assert o == sorted(o)


@pytest.mark.parametrize("content", [b"", b"{", b'{"version":2,"broker":0,"block_start":"0","block_end":"9"}',
                                     b'{"version":1,"broker":0,"block_start":"x","block_end":"9"}',
                                     b'{"version":1,"broker":0,"block_start":"9","block_end":"3"}',
                                     b'{"version":1,"block_start":"0","block_end":"9"}', b"\xff\xfe"])
def test_unreadable_file_refuses_to_start(tmp_path, content):
    (tmp_path / PRODUCER_ID_BLOCK_FILE).write_bytes(content)
    with pytest.raises(ProducerIdFileError):
        ProducerIdManager(str(tmp_path))


def test_exhausted(tmp_path):
    end = pim.LONG_MAX - 1000                         # next block would start at MAX - 999
    (tmp_path / PRODUCER_ID_BLOCK_FILE).write_bytes(ProducerIdsBlock(0, end - 999, 1000).encode())
    m = ProducerIdManager(str(tmp_path))
    with pytest.raises(ProducerIdsExhaustedError):       # Kafka: first > Long.MAX - block size
        m.generate_producer_id()
    assert _on_disk(tmp_path)["block_end"] == str(end)
    small = ProducerIdManager(str(tmp_path), block_size=999)
    assert small.generate_producer_id() == end + 1     # a block that still fits


def test_block_size_validated(tmp_path):
    with pytest.raises(ValueError):
        ProducerIdManager(str(tmp_path), block_size=0)


# -- InitProducerId --------------------------------------------------------------------------
@pytest.fixture
def gen(tmp_path):
    return ProducerIdManager(str(tmp_path)).generate_producer_id


def test_idempotent_producer_gets_new_id_epoch_0(gen):
    assert handle_init_producer_id(gen, None, 60000) == InitProducerIdResult(0, 0, 0)
    assert handle_init_producer_id(gen, None, -1) == InitProducerIdResult(0, 1, 0)   # timeout ignored


def test_idempotent_producer_with_known_id_and_epoch_gets_fresh_id(gen):
    """Kafka: a null transactional id is always answered with a new producer id, epoch 0,
    also for a v3+ request carrying (producer_id, producer_epoch) — no server-side bump."""
    first = handle_init_producer_id(gen, None, 60000)
    again = handle_init_producer_id(gen, None, 60000, first.producer_id, 5)
    assert again.error_code == 0 and again.producer_id != first.producer_id and again.producer_epoch == 0


@pytest.mark.parametrize("pid,epoch", [(-1, 0), (12, -1)])
def test_half_given_producer_id_and_epoch_is_invalid_request(gen, pid, epoch):
    assert handle_init_producer_id(gen, None, 60000, pid, epoch) == InitProducerIdResult(
        ErrorCode.INVALID_REQUEST, -1, -1)


def test_transactional_checks_and_seam(gen):
    assert handle_init_producer_id(gen, "", 60000).error_code == ErrorCode.INVALID_REQUEST
    for bad in (0, -5, 900_001):
        assert handle_init_producer_id(gen, "tx", bad).error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert handle_init_producer_id(gen, "tx", 900_000).error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert handle_init_producer_id(gen, "tx", 1000, transaction_max_timeout_ms=500).error_code == \
        ErrorCode.INVALID_TRANSACTION_TIMEOUT

    calls = []

    class Coordinator:
        def handle_init_producer_id(self, transactional_id, timeout_ms, expected, callback):
            calls.append((transactional_id, timeout_ms, expected))
            callback(InitProducerIdResult(0, 77, 3))

    c = Coordinator()
    answers = []
    assert handle_init_producer_id(gen, "tx", 1000, transaction_coordinator=c, respond=answers.append) is None
    assert handle_init_producer_id(gen, "tx", 1000, 77, 2, transaction_coordinator=c,
                                   respond=answers.append) is None
    assert answers == [(0, 77, 3), (0, 77, 3)]
    assert calls == [("tx", 1000, None), ("tx", 1000, (77, 2))]


def test_allocator_failure_is_unknown_server_error():
    def broken():
        raise OSError(5, "I/O error")

    assert handle_init_producer_id(broken, None, 1000) == InitProducerIdResult(ErrorCode.UNKNOWN_SERVER_ERROR, -1, -1)


def test_prepare_increment_producer_epoch():
    assert prepare_increment_producer_epoch(-1, -1, None) == (0, -1)        # new transactional id
    assert prepare_increment_producer_epoch(4, 3, None) == (5, -1)          # v0-v2 re-init
    assert prepare_increment_producer_epoch(4, 3, 4) == (5, 4)              # KIP-360: expected matches
    assert prepare_increment_producer_epoch(5, 4, 4) == (5, 4)              # retry of that bump
    assert prepare_increment_producer_epoch(5, 4, 2) == ErrorCode.PRODUCER_FENCED
    assert prepare_increment_producer_epoch(SHORT_MAX - 2, 0, None) == (SHORT_MAX - 1, -1)
    with pytest.raises(ValueError):
        prepare_increment_producer_epoch(SHORT_MAX - 1, 0, SHORT_MAX - 1)   # rotate the id instead

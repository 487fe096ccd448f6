"""ListOffsets never reveals offsets a consumer cannot fetch (Kafka's
ReplicaManager.fetchOffset with lastFetchableOffset). A single-node broker moves the
high watermark with every append, so the lagging-high-watermark state (a leader whose
followers have not caught up) is set up here on a real Log and Partition, driven
through the real ListOffsets handler."""
from __future__ import annotations

import types

import pytest

from kbroker.kernels import records
from kbroker.log import Log, LogConfig
from kbroker.protocol import ErrorCode as E
from kbroker.protocol.messages import list_offsets as lo
from kbroker.server.apis.list_offsets import handle_list_offsets
from kbroker.server.replica_manager import Partition

TOPIC = "lo-hw"


class _Ctx:
    def __init__(self, version: int):
        self.api_version = version
        self.responses = []

    def respond(self, resp, **kw):
        self.responses.append(resp)


@pytest.fixture
def part(tmp_path):
    lg = Log.open(str(tmp_path / f"{TOPIC}-0"), LogConfig({}))
    p = Partition(TOPIC, 0, None, lg, node_id=1)
    yield p
    lg.close()


def _append(part, ts: int) -> int:
    return part.log.append(bytearray(records.encode_batch([(ts, None, b"v%d" % ts, [])])),
                           leader_epoch=part.leader_epoch).first_offset


def _list(part, timestamp: int, version: int = 9, replica_id: int = -1, isolation_level: int = 0):
    broker = types.SimpleNamespace(replica_manager=types.SimpleNamespace(
        get_partition=lambda tp: part if tp == (TOPIC, 0) else None))
    ctx = _Ctx(version)
    handle_list_offsets(broker, ctx, lo.ListOffsetsRequest(
        replica_id=replica_id, isolation_level=isolation_level, topics=[lo.ListOffsetsTopic(
            name=TOPIC, partitions=[lo.ListOffsetsPartition(partition_index=0, timestamp=timestamp)])]))
    (resp,) = ctx.responses
    (p,) = resp.topics[0].partitions
    assert p.error_code == E.NONE, p
    return p.offset, p.timestamp


@pytest.mark.parametrize("isolation_level", [0, 1])
def test_max_timestamp_only_below_the_high_watermark(part, isolation_level):
    for ts in (1000, 5000, 3000):                      # offsets 0, 1, 2
        _append(part, ts)
    part.log.update_high_watermark(3)
    assert _list(part, -3, isolation_level=isolation_level) == (1, 5000)
    assert _append(part, 9000) == 3                    # beyond the high watermark
    assert part.log.high_watermark == 3
    # Kafka: the max-timestamp record is not fetchable yet -> nothing found (-1, -1)
    assert _list(part, -3, isolation_level=isolation_level) == (-1, -1)
    assert _list(part, -1, isolation_level=isolation_level) == (3, -1)   # latest = high watermark
    assert _list(part, 6000, isolation_level=isolation_level) == (-1, -1)  # by timestamp: same rule
    assert _list(part, 4000, isolation_level=isolation_level) == (1, 5000)
    assert _list(part, -2, isolation_level=isolation_level) == (0, -1)   # earliest: not limited
    # a replica sees up to the log end offset
    assert _list(part, -3, replica_id=1) == (3, 9000)
    part.log.update_high_watermark(4)
    assert _list(part, -3, isolation_level=isolation_level) == (3, 9000)


def test_max_timestamp_below_the_high_watermark_is_kept(part):
    """A record beyond the high watermark with a lower timestamp changes nothing."""
    for ts in (1000, 5000):
        _append(part, ts)
    part.log.update_high_watermark(2)
    _append(part, 2000)
    assert _list(part, -3) == (1, 5000)

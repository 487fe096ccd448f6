"""ProducerIdControlManager: blocks of producer ids, unique cluster-wide.

Kafka: ``controller/ProducerIdControlManager``. Replicated state: the first id of the
next block. AllocateProducerIds hands the requesting broker (whose epoch must match
its registration, else STALE_BROKER_EPOCH) the block [next, next + block size) and
writes a ProducerIdsRecord moving ``next`` past it, so no two blocks ever overlap.
"""
from __future__ import annotations

from kbroker.controller.result import ApiError, ControllerResult
from kbroker.metadata import records as R
from kbroker.protocol.errors import ErrorCode as E

INT64_MAX = 2**63 - 1


class ProducerIdControlManager:
    def __init__(self, config, cluster):
        self.config = config
        self.cluster = cluster
        self.next_producer_id = 0

    def replay(self, r, offset: int) -> None:
        if r.next_producer_id < self.next_producer_id:
            raise ValueError("producer id block goes back: %d < %d" % (r.next_producer_id, self.next_producer_id))
        self.next_producer_id = r.next_producer_id

    def allocate_producer_ids(self, req) -> ControllerResult:
        from kbroker.protocol.messages.allocate_producer_ids import AllocateProducerIdsResponse as Resp
        try:
            self.cluster.check_broker_epoch(req.broker_id, req.broker_epoch)
        except ApiError as e:
            return ControllerResult([], Resp(error_code=e.code))
        size = self.config.producer_id_block_size
        start = self.next_producer_id
        if start > INT64_MAX - size:
            return ControllerResult([], Resp(error_code=E.UNKNOWN_SERVER_ERROR))
        result = ControllerResult()
        result.add(R.ProducerIdsRecord(broker_id=req.broker_id, broker_epoch=req.broker_epoch,
                                       next_producer_id=start + size), 0)
        result.response = Resp(error_code=0, producer_id_start=start, producer_id_len=size)
        return result

"""ControllerResult, ApiError and ControllerConfig: shared by every controller manager."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from kbroker.metadata.serde import ApiMessageAndVersion
from kbroker.protocol.errors import ErrorCode


class ApiError(Exception):
    """A request failed with Kafka error ``code`` (message: Kafka's text where known)."""

    def __init__(self, code: int, message: Optional[str] = None):
        super().__init__(message or ErrorCode(code).name)
        self.code = int(code)
        self.message = message


@dataclass
class ControllerResult:
    """Records to append to the metadata log and the response to send once they are
    committed. ``atomic``: all records must land in one batch (Kafka's atomicOf)."""
    records: list = field(default_factory=list)      # list[ApiMessageAndVersion]
    response: Any = None
    atomic: bool = False
    #: the offsets the records were written at (set by QuorumController; -1: none)
    first_offset: int = -1
    last_offset: int = -1

    def add(self, message, version: int = 0) -> None:
        self.records.append(ApiMessageAndVersion(message, version))


def _accept(resource_type: int, resource_name: str, configs: dict) -> None:
    """The default config validator: accepts everything."""


@dataclass
class ControllerConfig:
    """Settings the controller reads (Kafka's names in comments)."""
    cluster_id: str = ""
    node_id: int = 3000
    session_timeout_ms: int = 9000            # broker.session.timeout.ms
    default_num_partitions: int = 1           # num.partitions
    default_replication_factor: int = 1       # default.replication.factor
    producer_id_block_size: int = 1000        # ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
    max_records_per_user_op: int = 10000      # QuorumController.MAX_RECORDS_PER_USER_OP
    #: validator(resource_type, resource_name, resulting configs) raises ApiError(INVALID_CONFIG)
    config_validator: Callable[[int, str, dict], None] = _accept
    #: unclean.leader.election.enable when neither the topic nor the cluster-wide dynamic
    #: broker config sets it (the node's static config)
    unclean_leader_election_enable: bool = False
    #: {feature: (min, max)} this controller supports (UpdateFeatures checks new levels
    #: against it; a node passes kbroker.server.features.SUPPORTED)
    supported_features: dict = field(default_factory=lambda: {"metadata.version": (1, 21)})

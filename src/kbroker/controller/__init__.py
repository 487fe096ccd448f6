"""The KRaft controller's state machine, pure: no threads, sockets, clocks or raft.

Kafka: ``metadata/src/main/java/org/apache/kafka/controller/``. Each manager keeps
the part of the cluster state it owns, changes it only in ``replay(record, offset)``
and answers requests with a :class:`ControllerResult` (records to append + the
response). :class:`QuorumController` routes requests to the managers; see its
docstring for how the raft client drives it.
"""
from kbroker.controller.result import ApiError, ControllerConfig, ControllerResult  # noqa: F401
from kbroker.controller.quorum_controller import QuorumController  # noqa: F401

"""The group coordinator: consumer groups and committed offsets in ``__consumer_offsets``.

- ``coordinator``: :class:`GroupCoordinator` (the classic protocol's state machine,
  offsets, loading, retention), :class:`GroupConfig`.
- ``classic_group``: :class:`ClassicGroup` / :class:`ClassicMember` (state, members).
- ``delayed``: the join / sync / heartbeat delayed operations (purgatory).
- ``offsets``: :class:`OffsetAndMetadata` and a group's committed-offset store.
- ``storage``: the ``__consumer_offsets`` record codecs and the :class:`OffsetsLog`
  seam to the broker (:class:`InMemoryOffsetsLog`, :class:`LogOffsetsLog`): the
  runtime's (:mod:`kbroker.coordinator.runtime`) under the names used here.

The wire handlers are in ``kbroker.server.apis.group``.
"""
from kbroker.coordinator.group.coordinator import GroupConfig, GroupCoordinator  # noqa: F401
from kbroker.coordinator.group.offsets import OffsetAndMetadata  # noqa: F401
from kbroker.coordinator.group.storage import (  # noqa: F401
    OFFSETS_TOPIC, InMemoryOffsetsLog, LogOffsetsLog, OffsetsLog, partition_for,
)

__all__ = ["GroupConfig", "GroupCoordinator", "OffsetAndMetadata", "OFFSETS_TOPIC", "InMemoryOffsetsLog",
           "LogOffsetsLog", "OffsetsLog", "partition_for"]

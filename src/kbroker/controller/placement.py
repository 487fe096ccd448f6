"""StripedReplicaPlacer: where the replicas of new partitions go.

Kafka: ``metadata/placement/StripedReplicaPlacer``. Brokers are grouped by rack; each
partition takes its leader (first replica) from the next rack in turn that has an
unfenced broker, then one replica from each following rack in turn (unfenced brokers
first, fenced only when a rack has no unfenced one left this round). Within a rack the
brokers are taken in a rotating order, and after every broker has led once the racks
and brokers are reshuffled (seeded ``random.Random``, so a simulation is reproducible).
Properties: no two replicas of a partition on one broker; replicas spread over as many
racks as possible; leaders spread evenly over unfenced brokers.

Errors (ApiError INVALID_REPLICATION_FACTOR, Kafka's messages): replication factor not
positive, more than the usable brokers, or every usable broker fenced.
"""
from __future__ import annotations

import random as _random
from dataclasses import dataclass
from typing import Optional

from kbroker.controller.result import ApiError
from kbroker.protocol.errors import ErrorCode


@dataclass(frozen=True)
class UsableBroker:
    id: int
    rack: Optional[str]
    fenced: bool


class _Brokers:
    """One rack's brokers of one kind (fenced or unfenced), handed out in rotation."""

    def __init__(self):
        self.ids: list = []
        self.index = 0
        self.offset = 0
        self.epoch = 0

    def init(self, rnd):
        if self.ids:
            self.ids.sort()
            self.offset = rnd.randrange(len(self.ids))

    def next(self, epoch: int) -> int:
        if not self.ids:
            return -1
        if self.epoch != epoch:
            self.epoch = epoch
            self.index = 0
            self.offset = (self.offset + 1) % len(self.ids)
        if self.index >= len(self.ids):
            return -1
        b = self.ids[(self.index + self.offset) % len(self.ids)]
        self.index += 1
        return b


class _Rack:
    def __init__(self):
        self.unfenced = _Brokers()
        self.fenced = _Brokers()

    def next(self, epoch: int) -> int:
        b = self.unfenced.next(epoch)
        return b if b >= 0 else self.fenced.next(epoch)


def _invalid_rf(msg: str) -> ApiError:
    return ApiError(ErrorCode.INVALID_REPLICATION_FACTOR, msg)


def check_replication_factor(rf: int, total: int, unfenced: int) -> None:
    if rf <= 0:
        raise _invalid_rf("Invalid replication factor %d: the replication factor must be positive." % rf)
    if unfenced == 0:
        raise _invalid_rf("All brokers are currently fenced.")
    if rf > total:
        raise _invalid_rf("The target replication factor of %d cannot be reached because only %d "
                          "broker(s) are registered." % (rf, total))


class _RackList:
    def __init__(self, rnd, brokers):
        self.rnd = rnd
        self.racks: dict = {}
        self.names: list = []
        self.total = self.unfenced = 0
        for b in brokers:
            rack = self.racks.get(b.rack)
            if rack is None:
                rack = self.racks[b.rack] = _Rack()
                self.names.append(b.rack)
            (rack.fenced if b.fenced else rack.unfenced).ids.append(b.id)
            self.total += 1
            self.unfenced += not b.fenced
        for name in sorted(self.racks, key=lambda n: (n is not None, n or "")):
            self.racks[name].unfenced.init(rnd)
            self.racks[name].fenced.init(rnd)
        self.names.sort(key=lambda n: (n is not None, n or ""))
        self.epoch = 0
        self.offset = rnd.randrange(len(self.names)) if self.names else 0

    def _shuffle(self):
        self.rnd.shuffle(self.names)
        for name in sorted(self.racks, key=lambda n: (n is not None, n or "")):
            self.rnd.shuffle(self.racks[name].unfenced.ids)
            self.rnd.shuffle(self.racks[name].fenced.ids)

    def place(self, rf: int) -> list:
        if self.epoch == self.unfenced and self.unfenced > 1:
            self._shuffle()
            self.epoch = 0
        if self.offset == len(self.names):
            self.offset = 0
        out = []
        first = self.offset
        while True:     # the leader: an unfenced broker from the next rack that has one
            b = self.racks[self.names[first]].unfenced.next(self.epoch)
            if b >= 0:
                out.append(b)
                break
            first = (first + 1) % len(self.names)
        idx = self.offset
        for _ in range(1, rf):
            b = -1
            while b < 0:
                if idx == first:
                    first = -1      # the leader's rack already gave one this round
                else:
                    b = self.racks[self.names[idx]].next(self.epoch)
                idx = (idx + 1) % len(self.names)
            out.append(b)
        self.epoch += 1
        self.offset += 1
        return out


class StripedReplicaPlacer:
    def __init__(self, rnd: Optional[_random.Random] = None):
        self.random = rnd if rnd is not None else _random.Random()

    def place(self, num_partitions: int, rf: int, brokers) -> list:
        """Replica lists (leader first) for ``num_partitions`` new partitions over
        ``brokers`` (UsableBroker: registered and not in controlled shutdown)."""
        rl = _RackList(self.random, sorted(brokers, key=lambda b: b.id))
        check_replication_factor(rf, rl.total, rl.unfenced)
        return [rl.place(rf) for _ in range(num_partitions)]

"""Partition assignors run by the group leader (Kafka's RangeAssignor, RoundRobinAssignor).

Input: ``members`` {member_id: [subscribed topics]} and ``partitions`` {topic: count}.
Output: {member_id: {topic: [partitions]}}. Members are ordered by member_id, as the
Java assignors do (without static-membership group.instance.id ordering).
"""
from __future__ import annotations


def range_assign(members: dict[str, list[str]], partitions: dict[str, int]) -> dict:
    """Per topic: consumers sorted; each gets n // m partitions, the first n % m one more."""
    out = {m: {} for m in members}
    topics = sorted({t for ts in members.values() for t in ts})
    for t in topics:
        n = partitions.get(t)
        if not n:
            continue
        subs = sorted(m for m, ts in members.items() if t in ts)
        per, extra = divmod(n, len(subs))
        start = 0
        for i, m in enumerate(subs):
            k = per + (1 if i < extra else 0)
            if k:
                out[m][t] = list(range(start, start + k))
            start += k
    return out


def roundrobin_assign(members: dict[str, list[str]], partitions: dict[str, int]) -> dict:
    """All partitions sorted by (topic, partition) dealt round-robin over the sorted
    members, skipping members not subscribed to the partition's topic."""
    out = {m: {} for m in members}
    ms = sorted(members)
    if not ms:
        return out
    i = 0
    for t in sorted({t for ts in members.values() for t in ts}):
        for p in range(partitions.get(t) or 0):
            for _ in range(len(ms)):
                m = ms[i % len(ms)]
                i += 1
                if t in members[m]:
                    out[m].setdefault(t, []).append(p)
                    break
    return out


ASSIGNORS = {"range": range_assign, "roundrobin": roundrobin_assign}

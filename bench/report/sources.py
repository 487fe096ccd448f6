"""Facts about the published Apache Kafka results in bench/data (from
bench/data/SOURCES.md), keyed by the result directory name.

OMB result JSONs do not say what hardware they ran on, and the Confluent 2020
files omit the workload shape too, so both come from this table. Anything the
JSON itself states (messageSize, topics, partitions, producerRate) wins over
``workload`` here.
"""
from __future__ import annotations

import re
from typing import Any

UNKNOWN_HARDWARE = "unknown (source not in bench/report/sources.py)"

OMB_SOURCES: dict[str, dict[str, Any]] = {
    "confluent-2020-kafka-2.6": {
        "label": "Confluent 2020 (OMB)",
        "kafka_version": "2.6.0 (Java 11)",
        "hardware": "3 brokers AWS i3en.2xlarge (8 vCPU, 64 GiB, 2 x 2.5 TB NVMe); "
                    "4 OMB clients c5n.2xlarge",
        "durability": "RF 3, min.insync.replicas 2, acks=all",
        "workload": {"topics": 1, "partitions": 100, "message_size": 1024,
                     "producers": 4, "consumers": 4},
    },
    "omb-pr407-t3large-kafka-3.2.1": {
        "label": "OMB PR #407 (t3.large)",
        "kafka_version": "3.2.1",
        "hardware": "3 brokers AWS t3.large (2 vCPU burstable, 8 GiB); 4 clients t3.large",
        "durability": "RF 3, acks=all",
        "workload": {"topics": 1, "partitions": 1, "message_size": 1024,
                     "producer_rate": 50000, "producers": 1, "consumers": 1},
    },
    "vanlightly-omb-copy-2024": {
        "label": "Vanlightly OMB copy 2024",
        "kafka_version": "not stated",
        "hardware": "Kubernetes; broker hardware not documented",
        "durability": "RF 1, acks=1, linger 1 ms",
        "workload": {"topics": 10, "partitions": 10, "message_size": 1024,
                     "producer_rate": 2000},
    },
}

_RATE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([KkMm]?)-rate")


def source_of(rel_path: str) -> str:
    """Source key = first path component of the file under the OMB root."""
    return rel_path.replace("\\", "/").split("/", 1)[0] if "/" in rel_path else ""


def source_facts(rel_path: str) -> dict[str, Any]:
    key = source_of(rel_path)
    facts = OMB_SOURCES.get(key)
    if facts is None:
        return {"label": key or "unknown", "kafka_version": "unknown",
                "hardware": UNKNOWN_HARDWARE, "durability": "unknown", "workload": {}}
    return facts


def rate_from_workload_name(name: str | None) -> float | None:
    """``"100-partitions-200K-rate-4-producer"`` -> 200000.0 (OMB naming)."""
    m = _RATE_RE.search(name or "")
    if not m:
        return None
    mult = {"": 1, "k": 1e3, "m": 1e6}[m.group(2).lower()]
    return float(m.group(1)) * mult

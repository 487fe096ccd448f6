"""The Jepsen-style queue workload against one kbroker node, with unchanged clients: three
idempotent acks=all producers while the nemesis SIGKILLs and restarts the broker and
pauses it (SIGSTOP/SIGCONT), then through a proxy that cuts the broker off. Every
acknowledged record must be read back at its acknowledged offset, none twice, each
producer's records in order. (With replication, issue 16, the same workload runs against
a 3-broker RF 3 cluster.)"""
from __future__ import annotations

from kbroker.chaos.checker import check
from kbroker.chaos.nemesis import Nemesis
from kbroker.chaos.proxy import FaultProxy
from kbroker.chaos.workload import run_queue_workload
from kbroker.testing import KBrokerProcess
from tests.broker.kafka_helpers import create_topic


def test_kill_and_pause_lose_nothing_acknowledged(tmp_path):
    b = KBrokerProcess(data_dir=str(tmp_path), overrides={"num.partitions": 4}).start()
    try:
        create_topic(b.bootstrap, "queue", partitions=4)
        nem = Nemesis({"broker": b}, seed=3, faults=("kill", "pause"), gap_s=(1.0, 2.0), fault_s=(0.5, 1.5),
                      max_faults=4)
        sends, reads, log = run_queue_workload(b.bootstrap, "queue", 4, producers=3, records_per_producer=600,
                                               duration_s=8.0, seed=3, nemesis=nem)
        v = check(sends, reads)
        assert v.ok, f"{v.summary()}; faults: {log}"
        assert any(f == "kill" for _, f, _ in log) or any(f == "pause" for _, f, _ in log)
        assert v.acknowledged >= 0.9 * 1800, v.summary()
    finally:
        b.cleanup()


def test_a_partitioned_broker_behind_a_proxy_loses_nothing_acknowledged(tmp_path):
    proxy = FaultProxy().start()
    b = KBrokerProcess(data_dir=str(tmp_path),
                       overrides={"num.partitions": 2, "advertised.listeners": f"PLAINTEXT://{proxy.bootstrap}"})
    proxy.upstream_port = b.port
    b.start()
    try:
        create_topic(proxy.bootstrap, "queue", partitions=2)
        nem = Nemesis({}, proxies={"broker": proxy}, seed=5, faults=("partition",), gap_s=(1.0, 1.5),
                      fault_s=(1.0, 2.0), max_faults=3)
        sends, reads, log = run_queue_workload(proxy.bootstrap, "queue", 2, producers=2, records_per_producer=500,
                                               duration_s=6.0, seed=5, nemesis=nem)
        v = check(sends, reads)
        assert v.ok, f"{v.summary()}; faults: {log}"
        assert sum(1 for _, f, _ in log if f == "partition") >= 1
    finally:
        proxy.stop()
        b.cleanup()

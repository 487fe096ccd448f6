"""Prometheus ``/metrics`` for a mirror process, in the broker endpoint's style
(kbroker/server/metrics.py): names are the JMX exporter's rendering of MM2's MBeans,
``kafka.connect.mirror:type=MirrorSourceConnector,target=B,topic=A.orders,partition=0`` →
``kafka_connect_mirror_MirrorSourceConnector_<attribute>{source,target,topic,partition}``.
Counts are counters (``_total``; use ``rate()``), replication latency (source record
timestamp → acknowledged on the target) a summary in ms plus its max, lag (source high
watermark − next offset to commit) a gauge; ``record_rate`` is records/s over ~10 s.

Values are read at scrape time on the HTTP thread from counters that have one writer each.
"""
from __future__ import annotations


from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from kbroker.prometheus import MetricsServer, serve

_SRC = "kafka_connect_mirror_MirrorSourceConnector_"
_CP = "kafka_connect_mirror_MirrorCheckpointConnector_"
_HB = "kafka_connect_mirror_MirrorHeartbeatConnector_"


class MirrorCollector(Collector):
    def __init__(self, maker):
        self.maker = maker

    def collect(self):
        labels = ["source", "target", "topic", "partition"]
        records = CounterMetricFamily(_SRC + "record_count", "Records replicated", labels=labels)
        nbytes = CounterMetricFamily(_SRC + "byte_count", "Key and value bytes replicated", labels=labels)
        latency = SummaryMetricFamily(_SRC + "replication_latency_ms",
                                      "Source record timestamp to acknowledged on the target", labels=labels)
        latency_max = GaugeMetricFamily(_SRC + "replication_latency_ms_max", "Max replication latency",
                                        labels=labels)
        lag = GaugeMetricFamily(_SRC + "lag", "Source high watermark minus the next offset to commit",
                                labels=labels)
        rate = GaugeMetricFamily(_SRC + "record_rate", "Records/s replicated over the last ~10 s",
                                 labels=["source", "target"])
        failures = CounterMetricFamily(_SRC + "send_failures", "Sends retried from the last acknowledged record",
                                       labels=["source", "target"])
        checkpoints = CounterMetricFamily(_CP + "checkpoint_count", "Checkpoints written",
                                          labels=["source", "target"])
        synced = CounterMetricFamily(_CP + "group_offset_syncs", "Group offset commits on the target",
                                     labels=["source", "target"])
        heartbeats = CounterMetricFamily(_HB + "heartbeat_count", "Heartbeats written", labels=["source", "target"])
        for run in list(self.maker.runners):
            fl = [run.fc.source, run.fc.target]
            task = run.source_task
            if task is not None:
                lags = task.lag()
                for tp, st in list(task.stats.items()):
                    lv = fl + [run.fc.remote_topic(tp.topic), str(tp.partition)]
                    records.add_metric(lv, st.records)
                    nbytes.add_metric(lv, st.bytes)
                    latency.add_metric(lv, st.records, st.latency_sum_ms)
                    latency_max.add_metric(lv, st.latency_max_ms)
                for tp, v in lags.items():
                    lag.add_metric(fl + [run.fc.remote_topic(tp.topic), str(tp.partition)], v)
                rate.add_metric(fl, run.record_rate)
                failures.add_metric(fl, task.failures)
            if run.checkpoint_task is not None:
                checkpoints.add_metric(fl, run.checkpoint_task.emitted)
                synced.add_metric(fl, run.checkpoint_task.synced_groups)
            if run.heartbeat_task is not None:
                heartbeats.add_metric(fl, run.heartbeat_task.emitted)
        yield from (records, nbytes, latency, latency_max, lag, rate, failures, checkpoints, synced, heartbeats)


def start_metrics_server(maker, host: str, port: int) -> MetricsServer:
    return serve(MirrorCollector(maker), host, port, "kbroker-mirror-metrics")

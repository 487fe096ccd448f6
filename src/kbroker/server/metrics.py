"""Prometheus ``/metrics`` endpoint with the metrics Kafka operators know.

Names follow the JMX exporter's rendering of Kafka's MBeans,
``kafka_<domain>_<type>_<name>`` with MBean keys as labels, so existing
dashboards and alerts carry over, e.g.
``kafka.network:type=RequestChannel,name=RequestQueueSize`` →
``kafka_network_RequestChannel_RequestQueueSize``,
``kafka.server:type=DelayedOperationPurgatory,name=PurgatorySize,delayedOperation=Produce`` →
``kafka_server_DelayedOperationPurgatory_PurgatorySize{delayedOperation="Produce"}``.

Kafka's meters (``BytesInPerSec``, ``RequestsPerSec``) are exported as counters
(``..._total``): Prometheus computes rates itself with ``rate()``. Request times
(``TotalTimeMs`` and its parts) are summaries (``_count``/``_sum`` in ms).

Nothing is sampled in the background: :class:`BrokerCollector` reads the live
values (NetworkMetrics, purgatories, logs) at scrape time, on the HTTP
server's thread. The reads take no lock on the hot path (NetworkMetrics
counters have one writer each; Log properties are single-attribute reads).
"""
from __future__ import annotations


from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from kbroker.prometheus import MetricsServer, serve

from kbroker.protocol import API_INFO
from kbroker.server.purgatory import DelayedOperationPurgatory


#: NetworkMetrics per-api fields exported as RequestMetrics summaries (Kafka's names)
_REQUEST_TIMES = (
    ("TotalTimeMs", "total_ns", "Time from receiving a request to sending its response"),
    ("RequestQueueTimeMs", "request_queue_ns", "Time a request waited in the request queue"),
    ("LocalTimeMs", "handle_ns", "Time a request handler spent on the request (incl. purgatory wait)"),
    ("ResponseQueueTimeMs", "response_queue_ns", "Time a response waited in the response queue"),
    ("ResponseSendTimeMs", "response_send_ns", "Time to send a response"),
)


def _api_name(api_key: int) -> str:
    info = API_INFO.get(api_key)
    return info.name if info is not None else str(api_key)


class BrokerCollector(Collector):
    """Reads a running KafkaBroker's live values on every scrape."""

    def __init__(self, broker):
        self.broker = broker

    def _purgatories(self) -> list[DelayedOperationPurgatory]:
        """Every purgatory the broker (or its group coordinator) holds, in a stable order."""
        found: dict[int, DelayedOperationPurgatory] = {}
        owners = [self.broker, getattr(self.broker, "group_coordinator", None)]
        for owner in owners:
            if owner is None:
                continue
            try:
                values = list(vars(owner).values())
            except TypeError:  # an owner with __slots__ and no __dict__
                continue
            for value in values:
                if isinstance(value, DelayedOperationPurgatory):
                    found[id(value)] = value
        return sorted(found.values(), key=lambda p: p.name)

    def collect(self):
        b = self.broker
        yield from self._network(b)
        yield from self._purgatory_metrics()
        yield from self._partitions(b)
        yield from self._fetch_sessions(b)

    def _fetch_sessions(self, b):
        """Kafka's FetchSessionCache gauges: consumers' and followers' sessions alike."""
        cache = getattr(b, "fetch_sessions", None)
        if cache is None:
            return
        sessions, partitions = cache.stats()
        yield GaugeMetricFamily("kafka_server_FetchSessionCache_NumIncrementalFetchSessions",
                                "Incremental fetch sessions cached (followers' and consumers')", value=sessions)
        yield GaugeMetricFamily("kafka_server_FetchSessionCache_NumIncrementalFetchPartitionsCached",
                                "Partitions in the cached incremental fetch sessions", value=partitions)

    def _network(self, b):
        ss = getattr(b, "socket_server", None)
        if ss is None:
            return
        m = ss.metrics
        totals = m.totals()
        yield GaugeMetricFamily("kafka_network_RequestChannel_RequestQueueSize",
                                "Requests waiting for a request handler", value=m.request_queue_size())
        yield GaugeMetricFamily("kafka_network_RequestChannel_ResponseQueueSize",
                                "Responses waiting for their network processor", value=m.response_queue_size())
        yield GaugeMetricFamily("kafka_network_SocketServer_NetworkProcessorAvgIdlePercent",
                                "Fraction of time network processors were idle since the last scrape",
                                value=m.network_processor_avg_idle_percent())
        yield GaugeMetricFamily("kafka_server_KafkaRequestHandlerPool_RequestHandlerAvgIdlePercent",
                                "Fraction of time request handlers were idle since the last scrape",
                                value=m.request_handler_avg_idle_percent())
        yield CounterMetricFamily("kafka_server_BrokerTopicMetrics_BytesInPerSec",
                                  "Request bytes received (all requests, frame size included)",
                                  value=totals["bytes_in"])
        yield CounterMetricFamily("kafka_server_BrokerTopicMetrics_BytesOutPerSec",
                                  "Response bytes sent (all responses, frame size included)",
                                  value=totals["bytes_out"])
        yield GaugeMetricFamily("kafka_server_socket_server_metrics_connection_count",
                                "Open client connections", value=totals["connection_count"])
        yield CounterMetricFamily("kafka_server_socket_server_metrics_connection_creation",
                                  "Connections accepted", value=totals["connections_created"])
        yield GaugeMetricFamily("kafka_network_SocketServer_MemoryPoolAvailable",
                                "Bytes left in the request memory pool (queued.max.request.bytes; "
                                "2^63-1 without a pool)", value=ss.memory_pool_available())
        yield GaugeMetricFamily("kafka_network_SocketServer_MemoryPoolUsed",
                                "Bytes of the request memory pool held by requests in flight",
                                value=ss.memory_pool_used())
        yield CounterMetricFamily("kafka_network_RequestChannel_InvalidReceives",
                                  "Connections closed for an unparseable or oversized frame",
                                  value=totals["invalid_receives"])
        yield CounterMetricFamily("kafka_server_KafkaRequestHandlerPool_HandlerErrors",
                                  "Requests whose handler raised (answered UNKNOWN_SERVER_ERROR or closed)",
                                  value=totals["handler_errors"])
        apis = m.api_totals()
        requests = CounterMetricFamily("kafka_network_RequestMetrics_RequestsPerSec",
                                       "Requests received, per API", labels=["request"])
        bytes_in = CounterMetricFamily("kafka_network_RequestMetrics_RequestBytes",
                                       "Request bytes received, per API", labels=["request"])
        bytes_out = CounterMetricFamily("kafka_network_RequestMetrics_ResponseBytes",
                                        "Response bytes sent, per API", labels=["request"])
        times = {name: SummaryMetricFamily(f"kafka_network_RequestMetrics_{name}", doc, labels=["request"])
                 for name, _, doc in _REQUEST_TIMES}
        for api_key, s in sorted(apis.items()):
            name = [_api_name(api_key)]
            requests.add_metric(name, s["count"])
            bytes_in.add_metric(name, s["bytes_in"])
            bytes_out.add_metric(name, s["bytes_out"])
            for metric, field, _ in _REQUEST_TIMES:
                times[metric].add_metric(name, count_value=s["count"], sum_value=s[field] / 1e6)
        yield requests
        yield bytes_in
        yield bytes_out
        yield from times.values()

    def _purgatory_metrics(self):
        size = GaugeMetricFamily("kafka_server_DelayedOperationPurgatory_PurgatorySize",
                                 "Entries in the purgatory's watch lists", labels=["delayedOperation"])
        delayed = GaugeMetricFamily("kafka_server_DelayedOperationPurgatory_NumDelayedOperations",
                                    "Operations waiting in the purgatory's timer", labels=["delayedOperation"])
        for p in self._purgatories():
            size.add_metric([p.name], p.watched())
            delayed.add_metric([p.name], p.num_delayed())
        yield size
        yield delayed

    def _partitions(self, b):
        rm = getattr(b, "replica_manager", None)
        if rm is None:
            return
        parts = list(rm.partitions.values())
        yield GaugeMetricFamily("kafka_server_ReplicaManager_PartitionCount",
                                "Partitions hosted by this broker", value=len(parts))
        yield GaugeMetricFamily("kafka_server_ReplicaManager_LeaderCount",
                                "Partitions this broker leads", value=sum(1 for p in parts if p.node_id == b.node_id))
        yield GaugeMetricFamily("kafka_server_ReplicaManager_UnderReplicatedPartitions",
                                "Partitions whose ISR is smaller than their replica set",
                                value=sum(1 for p in parts if len(p.isr) < len(p.replicas)))
        image = b.metadata.image
        yield GaugeMetricFamily("kafka_controller_KafkaController_ActiveControllerCount",
                                "1 on the active controller", value=1)
        yield GaugeMetricFamily("kafka_controller_KafkaController_GlobalTopicCount",
                                "Topics in the cluster", value=len(image.topics))
        yield GaugeMetricFamily("kafka_controller_KafkaController_GlobalPartitionCount",
                                "Partitions in the cluster",
                                value=sum(t.num_partitions for t in image.topics.values()))
        labels = ["topic", "partition"]
        size = GaugeMetricFamily("kafka_log_Log_Size", "Bytes in the partition's log segments", labels=labels)
        leo = GaugeMetricFamily("kafka_log_Log_LogEndOffset", "Offset of the next record appended", labels=labels)
        lso = GaugeMetricFamily("kafka_log_Log_LogStartOffset", "First offset of the log", labels=labels)
        segs = GaugeMetricFamily("kafka_log_Log_NumLogSegments", "Segments of the log", labels=labels)
        hw = GaugeMetricFamily("kafka_cluster_Partition_HighWatermark", "High watermark", labels=labels)
        total = 0
        for p in sorted(parts, key=lambda p: (p.topic, p.partition)):
            lg = p.log
            key = [p.topic, str(p.partition)]
            n = lg.size_in_bytes
            total += n
            size.add_metric(key, n)
            leo.add_metric(key, lg.log_end_offset)
            lso.add_metric(key, lg.log_start_offset)
            segs.add_metric(key, lg.num_segments)
            hw.add_metric(key, lg.high_watermark)
        yield size
        yield leo
        yield lso
        yield segs
        yield hw
        yield GaugeMetricFamily("kafka_log_LogManager_Size", "Bytes in all hosted logs", value=total)


def start_metrics_server(broker, port: int) -> MetricsServer:
    """Serve ``broker``'s metrics on the first listener's host and ``port`` (0 = any free port)."""
    host = broker.config.listeners[0].host or "0.0.0.0"
    return serve(BrokerCollector(broker), host, port, "kbroker-metrics-http")

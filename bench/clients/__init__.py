"""Thin client adapters so one benchmark driver runs unchanged on every Kafka client.

Settings use Kafka's property names (``acks``, ``linger.ms``, ``batch.size``,
``compression.type``, ...); each adapter maps them onto its client.

Producer adapters report every delivery to a *sink* with two methods::

    sink.ok(latency_s: float, nbytes: int)   # acknowledged; latency = send -> delivery callback
    sink.error()                              # delivery failed

The sink is called on whatever thread the client runs delivery callbacks on
(librdkafka: the thread calling ``poll``/``flush``; kafka-python and kbroker.client:
their I/O thread), so it must be thread-safe (bench.common.DeliveryRecorder is).

Consumer adapters return plain ``(key, value)`` lists from ``poll_batch`` so the drivers
can count and time-stamp records without knowing the client's record type.
"""
from __future__ import annotations

CLIENTS = ("confluent", "kbroker", "kafka-python")


def make_producer(client: str, bootstrap: str, settings: dict, sink):
    """A producer adapter (send/poll/flush/close) for ``client``."""
    if client == "confluent":
        from bench.clients.confluent import ConfluentProducer
        return ConfluentProducer(bootstrap, settings, sink)
    if client == "kafka-python":
        from bench.clients.kafka_python import KafkaPythonProducer
        return KafkaPythonProducer(bootstrap, settings, sink)
    if client == "kbroker":
        from bench.clients.kbroker_client import KBrokerProducer
        return KBrokerProducer(bootstrap, settings, sink)
    raise ValueError(f"unknown client {client!r} (choose from {', '.join(CLIENTS)})")


def make_consumer(client: str, bootstrap: str, settings: dict):
    """A consumer adapter (assign_beginning/assign_end/subscribe/poll_batch/close)."""
    if client == "confluent":
        from bench.clients.confluent import ConfluentConsumer
        return ConfluentConsumer(bootstrap, settings)
    if client == "kafka-python":
        from bench.clients.kafka_python import KafkaPythonConsumer
        return KafkaPythonConsumer(bootstrap, settings)
    if client == "kbroker":
        from bench.clients.kbroker_client import KBrokerConsumer
        return KBrokerConsumer(bootstrap, settings)
    raise ValueError(f"unknown client {client!r} (choose from {', '.join(CLIENTS)})")


def make_admin(bootstrap: str):
    """The admin adapter (librdkafka's AdminClient whatever client is under test: topic
    setup is not what is measured): ``create_topics({name: partitions}, timeout)``,
    ``delete_topics(names, timeout)``, ``partitions(topic)``, ``end_offsets(topic, n)``."""
    from bench.clients.confluent import ConfluentAdmin
    return ConfluentAdmin(bootstrap)

"""Broker-side schema validation on a KRaft cluster (1 controller + 1 broker, and a
`kbroker schema-registry` storing its schemas in that cluster): a topic created through the
controller with kbroker.value.schema.validation=true accepts, on its leader, values framed
with a schema id registered under `<topic>-value`, and refuses with INVALID_RECORD (nothing
appended) values without the header or with an id the registry does not know for it."""
from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.schema_registry.testing import SchemaRegistryProcess
from kbroker.testing import KRaftControllerQuorum, free_port
from tests.cluster.test_kraft_data_plane import FAST, _wait


def test_validated_topic_refuses_headerless_values_in_a_cluster(tmp_path):
    sr_port = free_port()
    q = KRaftControllerQuorum(str(tmp_path), n=1, brokers=1,
                              overrides={**FAST, "kbroker.schema.registry.url": f"http://127.0.0.1:{sr_port}"})
    registry = None
    try:
        q.start()
        admin = AdminClient({"bootstrap.servers": q.bootstrap})
        _wait(lambda: admin.list_topics(timeout=5).brokers, what="broker registered")
        f = admin.create_topics([NewTopic("validated", 1, 1, config={"kbroker.value.schema.validation": "true"})],
                                operation_timeout=10)["validated"]
        f.result(timeout=20)
        _wait(lambda: "validated" in admin.list_topics(timeout=5).topics, what="topic visible")
        p = Producer({"bootstrap.servers": q.bootstrap, "message.timeout.ms": 10000})
        errors = []
        p.produce("validated", value=b'{"not": "framed"}', on_delivery=lambda e, m: errors.append(e))
        p.flush(20)
        assert errors and errors[0] is not None and errors[0].name() == "INVALID_RECORD", errors
        from confluent_kafka import Consumer, TopicPartition
        c = Consumer({"bootstrap.servers": q.bootstrap, "group.id": "v"})
        assert c.get_watermark_offsets(TopicPartition("validated", 0), timeout=10) == (0, 0)  # nothing appended
        # with the registry: a registered id is accepted, an unknown one refused
        import struct
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

        registry = SchemaRegistryProcess(q.bootstrap, port=sr_port)
        registry.start()
        sid = SchemaRegistryClient({"url": f"http://127.0.0.1:{sr_port}"}).register_schema(
            "validated-value", Schema('{"type": "string"}', "AVRO"))
        results = []
        for schema_id in (sid, 424242):
            p.produce("validated", value=b"\0" + struct.pack(">i", schema_id) + b"\x02x",
                      on_delivery=lambda e, m: results.append(e))
            p.flush(20)
        assert results[0] is None, results
        assert results[1] is not None and results[1].name() == "INVALID_RECORD", results
        assert c.get_watermark_offsets(TopicPartition("validated", 0), timeout=10) == (0, 1)
        c.close()
    finally:
        if registry is not None:
            registry.terminate()
            registry.__exit__(None, None, None)
        q.stop()

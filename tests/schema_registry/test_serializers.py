"""confluent-kafka's SchemaRegistryClient and its Avro / JSON / Protobuf serializers,
unchanged, against ``kbroker schema-registry`` and records round-tripped through a kbroker
topic: register, evolve compatibly, 409 on an incompatible change."""
import json
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def _topic(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def roundtrip(broker, topic, values, serializer, deserializer, timeout_s=30.0):
    """Produce ``values`` serialized into a new kbroker topic and read them back."""
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    raw = []
    for v in values:
        data = serializer(v, SerializationContext(topic, MessageField.VALUE))
        raw.append(data)
        p.produce(topic, value=data)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "sr-" + uuid.uuid4().hex,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    import time
    deadline = time.monotonic() + timeout_s
    while len(got) < len(values) and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(deserializer(m.value(), SerializationContext(topic, MessageField.VALUE)))
    c.close()
    return raw, got


USER_V1 = {"type": "record", "name": "User", "namespace": "kbroker.test",
           "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}
USER_V2 = {**USER_V1, "fields": USER_V1["fields"] + [{"name": "email", "type": ["null", "string"], "default": None}]}
USER_BAD = {**USER_V1, "fields": [{"name": "name", "type": "string"}, {"name": "age", "type": "string"}]}


def test_avro_register_evolve_and_roundtrip(broker, client):
    topic = _topic("avro")
    ser1 = AvroSerializer(client, json.dumps(USER_V1))
    deser = AvroDeserializer(client)
    users = [{"name": f"u{i}", "age": i} for i in range(20)]
    raw, got = roundtrip(broker, topic, users, ser1, deser)
    assert got == users
    # the Confluent framing: magic 0, then the 4-byte id the registry assigned
    sid = client.get_latest_version(f"{topic}-value").schema_id
    assert all(r[0] == 0 and int.from_bytes(r[1:5], "big") == sid for r in raw)

    # a compatible evolution (a new field with a default) gets version 2 and a new id
    ser2 = AvroSerializer(client, json.dumps(USER_V2))
    more = [{"name": "x", "age": 1, "email": "x@example.com"}]
    _, got2 = roundtrip(broker, _topic("avro2"), more, ser2, deser)
    assert got2 == more
    assert client.get_versions(f"{topic}-value") == [1]
    latest = client.register_schema(f"{topic}-value", Schema(json.dumps(USER_V2), "AVRO"))
    assert latest != sid
    assert client.get_versions(f"{topic}-value") == [1, 2]

    # an incompatible change: 409 with the reason, nothing registered
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema(f"{topic}-value", Schema(json.dumps(USER_BAD), "AVRO"))
    assert e.value.http_status_code == 409 and e.value.error_code == 409
    assert "TYPE_MISMATCH" in e.value.error_message and "/fields/1/type" in e.value.error_message
    assert client.get_versions(f"{topic}-value") == [1, 2]


def test_avro_same_schema_same_id_across_subjects(client):
    a = client.register_schema("same-a", Schema(json.dumps(USER_V1), "AVRO"))
    # whitespace does not change the schema
    b = client.register_schema("same-b", Schema(json.dumps(USER_V1, indent=2), "AVRO"))
    assert a == b
    assert {"same-a", "same-b"} <= set(client.get_subjects_by_schema_id(a))
    reg = client.lookup_schema("same-b", Schema(json.dumps(USER_V1, indent=4), "AVRO"))
    assert (reg.schema_id, reg.version) == (a, 1)


def test_json_schema_serializer_roundtrip_and_409(broker, client):
    topic = _topic("json")
    v1 = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
          "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
          "required": ["id"], "additionalProperties": False}
    ser = JSONSerializer(json.dumps(v1), client)
    deser = JSONDeserializer(json.dumps(v1))
    orders = [{"id": i, "item": f"thing-{i}"} for i in range(10)]
    raw, got = roundtrip(broker, topic, orders, ser, deser)
    assert got == orders and raw[0][0] == 0
    subject = f"{topic}-value"
    # compatible: an optional property added to a closed content model
    v2 = {**v1, "properties": {**v1["properties"], "qty": {"type": "integer"}}}
    client.register_schema(subject, Schema(json.dumps(v2), "JSON"))
    # incompatible: a new required property (REQUIRED_ATTRIBUTE_ADDED)
    v3 = {**v2, "required": ["id", "qty"]}
    with pytest.raises(SchemaRegistryError) as e:
        client.register_schema(subject, Schema(json.dumps(v3), "JSON"))
    assert e.value.error_code == 409 and "REQUIRED_ATTRIBUTE_ADDED" in e.value.error_message
    assert client.get_latest_version(subject).schema.schema_type == "JSON"


def _proto_message_class(package, fields):
    """A generated message class without protoc: FileDescriptorProto -> pool -> class."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    T = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name=f"{package.replace('.', '/')}/order.proto",
                                             package=package, syntax="proto3")
    m = fdp.message_type.add(name="Order")
    for number, (name, typ) in enumerate(fields, 1):
        m.field.add(name=name, number=number, type=getattr(T, "TYPE_" + typ.upper()), label=T.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Order"))


def test_protobuf_serializer_roundtrip_and_409(broker, client):
    topic = _topic("proto")
    pkg = "kbroker.t" + uuid.uuid4().hex[:6]
    Order = _proto_message_class(pkg, [("id", "int64"), ("item", "string")])
    ser = ProtobufSerializer(Order, client, {"use.deprecated.format": False})
    deser = ProtobufDeserializer(Order, {"use.deprecated.format": False})
    orders = [Order(id=i, item=f"p{i}") for i in range(10)]
    raw, got = roundtrip(broker, topic, orders, ser, deser)
    assert got == orders
    subject = f"{topic}-value"
    # the registry serves the schema back in the serialized form the deserializer asks for
    reg = client.get_latest_version(subject)
    assert reg.schema.schema_type == "PROTOBUF"
    served = client.get_schema(reg.schema_id, fmt="serialized")
    assert served.schema_str

    # compatible: a field added (proto3 fields are optional)
    Order2 = _proto_message_class(pkg, [("id", "int64"), ("item", "string"), ("qty", "int32")])
    ProtobufSerializer(Order2, client, {"use.deprecated.format": False})(
        Order2(id=1, qty=2), SerializationContext(topic, MessageField.VALUE))
    assert client.get_versions(subject) == [1, 2]
    # incompatible: field 2 changes from string to int64 (FIELD_SCALAR_KIND_CHANGED)
    Order3 = _proto_message_class(pkg, [("id", "int64"), ("item", "int64")])
    with pytest.raises(Exception) as e:
        ProtobufSerializer(Order3, client, {"use.deprecated.format": False})(
            Order3(id=1), SerializationContext(topic, MessageField.VALUE))
    assert "FIELD_SCALAR_KIND_CHANGED" in str(e.value)


def test_protobuf_text_schema_served_serialized(client):
    """A .proto text schema registered over REST is served as a descriptor the Python
    protobuf runtime loads (what ProtobufDeserializer does with format=serialized)."""
    import base64

    from google.protobuf import descriptor_pb2, descriptor_pool

    text = """syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
message Basket {
  string id = 1;
  repeated Line lines = 2;
  map<string, int32> tags = 3;
  optional Kind kind = 4;
  oneof payer { string card = 5; int64 account = 6; }
  message Line { string sku = 1; uint32 qty = 2; }
}
enum Kind { KIND_UNSPECIFIED = 0; GIFT = 1; }
"""
    sid = client.register_schema("basket-value", Schema(text, "PROTOBUF"))
    assert client.get_schema(sid).schema_str == text.strip()
    import urllib.request
    with urllib.request.urlopen(f"{client._rest_client.base_urls[0]}/schemas/ids/{sid}?format=serialized") as r:
        body = json.loads(r.read())
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(body["schema"]))
    assert list(fdp.dependency) == ["google/protobuf/timestamp.proto"]
    pool = descriptor_pool.DescriptorPool()
    from google.protobuf import timestamp_pb2  # the well-known types ProtobufDeserializer preloads
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(fdp)
    d = pool.FindMessageTypeByName("shop.v1.Basket")
    assert [f.name for f in d.fields] == ["id", "lines", "tags", "kind", "card", "account"]
    assert d.fields_by_name["tags"].message_type.GetOptions().map_entry
    assert [o.name for o in d.oneofs] == ["payer", "_kind"]


def test_protobuf_with_an_imported_file_registers_references(broker, client):
    """A message whose .proto imports another file: the serializer registers the import as
    its own subject and references it; the deserializer resolves it back by reference."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    T = descriptor_pb2.FieldDescriptorProto
    pkg = "kbroker.r" + uuid.uuid4().hex[:6]
    money = descriptor_pb2.FileDescriptorProto(name=f"{pkg.replace('.', '/')}/money.proto", package=pkg,
                                               syntax="proto3")
    m = money.message_type.add(name="Money")
    m.field.add(name="cents", number=1, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    m.field.add(name="currency", number=2, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    order = descriptor_pb2.FileDescriptorProto(name=f"{pkg.replace('.', '/')}/order.proto", package=pkg,
                                               syntax="proto3", dependency=[money.name])
    o = order.message_type.add(name="Order")
    o.field.add(name="id", number=1, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    o.field.add(name="price", number=2, type=T.TYPE_MESSAGE, type_name=f".{pkg}.Money", label=T.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(money)
    pool.Add(order)
    Order = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.Order"))
    Money = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.Money"))

    topic = _topic("protoref")
    ser = ProtobufSerializer(Order, client, {"use.deprecated.format": False})
    deser = ProtobufDeserializer(Order, {"use.deprecated.format": False}, client)
    orders = [Order(id=i, price=Money(cents=100 * i, currency="NOK")) for i in range(5)]
    _, got = roundtrip(broker, topic, orders, ser, deser)
    assert got == orders
    latest = client.get_latest_version(f"{topic}-value")
    assert [(r.name, r.subject) for r in latest.schema.references] == [(money.name, money.name)]
    assert client.get_versions(money.name) == [1]

"""Compatibility rules, case by case, through the registry's compatibility endpoint with
confluent-kafka's ``SchemaRegistryClient.test_compatibility``.

Each case is (rule, old schema, new schema, compatible under BACKWARD), BACKWARD meaning
the new schema (reader) reads data written with the old one (writer). The Avro cases
follow the Avro specification's "Schema Resolution" section; the JSON Schema cases the
open/closed content-model rules Confluent documents; the Protobuf cases the protobuf
language guide's "Updating a message type" rules."""
import json
import uuid

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError


def rec(*fields, name="R"):
    return {"type": "record", "name": name, "fields": [dict(f) for f in fields]}


def f(name, typ, **kw):
    return {"name": name, "type": typ, **kw}


AVRO = [
    ("identical schemas resolve", "int", "int", True),
    ("promotion: int is promotable to long", "int", "long", True),
    ("promotion: int is promotable to float", "int", "float", True),
    ("promotion: int is promotable to double", "int", "double", True),
    ("promotion: long is promotable to float", "long", "float", True),
    ("promotion: long is promotable to double", "long", "double", True),
    ("promotion: float is promotable to double", "float", "double", True),
    ("promotion: string is promotable to bytes", "string", "bytes", True),
    ("promotion: bytes is promotable to string", "bytes", "string", True),
    ("no demotion: long is not promotable to int", "long", "int", False),
    ("no demotion: double is not promotable to float", "double", "float", False),
    ("primitives that do not match are an error", "int", "string", False),
    ("records: a writer field missing from the reader is ignored",
     rec(f("a", "int"), f("b", "string")), rec(f("a", "int")), True),
    ("records: a reader field missing from the writer takes its default",
     rec(f("a", "int")), rec(f("a", "int"), f("b", "string", default="x")), True),
    ("records: a reader field missing from the writer without a default is an error",
     rec(f("a", "int")), rec(f("a", "int"), f("b", "string")), False),
    ("records: fields are matched by name, their types resolved recursively",
     rec(f("a", "int")), rec(f("a", "long")), True),
    ("records: a field whose types do not resolve is an error",
     rec(f("a", "long")), rec(f("a", "int")), False),
    ("records: both schemas must have the same name", rec(f("a", "int")), rec(f("a", "int"), name="S"), False),
    ("records: a reader alias matches the writer's name",
     rec(f("a", "int")), {**rec(f("a", "int"), name="S"), "aliases": ["R"]}, True),
    ("enums: a writer symbol missing from the reader is an error",
     {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]},
     {"type": "enum", "name": "E", "symbols": ["A", "B"]}, False),
    ("enums: the reader may add symbols",
     {"type": "enum", "name": "E", "symbols": ["A", "B"]},
     {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}, True),
    ("enums: a missing symbol takes the reader's default",
     {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]},
     {"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "A"}, True),
    ("fixed: sizes must match", {"type": "fixed", "name": "F", "size": 4},
     {"type": "fixed", "name": "F", "size": 8}, False),
    ("fixed: names must match", {"type": "fixed", "name": "F", "size": 4},
     {"type": "fixed", "name": "G", "size": 4}, False),
    ("arrays: item types resolve recursively", {"type": "array", "items": "int"},
     {"type": "array", "items": "long"}, True),
    ("arrays: item types that do not resolve are an error", {"type": "array", "items": "long"},
     {"type": "array", "items": "int"}, False),
    ("maps: value types resolve recursively", {"type": "map", "values": "float"},
     {"type": "map", "values": "double"}, True),
    ("maps: value types that do not resolve are an error", {"type": "map", "values": "string"},
     {"type": "map", "values": "int"}, False),
    ("unions: a reader union takes a non-union writer's matching branch", "int", ["null", "int"], True),
    ("unions: a reader union with no matching branch is an error", "string", ["null", "int"], False),
    ("unions: every writer branch must resolve against the reader", ["null", "int"], "int", False),
    ("unions: branch order does not matter", ["int", "string"], ["string", "null", "int"], True),
    ("unions: a writer branch is resolved with promotion", ["null", "int"], ["null", "long"], True),
]

JSON = [
    ("type: the same type", {"type": "string"}, {"type": "string"}, True),
    ("type: TYPE_CHANGED", {"type": "string"}, {"type": "integer"}, False),
    ("type: integer widens to number", {"type": "integer"}, {"type": "number"}, True),
    ("type: TYPE_NARROWED number to integer", {"type": "number"}, {"type": "integer"}, False),
    ("type: adding a type to a type list", {"type": "string"}, {"type": ["string", "null"]}, True),
    ("required: REQUIRED_ATTRIBUTE_ADDED",
     {"type": "object", "properties": {"a": {"type": "string"}}},
     {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}, False),
    ("required: removing a required attribute",
     {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
     {"type": "object", "properties": {"a": {"type": "string"}}}, True),
    ("closed content model: OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
     {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
     {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
      "additionalProperties": False}, True),
    ("closed content model: PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL",
     {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
      "additionalProperties": False},
     {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}, False),
    ("open content model: PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL",
     {"type": "object", "properties": {"a": {"type": "string"}}},
     {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}, False),
    ("open content model: a property removed stays allowed",
     {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}},
     {"type": "object", "properties": {"a": {"type": "string"}}}, True),
    ("partially open content model: PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
     {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}},
     {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}},
      "additionalProperties": {"type": "integer"}}, True),
    ("partially open content model: PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL",
     {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}},
     {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
      "additionalProperties": {"type": "integer"}}, False),
    ("additionalProperties: ADDITIONAL_PROPERTIES_REMOVED (open to closed)",
     {"type": "object", "properties": {"a": {"type": "string"}}},
     {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}, False),
    ("additionalProperties: closed to open", {"type": "object", "additionalProperties": False},
     {"type": "object"}, True),
    ("enum: ENUM_ARRAY_NARROWED", {"enum": ["a", "b"]}, {"enum": ["a"]}, False),
    ("enum: ENUM_ARRAY_EXTENDED", {"enum": ["a"]}, {"enum": ["a", "b"]}, True),
    ("string: MAX_LENGTH_ADDED", {"type": "string"}, {"type": "string", "maxLength": 5}, False),
    ("string: MAX_LENGTH_DECREASED", {"type": "string", "maxLength": 9}, {"type": "string", "maxLength": 5}, False),
    ("string: MAX_LENGTH_INCREASED", {"type": "string", "maxLength": 5}, {"type": "string", "maxLength": 9}, True),
    ("string: MIN_LENGTH_INCREASED", {"type": "string", "minLength": 1}, {"type": "string", "minLength": 3}, False),
    ("string: PATTERN_ADDED", {"type": "string"}, {"type": "string", "pattern": "^a"}, False),
    ("number: MAXIMUM_DECREASED", {"type": "number", "maximum": 10}, {"type": "number", "maximum": 5}, False),
    ("number: MINIMUM_DECREASED", {"type": "number", "minimum": 10}, {"type": "number", "minimum": 5}, True),
    ("array: item types resolve recursively", {"type": "array", "items": {"type": "integer"}},
     {"type": "array", "items": {"type": "number"}}, True),
    ("array: item TYPE_CHANGED", {"type": "array", "items": {"type": "integer"}},
     {"type": "array", "items": {"type": "string"}}, False),
    ("array: MAX_ITEMS_ADDED", {"type": "array"}, {"type": "array", "maxItems": 3}, False),
    ("oneOf: SUM_TYPE_EXTENDED", {"type": "string"}, {"oneOf": [{"type": "string"}, {"type": "integer"}]}, True),
    ("oneOf: SUM_TYPE_NARROWED", {"oneOf": [{"type": "string"}, {"type": "integer"}]}, {"type": "string"}, False),
    ("nested: a property's type resolved recursively",
     {"type": "object", "properties": {"o": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
     {"type": "object", "properties": {"o": {"type": "object", "properties": {"x": {"type": "string"}}}}}, False),
]

PROTO_HEAD = 'syntax = "proto3";\npackage demo;\n'
PROTO = [
    ("adding a field is compatible", "message M { string a = 1; }", "message M { string a = 1; int32 b = 2; }", True),
    ("removing a field is compatible", "message M { string a = 1; int32 b = 2; }", "message M { string a = 1; }", True),
    ("renaming a field keeps its number", "message M { string a = 1; }", "message M { string renamed = 1; }", True),
    ("int32, uint32, int64, uint64 and bool are wire-compatible", "message M { int32 a = 1; }",
     "message M { int64 a = 1; }", True),
    ("sint32 and sint64 are compatible with each other", "message M { sint32 a = 1; }",
     "message M { sint64 a = 1; }", True),
    ("FIELD_SCALAR_KIND_CHANGED: string to int32", "message M { string a = 1; }", "message M { int32 a = 1; }", False),
    ("FIELD_SCALAR_KIND_CHANGED: int32 to sint32 (zigzag)", "message M { int32 a = 1; }",
     "message M { sint32 a = 1; }", False),
    ("string and bytes are compatible", "message M { string a = 1; }", "message M { bytes a = 1; }", True),
    ("enum and int32 are wire-compatible", "message M { E a = 1; }\nenum E { X = 0; }",
     "message M { int32 a = 1; }\nenum E { X = 0; }", True),
    ("FIELD_KIND_CHANGED: scalar to message", "message M { string a = 1; }\nmessage N { string s = 1; }",
     "message M { N a = 1; }\nmessage N { string s = 1; }", False),
    ("FIELD_NAMED_TYPE_CHANGED", "message M { N a = 1; }\nmessage N { }\nmessage O { }",
     "message M { O a = 1; }\nmessage N { }\nmessage O { }", False),
    ("MESSAGE_REMOVED", "message M { string a = 1; }\nmessage N { string s = 1; }",
     "message M { string a = 1; }", False),
    ("adding a message is compatible", "message M { string a = 1; }",
     "message M { string a = 1; }\nmessage N { string s = 1; }", True),
    ("MULTIPLE_FIELDS_MOVED_TO_ONEOF", "message M { string a = 1; int32 b = 2; }",
     "message M { oneof c { string a = 1; int32 b = 2; } }", False),
    ("a single field moved into a new oneof is compatible", "message M { string a = 1; }",
     "message M { oneof c { string a = 1; } }", True),
]

PROTO2 = [
    ("REQUIRED_FIELD_ADDED (proto2)", "message M { optional string a = 1; }",
     "message M { optional string a = 1; required int32 b = 2; }", False),
    ("REQUIRED_FIELD_REMOVED (proto2)", "message M { optional string a = 1; required int32 b = 2; }",
     "message M { optional string a = 1; }", False),
]


def _check(client, schema_type, old, new, level="BACKWARD"):
    subject = "rule-" + uuid.uuid4().hex[:10]
    if level != "BACKWARD":
        client.set_compatibility(subject, level)
    client.register_schema(subject, Schema(old, schema_type))
    return client.test_compatibility(subject, Schema(new, schema_type))


@pytest.mark.parametrize("rule,old,new,ok", AVRO, ids=[c[0] for c in AVRO])
def test_avro_schema_resolution(client, rule, old, new, ok):
    assert _check(client, "AVRO", json.dumps(old), json.dumps(new)) is ok, rule


@pytest.mark.parametrize("rule,old,new,ok", JSON, ids=[c[0] for c in JSON])
def test_json_schema_rules(client, rule, old, new, ok):
    assert _check(client, "JSON", json.dumps(old), json.dumps(new)) is ok, rule


@pytest.mark.parametrize("rule,old,new,ok", PROTO, ids=[c[0] for c in PROTO])
def test_protobuf_rules(client, rule, old, new, ok):
    assert _check(client, "PROTOBUF", PROTO_HEAD + old, PROTO_HEAD + new) is ok, rule


@pytest.mark.parametrize("rule,old,new,ok", PROTO2, ids=[c[0] for c in PROTO2])
def test_protobuf2_required_rules(client, rule, old, new, ok):
    head = 'syntax = "proto2";\npackage demo;\n'
    assert _check(client, "PROTOBUF", head + old, head + new) is ok, rule


def test_protobuf_package_changed(client):
    old = 'syntax = "proto3";\npackage a;\nmessage M { string s = 1; }'
    assert _check(client, "PROTOBUF", old, old.replace("package a;", "package b;")) is False


# -- levels: the direction of each check, and transitivity ---------------------------------
V1 = rec(f("a", "int"))
ADD_NO_DEFAULT = rec(f("a", "int"), f("b", "string"))    # new readers need b: not BACKWARD
DROP_NO_DEFAULT = rec()                                  # old readers need a: not FORWARD
ADD_DEFAULT = rec(f("a", "int"), f("b", "string", default=""))


@pytest.mark.parametrize("level,new,ok", [
    ("BACKWARD", ADD_NO_DEFAULT, False), ("BACKWARD", DROP_NO_DEFAULT, True),
    ("FORWARD", ADD_NO_DEFAULT, True), ("FORWARD", DROP_NO_DEFAULT, False),
    ("FULL", ADD_NO_DEFAULT, False), ("FULL", DROP_NO_DEFAULT, False), ("FULL", ADD_DEFAULT, True),
    ("NONE", rec(f("a", "string")), True),
])
def test_levels(client, level, new, ok):
    assert _check(client, "AVRO", json.dumps(V1), json.dumps(new), level) is ok


@pytest.mark.parametrize("level,ok", [("BACKWARD", True), ("BACKWARD_TRANSITIVE", False),
                                      ("FORWARD", True), ("FORWARD_TRANSITIVE", False),
                                      ("FULL", True), ("FULL_TRANSITIVE", False)])
def test_transitive_levels_check_every_version(client, level, ok):
    """v1 has x:int, v2 drops it, v3 brings x back as a string with a default: v3 resolves
    against v2 both ways but not against v1, so only the transitive levels refuse it."""
    subject = "trans-" + uuid.uuid4().hex[:10]
    client.set_compatibility(subject, level)
    v1 = rec(f("x", "int", default=0), f("k", "string", default=""))
    v2 = rec(f("k", "string", default=""))
    v3 = rec(f("k", "string", default=""), f("x", "string", default=""))
    client.register_schema(subject, Schema(json.dumps(v1), "AVRO"))
    client.register_schema(subject, Schema(json.dumps(v2), "AVRO"))
    if ok:
        client.register_schema(subject, Schema(json.dumps(v3), "AVRO"))
        assert client.get_versions(subject) == [1, 2, 3]
    else:
        with pytest.raises(SchemaRegistryError) as e:
            client.register_schema(subject, Schema(json.dumps(v3), "AVRO"))
        assert e.value.http_status_code == 409 and "oldSchemaVersion: 1" in e.value.error_message

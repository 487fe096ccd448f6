"""The format modules on their own: references, canonical and normalized forms, and the
Protobuf model being the same whether a schema arrives as text or as a descriptor."""
import json

import jsonschema
import pytest

from kbroker.schema_registry.formats import SchemaParseError, parse

ADDRESS = '{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}'


def test_json_schema_reference_resolves_by_name():
    s = parse("JSON", '{"type":"object","properties":{"home":{"$ref":"address.json"}}}',
              [("address.json", ADDRESS)])
    s.validate({"home": {"city": "Oslo"}})
    with pytest.raises(jsonschema.ValidationError):
        s.validate({"home": {}})


def test_json_schema_checked_against_its_meta_schema():
    with pytest.raises(SchemaParseError):
        parse("JSON", '{"type": "strin"}')
    with pytest.raises(SchemaParseError):
        parse("JSON", '{"$schema": "https://json-schema.org/draft/2020-12/schema", "minLength": -1}')


def test_avro_canonical_ignores_whitespace_and_normalized_keeps_references_by_name():
    doc = {"type": "record", "name": "U", "namespace": "n", "fields": [{"name": "a", "type": "n.Addr"}]}
    refs = [("n.Addr", json.dumps({"type": "record", "name": "Addr", "namespace": "n",
                                   "fields": [{"name": "c", "type": "string"}]}))]
    a, b = parse("AVRO", json.dumps(doc), refs), parse("AVRO", json.dumps(doc, indent=3), refs)
    assert a.canonical() == b.canonical()
    assert '"Addr"' not in a.normalized() and "n.Addr" in a.normalized()
    with pytest.raises(SchemaParseError):
        parse("AVRO", json.dumps(doc))  # the referenced type is unknown without the reference


PROTO = """syntax = "proto3";
package shop.v1;
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


def test_protobuf_text_and_descriptor_give_one_model():
    text = parse("PROTOBUF", PROTO)
    desc = parse("PROTOBUF", text.serialized())
    assert desc.messages == text.messages and desc.enums == text.enums and desc.package == "shop.v1"
    assert text.incompatibilities(desc) == [] and desc.incompatibilities(text) == []
    assert text.messages["shop.v1.Basket"][2].type == "shop.v1.Basket.Line"
    assert text.messages["shop.v1.Basket"][4].kind == "enum"


@pytest.mark.parametrize("bad", ["message {", "syntax = \"proto3\";", "message M { string a = ; }", "@@@"])
def test_protobuf_parse_errors_are_schema_errors(bad):
    with pytest.raises(SchemaParseError):
        parse("PROTOBUF", bad)

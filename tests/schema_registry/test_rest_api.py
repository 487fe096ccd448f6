"""The REST API's documented behaviour, over plain HTTP: error codes and messages,
soft and hard delete, ?deleted / ?normalize, config, mode, references, bad input, and a
restart that serves the same ids and versions."""
import json
import urllib.error
import urllib.request
import uuid

import pytest

from kbroker.schema_registry.testing import SchemaRegistryProcess

CT = "application/vnd.schemaregistry.v1+json"


def call(registry, method, path, body=None, ctype=CT):
    """(status, decoded JSON body, content type) of one request."""
    if body is None:
        data = None
    elif isinstance(body, (bytes, str)):
        data = body.encode() if isinstance(body, str) else body
    else:
        data = json.dumps(body).encode()
    headers = {"Content-Type": ctype} if data is not None and ctype else {}
    req = urllib.request.Request(registry.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw, status, rtype = r.read(), r.status, r.headers.get("Content-Type")
    except urllib.error.HTTPError as e:
        raw, status, rtype = e.read(), e.code, e.headers.get("Content-Type")
    try:
        return status, json.loads(raw), rtype
    except ValueError:
        return status, raw.decode(), rtype


def avro(n_fields=1, name="R"):
    return json.dumps({"type": "record", "name": name,
                       "fields": [{"name": f"f{i}", "type": "int", "default": 0} for i in range(n_fields)]},
                      separators=(",", ":"))  # the registry's canonical (compact) form


def subject():
    return "s-" + uuid.uuid4().hex[:8]


def register(registry, s, schema, **extra):
    st, body, _ = call(registry, "POST", f"/subjects/{s}/versions", {"schema": schema, **extra})
    assert st == 200, body
    return body["id"]


def expect(registry, method, path, status, code, body=None, ctype=CT, contains=None):
    st, b, rtype = call(registry, method, path, body, ctype)
    assert (st, b.get("error_code") if isinstance(b, dict) else b) == (status, code), b
    assert rtype == CT
    if contains:
        assert contains in b["message"], b["message"]
    return b


def test_get_by_subject_version_and_id(registry):
    s = subject()
    sid = register(registry, s, avro(1))
    st, b, rtype = call(registry, "GET", f"/subjects/{s}/versions/1")
    assert st == 200 and rtype == CT
    assert b == {"subject": s, "version": 1, "id": sid, "schema": avro(1)}
    assert call(registry, "GET", f"/subjects/{s}/versions/latest")[1] == b
    assert call(registry, "GET", f"/subjects/{s}/versions/-1")[1] == b
    assert call(registry, "GET", f"/schemas/ids/{sid}")[1] == {"schema": avro(1)}
    assert call(registry, "GET", f"/schemas/ids/{sid}/schema")[1] == json.loads(avro(1))
    assert call(registry, "GET", f"/subjects/{s}/versions/1/schema")[1] == json.loads(avro(1))
    assert call(registry, "GET", f"/schemas/ids/{sid}/versions")[1] == [{"subject": s, "version": 1}]
    assert s in call(registry, "GET", "/subjects")[1]
    assert sorted(call(registry, "GET", "/schemas/types")[1]) == ["AVRO", "JSON", "PROTOBUF"]
    st, b, _ = call(registry, "POST", f"/subjects/{s}", {"schema": avro(1)})
    assert (st, b["id"], b["version"]) == (200, sid, 1)


def test_not_found_codes(registry):
    s = subject()
    register(registry, s, avro(1))
    expect(registry, "GET", "/subjects/no-such-subject/versions", 404, 40401,
           contains="Subject 'no-such-subject' not found.")
    expect(registry, "GET", "/subjects/no-such-subject/versions/1", 404, 40401)
    expect(registry, "GET", f"/subjects/{s}/versions/7", 404, 40402, contains="Version 7 not found.")
    expect(registry, "GET", "/schemas/ids/987654", 404, 40403, contains="Schema 987654 not found")
    expect(registry, "POST", f"/subjects/{s}", 404, 40403, body={"schema": avro(3)})
    expect(registry, "POST", "/subjects/no-such-subject", 404, 40401, body={"schema": avro(1)})
    for bad in ("abc", "0", "2147483648", "-2"):
        expect(registry, "GET", f"/subjects/{s}/versions/{bad}", 422, 42202, contains=f"'{bad}'")
    expect(registry, "GET", "/no/such/path", 404, 404)
    expect(registry, "PATCH", "/config", 405, 405)


def test_bad_input_keeps_the_registry_up(registry):
    s = subject()
    path = f"/subjects/{s}/versions"
    expect(registry, "POST", path, 400, 400, body=b'{"schema": ')                  # malformed JSON
    expect(registry, "POST", path, 422, 42201, body={"schema": '{"type": "recrd"}'})  # does not parse
    expect(registry, "POST", path, 422, 42201, body={"schema": "{not json"})
    expect(registry, "POST", path, 422, 42201, body={"schema": avro(1), "schemaType": "XML"})
    expect(registry, "POST", path, 422, 42201, body={"schemaType": "AVRO"})          # no schema
    expect(registry, "POST", path, 422, 42201, body=["a list"])
    expect(registry, "POST", path, 422, 42201, body={"schema": "{}", "schemaType": "JSON",
                                                      "references": "nope"})
    expect(registry, "POST", path, 422, 42201, body={"schema": avro(1), "references": [
        {"name": "x", "subject": "missing", "version": 1}]}, contains="reference")
    expect(registry, "POST", path, 422, 42201, body={"schema": '{"type": 12}', "schemaType": "JSON"})
    expect(registry, "POST", path, 422, 42201, body={"schema": "message {", "schemaType": "PROTOBUF"})
    expect(registry, "POST", path, 415, 415, body={"schema": avro(1)}, ctype="text/plain")
    expect(registry, "POST", path, 400, 400, body="[" * 200000 + "]" * 200000)  # nests too deeply
    deep = '{"type":"array","items":' * 5000 + '"int"' + "}" * 5000
    expect(registry, "POST", path, 422, 42201, body={"schema": deep})
    expect(registry, "POST", path, 422, 42201, body={"schema": deep, "schemaType": "JSON"})
    huge = avro(60000)  # ~2.3 MB of fields: over the 1 MiB request limit
    assert len(huge) > 2 << 20
    expect(registry, "POST", path, 422, 42209, body={"schema": huge})
    # none of it registered anything, and the registry still serves
    expect(registry, "GET", path, 404, 40401)
    assert register(registry, s, avro(2)) > 0
    assert call(registry, "GET", "/")[0] == 200


def test_soft_and_hard_delete_of_versions(registry):
    s = subject()
    register(registry, s, avro(1))
    register(registry, s, avro(2))
    expect(registry, "DELETE", f"/subjects/{s}/versions/1?permanent=true", 404, 40407)
    st, b, _ = call(registry, "DELETE", f"/subjects/{s}/versions/1")
    assert (st, b) == (200, 1)
    expect(registry, "GET", f"/subjects/{s}/versions/1", 404, 40402)
    assert call(registry, "GET", f"/subjects/{s}/versions/1?deleted=true")[1]["version"] == 1
    assert call(registry, "GET", f"/subjects/{s}/versions")[1] == [2]
    assert call(registry, "GET", f"/subjects/{s}/versions?deleted=true")[1] == [1, 2]
    expect(registry, "DELETE", f"/subjects/{s}/versions/1", 404, 40406)
    assert call(registry, "DELETE", f"/subjects/{s}/versions/1?permanent=true")[:2] == (200, 1)
    expect(registry, "GET", f"/subjects/{s}/versions/1?deleted=true", 404, 40402)
    # the next version continues after the highest one ever used
    register(registry, s, avro(3))
    assert call(registry, "GET", f"/subjects/{s}/versions")[1] == [2, 3]


def test_soft_and_hard_delete_of_subjects(registry):
    s = subject()
    sid = register(registry, s, avro(1))
    register(registry, s, avro(2))
    expect(registry, "DELETE", f"/subjects/{s}?permanent=true", 404, 40405)
    assert call(registry, "DELETE", f"/subjects/{s}")[:2] == (200, [1, 2])
    assert s not in call(registry, "GET", "/subjects")[1]
    assert s in call(registry, "GET", "/subjects?deleted=true")[1]
    expect(registry, "DELETE", f"/subjects/{s}", 404, 40404, contains="soft deleted")
    expect(registry, "POST", f"/subjects/{s}", 404, 40401, body={"schema": avro(1)})
    st, b, _ = call(registry, "POST", f"/subjects/{s}?deleted=true", {"schema": avro(1)})
    assert (st, b["id"]) == (200, sid)
    assert call(registry, "GET", f"/schemas/ids/{sid}")[0] == 200  # ids stay readable
    assert call(registry, "DELETE", f"/subjects/{s}?permanent=true")[:2] == (200, [1, 2])
    expect(registry, "GET", f"/subjects/{s}/versions?deleted=true", 404, 40401)
    assert s not in call(registry, "GET", "/subjects?deleted=true")[1]


def test_normalize(registry):
    s = subject()
    a = json.dumps({"type": "record", "name": "N", "fields": [{"name": "x", "type": "int"}]})
    b = json.dumps({"fields": [{"type": "int", "name": "x"}], "name": "N", "type": "record"})
    ida = register(registry, s, a)
    assert register(registry, s + "-2", b) != ida  # not normalized: a different string
    st, r1, _ = call(registry, "POST", f"/subjects/{s}-n/versions?normalize=true", {"schema": a})
    st, r2, _ = call(registry, "POST", f"/subjects/{s}-n/versions?normalize=true", {"schema": b})
    assert r1["id"] == r2["id"]
    assert call(registry, "GET", f"/subjects/{s}-n/versions")[1] == [1]
    # confluent-kafka sends Python booleans: normalize=True
    st, r3, _ = call(registry, "POST", f"/subjects/{s}-n?normalize=True", {"schema": b})
    assert (st, r3["id"]) == (200, r1["id"])


def test_config_and_compatibility_endpoint(registry):
    s = subject()
    expect(registry, "GET", f"/config/{s}", 404, 40408)
    assert call(registry, "GET", f"/config/{s}?defaultToGlobal=true")[1] == {"compatibilityLevel": "BACKWARD"}
    assert call(registry, "PUT", f"/config/{s}", {"compatibility": "full"})[1] == {"compatibility": "FULL"}
    assert call(registry, "GET", f"/config/{s}")[1] == {"compatibilityLevel": "FULL"}
    expect(registry, "PUT", f"/config/{s}", 422, 42203, body={"compatibility": "SIDEWAYS"})
    register(registry, s, avro(1))
    # FULL: adding a field without a default breaks backward reading
    nodefault = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "f0", "type": "int", "default": 0}, {"name": "z", "type": "int"}]})
    st, b, _ = call(registry, "POST", f"/compatibility/subjects/{s}/versions/latest?verbose=true",
                    {"schema": nodefault})
    assert st == 200 and b["is_compatible"] is False
    assert any("READER_FIELD_MISSING_DEFAULT_VALUE" in m for m in b["messages"])
    assert call(registry, "POST", f"/compatibility/subjects/{s}/versions", {"schema": avro(2)})[1] == {
        "is_compatible": True}
    expect(registry, "POST", f"/subjects/{s}/versions", 409, 409, body={"schema": nodefault})
    assert call(registry, "PUT", f"/config/{s}", {"compatibility": "NONE"})[0] == 200
    register(registry, s, nodefault)
    assert call(registry, "DELETE", f"/config/{s}")[1] == {"compatibilityLevel": "NONE"}
    expect(registry, "GET", f"/config/{s}", 404, 40408)
    assert call(registry, "GET", "/config")[1] == {"compatibilityLevel": "BACKWARD"}


def test_mode(registry):
    s = subject()
    assert call(registry, "GET", "/mode")[1] == {"mode": "READWRITE"}
    expect(registry, "GET", f"/mode/{s}", 404, 40409)
    assert call(registry, "PUT", f"/mode/{s}", {"mode": "READONLY"})[1] == {"mode": "READONLY"}
    expect(registry, "POST", f"/subjects/{s}/versions", 422, 42205, body={"schema": avro(1)})
    expect(registry, "PUT", f"/mode/{s}", 422, 42204, body={"mode": "SOMETIMES"})
    assert call(registry, "DELETE", f"/mode/{s}")[1] == {"mode": "READONLY"}
    register(registry, s, avro(1))


def test_references(registry):
    base = subject()
    register(registry, base, json.dumps({"type": "record", "name": "Address", "namespace": "ref",
                                         "fields": [{"name": "city", "type": "string"}]}))
    user = json.dumps({"type": "record", "name": "User", "namespace": "ref",
                       "fields": [{"name": "home", "type": "ref.Address"}]})
    refs = [{"name": "ref.Address", "subject": base, "version": 1}]
    s = subject()
    sid = register(registry, s, user, references=refs)
    st, b, _ = call(registry, "GET", f"/schemas/ids/{sid}")
    assert b["references"] == refs
    assert call(registry, "GET", f"/subjects/{base}/versions/1/referencedby")[1] == [sid]
    expect(registry, "DELETE", f"/subjects/{base}/versions/1", 422, 42206)
    expect(registry, "DELETE", f"/subjects/{base}", 422, 42206)
    # without the reference the type is unknown
    expect(registry, "POST", f"/subjects/{subject()}/versions", 422, 42201, body={"schema": user})


def test_restart_serves_the_same_ids_and_versions(broker, registry):
    subjects = [subject() for _ in range(3)]
    ids = {s: [register(registry, s, avro(n, name="Rs")) for n in (1, 2)] for s in subjects}
    call(registry, "DELETE", f"/subjects/{subjects[0]}/versions/1")
    call(registry, "PUT", f"/config/{subjects[1]}", {"compatibility": "FORWARD"})

    def snapshot(r):
        out = {}
        for s in subjects:
            out[s] = (call(r, "GET", f"/subjects/{s}/versions?deleted=true")[1],
                      [call(r, "GET", f"/subjects/{s}/versions/{v}?deleted=true")[1] for v in (1, 2)],
                      call(r, "GET", f"/config/{s}?defaultToGlobal=true")[1])
        return out

    before = snapshot(registry)
    second = SchemaRegistryProcess(broker.bootstrap).start()
    try:
        assert snapshot(second) == before
        assert [b["id"] for b in before[subjects[2]][1]] == ids[subjects[2]]
        # a second instance restarted on the same topic continues the id sequence
        new_id = register(second, subject(), avro(9, name="Fresh"))
        assert new_id > max(max(v) for v in ids.values())
    finally:
        assert second.terminate() == 0
        second.__exit__(None, None, None)


def test_import_mode_keeps_given_ids_and_versions(registry):
    s = subject()
    expect(registry, "POST", f"/subjects/{s}/versions", 422, 42205, body={"schema": avro(1), "id": 5000})
    assert call(registry, "PUT", f"/mode/{s}", {"mode": "IMPORT"})[1] == {"mode": "IMPORT"}
    st, b, _ = call(registry, "POST", f"/subjects/{s}/versions", {"schema": avro(1), "id": 5000, "version": 3})
    assert (st, b) == (200, {"id": 5000})
    assert call(registry, "GET", f"/subjects/{s}/versions/3")[1]["id"] == 5000
    # no compatibility check on import; a taken id must hold the same schema
    incompatible = json.dumps({"type": "record", "name": "R", "fields": [{"name": "f0", "type": "string"}]})
    assert call(registry, "POST", f"/subjects/{s}/versions", {"schema": incompatible, "id": 5001})[0] == 200
    expect(registry, "POST", f"/subjects/{s}/versions", 422, 42207, body={"schema": avro(2), "id": 5000})
    assert call(registry, "DELETE", f"/mode/{s}")[0] == 200
    # back in READWRITE, ids continue after the imported ones
    other = subject()
    assert register(registry, other, avro(7, name="AfterImport")) > 5001


def test_subject_names_with_reserved_characters(client):
    from confluent_kafka.schema_registry import Schema

    s = "ns/topic name:value-ü" + uuid.uuid4().hex[:4]
    sid = client.register_schema(s, Schema(avro(1, name="Odd"), "AVRO"))
    assert client.get_latest_version(s).schema_id == sid
    assert s in client.get_subjects()
    assert client.delete_subject(s) == [1]


def test_protobuf_text_references(registry):
    """A .proto importing another subject's file: its types resolve through the reference,
    a changed field type is caught, and the serialized form loads in a descriptor pool with
    the reference added first (what ProtobufDeserializer does)."""
    import base64

    from google.protobuf import descriptor_pb2, descriptor_pool

    money = 'syntax = "proto3";\npackage shop;\nmessage Money { int64 cents = 1; }\nenum Unit { U = 0; }'
    base = subject()
    assert register(registry, base, money, schemaType="PROTOBUF")
    order = ('syntax = "proto3";\npackage shop;\nimport "shop/money.proto";\n'
             'message Order { Money price = 1; Unit unit = 2; }')
    refs = [{"name": "shop/money.proto", "subject": base, "version": 1}]
    s = subject()
    sid = register(registry, s, order, schemaType="PROTOBUF", references=refs)
    changed = order.replace("Money price = 1", "string price = 1")
    st, b, _ = call(registry, "POST", f"/compatibility/subjects/{s}/versions/latest?verbose=true",
                    {"schema": changed, "schemaType": "PROTOBUF", "references": refs})
    assert st == 200 and b["is_compatible"] is False
    assert any("FIELD_KIND_CHANGED" in m for m in b["messages"]), b
    # the enum from the referenced file is known as an enum: int32 is wire-compatible with it
    to_int = order.replace("Unit unit = 2", "int32 unit = 2")
    st, b, _ = call(registry, "POST", f"/compatibility/subjects/{s}/versions/latest",
                    {"schema": to_int, "schemaType": "PROTOBUF", "references": refs})
    assert b == {"is_compatible": True}
    pool = descriptor_pool.DescriptorPool()
    for path, name in ((f"/subjects/{base}/versions/1?format=serialized", "shop/money.proto"),
                       (f"/schemas/ids/{sid}?format=serialized", "shop/order.proto")):
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(call(registry, "GET", path)[1]["schema"]))
        fdp.name = name
        pool.Add(fdp)
    assert pool.FindMessageTypeByName("shop.Order").fields_by_name["price"].message_type.full_name == "shop.Money"

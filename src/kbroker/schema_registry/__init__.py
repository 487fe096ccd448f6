"""A Confluent-compatible Schema Registry stored in a kbroker topic.

``kbroker schema-registry --bootstrap-servers HOST:PORT --listeners http://HOST:PORT``
serves Confluent Schema Registry's REST API (app.py) for AVRO, JSON and PROTOBUF schemas
(formats/), with Confluent's compatibility levels (compatibility.py). The state lives in
the compacted ``_schemas`` topic (store.py, state.py) and is rebuilt from it at start-up.

Limit: one instance writes. Several instances may serve reads from one cluster, but
leader election and write forwarding (Confluent's ``schema-registry`` group) are not
implemented: run a single instance for writes.
"""

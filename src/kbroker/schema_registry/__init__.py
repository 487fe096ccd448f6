"""A Confluent-compatible Schema Registry stored in a kbroker topic.

``kbroker schema-registry --bootstrap-servers HOST:PORT --listeners http://HOST:PORT``
serves Confluent Schema Registry's REST API (app.py) for AVRO, JSON and PROTOBUF schemas
(formats/), with Confluent's compatibility levels (compatibility.py). The state lives in
the compacted ``_schemas`` topic (store.py, state.py) and is rebuilt from it at start-up.

Several instances may run against one cluster: they elect one writer through a
consumer group (leader.py) and forward writes to it; all of them serve reads.
"""

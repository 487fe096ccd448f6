"""SSL and SASL on a KRaft cluster's listeners: the controllers' quorum traffic and the
brokers' requests to the controllers over a SASL_SSL controller listener (PLAIN, with
``sasl.mechanism.controller.protocol``), and clients on a broker's SSL listener; the
inter-broker listener stays PLAINTEXT. A controller with a wrong password is refused."""
from __future__ import annotations

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import KRaftControllerQuorum, free_port
from tests.cluster.test_kraft_cluster import FAST, _brokers, _wait
from tests.security.certs import TestPKI

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret";')


def test_sasl_ssl_controller_listener_and_an_ssl_client_listener(tmp_path):
    (tmp_path / "pki").mkdir()
    pki = TestPKI(str(tmp_path / "pki"))
    q = KRaftControllerQuorum(str(tmp_path), n=3, brokers=1, overrides={
        **FAST, "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_SSL,SSL:SSL",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"],
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
        "sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.controller.protocol": "PLAIN",
        "sasl.jaas.config": JAAS})
    ssl_port = free_port()
    b = q.procs[4]
    b.overrides["listeners"] += f",SSL://127.0.0.1:{ssl_port}"
    b.overrides["advertised.listeners"] += f",SSL://127.0.0.1:{ssl_port}"
    try:
        q.start()
        port = q.broker_ports[4]
        # registered and unfenced: the broker reached the active controller over SASL_SSL,
        # which was elected over SASL_SSL
        _wait(lambda: _brokers(port) == [4], timeout_s=40, what="broker 4 registered and unfenced")
        ssl_client = {"bootstrap.servers": f"127.0.0.1:{ssl_port}", "security.protocol": "SSL",
                      "ssl.ca.location": pki.ca_file}
        admin = AdminClient(ssl_client)
        admin.create_topics([NewTopic("secure", num_partitions=1, replication_factor=1)],
                            operation_timeout=10)["secure"].result(timeout=30)
        p = Producer(ssl_client)
        for i in range(10):
            p.produce("secure", str(i).encode())
        assert p.flush(30) == 0
        c = Consumer({**ssl_client, "group.id": "g", "auto.offset.reset": "earliest"})
        c.subscribe(["secure"])
        got = []
        _wait(lambda: (lambda m: m is not None and not m.error() and got.append(m.value()))(c.poll(0.5)) or
              len(got) >= 10, timeout_s=30, what="10 records over SSL")
        c.close()
        assert got == [str(i).encode() for i in range(10)]
        logs = "".join(q.procs[i].read_log() for i in (1, 2, 3))
        assert "leader of epoch" in logs
        # a controller whose password is wrong cannot take part: the others refuse it
        q.procs[3].kill()
        q.procs[3].overrides["sasl.jaas.config"] = JAAS.replace('password="admin-secret"', 'password="wrong"')
        q.procs[3].start()
        _wait(lambda: "failed authentication with 127.0.0.1" in q.procs[1].read_log() + q.procs[2].read_log(),
              timeout_s=30, what="the wrong password refused")
        admin.create_topics([NewTopic("still", num_partitions=1, replication_factor=1)],
                            operation_timeout=10)["still"].result(timeout=30)
    finally:
        q.stop()

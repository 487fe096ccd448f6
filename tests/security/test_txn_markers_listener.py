"""A zero-config broker whose first listener is SSL: the transaction coordinator's markers,
which it sends to itself, go to its PLAINTEXT listener (inter.broker.listener.name's
default), not to the first one without TLS (where they failed and a committed
transaction never became visible to read_committed consumers)."""
from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from kbroker.testing import KBrokerProcess, free_port


def test_markers_to_itself_use_the_inter_broker_listener(pki):
    proc = KBrokerProcess(overrides={"num.partitions": 1, "transaction.state.log.num.partitions": 1,
                                     "group.initial.rebalance.delay.ms": 0})
    proc.overrides.update({"listeners": f"SSL://127.0.0.1:{free_port()},PLAINTEXT://127.0.0.1:{proc.port}",
                           "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL",
                           "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"]})
    proc.start()
    try:
        bootstrap = f"127.0.0.1:{proc.port}"
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "ssl-first"})
        p.init_transactions(20)
        p.begin_transaction()
        p.produce("ssl-first", b"committed")
        p.commit_transaction(20)
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "isolation.level": "read_committed"})
        c.assign([TopicPartition("ssl-first", 0, 0)])
        got = []
        deadline = time.monotonic() + 15
        try:
            while not got and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    got.append(m.value())
        finally:
            c.close()
        assert got == [b"committed"]
    finally:
        assert proc.terminate() == 0, proc.read_log()[-3000:]

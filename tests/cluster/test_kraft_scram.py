"""SCRAM credentials in the KRaft metadata log, with real processes: 1 controller + 3 brokers,
each broker with a SASL_PLAINTEXT client listener (SCRAM-SHA-512 / SCRAM-SHA-256) beside its
PLAINTEXT one, small snapshot settings so the metadata snapshots hold the credentials.

- a user created at format time (``kbroker storage format --add-scram``) authenticates with
  confluent-kafka on every broker before any AlterUserScramCredentials;
- AlterUserScramCredentials sent to one broker is forwarded to the controller and the user
  authenticates on another broker; a deletion takes effect everywhere; ``kbroker configs
  --entity-type users`` does both against the cluster;
- the credentials are in the controller's snapshot and survive a whole-cluster restart.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion, UserScramCredentialUpsertion,
)

from kbroker.protocol import ErrorCode
from kbroker.testing import KRaftControllerQuorum, free_port
from tests.cluster.test_kraft_cluster import FAST, _brokers, _wait

BROKERS = (2, 3, 4)
OVERRIDES = {**FAST, "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL:SASL_PLAINTEXT",
             "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
             "connection.failed.authentication.delay.ms": 10,
             "metadata.log.max.record.bytes.between.snapshots": 1024, "metadata.log.max.snapshot.interval.ms": 200}
SNAP = re.compile(r"(\d{20})-(\d{10})\.checkpoint$")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = str(tmp_path_factory.mktemp("kraft-scram"))
    q = KRaftControllerQuorum(base, n=1, brokers=3, overrides=OVERRIDES,
                              format_args=["--add-scram", "SCRAM-SHA-512=[name=alice,password=alice-secret]",
                                           "--add-scram", "SCRAM-SHA-256=[name=alice,iterations=8192,password=a256]"])
    q.base = base
    q.sasl_ports = {}
    for i in BROKERS:
        port = q.sasl_ports[i] = free_port()
        q.procs[i].overrides["listeners"] += f",SASL://127.0.0.1:{port}"
        q.procs[i].overrides["advertised.listeners"] += f",SASL://127.0.0.1:{port}"
    try:
        _each(q.start, q.procs)
        _wait(lambda: all(_brokers(q.broker_ports[i]) == list(BROKERS) for i in BROKERS), timeout_s=30,
              what="3 brokers unfenced")
        yield q
    finally:
        q.stop()


def _authenticates(q, node, user, password, mechanism="SCRAM-SHA-512") -> bool:
    """True when a confluent-kafka client on broker ``node``'s SASL listener logs in and reads
    metadata; False when the broker refuses the credentials (anything else fails the test)."""
    errors = []
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{q.sasl_ports[node]}", "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
                         "error_cb": errors.append, "log_level": 0, "reconnect.backoff.ms": 5000})
    deadline = time.monotonic() + 10
    ok = None
    while ok is None:
        try:
            admin.list_topics(timeout=0.3)
            ok = True
        except KafkaException:
            admin.poll(0)              # serves error_cb
            if any(e.code() == KafkaError._AUTHENTICATION for e in errors):
                ok = False
            elif time.monotonic() > deadline:
                raise AssertionError(f"neither in nor refused on broker {node}: {errors}") from None
    del admin                          # destroyed here: no reconnects in the background
    return ok


def _admin(q, node):
    return AdminClient({"bootstrap.servers": f"127.0.0.1:{q.broker_ports[node]}"})


def _described(q, node, user):
    """{mechanism: iterations} broker ``node`` describes for ``user`` ({} when it has none)."""
    admin = _admin(q, node)
    try:
        d = admin.describe_user_scram_credentials([user])[user].result(timeout=10)
    except KafkaException as e:
        if e.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND:
            return {}
        raise
    return {i.mechanism: i.iterations for i in d.scram_credential_infos}


def test_a_user_added_at_format_time_authenticates_on_every_broker(cluster):
    q = cluster
    for node in BROKERS:
        assert _authenticates(q, node, "alice", "alice-secret")
        assert _authenticates(q, node, "alice", "a256", "SCRAM-SHA-256")
        assert not _authenticates(q, node, "alice", "wrong")
        assert not _authenticates(q, node, "nobody", "alice-secret")
    assert _described(q, 3, "alice") == {ScramMechanism.SCRAM_SHA_256: 8192, ScramMechanism.SCRAM_SHA_512: 4096}


def test_alter_through_one_broker_authenticates_on_another_and_deletion_takes_effect(cluster):
    q = cluster
    a2 = _admin(q, 2)
    up = UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"bob-secret")
    for f in a2.alter_user_scram_credentials([up]).values():
        f.result(timeout=15)
    _wait(lambda: _authenticates(q, 4, "bob", "bob-secret"), what="bob authenticates on broker 4")
    _wait(lambda: _described(q, 3, "bob") == {ScramMechanism.SCRAM_SHA_512: 4096}, what="bob described by broker 3")
    # the controller's rules: the same user twice in one request
    twice = [UserScramCredentialUpsertion("erin", ScramCredentialInfo(m, 4096), b"x")
             for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)]
    with pytest.raises(KafkaException) as e:
        for f in a2.alter_user_scram_credentials(twice).values():
            f.result(timeout=15)
    assert e.value.args[0].code() == ErrorCode.DUPLICATE_RESOURCE
    # deletion through broker 3: refused on every broker once each replayed it
    a3 = _admin(q, 3)
    for f in a3.alter_user_scram_credentials([UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_512)]).values():
        f.result(timeout=15)
    for node in BROKERS:
        _wait(lambda: not _authenticates(q, node, "bob", "bob-secret"), what=f"bob refused on broker {node}")
    with pytest.raises(KafkaException) as e:
        for f in a2.alter_user_scram_credentials(
                [UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_512)]).values():
            f.result(timeout=15)
    assert e.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND


def _configs(q, node, *args):
    return subprocess.run([sys.executable, "-m", "kbroker", "configs", "--bootstrap-server",
                           f"127.0.0.1:{q.broker_ports[node]}", "--entity-type", "users", *args],
                          capture_output=True, text=True, timeout=60)


def test_kbroker_configs_alters_and_deletes_credentials_on_the_cluster(cluster):
    q = cluster
    r = _configs(q, 2, "--alter", "--entity-name", "dave", "--add-config",
                 "SCRAM-SHA-256=[iterations=8192,password=dave-256],SCRAM-SHA-512=[password=dave-512]")
    assert r.returncode == 0, r.stderr
    assert "Completed updating config for user dave." in r.stdout
    _wait(lambda: _authenticates(q, 4, "dave", "dave-512"), what="dave authenticates on broker 4")
    assert _authenticates(q, 4, "dave", "dave-256", "SCRAM-SHA-256")
    _wait(lambda: "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096" in
          _configs(q, 3, "--describe", "--entity-name", "dave").stdout, what="dave described by broker 3")
    r = _configs(q, 3, "--alter", "--entity-name", "dave", "--delete-config", "SCRAM-SHA-512")
    assert r.returncode == 0, r.stderr
    _wait(lambda: not _authenticates(q, 2, "dave", "dave-512"), what="dave's SCRAM-SHA-512 deleted")
    assert _authenticates(q, 2, "dave", "dave-256", "SCRAM-SHA-256")


def _each(fn, items):
    """``fn(item)`` for every item at once (process starts and stops), re-raising the first error."""
    with ThreadPoolExecutor(len(items)) as pool:
        for f in [pool.submit(fn, i) for i in items]:
            f.result()


def _snapshots(base, node):
    out = []
    for path in glob.glob(os.path.join(base, f"c{node}", "**", "__cluster_metadata-0", "*.checkpoint"),
                          recursive=True):
        m = SNAP.search(path)
        if m and int(m.group(1)) > 0:
            out.append((int(m.group(1)), path))
    return sorted(out)


def _snapshot_users(path):
    """The (user, mechanism) pairs of a snapshot; empty if it is gone (a newer snapshot
    came between the listing and the read, and the node deleted this one)."""
    from kbroker.metadata import records as R
    from kbroker.metadata.snapshot import decode_snapshot
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return set()
    return {(r.message.name, r.message.mechanism) for r in decode_snapshot(data)
            if isinstance(r.message, R.UserScramCredentialRecord)}


def test_credentials_are_kept_in_snapshots_and_survive_a_whole_cluster_restart(cluster):
    q = cluster
    up = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                      b"carol-secret")
    a4 = _admin(q, 4)
    for f in a4.alter_user_scram_credentials([up]).values():
        f.result(timeout=15)
    # a node snapshots at a commit 200 ms after its last snapshot: commit (carol's SCRAM-SHA-256)
    # until the controller's and broker 2's newest snapshots hold every credential
    want = {("alice", 1), ("alice", 2), ("carol", 1), ("carol", 2)}
    deadline = time.monotonic() + 30
    while not all((s := _snapshots(q.base, n)) and want <= _snapshot_users(s[-1][1]) for n in (1, 2)):
        assert time.monotonic() < deadline, "no snapshot holding the credentials within 30s"
        time.sleep(0.3)
        up = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                          b"carol-256")
        for f in a4.alter_user_scram_credentials([up]).values():
            f.result(timeout=15)
    _each(lambda i: q.procs[i].terminate(), BROKERS)      # controlled shutdowns, the controller still up
    q.procs[1].terminate()
    _each(lambda i: q.procs[i].start(), q.procs)
    for node in BROKERS:
        _wait(lambda: _authenticates(q, node, "carol", "carol-secret"), timeout_s=30,
              what=f"carol authenticates on broker {node} after the restart")
        assert _authenticates(q, node, "alice", "alice-secret")


def test_brokers_reach_a_scram_controller_listener_with_a_format_time_user(tmp_path):
    """The controller's SASL listener authenticates SCRAM users from its committed metadata
    (Kafka's ControllerServer runs a ScramPublisher too): a broker with
    sasl.mechanism.controller.protocol=SCRAM-SHA-512 and the user given to --add-scram
    registers and is unfenced; one with a wrong password never is."""
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" '
            'password="admin-secret";')
    q = KRaftControllerQuorum(str(tmp_path), n=1, brokers=2, overrides={
        **FAST, "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512", "sasl.mechanism.controller.protocol": "SCRAM-SHA-512",
        "sasl.jaas.config": jaas, "connection.failed.authentication.delay.ms": 10},
        format_args=["--add-scram", "SCRAM-SHA-512=[name=admin,password=admin-secret]"])
    q.procs[3].overrides["sasl.jaas.config"] = jaas.replace("admin-secret", "wrong")
    try:
        _each(q.start, (1, 2, 3))
        _wait(lambda: _brokers(q.broker_ports[2]) == [2], timeout_s=30, what="broker 2 registered and unfenced")
        _wait(lambda: "failed authentication" in q.procs[1].read_log(), what="broker 3's wrong password refused")
        assert _brokers(q.broker_ports[2]) == [2]
    finally:
        q.stop()

"""A broker with one listener per security protocol, certificates made here (``cryptography``).

Listeners: PLAINTEXT (admin), SSL (server auth), MTLS (SSL, ssl.client.auth=required, through the
listener.name.mtls.* overrides), SASL_SSL (PLAIN from JAAS, SCRAM-SHA-256/512) and SASL_PLAINTEXT
(SCRAM-SHA-256/512, PLAIN), REAUTH (SASL_PLAINTEXT with a session lifetime, KIP-368, and OAUTHBEARER with unsecured JWTs). A small failed-authentication delay and sasl.server.max.receive.size
keep the bad-input tests short.
"""
from __future__ import annotations

import pytest

from kbroker.testing import KBrokerProcess, free_port
from tests.security.certs import TestPKI

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
SCRAM_USERS = {"carol": "carol-secret", "dave": "dave-secret"}
FAILED_AUTH_DELAY_MS = 20
MAX_RECEIVE = 8192
#: session lifetime on the REAUTH listener. librdkafka re-authenticates at 90% of it, so the
#: slack for a loaded machine's timer delay is a tenth of it (150 ms was missed once under a
#: load average of 15).
REAUTH_MS = 5000


@pytest.fixture(scope="package")
def pki(tmp_path_factory):
    return TestPKI(str(tmp_path_factory.mktemp("pki")))


class SecureBroker:
    def __init__(self, proc: KBrokerProcess, ports: dict[str, int], pki: TestPKI):
        self.proc, self.ports, self.pki = proc, ports, pki

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"


@pytest.fixture(scope="package")
def secure_broker(pki):
    ports = {"PLAINTEXT": None, "SSL": free_port(), "MTLS": free_port(), "SASL_SSL": free_port(),
             "SASL_PLAINTEXT": free_port(), "REAUTH": free_port()}
    proc = KBrokerProcess(overrides={"num.partitions": 1, "group.initial.rebalance.delay.ms": 0})
    ports["PLAINTEXT"] = proc.port
    proc.overrides.update({
        "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL,SASL_SSL:SASL_SSL,"
                                          "SASL_PLAINTEXT:SASL_PLAINTEXT,REAUTH:SASL_PLAINTEXT",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": pki.server["keystore"],
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.truststore.type": "PEM",
        "listener.name.mtls.ssl.truststore.location": pki.ca_file,
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "sasl.jaas.config": JAAS,
        "connection.failed.authentication.delay.ms": FAILED_AUTH_DELAY_MS,
        "sasl.server.max.receive.size": MAX_RECEIVE,
        "listener.name.reauth.connections.max.reauth.ms": REAUTH_MS,
        "listener.name.reauth.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,OAUTHBEARER",
        "listener.name.reauth.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            "unsecuredValidatorAllowableClockSkewMs=\"1000\";",
    })
    proc.start()
    from kbroker.security import scram
    from kbroker.protocol import ApiKey
    from kbroker.protocol.messages import alter_user_scram_credentials as auc
    from tests.broker.raw_client import RawClient
    with RawClient(proc.port) as c:
        ups = []
        for user, pw in SCRAM_USERS.items():
            for mech, (_, mtype) in scram.MECHANISMS.items():
                salt = b"salt-" + user.encode()
                ups.append(auc.ScramCredentialUpsertion(
                    name=user, mechanism=mtype, iterations=4096, salt=salt,
                    salted_password=scram.salted_password(mech, pw, salt, 4096)))
        r = c.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0,
                   auc.AlterUserScramCredentialsRequest(deletions=[], upsertions=ups))
        assert [x.error_code for x in r.results] == [0] * len(SCRAM_USERS), r
    yield SecureBroker(proc, ports, pki)
    rc = proc.terminate()
    log = proc.read_log()
    proc.__exit__(None, None, None)
    assert rc == 0, f"broker exited with {rc}; log tail:\n{log[-4000:]}"
    assert "Traceback" not in log, log[-6000:]

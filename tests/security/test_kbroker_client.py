"""kbroker's own client (and so its operator tools) over SSL, mutual TLS and SASL."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kbroker.client import errors as E
from kbroker.client.admin import Admin
from tests.security.conftest import SCRAM_USERS

JAAS = ('org.apache.kafka.common.security.{m}.{cls} required username="{u}" password="{p}";')


def _settings(secure_broker, listener: str, mechanism: str | None = None, user: str = "carol",
              password: str | None = None, cert: dict | None = None) -> dict:
    conf = {"bootstrap.servers": secure_broker.bootstrap(listener), "security.protocol":
            {"MTLS": "SSL"}.get(listener, listener), "default.api.timeout.ms": 10000}
    if "SSL" in conf["security.protocol"]:
        conf.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": secure_broker.pki.ca_file})
    if cert:
        conf["ssl.keystore.location"] = cert["keystore"]
    if mechanism:
        module = ("plain", "PlainLoginModule") if mechanism == "PLAIN" else ("scram", "ScramLoginModule")
        pw = password or SCRAM_USERS.get(user) or f"{user}-secret"
        conf.update({"sasl.mechanism": mechanism,
                     "sasl.jaas.config": JAAS.format(m=module[0], cls=module[1], u=user, p=pw)})
    return conf


@pytest.mark.parametrize("listener,mechanism,user", [
    ("SSL", None, None), ("SASL_SSL", "SCRAM-SHA-512", "carol"), ("SASL_SSL", "PLAIN", "alice"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256", "dave")])
def test_admin_over_secure_listeners(secure_broker, listener, mechanism, user):
    with Admin(_settings(secure_broker, listener, mechanism, user or "carol")) as a:
        d = a.describe_cluster()
        assert [b.port for b in d.brokers] == [secure_broker.ports[listener]]


def test_admin_over_mutual_tls(secure_broker, pki):
    with Admin(_settings(secure_broker, "MTLS", cert=pki.issue("admin-tool"))) as a:
        assert a.describe_cluster().brokers
    with Admin({**_settings(secure_broker, "MTLS"), "default.api.timeout.ms": 3000}) as a:
        with pytest.raises(E.KafkaError):                 # no client certificate
            a.describe_cluster()


def test_admin_with_a_wrong_password_fails(secure_broker):
    with Admin({**_settings(secure_broker, "SASL_PLAINTEXT", "SCRAM-SHA-512", "carol", password="nope"),
                "default.api.timeout.ms": 3000}) as a:
        with pytest.raises(E.KafkaError):
            a.describe_cluster()


def test_configs_tool_over_sasl_ssl(secure_broker, tmp_path):
    props = tmp_path / "admin.properties"
    conf = _settings(secure_broker, "SASL_SSL", "SCRAM-SHA-512", "carol")
    props.write_text("".join(f"{k}={v}\n" for k, v in conf.items() if k != "bootstrap.servers"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(root, "src"),
                                                                   os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "kbroker", "configs", "--bootstrap-server", conf["bootstrap.servers"],
                        "--command-config", str(props), "--alter", "--entity-type", "users", "--entity-name", "erin",
                        "--add-config", "SCRAM-SHA-256=[password=erin-secret]"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    with Admin(_settings(secure_broker, "SASL_PLAINTEXT", "SCRAM-SHA-256", "erin", "erin-secret")) as a:
        assert a.describe_cluster().brokers                # the new user authenticates

"""Units of kbroker.security: SCRAM against RFC 7677's example, PLAIN, JAAS, principal mapping,
the kafka-configs credential syntax, TLS settings."""
from __future__ import annotations

import base64

import pytest

from kbroker.config_def import ConfigError
from kbroker.security import scram
from kbroker.security.credentials import InMemoryScramCredentials
from kbroker.security.jaas import parse_jaas, plain_users
from kbroker.security.sasl import (
    COMPLETE, FAILED, ChannelSession, PlainServer, SaslAuthenticationError, SaslListenerConfig, ScramServer,
)
from kbroker.security.tls import SslPrincipalMapper, build_server_context, ssl_principal, subject_dn
from kbroker.server.config import KafkaConfig


def test_scram_sha_256_rfc7677_example(monkeypatch):
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = scram.make_credential("SCRAM-SHA-256", "pencil", 4096, salt)
    server = ScramServer("SCRAM-SHA-256", lambda u, m: cred if u == "user" else None, b"k")
    monkeypatch.setattr("kbroker.security.sasl.server_nonce", lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first = server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                            b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.authorization_id == "user"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_unknown_user_and_wrong_password_look_alike(mechanism):
    from tests.security.scram_client import ScramClient

    store = InMemoryScramCredentials({"u": {mechanism: scram.make_credential(mechanism, "pw")}})
    cfg = SaslListenerConfig([mechanism], scram_credentials=store)
    outcomes = []
    for user, pw in (("u", "pw"), ("u", "bad"), ("ghost", "pw")):
        s = ChannelSession("SASL_PLAINTEXT", "L", cfg)
        assert s.handshake(mechanism, raw_tokens=False)
        c = ScramClient(mechanism, user, pw)
        server_first = s.evaluate(c.first())
        assert server_first.startswith(b"r=" + c.nonce.encode())
        try:
            c.verify(s.evaluate(c.final(server_first)))
            outcomes.append((s.state, s.principal))
        except SaslAuthenticationError:
            outcomes.append((s.state, s.close_delay_ms))
    assert outcomes == [(COMPLETE, "User:u"), (FAILED, 100), (FAILED, 100)]
    # the same made-up salt for an unknown user every time
    firsts = []
    for _ in range(2):
        s = ChannelSession("SASL_PLAINTEXT", "L", cfg)
        s.handshake(mechanism, False)
        firsts.append(s.evaluate(b"n,,n=ghost,r=abc").split(b",", 1)[1])
    assert firsts[0] == firsts[1]


def test_scram_accepts_old_librdkafka_nonce_but_not_a_wrong_one():
    from tests.security.scram_client import ScramClient

    cred = scram.make_credential("SCRAM-SHA-512", "pw")
    ok = ScramClient("SCRAM-SHA-512", "u", "pw", old_librdkafka=True)
    server = ScramServer("SCRAM-SHA-512", lambda u, m: cred, b"k")
    ok.verify(server.evaluate(ok.final(server.evaluate(ok.first()))))
    bad = ScramClient("SCRAM-SHA-512", "u", "pw")
    server = ScramServer("SCRAM-SHA-512", lambda u, m: cred, b"k")
    final = bad.final(server.evaluate(bad.first())).decode()
    without, proof = final.split(",p=")
    tampered = without[:-1] + ("0" if without[-1] != "0" else "1") + ",p=" + proof   # server nonce changed
    with pytest.raises(SaslAuthenticationError, match="nonce"):
        server.evaluate(tampered.encode())


def test_scram_refuses_tokenauth_and_malformed_messages():
    cred = scram.make_credential("SCRAM-SHA-256", "pw")
    for token in (b"n,,n=u,r=abc,tokenauth=true", b"p=tls-unique,,n=u,r=abc", b"garbage", b"n,a=other,n=u,r=abc",
                  b"n,,n=u=x,r=abc"):
        with pytest.raises(SaslAuthenticationError):
            ScramServer("SCRAM-SHA-256", lambda u, m: cred, b"k").evaluate(token)
    # other extensions are ignored, as Kafka does
    assert ScramServer("SCRAM-SHA-256", lambda u, m: cred, b"k").evaluate(b"n,,n=u,r=abc,ext=1").startswith(b"r=abc")


def test_plain():
    users = {"alice": "s3cret"}
    assert PlainServer(users).evaluate(b"\0alice\0s3cret") == b""
    assert PlainServer(users).evaluate(b"alice\0alice\0s3cret") == b""
    for token in (b"\0alice\0wrong", b"\0bob\0s3cret", b"bob\0alice\0s3cret", b"\0alice", b"\0\0s3cret"):
        with pytest.raises(SaslAuthenticationError):
            PlainServer(users).evaluate(token)


def test_jaas():
    text = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
            'password="a\\"b" user_admin="a\\"b" user_alice=alice-secret;')
    (m,) = parse_jaas(text)
    assert m.flag == "required" and m.options["password"] == 'a"b'
    assert plain_users(text) == {"admin": 'a"b', "alice": "alice-secret"}
    for bad in ("org.Foo required a=1", "org.Foo maybe a=1;", "org.Foo required a;", ""):
        with pytest.raises(ValueError):
            parse_jaas(bad)


def test_principal_mapping():
    cert = {"subject": ((("countryName", "US"),), (("organizationName", "kbroker"),),
                        (("organizationalUnitName", "apps"),), (("commonName", "App, Client"),))}
    assert subject_dn(cert) == "CN=App\\, Client,OU=apps,O=kbroker,C=US"
    assert ssl_principal(cert, SslPrincipalMapper("DEFAULT")) == "User:CN=App\\, Client,OU=apps,O=kbroker,C=US"
    assert ssl_principal({}, SslPrincipalMapper("DEFAULT")) == "User:ANONYMOUS"
    m = SslPrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=([a-z]*) (.*?),OU=(.*)$/$1@$3/U,DEFAULT")
    assert m.name("CN=kafka,OU=ServiceUsers,O=Org") == "kafka"
    assert m.name("CN=abc def,OU=x") == "ABC@X"
    assert m.name("CN=Other,O=Org") == "CN=Other,O=Org"
    with pytest.raises(ValueError):
        SslPrincipalMapper("RULE:broken")


def test_credential_spec():
    assert scram.parse_credential_spec("[iterations=8192,password=alice-secret]") == {
        "iterations": "8192", "password": "alice-secret"}
    assert scram.parse_credential_spec("[password=a,b=c]") == {"password": "a,b=c"}
    with pytest.raises(ValueError):
        scram.parse_credential_spec("[iterations=8192]")


def test_tls_settings_name_the_key(tmp_path):
    from tests.security.certs import TestPKI

    pki = TestPKI(str(tmp_path))
    ok = {"ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"]}
    ctx = build_server_context(ok)
    assert ctx.minimum_version.name == "TLSv1_2"
    inline = {"ssl.keystore.type": "PEM", "ssl.keystore.key": pki.server["key_pem"],
              "ssl.keystore.certificate.chain": pki.server["cert_pem"], "ssl.client.auth": "required",
              "ssl.truststore.type": "PEM", "ssl.truststore.certificates": pki.ca_pem.decode(),
              "ssl.enabled.protocols": ["TLSv1.3"], "ssl.cipher.suites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]}
    assert build_server_context(inline).minimum_version.name == "TLSv1_3"
    enc = pki.issue("enc", server=True, key_password=b"kp")
    build_server_context({"ssl.keystore.type": "PEM", "ssl.keystore.location": enc["keystore"],
                          "ssl.key.password": "kp"})
    base = {"listeners": "PLAINTEXT://127.0.0.1:0,SECURE://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SECURE:SSL"}
    cases = [
        ({}, "ssl.keystore.location"),
        ({"ssl.keystore.location": pki.server["keystore"]}, "ssl.keystore.type"),
        ({**ok, "ssl.keystore.password": "x"}, "ssl.keystore.password"),
        ({**ok, "listener.name.secure.ssl.client.auth": "sometimes"}, "listener.name.secure.ssl.client.auth"),
        ({**ok, "ssl.enabled.protocols": "SSLv3"}, "ssl.enabled.protocols"),
        ({**ok, "ssl.cipher.suites": "NO_SUCH_SUITE"}, "ssl.cipher.suites"),
        ({"ssl.keystore.type": "PEM", "listener.name.secure.ssl.keystore.location": str(tmp_path / "none.pem")},
         "listener.name.secure.ssl.keystore.location"),
        ({**ok, "ssl.principal.mapping.rules": "RULE:x"}, "ssl.principal.mapping.rules"),
        ({"ssl.keystore.type": "PEM", "ssl.keystore.location": enc["keystore"], "ssl.key.password": "wrong"},
         "ssl.keystore.location"),
    ]
    for props, key in cases:
        with pytest.raises(ConfigError) as e:
            KafkaConfig({**base, **props})
        assert e.value.key == key, (props, str(e.value))
        assert "\n" not in str(e.value)
    c = KafkaConfig({**base, **ok})
    assert c.listener_security["SECURE"].ssl_context is not None
    assert c.listener_security["PLAINTEXT"].ssl_context is None


def test_metadata_store_keeps_scram_credentials(tmp_path):
    from kbroker.server.metadata import MetadataStore

    store = MetadataStore(str(tmp_path))
    c256 = scram.make_credential("SCRAM-SHA-256", "pw", 4096)
    c512 = scram.make_credential("SCRAM-SHA-512", "pw", 8192)
    store.alter_scram_credentials({("alice", "SCRAM-SHA-256"): c256, ("alice", "SCRAM-SHA-512"): c512,
                                   ("bob", "SCRAM-SHA-256"): c256}, [])
    store.alter_scram_credentials({}, [("bob", "SCRAM-SHA-256")])
    again = MetadataStore(str(tmp_path))
    assert again.scram_credential("alice", "SCRAM-SHA-512") == c512
    assert again.scram_credential("bob", "SCRAM-SHA-256") is None
    assert set(again.scram_credentials()) == {"alice"}
    text = (tmp_path / "__cluster_metadata.json").read_text()
    assert "stored_key" in text and "salted" not in text


def test_oauthbearer_unsecured_validation():
    import json
    import time as _time

    from kbroker.security.oauthbearer import OAuthBearerUnsecuredServer
    from tests.security.test_reauth import _jwt

    now = int(_time.time())

    def run(token, options=None):
        s = OAuthBearerUnsecuredServer(options or {})
        out = s.evaluate(f"n,,\x01auth=Bearer {token}\x01\x01".encode())
        return s, out

    s, out = run(_jwt({"sub": "alice", "exp": now + 30, "scope": "read kafka"}),
                 {"unsecuredValidatorRequiredScope": "kafka"})
    assert out == b"" and s.complete and s.authorization_id == "alice" and s.expiry_ms == (now + 30) * 1000
    s, out = run(_jwt({"sub": "alice", "exp": now + 30, "scope": "read"}), {"unsecuredValidatorRequiredScope": "kafka"})
    assert json.loads(out) == {"status": "invalid_token"} and not s.complete
    with pytest.raises(SaslAuthenticationError):
        s.evaluate(b"\x01")
    s, out = run(_jwt({"user": "carol", "exp": now + 30}), {"unsecuredValidatorPrincipalClaimName": "user"})
    assert s.authorization_id == "carol"
    s, out = run(_jwt({"sub": "alice", "exp": now - 1}), {"unsecuredValidatorAllowableClockSkewMs": "5000"})
    assert s.complete                                  # within the allowed skew
    s, out = run(_jwt({"sub": "alice", "exp": now + 30, "iat": now + 120}))
    assert not s.complete                              # issued in the future


def test_oauthbearer_token_expiry_caps_the_session_lifetime():
    import time as _time

    from tests.security.test_reauth import _jwt

    cfg = SaslListenerConfig(["OAUTHBEARER"], max_reauth_ms=3_600_000)
    s = ChannelSession("SASL_PLAINTEXT", "L", cfg)
    assert s.handshake("OAUTHBEARER", False)
    token = _jwt({"sub": "alice", "exp": int(_time.time()) + 20})
    assert s.evaluate(f"n,,\x01auth=Bearer {token}\x01\x01".encode()) == b""
    assert s.principal == "User:alice" and 15_000 <= s.session_lifetime_ms <= 20_000


def test_sasl_ssl_takes_client_auth_only_from_its_listener_prefix(tmp_path):
    """KIP-684: the broker-wide ssl.client.auth applies to SSL listeners, not SASL_SSL ones."""
    import ssl

    from tests.security.certs import TestPKI

    pki = TestPKI(str(tmp_path))
    base = {"listeners": "A://127.0.0.1:0,B://127.0.0.1:0,C://127.0.0.1:0",
            "listener.security.protocol.map": "A:SSL,B:SASL_SSL,C:SASL_SSL",
            "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.server["keystore"],
            "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
            "ssl.client.auth": "required", "sasl.enabled.mechanisms": "SCRAM-SHA-256",
            "listener.name.c.ssl.client.auth": "requested"}
    sec = KafkaConfig(base).listener_security
    assert sec["A"].ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert sec["B"].ssl_context.verify_mode == ssl.CERT_NONE
    assert sec["C"].ssl_context.verify_mode == ssl.CERT_OPTIONAL

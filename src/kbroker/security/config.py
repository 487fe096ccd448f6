"""The broker's security settings: Kafka's ``ssl.*`` / ``sasl.*`` keys, their per-listener
overrides, and each listener's :class:`ListenerSecurity`.

Per-listener overrides are Kafka's: ``listener.name.<listener>.<key>`` for any key of
:data:`SECURITY_KEYS` (``listener.name.ssl.ssl.keystore.location``), and
``listener.name.<listener>.<mechanism>.sasl.jaas.config`` (mechanism in lower case,
``listener.name.sasl_ssl.plain.sasl.jaas.config``). A listener's setting is its override, else
the broker-wide key. The listener name in a key is matched case-insensitively.
"""
from __future__ import annotations

import dataclasses
import ssl
from typing import Any, Callable, Mapping, Optional

from kbroker.config_def import ConfigError
from kbroker.security.jaas import OAUTHBEARER_LOGIN_MODULE, parse_jaas, plain_users
from kbroker.security.sasl import SUPPORTED_MECHANISMS, SaslListenerConfig
from kbroker.security.tls import SslPrincipalMapper, TlsConfigError, build_server_context

#: (key, type, default, doc): the security block of the broker config (Kafka's names and defaults)
SECURITY_KEYS = (
    ("ssl.keystore.type", "string", "JKS", "Only PEM is supported."),
    ("ssl.keystore.location", "string", None, "PEM file with the private key and its certificate chain."),
    ("ssl.keystore.password", "password", None, "Not used with PEM (Kafka refuses it too)."),
    ("ssl.keystore.key", "password", None, "Inline PEM private key (with ssl.keystore.certificate.chain)."),
    ("ssl.keystore.certificate.chain", "password", None, "Inline PEM certificate chain."),
    ("ssl.key.password", "password", None, "Password of an encrypted private key."),
    ("ssl.truststore.type", "string", "JKS", "Only PEM is supported."),
    ("ssl.truststore.location", "string", None, "PEM file of trusted CA certificates."),
    ("ssl.truststore.password", "password", None, "Not used with PEM."),
    ("ssl.truststore.certificates", "password", None, "Inline PEM trusted certificates."),
    ("ssl.client.auth", "string", "none", "none, requested or required."),
    ("ssl.enabled.protocols", "list", ["TLSv1.2", "TLSv1.3"], "TLS versions accepted."),
    ("ssl.protocol", "string", "TLSv1.3", "Accepted for compatibility; ssl.enabled.protocols decides."),
    ("ssl.cipher.suites", "list", [], "IANA or OpenSSL names of TLS 1.2 suites; empty: OpenSSL's defaults."),
    ("ssl.endpoint.identification.algorithm", "string", "https", "Client side only; accepted."),
    ("ssl.principal.mapping.rules", "string", "DEFAULT", "Kafka's RULE:pattern/replacement/[LU] list."),
    ("ssl.keymanager.algorithm", "string", "SunX509", "Java only; accepted."),
    ("ssl.trustmanager.algorithm", "string", "PKIX", "Java only; accepted."),
    ("sasl.enabled.mechanisms", "list", ["GSSAPI"], "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (unsecured JWTs)."),
    ("sasl.mechanism.inter.broker.protocol", "string", "GSSAPI",
     "SASL mechanism a KRaft broker uses on the inter-broker listener (single node: no inter-broker traffic)."),
    ("sasl.mechanism.controller.protocol", "string", "GSSAPI",
     "SASL mechanism KRaft nodes use to reach the controllers on a SASL controller listener."),
    ("sasl.jaas.config", "password", None, "Kafka's JAAS text (PlainLoginModule user_<name>=\"...\")."),
    ("sasl.server.max.receive.size", "int", 524288, "Largest frame before authentication completes."),
    ("connection.failed.authentication.delay.ms", "int", 100, "Close delay after a failed authentication."),
    ("connections.max.reauth.ms", "long", 0, "Session lifetime of a SASL connection (0: none; KIP-368)."),
    ("principal.builder.class", "string", None, "Only the default principal builder."),
)
_KEY_NAMES = frozenset(k for k, *_ in SECURITY_KEYS)
_LISTENER_PREFIX = "listener.name."
#: non-security keys a listener may override too (Kafka's ListenerConnectionQuota)
LISTENER_NETWORK_KEYS = frozenset({"max.connection.creation.rate"})


#: a bad security setting: Kafka's one-line "key: message" ConfigError
SecurityConfigError = ConfigError


def split_listener_overrides(props: Mapping[str, Any], parse_key: Callable[[str, Any], Any]
                             ) -> tuple[dict, dict[str, dict[str, Any]]]:
    """``props`` without its ``listener.name.<listener>.<key>`` entries, and those entries as
    {LISTENER: {key: typed value}}; ``parse_key(key, raw)`` types and checks a value. An
    override of a key that is not a security key is an error naming it."""
    rest, overrides = {}, {}
    for k, v in props.items():
        if not k.startswith(_LISTENER_PREFIX):
            rest[k] = v
            continue
        listener, sep, key = k[len(_LISTENER_PREFIX):].partition(".")
        if not sep or not listener:
            raise SecurityConfigError(k, "unknown configuration key")
        mech, sep2, tail = key.partition(".")
        if key in _KEY_NAMES or key in LISTENER_NETWORK_KEYS:
            value = parse_key(key, v)
        elif sep2 and tail == "sasl.jaas.config":
            value = None if v is None else str(v).strip()
            key = f"{mech.lower()}.sasl.jaas.config"
        else:
            raise SecurityConfigError(k, "unknown configuration key (per-listener overrides are for ssl.* and "
                                      "sasl.* keys, <mechanism>.sasl.jaas.config and "
                                      "max.connection.creation.rate)")
        overrides.setdefault(listener.upper(), {})[key] = value
    return rest, overrides


@dataclasses.dataclass
class ListenerSecurity:
    """What a listener's connections need: its protocol, a server SSLContext (SSL, SASL_SSL),
    the certificate principal mapper, and SASL settings (SASL_PLAINTEXT, SASL_SSL)."""

    protocol: str = "PLAINTEXT"
    ssl_context: Optional[ssl.SSLContext] = None
    principal_mapper: Optional[SslPrincipalMapper] = None
    sasl: Optional[SaslListenerConfig] = None

    @property
    def is_plaintext(self) -> bool:
        return self.protocol == "PLAINTEXT"


def build_listener_security(name: str, protocol: str, values: Mapping[str, Any],
                            overrides: Mapping[str, Any]) -> ListenerSecurity:
    """The ListenerSecurity of listener ``name``; SecurityConfigError naming the (prefixed) key
    that is missing or wrong."""
    prefix = f"{_LISTENER_PREFIX}{name.lower()}."

    def get(key):
        return overrides[key] if key in overrides else values.get(key)

    def key_name(key):
        return prefix + key if key in overrides else key

    sec = ListenerSecurity(protocol)
    if protocol in ("SSL", "SASL_SSL"):
        settings = {k: get(k) for k in _KEY_NAMES if k.startswith("ssl.")}
        if protocol == "SASL_SSL":
            # KIP-684: a SASL_SSL listener asks for client certificates only when its own
            # listener.name.<l>.ssl.client.auth says so; the broker-wide key is for SSL listeners
            settings["ssl.client.auth"] = overrides.get("ssl.client.auth") or "none"
        try:
            sec.ssl_context = build_server_context(settings)
        except TlsConfigError as e:
            raise SecurityConfigError(key_name(e.key),
                                      str(e).split(": ", 1)[1]) from None
        try:
            sec.principal_mapper = SslPrincipalMapper(get("ssl.principal.mapping.rules"))
        except ValueError as e:
            raise SecurityConfigError(key_name("ssl.principal.mapping.rules"), str(e)) from None
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanisms = [m.strip().upper() for m in get("sasl.enabled.mechanisms") or []]
        if not mechanisms:
            raise SecurityConfigError(key_name("sasl.enabled.mechanisms"),
                                      f"listener {name} is {protocol} but no SASL mechanism is enabled")
        for m in mechanisms:
            if m not in SUPPORTED_MECHANISMS:
                raise SecurityConfigError(key_name("sasl.enabled.mechanisms"),
                                          f"mechanism {m} is not supported (supported: {', '.join(SUPPORTED_MECHANISMS)})")
        users = {}
        if "PLAIN" in mechanisms:
            jaas_key = "plain.sasl.jaas.config"
            text, where = ((overrides[jaas_key], prefix + jaas_key) if overrides.get(jaas_key)
                           else (get("sasl.jaas.config"), key_name("sasl.jaas.config")))
            if not text:
                raise SecurityConfigError(prefix + jaas_key, f"listener {name} enables PLAIN but has no JAAS "
                                          "configuration (PlainLoginModule with user_<name>=\"<password>\" entries)")
            try:
                users = plain_users(text)
            except ValueError as e:
                raise SecurityConfigError(where, f"invalid JAAS configuration: {e}") from None
        oauth = {}
        if "OAUTHBEARER" in mechanisms:
            jaas_key = "oauthbearer.sasl.jaas.config"
            text = overrides.get(jaas_key) or get("sasl.jaas.config")
            if text:
                try:
                    oauth = {k: v for m in parse_jaas(text) if m.class_name == OAUTHBEARER_LOGIN_MODULE
                             for k, v in m.options.items()}
                except ValueError as e:
                    raise SecurityConfigError(prefix + jaas_key if overrides.get(jaas_key) else "sasl.jaas.config",
                                              f"invalid JAAS configuration: {e}") from None
        sec.sasl = SaslListenerConfig(
            mechanisms, users, None, oauthbearer_options=oauth,
            max_receive_size=get("sasl.server.max.receive.size"),
            failed_authentication_delay_ms=get("connection.failed.authentication.delay.ms"),
            max_reauth_ms=get("connections.max.reauth.ms") or 0)
    if get("principal.builder.class"):
        raise SecurityConfigError(key_name("principal.builder.class"), "only the default principal builder is supported")
    return sec

"""TLS for a listener: Kafka's ``ssl.*`` settings -> ``ssl.SSLContext``, and the principal of a peer.

Kafka's names, PEM only (Kafka's ``DefaultSslEngineFactory`` with ``ssl.keystore.type=PEM``,
KIP-651): the key store is a PEM file with the private key and its certificate chain
(``ssl.keystore.location``) or the same inline (``ssl.keystore.key`` +
``ssl.keystore.certificate.chain``); ``ssl.key.password`` decrypts an encrypted key. The trust
store is a PEM file of CA certificates (``ssl.truststore.location``) or inline
(``ssl.truststore.certificates``). JKS and PKCS12 stores are refused with a message naming the key.

``ssl.enabled.protocols`` sets the context's minimum and maximum TLS version; ``ssl.cipher.suites``
takes IANA names as Kafka does (``TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256``) or OpenSSL names; TLS 1.3
suites (``TLS_AES_128_GCM_SHA256`` ...) are accepted but Python 3.11 cannot restrict them
(``SSL_CTX_set_ciphersuites`` is not exposed), so they stay OpenSSL's default set.

Principals: Kafka's ``DefaultKafkaPrincipalBuilder`` for SSL: ``User:ANONYMOUS`` without a client
certificate, else ``User:`` + ``ssl.principal.mapping.rules`` applied to the certificate's subject
in RFC 2253 form (Java's ``X500Principal.getName()``: last RDN first, ``CN=client,O=Org,C=US``).
"""
from __future__ import annotations

import os
import re
import ssl
import tempfile
from typing import Callable, Mapping, Optional

ANONYMOUS = "User:ANONYMOUS"

_TLS_VERSIONS = {
    "TLSv1": ssl.TLSVersion.TLSv1, "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}

#: OpenSSL's long attribute names -> the RFC 2253 keywords Java prints
_RDN_KEYWORDS = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
    "domainComponent": "DC", "userId": "UID", "emailAddress": "EMAILADDRESS",
}


class TlsConfigError(ValueError):
    """A bad ``ssl.*`` setting; ``key`` names it (with its listener prefix, if any)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


def _iana_to_openssl(name: str) -> Optional[str]:
    """``TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`` -> ``ECDHE-RSA-AES128-GCM-SHA256``; None for a
    TLS 1.3 suite (no ``_WITH_``); an OpenSSL name is returned as it is."""
    if not name.startswith("TLS_"):
        return name
    kx, sep, rest = name[4:].partition("_WITH_")
    if not sep:
        return None                     # TLS 1.3: TLS_AES_128_GCM_SHA256
    kx = {"RSA": ""}.get(kx, kx.replace("_", "-"))
    m = re.fullmatch(r"(AES)_(128|256)_(GCM|CBC|CCM)_(SHA\d*)|(CHACHA20_POLY1305)_SHA256", rest)
    if m is None:
        return name.replace("_", "-")
    if m.group(5):
        cipher = "CHACHA20-POLY1305"
    elif m.group(3) == "CBC":
        cipher = f"AES{m.group(2)}-{m.group(4)}"
    else:
        cipher = f"AES{m.group(2)}-{m.group(3)}" + ("-" + m.group(4) if m.group(3) == "GCM" else "")
    return f"{kx}-{cipher}" if kx else cipher


def build_server_context(settings: Mapping[str, object], key_prefix: str = "") -> ssl.SSLContext:
    """An ``SSLContext`` for the server side of a listener from its effective ``ssl.*`` settings
    (Kafka key -> value; values already typed: lists for list keys). ``key_prefix`` is put before
    a key in error messages (``listener.name.ssl.``)."""
    def get(key, default=None):
        v = settings.get(key)
        return default if v is None or v == "" else v

    def err(key, message):
        return TlsConfigError(key_prefix + key, message)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.options |= ssl.OP_NO_COMPRESSION | getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    # No session tickets: a ticket is written after the handshake, and nothing resumes them.
    try:
        ctx.num_tickets = 0
    except (AttributeError, ValueError):
        pass
    # -- protocols
    enabled = get("ssl.enabled.protocols", ["TLSv1.2", "TLSv1.3"])
    versions = []
    for p in enabled:
        if p not in _TLS_VERSIONS:
            raise err("ssl.enabled.protocols", f"unknown protocol {p!r} (expected TLSv1.2, TLSv1.3)")
        versions.append(_TLS_VERSIONS[p])
    try:
        ctx.minimum_version = min(versions)
        ctx.maximum_version = max(versions)
    except ValueError as e:
        raise err("ssl.enabled.protocols", f"not supported by this OpenSSL: {e}") from None
    # -- cipher suites
    suites = get("ssl.cipher.suites", [])
    if suites:
        names = [n for n in (_iana_to_openssl(s) for s in suites) if n]
        if names:
            try:
                ctx.set_ciphers(":".join(names))
            except ssl.SSLError:
                raise err("ssl.cipher.suites", f"no cipher suite of {','.join(suites)} is available") from None
    # -- key store
    ks_type = str(get("ssl.keystore.type", "JKS")).upper()
    location = get("ssl.keystore.location")
    chain = get("ssl.keystore.certificate.chain")
    key = get("ssl.keystore.key")
    key_password = get("ssl.key.password")
    if location is None and chain is None and key is None:
        raise err("ssl.keystore.location", "an SSL listener needs a key store (ssl.keystore.type=PEM with "
                  "ssl.keystore.location, or ssl.keystore.certificate.chain and ssl.keystore.key)")
    if ks_type != "PEM":
        raise err("ssl.keystore.type", f"{ks_type} key stores are not supported; use PEM")
    if get("ssl.keystore.password") is not None:
        raise err("ssl.keystore.password", "SSL key store password cannot be specified with PEM format, "
                  "only key password may be specified (ssl.key.password)")
    if location is not None and (chain is not None or key is not None):
        raise err("ssl.keystore.location", "give either a key store file or ssl.keystore.certificate.chain "
                  "and ssl.keystore.key, not both")
    try:
        if location is not None:
            ctx.load_cert_chain(str(location), password=_password(key_password))
        else:
            if chain is None or key is None:
                missing = "ssl.keystore.key" if key is None else "ssl.keystore.certificate.chain"
                raise err(missing, "required with inline PEM key store settings")
            _load_inline_cert_chain(ctx, str(chain), str(key), key_password)
    except TlsConfigError:
        raise
    except (OSError, ssl.SSLError, ValueError) as e:
        what = "ssl.keystore.location" if location is not None else "ssl.keystore.key"
        raise err(what, f"cannot load the key store: {e}") from None
    # -- trust store
    ts_type = str(get("ssl.truststore.type", "JKS")).upper()
    ts_location = get("ssl.truststore.location")
    ts_certs = get("ssl.truststore.certificates")
    if ts_location is not None or ts_certs is not None:
        if ts_type != "PEM":
            raise err("ssl.truststore.type", f"{ts_type} trust stores are not supported; use PEM")
        if get("ssl.truststore.password") is not None:
            raise err("ssl.truststore.password", "SSL trust store password cannot be specified for PEM format")
        try:
            if ts_location is not None:
                ctx.load_verify_locations(cafile=str(ts_location))
            else:
                ctx.load_verify_locations(cadata=str(ts_certs))
        except (OSError, ssl.SSLError, ValueError) as e:
            what = "ssl.truststore.location" if ts_location is not None else "ssl.truststore.certificates"
            raise err(what, f"cannot load the trust store: {e}") from None
    # -- client authentication
    auth = str(get("ssl.client.auth", "none")).lower()
    if auth not in ("none", "requested", "required"):
        raise err("ssl.client.auth", f"invalid value {auth!r}: must be one of none, requested, required")
    if auth != "none":
        if ts_location is None and ts_certs is None:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        ctx.verify_mode = ssl.CERT_REQUIRED if auth == "required" else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _password(password):
    """``load_cert_chain``'s password: without one, OpenSSL would prompt on the terminal for an
    encrypted key; an empty answer makes it fail instead."""
    return str(password) if password else (lambda: b"")


def _load_inline_cert_chain(ctx: ssl.SSLContext, chain: str, key: str, password) -> None:
    """``load_cert_chain`` reads files only: write the PEM text to a private temporary file
    (mode 0600), load it, remove it."""
    fd, path = tempfile.mkstemp(prefix="kbroker-pem-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key.strip() + "\n" + chain.strip() + "\n")
        ctx.load_cert_chain(path, password=_password(password))
    finally:
        os.unlink(path)


# -- principals ------------------------------------------------------------------------------

def _escape_rdn_value(v: str) -> str:
    out = []
    for i, ch in enumerate(v):
        if ch in ',+"\\<>;' or (i == 0 and ch in "# ") or (i == len(v) - 1 and ch == " "):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def subject_dn(peer_cert: Mapping) -> str:
    """RFC 2253 text of a certificate's subject, from ``SSLSocket.getpeercert()``'s dict."""
    rdns = []
    for rdn in reversed(peer_cert.get("subject", ())):
        rdns.append("+".join(f"{_RDN_KEYWORDS.get(k, k)}={_escape_rdn_value(v)}" for k, v in rdn))
    return ",".join(rdns)


_RULE = re.compile(r"\s*(?:(DEFAULT)|RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU])?)\s*(?:,|$)")


class SslPrincipalMapper:
    """Kafka's ``SslPrincipalMapper``: ``ssl.principal.mapping.rules``, a comma-separated list of
    ``DEFAULT`` and ``RULE:pattern/replacement/[L|U]``; the first rule whose pattern matches the
    whole DN gives the name (``$1`` ... are its groups; ``L``/``U`` change the case); ``DEFAULT``
    is the DN itself. No rule matches: the DN itself (Kafka throws; the DN is the safe answer)."""

    def __init__(self, rules: str | list | None = "DEFAULT"):
        if isinstance(rules, (list, tuple)):
            rules = ",".join(rules)
        text = (rules or "DEFAULT").strip()
        self.rules: list[Optional[tuple[re.Pattern, str, str]]] = []
        pos = 0
        while pos < len(text):
            m = _RULE.match(text, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"invalid rule at {text[pos:]!r}")
            pos = m.end()
            if m.group(1):
                self.rules.append(None)
            else:
                pattern = m.group(2).replace("\\/", "/")
                repl = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
                self.rules.append((re.compile(pattern), repl, m.group(4) or ""))

    def name(self, dn: str) -> str:
        for rule in self.rules:
            if rule is None:
                return dn
            pattern, repl, case = rule
            m = pattern.fullmatch(dn)
            if m is not None:
                out = m.expand(repl)
                return out.lower() if case == "L" else out.upper() if case == "U" else out
        return dn


def ssl_principal(peer_cert: Optional[Mapping], mapper: SslPrincipalMapper) -> str:
    """``User:<mapped DN>`` of a verified client certificate, else ``User:ANONYMOUS``."""
    if not peer_cert:
        return ANONYMOUS
    return "User:" + mapper.name(subject_dn(peer_cert))


PrincipalBuilder = Callable[[Optional[Mapping]], str]

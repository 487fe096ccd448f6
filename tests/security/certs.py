"""Test PKI made with ``cryptography``: a CA, a server certificate for 127.0.0.1/localhost and
client certificates, as PEM files (Kafka's ssl.keystore.type=PEM layout: key + chain in one file)."""
from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str, ou: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COUNTRY_NAME, "US"), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kbroker")]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _pem_key(key, password: bytes | None = None) -> bytes:
    enc = (serialization.BestAvailableEncryption(password) if password
           else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


class TestPKI:
    """Files under ``directory``: ca.pem, server.pem (key+chain), client-<cn>.pem, and the
    separate key/cert files clients want."""

    def __init__(self, directory: str):
        self.dir = directory
        now = datetime.datetime.now(datetime.timezone.utc)
        self._not_before, self._not_after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        self.ca_cert = (x509.CertificateBuilder().subject_name(_name("kbroker-test-ca"))
                        .issuer_name(_name("kbroker-test-ca")).public_key(self.ca_key.public_key())
                        .serial_number(x509.random_serial_number())
                        .not_valid_before(self._not_before).not_valid_after(self._not_after)
                        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                     content_commitment=False, key_encipherment=False,
                                                     data_encipherment=False, key_agreement=False,
                                                     encipher_only=False, decipher_only=False), critical=True)
                        .sign(self.ca_key, hashes.SHA256()))
        self.ca_pem = self.ca_cert.public_bytes(serialization.Encoding.PEM)
        self.ca_file = self._write("ca.pem", self.ca_pem)
        self.server = self.issue("localhost", server=True)

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def issue(self, cn: str, server: bool = False, ou: str | None = None, key_password: bytes | None = None,
              client_too: bool = False) -> dict:
        """A certificate for ``cn``; ``server``: for 127.0.0.1/localhost (serverAuth), and with
        ``client_too`` for client authentication as well (a broker's own certificate under
        mutual TLS between brokers)."""
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(_name(cn, ou)).issuer_name(self.ca_cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(self._not_before).not_valid_after(self._not_after)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(
                 [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server and client_too
                 else [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                 critical=False))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = b.sign(self.ca_key, hashes.SHA256())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = _pem_key(key, key_password)
        tag = "server" if server and cn == "localhost" else f"{'server' if server else 'client'}-{cn}"
        return {
            "keystore": self._write(f"{tag}.keystore.pem", key_pem + cert_pem + self.ca_pem),
            "cert": self._write(f"{tag}.cert.pem", cert_pem),
            "key": self._write(f"{tag}.key.pem", key_pem),
            "cert_pem": cert_pem.decode(), "key_pem": key_pem.decode(),
        }

"""Throwaway TLS certificates for the tests: a CA, a server and a client certificate it signs, and
a second, unrelated CA with its own client certificate (for the negative mTLS case)."""
from __future__ import annotations

import datetime
import ipaddress
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    """Paths of PEM files."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str
    """A CA the server does not trust."""
    other_client_cert: str
    """A client certificate signed by ``other_ca``."""
    other_client_key: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "modelinit tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return key, builder.sign(key, hashes.SHA256())


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cn: str, *, server: bool,
          ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: pathlib.Path, cert: x509.Certificate) -> str:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def _write_key(path: pathlib.Path, key: ec.EllipticCurvePrivateKey) -> str:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return str(path)


def make_certs(directory) -> Certs:
    """Write a fresh CA, server and client certificates (EC P-256, valid one day) into ``directory``."""
    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("modelinit test CA")
    server_key, server_cert = _leaf(ca_key, ca_cert, "localhost", server=True)
    client_key, client_cert = _leaf(ca_key, ca_cert, "modelinit test client", server=False)
    other_ca_key, other_ca_cert = _ca("unrelated test CA")
    other_key, other_cert = _leaf(other_ca_key, other_ca_cert, "unrelated test client", server=False)
    return Certs(
        ca=_write_cert(d / "ca.pem", ca_cert),
        server_cert=_write_cert(d / "server.pem", server_cert),
        server_key=_write_key(d / "server.key", server_key),
        client_cert=_write_cert(d / "client.pem", client_cert),
        client_key=_write_key(d / "client.key", client_key),
        other_ca=_write_cert(d / "other-ca.pem", other_ca_cert),
        other_client_cert=_write_cert(d / "other-client.pem", other_cert),
        other_client_key=_write_key(d / "other-client.key", other_key),
    )

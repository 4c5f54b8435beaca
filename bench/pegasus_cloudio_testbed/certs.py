"""Throw-away TLS material for loopback servers: a self-signed CA and a server
certificate for ``127.0.0.1`` / ``localhost`` signed by it."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["TlsFiles", "make_tls_files"]

_VALIDITY = datetime.timedelta(days=30)
_CLOCK_SKEW = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files written by `make_tls_files`.

    Fields:
        ca_cert: the CA certificate; clients verify the server against it.
        cert: the server certificate (SANs: IP 127.0.0.1, DNS localhost).
        key: the server's private key (mode 0600, unencrypted PKCS#8).
    """

    ca_cert: Path
    cert: Path
    key: Path


def make_tls_files(directory: Union[str, "os.PathLike[str]"], dns_names: Sequence[str] = (),
                   ips: Sequence[str] = ("127.0.0.1",)) -> TlsFiles:
    """Create ``ca.crt``, ``server.crt`` and ``server.key`` in ``directory``.

    ``dns_names`` are added to the server certificate's SANs (wildcards such as
    ``*.s3.us-west-2.amazonaws.com`` included), for servers reached under cloud host names.

    The directory is created if needed; existing files of those names are
    replaced. The CA's private key is never written: nothing else can be
    signed with it. The server certificate names ``localhost`` and every address in ``ips``
    (one certificate for several test nodes signed by one "pool" CA). Certificates are valid for 30 days from an hour ago and
    carry the extensions strict verifiers (Python 3.13's VERIFY_X509_STRICT,
    Go's crypto/tls) require.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _server_certificate(server_key, ca_key, ca_cert, dns_names, ips)
    files = TlsFiles(ca_cert=out / "ca.crt", cert=out / "server.crt", key=out / "server.key")
    _write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(files.cert, server_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(files.key, key_pem, 0o600)
    return files


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pegasus-cloudio test CA")])
    public = key.public_key()
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )
    builder = (
        _base_builder(name, name, public)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
    )
    return builder.sign(key, hashes.SHA256())


def _server_certificate(
    key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
    dns_names: Sequence[str] = (), ips: Sequence[str] = ("127.0.0.1",),
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    names = x509.SubjectAlternativeName(
        [*(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips), x509.DNSName("localhost")]
        + [x509.DNSName(name) for name in dns_names]
    )
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
        encipher_only=False, decipher_only=False,
    )
    builder = (
        _base_builder(ca_cert.subject, subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(names, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    return builder.sign(ca_key, hashes.SHA256())


def _base_builder(
    issuer: x509.Name, subject: x509.Name, public: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .issuer_name(issuer)
        .subject_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with exactly ``mode`` (never briefly wider)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)

"""Certificates for local use: a self-signed CA, and server and client certificates it signs.

For a laptop cluster or a test; a production cluster takes its certificates from its own CA.
Keys are ECDSA P-256 and written readable by their owner only.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SERVER_NAMES = ("localhost", "127.0.0.1")
MAX_DAYS = 36_500
FILES = ("ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key")


def make_certificates(
    directory: Path,
    server_names: Sequence[str] = DEFAULT_SERVER_NAMES,
    days: int = 365,
    not_before: datetime.datetime | None = None,
    ca_dir: Path | None = None,
) -> dict[str, Path]:
    """Write a CA and the server and client certificates it signs under ``directory``.

    Args:
        directory: created if missing; existing files are never overwritten.
        server_names: DNS names and IP addresses the server certificate is valid for.
        days: validity of every certificate.
        not_before: start of validity (default: now); tests back-date it to make expired ones.
        ca_dir: sign with the CA already in this directory (its ``ca.pem`` and ``ca.key``)
            instead of a new one; ``ca.pem`` is copied, its key stays where it is.

    Returns:
        Each file written (of :data:`FILES`) by name.

    Raises:
        FileExistsError: one of the files exists already.
        ValueError: days out of 1..MAX_DAYS, or no server name.
    """
    if not 1 <= days <= MAX_DAYS:
        raise ValueError(f"days must be in 1..{MAX_DAYS}, got {days}")
    if not server_names:
        raise ValueError("the server certificate needs at least one name")
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in FILES if not (ca_dir and name == "ca.key")}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing:
        raise FileExistsError(f"will not overwrite {', '.join(existing)}")
    start = not_before or datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=days)
    if ca_dir is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Ember local CA")])
        ca = (
            _builder(ca_name, ca_name, ca_key, start, end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        _write(paths["ca.pem"], paths["ca.key"], ca, ca_key)
    else:
        ca_pem = (ca_dir / "ca.pem").read_bytes()
        ca_name = x509.load_pem_x509_certificate(ca_pem).subject
        ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
        paths["ca.pem"].write_bytes(ca_pem)
    leaves = (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH, _alt_names(server_names)),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH, None),
    )
    for role, usage, alt_names in leaves:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"ember {role}")])
        builder = (
            _builder(name, ca_name, key, start, end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if alt_names is not None:
            builder = builder.add_extension(alt_names, critical=False)
        _write(
            paths[f"{role}.pem"], paths[f"{role}.key"], builder.sign(ca_key, hashes.SHA256()), key
        )
    return paths


def _builder(subject, issuer, key, start, end) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=not cert_sign, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _alt_names(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _write(cert_path: Path, key_path: Path, cert: x509.Certificate, key) -> None:
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(key_bytes)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

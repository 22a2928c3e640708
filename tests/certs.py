"""Throwaway TLS material for tests: a CA of its own and a certificate it signed for 127.0.0.1 (cryptography, which
paramiko brings)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Pair:
    """Where the CA's certificate, the edge's certificate and its key were written."""

    ca: Path
    cert: Path
    key: Path


def _pem_key(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,  # type: ignore[attr-defined]
                             serialization.NoEncryption())


def new_key_pem() -> bytes:
    """A fresh EC private key, PEM: one that belongs to no certificate."""
    from cryptography.hazmat.primitives.asymmetric import ec

    return _pem_key(ec.generate_private_key(ec.SECP256R1()))


def make_pair(root: Path, address: str = "127.0.0.1") -> Pair:
    """A CA and a one-day certificate for `address` (an IP SAN) it signed, under `root`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "primectl test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - day).not_valid_after(now + day)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - day).not_valid_after(now + day)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    root.mkdir(parents=True, exist_ok=True)
    pair = Pair(root / "ca.pem", root / "edge.crt", root / "edge.key")
    pair.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(_pem_key(key))
    pair.key.chmod(0o600)
    return pair

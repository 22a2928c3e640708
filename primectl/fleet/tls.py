"""The edge's TLS certificate and key, checked on the control machine before anything is touched.

The key is read here only to check it and to hash it: the plan carries its SHA-256 and where to read it, and the
bundle reads it again when it is made (`FileSpec.source`), so the key itself never enters a plan, a diff or a log.
With the `cryptography` package (paramiko's own dependency) the check parses both files and compares the key's
public half with the certificate's; without it, it checks the PEM markers only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

CERT_MARK = b"-----BEGIN CERTIFICATE-----"
KEY_MARKS = (b"-----BEGIN PRIVATE KEY-----", b"-----BEGIN RSA PRIVATE KEY-----", b"-----BEGIN EC PRIVATE KEY-----")
ENCRYPTED_MARKS = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")


def _read(path: Path) -> tuple[bytes | None, str | None]:
    if not path.exists():
        return None, f"no such file: {path}"
    if not path.is_file():
        return None, f"{path} is not a file"
    try:
        return path.read_bytes(), None
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"


def check_pair(cert: Path, key: Path) -> dict[str, str]:
    """What is wrong with a certificate and key pair, by field (`cert`, `key`); {} when the edge can serve them."""
    cert_data, cert_problem = _read(cert)
    key_data, key_problem = _read(key)
    problems = {f: p for f, p in (("cert", cert_problem), ("key", key_problem)) if p}
    if cert_data is not None and CERT_MARK not in cert_data:
        problems["cert"] = f"{cert} is not a PEM certificate (no {CERT_MARK.decode()} line)"
    elif cert_data is not None and b"PRIVATE KEY-----" in cert_data:  # the certificate's text goes into the plan
        problems["cert"] = f"{cert} holds a private key too; give the certificate alone here and the key in `key`"
    if key_data is not None:
        if any(m in key_data for m in ENCRYPTED_MARKS):
            problems["key"] = f"{key} is an encrypted key; HAProxy needs it unencrypted (it is shipped mode 0600)"
        elif not any(m in key_data for m in KEY_MARKS):
            problems["key"] = f"{key} is not a PEM private key (no -----BEGIN ... PRIVATE KEY----- line)"
    if problems or cert_data is None or key_data is None:
        return problems
    return _check_parsed(cert, cert_data, key, key_data)


def _check_parsed(cert: Path, cert_data: bytes, key: Path, key_data: bytes) -> dict[str, str]:
    """Both files parsed, and the key the certificate's (only where `cryptography` is installed)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # the PEM markers were checked; HAProxy's own check (`haproxy -c`) does the rest
        return {}
    try:
        leaf = x509.load_pem_x509_certificate(cert_data)
    except ValueError as exc:
        return {"cert": f"{cert} holds no readable certificate: {exc}"}
    try:
        private = serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError) as exc:
        return {"key": f"{key} holds no readable unencrypted private key: {exc}"}
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if private.public_key().public_bytes(der, pub) != leaf.public_key().public_bytes(der, pub):
        return {"key": f"{key} is not the private key of the certificate in {cert} (the first one there)"}
    return {}


def key_digest(key: Path) -> str:
    """What the plan holds of the key: its SHA-256 (a new key changes the edge's files, so the edge reloads)."""
    return "sha256:" + hashlib.sha256(key.read_bytes()).hexdigest()

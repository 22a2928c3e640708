"""primectl's known_hosts: which keys a host may present, and recording a new one (--accept-new-host-keys).

The file has OpenSSH's format: `names keytype base64 [comment]`, where names are plain (`addr`, `[addr]:port`
for a port other than 22) or hashed (`|1|salt|hmac`). It is indexed once per change, by plain name, so that each
of 72 connections reads only its own host's lines (parsing every line for each host is quadratic in the fleet).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from pathlib import Path
from typing import Any

_INDEX: dict[str, tuple[tuple[int, int, int], dict[str, list[str]], list[str]]] = {}
_INDEX_LOCK = threading.Lock()
_APPEND_LOCK = threading.Lock()


def known_hosts_path(known_hosts: str | None) -> str:
    """The known_hosts file a policy names, or the user's own."""
    return os.path.expanduser(known_hosts or "~/.ssh/known_hosts")


def host_entry_name(address: str, port: int) -> str:
    """How known_hosts names a host: its address, bracketed with the port when that is not 22."""
    return address if port == 22 else f"[{address}]:{port}"


def _index(path: str) -> tuple[dict[str, list[str]], list[str]]:
    """known_hosts lines by plain host name, plus the hashed (`|1|`) lines; re-read when the file changes."""
    try:
        st = os.stat(path)
    except OSError:
        return {}, []
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _INDEX_LOCK:
        cached = _INDEX.get(path)
        if cached and cached[0] == stamp:
            return cached[1], cached[2]
        by_name: dict[str, list[str]] = {}
        hashed: list[str] = []
        with open(path) as f:
            for raw in f:
                line = raw.strip()
                if not line or line[0] == "#":
                    continue
                names = line.split(None, 1)[0].split(",")
                for name in dict.fromkeys(names):
                    if name.startswith("|1|"):
                        if line not in hashed[-1:]:
                            hashed.append(line)
                    else:
                        by_name.setdefault(name, []).append(line)
        _INDEX[path] = (stamp, by_name, hashed)
        return by_name, hashed


def _hashed_name_matches(pattern: str, name: str) -> bool:
    """Whether a `|1|salt|hmac` entry name stands for `name` (HMAC-SHA1 of the name, keyed by the salt)."""
    try:
        _, _, salt, digest = pattern.split("|", 3)
        want = base64.b64decode(digest)
        got = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(want, got)


def host_key_blobs(path: str, address: str, port: int) -> dict[str, list[bytes]]:
    """The keys known_hosts accepts for this host, as key type -> the keys' wire blobs (what a server presents).
    Lines that do not parse, and marked lines (@cert-authority, @revoked), accept nothing, as in paramiko."""
    name = host_entry_name(address, port)
    by_name, hashed = _index(path)
    keys: dict[str, list[bytes]] = {}
    for line in [*by_name.get(name, []), *hashed]:
        fields = line.split()
        if len(fields) < 3 or line[0] == "@":
            continue
        names = fields[0].split(",")
        if name not in names and not any(n.startswith("|1|") and _hashed_name_matches(n, name) for n in names):
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except binascii.Error:
            continue
        if blob not in keys.get(fields[1], []):
            keys.setdefault(fields[1], []).append(blob)
    return keys


def host_keys_for(path: str, address: str, port: int) -> Any:
    """This host's known_hosts keys (host_key_blobs) as paramiko's HostKeys, the first of each type, as paramiko's
    own lookup takes them; a key paramiko cannot load is left out."""
    import paramiko

    name = host_entry_name(address, port)
    keys = paramiko.HostKeys()
    for keytype, blobs in host_key_blobs(path, address, port).items():
        try:
            keys.add(name, keytype, paramiko.PKey.from_type_string(keytype, blobs[0]))
        except Exception:  # a type this paramiko does not have (ssh-dss), or a blob that is not that type's
            continue
    return keys


def record_host_key(path: str, name: str, keytype: str, key_base64: str) -> None:
    """Append one host's key to known_hosts (trust on first use). Hosts connect in parallel, each knowing only
    the keys it read: this appends the one entry, and never rewrites the file from one connection's view."""
    file = Path(path)
    with _APPEND_LOCK:
        file.parent.mkdir(parents=True, exist_ok=True)
        sep = "\n" if file.exists() and file.stat().st_size and not file.read_bytes().endswith(b"\n") else ""
        with open(file, "a") as f:
            f.write(f"{sep}{name} {keytype} {key_base64}\n")

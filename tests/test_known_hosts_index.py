"""Each SSH client gets only its own host's known_hosts entries, parsed as paramiko parses them, and libssh2's
connections accept the same keys."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko

from primectl.deploy.known_hosts import host_key_blobs, host_keys_for, record_host_key


def keygen(path: Path) -> paramiko.PKey:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def known_hosts(tmp_path: Path) -> tuple[Path, paramiko.PKey, paramiko.PKey]:
    """A known_hosts file with comments, plain, bracketed, hashed, marked and broken lines; its two keys."""
    k1, k2 = keygen(tmp_path / "k1"), keygen(tmp_path / "k2")
    hashed = paramiko.HostKeys.hash_host("[10.0.0.9]:2222")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"# comment\n\n10.0.0.1 {k1.get_name()} {k1.get_base64()}\n"
                  f"[10.0.0.1]:2200,10.0.0.7 {k2.get_name()} {k2.get_base64()}\n"
                  f"{hashed} {k2.get_name()} {k2.get_base64()}\n"
                  f"@revoked 10.0.0.1 {k2.get_name()} {k2.get_base64()}\n"
                  "10.0.0.1 garbage\n"
                  "10.0.0.1 ssh-ed25519 not!base64\n")
    return kh, k1, k2


def test_plain_bracketed_and_hashed_entries(tmp_path: Path) -> None:
    kh, k1, k2 = known_hosts(tmp_path)
    plain = host_keys_for(str(kh), "10.0.0.1", 22)
    assert plain.check("10.0.0.1", k1) and not plain.check("10.0.0.1", k2)
    assert not plain.check("[10.0.0.1]:2200", k2)  # another host's entry is not there
    assert host_keys_for(str(kh), "10.0.0.1", 2200).check("[10.0.0.1]:2200", k2)
    assert host_keys_for(str(kh), "10.0.0.7", 22).check("10.0.0.7", k2)
    assert host_keys_for(str(kh), "10.0.0.9", 2222).check("[10.0.0.9]:2222", k2)
    assert host_keys_for(str(kh), "10.0.0.9", 2222).lookup("[10.0.0.9]:2222") is not None
    assert host_keys_for(str(kh), "10.0.0.2", 22).lookup("10.0.0.2") is None
    assert host_keys_for(str(tmp_path / "missing"), "10.0.0.1", 22).lookup("10.0.0.1") is None


def test_the_index_follows_the_file(tmp_path: Path) -> None:
    k = keygen(tmp_path / "k")
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    assert host_keys_for(str(kh), "10.0.0.3", 22).lookup("10.0.0.3") is None
    with open(kh, "a") as f:  # what --accept-new-host-keys appends
        f.write(f"10.0.0.3 {k.get_name()} {k.get_base64()}\n")
    assert host_keys_for(str(kh), "10.0.0.3", 22).check("10.0.0.3", k)


def test_host_key_blobs_are_what_paramiko_accepts(tmp_path: Path) -> None:
    """The keys libssh2's connections accept for a host (its wire blobs) are the ones paramiko's would."""
    kh, k1, k2 = known_hosts(tmp_path)
    assert host_key_blobs(str(kh), "10.0.0.1", 22) == {"ssh-ed25519": [k1.asbytes()]}
    assert host_key_blobs(str(kh), "10.0.0.1", 2200) == {"ssh-ed25519": [k2.asbytes()]}
    assert host_key_blobs(str(kh), "10.0.0.7", 22) == {"ssh-ed25519": [k2.asbytes()]}
    assert host_key_blobs(str(kh), "10.0.0.9", 2222) == {"ssh-ed25519": [k2.asbytes()]}
    assert host_key_blobs(str(kh), "10.0.0.9", 22) == {}  # the hashed name is [10.0.0.9]:2222's only
    assert host_key_blobs(str(tmp_path / "missing"), "10.0.0.1", 22) == {}


def test_a_recorded_key_is_appended_on_a_line_of_its_own(tmp_path: Path) -> None:
    k = keygen(tmp_path / "k")
    kh = tmp_path / "ssh" / "known_hosts"
    record_host_key(str(kh), "10.0.0.3", k.get_name(), k.get_base64())  # the directory is made
    kh.write_text(kh.read_text().rstrip("\n"))  # a file edited by hand, without its last newline
    record_host_key(str(kh), "[10.0.0.4]:2222", k.get_name(), k.get_base64())
    assert kh.read_text().splitlines() == [f"10.0.0.3 {k.get_name()} {k.get_base64()}",
                                           f"[10.0.0.4]:2222 {k.get_name()} {k.get_base64()}"]
    assert host_key_blobs(str(kh), "10.0.0.4", 2222) == {"ssh-ed25519": [k.asbytes()]}

"""Which transport reaches a host: local, SSH direct (libssh2 or paramiko), or SSH through its head node.

Here rather than in transport.py, which the transports it chooses among build on.
"""

from __future__ import annotations

import os

from primectl.deploy.access import access
from primectl.deploy.known_hosts import known_hosts_path
from primectl.deploy.libssh2_transport import Libssh2Transport, libssh2_available
from primectl.deploy.transport import LocalTransport, SSHConnection, SSHTransport, Transport
from primectl.deploy.via import ViaTransport, head_links
from primectl.errors import Refused
from primectl.plan.model import HostPlan


def connect(host: HostPlan, *, known_hosts: str | None, accept_new_host_keys: bool, shell: bool = False
            ) -> Transport:
    """Open the right transport for a host: local, SSH, or SSH through its head node (`via`). `shell`: see
    open_ssh."""
    if access(host).connection == "local":
        return LocalTransport(host)
    return open_ssh(host, known_hosts=known_hosts_path(known_hosts), accept_new_host_keys=accept_new_host_keys,
                    shell=shell)


SSH_CLIENT_ENV = "PRIMECTL_SSH_CLIENT"
SSH_CLIENTS = ("libssh2", "paramiko")


def ssh_client() -> str:
    """The client agent calls to directly reached hosts use: `PRIMECTL_SSH_CLIENT`, libssh2 when unset (paramiko
    where ssh2-python is not installed)."""
    raw = os.environ.get(SSH_CLIENT_ENV, "").strip()
    if raw and raw not in SSH_CLIENTS:
        raise Refused(f"{SSH_CLIENT_ENV}={raw!r}: give one of {', '.join(SSH_CLIENTS)} (unset: libssh2)")
    return raw or ("libssh2" if libssh2_available() else "paramiko")


def open_ssh(host: HostPlan, *, known_hosts: str, accept_new_host_keys: bool,
             shell: bool = False) -> SSHConnection:
    """A `connection: ssh` host's connection: through its head node's ssh client when it has `via`, else direct,
    with agent calls on libssh2 (on paramiko with PRIMECTL_SSH_CLIENT=paramiko, or where ssh2-python is not
    installed). `shell`: a connection for shell commands and uploads only (Fabric's, on paramiko)."""
    if access(host).via is not None:
        return ViaTransport(host, head_links(known_hosts, accept_new_host_keys))
    if not shell and ssh_client() == "libssh2":
        return Libssh2Transport(host, known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys)
    return SSHTransport(host, known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys)

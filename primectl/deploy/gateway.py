"""Hosts reached through another host of the recipe (`via:`, a rack's head node).

The controller holds one SSH connection to the head node. For each host behind it, a channel on that connection
runs the head node's own OpenSSH client to the host, and that client starts the host's agent: the handshake with
the host is the head node's work, not the controller's, which only moves the agent's JSON lines. Four racks cost
the controller four handshakes, not 72.

Trust is unchanged: the host's key is checked against primectl's known_hosts (the matching lines travel on the
head node's command line as `KnownHostsCommand`, nothing is written there), with strict checking; a key not in
known_hosts is refused, since the head node cannot record one for primectl. The head node's user logs in with
its own keys (as in most racks: root on the head node reaches every tray), or with `via_identity_file`. The key
exchange is curve25519, the one primectl's own connections make (OpenSSH's post-quantum default costs a head node
~90 ms of CPU per host). The head node's ssh configuration applies where these options leave it room.
"""

from __future__ import annotations

import posixpath
import shlex
import threading
from typing import Any

from primectl.deploy.transport import HostUnreachable, OnProgress, SSHTransport, host_keys_for
from primectl.plan.model import HostPlan

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null",
               "-o", "KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org", "-o", "ConnectTimeout=10",
               "-o", "ServerAliveInterval=15", "-o", "LogLevel=ERROR")


class Gateways:
    """The head-node connections of one command, shared by every host reached through each (opened on first
    use, closed when the last of its hosts closes)."""

    def __init__(self, known_hosts: str, accept_new_host_keys: bool):
        self.known_hosts = known_hosts
        self.accept_new = accept_new_host_keys
        self._lock = threading.Lock()
        self._open: dict[str, tuple[threading.Lock, list[Any]]] = {}  # head name -> (gate, [transport, users])

    def acquire(self, head: HostPlan) -> SSHTransport:
        """The connection to `head`, opened now if it is not open (HostUnreachable when it cannot be)."""
        with self._lock:
            gate, slot = self._open.setdefault(head.name, (threading.Lock(), [None, 0]))
        with gate:
            if slot[0] is None or not slot[0].alive():
                slot[0] = SSHTransport(head, known_hosts=self.known_hosts, accept_new_host_keys=self.accept_new)
            slot[1] += 1
            return slot[0]  # type: ignore[no-any-return]

    def release(self, head: HostPlan) -> None:
        """One host behind `head` is done with it; the last one closes the connection."""
        with self._lock:
            gate, slot = self._open[head.name]
        with gate:
            slot[1] -= 1
            if slot[1] <= 0 and slot[0] is not None:
                slot[0].close()
                slot[0] = None


class ViaTransport(SSHTransport):
    """`via:` hosts: agent calls, shell commands and uploads run through the head node's `ssh` client."""

    def __init__(self, host: HostPlan, gateways: Gateways):
        assert host.via is not None
        self.host, self.head, self._gateways = host, host.via, gateways
        self._agent = None
        self._agent_lock = threading.Lock()
        self._fabric = None
        self._sftp = None
        self._prefix = self._ssh_prefix(gateways)
        try:
            self.gateway = gateways.acquire(host.via)
        except HostUnreachable as exc:
            raise HostUnreachable(f"{host.name} ({host.address}:{host.port}) through {host.via.name}: {exc}") from None
        self.client = self.gateway.client
        self._released = False

    def _ssh_prefix(self, gateways: Gateways) -> str:
        """`ssh <options> <host>` as the head node runs it, with this host's known keys on its command line."""
        h = self.host
        name = h.address if h.port == 22 else f"[{h.address}]:{h.port}"
        keys = host_keys_for(gateways.known_hosts, h.address, h.port).lookup(name) or {}
        if not keys:
            hint = (" (through a head node primectl cannot learn a key: add it first, e.g. `ssh-keyscan` run on "
                    f"{h.via.name if h.via else 'the head node'})") if gateways.accept_new else ""
            raise HostUnreachable(f"{h.name} ({h.address}:{h.port}): unknown host key (not in {gateways.known_hosts})"
                                  f"; verify it and add it{hint}")
        # printf's \n between lines: ssh splits this option's value into words itself, quotes but no newlines
        lines = "".join(f"{name} {k.get_name()} {k.get_base64()}\\n" for k in keys.values())
        identity = ["-i", h.via_identity_file, "-o", "IdentitiesOnly=yes"] if h.via_identity_file else []
        argv = ["ssh", *SSH_OPTIONS, *identity, "-o", f"KnownHostsCommand=/usr/bin/printf '{lines}'",
                "-p", str(h.port), "-l", h.user, h.address, "--"]
        return " ".join(shlex.quote(a) for a in argv)

    def command(self, command: str) -> str:
        """`command` as the head node runs it: through its ssh client to this host."""
        return f"{self._prefix} {shlex.quote(command)}"

    def agent(self, op: str, args: dict[str, Any], timeout: float | None,
              on_progress: OnProgress | None = None) -> dict[str, Any]:
        """One agent call; a host the head node cannot reach is unreachable, with what its ssh client said."""
        try:
            return super().agent(op, args, timeout, on_progress)
        except HostUnreachable as exc:
            text = str(exc).split("the host agent did not start: ", 1)
            if len(text) == 2:
                raise HostUnreachable(f"{self.host.name} ({self.host.address}:{self.host.port}) through "
                                      f"{self.head.name}: {text[1]}") from None
            raise

    def alive(self) -> bool:
        """Whether the head node's connection and this host's agent session are still up."""
        return not self._released and super().alive()

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write a file on the host through the head node (its parent directory is created)."""
        tmp = f"{path}.partial"
        script = (f"mkdir -p {shlex.quote(posixpath.dirname(path))} && cat > {shlex.quote(tmp)} && "
                  f"chmod {mode:o} {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}")
        try:
            chan = self.client.get_transport().open_session()
            chan.set_combine_stderr(True)
            chan.exec_command(self.command(script))
            chan.sendall(data)
            chan.shutdown_write()
            said = b"".join(iter(lambda: chan.recv(65536), b""))
            code = chan.recv_exit_status()
            chan.close()
        except Exception as exc:
            raise HostUnreachable(f"{self.host.name}: upload of {path} failed: {type(exc).__name__}: {exc}") from None
        if code != 0:
            raise HostUnreachable(f"{self.host.name}: upload of {path} through {self.head.name} failed (exit {code}): "
                                  f"{said.decode(errors='replace').strip()[-500:]}")

    def close(self) -> None:
        """Close this host's agent session; the head node's connection stays for the others behind it."""
        self._close_agent()
        if not self._released:
            self._released = True
            self._gateways.release(self.head)


_GATEWAYS: dict[tuple[str, bool], Gateways] = {}
_GATEWAYS_LOCK = threading.Lock()


def gateways(known_hosts: str, accept_new_host_keys: bool) -> Gateways:
    """This process's head-node connections for one host-key policy."""
    with _GATEWAYS_LOCK:
        return _GATEWAYS.setdefault((known_hosts, accept_new_host_keys), Gateways(known_hosts, accept_new_host_keys))

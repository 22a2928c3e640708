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
import time
from dataclasses import dataclass, field
from typing import Any

from primectl.deploy.access import access
from primectl.deploy.known_hosts import host_entry_name, host_keys_for
from primectl.deploy.transport import (
    KEEPALIVE_INTERVAL_S,
    KEEPALIVE_PROBES,
    ChannelStream,
    HostUnreachable,
    OnProgress,
    SSHTransport,
    peer_silent,
)
from primectl.plan.model import HostPlan

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null",
               "-o", "KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org", "-o", "ConnectTimeout=10",
               "-o", f"ServerAliveInterval={KEEPALIVE_INTERVAL_S}", "-o", f"ServerAliveCountMax={KEEPALIVE_PROBES}",
               "-o", "LogLevel=ERROR")
# sshd serves at most MaxSessions (10 by default) sessions on one connection: each host behind a head keeps an
# agent session, so one connection carries at most 8 hosts, and 2 sessions are left for uploads and commands.
SESSIONS_PER_LINK = 10
HOSTS_PER_LINK = 8
FAILED_HEAD_S = 30.0  # a head that could not be reached is not tried again for this long by the same process

HeadKey = tuple[str, int, str, str | None]


def head_key(head: HostPlan) -> HeadKey:
    """Who a head connection is to and as whom: a long-lived process (the connection keeper) serves recipes
    that may give different heads one name, or change a head's address or login."""
    a = access(head)
    return head.address, a.port, a.user, a.identity_file


@dataclass
class Link:
    """One SSH connection to a head node: the hosts it carries, and its free sessions."""

    transport: SSHTransport
    hosts: int = 0
    sessions: threading.BoundedSemaphore = field(default_factory=lambda: threading.BoundedSemaphore(SESSIONS_PER_LINK))


class HeadLinks:
    """The head-node connections of one process, shared by the hosts reached through each: opened when first
    needed, up to HOSTS_PER_LINK hosts a connection, each closed when the last of its hosts closes."""

    def __init__(self, known_hosts: str, accept_new_host_keys: bool):
        self.known_hosts = known_hosts
        self.accept_new = accept_new_host_keys
        self._lock = threading.Lock()
        self._gates: dict[HeadKey, threading.Lock] = {}
        self._links: dict[HeadKey, list[Link]] = {}
        self._failed: dict[HeadKey, tuple[float, str]] = {}  # (when, why) a head's connection failed

    def acquire(self, head: HostPlan) -> Link:
        """A connection to `head` with room for one more host (HostUnreachable when it cannot be reached; a
        failure is remembered for FAILED_HEAD_S, so the hosts behind a dead head fail at once, not in turn)."""
        key = head_key(head)
        with self._lock:
            gate = self._gates.setdefault(key, threading.Lock())
        with gate:
            links = self._links.setdefault(key, [])
            links[:] = [link for link in links if link.hosts > 0 and link.transport.alive()]
            link = next((link for link in links if link.hosts < HOSTS_PER_LINK), None)
            if link is None:
                failed = self._failed.get(key)
                if failed and time.monotonic() - failed[0] < FAILED_HEAD_S:
                    raise HostUnreachable(failed[1])
                try:
                    link = Link(SSHTransport(head, known_hosts=self.known_hosts, accept_new_host_keys=self.accept_new))
                except HostUnreachable as exc:
                    self._failed[key] = (time.monotonic(), str(exc))
                    raise
                self._failed.pop(key, None)
                links.append(link)
            link.hosts += 1
            return link

    def forget_failures(self) -> None:
        """Try every head again from now on (the connection keeper, between commands: a head found down by one
        command may be up for the next)."""
        with self._lock:
            self._failed.clear()

    def release(self, head: HostPlan, link: Link) -> None:
        """One host is done with `link`; the last one closes it."""
        with self._gates[head_key(head)]:
            link.hosts -= 1
            if link.hosts <= 0:
                link.transport.close()


class ViaTransport(SSHTransport):
    """`via:` hosts: agent calls, shell commands and uploads run through the head node's `ssh` client."""

    def __init__(self, host: HostPlan, heads: HeadLinks):
        self.access = a = access(host)
        assert a.via is not None
        self.host, self.head, self._heads = host, a.via, heads
        self._agent = None
        self._agent_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._fabric = None
        self._sftp = None
        self._prefix = self._ssh_prefix(heads)
        try:
            self.link = heads.acquire(a.via)
        except HostUnreachable as exc:
            raise HostUnreachable(f"{host.name} ({host.address}:{a.port}) through {a.via.name}: {exc}") from None
        self.client = self.link.transport.client
        self._released = False

    def _ssh_prefix(self, heads: HeadLinks) -> str:
        """`ssh <options> -- <host>` as the head node runs it, with this host's known keys on its command line."""
        h, a = self.host, self.access
        name = host_entry_name(h.address, a.port)
        keys = host_keys_for(heads.known_hosts, h.address, a.port).lookup(name) or {}
        if not keys:
            hint = (" (through a head node primectl cannot learn a key: add it first, e.g. `ssh-keyscan` run on "
                    f"{a.via.name if a.via else 'the head node'})") if heads.accept_new else ""
            raise HostUnreachable(f"{h.name} ({h.address}:{a.port}): unknown host key (not in {heads.known_hosts})"
                                  f"; verify it and add it{hint}")
        # printf's \n between lines: ssh splits this option's value into words itself, quotes but no newlines;
        # it expands %-tokens in it and printf its own %s, so a % (a scoped IPv6 address) is doubled twice
        lines = "".join(f"{name} {k.get_name()} {k.get_base64()}\\n" for k in keys.values()).replace("%", "%%%%")
        identity = ["-i", a.via_identity_file, "-o", "IdentitiesOnly=yes"] if a.via_identity_file else []
        argv = ["ssh", *SSH_OPTIONS, *identity, "-o", f"KnownHostsCommand=/usr/bin/printf '{lines}'",
                "-p", str(a.port), "-l", a.user, "--", h.address]
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
                raise HostUnreachable(f"{self.host.name} ({self.host.address}:{self.access.port}) through "
                                      f"{self.head.name}: {text[1]}") from None
            raise

    def _silence(self) -> str:
        """The connection the kernel gave up on is the head node's: it is named as the one that stopped answering."""
        return peer_silent(self.head.name)

    def _start_agent(self, timeout: float | None, first: bytes) -> ChannelStream:
        """The agent's session, in one of the link's sessions (given back when it closes). A transport that was
        closed starts none: its slot on the link is given back (the keeper may close one another command is
        about to use)."""
        if self._released:
            raise HostUnreachable(f"{self.host.name}: its connection through {self.head.name} was closed")
        self.link.sessions.acquire()
        try:
            started = super()._start_agent(timeout, first)
        except BaseException:
            self.link.sessions.release()
            raise
        with self._close_lock:
            if not self._released:
                self._agent = started  # under the lock: a close() from here on closes it
                return started
        started.chan.close()
        self.link.sessions.release()
        raise HostUnreachable(f"{self.host.name}: its connection through {self.head.name} was closed")

    def _close_agent(self) -> None:
        with self._close_lock:  # close() and a failing call may both get here: the slot goes back once
            had = self._agent is not None
            super()._close_agent()
        if had:
            self.link.sessions.release()

    def alive(self) -> bool:
        """Whether the head node's connection and this host's agent session are still up."""
        return not self._released and super().alive()

    def run(self, command: str, *, timeout: float | None = None, stream: bool = False) -> tuple[int, str, str]:
        """A shell command on the host; HostUnreachable when the head node's ssh could not reach it (exit 255)."""
        with self.link.sessions:
            code, out, err = super().run(command, timeout=timeout, stream=stream)
        if code == 255 and not out:  # ssh's own failure (a command's 255 with no output would read the same)
            raise HostUnreachable(f"{self.host.name} ({self.host.address}:{self.access.port}) through {self.head.name}: "
                                  f"{err.strip()[-500:]}")
        return code, out, err

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write a file on the host through the head node (its parent directory is created)."""
        tmp = f"{path}.partial"
        script = (f"mkdir -p {shlex.quote(posixpath.dirname(path))} && cat > {shlex.quote(tmp)} && "
                  f"chmod {mode:o} {shlex.quote(tmp)} && mv -f {shlex.quote(tmp)} {shlex.quote(path)}")
        with self.link.sessions:
            chan = None
            try:
                chan = self.client.get_transport().open_session()
                chan.settimeout(300)
                chan.set_combine_stderr(True)
                chan.exec_command(self.command(script))
                chan.sendall(data)
                chan.shutdown_write()
                said = b"".join(iter(lambda: chan.recv(65536), b""))
                code = chan.recv_exit_status()
            except Exception as exc:
                raise HostUnreachable(f"{self.host.name}: upload of {path} failed: {type(exc).__name__}: {exc}") from None
            finally:
                if chan is not None:
                    chan.close()
        if code != 0:
            raise HostUnreachable(f"{self.host.name}: upload of {path} through {self.head.name} failed (exit {code}): "
                                  f"{said.decode(errors='replace').strip()[-500:]}")

    def close(self) -> None:
        """Close this host's agent session; the head node's connection stays for the others behind it."""
        with self._close_lock:
            released, self._released = self._released, True
        self._close_agent()
        if not released:
            self._heads.release(self.head, self.link)


_HEAD_LINKS: dict[tuple[str, bool], HeadLinks] = {}
_HEAD_LINKS_LOCK = threading.Lock()


def head_links(known_hosts: str, accept_new_host_keys: bool) -> HeadLinks:
    """This process's head-node connections for one host-key policy."""
    with _HEAD_LINKS_LOCK:
        return _HEAD_LINKS.setdefault((known_hosts, accept_new_host_keys), HeadLinks(known_hosts, accept_new_host_keys))


def forget_head_failures() -> None:
    """Every head of this process may be tried again (see HeadLinks.forget_failures)."""
    with _HEAD_LINKS_LOCK:
        every = list(_HEAD_LINKS.values())
    for g in every:
        g.forget_failures()

"""Sites of their own: each a network namespace joined to this one by a veth pair, with a real sshd inside.

A fleet's deployments run at different sites. Here each site is a network namespace (held open by a `sleep`
started under `unshare --net`) with one link to the namespace that starts it: the site's address is
10.88.<n>.2 and this side's 10.88.<n>.1, on a /30. An sshd listens at the site's address inside it, so a site
recipe reaches its host over SSH (`connection: ssh`), every process `up` starts there runs inside the site's
namespace, and the gateway reaches the site's frontend across the link, as it would another data centre's.

Losing a site is then what it is on real hardware:
- `kill()`: every process in the site's namespace SIGKILLed (the site's kernel still answers: connections are
  refused or reset);
- `partition()`: the link down (nothing answers: connections time out, streams stall);
- `restore()`: the link up and the site's sshd listening again, ready for `primectl up` of the site.

Everything is found and stopped by pid (a site's processes by /proc/PID/ns/net), never by name. Tests run this
inside a private namespace (`unshare --net`), where the links made here join SESSION_LINKS so that
`isolated_netns()` still holds; `make demo-fleet` runs it on the host (scripts/demo_fleet_sites.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from primectl.bench.fleet_copy import SiteHost

from .sshhosts import SESSION_LINKS, SSHHost, client_keys, kill_pids, pid_alive, wait_gone

NET = "10.88"


def _ip(*args: str, inside: int | None = None) -> None:
    enter = ["nsenter", "-t", str(inside), "-n", "--"] if inside else []
    done = subprocess.run([*enter, "ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def netns_of(pid: int) -> str | None:
    """The network namespace pid runs in (what /proc/PID/ns/net links to), or None when it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


@dataclass
class Site:
    """One site: its namespace (held open by the process `holder`), its link, and the sshd standing in for its
    host (a `connection: ssh` host at `address`)."""

    name: str
    number: int
    root: Path
    holder: int
    client_key: Path
    authorized_keys: Path

    def __post_init__(self) -> None:
        self.host = SSHHost(self.name, self.address, 22, self.root, self.authorized_keys,
                            enter=["nsenter", "-t", str(self.holder), "-n", "--"])

    @property
    def address(self) -> str:
        """The site host's address, reached across the link."""
        return f"{NET}.{self.number}.2"

    @property
    def link(self) -> str:
        """This side's end of the link."""
        return f"pctl-site{self.number}"

    def pids(self) -> list[int]:
        """Every process in the site's namespace but its holder."""
        ns = netns_of(self.holder)
        if ns is None:
            return []
        return [int(p) for p in os.listdir("/proc")
                if p.isdigit() and int(p) != self.holder and netns_of(int(p)) == ns and pid_alive(int(p))]

    def kill(self) -> list[int]:
        """SIGKILL every process of the site (its sshd and all `up` started there), by pid; their pids."""
        pids = self.pids()
        kill_pids(pids)
        if self.host.proc is not None:  # started by this process: reap it
            self.host.proc.wait(5)
            self.host.proc = None
        wait_gone(pids, 10)
        return pids

    @property
    def peer(self) -> str:
        """The site's end of the link."""
        return f"site{self.number}-in"

    def partition(self) -> None:
        """Take the site's end of the link down: what is sent to the site is dropped (this side keeps its route),
        so nothing there answers or refuses, as when a site loses power or its uplink."""
        _ip("link", "set", self.peer, "down", inside=self.holder)

    def restore(self) -> None:
        """The link up, and the site's sshd listening again when it was killed."""
        _ip("link", "set", self.peer, "up", inside=self.holder)
        if not any(self._is_sshd(p) for p in self.pids()):
            self.host.start()

    def run(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        """Start `argv` inside the site (its output to `log`); the caller stops it by pid."""
        with open(log, "ab") as out:
            return subprocess.Popen(["nsenter", "-t", str(self.holder), "-n", "--", *argv], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=out, start_new_session=True)

    def _is_sshd(self, pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/exe").resolve().name == "sshd"
        except OSError:
            return False

    def stop(self) -> None:
        """Kill everything in the site, then its holder: the namespace and its link go with them."""
        self.kill()
        # Both ends of the link go now; the kernel removes a dead namespace's links only some time later.
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        kill_pids([self.holder])
        wait_gone([self.holder], 5)
        SESSION_LINKS.discard(self.link)

    def record(self) -> dict[str, object]:
        """What `load` needs to find this site again from another process."""
        return {"name": self.name, "number": self.number, "root": str(self.root), "holder": self.holder,
                "client_key": str(self.client_key), "authorized_keys": str(self.authorized_keys)}


def start_site(root: Path, name: str, number: int, sshd: bool = True, routed: bool = False) -> Site:
    """A site's namespace, link and (unless not `sshd`) sshd, as root; `number` picks 10.88.<number>.0/30. The
    client key that logs in is shared by every site under root's parent (`Site.client_key`). `routed`: the site
    reaches the other sites through this namespace (its default route; this namespace forwards, so call it only
    in a namespace of the test's own)."""
    root.mkdir(parents=True, exist_ok=True)
    client_key, authorized = client_keys(root.parent / "site-client")
    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "infinity"], stdin=subprocess.DEVNULL,
                              start_new_session=True)
    site = Site(name, number, root, holder.pid, client_key, authorized)
    try:
        deadline = time.monotonic() + 5
        while netns_of(holder.pid) == netns_of(os.getpid()):  # until unshare has made the namespace
            if time.monotonic() > deadline:
                raise RuntimeError("unshare --net made no network namespace within 5 s")
            time.sleep(0.01)
        SESSION_LINKS.add(site.link)
        peer = site.peer
        _ip("link", "add", site.link, "type", "veth", "peer", "name", peer, "netns", str(holder.pid))
        _ip("addr", "add", f"{NET}.{number}.1/30", "dev", site.link)
        _ip("link", "set", site.link, "up")
        _ip("link", "set", "lo", "up", inside=holder.pid)
        _ip("addr", "add", f"{site.address}/30", "dev", peer, inside=holder.pid)
        _ip("link", "set", peer, "up", inside=holder.pid)
        if routed:
            _ip("route", "add", "default", "via", f"{NET}.{number}.1", inside=holder.pid)
            Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        if sshd:
            site.host.start()
    except BaseException:
        site.stop()
        holder.wait(5)
        raise
    return site


def known_hosts(path: Path, sites: list[Site]) -> Path:
    """A known_hosts file for the sites' hosts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(s.host.known_hosts_line() for s in sites))
    return path


def save(path: Path, sites: list[Site]) -> None:
    """Record the sites (for `load` by a later process: `make demo-fleet-down`)."""
    path.write_text(json.dumps([s.record() for s in sites], indent=2) + "\n")


def load(path: Path) -> list[Site]:
    """The sites `save` recorded whose holder still runs."""
    if not path.exists():
        return []
    sites = []
    for r in json.loads(path.read_text()):
        site = Site(r["name"], r["number"], Path(r["root"]), r["holder"], Path(r["client_key"]),
                    Path(r["authorized_keys"]))
        if netns_of(site.holder) not in (None, netns_of(os.getpid())):
            sites.append(site)
    return sites


def stop_all(sites: list[Site]) -> None:
    """Stop each site."""
    for s in sites:
        s.stop()


@contextmanager
def sites_up(root: Path, names: Iterable[str], *, sshd: bool = True, first: int = 1, routed: bool = False
             ) -> Iterator[dict[str, Site]]:
    """A site per name (numbered `first`, `first` + 1, ... in order) under root, stopped again at the end (`sshd`,
    `routed`: as start_site)."""
    sites: dict[str, Site] = {}
    try:
        for number, name in enumerate(names, first):
            sites[name] = start_site(root / f"site-{name}", f"site-{name}", number, sshd=sshd, routed=routed)
        yield sites
    finally:
        stop_all(list(sites.values()))


def reach(sites: dict[str, Site], known: Path) -> dict[str, SiteHost]:
    """How a fleet copy's site recipes reach each site's host (write_fleet's `site_hosts`), with their
    known_hosts written to `known`."""
    known_hosts(known, list(sites.values()))
    return {name: SiteHost(s.address, s.client_key, known) for name, s in sites.items()}

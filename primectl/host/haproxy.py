"""A load balancer's admin socket (HAProxy's runtime API): a server drained and put back into rotation, and
the balancer reloaded in place with its new files.
"""

from __future__ import annotations

import os
import time

from primectl.host.files import write_atomic
from primectl.host.processes import starttime

TYPE_CHECKING = False
if TYPE_CHECKING:
    from primectl.host.wire import Drained, DrainSpec, ReloadSpec


def balancer_command(sock_path: str, command: str) -> str:
    """One command on a load balancer's admin socket (HAProxy's runtime API); its answer."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(sock_path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def balancer_stat(sock_path: str) -> list[dict[str, str]]:
    """The balancer's `show stat` rows, each keyed by the CSV header's names."""
    lines = balancer_command(sock_path, "show stat").splitlines()
    if not lines:
        return []
    header = lines[0].lstrip("# ").split(",")
    return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:]]


def balancer_server(sock_path: str, server: str) -> dict[str, str]:
    """The `show stat` row of backend/server (empty when the balancer does not know it)."""
    backend, _, name = server.partition("/")
    return next((r for r in balancer_stat(sock_path) if r.get("pxname") == backend and r.get("svname") == name), {})


def balancer_servers(sock_path: str, backend: str) -> list[str]:
    """The servers a load balancer's running worker has in `backend` (its `show stat`)."""
    return sorted(r["svname"] for r in balancer_stat(sock_path)
                  if r.get("pxname") == backend and r.get("svname") not in ("FRONTEND", "BACKEND"))


def balancer_worker_pid(sock_path: str) -> str:
    """The pid of the balancer worker that answers on its admin socket (`show info`), '' if it says none."""
    for line in balancer_command(sock_path, "show info").splitlines():
        if line.startswith("Pid:"):
            return line.split(":", 1)[1].strip()
    return ""


def drain_from_balancer(drain: DrainSpec) -> Drained:
    """Stop the balancer sending the server new work, then wait until its sessions end (or `timeout_s`)."""
    sock_path, server = str(drain.get("socket")), str(drain.get("server"))
    t0 = time.time()
    try:
        balancer_command(sock_path, f"set server {server} state drain")
    except OSError:
        return {"seconds": 0.0, "cut": 0, "how": "balancer"}  # no balancer running: nothing routes to it
    deadline = t0 + float(drain.get("timeout_s", 60))
    current = 0
    while time.time() < deadline:
        try:
            row = balancer_server(sock_path, server)
        except OSError:
            break
        current = int(row.get("scur") or 0) + int(row.get("qcur") or 0)
        if current == 0:
            break
        time.sleep(0.1)
    cut = current if time.time() >= deadline else 0
    return {"seconds": round(time.time() - t0, 3), "cut": cut, "how": "balancer"}


def balancer_address(address: str) -> str:
    """`address` (host:port) as the balancer shows and takes it: a host named by name is resolved to its IPv4
    address, as the balancer's configuration was (OSError when it does not resolve)."""
    import ipaddress
    import socket

    host, _, port = address.rpartition(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        host = str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    return f"{host}:{port}"


def repoint_in_balancer(sock_path: str, server: str, address: str, row: dict[str, str]) -> str | None:
    """Point the balancer's server at `address` (an IP:port) when its `show stat` row says another one: a replica
    that came back on a new port must not be health-checked, or routed to, at its old one (None: done)."""
    if not address or row.get("addr") == address:
        return None
    host, _, port = address.rpartition(":")
    answer = balancer_command(sock_path, f"set server {server} addr {host} port {port}").strip()
    now = balancer_server(sock_path, server).get("addr")
    return None if now == address else f"the balancer would not move {server} to {address}: {answer or 'no answer'}"


def back_into_balancer(drain: DrainSpec, timeout: float = 30) -> str | None:
    """Put the server back in rotation, at its planned address, and wait until the balancer's health check calls
    it UP (None: done)."""
    sock_path, server = str(drain.get("socket")), str(drain.get("server"))
    address = str(drain.get("address") or "")
    try:
        address = balancer_address(address) if address else ""
    except OSError as exc:
        return f"the balancer cannot move {server} to {drain.get('address')}: {exc}"
    deadline = time.time() + timeout
    status = "?"
    while time.time() < deadline:
        try:
            row = balancer_server(sock_path, server)
            if not row:
                return None  # a new server, not in the balancer's configuration yet: the balancer's reload adds it
            error = repoint_in_balancer(sock_path, server, address, row)
            if error:
                return error
            balancer_command(sock_path, f"set server {server} state ready")
            status = balancer_server(sock_path, server).get("status", "?")
        except (FileNotFoundError, ConnectionRefusedError):
            return None  # no balancer runs (a socket file left by one that stopped refuses): it starts with it UP
        except OSError as exc:
            return f"balancer socket {sock_path}: {exc}"
        if status.startswith("UP"):
            return None
        time.sleep(0.1)
    return f"the balancer still calls {server} {status} after {timeout:g}s"


def reload_in_place(pid: int, spec: ReloadSpec) -> str | None:
    """Check the new files, signal a running process to re-read them, and wait until it has (None: done, else why
    not: the running process is left as it was).

    With a balancer socket, done is when a new worker answers on it with exactly the servers the new files list;
    otherwise when the process is still the same one after the signal."""
    if spec.get("check"):
        # a master given a bad configuration keeps its old worker and only logs it: refuse before the signal
        import subprocess

        r = subprocess.run(spec["check"], capture_output=True, text=True)
        if r.returncode != 0:
            detail = " ".join((r.stderr or r.stdout).split())[-600:]
            return f"the new configuration does not load ({' '.join(spec['check'])}: {detail}); still running the old one"
    start = starttime(pid)
    sock_path, backend = spec.get("socket"), spec.get("backend")
    old_worker = ""
    if sock_path:
        try:
            old_worker = balancer_worker_pid(sock_path)
            if spec.get("state_file"):
                # without them the new worker would call every server down until its first health check passes
                write_atomic(str(spec["state_file"]), balancer_command(sock_path, "show servers state").encode())
        except OSError as exc:
            return f"could not save the balancer's server states through {sock_path}: {exc}"
    import signal  # a reload's signal is named (SIGHUP, SIGUSR2): rare enough to import the names for

    os.kill(pid, getattr(signal, spec["signal"]))
    deadline = time.time() + float(spec.get("timeout_s", 30))
    want = sorted(spec.get("servers") or [])
    seen: list[str] | str = "nothing"
    while time.time() < deadline:
        if starttime(pid) != start:
            return f"process {pid} exited on {spec['signal']} instead of reloading"
        if not sock_path or not backend:
            return None
        try:
            worker = balancer_worker_pid(sock_path)
            seen = balancer_servers(sock_path, backend) if worker and worker != old_worker else f"worker {worker}"
        except OSError as exc:  # between the old worker's socket and the new one's
            seen = str(exc)
        if seen == want:
            if spec.get("state_file"):  # read once: a later start must not take ports or states from it
                try:
                    os.unlink(str(spec["state_file"]))
                except FileNotFoundError:
                    pass
            return None
        time.sleep(0.1)
    return (f"after {spec['signal']} no new worker of the balancer lists {want} in backend {backend} (it shows "
            f"{seen}, {spec.get('timeout_s', 30):g}s)")

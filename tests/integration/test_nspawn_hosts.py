"""An operator's day on three systemd hosts (systemd-nspawn containers with systemd as PID 1).

Everything goes over SSH with paramiko (what primectl's Fabric uses) to each host's own address,
host keys checked against a known_hosts file; the units mirror the directives of
templates/unit.service.j2 (Type=simple, Restart=on-failure, KillMode=control-group,
network-online.target, Limit*), with shorter RestartSec so the tests stay quick.

Run in a private network namespace:
    unshare --net -- sh -c 'ip link set lo up && exec .venv/bin/pytest tests/integration/test_nspawn_hosts.py -q'
"""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from .conftest import nspawn_runtime
from .nspawnhosts import NspawnHost, NspawnHosts
from .sshhosts import wait_for

pytestmark = pytest.mark.integration

SERVER = """\
import http.server, os, socket

address, port = os.environ["DEMO_ADDRESS"], int(os.environ["DEMO_PORT"])


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{socket.gethostname()} {os.getpid()}\\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        print("demo-server request", fmt % args, flush=True)


server = http.server.HTTPServer((address, port), Handler)
print(f"demo-server listening on {address}:{port} pid {os.getpid()}", flush=True)
server.serve_forever()
"""

UNIT = """\
[Unit]
Description=primectl test: demo HTTP service {name}
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/python3 -u /var/lib/primectl/demo/server.py
WorkingDirectory=/var/lib/primectl/demo
Environment=DEMO_ADDRESS={address} DEMO_PORT={port}
Restart=on-failure
RestartSec=1
KillMode=control-group
KillSignal=SIGTERM
TimeoutStopSec=10
LimitNOFILE=1048576
LimitMEMLOCK=infinity

[Install]
WantedBy=multi-user.target
"""

BROKEN_UNIT = """\
[Unit]
Description=primectl test: a service that fails as it starts
StartLimitIntervalSec=30
StartLimitBurst=3

[Service]
Type=simple
ExecStart=/bin/sh -c 'echo broken-start attempt; exit 3'
Restart=on-failure
RestartSec=200ms

[Install]
WantedBy=multi-user.target
"""


class Shell:
    """One SSH connection to a host as root with the test client key; the host key must match known_hosts."""

    def __init__(self, host: NspawnHost, client_key: Path, known_hosts: Path):
        self.host = host
        self.client = paramiko.SSHClient()
        self.client.load_host_keys(str(known_hosts))
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        self.client.connect(host.address, port=host.port, username="root", key_filename=str(client_key),
                            look_for_keys=False, allow_agent=False, timeout=10, banner_timeout=10, auth_timeout=10)

    def sh(self, command: str, timeout: float = 30) -> tuple[int, str, str]:
        """Run a shell command; (exit status, stdout, stderr)."""
        t0 = time.monotonic()
        try:
            _, out, err = self.client.exec_command(command, timeout=timeout)
        except paramiko.SSHException as exc:  # say what the host's sshd and logind said about it
            journal = self.host.run("journalctl", "-n", "40", "--no-pager", check=False).stdout
            raise AssertionError(f"{self.host.name}: cannot run `{command}` over SSH: {exc!r}\n{journal}") from exc
        rc = out.channel.recv_exit_status()
        result = rc, out.read().decode(), err.read().decode()
        out.channel.close()
        if os.environ.get("PRIMECTL_TEST_TIMING"):
            print(f"[{time.monotonic() - t0:5.2f}s] {self.host.name}: {command[:100]} -> {rc}")
        return result

    def ok(self, command: str, timeout: float = 30) -> str:
        """Run a command that must succeed; its stdout."""
        rc, out, err = self.sh(command, timeout)
        assert rc == 0, f"{self.host.name}: `{command}` -> {rc}\n{out}\n{err}"
        return out

    def fire(self, command: str) -> None:
        """Start a command without waiting for it (e.g. `systemctl reboot`, which ends this connection)."""
        transport = self.client.get_transport()
        assert transport is not None, "not connected"
        transport.open_session().exec_command(command)

    def put(self, text: str, path: str, mode: int = 0o644) -> None:
        """Copy a file onto the host over SFTP (as Fabric's put does)."""
        with self.client.open_sftp() as sftp:
            with sftp.open(path, "w") as f:
                f.write(text)
            sftp.chmod(path, mode)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """`systemctl show -p ...` as a dict."""
        out = self.ok(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def close(self) -> None:
        self.client.close()


Connect = Callable[[NspawnHost], Shell]


@pytest.fixture
def known_hosts(nspawn_hosts: NspawnHosts, tmp_path: Path) -> Path:
    return nspawn_hosts.known_hosts(tmp_path / "known_hosts")


@pytest.fixture
def ssh(nspawn_hosts: NspawnHosts, known_hosts: Path) -> Iterator[Connect]:
    """ssh(host) -> a Shell; every connection is closed after the test."""
    opened: list[Shell] = []

    def connect(host: NspawnHost) -> Shell:
        shell = Shell(host, nspawn_hosts.client_key, known_hosts)
        opened.append(shell)
        return shell

    yield connect
    for shell in opened:
        shell.close()


def http_get(address: str, port: int, timeout: float = 10) -> str:
    """GET / from the test's namespace, retrying until the service answers or timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{address}:{port}/", timeout=2) as resp:
                body: bytes = resp.read()
                return body.decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def port_closed(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((address, port)) != 0


def install_demo(shell: Shell, unit: str, port: int) -> None:
    """Copy the server and its unit onto the host, daemon-reload, enable --now."""
    shell.ok("mkdir -p /var/lib/primectl/demo")
    shell.put(SERVER, "/var/lib/primectl/demo/server.py")
    shell.put(UNIT.format(name=unit, address=shell.host.address, port=port), f"/etc/systemd/system/{unit}.service")
    shell.ok(f"systemctl daemon-reload && systemctl enable --now {unit}.service")


def remove_unit(shell: Shell, unit: str) -> None:
    """disable --now, delete the unit file, daemon-reload, forget its failures."""
    shell.sh(f"systemctl disable --now {unit}.service; rm -f /etc/systemd/system/{unit}.service; "
             f"systemctl daemon-reload; systemctl reset-failed {unit}.service")


def test_each_host_is_a_machine_of_its_own(nspawn_hosts: NspawnHosts, ssh: Connect) -> None:
    """Own address (reached over SSH, host key checked), hostname, machine-id; systemd as PID 1, running."""
    machine_ids = set()
    for h in nspawn_hosts.hosts:
        shell = ssh(h)
        wd = h.workdir("t-identity")
        shell.ok(f"mkdir -p {wd} && hostname > {wd}/written-on-host")  # the workdir is the same path here and there
        assert (wd / "written-on-host").read_text() == f"{h.name}\n"
        assert shell.ok("hostname").strip() == h.name
        assert shell.ok("ps -o comm= -p 1").strip() == "systemd"
        assert shell.ok("systemctl is-system-running").strip() == "running"
        assert f"{h.address}/24" in shell.ok("ip -br addr show host0")
        machine_ids.add(shell.ok("cat /etc/machine-id").strip())
        others = [o for o in nspawn_hosts.hosts if o is not h]
        assert shell.ok(f"getent hosts {others[0].name}").split()[0] == others[0].address
    assert len(machine_ids) == len(nspawn_hosts.hosts)
    keys = {h.known_hosts_line().split()[2] for h in nspawn_hosts.hosts}
    assert len(keys) == len(nspawn_hosts.hosts), "each host has its own ssh host key"


def test_enabled_unit_serves_logs_and_comes_back_after_kill_9(nspawn_hosts: NspawnHosts, ssh: Connect) -> None:
    """Copy + daemon-reload + enable --now on every host; each answers on its own address; kill -9 -> restarted."""
    unit, port = "primectl-demo", 8000
    shells = [ssh(h) for h in nspawn_hosts.hosts]
    try:
        for shell in shells:
            install_demo(shell, unit, port)
        for shell in shells:
            h = shell.host
            assert shell.ok(f"systemctl is-active {unit}").strip() == "active"
            assert shell.ok(f"systemctl is-enabled {unit}").strip() == "enabled"
            assert http_get(h.address, port).split()[0] == h.name  # this host's service, on this host's address
            journal = wait_for(lambda: shell.ok(f"journalctl -u {unit} --no-pager -o cat"),  # noqa: B023 (used at once)
                               lambda j: "demo-server listening" in j, 10, "the start line in the journal")
            assert f"demo-server listening on {h.address}:{port}" in journal

        shell = shells[0]
        before = shell.show(unit, "MainPID", "NRestarts")
        assert before["NRestarts"] == "0"
        shell.ok(f"kill -9 {before['MainPID']}")
        after = wait_for(lambda: shell.show(unit, "MainPID", "NRestarts", "ActiveState"),
                         lambda s: s["ActiveState"] == "active" and s["MainPID"] not in ("0", before["MainPID"]),
                         15, "systemd restarting the killed service")
        assert after["NRestarts"] == "1"
        assert http_get(shell.host.address, port).split() == [shell.host.name, after["MainPID"]]
        journal = shell.ok(f"journalctl -u {unit} --no-pager -o cat")
        assert "Main process exited, code=killed, status=9/KILL" in journal
        assert "Scheduled restart job, restart counter is at 1." in journal
    finally:
        for shell in shells:
            remove_unit(shell, unit)


def test_unit_failing_at_start_stops_at_its_start_limit(nspawn_hosts: NspawnHosts, ssh: Connect) -> None:
    """Restart=on-failure with StartLimitBurst=3 in 30 s: three tries, then failed, and refused until reset-failed."""
    shell, unit = ssh(nspawn_hosts.hosts[1]), "primectl-broken"
    shell.put(BROKEN_UNIT, f"/etc/systemd/system/{unit}.service")
    try:
        # Type=simple: the start job succeeds as soon as the process is forked, so enable --now says 0
        # although the service is about to fail; only the unit's state tells.
        rc, _, err = shell.sh(f"systemctl daemon-reload && systemctl enable --now {unit}.service")
        assert rc == 0, err
        state = wait_for(lambda: shell.show(unit, "ActiveState", "Result", "NRestarts"),
                         lambda s: s["ActiveState"] == "failed", 15, "the unit giving up")
        # systemd 252: the 3 starts allowed by the burst (NRestarts counts the 3 scheduled restarts, the
        # last of which is refused), and Result stays 'exit-code', not 'start-limit-hit'.
        assert state == {"ActiveState": "failed", "Result": "exit-code", "NRestarts": "3"}
        journal = shell.ok(f"journalctl -u {unit} --no-pager -o cat")
        assert journal.count("broken-start attempt") == 3
        assert journal.count("Start request repeated too quickly.") == 1
        assert shell.sh(f"systemctl is-failed {unit}")[1].strip() == "failed"
        assert shell.sh(f"systemctl is-enabled {unit}")[1].strip() == "enabled"  # still enabled: tried at next boot

        # Within the interval a manual start is refused without running anything (rc 1, and the message
        # blames "the control process" rather than the start limit) ...
        rc, _, err = shell.sh(f"systemctl start {unit}")
        assert rc == 1 and "failed because the control process exited with error code" in err
        journal = shell.ok(f"journalctl -u {unit} --no-pager -o cat")
        assert journal.count("broken-start attempt") == 3
        assert journal.count("Start request repeated too quickly.") == 2
        # ... until reset-failed, which makes it try (three more times) again.
        shell.ok(f"systemctl reset-failed {unit} && systemctl start {unit}")
        wait_for(lambda: shell.ok(f"journalctl -u {unit} --no-pager -o cat").count("broken-start attempt"),
                 lambda n: n == 6, 15, "three more attempts after reset-failed")
    finally:
        remove_unit(shell, unit)


def test_reboot_brings_the_enabled_unit_back_and_keeps_the_disk(nspawn_hosts: NspawnHosts, ssh: Connect) -> None:
    """`systemctl reboot` over SSH: nspawn exits 133, the host boots again, the enabled unit runs again."""
    h, unit, port = nspawn_hosts.hosts[2], "primectl-boot", 8001
    shell = ssh(h)
    install_demo(shell, unit, port)
    shell.ok("echo written-before-reboot > /var/lib/primectl/marker")  # the host's own disk (its overlay layer)
    first_pid = shell.show(unit, "MainPID")["MainPID"]
    boot_id = shell.ok("cat /proc/sys/kernel/random/boot_id").strip()
    try:
        seconds = h.reboot(request=lambda: shell.fire("systemctl reboot"))
        print(f"\nreboot of {h.name}: {seconds:.2f}s (nspawn exit {h.last_exit})")
        assert h.last_exit == 133
        again = ssh(h)
        assert again.ok(f"systemctl is-active {unit}").strip() == "active"
        assert again.show(unit, "MainPID")["MainPID"] != first_pid
        assert http_get(h.address, port).split()[0] == h.name
        assert again.ok("cat /var/lib/primectl/marker").strip() == "written-before-reboot"
        assert again.ok("cat /proc/sys/kernel/random/boot_id").strip() != boot_id
        # The journal is persistent (/var/log/journal): the previous boot's log of the unit is still there.
        assert f"demo-server listening on {h.address}:{port}" in again.ok(f"journalctl -b -1 -u {unit} --no-pager -o cat")
    finally:
        remove_unit(ssh(h), unit)


def test_disable_now_stops_it_for_good_even_across_a_power_cut(nspawn_hosts: NspawnHosts, ssh: Connect) -> None:
    """`disable --now`: inactive, not enabled, port closed; after a hard power-off and boot it stays off."""
    h, unit, port = nspawn_hosts.hosts[0], "primectl-off", 8002
    shell = ssh(h)
    install_demo(shell, unit, port)
    assert http_get(h.address, port).split()[0] == h.name
    shell.ok(f"systemctl disable --now {unit}")
    assert shell.sh(f"systemctl is-active {unit}")[:2] == (3, "inactive\n")
    assert shell.sh(f"systemctl is-enabled {unit}")[:2] == (1, "disabled\n")
    assert port_closed(h.address, port)
    shell.close()

    assert h.power_cut() == [], "a power cut leaves no process of the host behind"
    h.boot()
    again = ssh(h)
    assert again.sh(f"systemctl is-active {unit}")[1].strip() == "inactive"
    assert again.ok(f"test -f /etc/systemd/system/{unit}.service && echo kept").strip() == "kept"
    assert port_closed(h.address, port)
    remove_unit(again, unit)


def test_append_output_goes_to_the_file_and_lifecycle_to_the_journal(nspawn_hosts: NspawnHosts, ssh: Connect) -> None:
    """templates/unit.service.j2 writes StandardOutput=append:LOG: the output is in LOG, `journalctl -u` has only systemd's lines."""
    shell, unit = ssh(nspawn_hosts.hosts[1]), "primectl-append"
    shell.ok("mkdir -p /var/lib/primectl/append/logs")
    shell.put("[Service]\nType=simple\nExecStart=/bin/sh -c 'echo to-the-log-file; echo to-stderr >&2; sleep 60'\n"
              "WorkingDirectory=/var/lib/primectl/append\nStandardOutput=append:/var/lib/primectl/append/logs/app.log\n"
              "StandardError=inherit\n", f"/etc/systemd/system/{unit}.service")
    try:
        shell.ok(f"systemctl daemon-reload && systemctl start {unit}")
        log = wait_for(lambda: shell.ok("cat /var/lib/primectl/append/logs/app.log"),
                       lambda t: "to-stderr" in t, 10, "both streams in the log file")
        assert "to-the-log-file" in log
        journal = shell.ok(f"journalctl -u {unit} --no-pager -o cat")
        assert "Started" in journal and "to-the-log-file" not in journal and "to-stderr" not in journal
    finally:
        remove_unit(shell, unit)


def test_stop_ends_every_process_of_the_unit_including_forked_children(nspawn_hosts: NspawnHosts, ssh: Connect) -> None:
    """KillMode=control-group (the template's) kills what the service forked too; cgroups track it here (hybrid v1)."""
    shell, unit = ssh(nspawn_hosts.hosts[2]), "primectl-forks"
    shell.put("[Service]\nType=simple\nExecStart=/bin/sh -c 'setsid sleep 1001 & sleep 1002 & exec sleep 1003'\n"
              "KillMode=control-group\nTimeoutStopSec=10\n", f"/etc/systemd/system/{unit}.service")
    try:
        shell.ok(f"systemctl daemon-reload && systemctl start {unit}")
        wait_for(lambda: shell.sh("pgrep -c -f 'sleep 100[123]'")[1].strip(), lambda n: n == "3", 10, "three sleeps")
        tasks = shell.ok(f"systemctl status {unit} --no-pager; true")
        assert all(f"sleep 100{i}" in tasks for i in (1, 2, 3)), tasks  # the session-leaving one too
        shell.ok(f"systemctl stop {unit}")
        assert shell.sh("pgrep -f 'sleep 100[123]'")[0] == 1, "a process of the stopped unit survived"
    finally:
        remove_unit(shell, unit)


def test_runtime_venv_is_usable_inside(nspawn_hosts: NspawnHosts, ssh: Connect) -> None:
    """The runtime venv bound read-only imports Dynamo and Mooncake (whose engine links libibverbs, libnuma, libcurl)."""
    runtime = nspawn_runtime()
    if runtime is None:
        pytest.skip("no runtime venv (make runtime, or set PRIMECTL_NSPAWN_RUNTIME)")
    shell = ssh(nspawn_hosts.hosts[0])
    out = shell.ok(f"{runtime}/bin/python -c 'import dynamo.runtime, dynamo.llm, mooncake.engine; print(\"imported\")'",
                   timeout=60)
    assert out.strip() == "imported"
    rc, _, err = shell.sh(f"touch {runtime}/should-not-exist")
    assert rc != 0 and "Read-only file system" in err

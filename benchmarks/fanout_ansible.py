"""primectl `up` against Ansible doing the same deployment, side by side, on the same simulated SSH hosts.

Starts N real OpenSSH servers (default 18) on 127.0.0.2... (tests/integration/sshhosts.py), and deploys the
fan-out benchmark's recipe (benchmarks/fanout.py: etcd, the frontend and the prefill worker on h1, one decode
worker on every host, FAKE engine runtime) two ways, alternately (primectl, Ansible, primectl, Ansible, ...), so
that whatever else loads the machine weighs on both:

- primectl: `up` (primectl's pipeline) in-process, as benchmarks/fanout.py times it (what
  `up --skip-preflight --no-smoke` does), then a zero-change `up`, then `down --purge`.
- Ansible (ansible-core, pinned in benchmarks/ansible-requirements.txt, installed into .venv-bench by
  `make bench-tools`): `ansible-playbook` of a generated inventory (each host's address, port and user, the
  benchmark's client key and known_hosts with StrictHostKeyChecking=yes) and a generated playbook that
    1. (strategy free) makes the workdir's directories, unpacks the host's release (the tarball of primectl's
       own render, `primectl.render.bundle.render_plan`, as primectl pushes it) into releases/<revision> with
       `unarchive` (`creates:` makes it idempotent), copies the generated model to models/<name> as primectl's
       agent does, and points `current` at the release (`file state=link`);
    2. (linear: each task is a barrier across hosts) per start wave of the plan (etcd; the workers; the
       frontend), starts each of the wave's services on its host the way primectl's process supervisor does
       (setsid + `bash current/bin/NAME.sh`, log appended to logs/NAME.log after the same start marker, a
       "pid starttime" pidfile in run/; a service whose pidfile names a live process is left alone unless
       `current` just changed, then it is stopped by its pidfile and started again), then waits for each
       started service's readiness probe (`uri` on the same URL, retried every 0.5 s up to the service's
       startup timeout), and at the end the deployment's readiness gate on the head host
       (GET /v1/models/demo/ready, as primectl's gate);
  with forks = N, pipelining on, ControlMaster/ControlPersist, no fact gathering, the hosts' python3 named
  (no interpreter discovery). Then the same playbook again: Ansible's own idempotent rerun, the zero-change
  case (every task ok or skipped, changed=0, checked); then its services are stopped by their pidfiles.

What differs between the two sides (printed with the numbers too):
- primectl also takes and releases a deployment lock (on the head host), inspects every host first (state,
  liveness, taken ports) and refuses taken ports, writes the (here empty) secrets file, writes state.json
  (what runs, hashes, probes) and prunes old releases, and rolls back on any failure; the Ansible playbook
  does none of that (on a failure it stops where it is).
- primectl's zero-change `up` connects, inspects each host (one round trip) and takes and releases the lock;
  Ansible's rerun runs each task's check on every host (`creates:` for the directories, the unpack and the
  model copy, the link, a pidfile check per service) and skips the probes (they run only for services it
  started), the least an idempotent playbook can do.
- Ansible's time is the `ansible-playbook` command's wall time, its own start-up included (printed apart:
  an empty playbook's run), with its ControlPersist masters closed before every fresh run, left open for
  the rerun (as an operator running it twice in a row gets); primectl's is `up` in-process (no CLI start-up,
  recipe loading not counted; it renders the bundles inside `up`, while Ansible's tarballs, inventory and
  playbook are written before its clock starts).
- Ansible probes readiness with a `uri` module run per probe try (a round trip each); primectl's agent
  probes on the host inside one request per host and wave.

Targets (the issue): Ansible's fresh run / primectl's fresh `up` >= 45 on 18 hosts, and primectl's
zero-change `up` on 18 hosts < 1 s. The simulated hosts share this machine's cores with both controllers;
the load average is printed with every measurement.

It binds port 22 on loopback addresses, so it refuses to run outside a private network namespace
(PRIMECTL_ALLOW_HOST_NET=1 overrides):

    unshare --net -- sh -c 'ip link set lo up && .venv/bin/python benchmarks/fanout_ansible.py'

Options: --hosts 18  --repeat 3 (rounds of primectl then Ansible; best and median reported)
  --ansible-bin .venv-bench/bin  --keep-logs DIR (copy Ansible's output there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fanout import cpu_busy_s, load, quiet, recipe, timed  # noqa: E402

from tests.integration.sshhosts import (  # noqa: E402
    SSHHosts,
    kill_leftovers,
    netns_problem,
    pid_alive,
    start_hosts,
    stop_on_sigterm,
    wait_gone,
)

TARGET_RATIO = 45.0  # Ansible fresh / primectl fresh
TARGET_NOOP_S = {18: 1.0, 72: 1.5}  # primectl zero-change up
RUN_HINT = "unshare --net -- sh -c 'ip link set lo up && .venv/bin/python benchmarks/fanout_ansible.py'"
HOST_PYTHON = "/usr/bin/python3"

# The process supervisor's start, in bash: leave a live service alone unless RESTART, else stop it by its
# pidfile ("pid starttime", checked against /proc so a reused pid is never signalled), append the start marker
# to its log, start the run script in its own session and record "pid starttime".
START_SH = r"""set -u
name='{{ item.name }}'; pidf="run/$name.pid"; log="logs/$name.log"
starttime() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }
alive() { [ -r "$pidf" ] && read -r pid st < "$pidf" && [ -n "$st" ] && [ "$(starttime "$pid")" = "$st" ]; }
if alive; then
  if [ '{{ restart }}' != 'True' ]; then echo running "$pid"; exit 0; fi
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
  for _ in $(seq 300); do alive || break; sleep 0.1; done
  if alive; then kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid"; fi
fi
rm -f "$pidf"
mkdir -p run logs
printf -- '--- primectl: starting %s at %s ---\n' "$name" "$(date +%Y-%m-%dT%H:%M:%S%z)" >> "$log"
setsid /bin/bash '{{ workdir }}/current/bin/{{ item.name }}.sh' < /dev/null >> "$log" 2>&1 &
pid=$!
st=$(starttime "$pid")
echo "$pid $st" > "$pidf.tmp" && mv "$pidf.tmp" "$pidf"
echo started "$pid"
"""



def tarball(files: dict[str, bytes], modes: dict[str, int]) -> bytes:
    """A bundle's files with their modes as a gzipped tarball (mtime 0), what Ansible's unarchive takes."""
    import gzip
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(files[path]), modes.get(path, 0o644), 0
            tar.addfile(info, io.BytesIO(files[path]))
    return gzip.compress(buf.getvalue(), compresslevel=1, mtime=0)

# Ansible's own tuning knobs, per --ansible-config. "tuned": what an operator who tunes Ansible for many hosts sets
# (forks = every host at once, pipelining, long-lived ControlPersist masters). "defaults": what ansible-core does
# when ansible.cfg leaves them out (forks 5, no pipelining, its default ssh_args' 60 s ControlPersist). The
# playbook, the host-key checks and everything else are the same in both.
ANSIBLE_CONFIGS = ("tuned", "defaults")


def ansible_tuning(config: str, hosts: int) -> tuple[str, str, str, str]:
    """(what it is, the [defaults] lines, the [ssh_connection] lines, the ssh options) of an --ansible-config."""
    if config == "tuned":
        return (f"Ansible tuned: forks={hosts}, pipelining, ControlPersist", f"forks = {hosts}\n",
                "pipelining = True\n", "-o ControlMaster=auto -o ControlPersist=120s")
    return ("Ansible's defaults: forks=5, no pipelining, ControlPersist 60 s", "", "",
            "-C -o ControlMaster=auto -o ControlPersist=60s")  # ansible-core's default ssh_args


def ansible_project(plan: Any, cluster: SSHHosts, out: Path, config: str) -> Path:
    """Write ansible.cfg (tuned per `config`: ANSIBLE_CONFIGS), the inventory, the release tarballs and the
    playbook for `plan` under out; the playbook."""
    from primectl.render.bundle import SHARED_MODEL_MARK, render_plan

    out.mkdir(parents=True)
    (out / "cp").mkdir()
    bundles = render_plan(plan)
    waves = plan.start_waves()
    known_hosts = cluster.base / "known_hosts"
    hosts: dict[str, Any] = {}
    for h in plan.hosts:
        if h.name not in bundles:
            continue
        b = bundles[h.name]
        tar = out / "releases" / f"{h.name}-{b.revision}.tar.gz"
        tar.parent.mkdir(exist_ok=True)
        tar.write_bytes(tarball(b.files, b.modes))  # the files primectl pushes, as a tarball for `unarchive`
        mine = {s.name: s for s in plan.services_on(h.name)}
        hosts[h.name] = {
            "ansible_host": h.address, "ansible_port": h.port, "ansible_user": h.user,
            "ansible_ssh_private_key_file": str(cluster.client_key),
            "workdir": h.workdir, "revision": b.revision, "bundle_tar": str(tar),
            "model_name": b.files[SHARED_MODEL_MARK].decode().strip() if SHARED_MODEL_MARK in b.files else "",
            "is_head": h.name == plan.head,
            "waves": [[{"name": n, "url": mine[n].ready.url, "timeout_s": mine[n].ready.timeout_s}
                       for n in wave if n in mine] for wave in waves],
        }
        assert all(mine[n].ready.kind == "http" for n in mine), "the playbook probes HTTP readiness only"
    (out / "inventory.json").write_text(json.dumps({"deploy": {"hosts": hosts}}, indent=1))
    _, defaults, connection, ssh_opts = ansible_tuning(config, len(hosts))
    (out / "ansible.cfg").write_text(
        "[defaults]\n"
        f"inventory = {out / 'inventory.json'}\n"
        f"{defaults}"
        "gathering = explicit\n"
        "host_key_checking = True\n"
        f"interpreter_python = {HOST_PYTHON}\n"
        "retry_files_enabled = False\n"
        "display_skipped_hosts = False\n"
        "deprecation_warnings = False\n"
        f"local_tmp = {out / 'local-tmp'}\n"
        "[ssh_connection]\n"
        f"{connection}"
        f"ssh_args = -F /dev/null {ssh_opts} -o UserKnownHostsFile={known_hosts} "
        "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o BatchMode=yes\n"
        f"control_path_dir = {out / 'cp'}\n"
    )
    gate = plan.gate
    assert gate.kind == "http"
    stage = {
        "name": "stage the release and switch `current` (as primectl's push + activate)",
        "hosts": "deploy", "gather_facts": False, "strategy": "free",
        "tasks": [
            {"name": "workdir directories",
             "ansible.builtin.shell": {"cmd": "mkdir -p {{ workdir }} && cd {{ workdir }} && "
                                              "mkdir -p releases/{{ revision }} logs run secrets models",
                                       "creates": "{{ workdir }}/releases/{{ revision }}"}},
            {"name": "unpack the release",
             "ansible.builtin.unarchive": {"src": "{{ bundle_tar }}", "dest": "{{ workdir }}/releases/{{ revision }}",
                                           "creates": "{{ workdir }}/releases/{{ revision }}/manifest.json"}},
            {"name": "shared copy of the generated model",
             "ansible.builtin.command": {"cmd": "cp -a {{ workdir }}/releases/{{ revision }}/model "
                                                "{{ workdir }}/models/{{ model_name }}",
                                         "creates": "{{ workdir }}/models/{{ model_name }}"},
             "when": "model_name | length > 0"},
            {"name": "point current at the release",
             "ansible.builtin.file": {"src": "releases/{{ revision }}", "dest": "{{ workdir }}/current",
                                      "state": "link", "force": True},
             "register": "switched"},
        ],
    }
    tasks: list[dict[str, Any]] = []
    for i, wave in enumerate(waves):
        label = ", ".join(wave) if len(wave) <= 3 else f"{wave[0]} ... {wave[-1]} ({len(wave)} services)"
        tasks.append({
            "name": f"wave {i + 1}: start {label}",
            "ansible.builtin.shell": {"cmd": START_SH, "chdir": "{{ workdir }}", "executable": "/bin/bash"},
            "vars": {"restart": "{{ switched is changed }}"},
            "loop": f"{{{{ waves[{i}] }}}}", "loop_control": {"label": "{{ item.name }}"},
            # in a loop, the registered name is the current item's result
            "register": f"started_{i}", "changed_when": f"'started' in started_{i}.stdout",
        })
        tasks.append({
            "name": f"wave {i + 1}: wait for readiness",
            "ansible.builtin.uri": {"url": "{{ item.item.url }}", "status_code": 200, "timeout": 3},
            "loop": f"{{{{ started_{i}.results }}}}", "loop_control": {"label": "{{ item.item.name }}"},
            "when": "item is changed", "register": "probe", "until": "probe.status == 200",
            "retries": "{{ (item.item.timeout_s / 0.5) | int }}", "delay": 0.5,
        })
    any_started = " or ".join(f"started_{i} is changed" for i in range(len(waves)))
    tasks.append({
        "name": "readiness gate", "ansible.builtin.uri": {"url": gate.url, "status_code": 200, "timeout": 3},
        "when": f"is_head and ({any_started})", "register": "gate", "until": "gate.status == 200",
        "retries": int(gate.timeout_s / 0.5), "delay": 0.5,
    })
    start = {"name": "start in dependency order and wait for readiness (as primectl's waves + gate)",
             "hosts": "deploy", "gather_facts": False, "tasks": tasks}
    playbook = out / "up.yml"
    playbook.write_text(json.dumps([stage, start], indent=1))  # JSON is YAML
    (out / "empty.yml").write_text(json.dumps([{"name": "start-up only", "hosts": "localhost",
                                                "gather_facts": False, "tasks": []}]))
    return playbook


RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


class Ansible:
    """ansible-playbook runs of one generated project."""

    def __init__(self, project: Path, bindir: Path, logs: Path):
        self.project, self.bindir, self.logs = project, bindir, logs
        self.env = os.environ | {
            "ANSIBLE_CONFIG": str(project / "ansible.cfg"), "ANSIBLE_HOME": str(project / "home"),
            "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PYTHONDONTWRITEBYTECODE": "",
        }
        self.runs = 0

    def play(self, playbook: str) -> tuple[float, float, dict[str, tuple[int, int, int, int]], str]:
        """Run a playbook: (wall s, CPU s of ansible-playbook and its waited children, recap per host, log path)."""
        self.runs += 1
        log = self.logs / f"{self.project.name}-{self.runs}-{playbook}.log"
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        with open(log, "wb") as f:
            r = subprocess.run([str(self.bindir / "ansible-playbook"), str(self.project / playbook)],
                               cwd=self.project, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=900)
        wall = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
        text = log.read_text(errors="replace")
        recap = {m[1]: (int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in RECAP.finditer(text)}
        if r.returncode != 0:
            raise RuntimeError(f"ansible-playbook {playbook} exited {r.returncode}; see {log}:\n{text[-3000:]}")
        return wall, cpu, recap, str(log)

    def close_masters(self) -> None:
        """Close the ControlPersist masters (by their control sockets), so the next run connects afresh."""
        for sock in (self.project / "cp").iterdir():
            subprocess.run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                           capture_output=True, timeout=10)
        deadline = time.monotonic() + 5
        while any((self.project / "cp").iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)


def stop_by_pidfiles(workdirs: list[str]) -> int:
    """Stop what the Ansible run started: each run/*.pid's process group, only if its starttime still matches;
    then remove the workdirs. The number of services stopped."""
    from primectl.host.processes import starttime

    pids = []
    for wd in workdirs:
        for pidfile in sorted(Path(wd, "run").glob("*.pid")):
            try:
                pid_s, start = pidfile.read_text().split()
            except (OSError, ValueError):
                continue
            pid = int(pid_s)
            if starttime(pid) == start:
                try:
                    os.killpg(pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
                pids.append(pid)
    left = wait_gone(pids, 30)
    for pid in left:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_gone(left, 5)
    for wd in workdirs:
        shutil.rmtree(wd, ignore_errors=True)
    return len(pids)


def load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=18)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of primectl then Ansible")
    ap.add_argument("--ansible-bin", default=str(REPO / ".venv-bench" / "bin"))
    ap.add_argument("--keep-logs", help="copy Ansible's output and the generated playbook here")
    ap.add_argument("--ansible-config", choices=ANSIBLE_CONFIGS, default="tuned",
                    help="tuned: forks = the host count, pipelining, ControlPersist 120 s; defaults: what "
                         "ansible-core does when ansible.cfg sets none of them (forks 5, no pipelining)")
    opts = ap.parse_args()
    bindir = Path(opts.ansible_bin)
    if not (bindir / "ansible-playbook").exists():
        print(f"fanout_ansible: {bindir / 'ansible-playbook'} is missing: run `make bench-tools`", file=sys.stderr)
        return 2
    problem = netns_problem(RUN_HINT)
    if problem:
        print(f"fanout_ansible: refusing to start sshd: {problem}", file=sys.stderr)
        return 2
    stop_on_sigterm()
    version = subprocess.run([str(bindir / "ansible-playbook"), "--version"], capture_output=True, text=True
                             ).stdout.split("\n", 1)[0].strip()
    n = opts.hosts

    from primectl.deploy.cluster import ConnectionPolicy
    try:  # where `up` lives (it moved from primectl/deploy/pipeline.py to primectl/pipeline.py)
        from primectl.pipeline import UpOptions, up
    except ImportError:
        from primectl.deploy.pipeline import UpOptions, up  # type: ignore[no-redef]
    try:  # where the known_hosts file is planned (it moved from Plan.known_hosts to the SSH target's options)
        from primectl.deploy.access import ssh_options

        def known_hosts(plan: Any) -> str | None:
            return ssh_options(plan).known_hosts
    except ImportError:
        def known_hosts(plan: Any) -> str | None:
            return cast(str | None, plan.known_hosts)
    from primectl.targets.ssh import SSHTarget

    rows: dict[str, list[float]] = {k: [] for k in ("p_fresh", "p_noop", "a_fresh", "a_noop", "a_startup")}
    busy: dict[float, float] = {}  # primectl's fresh up: its time -> the machine's busy CPU meanwhile
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="primectl-fanans-") as tmp:
        base = Path(tmp)
        logs = base / "logs"
        logs.mkdir()
        t_start, cluster = timed(lambda: start_hosts(base / "hosts", n))
        cluster.known_hosts(cluster.base / "known_hosts")
        cores = os.cpu_count() or 1
        tuning = ansible_tuning(opts.ansible_config, n)[0]
        print(f"started {n} sshd hosts in {t_start:.2f}s; {cores} cores, {load_text()} (1/5 min); {version}; "
              f"{opts.repeat} rounds of primectl `up` (in-process) then ansible-playbook ({tuning}, no facts)")
        projects: list[str] = []
        try:
            run = 0
            for rep in range(opts.repeat):
                # -- A: primectl ---------------------------------------------------------------------------
                run += 1
                name = f"pc{n}-r{rep}"
                plan = load(recipe(name, cluster, n, 10_000 + 100 * run), base / f"{name}.yaml")
                options = UpOptions(connection=ConnectionPolicy(known_hosts=known_hosts(plan)), preflight=False,
                                    smoke=False)
                loads.append(os.getloadavg()[0])
                before = load_text()
                c0, b0 = resource.getrusage(resource.RUSAGE_SELF), cpu_busy_s()
                secs, res = timed(partial(up, plan, options, quiet))
                c1 = resource.getrusage(resource.RUSAGE_SELF)
                busy[secs] = cpu_busy_s() - b0
                assert len(res.started) == len(plan.services), res
                rows["p_fresh"].append(secs)
                cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
                print(f"[{rep + 1}] primectl fresh up:        {secs:7.3f}s  controller CPU {cpu:5.2f}s  "
                      f"{len(plan.services)} services  ({before})")
                c0 = resource.getrusage(resource.RUSAGE_SELF)
                s, r = timed(partial(up, plan, options, quiet))
                c1 = resource.getrusage(resource.RUSAGE_SELF)
                assert not r.started, r
                rows["p_noop"].append(s)
                cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
                print(f"[{rep + 1}] primectl zero-change up:  {s:7.3f}s  controller CPU {cpu:5.2f}s  ({load_text()})")
                SSHTarget().down(plan, options.connection, quiet, purge=True, break_lock=False)

                # -- B: Ansible ----------------------------------------------------------------------------
                run += 1
                name = f"an{n}-r{rep}"
                plan = load(recipe(name, cluster, n, 10_000 + 100 * run), base / f"{name}.yaml")
                project = base / name
                ansible_project(plan, cluster, project, opts.ansible_config)
                ans = Ansible(project, bindir, logs)
                projects.append(str(project))
                workdirs = [h.workdir for h in plan.hosts]
                try:
                    w, _, _, _ = ans.play("empty.yml")
                    rows["a_startup"].append(w)
                    loads.append(os.getloadavg()[0])
                    before = load_text()
                    w, cpu, recap, log = ans.play("up.yml")
                    alive = [pid_alive(int(f.read_text().split()[0]))
                             for wd in workdirs for f in Path(wd, "run").glob("*.pid")]
                    assert len(alive) == len(plan.services) and all(alive), (alive, log)
                    assert len(recap) == n and all(v[2] == v[3] == 0 for v in recap.values()), (recap, log)
                    rows["a_fresh"].append(w)
                    print(f"[{rep + 1}] Ansible fresh run:        {w:7.3f}s  ansible-playbook CPU {cpu:5.2f}s  "
                          f"{sum(alive)} services running  ({before})")
                    w, cpu, recap, log = ans.play("up.yml")
                    changed = sum(v[1] for v in recap.values())
                    assert len(recap) == n and changed == 0 and all(v[3] == 0 for v in recap.values()), (recap, log)
                    rows["a_noop"].append(w)
                    print(f"[{rep + 1}] Ansible zero-change run:  {w:7.3f}s  ansible-playbook CPU {cpu:5.2f}s  "
                          f"changed=0 on all {len(recap)} hosts  ({load_text()})")
                finally:
                    ans.close_masters()
                    stop_by_pidfiles(workdirs)
            if opts.keep_logs:
                keep = Path(opts.keep_logs)
                keep.mkdir(parents=True, exist_ok=True)
                for f in logs.iterdir():
                    shutil.copy(f, keep / f.name)
                last = base / f"an{n}-r{opts.repeat - 1}"
                for generated in ("up.yml", "inventory.json", "ansible.cfg"):
                    shutil.copy(last / generated, keep / generated)
        finally:
            for made in projects:
                if Path(made, "cp").is_dir():
                    Ansible(Path(made), bindir, logs).close_masters()
            left = kill_leftovers(cluster.base)
            cluster.stop()
            if left:
                print(f"safety net killed {len(left)} leftover process(es)", file=sys.stderr)

    def best_med(key: str) -> tuple[float, float]:
        return min(rows[key]), statistics.median(rows[key])

    pf, pn, af, an, st = (best_med(k) for k in ("p_fresh", "p_noop", "a_fresh", "a_noop", "a_startup"))
    print()
    print(f"{n} hosts, {opts.repeat} alternating rounds, {tuning}; load average (1 min) at the measurements "
          f"{min(loads):.1f}..{max(loads):.1f} on {os.cpu_count()} cores")
    print(f"{'':28}{'primectl':>10}{'Ansible':>10}   ratio (best; median)")
    print(f"{'fresh (best)':28}{pf[0]:9.3f}s{af[0]:9.3f}s   primectl {af[0] / pf[0]:.1f}x faster "
          f"(median {af[1] / pf[1]:.1f}x)")
    print(f"{'fresh, Ansible less start-up':28}{pf[0]:9.3f}s{af[0] - st[0]:9.3f}s   primectl "
          f"{(af[0] - st[0]) / pf[0]:.1f}x faster (ansible-playbook of an empty play: {st[0]:.2f}s)")
    print(f"{'zero-change (best)':28}{pn[0]:9.3f}s{an[0]:9.3f}s   primectl {an[0] / pn[0]:.1f}x faster "
          f"(median {an[1] / pn[1]:.1f}x)")
    ok = True
    good = af[0] / pf[0] >= TARGET_RATIO
    ok &= good
    print(f"target: Ansible fresh / primectl fresh >= {TARGET_RATIO:g}x on {n} hosts: {af[0] / pf[0]:.1f}x "
          f"{'OK' if good else 'MISSED'}")
    # The simulated hosts' sshd, agents and services share this machine's cores with primectl: no schedule runs
    # its best fresh up in less than the CPU the machine spent meanwhile, divided among the cores.
    cores = os.cpu_count() or 1
    floor = busy[pf[0]] / cores
    print(f"  on this machine primectl's fresh up >= {floor:.3f}s (the machine's busy CPU during its best one, "
          f"{busy[pf[0]]:.2f}s, / {cores} cores), so the ratio <= {af[0] / floor:.1f}x with this Ansible time")
    target = TARGET_NOOP_S.get(n)
    if target is not None:
        good = pn[0] < target
        ok &= good
        print(f"target: primectl zero-change up on {n} hosts < {target:g} s: {pn[0]:.3f}s {'OK' if good else 'MISSED'}")
    print("what differs: primectl also locks, inspects every host (state, liveness, taken ports), writes the secrets "
          "file and state.json, prunes old releases and rolls back on failure, none of which the playbook does; both "
          "ship the same rendered release, start the same run scripts in the same waves the same way and wait for "
          "the same probes and gate; Ansible's times include its own start-up (shown apart); its zero-change rerun "
          "checks every task on every host but probes nothing; primectl renders inside its timed `up`, Ansible's "
          "files are written before its clock starts.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

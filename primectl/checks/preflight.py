"""`primectl preflight`: host checks before a launch, and the gate `up` runs first.

Per host, in parallel: SSH and privileges, OS/python3, disk at the workdir and
the model path, model weights, ports, clock skew, host DRAM for the Mooncake
tier, runtime versions against the pins; on GPU profiles the GPUs, driver,
ECC/Xid, NVLink, IB/RoCE, nvidia_peermem, NUMA and the kernel self-test per
GPU. Then the fabric: a NIXL READ from every prefill host to every decode host
(DRAM over UCX; GPU memory too where the hosts have GPUs) and a Mooncake store
put/get through a master. Every check ends pass / warn / fail / n/a with a
one-line remediation; any fail makes `preflight` exit 1 and `up` refuse.

Facts come from preflight_host.py (stdlib, `python3 -c`, like the deploy
agent); verdicts from preflight_rules.py (pure). Probes that need the runtime
(nixl_probe.py, mooncake_roundtrip.py, the kernels self-test) are copied into
<workdir>/preflight/<run>/ and removed afterwards; every process they start is
stopped by pid.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import shlex
import statistics
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, TextIO

from primectl.checks import preflight_rules as rules
from primectl.checks.preflight_rules import HostNeeds, Result, Transfer, fail, na, ok
from primectl.deploy.client import HostClient
from primectl.deploy.cluster import Cluster, ConnectionPolicy, Say, open_cluster
from primectl.deploy.fanout import parallel
from primectl.deploy.protocol import Layout
from primectl.deploy.transport import Transport
from primectl.engines.mooncake import master_argv
from primectl.errors import DeployError
from primectl.output import print_table
from primectl.plan.model import Plan

CHECK_ORDER = ("ssh", "workdir", "access", "os", "disk_workdir", "disk_model", "model", "ports", "clock", "host_dram",
               "runtime", *rules.GPU_CHECKS, "nixl", "mooncake")
FACTS_TIMEOUT_S = 120
SELFTEST_TIMEOUT_S = 900
NIXL_TIMEOUT_S = 180
MOONCAKE_TIMEOUT_S = 120


@dataclass
class Report:
    """Everything preflight found."""

    deployment: str
    results: list[Result]
    transfers: list[Transfer] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status == "fail"]

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("pass", "warn", "fail", "n/a")}
        for r in self.results:
            out[r.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "ok": self.ok, "counts": self.counts(), "seconds": round(self.seconds, 2),
                "results": [r.to_dict() for r in self.results],
                "transfers": [{"src": t.src, "dst": t.dst, "mem": t.mem, "ok": t.ok, "gb_s": t.gb_s, "error": t.error}
                              for t in self.transfers]}

    def refusal(self) -> str:
        """The message `up` fails with: unreachable hosts first (as `up` itself words it), then every failed check."""
        lines = []
        unreachable = [r for r in self.failures if r.check == "ssh"]
        if unreachable:
            lines.append(f"connecting failed on {len(unreachable)} host(s); nothing was changed")
        lines.append(f"preflight failed ({len(self.failures)} check(s)); nothing was changed "
                     "(fix them, or pass --skip-preflight):")
        lines += [f"  {r.host} {r.check}: {r.detail} -> {r.remediation}" for r in self.failures]
        return "\n".join(lines)


# -- what the plan asks of each host ----------------------------------------------------------------

def host_needs(plan: Plan) -> dict[str, HostNeeds]:
    """Per host with services: roles, ports, runtime, model, GPUs, tier memory (no I/O)."""
    from primectl.deploy.provision import lock_file

    hw = plan.hardware
    tier = plan.serving.tier
    model = plan.serving.model
    hosts = [h for h in plan.hosts if plan.services_on(h.name)]
    out = {}
    for h in hosts:
        svcs = plan.services_on(h.name)
        rt = plan.serving.runtime[h.name]
        expected_stamp: str | None = None
        if rt.provisioned:
            try:
                expected_stamp = hashlib.sha256(lock_file(rt).read_bytes()).hexdigest()
            except OSError:
                expected_stamp = None
        ports: dict[int, str] = {}
        for s in svcs:
            for p in s.listens:
                ports.setdefault(p, s.name)
        out[h.name] = HostNeeds(
            name=h.name, address=h.address, workdir=h.workdir, roles=frozenset(s.role for s in svcs), ports=ports,
            runtime_python=rt.python, runtime_dir=rt.dir, provisioned=rt.provisioned, expected_stamp=expected_stamp,
            model_path="" if model.generate else model.path, weights_gb=model.weights_gb,
            generated_model=bool(model.generate), gpus=h.gpus if (hw.gpus_per_host or hw.gpu) else 0,
            gpu_name=hw.gpu, sm=hw.sm, tier_dram_gb=tier.dram_gb_per_host if tier else None,
            supervisor=plan.supervisor, multi_host=len(hosts) > 1,
            nvlink_expected=hw.hosts_per_nvlink_domain > 1 or hw.gpus_per_host > 1,
        )
    return out


def is_gpu_profile(plan: Plan) -> bool:
    """Whether the plan's hardware profile has GPUs."""
    return bool(plan.hardware.gpu) or plan.hardware.gpus_per_host > 0


# -- talking to hosts ------------------------------------------------------------------------------

def host_script() -> str:
    return files("primectl.checks").joinpath("preflight_host.py").read_text()


def _json_line(out: str) -> dict[str, Any] | None:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


def gather_facts(t: Transport, args: dict[str, Any]) -> dict[str, Any]:
    code, out, err = t.run(f"python3 -c {shlex.quote(host_script())} {shlex.quote(json.dumps(args))}",
                           timeout=FACTS_TIMEOUT_S)
    doc = _json_line(out)
    if doc is None:
        return {"ok": False, "error": (err or out).strip()[-500:] or f"exit {code}"}
    return doc


def measure_clock(t: Transport, tries: int = 3) -> tuple[float | None, float]:
    """(host clock - control clock, uncertainty): the try with the shortest round trip."""
    best: tuple[float | None, float] = (None, 0.0)
    for _ in range(tries):
        t0 = time.time()
        _, out, _ = t.run("date +%s.%N")
        t1 = time.time()
        try:
            host = float(out.strip())
        except ValueError:
            continue
        half = (t1 - t0) / 2
        if best[0] is None or half < best[1]:
            best = (host - (t0 + half), half)
    return best


class Session:
    """The open cluster's hosts plus a scratch directory per host for probes; cleans up afterwards."""

    def __init__(self, plan: Plan, needs: dict[str, HostNeeds], clients: dict[str, HostClient]):
        self.plan = plan
        self.needs = needs
        self.clients = clients
        self.t: dict[str, Transport] = {h: c.transport for h, c in clients.items()}
        self.run_id = uuid.uuid4().hex[:10]
        self._scratch: dict[str, str] = {}

    def spawn(self, host: str, argv: list[str], log: str) -> int | None:
        """Start a probe process in the host's scratch directory through the agent; its pid."""
        try:
            return self.clients[host].spawn(argv, cwd=self.scratch(host), log=log)
        except DeployError:
            return None

    def kill(self, host: str, pid: int, marker: str) -> None:
        """Stop a probe started by `spawn`, by pid (only if it is still ours)."""
        self.clients[host].kill(pid, marker)

    def scratch(self, host: str) -> str:
        if host not in self._scratch:
            d = Layout(self.needs[host].workdir).scratch(self.run_id)
            code, _, err = self.t[host].run(f"mkdir -p {shlex.quote(d)}")
            if code != 0:
                raise DeployError(f"{host}: cannot create {d}: {err.strip()}")
            self._scratch[host] = d
        return self._scratch[host]

    def put_resource(self, host: str, package: str, name: str) -> str:
        path = posixpath.join(self.scratch(host), name)
        self.t[host].put(files(package).joinpath(name).read_bytes(), path, 0o755)
        return path

    def cleanup(self) -> None:
        for host, d in self._scratch.items():
            try:
                self.t[host].run(f"rm -rf {shlex.quote(d)}; rmdir {shlex.quote(posixpath.dirname(d))} 2>/dev/null; true")
            except DeployError:
                pass


# -- GPU self-test ---------------------------------------------------------------------------------

def kernels_tar() -> bytes:
    """The `kernels` package (Python sources) as a tar, to run its self-test on the hosts."""
    import kernels

    root = Path(kernels.__file__).resolve().parent
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(root.glob("*.py")):
            info = tarfile.TarInfo(f"kernels/{p.name}")
            data = p.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def run_selftests(s: Session, host: str, gpus: int) -> list[dict[str, Any]]:
    """`python -m kernels.selftest --json` once per GPU (CUDA_VISIBLE_DEVICES), one after another."""
    n = s.needs[host]
    d = s.scratch(host)
    s.t[host].put(kernels_tar(), posixpath.join(d, "kernels.tar"))
    s.t[host].run(f"cd {shlex.quote(d)} && python3 -c 'import tarfile; tarfile.open(\"kernels.tar\").extractall(\".\")'")
    out = []
    for i in range(gpus):
        code, so, se = s.t[host].run(f"cd {shlex.quote(d)} && CUDA_VISIBLE_DEVICES={i} PYTHONPATH={shlex.quote(d)} "
                                     f"{shlex.quote(n.runtime_python)} -m kernels.selftest --json",
                                     timeout=SELFTEST_TIMEOUT_S)
        doc = _json_line(so) or {"status": "crash", "exit_code": code,
                                 "message": ((se or so).strip().splitlines() or [f"exit {code}"])[-1][:300]}
        if doc.get("status") == "fail":
            bad = [c["name"] for c in doc.get("checks", []) if not c.get("passed")]
            doc["message"] = "failed: " + ", ".join(bad)
        out.append({"gpu": i, **doc})
    return out


# -- NIXL ------------------------------------------------------------------------------------------

def nixl_pairs(plan: Plan) -> list[tuple[str, str]]:
    """(prefill host, decode host) for every prefill host and every decode host it may hand KV to."""
    pre = sorted({s.host for s in plan.services if s.role == "prefill"})
    dec = sorted({s.host for s in plan.services if s.role == "decode"})
    return [(p, d) for p in pre for d in dec]


def rounds(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Group pairs so no host is in two transfers at once (bandwidth figures stay honest)."""
    todo, out = list(pairs), []
    while todo:
        busy: set[str] = set()
        this = []
        for p in list(todo):
            if not ({p[0], p[1]} & busy):
                this.append(p)
                busy |= {p[0], p[1]}
                todo.remove(p)
        out.append(this)
    return out


def nixl_transfer(s: Session, src: str, dst: str, mem: str) -> Transfer:
    """Target on the prefill host, READ from the decode host; metadata moved through the controller."""
    ns, nd = s.needs[src], s.needs[dst]
    tag = f"{src}-{dst}-{mem}"
    probe_src = s.put_resource(src, "primectl.checks", "nixl_probe.py")
    probe_dst = probe_src if src == dst else s.put_resource(dst, "primectl.checks", "nixl_probe.py")
    dsrc, ddst = s.scratch(src), s.scratch(dst)
    meta = posixpath.join(dsrc, f"nixl-{tag}.json")
    log = posixpath.join(dsrc, f"nixl-{tag}.log")
    argv = [ns.runtime_python, probe_src, "serve", "--meta", meta, "--mem", mem, "--timeout", str(NIXL_TIMEOUT_S)]
    pid = s.spawn(src, argv, log)
    if pid is None:
        return Transfer(src, dst, mem, False, error="could not start the NIXL target")
    try:
        # Until the target wrote its metadata or is gone. Not `kill -0`: a target that died at once (a runtime
        # without nixl) is a zombie until the agent that spawned it reaps it, and a zombie takes signals, so the
        # loop waited out its whole minute, twice with the retry. Alive is a live state in /proc/PID/status.
        alive = f"grep -qs '^State:[[:space:]]*[RSDTtWIP]' /proc/{pid}/status"
        wait = (f"for i in $(seq 600); do [ -f {shlex.quote(meta)} ] && break; {alive} || break; "
                f"sleep 0.1; done; cat {shlex.quote(meta)} 2>/dev/null || {{ echo __NOMETA__; tail -n 5 {shlex.quote(log)}; }}")
        _, out, _ = s.t[src].run(wait, timeout=90)
        if "__NOMETA__" in out or not out.strip().startswith("{"):
            lines = [ln for ln in out.splitlines() if ln.strip() and "__NOMETA__" not in ln]
            return Transfer(src, dst, mem, False, error="target did not start: " + (lines[-1][:300] if lines else "no output"))
        dmeta = posixpath.join(ddst, f"nixl-{tag}.peer.json")
        s.t[dst].put(out.encode(), dmeta)
        code, so, se = s.t[dst].run(f"cd {shlex.quote(ddst)} && {shlex.quote(nd.runtime_python)} {shlex.quote(probe_dst)} "
                                    f"read --meta {shlex.quote(dmeta)} --mem {mem}", timeout=NIXL_TIMEOUT_S)
        doc = _json_line(so)
        if doc is None:
            return Transfer(src, dst, mem, False, error=((se or so).strip().splitlines() or [f"exit {code}"])[-1][:300])
        if not doc.get("ok"):
            return Transfer(src, dst, mem, False, error=str(doc.get("error"))[:300])
        return Transfer(src, dst, mem, True, gb_s=float(doc["gb_s"]), extra=doc)
    finally:
        s.kill(src, pid, "nixl_probe")


# -- Mooncake --------------------------------------------------------------------------------------

FREE_PORTS = ("import socket,sys\nss=[socket.socket() for _ in range(3)]\n"
              "[s.bind((sys.argv[1],0)) for s in ss]\nprint(' '.join(str(s.getsockname()[1]) for s in ss))")
WAIT_HTTP = ("import sys,time,urllib.request\nend=time.time()+float(sys.argv[2])\nwhile time.time()<end:\n"
             " try:\n  urllib.request.urlopen(sys.argv[1],timeout=2).read(); print('ready'); break\n"
             " except Exception: time.sleep(0.2)\nelse: print('timeout')")


def mooncake_check(s: Session, views: dict[str, Any], clients: list[str]) -> dict[str, Result]:
    """Put/get through the master from every worker host: the running master, or a temporary one."""
    tier = s.plan.serving.tier
    assert tier is not None
    mh = tier.master_host
    n = s.needs[mh]
    t = s.t[mh]
    running = (views.get(mh) or {}).get("services", {}).get("mooncake-master", {}).get("alive")
    pid = None
    ports = s.plan.service("mooncake-master").ports
    rpc, meta, metrics = ports["rpc"], ports["metadata"], ports["metrics"]
    where = "the deployment's master"
    try:
        if not running:
            _, out, _ = t.run(f"python3 -c {shlex.quote(FREE_PORTS)} {shlex.quote(n.address)}")
            rpc, meta, metrics = (int(x) for x in out.split()[-3:])
            binary = posixpath.join(posixpath.dirname(n.runtime_python), "mooncake_master")
            d = s.scratch(mh)
            pid = s.spawn(mh, master_argv(binary, n.address, rpc, meta, metrics), posixpath.join(d, "mooncake-master.log"))
            _, out, _ = t.run(f"python3 -c {shlex.quote(WAIT_HTTP)} http://{n.address}:{metrics}/health 30", timeout=60)
            if "ready" not in out:
                _, tail, _ = t.run(f"tail -n 3 {shlex.quote(posixpath.join(d, 'mooncake-master.log'))}")
                r = fail(mh, "mooncake", f"temporary mooncake_master did not become ready: {tail.strip()[-300:]}",
                         f"check {binary} runs on {mh} (libibverbs, ports)")
                return {h: r if h == mh else na(h, "mooncake", f"master on {mh} did not start") for h in clients}
            where = f"a temporary master on {mh}"

        def one(h: str) -> Result:
            probe = s.put_resource(h, "primectl.engines", "mooncake_roundtrip.py")
            ch = s.needs[h]
            code, so, se = s.t[h].run(
                f"cd {shlex.quote(s.scratch(h))} && {shlex.quote(ch.runtime_python)} {shlex.quote(probe)} "
                f"--master {n.address}:{rpc} --metadata http://{n.address}:{meta}/metadata "
                f"--local-hostname {shlex.quote(ch.address)} --protocol {tier.protocol}", timeout=MOONCAKE_TIMEOUT_S)
            if code == 0:
                return ok(h, "mooncake", f"put/get via {where} ({n.address}:{rpc}, {tier.protocol}): {so.strip()[-80:]}")
            last = ((se or so).strip().splitlines() or [f"exit {code}"])[-1][:300]
            return fail(h, "mooncake", f"put/get via {where} failed: {last}",
                        f"check {h} reaches {n.address}:{rpc}/{meta} and the transfer protocol ({tier.protocol})")

        res = parallel(one, clients)
        return {h: r if isinstance(r, Result) else fail(h, "mooncake", str(r), "check the host connection")
                for h, r in res.items()}
    finally:
        if pid is not None:
            s.kill(mh, pid, "mooncake_master")


# -- the whole run ---------------------------------------------------------------------------------

def run_preflight(cluster: Cluster, *, selftest: bool = True, fabric: bool = True) -> Report:
    """Every check on every host with services, on the cluster's open connections; never changes the deployment."""
    t0 = time.monotonic()
    plan, say = cluster.plan, cluster.say
    needs = host_needs(plan)
    hosts = list(needs)
    results: dict[tuple[str, str], Result] = {}

    def put(r: Result) -> None:
        results[(r.host, r.check)] = r

    for h, why in cluster.unreachable.items():
        put(fail(h, "ssh", why, "check the host is up, sshd runs, and hosts[].address/port/user/identity_file"))
        for check in CHECK_ORDER[1:]:
            put(na(h, check, "host unreachable"))
    host_clients = {h: c for h, c in cluster.clients.items() if h in needs and h in cluster.views}
    s = Session(plan, needs, host_clients)
    transfers: list[Transfer] = []
    try:
        gpu_profile = is_gpu_profile(plan)

        def probe(h: str) -> tuple[dict[str, Any], dict[str, Any], tuple[float | None, float]]:
            n = needs[h]
            view = dict(cluster.views.get(h) or {"ok": False, "error": "not inspected"})
            paths = [n.workdir] + ([n.model_path] if n.model_path else [])
            facts = gather_facts(s.t[h], {"paths": paths, "model_path": n.model_path if n.worker else "",
                                          "ports": sorted(n.ports), "address": n.address,
                                          "runtime_python": n.runtime_python, "runtime_dir": n.runtime_dir,
                                          "gpu": gpu_profile and n.gpus > 0})
            return view, facts, measure_clock(s.t[h])

        gathered = parallel(probe, list(host_clients))
        views: dict[str, dict[str, Any]] = {}
        facts_ok: dict[str, dict[str, Any]] = {}
        transports = s.t
        for h, g in gathered.items():
            if isinstance(g, BaseException):
                put(fail(h, "ssh", f"connection failed while checking: {g}", "check the host and retry"))
                for check in CHECK_ORDER[1:]:
                    put(na(h, check, "host unreachable"))
                continue
            view, facts, clock = g
            for r in host_results(plan, needs[h], view, facts, clock, gpu_profile):
                put(r)
            if view.get("ok"):
                views[h] = view
            if facts.get("ok"):
                facts_ok[h] = facts
        runtime_ok = {h for h, f in facts_ok.items() if rules.runtime_state(f.get("runtime", {})) == "ok"}

        # GPU self-test on hosts whose driver answered
        if gpu_profile:
            st_hosts = {h: len(f["gpu"].get("gpus", [])) for h, f in facts_ok.items()
                        if needs[h].gpus and (f.get("gpu") or {}).get("nvidia_smi") and f["gpu"].get("gpus")}
            for h in facts_ok:
                if not needs[h].gpus:
                    put(na(h, "selftest", "no GPUs on this host"))
                elif h not in st_hosts:
                    put(na(h, "selftest", "no usable NVIDIA driver (see gpu)"))
                elif h not in runtime_ok:
                    put(na(h, "selftest", "no runtime to run it with", rules.PROVISION_HINT))
                elif not selftest:
                    put(na(h, "selftest", "skipped (--no-selftest)"))
            runnable = [h for h in st_hosts if h in runtime_ok and selftest]
            if runnable:
                say(f"preflight: kernel self-test on {sum(st_hosts[h] for h in runnable)} GPU(s)")
                runs = parallel(lambda h: run_selftests(s, h, st_hosts[h]), runnable)
                good = {h: r for h, r in runs.items() if isinstance(r, list)}
                for res in rules.selftest_results(good):
                    put(res)
                for h, run in runs.items():
                    if isinstance(run, BaseException):
                        put(fail(h, "selftest", f"could not run: {run}", "check the host connection and workdir space"))
        else:
            for h in facts_ok:
                for check in rules.GPU_CHECKS:
                    put(na(h, check, "hardware profile cpu: no GPUs"))

        # fabric: NIXL between prefill and decode hosts, Mooncake through the master
        pending: dict[str, Result] = {}
        pairs = nixl_pairs(plan)
        involved = {h for p in pairs for h in p}

        def not_ready(h: str, check: str) -> Result | None:
            if h not in transports:
                return na(h, check, "host unreachable")
            if h not in facts_ok:
                return na(h, check, "host facts unavailable (see ssh/workdir)")
            if h not in runtime_ok:
                st = rules.runtime_state(facts_ok[h].get("runtime", {}))
                if st == "missing" and needs[h].provisioned:
                    return na(h, check, "no runtime yet", rules.PROVISION_HINT)
                return na(h, check, f"runtime {st} (see runtime)", "fix the runtime first")
            if not fabric:
                return na(h, check, "skipped (--no-fabric)")
            return None

        for h in hosts:
            blocked_nixl = not_ready(h, "nixl") if h in involved else None
            if blocked_nixl:
                pending[h] = blocked_nixl
        live_pairs = [p for p in pairs if p[0] not in pending and p[1] not in pending]
        for a, b in pairs:
            for x, y in ((a, b), (b, a)):
                if x in pending and y not in pending and (y, "nixl") not in results:
                    pending[y] = na(y, "nixl", f"peer {x} cannot run the probe (see its nixl)")
        if live_pairs:
            say(f"preflight: NIXL transfers for {len(live_pairs)} prefill->decode pair(s)")
        for rnd in rounds(live_pairs):
            got = parallel(lambda p: _pair_transfers(s, p, facts_ok), rnd)
            for p, tr in got.items():
                transfers += tr if isinstance(tr, list) else [Transfer(p[0], p[1], "DRAM", False, error=str(tr))]
        for res in rules.nixl_results([h for h in hosts if h in facts_ok or h in pending], transfers, pending):
            if (res.host, "nixl") not in results or results[(res.host, "nixl")].status == "n/a":
                put(res)

        tier = plan.serving.tier
        if tier is None:
            for h in facts_ok:
                put(na(h, "mooncake", "no Mooncake host tier"))
        else:
            clients = sorted({sv.host for sv in plan.services if sv.role in ("prefill", "decode")}) or [tier.master_host]
            blocked = {h: nr for h in {*clients, tier.master_host} if (nr := not_ready(h, "mooncake"))}
            for h in facts_ok:
                if h not in clients and h != tier.master_host:
                    put(na(h, "mooncake", "no worker on this host"))
            if blocked:
                for h in clients:
                    put(blocked.get(h) or na(h, "mooncake", f"{', '.join(sorted(blocked))} cannot run the probe (see there)"))
                if tier.master_host not in clients and tier.master_host in blocked:
                    put(blocked[tier.master_host])
            else:
                say(f"preflight: Mooncake put/get from {len(clients)} host(s)")
                for res in mooncake_check(s, views, clients).values():
                    put(res)
                if tier.master_host not in clients:
                    put(ok(tier.master_host, "mooncake", "master host (clients checked on the worker hosts)"))
    finally:
        s.cleanup()
    order = {c: i for i, c in enumerate(CHECK_ORDER)}
    hidx = {h: i for i, h in enumerate(hosts)}
    ordered = sorted(results.values(), key=lambda r: (hidx.get(r.host, 99), order.get(r.check, 99)))
    return Report(plan.name, ordered, transfers, time.monotonic() - t0)


def _pair_transfers(s: Session, pair: tuple[str, str], facts: dict[str, dict[str, Any]]) -> list[Transfer]:
    src, dst = pair
    out = [_with_retry(s, src, dst, "DRAM")]

    def has_gpu(h: str) -> bool:
        return bool(s.needs[h].gpus and ((facts[h].get("gpu") or {}).get("gpus")))

    if has_gpu(src) and has_gpu(dst):
        out.append(_with_retry(s, src, dst, "VRAM"))
    return out


def _with_retry(s: Session, src: str, dst: str, mem: str) -> Transfer:
    """One retry: a transfer that fails once and then works is reported (warn), not fatal."""
    first = nixl_transfer(s, src, dst, mem)
    if first.ok:
        return first
    second = nixl_transfer(s, src, dst, mem)
    if second.ok:
        second.extra["first_error"] = first.error
    return second


def host_results(plan: Plan, n: HostNeeds, view: dict[str, Any], facts: dict[str, Any],
                 clock: tuple[float | None, float], gpu_profile: bool) -> list[Result]:
    """Every per-host verdict from what the agent's inspect and preflight_host.py reported."""
    h = n.name
    out = []
    if not facts.get("ok"):
        out.append(fail(h, "ssh", f"ssh ok, but the fact script failed: {facts.get('error')}",
                        "check python3 on the host (the agent needs it)"))
        return out + [na(h, c, "no host facts") for c in CHECK_ORDER[1:] if c not in ("nixl", "mooncake")]
    hp = plan.host(h)
    out.append(ok(h, "ssh", "local connection (no ssh)" if hp.connection == "local"
                  else f"reachable ({hp.user}@{n.address}:{hp.port})"))
    if not view.get("ok"):
        out.append(fail(h, "workdir", str(view.get("error")), f"create {n.workdir} writable by {facts.get('user')}"))
    else:
        owner = (view.get("state") or {}).get("deployment")
        if owner and owner != plan.name:
            out.append(fail(h, "workdir", f"{n.workdir} holds deployment {owner!r}, not {plan.name!r}",
                            "give each deployment its own workdir (hosts[].workdir)"))
        else:
            running = sum(1 for v in view.get("services", {}).values() if v.get("alive"))
            out.append(ok(h, "workdir", f"{n.workdir} writable" + (f"; {running} service(s) of this deployment running"
                                                                    if running else "")))
    out.append(rules.check_access(n, str(facts.get("user")), int(facts.get("uid", -1)), facts.get("sudo")))
    out.append(rules.check_os(n, str(facts.get("os")), str(facts.get("kernel")), str(facts.get("python3"))))
    rt = facts.get("runtime", {})
    disk = facts.get("disk", {})
    out.append(rules.check_disk(h, "disk_workdir", n.workdir, disk.get(n.workdir),
                                rules.workdir_need(n, rules.runtime_state(rt) != "missing")))
    if n.model_path:
        out.append(rules.check_disk(h, "disk_model", n.model_path, disk.get(n.model_path), rules.MIN_FREE_BYTES))
    else:
        out.append(na(h, "disk_model", "no model.path (generated model)" if n.generated_model else "no model.path"))
    out.append(rules.check_model(n, facts.get("model", {})))
    out.append(rules.check_ports(n, facts.get("ports", {}), rules.ours_listening(view)))
    out.append(rules.check_clock(h, *clock))
    running_here = any(v.get("alive") for v in view.get("services", {}).values()) if view.get("ok") else False
    out.append(rules.check_dram(n, facts.get("mem", {}), running_here))
    out.append(rules.check_runtime(n, plan, rt))
    if gpu_profile:
        out += rules.gpu_checks(n, facts.get("gpu"))
    return out


# -- output ----------------------------------------------------------------------------------------

def print_report(report: Report, *, verbose: bool = True, stream: TextIO | None = None) -> None:
    """Host x check table (result, detail, remediation) and a summary line."""
    stream = stream or sys.stdout
    c = report.counts()
    title = (f"preflight {report.deployment}: {'OK' if report.ok else 'FAILED'} "
             f"({c['pass']} pass, {c['warn']} warn, {c['fail']} fail, {c['n/a']} n/a; {report.seconds:.1f}s)")
    rows, last = [], None
    for r in report.results:
        if not verbose and r.status in ("pass", "n/a"):
            continue
        rows.append([r.host if r.host != last else "", r.check, r.status, r.detail, r.remediation])
        last = r.host
    print_table(title, ["host", "check", "result", "detail", "remediation"], rows, fold="detail", stream=stream)
    good = [x for x in report.transfers if x.ok]
    if good:
        med = statistics.median(x.gb_s for x in good)
        stream.write(f"NIXL: {len(good)} transfer(s), median {med:.2f} GB/s "
                     f"(min {min(x.gb_s for x in good):.2f}, max {max(x.gb_s for x in good):.2f})\n")


def gate_up(cluster: Cluster) -> Report:
    """What `up` runs first, on its open cluster: DeployError (nothing changed) when any check fails."""
    say = cluster.say
    say("preflight: checking hosts before the launch (skip with --skip-preflight)")
    report = run_preflight(cluster)
    if not report.ok:
        print_report(report, verbose=False, stream=sys.stderr)
        raise DeployError(report.refusal())
    c = report.counts()
    say(f"preflight ok: {c['pass']} pass, {c['warn']} warn, {c['n/a']} n/a ({report.seconds:.1f}s)")
    for r in report.results:
        if r.status == "warn":
            say(f"  warn {r.host} {r.check}: {r.detail} -> {r.remediation}")
    return report


def preflight(plan: Plan, policy: ConnectionPolicy, say: Say, *, selftest: bool = True, fabric: bool = True) -> Report:
    """`primectl preflight`: connect to every host (unreachable ones are reported, not fatal) and check them."""
    cluster = open_cluster(plan, policy, say, tolerate_unreachable=True)
    try:
        return run_preflight(cluster, selftest=selftest, fabric=fabric)
    finally:
        cluster.close()

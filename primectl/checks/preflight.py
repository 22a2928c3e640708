"""`primectl preflight`: host checks before a launch, and the gate `up` runs first.

Per host, in parallel: SSH and privileges, OS/python3, disk at the workdir and
the model path, model weights, ports, clock skew, host DRAM for the Mooncake
tier, runtime versions against the pins; on GPU profiles the GPUs, driver,
ECC/Xid, NVLink, IB/RoCE, nvidia_peermem, NUMA and the kernel self-test per
GPU. Then the fabric: a NIXL READ from every prefill host to every decode host
(DRAM over UCX; GPU memory too where the hosts have GPUs) and a Mooncake store
put/get through a master. Every check ends pass / warn / fail / n/a with a
one-line remediation; any fail makes `preflight` exit 1 and `up` refuse.

A run is four phases, in `run_preflight` in this order: hosts that did not
connect; the host phase (facts from every reachable host, in parallel); the
GPU phase (the kernel self-test); the fabric phase (preflight_fabric.py).

Facts come from preflight_host.py (stdlib, `python3 -c`, like the deploy
agent); verdicts from preflight_rules.py (pure). Probes that need the runtime
(nixl_probe.py, mooncake_roundtrip.py, the kernels self-test) are copied into
<workdir>/preflight/<run>/ and removed afterwards; every process they start is
stopped by pid. The phases share a `Session`, what the host phase learnt and
the verdicts so far (preflight_session.py).
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
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, TextIO

from primectl.checks import preflight_rules as rules
from primectl.checks.preflight_fabric import run_fabric
from primectl.checks.preflight_rules import HostNeeds, Result, Transfer, fail, na, ok
from primectl.checks.preflight_session import Known, Session, Verdicts, json_line
from primectl.checks.report import Case, junit_xml, tally
from primectl.deploy.access import access
from primectl.deploy.cluster import Cluster, ConnectionPolicy, Say, open_cluster
from primectl.deploy.fanout import parallel
from primectl.deploy.transport import Transport
from primectl.errors import DeployError
from primectl.output import print_table
from primectl.plan.model import Plan

CHECK_ORDER = ("ssh", "workdir", "access", "os", "disk_workdir", "disk_model", "model", "ports", "clock", "host_dram",
               "runtime", *rules.GPU_CHECKS, "nixl", "mooncake")
FACTS_TIMEOUT_S = 120
SELFTEST_TIMEOUT_S = 900


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
        return tally(r.status for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "ok": self.ok, "counts": self.counts(), "seconds": round(self.seconds, 2),
                "results": [r.to_dict() for r in self.results],
                "transfers": [{"src": t.src, "dst": t.dst, "mem": t.mem, "ok": t.ok, "gb_s": t.gb_s, "error": t.error}
                              for t in self.transfers]}

    def to_junit(self) -> str:
        """JUnit XML (report.py's, as smoke's): one testcase per host and check, grouped by host."""
        cases = [Case(f"primectl.preflight.{r.host}", r.check, r.status, r.detail,
                      text=r.detail + (f"\n-> {r.remediation}" if r.remediation else "")) for r in self.results]
        return junit_xml(f"primectl preflight {self.deployment}", cases, failure_type="PreflightFailure",
                         properties={"deployment": self.deployment}, seconds=self.seconds)

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


def gather_facts(t: Transport, args: dict[str, Any]) -> dict[str, Any]:
    code, out, err = t.run(f"python3 -c {shlex.quote(host_script())} {shlex.quote(json.dumps(args))}",
                           timeout=FACTS_TIMEOUT_S)
    doc = json_line(out)
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


# -- GPU self-test ---------------------------------------------------------------------------------

def kernels_tar() -> bytes:
    """The `primectl_kernels` package (Python sources) as a tar, to run its self-test on the hosts
    (found by import, so a wheel install ships the same files as a checkout)."""
    import primectl_kernels

    root = Path(primectl_kernels.__file__).resolve().parent
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(root.glob("*.py")):
            info = tarfile.TarInfo(f"primectl_kernels/{p.name}")
            data = p.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def run_selftests(s: Session, host: str, gpus: int) -> list[dict[str, Any]]:
    """`python -m primectl_kernels.selftest --json` once per GPU (CUDA_VISIBLE_DEVICES), one after another."""
    n = s.needs[host]
    d = s.scratch(host)
    s.t[host].put(kernels_tar(), posixpath.join(d, "primectl_kernels.tar"))
    s.t[host].run(f"cd {shlex.quote(d)} && python3 -c 'import tarfile; tarfile.open(\"primectl_kernels.tar\").extractall(\".\")'")
    out = []
    for i in range(gpus):
        code, so, se = s.t[host].run(f"cd {shlex.quote(d)} && CUDA_VISIBLE_DEVICES={i} PYTHONPATH={shlex.quote(d)} "
                                     f"{shlex.quote(n.runtime_python)} -m primectl_kernels.selftest --json",
                                     timeout=SELFTEST_TIMEOUT_S)
        doc = json_line(so) or {"status": "crash", "exit_code": code,
                                 "message": ((se or so).strip().splitlines() or [f"exit {code}"])[-1][:300]}
        if doc.get("status") == "fail":
            bad = [c["name"] for c in doc.get("checks", []) if not c.get("passed")]
            doc["message"] = "failed: " + ", ".join(bad)
        out.append({"gpu": i, **doc})
    return out


# -- the whole run, phase by phase ------------------------------------------------------------------

def run_preflight(cluster: Cluster, *, selftest: bool = True, fabric: bool = True) -> Report:
    """Every check on every host with services, on the cluster's open connections; never changes the deployment."""
    t0 = time.monotonic()
    plan = cluster.plan
    needs = host_needs(plan)
    verdicts = Verdicts()
    unreachable_phase(cluster, verdicts)
    s = Session(plan, needs, {h: c for h, c in cluster.clients.items() if h in needs and h in cluster.views})
    transfers: list[Transfer] = []
    try:
        known = host_phase(cluster, s, verdicts)
        gpu_phase(s, known, verdicts, cluster.say, selftest=selftest)
        transfers = run_fabric(s, known, verdicts, cluster.say, enabled=fabric)
    finally:
        s.cleanup()
    return Report(plan.name, in_order(verdicts, list(needs)), transfers, time.monotonic() - t0)


def _unreachable(verdicts: Verdicts, h: str, why: str, fix: str) -> None:
    verdicts.put(fail(h, "ssh", why, fix))
    for check in CHECK_ORDER[1:]:
        verdicts.put(na(h, check, "host unreachable"))


def unreachable_phase(cluster: Cluster, verdicts: Verdicts) -> None:
    """Phase 1: hosts the cluster could not connect to fail `ssh`; every other check of theirs is n/a."""
    for h, why in cluster.unreachable.items():
        _unreachable(verdicts, h, why, "check the host is up, sshd runs, and hosts[].address/port/user/identity_file")


def host_phase(cluster: Cluster, s: Session, verdicts: Verdicts) -> Known:
    """Phase 2: facts from every reachable host, in parallel, and every per-host verdict on them."""
    plan, needs = s.plan, s.needs
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

    known = Known()
    for h, g in parallel(probe, list(s.clients)).items():
        if isinstance(g, BaseException):
            _unreachable(verdicts, h, f"connection failed while checking: {g}", "check the host and retry")
            continue
        view, facts, clock = g
        for r in host_results(plan, needs[h], view, facts, clock, gpu_profile):
            verdicts.put(r)
        if view.get("ok"):
            known.views[h] = view
        if facts.get("ok"):
            known.facts[h] = facts
    # a venv whose install never finished runs nothing: the probes wait for the one `up` installs
    known.runtime_ok = {h for h, f in known.facts.items() if rules.runtime_state(f.get("runtime", {})) == "ok"
                        and not rules.install_unfinished(needs[h], f.get("runtime", {}))}
    return known


def gpu_phase(s: Session, known: Known, verdicts: Verdicts, say: Say, *, selftest: bool = True) -> None:
    """Phase 3: the kernel self-test on every GPU of hosts whose driver answered (CPU profiles: GPU checks n/a)."""
    needs, facts_ok = s.needs, known.facts
    if not is_gpu_profile(s.plan):
        for h in facts_ok:
            for check in rules.GPU_CHECKS:
                verdicts.put(na(h, check, "hardware profile cpu: no GPUs"))
        return
    st_hosts = {h: len(f["gpu"].get("gpus", [])) for h, f in facts_ok.items()
                if needs[h].gpus and (f.get("gpu") or {}).get("nvidia_smi") and f["gpu"].get("gpus")}
    for h in facts_ok:
        if not needs[h].gpus:
            verdicts.put(na(h, "selftest", "no GPUs on this host"))
        elif h not in st_hosts:
            verdicts.put(na(h, "selftest", "no usable NVIDIA driver (see gpu)"))
        elif rules.install_unfinished(needs[h], facts_ok[h].get("runtime", {})):
            verdicts.put(na(h, "selftest", rules.UNFINISHED, rules.PROVISION_HINT))
        elif h not in known.runtime_ok:
            verdicts.put(na(h, "selftest", "no runtime to run it with", rules.PROVISION_HINT))
        elif not selftest:
            verdicts.put(na(h, "selftest", "skipped (--no-selftest)"))
    runnable = [h for h in st_hosts if h in known.runtime_ok and selftest]
    if not runnable:
        return
    say(f"preflight: kernel self-test on {sum(st_hosts[h] for h in runnable)} GPU(s)")
    runs = parallel(lambda h: run_selftests(s, h, st_hosts[h]), runnable)
    good = {h: r for h, r in runs.items() if isinstance(r, list)}
    for res in rules.selftest_results(good):
        verdicts.put(res)
    for h, run in runs.items():
        if isinstance(run, BaseException):
            verdicts.put(fail(h, "selftest", f"could not run: {run}", "check the host connection and workdir space"))


def in_order(verdicts: Verdicts, hosts: list[str]) -> list[Result]:
    """The verdicts by host (the plan's order), then by check (CHECK_ORDER)."""
    order = {c: i for i, c in enumerate(CHECK_ORDER)}
    hidx = {h: i for i, h in enumerate(hosts)}
    return sorted(verdicts.values(), key=lambda r: (hidx.get(r.host, 99), order.get(r.check, 99)))


def host_results(plan: Plan, n: HostNeeds, view: dict[str, Any], facts: dict[str, Any],
                 clock: tuple[float | None, float], gpu_profile: bool) -> list[Result]:
    """Every per-host verdict from what the agent's inspect and preflight_host.py reported."""
    h = n.name
    out = []
    if not facts.get("ok"):
        out.append(fail(h, "ssh", f"ssh ok, but the fact script failed: {facts.get('error')}",
                        "check python3 on the host (the agent needs it)"))
        return out + [na(h, c, "no host facts") for c in CHECK_ORDER[1:] if c not in ("nixl", "mooncake")]
    hp = access(plan.host(h))
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

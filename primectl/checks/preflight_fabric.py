"""Preflight's fabric phase: probes that move bytes between hosts, as the deployment will.

- NIXL: a READ from every prefill host to every decode host it may hand KV to,
  DRAM over UCX, and GPU memory too where both hosts have GPUs
  (`nixl_probe.py` serves on the prefill host, reads on the decode host; the
  metadata goes through the controller). Pairs run in rounds in which no host
  takes part twice, so the bandwidth figures stay honest; a transfer that fails
  once is tried once more (passing the second time is a warn).
- Mooncake: a put/get through the master from every worker host
  (`mooncake_roundtrip.py`), against the deployment's running master or a
  temporary one started (and stopped by pid) for the check.

A host that cannot run a probe (unreachable, no facts, no working runtime,
`--no-fabric`) gets n/a with the reason, and so does its peer.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable
from typing import Any

from primectl.checks import preflight_rules as rules
from primectl.checks.preflight_rules import Result, Transfer, fail, na, ok
from primectl.checks.preflight_session import Known, Session, Verdicts, json_line
from primectl.components.mooncake import master_argv
from primectl.deploy.fanout import parallel
from primectl.plan.model import Plan

NIXL_TIMEOUT_S = 180
MOONCAKE_TIMEOUT_S = 120


def run_fabric(s: Session, known: Known, verdicts: Verdicts, say: Callable[[str], None], *,
               enabled: bool = True) -> list[Transfer]:
    """Phase 4 of a preflight run: the NIXL transfers, then the Mooncake round trips; every transfer made."""
    transfers = nixl_phase(s, known, verdicts, say, enabled=enabled)
    mooncake_phase(s, known, verdicts, say, enabled=enabled)
    return transfers


def blocked(s: Session, known: Known, h: str, check: str, *, enabled: bool) -> Result | None:
    """Why host `h` cannot run the `check` probe (an n/a Result), None when it can."""
    if h not in s.t:
        return na(h, check, "host unreachable")
    if h not in known.facts:
        return na(h, check, "host facts unavailable (see ssh/workdir)")
    if h not in known.runtime_ok:
        facts = known.facts[h].get("runtime", {})
        st = rules.runtime_state(facts)
        if st == "missing" and s.needs[h].provisioned:
            return na(h, check, "no runtime yet", rules.PROVISION_HINT)
        if st == "ok" and rules.install_unfinished(s.needs[h], facts):
            return na(h, check, rules.UNFINISHED, rules.PROVISION_HINT)
        return na(h, check, f"runtime {st} (see runtime)", "fix the runtime first")
    if not enabled:
        return na(h, check, "skipped (--no-fabric)")
    return None


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


def nixl_phase(s: Session, known: Known, verdicts: Verdicts, say: Callable[[str], None], *,
               enabled: bool = True) -> list[Transfer]:
    """One `nixl` row per host with facts (or a blocked one): the transfers of every runnable pair."""
    hosts = list(s.needs)
    pairs = nixl_pairs(s.plan)
    involved = {h for p in pairs for h in p}
    pending: dict[str, Result] = {}
    for h in hosts:
        why = blocked(s, known, h, "nixl", enabled=enabled) if h in involved else None
        if why:
            pending[h] = why
    live_pairs = [p for p in pairs if p[0] not in pending and p[1] not in pending]
    for a, b in pairs:
        for x, y in ((a, b), (b, a)):
            if x in pending and y not in pending and verdicts.status(y, "nixl") is None:
                pending[y] = na(y, "nixl", f"peer {x} cannot run the probe (see its nixl)")
    if live_pairs:
        say(f"preflight: NIXL transfers for {len(live_pairs)} prefill->decode pair(s)")
    transfers: list[Transfer] = []
    for rnd in rounds(live_pairs):
        got = parallel(lambda p: _pair_transfers(s, p, known.facts), rnd)
        for p, tr in got.items():
            transfers += tr if isinstance(tr, list) else [Transfer(p[0], p[1], "DRAM", False, error=str(tr))]
    for res in rules.nixl_results([h for h in hosts if h in known.facts or h in pending], transfers, pending):
        if verdicts.status(res.host, "nixl") in (None, "n/a"):
            verdicts.put(res)
    return transfers


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
        doc = json_line(so)
        if doc is None:
            return Transfer(src, dst, mem, False, error=((se or so).strip().splitlines() or [f"exit {code}"])[-1][:300])
        if not doc.get("ok"):
            return Transfer(src, dst, mem, False, error=str(doc.get("error"))[:300])
        return Transfer(src, dst, mem, True, gb_s=float(doc["gb_s"]), extra=doc)
    finally:
        s.kill(src, pid, "nixl_probe")


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


# -- Mooncake --------------------------------------------------------------------------------------

FREE_PORTS = ("import socket,sys\nss=[socket.socket() for _ in range(3)]\n"
              "[s.bind((sys.argv[1],0)) for s in ss]\nprint(' '.join(str(s.getsockname()[1]) for s in ss))")
WAIT_HTTP = ("import sys,time,urllib.request\nend=time.time()+float(sys.argv[2])\nwhile time.time()<end:\n"
             " try:\n  urllib.request.urlopen(sys.argv[1],timeout=2).read(); print('ready'); break\n"
             " except Exception: time.sleep(0.2)\nelse: print('timeout')")


def mooncake_phase(s: Session, known: Known, verdicts: Verdicts, say: Callable[[str], None], *,
                   enabled: bool = True) -> None:
    """One `mooncake` row per host with facts: n/a without a host tier, else a put/get from every worker host."""
    tier = s.plan.serving.tier
    if tier is None:
        for h in known.facts:
            verdicts.put(na(h, "mooncake", "no Mooncake host tier"))
        return
    clients = sorted({sv.host for sv in s.plan.services if sv.role in ("prefill", "decode")}) or [tier.master_host]
    stopped = {h: why for h in {*clients, tier.master_host} if (why := blocked(s, known, h, "mooncake", enabled=enabled))}
    for h in known.facts:
        if h not in clients and h != tier.master_host:
            verdicts.put(na(h, "mooncake", "no worker on this host"))
    if stopped:
        for h in clients:
            verdicts.put(stopped.get(h) or na(h, "mooncake", f"{', '.join(sorted(stopped))} cannot run the probe (see there)"))
        if tier.master_host not in clients and tier.master_host in stopped:
            verdicts.put(stopped[tier.master_host])
        return
    say(f"preflight: Mooncake put/get from {len(clients)} host(s)")
    for res in mooncake_check(s, known.views, clients).values():
        verdicts.put(res)
    if tier.master_host not in clients:
        verdicts.put(ok(tier.master_host, "mooncake", "master host (clients checked on the worker hosts)"))


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
            probe = s.put_resource(h, "primectl.components", "mooncake_roundtrip.py")
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

"""Predicting a plan's serving figures with NVIDIA's aiconfigurator 0.12.0 (`primectl predict`).

One job: map a Plan to one `aiconfigurator cli estimate --estimate-mode disagg` point, run it, and
parse what it says. The numbers are aiconfigurator's predictions from its perf database, never
measurements, and they travel with its own warnings.

aiconfigurator lives in its own virtual environment (pandas, pyarrow, plotly, bokeh, ... are not
primectl's). Lookup order: $PRIMECTL_AICONFIGURATOR, `.venv-predict/bin/aiconfigurator` in the current
directory and in the source checkout, then `predict_venv()`; else it is installed there on first use.

Facts checked against the installed 0.12.0 (aiconfigurator/cli/main.py, cli/api.py, sdk/):
- `cli estimate` is argparse over `cli.api.cli_estimate`, which returns an EstimateResult whose `raw`
  row holds every figure the console table prints (ttft, tpot, tokens/s, tokens/s/gpu, tokens/s/user,
  seq/s, concurrency, per-role parallelism, quant modes, memory). There is no JSON output, so a small
  driver (`_DRIVER`) parses the argv with aiconfigurator's own parser, runs its own `cli.main.main`,
  keeps the EstimateResult it produces and the WARNING records of its loggers, and prints them as JSON.
  The argv recorded in a Prediction runs unchanged as `aiconfigurator cli estimate ...`.
- Disagg: prefill runs `static_ctx` at --p-bs per attention-DP rank, decode `static_gen` at --d-bs per
  rank; throughput is rate-matched between --p-workers and --d-workers. TTFT is the prefill latency
  (no queueing); no term for the KV transfer between the roles. A decode batch whose KV does not fit
  raises the same "OOM: ... does not fit" as weights that do not fit.
- KV cache quant modes are bfloat16, int8 and fp8 only; decode context parallelism has no flag.
- A model id that is not among its bundled configs (aiconfigurator_core/model_configs) is fetched
  from Hugging Face; the driver only passes bundled ids.
- Its `cli estimate` prints a deprecation notice pointing at `aisimulate` (an uninstallable stub
  here); the driver does not call that notice and any that reaches it is dropped.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from primectl.plan.model import Plan, RoleCapacity

AICONFIGURATOR_VERSION = "0.12.0"
PACKAGES = (f"aiconfigurator=={AICONFIGURATOR_VERSION}", f"aiconfigurator-core=={AICONFIGURATOR_VERSION}")
INSTALL_HINT = (f"python3 -m venv .venv-predict && .venv-predict/bin/pip install {' '.join(PACKAGES)} "
                "(or set PRIMECTL_AICONFIGURATOR to an aiconfigurator executable)")
_REPO = Path(__file__).resolve().parents[2]

#: GPU name as the hardware profile gives it (nvidia-smi's) -> aiconfigurator's system name.
SYSTEMS: dict[str, str] = {"NVIDIA GB200": "gb200", "NVIDIA H200": "h200_sxm"}
#: aiconfigurator's backends; a plan whose engine has one of these names maps to it.
BACKENDS = ("vllm", "sglang", "trtllm")
#: The recipe's kv.dtype -> --kvcache-quant-mode (None: left to aiconfigurator, which reads the checkpoint).
KV_QUANT: dict[str, str | None] = {"fp8": "fp8", "bf16": "bfloat16", "nvfp4": "fp8", "auto": None}
#: A prediction's figure -> aiconfigurator's raw result column.
FIGURES: dict[str, str] = {
    "ttft_ms": "ttft", "itl_ms": "tpot", "tok_s_per_user": "tokens/s/user", "output_tok_s": "tokens/s",
    "output_tok_s_per_gpu": "tokens/s/gpu", "request_throughput_rps": "seq/s", "request_latency_ms": "request_latency",
}
TIMEOUT_S = 600


class AIConfiguratorMissing(RuntimeError):
    """No aiconfigurator executable found (or installing it failed)."""


@dataclass
class Prediction:
    """aiconfigurator's prediction for one plan at one workload point, with what qualifies it."""

    status: str
    reason: str
    figures: dict[str, float | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    tool: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """What the numbers are: "prediction (aiconfigurator 0.12.0, gb200, vllm)"."""
        version = self.tool.get("version", AICONFIGURATOR_VERSION)
        where = ", ".join(str(self.inputs[k]) for k in ("system", "backend") if self.inputs.get(k))
        return f"prediction (aiconfigurator {version}{', ' + where if where else ''})"

    def to_json(self) -> dict[str, Any]:
        """The prediction as plain JSON data (label included)."""
        return {"label": self.label, **asdict(self)}


# --- finding and installing aiconfigurator -------------------------------------------------------

def predict_venv() -> Path:
    """Where `predict` installs aiconfigurator when none is found: $PRIMECTL_PREDICT_VENV, the checkout's
    .venv-predict, else ~/.cache/primectl/venv-predict (an installed primectl has no checkout)."""
    env = os.environ.get("PRIMECTL_PREDICT_VENV")
    if env:
        return Path(env)
    if (_REPO / "pyproject.toml").exists():
        return _REPO / ".venv-predict"
    return Path.home() / ".cache" / "primectl" / "venv-predict"


def find_aiconfigurator() -> str:
    """Path of the aiconfigurator executable (AIConfiguratorMissing with the install command if none)."""
    env = os.environ.get("PRIMECTL_AICONFIGURATOR")
    if env:
        if os.access(env, os.X_OK):
            return env
        raise AIConfiguratorMissing(f"PRIMECTL_AICONFIGURATOR={env} is not an executable; install with: {INSTALL_HINT}")
    for venv in (Path.cwd() / ".venv-predict", _REPO / ".venv-predict", predict_venv()):
        cand = venv / "bin" / "aiconfigurator"
        if os.access(cand, os.X_OK):
            return str(cand)
    raise AIConfiguratorMissing(f"aiconfigurator {AICONFIGURATOR_VERSION} not found (PRIMECTL_AICONFIGURATOR, "
                                f".venv-predict/bin/aiconfigurator, {predict_venv()}/bin/aiconfigurator); "
                                f"install with: {INSTALL_HINT}")


def ensure_aiconfigurator(say: Callable[[str], None]) -> str:
    """The aiconfigurator executable; installed into `predict_venv()` on first use (said once)."""
    try:
        return find_aiconfigurator()
    except AIConfiguratorMissing:
        if os.environ.get("PRIMECTL_AICONFIGURATOR"):
            raise
    venv = predict_venv()
    say(f"predict: aiconfigurator {AICONFIGURATOR_VERSION} is not installed; installing it once into {venv} "
        "(its own venv, about 1 GB; later runs reuse it)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *PACKAGES],
                       check=True, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise AIConfiguratorMissing(f"installing aiconfigurator into {venv} failed: {detail.strip()[-500:]}; "
                                    f"install with: {INSTALL_HINT}") from None
    return str(venv / "bin" / "aiconfigurator")


# --- mapping a plan ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mapping:
    """A plan as one aiconfigurator disagg point: the inputs field by field, and the flags they make.

    `flags` follow `aiconfigurator cli estimate --model MODEL`, the decode batch (`--d-bs`) excepted:
    it is `d_bs`, or, with `search`, the largest batch up to `d_bs` that aiconfigurator's memory model
    admits. `na` is why the plan cannot be predicted at all ("" when it can).
    """

    na: str
    inputs: dict[str, Any]
    flags: list[str]
    caveats: list[str]
    model_candidates: list[str]
    d_bs: int
    search: bool


def role_parallelism(parallel: str) -> dict[str, int]:
    """aiconfigurator's widths for a role's parallel spec: tp, dp (attention data-parallel ranks), etp and ep
    (the MoE layers' tensor- and expert-parallel widths, etp x ep = tp x dp).

    DEPn: attention DP n, experts EP n. TEPn: attention TP n, experts EP n. TPn: experts tensor-parallel n.
    DPn: experts tensor-parallel over all n ranks (vLLM without --enable-expert-parallel)."""
    from primectl.recipe.capacity import parse_parallel

    par = parse_parallel(parallel)
    ep = par.size if par.expert_parallel else 1
    return {"tp": par.tp, "pp": 1, "dp": par.dp, "etp": par.size // ep, "ep": ep}


def workload_point(plan: Plan, workload: str | None, sessions: int) -> dict[str, Any]:
    """isl, osl and prefix of one request, as means over the workload the bench would generate.

    The bench's preset (`workload`, else the engine's default), the bench's seed and the plan's block
    size, `sessions` sessions: isl is the mean prompt, prefix the mean cached part of it at the
    workload's theoretical (unbounded-cache) hit rate, osl the mean output."""
    from primectl.bench.runner import DEFAULT_SEED
    from primectl.bench.workload import generate, preset

    spec = preset(workload or plan.serving.capabilities.workload)
    wl = generate(spec, seed=DEFAULT_SEED, block_size=plan.serving.block_size, sessions=sessions)
    stats = wl.stats()
    isl = round(stats["prompt_tokens_mean"])
    prefix = min(isl - 1, round(isl * stats["theoretical_prefix_hit_rate"]))
    osl = round(sum(r.output_tokens for r in wl.requests) / len(wl.requests))
    return {"workload": spec.name, "isl": isl, "osl": osl, "prefix": prefix,
            "workload_basis": (f"means over the bench's {spec.name} workload (seed {DEFAULT_SEED}, block "
                               f"{plan.serving.block_size}, {stats['sessions']} sessions of {spec.turns} turns + "
                               f"{stats['cold_prompts']} cold prompts, {stats['requests']} requests): isl = mean prompt, "
                               f"prefix = isl x theoretical hit rate {stats['theoretical_prefix_hit_rate']}, "
                               "osl = mean output")}


def _memory_fraction(role: RoleCapacity) -> float:
    """The role's gpu_memory_utilization, as the plan's capacity figures carry it (usable / HBM)."""
    return round(role.usable_gb / role.hbm_gb, 2) if role.hbm_gb else 0.9


def map_plan(plan: Plan, *, workload: str | None = None, concurrency: int | None = None) -> Mapping:
    """Map a plan (and the bench's workload) to aiconfigurator's inputs; pure, no tool run.

    ValueError for an unknown workload or a concurrency below 1. Concurrency: given, the decode batch
    per attention-DP rank is ceil(concurrency / (decode workers x DP ranks)); not given, the decoders
    are filled to the sessions the plan says each holds in HBM (capacity.decode.sessions_in_hbm), and
    the prediction runs at the largest batch up to that which aiconfigurator's own memory model admits."""
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    hw = plan.hardware
    inputs: dict[str, Any] = {"recipe": plan.name, "hardware_profile": hw.profile, "gpu": hw.gpu or None,
                              "engine": plan.engine}

    def na(reason: str) -> Mapping:
        return Mapping(reason, inputs, [], [], [], 0, False)

    if not hw.gpu or hw.sm == 0:
        return na(f"hardware profile {hw.profile} has no GPU; aiconfigurator has perf databases for GPU systems only")
    system = SYSTEMS.get(hw.gpu)
    if system is None:
        return na(f"no aiconfigurator system for GPU {hw.gpu!r} (hardware profile {hw.profile}); "
                  f"known: {', '.join(f'{g} -> {s}' for g, s in SYSTEMS.items())}")
    if plan.engine not in BACKENDS:
        return na(f"engine {plan.engine} has no aiconfigurator backend ({', '.join(BACKENDS)})")
    pre, dec = plan.capacity.prefill, plan.capacity.decode
    if pre is None or dec is None:
        return na("the plan has no prefill and decode capacity figures to map")

    p, d = role_parallelism(pre.parallel), role_parallelism(dec.parallel)
    cap = max(1, dec.sessions_in_hbm)
    if concurrency is None:
        d_bs, search = max(1, math.ceil(cap / d["dp"])), True
        basis = (f"not given: the decoders full as planned, {dec.instances} decode workers x {cap} sessions each "
                 f"holds in HBM (capacity.decode.sessions_in_hbm); predicted at the largest decode batch up to "
                 f"that which aiconfigurator's memory model admits")
        sessions = dec.instances * cap
    else:
        d_bs, search = math.ceil(concurrency / (dec.instances * d["dp"])), False
        basis = f"given: decode batch per DP rank = ceil({concurrency} / ({dec.instances} workers x {d['dp']} DP ranks))"
        sessions = concurrency
    from primectl.bench.workload import preset

    spec = preset(workload or plan.serving.capabilities.workload)
    point = workload_point(plan, spec.name, max(4, spec.sessions_per_slot * sessions))
    new_tokens = max(1, point["isl"] - point["prefix"])
    p_bs = max(1, plan.serving.prefill_budget // new_tokens)
    kv = KV_QUANT.get(plan.serving.kv_dtype)
    inputs.update({
        "model_from": plan.serving.model.path, "system": system, "backend": plan.engine,
        "engine_version": plan.pins.get(plan.engine), "estimate_mode": "disagg",
        **point,
        "p_parallel": pre.parallel, "p_tp": p["tp"], "p_pp": p["pp"], "p_dp": p["dp"], "p_etp": p["etp"],
        "p_ep": p["ep"], "p_bs": p_bs, "p_workers": pre.instances,
        "p_bs_basis": (f"max(1, prefill budget {plan.serving.prefill_budget} tokens per step // "
                       f"{new_tokens} uncached prompt tokens) requests per DP rank"),
        "d_parallel": dec.parallel, "d_tp": d["tp"], "d_pp": d["pp"], "d_dp": d["dp"], "d_etp": d["etp"],
        "d_ep": d["ep"], "d_dcp": dec.dcp, "d_bs": d_bs, "d_workers": dec.instances,
        "concurrency": concurrency, "concurrency_basis": basis,
        "kv_dtype": plan.serving.kv_dtype, "kvcache_quant_mode": kv,
        "p_gpu_memory_utilization": _memory_fraction(pre), "d_gpu_memory_utilization": _memory_fraction(dec),
        "gpus_planned": pre.instances * pre.gpus_per_instance + dec.instances * dec.gpus_per_instance,
    })
    flags = ["--system", system, "--backend", plan.engine, "--estimate-mode", "disagg",
             "--isl", str(point["isl"]), "--osl", str(point["osl"]), "--prefix", str(point["prefix"])]
    for side, par, bs, workers in (("p", p, p_bs, pre.instances), ("d", d, None, dec.instances)):
        flags += [f"--{side}-tp", str(par["tp"]), f"--{side}-pp", str(par["pp"]), f"--{side}-dp", str(par["dp"]),
                  f"--{side}-etp", str(par["etp"]), f"--{side}-ep", str(par["ep"])]
        flags += ([f"--{side}-bs", str(bs)] if bs is not None else []) + [f"--{side}-workers", str(workers)]
    if kv is not None:
        flags += ["--kvcache-quant-mode", kv]
    flags += ["--prefill-free-gpu-memory-fraction", str(inputs["p_gpu_memory_utilization"]),
              "--decode-free-gpu-memory-fraction", str(inputs["d_gpu_memory_utilization"])]
    return Mapping("", inputs, flags, _caveats(plan, inputs, concurrency), _model_candidates(plan), d_bs, search)


def _model_candidates(plan: Plan) -> list[str]:
    """Names aiconfigurator's bundled model configs are matched against: the weights directory's name, then
    the served name (the plan carries no architecture name)."""
    path = plan.serving.model.path.rstrip("/")
    return [n for n in dict.fromkeys((path.rsplit("/", 1)[-1], plan.serving.model.served_name)) if n]


def _caveats(plan: Plan, inputs: dict[str, Any], concurrency: int | None) -> list[str]:
    """What of the recipe aiconfigurator does not model, as primectl's warnings."""
    out: list[str] = []
    if inputs["kv_dtype"] == "nvfp4":
        out.append("NVFP4 KV not modelled (aiconfigurator's KV quant modes are bfloat16, int8, fp8): predicted with "
                   "fp8 KV, whose larger rows hold fewer sessions per decoder and read more bytes per decode step")
    if inputs["d_dcp"] > 1:
        out.append(f"decode context parallelism (dcp {inputs['d_dcp']}) not modelled: predicted as plain "
                   f"{inputs['d_parallel']}, the KV cache copied on all {inputs['d_tp']} TP ranks instead of sharded "
                   f"over {inputs['d_dcp']}, so fewer sessions fit per decoder")
    if concurrency is not None:
        modelled = inputs["d_bs"] * inputs["d_workers"] * inputs["d_dp"]
        if modelled != concurrency:
            out.append(f"concurrency {concurrency} is modelled as {modelled} in flight: aiconfigurator runs the same "
                       f"batch ({inputs['d_bs']}) on every one of the {inputs['d_workers'] * inputs['d_dp']} decode ranks")
    if plan.serving.tier is not None:
        out.append("the prefix is taken as cached with no cost to fetch it: the Mooncake host-DRAM tier, KV-aware "
                   "routing and the KV transfer from prefill to decode (NIXL) are not modelled")
    out.append(f"one request shape (isl {inputs['isl']}, prefix {inputs['prefix']}, osl {inputs['osl']}) stands for "
               f"the whole {inputs['workload']} workload; ttft_ms is the prefill time without queueing, not a p50")
    return out


# --- running aiconfigurator ----------------------------------------------------------------------

# Runs inside aiconfigurator's venv: one JSON argument (model candidates, flags, decode-batch search),
# one JSON line out after RESULT_MARK. See the module docstring for why it wraps cli_estimate.
_DRIVER = r'''
import argparse, contextlib, importlib.metadata as md, io, json, logging, math, sys, time
from pathlib import Path

spec = json.loads(sys.argv[1])
out = {"tool": {}, "attempts": [], "warnings": [], "console": ""}
for dist in ("aiconfigurator", "aiconfigurator-core"):
    try:
        out["tool"][dist] = md.version(dist)
    except md.PackageNotFoundError:
        pass

def done(status, reason=""):
    out["status"], out["reason"] = status, reason
    sys.__stdout__.write(spec["mark"] + json.dumps(out, default=str) + "\n")
    sys.exit(0)

import aiconfigurator_core
core = Path(aiconfigurator_core.__file__).parent
bundled = {}
for f in sorted((core / "model_configs").glob("*_config.json")):
    if f.name.endswith("_hf_quant_config.json"):
        continue
    mid = f.name[: -len("_config.json")].replace("--", "/", 1)
    bundled.setdefault(mid.lower(), []).append(mid)
    bundled.setdefault(mid.split("/", 1)[-1].lower(), []).append(mid)
model = next((bundled[c.lower()][0] for c in spec["candidates"] if len(bundled.get(c.lower(), [])) == 1), None)
if model is None:
    done("n/a", "no bundled aiconfigurator model config named " + " or ".join(repr(c) for c in spec["candidates"]))
out["model"] = model
data = core / "systems" / "data" / spec["system"]
if not any(p.name == spec["backend"] for p in data.glob("*/*") if p.is_dir()):
    done("n/a", "aiconfigurator has no %s perf database for system %s" % (spec["backend"], spec["system"]))

from aiconfigurator.cli import api
from aiconfigurator.cli import main as cli_module
from aiconfigurator.cli.main import configure_parser, main as cli_main

# cli main sets the systems paths on every call, which empties the perf-data caches; later tries of
# the same paths keep them (the same data, without loading it again).
real_set_paths, paths_set = cli_module.perf_database.set_systems_paths, []
def set_paths_once(raw):
    if paths_set != [raw]:
        real_set_paths(raw)
        paths_set[:] = [raw]
cli_module.perf_database.set_systems_paths = set_paths_once

results = []
real_estimate = api.cli_estimate
def keep(**kw):
    res = real_estimate(**kw)
    results.append(res)
    return res
api.cli_estimate = keep

class Grab(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if record.levelno >= logging.WARNING and msg not in out["warnings"]:
            out["warnings"].append(msg)
for name in ("aiconfigurator", "aiconfigurator_core"):
    logging.getLogger(name).addHandler(Grab())

def plain(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)

def attempt(d_bs):
    started = time.monotonic()
    argv = ["cli", "estimate", "--model", model, *spec["flags"], "--d-bs", str(d_bs)]
    parser = argparse.ArgumentParser(prog="aiconfigurator cli")
    configure_parser(parser)
    buf, err = io.StringIO(), None
    del results[:]
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            cli_main(parser.parse_args(argv[1:]))
        except SystemExit as exc:
            err = str(exc.code)
        except Exception as exc:
            err = "%s: %s" % (type(exc).__name__, exc)
    if err is None and not results:
        err = "aiconfigurator printed no estimate"
    row = {"d_bs": d_bs, "ok": err is None, "oom": bool(err) and "OOM" in err, "error": err,
           "elapsed_s": round(time.monotonic() - started, 2)}
    out["attempts"].append(row)
    if err is None:
        res = results[-1]
        row["kept"] = {"argv": argv, "console": buf.getvalue(), "result": {
            "raw": {k: plain(v) for k, v in res.raw.items()}, "backend_version": res.backend_version,
            "per_ops_source": res.per_ops_source or {}}}
    else:
        out["console"] = buf.getvalue()
    return row

top = spec["d_bs"]
row = best = attempt(top)
if row["oom"] and spec["search"] and top > 1:
    lo, hi, best = 1, top - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        row = attempt(mid)
        if row["ok"]:
            best, lo = row, mid + 1
        elif row["oom"]:
            hi = mid - 1
        else:
            break
if best is None or not best["ok"]:
    reason = row["error"] or ""
    if row["oom"] and row["d_bs"] > 1:
        reason += (" (at --d-bs %d per decode rank: aiconfigurator reports a decode KV cache that does not fit "
                   "at that batch the same way)" % row["d_bs"])
    done("failed", reason)
out.update(best.pop("kept"), d_bs=best["d_bs"])
for r in out["attempts"]:
    r.pop("kept", None)
done("predicted")
'''
RESULT_MARK = "PRIMECTL-PREDICT "
_SITE_PACKAGES = re.compile(r"\S*/site-packages/")


def _tool_warning(msg: str) -> str | None:
    """One of aiconfigurator's warnings as shown (None: dropped), its install path cut to the package."""
    if "aisimulate" in msg:
        return None
    return "aiconfigurator: " + _SITE_PACKAGES.sub("", msg.strip())


def _op_sources(per_ops_source: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per role, how many of the ops aiconfigurator priced came from each kind of data (silicon, empirical, ...)."""
    out: dict[str, dict[str, int]] = {}
    for role, ops in per_ops_source.items():
        if isinstance(ops, dict):
            counts: dict[str, int] = {}
            for source in ops.values():
                counts[str(source)] = counts.get(str(source), 0) + 1
            out[role] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    return out


def predict(plan: Plan, *, workload: str | None = None, concurrency: int | None = None,
            say: Callable[[str], None] = print) -> Prediction:
    """aiconfigurator's prediction for `plan` on the bench's workload (see `map_plan` for the mapping).

    Never raises for the tool: a plan aiconfigurator has no data for is "n/a" (nothing installed), a run
    that fails is "failed" with the reason. ValueError for an unknown workload or a concurrency below 1."""
    m = map_plan(plan, workload=workload, concurrency=concurrency)
    if m.na:
        return Prediction("n/a", m.na, inputs=m.inputs, tool={"name": "aiconfigurator", "version": AICONFIGURATOR_VERSION})
    tool = {"name": "aiconfigurator", "version": AICONFIGURATOR_VERSION}
    try:
        exe = ensure_aiconfigurator(say)
    except AIConfiguratorMissing as exc:
        return Prediction("failed", str(exc), inputs=m.inputs, warnings=list(m.caveats), tool=tool)
    python = Path(exe).with_name("python")
    if not python.exists():
        return Prediction("failed", f"no python next to {exe} to run aiconfigurator's API with", inputs=m.inputs,
                          warnings=list(m.caveats), tool=tool)
    spec = {"mark": RESULT_MARK, "candidates": m.model_candidates, "system": m.inputs["system"],
            "backend": m.inputs["backend"], "flags": m.flags, "d_bs": m.d_bs, "search": m.search}
    say(f"predict {plan.name}: aiconfigurator {AICONFIGURATOR_VERSION} on {m.inputs['system']}/{m.inputs['backend']}, "
        f"{m.inputs['workload']} workload (isl {m.inputs['isl']}, prefix {m.inputs['prefix']}, osl {m.inputs['osl']})")
    started = time.monotonic()
    try:
        proc = subprocess.run([str(python), "-c", _DRIVER, json.dumps(spec)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env={**os.environ, "NO_COLOR": "1"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Prediction("failed", f"running aiconfigurator: {exc}", inputs=m.inputs, warnings=list(m.caveats),
                          tool=tool)
    tool["elapsed_s"] = f"{time.monotonic() - started:.1f}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip()[-800:]
        return Prediction("failed", f"aiconfigurator exited {proc.returncode} without a result: {tail}",
                          inputs=m.inputs, warnings=list(m.caveats), tool=tool)
    doc = json.loads(lines[-1][len(RESULT_MARK):])
    return _prediction(doc, m, exe, tool)


def _prediction(doc: dict[str, Any], m: Mapping, exe: str, tool: dict[str, str]) -> Prediction:
    """A Prediction from the driver's JSON."""
    installed = doc.get("tool", {})
    tool.update({"version": installed.get("aiconfigurator", "unknown"),
                 "core_version": installed.get("aiconfigurator-core", "unknown"), "executable": exe})
    inputs = {**m.inputs, "model": doc.get("model")}
    warnings = [w for w in (_tool_warning(x) for x in doc.get("warnings", [])) if w]
    caveats = list(m.caveats)
    if tool["version"] != AICONFIGURATOR_VERSION:
        caveats.insert(0, f"aiconfigurator {tool['version']} is installed; primectl maps for {AICONFIGURATOR_VERSION}")
    attempts = doc.get("attempts", [])
    raw_doc: dict[str, Any] = {"attempts": attempts}
    if doc.get("status") != "predicted":
        argv = [exe, *doc["argv"]] if doc.get("argv") else []
        return Prediction(doc.get("status", "failed"), _tool_warning(doc.get("reason", "")) or "", inputs=inputs,
                          warnings=warnings + [f"primectl: {c}" for c in caveats], argv=argv, tool=tool, raw=raw_doc)
    result = doc["result"]
    row = result["raw"]
    tool["perf_db"] = f"{m.inputs['backend']} {result.get('backend_version')}"
    figures = {name: (float(row[col]) if isinstance(row.get(col), int | float) else None)
               for name, col in FIGURES.items()}
    d_bs = int(doc["d_bs"])
    inputs.update({"d_bs": d_bs, "concurrency_modelled": row.get("concurrency"), "gpus_modelled": row.get("num_total_gpus"),
                   "resolved": {k: row.get(k) for k in ("(p)gemm", "(p)moe", "(p)kvcache", "(p)fmha", "(d)gemm",
                                                       "(d)moe", "(d)kvcache", "(d)fmha") if k in row}})
    if m.search and d_bs < m.d_bs:
        caveats.insert(0, f"the plan's decoders hold {m.d_bs} sessions per DP rank in HBM, aiconfigurator's memory "
                          f"model at most {d_bs}: predicted at {d_bs} per rank")
    engine_version = m.inputs.get("engine_version")
    if engine_version and result.get("backend_version") and engine_version != result["backend_version"]:
        caveats.append(f"perf database is {tool['perf_db']}; the recipe runs {m.inputs['backend']} {engine_version}")
    if row.get("num_total_gpus") not in (None, m.inputs["gpus_planned"]):
        caveats.append(f"aiconfigurator counts {row['num_total_gpus']} GPUs, the plan {m.inputs['gpus_planned']}")
    raw_doc.update({"row": row, "op_sources": _op_sources(result.get("per_ops_source") or {}),
                    "console": doc.get("console", "")})
    return Prediction("predicted", "", figures=figures, warnings=warnings + [f"primectl: {c}" for c in caveats],
                      inputs=inputs, argv=[exe, *doc["argv"]], tool=tool, raw=raw_doc)


# --- showing it ----------------------------------------------------------------------------------

def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)


def render(pred: Prediction) -> str:
    """The table `primectl predict` prints: label, figures, the warnings beside them, the mapping, the command."""
    i = pred.inputs
    lines = [f"{pred.label}: {i.get('recipe', '')}", "  predictions from aiconfigurator's perf database, not measurements"]
    if pred.status != "predicted":
        lines.append(f"  {pred.status}: {pred.reason}")
    else:
        lines.append(f"  at {_num(i.get('concurrency_modelled'))} sessions in flight ({i['d_bs']} per decode rank), "
                     f"{i['workload']} workload: isl {i['isl']}, prefix {i['prefix']}, osl {i['osl']}")
        lines.append("")
        lines += [f"  {name:<24}{_num(v) if v is not None else '-':>12}" for name, v in pred.figures.items()]
        sources = pred.raw.get("op_sources") or {}
        if sources:
            lines.append("  op data: " + "; ".join(f"{role} " + ", ".join(f"{n} {s}" for s, n in c.items())
                                                    for role, c in sources.items()))
    if pred.warnings:
        lines += ["", "  warnings:"] + [f"  - {w}" for w in pred.warnings]
    if "p_parallel" in i:
        lines += ["", "  mapping (plan -> aiconfigurator):"]
        rows = [("model", f"{i['model_from']} -> {i.get('model') or '?'}"),
                ("hardware", f"{i['hardware_profile']} ({i['gpu']}) -> --system {i['system']}"),
                ("engine", f"{i['engine']} {i.get('engine_version') or ''} -> --backend {i['backend']}"),
                ("prefill", f"{i['p_parallel']} x {i['p_workers']} -> tp {i['p_tp']} dp {i['p_dp']} etp {i['p_etp']} "
                            f"ep {i['p_ep']}, bs {i['p_bs']}, workers {i['p_workers']}"),
                ("decode", f"{i['d_parallel']}{' dcp ' + str(i['d_dcp']) if i['d_dcp'] > 1 else ''} x {i['d_workers']} -> "
                           f"tp {i['d_tp']} dp {i['d_dp']} etp {i['d_etp']} ep {i['d_ep']}, bs {i['d_bs']}, "
                           f"workers {i['d_workers']}"),
                ("kv dtype", f"{i['kv_dtype']} -> {i['kvcache_quant_mode'] or 'from the checkpoint'}"),
                ("memory", f"gpu_memory_utilization {i['p_gpu_memory_utilization']} / {i['d_gpu_memory_utilization']}"),
                ("workload", i["workload_basis"]), ("concurrency", i["concurrency_basis"])]
        lines += [f"    {k:<12}{v}" for k, v in rows]
    if pred.argv:
        lines += ["", "  command: " + " ".join(pred.argv)]
    if pred.tool.get("elapsed_s"):
        lines.append(f"  ({pred.tool['elapsed_s']} s)")
    return "\n".join(lines)

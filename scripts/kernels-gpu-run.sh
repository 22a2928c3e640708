#!/usr/bin/env bash
# One prepared GPU pass over primectl_kernels/, sized for a lent H200 with ~15 minutes of device time in all
# (the machine's start and the transfers take 1-3 of them; this script stops itself by DEADLINE_S).
# It uses the machine's own python3, torch and Triton (the project's CUDA torch wheel is too big to carry).
#
#   KERNELS_COMMIT=<short hash of the tree sent> bash scripts/kernels-gpu-run.sh
#
# Steps, in order of value, each with a cap inside the overall deadline (seconds; expected in brackets):
#   env          20  [5]    nvidia-smi, python / torch / Triton versions
#   selftest    150  [60]   codecs bit-exact, decode (1/5 of the slots empty and a -1 tail) vs reference
#   bench       240  [150]  decode T = 1,2,4,8,15,20,32,35,64 at fill 1.0, native / staged / fp8, best of
#                           6 split counts; eager time and max error at T=15; codec table; PyTorch reference
#   rows         15  [1]    RESULTS.md rows (commit, kernels source hash) from what is there so far
#   fill 0.5     90  [40]   T = 1,15,64 with the second half of every top-k list -1 (compaction)
#   pytest      150  [100]  tests/kernels on the GPU (TRITON_INTERPRET=0)
#   ablation     60  [30]   gather-only vs full decode at T = 1,15,64
#   tune        rest        only with TUNE=1: the first TUNE_CANDIDATES (default 6) launches at T=15
# SKIP_PYTEST=1 leaves the tests out; PYTHON=... picks another interpreter.
# Files in $OUT (the device tool returns at most 8): log.txt, selftest.json, bench.json, bench-fill05.json,
# results-rows.md, and tune.json with TUNE=1.  Everything is written as it goes, so a step cut off by its
# cap or the deadline still leaves the earlier steps' output.
set -u
OUT=${OUT:-kernels-gpu-out}
PY=${PYTHON:-python3}
DEADLINE_S=${DEADLINE_S:-540}
START=$(date +%s)
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: >"$LOG"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TRITON_DEFAULT_FP_FUSION=1
COMMIT=${KERNELS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
DATE=$(date -u +%Y-%m-%d)

elapsed() { echo $(($(date +%s) - START)); }

# step NAME CAP CMD...: run CMD (a program or one of the functions below) under
# timeout min(CAP, time left - 5 s), its output into the log
step() {
  local name=$1 cap=$2 budget
  shift 2
  budget=$((DEADLINE_S - $(elapsed) - 5))
  [ "$budget" -gt "$cap" ] && budget=$cap
  echo | tee -a "$LOG"
  echo "=== $name (cap ${cap}s, given ${budget}s, at $(elapsed)s, $(date -u +%H:%M:%S))" | tee -a "$LOG"
  if [ "$budget" -lt 10 ]; then
    echo "$name skipped: out of time" | tee -a "$LOG"
    return 0
  fi
  if declare -F "$1" >/dev/null; then set -- bash -c "$1"; fi
  timeout -k 5 "$budget" "$@" 2>&1 | tee -a "$LOG"
  echo "$name exit: ${PIPESTATUS[0]} (at $(elapsed)s)" | tee -a "$LOG"
}

rows() {
  local args=(--commit "$COMMIT" --date "$DATE")
  [ -s "$OUT/selftest.json" ] && args+=(--selftest "$OUT/selftest.json")
  for f in bench.json bench-fill05.json; do [ -s "$OUT/$f" ] && args+=(--bench "$OUT/$f"); done
  $PY -m primectl_kernels.results_rows "${args[@]}" >"$OUT/results-rows.md" && cat "$OUT/results-rows.md"
}

env_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
  $PY -c 'import sys, torch, triton; p = torch.cuda.get_device_properties(0)
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
print(p.name, "SMs", p.multi_processor_count, "L2", getattr(p, "L2_cache_size", "?"), "mem", p.total_memory)'
  echo "commit $COMMIT, date $DATE"
}

selftest_json() {
  $PY -m primectl_kernels.selftest --json >"$OUT/selftest.json"
  local rc=$?
  cat "$OUT/selftest.json"
  return $rc
}
export OUT PY COMMIT DATE
export -f rows env_info selftest_json

step env 20 env_info
step selftest 150 selftest_json
step bench 240 $PY -m primectl_kernels.bench --sweep 1,2,4,8,15,20,32,35,64 --json-out "$OUT/bench.json"
step rows 15 rows
step "fill 0.5" 90 $PY -m primectl_kernels.bench --sweep 1,15,64 --fill 0.5 --no-codec --json-out "$OUT/bench-fill05.json"
step rows 15 rows
[ -z "${SKIP_PYTEST:-}" ] && step pytest 150 $PY -m pytest -q -p no:cacheprovider tests/kernels
step ablation 60 $PY -m primectl_kernels.ablation --sweep 1,15,64
if [ -n "${TUNE:-}" ]; then
  step tune 600 $PY -m primectl_kernels.bench --tune --candidates "${TUNE_CANDIDATES:-6}" --sweep 15 --no-codec --json-out "$OUT/tune.json"
fi
echo | tee -a "$LOG"
echo "=== done at $(elapsed)s of ${DEADLINE_S}s" | tee -a "$LOG"

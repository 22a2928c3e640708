#!/usr/bin/env bash
# One GPU pass over kernels/: environment, self-test, the kernel test suite on the GPU,
# then the benchmark with tuning.  Every step writes into $OUT (default ./kernels-gpu-out)
# as it goes, so a step that times out still leaves the earlier ones' results.
#   OUT=/tmp/k scripts/kernels-gpu-run.sh          # uses python3 (torch + triton with CUDA)
#   BENCH_ARGS="--sweep 1,15,64" SKIP_PYTEST=1 ... # a shorter pass
set -u
OUT=${OUT:-kernels-gpu-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TRITON_DEFAULT_FP_FUSION=1
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

step env
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv
  $PY -c 'import sys, torch, triton; p = torch.cuda.get_device_properties(0)
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)
print(p.name, "SMs", p.multi_processor_count, "L2", getattr(p, "L2_cache_size", "?"), "mem", p.total_memory)'
} 2>&1 | tee "$OUT/env.txt"

step selftest
timeout "${SELFTEST_TIMEOUT:-150}" $PY -m kernels.selftest 2>&1 | tee "$OUT/selftest.txt"
echo "selftest exit: ${PIPESTATUS[0]}" | tee -a "$OUT/selftest.txt"

step bench
# shellcheck disable=SC2086  # BENCH_ARGS is a word list on purpose
timeout "${BENCH_TIMEOUT:-300}" $PY -m kernels.bench ${BENCH_ARGS:---tune --fill 1.0 --fill 0.5} --json-out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
echo "bench exit: ${PIPESTATUS[0]}" | tee -a "$OUT/bench.txt"

[ -n "${SKIP_PYTEST:-}" ] && { step done; exit 0; }
step pytest-gpu
timeout "${PYTEST_TIMEOUT:-120}" $PY -m pytest -q -p no:cacheprovider tests/kernels 2>&1 | tail -25 | tee "$OUT/pytest.txt"
step done

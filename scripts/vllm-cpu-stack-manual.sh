#!/usr/bin/env bash
# Reference run of a REAL vLLM prefill + decode pair under Dynamo on a CPU host,
# exactly as verified by hand (docs/vllm-cpu-notes.md): mooncake_master +
# Dynamo frontend (KV router, session affinity) + one `dynamo.vllm` prefill
# worker and one decode worker (vllm-cpu 0.31.0, KV over NIXL with a CPU
# buffer, KV events on), serving the tiny random-weight model from
# primectl/tiny_model.py. Everything runs on 127.0.0.1 inside a private
# network namespace that has only loopback; every process is started here,
# recorded by PID and stopped by PID.
#
# Usage (root): scripts/vllm-cpu-stack-manual.sh [--mooncake-store] [--kill-decode]
#   --mooncake-store  prefill uses MultiConnector [NixlConnector kv_producer,
#                     MooncakeStoreConnector kv_both] against the master.
#   --kill-decode     at the end, SIGKILL the decode worker's process tree and
#                     record what the frontend answers.
# Env: RUNTIME_VENV  (default REPO/.venv-vllm-cpu, made by
#                     `scripts/install-runtime.sh DIR --vllm-cpu`)
#      CLIENT_PY     python with `openai` and `jsonschema` (default
#                     /work/main/.venv/bin/python if present)
#      TOOL_REPS     repetitions per tool-calling case and mode (default 2; 0 skips)
#      WORKER_ENV    extra "K=V K=V" for both workers (e.g. OMP_WAIT_POLICY=PASSIVE)
#      KVCACHE_GIB   VLLM_CPU_KVCACHE_SPACE for both workers (default 1)
#      WORKER_ARGS_EXTRA  extra dynamo.vllm/vLLM flags for both workers (e.g. "--block-size 64")
#      WORK          scratch dir (default: new /tmp/primectl-vllm-cpu.XXXXXX; kept)
set -euo pipefail

MOONCAKE_STORE=0
KILL_DECODE=0
for a in "$@"; do
  case "$a" in
    --mooncake-store) MOONCAKE_STORE=1 ;;
    --kill-decode) KILL_DECODE=1 ;;
    *) echo "usage: $0 [--mooncake-store] [--kill-decode]" >&2; exit 2 ;;
  esac
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PRIMECTL_VLLM_CPU_IN_NETNS:-}" ]]; then
  exec unshare --net env PRIMECTL_VLLM_CPU_IN_NETNS=1 bash "${BASH_SOURCE[0]}" "$@"
fi
ip link set lo up

RUNTIME="${RUNTIME_VENV:-$REPO/.venv-vllm-cpu}"
PY="$RUNTIME/bin/python"
BRIDGE="$REPO/primectl/bridges/dynamo_vllm_cpu_bridge.py"
CLIENT_PY="${CLIENT_PY:-$( [[ -x /work/main/.venv/bin/python ]] && echo /work/main/.venv/bin/python || true)}"
TOOL_REPS="${TOOL_REPS:-2}"
KVCACHE_GIB="${KVCACHE_GIB:-1}"
WORK="${WORK:-$(mktemp -d /tmp/primectl-vllm-cpu.XXXXXX)}"
mkdir -p "$WORK"/{home,cache,vllm-cache,tmp,dynkv,logs,metrics}
MODEL="$WORK/model"
H=127.0.0.1
NS=primectl-vllm-cpu
SERVED=tiny
PIDS=()
NAMES=()

T0=$(date +%s%N)
log() { printf '[%7.2fs] %s\n' "$(awk "BEGIN{print ($(date +%s%N)-$T0)/1e9}")" "$*"; }

# Every descendant of a PID (vLLM forks EngineCore -> Worker and a resource tracker).
descendants() { local p=$1 c; for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do echo "$c"; descendants "$c"; done; }
# stop_tree NAME PID SIGNAL: signal the process, wait for it and every descendant, report seconds.
stop_tree() {
  local name=$1 p=$2 sig=$3 t kids k
  kill -0 "$p" 2>/dev/null || return 0
  kids=$(descendants "$p")
  t=$(date +%s%N)
  kill -"$sig" "$p" 2>/dev/null || true
  for _ in $(seq 1 600); do
    local alive=0
    for k in $p $kids; do kill -0 "$k" 2>/dev/null && alive=1; done
    (( alive )) || break
    sleep 0.1
  done
  for k in $p $kids; do
    if kill -0 "$k" 2>/dev/null; then echo "  $name: pid $k still alive after 60 s: SIGKILL"; kill -KILL "$k" 2>/dev/null || true; fi
  done
  log "stopped $name (pid $p + $(echo $kids | wc -w) descendants) with SIG$sig in $(( ($(date +%s%N)-t)/1000000 )) ms"
}
stop_all() {
  local i
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do stop_tree "${NAMES[i]}" "${PIDS[i]}" TERM; done
  echo "logs and metrics in $WORK"
}
trap stop_all EXIT

# start NAME CMD...: background, stdout+stderr to $WORK/logs/NAME.log; $! is the process itself.
start() {
  local name=$1; shift
  "$@" >"$WORK/logs/$name.log" 2>&1 &
  PIDS+=($!); NAMES+=("$name")
}
pid_of() { local i; for i in "${!NAMES[@]}"; do [[ "${NAMES[i]}" == "$1" ]] && echo "${PIDS[i]}"; done; return 0; }
# wait_code URL CODE TIMEOUT_S: poll until the HTTP status is CODE; prints ms waited.
wait_code() {
  local url=$1 want=$2 limit=$3 t c
  t=$(date +%s%N)
  while :; do
    c=$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)
    [[ "$c" == "$want" ]] && { echo $(( ($(date +%s%N)-t)/1000000 )); return 0; }
    (( ($(date +%s%N)-t)/1000000000 >= limit )) && { echo "timeout waiting $url -> $want (last $c)" >&2; return 1; }
    sleep 0.2
  done
}
# metric PORT NAME [LABEL_REGEX]: sum of the samples of one metric on a /metrics page.
metric() {
  curl -s "http://$H:$1/metrics" | awk -v n="$2" -v l="${3:-}" '$1 ~ "^"n"({|$)" && (l == "" || $1 ~ l) {s+=$NF} END{printf "%.0f\n", s+0}'
}
# treestat SECONDS NAME=PID...: RSS and CPU% of whole process trees (the Python helper below).
treestat() { "$PY" "$WORK/treestat.py" "$@"; }
cat >"$WORK/treestat.py" <<'PY'
import os, sys, time
HZ, PAGE = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
def tree(pid):
    out = [pid]
    for t in os.listdir(f"/proc/{pid}/task"):
        try: kids = open(f"/proc/{pid}/task/{t}/children").read().split()
        except OSError: kids = []
        for k in kids: out += tree(int(k))
    return out
def sample(pids):
    cpu = rss = 0
    for p in pids:
        try:
            r = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            cpu += int(r[11]) + int(r[12]); rss += int(r[21]) * PAGE
        except OSError: pass
    return cpu, rss
secs = float(sys.argv[1]); trees = {n: tree(int(p)) for n, p in (a.split("=") for a in sys.argv[2:])}
a = {n: sample(t) for n, t in trees.items()}; time.sleep(secs); b = {n: sample(t) for n, t in trees.items()}
print("  ".join(f"{n}: rss {b[n][1]/2**20:.0f} MiB, cpu {100*(b[n][0]-a[n][0])/HZ/secs:.0f}% ({len(trees[n])} procs)" for n in trees))
PY

# ---- model directory -----------------------------------------------------------
PYTHONPATH="$REPO" "$PY" -m primectl.tiny_model "$MODEL" "$SERVED"
log "tiny model written: $(du -sk "$MODEL" | cut -f1) KiB in $MODEL"

# ---- common env for every process ----------------------------------------------
# HOME too: the Dynamo frontend caches model cards under $HOME/.cache/dynamo/mdc
# whatever XDG_CACHE_HOME says.
export HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache" VLLM_CACHE_ROOT="$WORK/vllm-cache" TMPDIR="$WORK/tmp"
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export DYN_NAMESPACE=$NS DYN_REQUEST_PLANE=tcp DYN_EVENT_PLANE=zmq
export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV="$WORK/dynkv"
export DYN_TCP_RPC_HOST=$H DYN_TCP_RESPONSE_STREAM_HOST=$H DYN_EVENT_PLANE_HOST=$H
export DYN_HTTP_RPC_HOST=$H DYN_SYSTEM_HOST=$H VLLM_HOST_IP=$H
export VLLM_NIXL_SIDE_CHANNEL_HOST=$H UCX_NET_DEVICES=lo

# ---- mooncake_master -----------------------------------------------------------
start mooncake_master "$RUNTIME/bin/mooncake_master" --rpc_address=$H --rpc_port=50051 \
  --enable_http_metadata_server=true --http_metadata_server_host=$H --http_metadata_server_port=8080 \
  --metrics_host=$H --metrics_port=9003
log "mooncake_master /health 200 after $(wait_code http://$H:9003/health 200 30) ms"

# ---- Dynamo frontend -----------------------------------------------------------
start frontend "$PY" -m dynamo.frontend --namespace $NS --http-host $H --http-port 8000 \
  --router-mode kv --router-session-affinity-ttl-secs 600 --router-session-affinity-mode hard
log "frontend /health 200 after $(wait_code http://$H:8000/health 200 60) ms"

# ---- vLLM workers ----------------------------------------------------------------
WORKER_ARGS=(--model "$MODEL" --served-model-name $SERVED --enforce-eager --dtype float32 --max-model-len 2048
  --enable-prefix-caching --structured-outputs-config '{"backend":"xgrammar"}' --dyn-tool-call-parser hermes)
read -r -a ARGS_EXTRA <<<"${WORKER_ARGS_EXTRA:-}"
WORKER_ARGS+=("${ARGS_EXTRA[@]}")
NIXL_PRODUCER='{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cpu"}'
NIXL_CONSUMER='{"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_buffer_device":"cpu"}'
PREFILL_KV="$NIXL_PRODUCER"
PREFILL_ENV=()
if (( MOONCAKE_STORE )); then
  cat >"$WORK/mooncake-prefill.json" <<EOF
{"local_hostname": "$H", "metadata_server": "http://$H:8080/metadata", "master_server_address": "$H:50051",
 "protocol": "tcp", "device_name": "", "mode": "embedded",
 "global_segment_size": 268435456, "local_buffer_size": 67108864}
EOF
  PREFILL_KV='{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[{"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"cpu"},{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_both","kv_connector_extra_config":{"load_async":true}}]}}'
  PREFILL_ENV=(MOONCAKE_CONFIG_PATH="$WORK/mooncake-prefill.json" MOONCAKE_REQUESTER_LOCAL_HOSTNAME=$H MC_TCP_BIND_ADDRESS=$H)
fi
read -r -a EXTRA <<<"${WORKER_ENV:-}"
TW=$(date +%s%N)
start prefill env "${EXTRA[@]}" "${PREFILL_ENV[@]}" DYN_SYSTEM_PORT=18081 DYN_TCP_RPC_PORT=19001 VLLM_NIXL_SIDE_CHANNEL_PORT=5600 \
  VLLM_CPU_OMP_THREADS_BIND=0 VLLM_CPU_KVCACHE_SPACE="$KVCACHE_GIB" \
  "$PY" "$BRIDGE" "${WORKER_ARGS[@]}" --disaggregation-mode prefill \
  --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:20080"}' \
  --kv-transfer-config "$PREFILL_KV"
start decode env "${EXTRA[@]}" DYN_SYSTEM_PORT=18082 DYN_TCP_RPC_PORT=19002 VLLM_NIXL_SIDE_CHANNEL_PORT=5601 \
  VLLM_CPU_OMP_THREADS_BIND=1 VLLM_CPU_KVCACHE_SPACE="$KVCACHE_GIB" \
  "$PY" "$BRIDGE" "${WORKER_ARGS[@]}" --disaggregation-mode decode \
  --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:20081"}' \
  --kv-transfer-config "$NIXL_CONSUMER"
# Both workers start together and share 2 cores: record when each /health turns 200.
declare -A READY_MS=()
while (( ${#READY_MS[@]} < 2 )); do
  for w in prefill:18081 decode:18082; do
    [[ -n "${READY_MS[${w%%:*}]:-}" ]] && continue
    [[ "$(curl -s -o /dev/null -w '%{http_code}' http://$H:${w##*:}/health || true)" == 200 ]] && READY_MS[${w%%:*}]=$(( ($(date +%s%N)-TW)/1000000 ))
    kill -0 "$(pid_of ${w%%:*})" 2>/dev/null || { echo "${w%%:*} exited; tail of its log:" >&2; tail -20 "$WORK/logs/${w%%:*}.log" >&2; exit 1; }
  done
  (( ($(date +%s%N)-TW)/1000000000 < 600 )) || { echo "workers not ready after 600 s" >&2; exit 1; }
  sleep 0.5
done
log "worker /health 200 after start: prefill ${READY_MS[prefill]} ms, decode ${READY_MS[decode]} ms"
log "frontend /v1/models/$SERVED/ready 200 after $(wait_code http://$H:8000/v1/models/$SERVED/ready 200 120) ms more"
P=$(pid_of prefill); D=$(pid_of decode); F=$(pid_of frontend); M=$(pid_of mooncake_master)

# ---- KV cache size: what vLLM allocated vs the formula ------------------------------
grep -ah "CPU KV cache size\|GiB for KV cache" "$WORK/logs/decode.log" | sed 's/^.*\] //' | sed 's/^/  decode log: /' || true
curl -s http://$H:18082/metrics > "$WORK/metrics/decode-idle.txt"
BLOCKS=$(grep -o 'num_gpu_blocks="[0-9]*"' "$WORK/metrics/decode-idle.txt" | head -1 | grep -o '[0-9]*' || echo 0)
BLOCK=$(grep -o '[{,]block_size="[0-9]*"' "$WORK/metrics/decode-idle.txt" | head -1 | grep -o '[0-9][0-9]*' || echo 0)
"$PY" - "$MODEL/config.json" "$KVCACHE_GIB" "$BLOCK" "$BLOCKS" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1])); gib, block, blocks = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
head = cfg["hidden_size"] // cfg["num_attention_heads"]; dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[cfg["torch_dtype"]]
per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head * dtype_bytes
predicted = (gib * 2**30) // (per_token * block)
print(f"  KV: {per_token} B/token = 2 (K,V) x {cfg['num_hidden_layers']} layers x {cfg['num_key_value_heads']} kv heads x {head} head size x {dtype_bytes} B;"
      f" predicted blocks = floor({gib} GiB / ({per_token} B x {block})) = {predicted} ({predicted*block} tokens);"
      f" measured vllm:cache_config_info num_gpu_blocks={blocks} block_size={block} ({blocks*block} tokens);"
      f" error {100*(blocks-predicted)/predicted:+.2f}%")
PY

# ---- idle footprint ------------------------------------------------------------------
sleep 5
log "idle 20 s: $(treestat 20 frontend=$F prefill=$P decode=$D mooncake_master=$M)"

# ---- chat through the frontend: curl, then the openai client -----------------------
snap() { # snap TAG: NIXL + prompt-source counters on decode's system port
  printf '%s xfers=%s bytes=%s failed_xfers=%s failed_notifs=%s src_external=%s src_local_compute=%s src_local_cache=%s\n' "$1" \
    "$(metric 18082 'vllm:nixl_xfer_time_seconds_count')" "$(metric 18082 'vllm:nixl_bytes_transferred_sum')" \
    "$(metric 18082 'vllm:nixl_num_failed_transfers_total')" "$(metric 18082 'vllm:nixl_num_failed_notifications_total')" \
    "$(metric 18082 'vllm:prompt_tokens_by_source_total' 'external_kv_transfer')" \
    "$(metric 18082 'vllm:prompt_tokens_by_source_total' 'local_compute')" \
    "$(metric 18082 'vllm:prompt_tokens_by_source_total' 'local_cache_hit')"
}
log "decode metrics $(snap before)"
t=$(date +%s%N)
curl -sf --max-time 300 http://$H:8000/v1/chat/completions -H 'Content-Type: application/json' \
  -d "{\"model\":\"$SERVED\",\"messages\":[{\"role\":\"user\",\"content\":\"Say hello.\"}],\"max_tokens\":16}" > "$WORK/metrics/first-chat.json"
log "first chat (curl, non-streaming) in $(( ($(date +%s%N)-t)/1000000 )) ms: $(head -c 400 "$WORK/metrics/first-chat.json")"
log "decode metrics $(snap after-1-request)"
curl -s http://$H:18081/metrics > "$WORK/metrics/prefill-after1.txt"
curl -s http://$H:18082/metrics > "$WORK/metrics/decode-after1.txt"
t=$(date +%s%N)
curl -sfN --max-time 300 http://$H:8000/v1/chat/completions -H 'Content-Type: application/json' \
  -d "{\"model\":\"$SERVED\",\"messages\":[{\"role\":\"user\",\"content\":\"Stream please.\"}],\"max_tokens\":8,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
  > "$WORK/metrics/stream.sse"
log "streaming chat (curl) in $(( ($(date +%s%N)-t)/1000000 )) ms: $(grep -c '^data: {' "$WORK/metrics/stream.sse") data events, last: $(grep '^data: {' "$WORK/metrics/stream.sse" | tail -1 | head -c 300)"
if [[ -n "$CLIENT_PY" ]]; then
  "$CLIENT_PY" - "$SERVED" <<'PY'
import sys, time
from openai import OpenAI
m = sys.argv[1]
c = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none", timeout=300, max_retries=0)
t = time.monotonic()
r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=12)
print(f"  openai non-streaming: {time.monotonic()-t:.2f}s finish={r.choices[0].finish_reason} usage={r.usage.prompt_tokens}+{r.usage.completion_tokens} text={r.choices[0].message.content!r}")
t = time.monotonic(); deltas = []; usage = None
for ch in c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=12, stream=True,
                                    stream_options={"include_usage": True}):
    if ch.choices and ch.choices[0].delta.content: deltas.append(ch.choices[0].delta.content)
    usage = ch.usage or usage
print(f"  openai streaming: {time.monotonic()-t:.2f}s {len(deltas)} content deltas, usage={usage.prompt_tokens}+{usage.completion_tokens} text={''.join(deltas)!r}")
assert usage.completion_tokens == 12 and deltas
PY
fi
log "decode metrics $(snap after-4-requests)"
log "prefill generation_tokens_total=$(metric 18081 'vllm:generation_tokens_total') decode generation_tokens_total=$(metric 18082 'vllm:generation_tokens_total')"

# ---- KV events reach the router: a 700-token prompt twice ---------------------------
LONG=$("$PY" -c 'print(" ".join(f"word{i} the weather in paris is fine" for i in range(60)))')
for i in 1 2; do
  curl -sf --max-time 300 http://$H:8000/v1/chat/completions -H 'Content-Type: application/json' \
    -d "{\"model\":\"$SERVED\",\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}],\"max_tokens\":4}" \
    | "$PY" -c 'import json,sys; u=json.load(sys.stdin)["usage"]; print("  long prompt: prompt_tokens", u["prompt_tokens"], "cached_tokens", (u.get("prompt_tokens_details") or {}).get("cached_tokens"))'
done
sleep 1
log "router: stored events applied ok = $(metric 8000 'dynamo_component_kv_cache_events_applied' 'event_type="stored",status="ok"'), kv zmq ingress batches = $(metric 8000 'dynamo_component_router_kv_zmq_ingress_batches_total'), selected cached prefix tokens = $(metric 8000 'dynamo_component_router_kv_selected_cached_prefix_tokens_total')"
grep -a "Selected worker" "$WORK/logs/frontend.log" | sed 's/\x1b\[[0-9;]*m//g' | grep -o 'worker_type=prefill.*' | tail -2 | sed 's/^/  frontend log: Selected worker ... /' || true

# ---- session affinity header is accepted ----------------------------------------------
for i in 1 2 3; do
  c=$(curl -s -o /dev/null -w '%{http_code}' --max-time 120 http://$H:8000/v1/chat/completions -H 'Content-Type: application/json' \
    -H 'X-Dynamo-Session-ID: s1' -d "{\"model\":\"$SERVED\",\"messages\":[{\"role\":\"user\",\"content\":\"turn $i\"}],\"max_tokens\":2}")
  printf '  session s1 turn %s: HTTP %s\n' "$i" "$c"
done

# ---- tool calling through Dynamo ---------------------------------------------------------
if [[ -n "$CLIENT_PY" && "$TOOL_REPS" != 0 ]]; then
  log "tool calling probe, $TOOL_REPS reps per case and mode"
  "$CLIENT_PY" "$REPO/scripts/vllm_cpu_toolcall_probe.py" http://$H:8000/v1 $SERVED "$TOOL_REPS" "$WORK/metrics/toolcalls.json" \
    > "$WORK/logs/toolcall-probe.log" 2>&1 || echo "  tool probe failed: see $WORK/logs/toolcall-probe.log"
  sed -n '/^| case/,$p' "$WORK/logs/toolcall-probe.log"
  grep '"status"' "$WORK/logs/toolcall-probe.log" | sed 's/^/  malformed: /' || true
fi
log "busy->idle 20 s after the load: $(treestat 20 prefill=$P decode=$D)"

# ---- Mooncake store ---------------------------------------------------------------------
if (( MOONCAKE_STORE )); then
  grep -a -i "mooncake" "$WORK/logs/prefill.log" | grep -a -iE "registered|setup|mode=|error|fail" | sed 's/\x1b\[[0-9;]*m//g' | head -8 | cut -c1-300 | sed 's/^/  prefill log: /' || true
  curl -s http://$H:9003/metrics | grep -E '^(master_key_count|master_put_start_requests_total|master_put_end_requests_total|master_put_start_failures_total|master_allocated_bytes|master_total_capacity_bytes|master_exist_key_requests_total|master_get_replica_list_requests_total)' | sed 's/^/  mooncake_master: /' || true
fi

# ---- decode worker killed ---------------------------------------------------------------------
# SIGKILL only the decode worker's main process (a crash), ask the frontend at once and
# again later, see whether vLLM's EngineCore/Worker children outlive it, then reap them by PID.
if (( KILL_DECODE )); then
  KIDS=$(descendants "$D")
  kill -KILL "$D"
  TK=$(date +%s%N)
  log "SIGKILLed decode main process $D (children: $(echo $KIDS))"
  for at in 0 2 5 10 20 30; do
    while (( ($(date +%s%N)-TK)/1000000000 < at )); do sleep 0.2; done
    out=$(curl -s -w ' HTTP %{http_code}' --max-time 60 http://$H:8000/v1/chat/completions -H 'Content-Type: application/json' \
      -d "{\"model\":\"$SERVED\",\"messages\":[{\"role\":\"user\",\"content\":\"are you there?\"}],\"max_tokens\":4}")
    ready=$(curl -s -o /dev/null -w '%{http_code}' http://$H:8000/v1/models/$SERVED/ready)
    alive=0; for k in $KIDS; do kill -0 "$k" 2>/dev/null && alive=$((alive+1)); done
    log "t+${at}s: chat -> ${out:0:300}; ready -> HTTP $ready; decode children still alive: $alive"
  done
  log "frontend ready endpoint now: $(curl -s -w ' HTTP %{http_code}' http://$H:8000/v1/models/$SERVED/ready | head -c 400); /v1/models: $(curl -s http://$H:8000/v1/models)"
  for k in $KIDS; do kill -0 "$k" 2>/dev/null && { echo "  reaping orphaned decode child $k ($(cat /proc/$k/comm 2>/dev/null))"; kill -KILL "$k"; }; done
  sleep 1
fi
log "all steps done"

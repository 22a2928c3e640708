#!/usr/bin/env bash
# Reference run of the CPU demo stack, exactly as verified by hand (see
# docs/runtime-notes.md): mooncake_master + Dynamo frontend (KV router,
# session affinity) + 1 mocker prefill + 2 mocker decode workers, all on
# 127.0.0.1 inside a private network namespace that has only loopback.
#
# Usage (root): scripts/demo-stack-manual.sh [file|etcd]
# Env: RUNTIME_VENV (default /opt/primectl-runtime-test, made by
#      scripts/install-runtime.sh), CLIENT_PY (optional python with `openai`).
# Every process is started here, recorded by PID, and stopped by PID on exit.
set -euo pipefail

DISCOVERY="${1:-file}"
case "$DISCOVERY" in file|etcd) ;; *) echo "usage: $0 [file|etcd]" >&2; exit 2;; esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PRIMECTL_DEMO_IN_NETNS:-}" ]]; then
  exec unshare --net env PRIMECTL_DEMO_IN_NETNS=1 bash "${BASH_SOURCE[0]}" "$@"
fi
ip link set lo up

RUNTIME="${RUNTIME_VENV:-/opt/primectl-runtime-test}"
PY="$RUNTIME/bin/python"
WORK="$(mktemp -d /tmp/primectl-demo.XXXXXX)"
MODEL="$WORK/model"
H=127.0.0.1
NS=primectl-demo
PIDS=()
NAMES=()

log() { printf '[%6.2fs] %s\n' "$(awk "BEGIN{print ($(date +%s%N)-$T0)/1e9}")" "$*"; }
T0=$(date +%s%N)

stop_all() {
  local i p
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do
    p=${PIDS[i]}
    kill -TERM "$p" 2>/dev/null || continue
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then echo "  ${NAMES[i]} ($p) ignored SIGTERM: SIGKILL"; kill -KILL "$p" 2>/dev/null || true; fi
  done
  for p in "${PIDS[@]}"; do
    if kill -0 "$p" 2>/dev/null; then echo "LEFTOVER pid $p" >&2; fi
  done
  echo "stopped ${#PIDS[@]} processes; logs in $WORK"
}
trap stop_all EXIT

# start NAME CMD... : background, stdout+stderr to $WORK/NAME.log; $! is the
# process itself (env execs the command), so stopping by PID is exact.
start() {
  local name=$1; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!); NAMES+=("$name")
}
# wait_code URL CODE TIMEOUT_S: poll until the HTTP status is CODE.
wait_code() {
  local url=$1 want=$2 limit=$3 t=$(date +%s%N) c
  while :; do
    c=$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)
    [[ "$c" == "$want" ]] && { echo $(( ($(date +%s%N)-t)/1000000 )); return 0; }
    (( ($(date +%s%N)-t)/1000000000 >= limit )) && { echo "timeout waiting $url -> $want (last $c)" >&2; return 1; }
    sleep 0.05
  done
}
metric() { # metric PORT REGEX -> summed value of matching sample lines
  curl -s "http://$H:$1/metrics" | grep -E "^$2" | awk '{s+=$NF} END{print s+0}'
}

# ---- model directory (task 3) -------------------------------------------------
PYTHONPATH="$REPO" "$PY" -c "import pathlib,sys; from primectl.demo_model import write_demo_model; write_demo_model(pathlib.Path(sys.argv[1]), 'demo', 32768)" "$MODEL"

# ---- common env for every Dynamo process ---------------------------------------
export DYN_NAMESPACE=$NS DYN_REQUEST_PLANE=tcp DYN_EVENT_PLANE=zmq
export DYN_TCP_RPC_HOST=$H DYN_TCP_RESPONSE_STREAM_HOST=$H DYN_EVENT_PLANE_HOST=$H
export DYN_HTTP_RPC_HOST=$H DYN_SYSTEM_HOST=$H VLLM_HOST_IP=$H
if [[ "$DISCOVERY" == file ]]; then
  export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV="$WORK/dynkv"
else
  export DYN_DISCOVERY_BACKEND=etcd ETCD_ENDPOINTS=http://$H:2379
  t=$(date +%s%N)
  start etcd etcd --name primectl-demo --data-dir "$WORK/etcd" \
    --listen-client-urls http://$H:2379 --advertise-client-urls http://$H:2379 \
    --listen-peer-urls http://$H:2380 --initial-advertise-peer-urls http://$H:2380 \
    --initial-cluster primectl-demo=http://$H:2380 --initial-cluster-state new
  log "etcd /health 200 after $(wait_code http://$H:2379/health 200 30) ms (pid ${PIDS[-1]})"
fi

# ---- mooncake_master ----------------------------------------------------------
start mooncake_master "$RUNTIME/bin/mooncake_master" --rpc_address $H --rpc_port 50051 \
  --enable_http_metadata_server=true --http_metadata_server_host $H --http_metadata_server_port 8080 \
  --metrics_host $H --metrics_port 9003
log "mooncake_master metrics /health 200 after $(wait_code http://$H:9003/health 200 30) ms; metadata /health $(wait_code http://$H:8080/health 200 30) ms"

# Mooncake store round trip (tcp). MC_TCP_BIND_ADDRESS is required in a
# loopback-only namespace ("not valid LAN address found" otherwise).
MC_TCP_BIND_ADDRESS=$H "$PY" - <<'PY' 2>"$WORK/mooncake_client.log"
from mooncake.store import MooncakeDistributedStore
store = MooncakeDistributedStore()
rc = store.setup("127.0.0.1", "http://127.0.0.1:8080/metadata",
                 64 * 1024 * 1024, 16 * 1024 * 1024, "tcp", "", "127.0.0.1:50051")
assert rc == 0, rc
payload = b"primectl" * 1000
assert store.put("primectl-demo-key", payload) == 0
assert store.get("primectl-demo-key") == payload
assert store.is_exist("primectl-demo-key") == 1
assert store.remove("primectl-demo-key", force=True) == 0  # plain remove() is -706 while the 10 s lease holds
store.close()
print("mooncake put/get round trip ok")
PY

# ---- Dynamo frontend ------------------------------------------------------------
start frontend "$PY" -m dynamo.frontend --namespace $NS --http-host $H --http-port 8000 \
  --router-mode kv --router-session-affinity-ttl-secs 600 --migration-limit 1
log "frontend /health 200 after $(wait_code http://$H:8000/health 200 60) ms"
log "ready before workers: $(curl -s -o /dev/null -w '%{http_code}' http://$H:8000/v1/models/demo/ready) (404 = model unknown)"

# ---- mocker workers -------------------------------------------------------------
MOCK=(-m dynamo.mocker --model-path "$MODEL" --model-name demo --max-model-len 32768)
start prefill env DYN_SYSTEM_PORT=18081 DYN_SYSTEM_STARTING_HEALTH_STATUS=ready \
  "$PY" "${MOCK[@]}" --disaggregation-mode prefill --bootstrap-ports 17001
log "prefill /health 200 after $(wait_code http://$H:18081/health 200 60) ms"
log "ready with prefill only: $(wait_code http://$H:8000/v1/models/demo/ready 503 30) ms -> $(curl -s http://$H:8000/v1/models/demo/ready)"
for n in 1 2; do
  start decode$n env DYN_SYSTEM_PORT=$((18081+n)) DYN_SYSTEM_STARTING_HEALTH_STATUS=ready \
    "$PY" "${MOCK[@]}" --disaggregation-mode decode
done
log "decode1 /health 200 after $(wait_code http://$H:18082/health 200 60) ms; decode2 $(wait_code http://$H:18083/health 200 60) ms"
log "frontend ready 200 after $(wait_code http://$H:8000/v1/models/demo/ready 200 60) ms"
curl -s http://$H:8000/v1/models; echo

# ---- requests -------------------------------------------------------------------
P_REQ='dynamo_component_requests_total\{dynamo_component="prefill",dynamo_endpoint="generate"'
D_REQ='dynamo_component_requests_total\{dynamo_component="backend",dynamo_endpoint="generate"'
p0=$(metric 18081 "$P_REQ"); d10=$(metric 18082 "$D_REQ"); d20=$(metric 18083 "$D_REQ")
curl -sf http://$H:8000/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model":"demo","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}],"max_tokens":8}'
echo
curl -sfN http://$H:8000/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"model":"demo","messages":[{"role":"user","content":"Stream please."}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}'
p1=$(metric 18081 "$P_REQ"); d11=$(metric 18082 "$D_REQ"); d21=$(metric 18083 "$D_REQ")
log "prefill requests_total $p0 -> $p1; decode1 $d10 -> $d11; decode2 $d20 -> $d21"
(( p1 - p0 == 2 && (d11 - d10) + (d21 - d20) == 2 )) || { echo "metric check FAILED" >&2; exit 1; }

# Session affinity: same X-Dynamo-Session-ID -> same decode worker every time.
for s in alpha beta gamma; do
  a=$(metric 18082 "$D_REQ"); b=$(metric 18083 "$D_REQ")
  for i in 1 2 3 4; do
    curl -sf -o /dev/null http://$H:8000/v1/chat/completions -H 'Content-Type: application/json' \
      -H "X-Dynamo-Session-ID: $s" -d "{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"$s turn $i $RANDOM\"}],\"max_tokens\":2}"
  done
  da=$(( $(metric 18082 "$D_REQ") - a )); db=$(( $(metric 18083 "$D_REQ") - b ))
  log "session $s: decode1 +$da decode2 +$db"
  (( (da == 4 && db == 0) || (da == 0 && db == 4) )) || { echo "session affinity FAILED" >&2; exit 1; }
done

if [[ -n "${CLIENT_PY:-}" ]]; then
  "$CLIENT_PY" - <<'PY'
from openai import OpenAI
c = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
assert len(r.choices[0].message.content.split()) == r.usage.completion_tokens == 5
s = [ch.choices[0].delta.content for ch in c.chat.completions.create(
    model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True)
    if ch.choices and ch.choices[0].delta.content]
assert len(s) == 5, s
print("openai client ok:", r.choices[0].message.content, "|", "".join(s))
PY
fi
log "all checks passed ($DISCOVERY discovery)"

#!/usr/bin/env bash
# Autoscaling demo: a master with no agents, `gantry-autoscaler` with the local provider and an
# empty pool of 2-GPU nodes (real gantry-agent processes with stand-in GPUs), and the batch
# example asking for 6 one-GPU tasks. Nodes appear for the demand, the tasks run, the idle
# nodes drain and go, and the report says what the nodes cost and what the framework paid.
# Everything lives in a temporary directory and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cargo build --workspace --bins
cargo build -p gantry-nvml-standin
BIN=$PWD/target/debug
DIR=$(mktemp -d /tmp/gantry-autoscale-demo.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM

QUIC=127.0.0.1:${GANTRY_DEMO_PORT:-5060}
HTTP=127.0.0.1:${GANTRY_DEMO_HTTP_PORT:-5061}
export GANTRY_MASTER="https://$HTTP" GANTRY_TLS_DIR="$DIR/tls"
echo "== starting a master with no agents on $QUIC (operator API https://$HTTP), logs in $DIR"
"$BIN/gantry-master" --listen "$QUIC" --http "$HTTP" --work-dir "$DIR/master" --tls-dir "$DIR/tls" \
  >"$DIR/master.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do "$BIN/gantryctl" state >/dev/null 2>&1 && break; sleep 0.1; done

cat >"$DIR/pools.toml" <<'TOML'
[autoscaler]
interval = "500ms"

[[pool]]
name = "gpu"
cpus = 2
mem = 2048
gpus = 2
gpu_model = "NVIDIA A100-SXM4-40GB"
price_per_hour = 4.10
max = 4
scale_down_cooldown = "5s"
provider = { kind = "local" }
TOML
ISOLATION=()
if [ "$(id -u)" != 0 ]; then ISOLATION=(--local-agent-arg=--isolation --local-agent-arg=none); fi
echo "== starting gantry-autoscaler: pool 'gpu' (2 x A100 per node, 4.10/h, 0..4 nodes)"
"$BIN/gantry-autoscaler" run --config "$DIR/pools.toml" --master "https://$HTTP" --tls-dir "$DIR/tls" \
  --operator admin --status-file "$DIR/status.json" --local-master "$QUIC" \
  --local-work-dir "$DIR/nodes" --local-agent-bin "$BIN/gantry-agent" \
  --local-nvml-lib "$BIN/libgantry_nvml_standin.so" \
  --local-agent-arg=--ports --local-agent-arg=none "${ISOLATION[@]}" >"$DIR/autoscaler.log" 2>&1 &
PIDS+=($!)

echo "== batch 'training': 6 tasks of 1 GPU each (3 nodes' worth), 4 s each"
"$BIN/batch" --master "$QUIC" --tls-dir "$DIR/tls" --name training --count 6 --cpus 0.5 --mem 64 \
  --gpus 1 -- 'echo "GPUs: ${CUDA_VISIBLE_DEVICES:-none}"; sleep 4' >"$DIR/batch.log" 2>&1 &
B=$!
nodes() { grep -o '"nodes": [0-9]*' "$DIR/status.json" 2>/dev/null | head -n 1 | grep -o '[0-9]*$' || echo 0; }
status=0
for i in $(seq 120); do
  sleep 1
  if [ $((i % 2)) = 0 ]; then
    echo "---- t=${i}s: nodes in the pool: $(nodes); the master's agents:"
    "$BIN/gantryctl" agents 2>/dev/null | sed 's/^/   /' || true
  fi
  if [ -n "$B" ] && ! kill -0 "$B" 2>/dev/null; then
    wait "$B" || status=1
    B=
    echo "---- the batch ended; its last lines:"
    tail -n 3 "$DIR/batch.log" | sed 's/^/   /'
  fi
  if [ -z "$B" ] && [ "$(nodes)" = 0 ]; then break; fi
done
echo "---- the autoscaler's report (cost per pool, and what the framework paid):"
cat "$DIR/status.json"
echo
if [ $status = 0 ] && [ -z "$B" ] && [ "$(nodes)" = 0 ]; then
  echo "== demo finished: the pool grew for the demand and shrank back to zero"
else
  echo "== the demo did not finish as expected; logs: $DIR"; status=1
fi
exit $status

#!/usr/bin/env bash
# Quickstart: build Gantry, start a local cluster (one master, two agents) and run the batch
# example in two roles side by side, showing tasks finishing and the DRF shares.
# Everything lives in a temporary directory and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cargo build --workspace --bins
cargo build -p gantry-nvml-standin   # the stand-in libnvidia-ml.so that gives agent-2 simulated GPUs
BIN=target/debug
DIR=$(mktemp -d /tmp/gantry-demo.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM

QUIC=127.0.0.1:${GANTRY_DEMO_PORT:-5050}
HTTP=127.0.0.1:${GANTRY_DEMO_HTTP_PORT:-5051}
ISOLATION=()
if [ "$(id -u)" != 0 ]; then ISOLATION=(--isolation none); fi
# Use cgroups only where the agent supports the flag (always, once built).
if ! $BIN/gantry-agent --help | grep -q -- "--isolation"; then ISOLATION=(); fi

# gantryctl reaches the operator API over HTTPS with the operator certificate the dev master
# writes into its TLS directory (operator-admin.pem).
export GANTRY_MASTER="https://$HTTP" GANTRY_TLS_DIR="$DIR/tls"
echo "== starting master on $QUIC (operator API https://$HTTP), logs in $DIR"
$BIN/gantry-master --listen "$QUIC" --http "$HTTP" --work-dir "$DIR/master" --tls-dir "$DIR/tls" \
  >"$DIR/master.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do $BIN/gantryctl state >/dev/null 2>&1 && break; sleep 0.1; done

EXTRA=()
if $BIN/gantry-agent --help | grep -q -- "--nvml-lib" && [ -e "$BIN/libgantry_nvml_standin.so" ]; then
  # The second agent gets four simulated GPUs from the stand-in NVML library.
  export GANTRY_NVML_STANDIN_CONFIG="$PWD/tests/nvml-standin/examples/four-gpus.toml"
  EXTRA=(--nvml-lib "$PWD/$BIN/libgantry_nvml_standin.so")
fi
echo "== starting two agents"
$BIN/gantry-agent --master "$QUIC" --work-dir "$DIR/agent-1" --tls-dir "$DIR/tls" --name agent-1 \
  --resources "cpus:4;mem:4096;disk:10000" "${ISOLATION[@]}" >"$DIR/agent-1.log" 2>&1 &
PIDS+=($!)
$BIN/gantry-agent --master "$QUIC" --work-dir "$DIR/agent-2" --tls-dir "$DIR/tls" --name agent-2 \
  --resources "cpus:4;mem:4096;disk:10000" "${ISOLATION[@]}" "${EXTRA[@]}" >"$DIR/agent-2.log" 2>&1 &
PIDS+=($!)
sleep 1
$BIN/gantryctl state

GPUS=0
if [ ${#EXTRA[@]} -gt 0 ]; then GPUS=1; fi
echo "== running batch frameworks: 'analytics' (20 x 1 cpu, 512 MiB) and 'training' (12 x 1 cpu, 128 MiB, $GPUS GPU)"
$BIN/batch --master "$QUIC" --tls-dir "$DIR/tls" --role analytics --count 20 --cpus 1 --mem 512 -- 'sleep 1' &
A=$!
$BIN/batch --master "$QUIC" --tls-dir "$DIR/tls" --role training --count 12 --cpus 1 --mem 128 --gpus "$GPUS" \
  -- 'echo "GPUs: ${CUDA_VISIBLE_DEVICES:-none}"; sleep 1' &
B=$!
for _ in 1 2 3; do
  sleep 1
  echo "---- cluster state (dominant shares are DRF's fairness measure)"
  $BIN/gantryctl state || true
done
status=0
wait "$A" || status=1
wait "$B" || status=1
echo "---- final state"
$BIN/gantryctl state
echo "---- what one training task saw:"
cat "$(ls -d "$DIR"/agent-2/sandboxes/*/ | head -n 1)stdout" 2>/dev/null || true
if [ $status = 0 ]; then echo "== demo finished: every task FINISHED"; else echo "== some tasks failed; logs: $DIR"; fi
exit $status

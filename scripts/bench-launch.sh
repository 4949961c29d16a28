#!/usr/bin/env bash
# Launch throughput of one machine, measured in ONE run (issue 13): N trivial processes (`true`)
# started and finished by
#   1. a bare spawner (xargs -P, INFLIGHT at a time): the floor set by the kernel;
#   2. Gantry with one real agent, --isolation none: `batch --count N --cpus 0.1 -- true`;
#   3. the same with cgroups (root and a writable cgroup file system only);
#   4. Slurm (Debian slurm-wlm, one node, an array job of `true`), when installed
#      (scripts/setup-deps.sh --bench installs it; CI does not).
# Prints jobs/s, each against the bare spawner and Slurm, the agent's CPU per task in two
# consecutive batches (it should not grow with the tasks run), the master's, and the whole
# machine's (busy time, steal excluded: comparable between runs on a noisy shared host).
#
# Usage: scripts/bench-launch.sh [N]     (default 1000)
# Env:   INFLIGHT (640: 0.1 cpus each on a 64-cpu agent, Slurm node of INFLIGHT cpus),
#        PROFILE=release|debug (release), SLURM=auto|no (auto), KEEP=1 keeps the temp dir,
#        CGROUP_ARGS: extra flags of the cgroups agent (e.g. "--cgroup-pool 0:0": no pool),
#        AGENT_ARGS: extra flags of both agents (e.g. "--commit-gap-ms 0"),
#        BIN=DIR: use the binaries in DIR instead of building (to compare two builds),
#        TMPDIR: where the run's files go (/tmp),
#        PERF=DIR: record `perf record -a` (every CPU) during each Gantry batch into
#        DIR/perf-MODE-RUN.data (read with `perf report -i FILE --sort comm,dso`); PERF_ARGS:
#        its options (-F 1999; e.g. "-e sched:sched_switch" counts context switches),
#        WORKFS=ext4: the agents' work directories on a fresh ext4 file system with a journal
#        (a loop-mounted image in the run's directory; root only) instead of TMPDIR's. On an
#        ext4 without a journal every new inode skips those freed in the last minutes, one
#        look-up each: after a burst of deletions (an earlier run's sandboxes) creating a
#        task's files can cost more than starting it (docs/benchmarks.md, "One real agent").
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000}
INFLIGHT=${INFLIGHT:-640}
PROFILE=${PROFILE:-release}
SLURM=${SLURM:-auto}
if [ -n "${BIN:-}" ]; then
  PROFILE="prebuilt $BIN"
elif [ "$PROFILE" = release ]; then
  cargo build -q --release -p gantry-master -p gantry-agent -p gantry-examples --bins
  BIN=target/release
else
  cargo build -q -p gantry-master -p gantry-agent -p gantry-examples --bins
  BIN=target/debug
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/gantry-bench.XXXXXX")
PIDS=()
WORK=$DIR
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "$WORK" = "$DIR" ] || umount "$WORK" 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] && echo "logs kept in $DIR" || rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
if [ "${WORKFS:-}" = ext4 ]; then
  truncate -s 8G "$DIR/work.img"
  mkfs.ext4 -q -F "$DIR/work.img"
  mkdir "$DIR/work"
  mount -o loop "$DIR/work.img" "$DIR/work"
  WORK=$DIR/work
fi

now() { date +%s.%N; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# utime + stime of a process (all its threads), in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Busy time of the whole machine (user, nice, system, irq, softirq: not idle, I/O wait or
# steal), in clock ticks: its CPU per task does not depend on what neighbours on the host take.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
HZ=$(getconf CLK_TCK)
per_task() { awk -v c="$1" -v hz="$HZ" -v n="$N" 'BEGIN { printf "%.2f", c * 1000 / hz / n }'; }
declare -A RATE
report() { # name t0 t1
  RATE[$1]=$(awk -v n="$N" -v a="$2" -v b="$3" 'BEGIN { printf "%.1f", n / (b - a) }')
  printf '%-32s %8.2f s %10s jobs/s\n' "$1" "$(awk -v a="$2" -v b="$3" 'BEGIN { print b - a }')" "${RATE[$1]}"
}

echo "== $N x true, $INFLIGHT in flight, $(nproc) cpus, $(uname -r), $(date -u +%FT%TZ), profile $PROFILE, agents' work on $(findmnt -n -o FSTYPE,OPTIONS --target "$WORK" | cut -c1-60)"

# 1. The floor: fork + exec + wait of N `true`, INFLIGHT at a time.
b0=$(busy_ticks)
t0=$(now)
seq "$N" | xargs -P "$INFLIGHT" -n 1 true
t1=$(now)
b1=$(busy_ticks)
report "bare spawner (xargs -P)" "$t0" "$t1"
echo "   machine CPU per task: $(per_task $((b1 - b0))) ms"

# 2-3. Gantry: one master, one agent per mode.
QUIC=127.0.0.1:$(free_port)
HTTP=127.0.0.1:$(free_port)
export GANTRY_MASTER="https://$HTTP" GANTRY_TLS_DIR="$DIR/tls"
# A stopped agent is forgotten after 1 s, so the next mode's batch gets no offer for it.
$BIN/gantry-master --listen "$QUIC" --http "$HTTP" --work-dir "$DIR/master" --tls-dir "$DIR/tls" \
  --agent-reregister-timeout 1 >"$DIR/master.log" 2>&1 &
MASTER=$!
PIDS+=($MASTER)
for _ in $(seq 200); do $BIN/gantryctl state >/dev/null 2>&1 && break; sleep 0.1; done
CPUS=$(awk -v n="$INFLIGHT" 'BEGIN { print n / 10 }')

known_agents() {
  $BIN/gantryctl state --json 2>/dev/null \
    | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["agents"]))' 2>/dev/null \
    || echo "?"
}

gantry() { # name isolation-args...
  local name=$1; shift
  # shellcheck disable=SC2086 # AGENT_ARGS: extra agent flags
  $BIN/gantry-agent --master "$QUIC" --work-dir "$WORK/agent-$name" --tls-dir "$DIR/tls" \
    --name "bench-$name" --resources "cpus:$CPUS;mem:$((INFLIGHT * 128));disk:1000;gpus:0" "$@" ${AGENT_ARGS:-} \
    >"$DIR/agent-$name.log" 2>&1 &
  local agent=$!
  PIDS+=($agent)
  for _ in $(seq 300); do grep -q "registered with the master" "$DIR/agent-$name.log" && break; sleep 0.1; done
  local agent_cpu=() master_cpu=() machine_cpu=()
  for run in 1 2; do
    local c0 t0 t1 c1 m0 m1 b0 b1
    c0=$(cpu_ticks "$agent")
    m0=$(cpu_ticks "$MASTER")
    b0=$(busy_ticks)
    local perf=
    if [ -n "${PERF:-}" ]; then
      mkdir -p "$PERF"
      # shellcheck disable=SC2086 # PERF_ARGS: perf's options, split into words
      perf record -q -a ${PERF_ARGS:--F 1999} -o "$PERF/perf-$name-$run.data" >/dev/null 2>&1 &
      perf=$!
      sleep 0.5
    fi
    t0=$(now)
    $BIN/batch --master "$QUIC" --tls-dir "$DIR/tls" --name "bench-$name-$run" --role "bench-$name" \
      --count "$N" --cpus 0.1 -- true >"$DIR/batch-$name-$run.log" 2>&1 &
    PIDS+=($!)
    # (wait, unlike a foreground command, lets a signal stop the script at once)
    wait $! || { echo "batch failed, see $DIR/batch-$name-$run.log"; KEEP=1; exit 1; }
    t1=$(now)
    if [ -n "$perf" ]; then kill -INT "$perf"; wait "$perf" 2>/dev/null || true; fi
    c1=$(cpu_ticks "$agent")
    m1=$(cpu_ticks "$MASTER")
    b1=$(busy_ticks)
    report "gantry $name (batch $run)" "$t0" "$t1"
    agent_cpu+=("$(per_task $((c1 - c0)))")
    master_cpu+=("$(per_task $((m1 - m0)))")
    machine_cpu+=("$(per_task $((b1 - b0)))")
  done
  echo "   agent CPU per task: ${agent_cpu[0]} ms (batch 1), ${agent_cpu[1]} ms (batch 2)"
  echo "   master CPU per task: ${master_cpu[0]} ms, ${master_cpu[1]} ms;" \
    "machine CPU per task: ${machine_cpu[0]} ms, ${machine_cpu[1]} ms"
  kill "$agent" 2>/dev/null || true
  wait "$agent" 2>/dev/null || true
  # The agent logs its log's frames and fdatasyncs at shutdown (both batches, 2 x N tasks).
  local syncs
  syncs=$(grep -o 'log_syncs[^0-9]*[0-9]*' "$DIR/agent-$name.log" | grep -o '[0-9]*$' | tail -1 || true)
  [ -n "$syncs" ] && echo "   agent log syncs per task: $(awk -v s="$syncs" -v n="$N" 'BEGIN { printf "%.2f", s / (2 * n) }') ($syncs fdatasyncs, both batches)"
  # The next mode's batch must not get offers for this agent.
  for _ in $(seq 600); do [ "$(known_agents)" = 0 ] && break; sleep 0.1; done
}
gantry none --isolation none
if [ "$(id -u)" = 0 ] && [ -w /sys/fs/cgroup ]; then
  # shellcheck disable=SC2086 # CGROUP_ARGS: extra agent flags, e.g. "--cgroup-pool 0:0"
  gantry cgroups --cgroup-root "gantry-bench-$$" ${CGROUP_ARGS:-}
fi

# 4. Slurm: a throwaway one-node cluster (its own config, state and ports) under $DIR.
if [ "$SLURM" != no ] && command -v slurmctld >/dev/null && command -v sbatch >/dev/null \
  && [ "$(id -u)" = 0 ]; then
  S=$DIR/slurm
  mkdir -p "$S/state" "$S/spool" /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    chown munge: /run/munge 2>/dev/null || true
    runuser -u munge -- /usr/sbin/munged
    # munged daemonizes: stopped with the rest (by the pid it records).
    PIDS+=("$(cat /run/munge/munged.pid)")
  fi
  cat >"$S/slurm.conf" <<EOF
ClusterName=bench
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
MaxArraySize=$((N + 1))
MaxJobCount=$((N * 2 + 100))
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$INFLIGHT RealMemory=1000 State=UNKNOWN
PartitionName=bench Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$S/slurm.conf
  slurmctld -D -f "$SLURM_CONF" >"$S/ctld.out" 2>&1 &
  PIDS+=($!)
  slurmd -D -N localhost -f "$SLURM_CONF" >"$S/d.out" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 300); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 0.1; done
  t0=$(now)
  job=$(sbatch --parsable --array="1-$N" --cpus-per-task=1 --mem=1 -o /dev/null -e /dev/null --wrap true)
  while [ -n "$(squeue -h -j "$job" -o %i 2>/dev/null | head -1)" ]; do sleep 0.05; done
  t1=$(now)
  report "slurm (array job, one node)" "$t0" "$t1"
else
  echo "slurm: skipped (needs root and slurm-wlm: scripts/setup-deps.sh --bench)"
fi

echo "== ratios"
bare=${RATE["bare spawner (xargs -P)"]}
for k in "gantry none (batch 2)" "gantry cgroups (batch 2)"; do
  [ -n "${RATE[$k]:-}" ] || continue
  line=$(awk -v g="${RATE[$k]}" -v b="$bare" 'BEGIN { printf "%.0f%% of the bare spawner", 100 * g / b }')
  if [ -n "${RATE["slurm (array job, one node)"]:-}" ]; then
    line+=$(awk -v g="${RATE[$k]}" -v s="${RATE["slurm (array job, one node)"]}" 'BEGIN { printf ", %.1fx Slurm", g / s }')
  fi
  echo "$k: $line"
done

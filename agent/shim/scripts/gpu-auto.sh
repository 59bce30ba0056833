#!/usr/bin/env bash
# Auto-sized jobs on a real GPU: the comparison of gpu-efficiency.sh (inference services
# and a training loop sharing one GPU, against one service per GPU), but run through
# Allot's real control plane, so that Allot places every job and, in the auto phase, sizes
# each service's share from what it uses. Starts `allot dev` (no simulated nodes) and one
# `allot agent` on this machine's GPU, both on loopback, in a temporary directory. Needs an
# NVIDIA GPU, its driver, PyTorch with CUDA and Allot's binaries (allot, liballot_shim.so:
# from ALLOT_DIR, else the repo's target/release, else target/debug); downloads nothing;
# changes no GPU setting (no MIG, clock, power or persistence change, no reset): it only
# reads utilization with nvidia-smi. About 10 minutes with the defaults (SIM: 3).
#
#   agent/shim/scripts/gpu-auto.sh
#   SIM=1 agent/shim/scripts/gpu-auto.sh   # a dry run of the orchestration without a GPU
#                                          # or PyTorch: a simulated H200 (the fake
#                                          # driver), allot-workload as the services and
#                                          # the training loop, no nvidia-smi
#
# Settings (environment): RATES ("120 60 30 15 8 4") requests per second to each service
# (Poisson, open loop; one service per rate), SERVICE_SHARE (0.1) of a GPU the operator
# gives each service in the static phase, PHASE_SECONDS (120; 20 under SIM) of measured
# load per phase, WARMUP (30) seconds of load before the auto phase is measured, TIME_SCALE
# (20) how much shorter Allot's sizing windows are (allot dev --sizing-time-scale), SEED (1),
# SERVICE_MEMORY (8GiB) and TRAIN_MEMORY (16GiB) of GPU memory, GPU_BACKEND (nvml), KEEP=1
# keeps the working directory (logs, database).
#
# Phases, each on fresh jobs (the previous phase's are cancelled and waited for):
#   1. exclusive: the first service alone on a whole GPU (--gpus 1) under its load;
#   2. static: every service at a strict SERVICE_SHARE (--gpus 0.1 --gpu-compute strict)
#      plus a best-effort training loop (--gpu-compute best-effort, tenant research);
#   3. auto: every service --gpus auto (Allot sizes it) plus the same training loop,
#      measured after WARMUP seconds under load.
# Prints one JSON line per phase and a table: services per GPU, GPU utilization
# (nvidia-smi's mean; null under SIM), the services' summed share as placed (and in auto
# each one's share as Allot sized it and the resizes it made), request latency p50/p99/p99.9
# and the share over 100 ms, requests lost, training steps/s (the real loop's over its life,
# from its log; under SIM over the measured window, in 2 ms kernels).
# Exit status: 0 the auto phase met 100 ms at p99.9, lost nothing, and its services' shares
# sum below SERVICES × SERVICE_SHARE (Allot gave less than the static guess); 1 it did not;
# 2 cannot run here.
set -uo pipefail

name=gpu-auto
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
python="${PYTHON:-python3}"
exec 3>&2 # what die says reaches stderr even from a quietened check
die() { echo "$name: $*" >&3; exit 2; }

sim=0; [[ "${SIM:-0}" != 0 ]] && sim=1
if [[ -n "${ALLOT_DIR:-}" ]]; then bin="$ALLOT_DIR"
elif [[ -x "$repo/target/release/allot" ]]; then bin="$repo/target/release"
else bin="$repo/target/debug"; fi
allot="$bin/allot"; shim="$bin/liballot_shim.so"
[[ -x "$allot" && -f "$shim" ]] || die "no allot and liballot_shim.so in $bin (set ALLOT_DIR)"
bin="$(cd "$bin" && pwd)"; allot="$bin/allot"; shim="$bin/liballot_shim.so"; workload="$bin/allot-workload"
python="$(command -v "$python")" || die "no ${PYTHON:-python3}"
if ((sim)); then
  [[ -x "$workload" && -f "$bin/liballot_fake_cuda.so" ]] || die "no allot-workload and liballot_fake_cuda.so in $bin"
else
  command -v nvidia-smi >/dev/null || die "no nvidia-smi: no NVIDIA driver here"
  "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || die "PyTorch with CUDA is not importable by $python"
fi

read -ra rates <<<"${RATES:-120 60 30 15 8 4}"
services=${#rates[@]}
((services > 0)) || die "RATES is empty"
service_share="${SERVICE_SHARE:-0.1}"
seconds="${PHASE_SECONDS:-$((sim ? 20 : 120))}"
warmup="${WARMUP:-30}"
seed="${SEED:-1}"
((seconds >= 8)) || die "PHASE_SECONDS must be at least 8"

work="$(mktemp -d)"
pids=()
cleanup() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do # loaders, the agent (it stops its jobs), dev
    kill "${pids[i]}" 2>/dev/null && wait "${pids[i]}" 2>/dev/null
  done
  if [[ "${KEEP:-0}" != 0 ]]; then echo "$name: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# json EXPR: EXPR (Python) of the JSON document `j` on stdin.
json() { "$python" -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
job() { "$allot" job get "$1" -o json | json "$2"; } # job ID EXPR
pyval() { "$python" -c "print($1)"; }

# Wait up to $1 seconds for the command "${@:3}" to succeed; else die with message $2.
await() {
  local n="$1" why="$2"; shift 2
  for _ in $(seq 1 $((n * 2))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "$why"
}

start_allot() {
  local port gport token
  read -r port gport < <("$python" -c 'import socket; s=[socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
  "$allot" dev --data-dir "$work/dev" --nodes 0 --listen "127.0.0.1:$port" \
    --grpc-listen "127.0.0.1:$gport" --runtime process --sizing-time-scale "${TIME_SCALE:-20}" \
    --max-jobs-per-shared-gpu 16 >"$work/dev.log" 2>&1 &
  pids+=($!)
  export ALLOT_SERVER="http://127.0.0.1:$port"
  await 60 "the control plane did not start (KEEP=1 keeps dev.log)" test -s "$work/dev/admin.token"
  ALLOT_TOKEN="$(cat "$work/dev/admin.token")"; export ALLOT_TOKEN
  await 60 "the control plane does not answer" "$allot" node list
  token="$("$allot" node bootstrap-token create --node gpu0 -o json | json "j['secret']")" \
    || die "no bootstrap token"
  local backend=(--gpu-backend "${GPU_BACKEND:-nvml}")
  ((sim)) && backend=(--gpu-backend sim --sim-gpus 1xH200)
  "$allot" agent --server "https://127.0.0.1:$gport" --ca-cert "$work/dev/pki/ca.pem" \
    --bootstrap-token "$token" --name gpu0 "${backend[@]}" --runtime process \
    --shim-library "$shim" --data-dir "$work/agent" >"$work/agent.log" 2>&1 &
  pids+=($!)
  await 60 "the agent did not become ready (KEEP=1 keeps agent.log)" \
    bash -c '"$0" node list -o json | grep -q "\"status\": \"ready\""' "$allot"
  for t in serving research; do "$allot" tenant create "$t" >/dev/null || die "tenant $t"; done
}

# What jobs are given: their host share, and the fake driver or the Python settings.
if ((sim)); then
  mkdir -p "$work/driver"
  for lib in libcuda.so.1 libcuda.so libnvidia-ml.so.1; do ln -s "$bin/liballot_fake_cuda.so" "$work/driver/$lib"; done
  job_args=(--cpus 0.1 --memory 256MiB -e "LD_LIBRARY_PATH=$work/driver")
else
  job_args=(--cpus 1 --memory 8GiB)
  for v in HIDDEN LAYERS TRAIN_HIDDEN TRAIN_BATCH PYTHONPATH LD_LIBRARY_PATH; do
    [[ -n "${!v:-}" ]] && job_args+=(-e "$v=${!v}")
  done
fi

submit() { # submit NAME TENANT ARGS... -- COMMAND...: prints the job's id
  local name="$1" tenant="$2"; shift 2
  "$allot" job submit --name "$name" --tenant "$tenant" "${job_args[@]}" -o json "$@" | json "j['id']"
}
service() { # service NAME GPU-ARGS...: a service that writes its port to ports/NAME
  local name="$1"; shift
  if ((sim)); then
    submit "$name" serving --class inference "$@" -- "$workload" serve \
      --port-file "$work/ports/$name" --kernels 2 --kernel-us 250 --max-batch 8
  else
    submit "$name" serving --class inference "$@" -- "$python" "$here/gpu_efficiency.py" serve "$work/ports/$name"
  fi
}
trainer() { # trainer PHASE: the best-effort training loop
  local args=(--class training --isolation shared --gpus 1 --gpu-compute best-effort --gpu-memory "${TRAIN_MEMORY:-16GiB}")
  if ((sim)); then
    submit "$1-train" research "${args[@]}" -- "$workload" train --progress-dir "$work/progress" \
      --checkpoint-dir "$work/checkpoints/$1"
  else
    submit "$1-train" research "${args[@]}" -- "$python" "$here/gpu_efficiency.py" train 1000000
  fi
}
load() { "$python" "$here/gpu_efficiency.py" load "$@"; } # load SECONDS RATES SEED PORT...
started() { # started NAME ID: whether service NAME wrote its port; dies if its job ended
  [[ -s "$work/ports/$1" ]] && return 0
  [[ "$(job "$2" "j['state']")" =~ ^(pending|scheduled|running)$ ]] \
    || die "service $1 ended before it listened: $("$allot" job logs "$2" 2>&1 | tail -n3)"
  return 1
}

# Mean GPU utilization (%) of GPU $1 over the next $2 seconds, read-only (null under SIM).
utilization() {
  local gpu="$1" n="$2" sum=0 count=0 u end=$((SECONDS + $2))
  if ((sim)); then sleep "$n"; echo null; return; fi
  while ((SECONDS < end)); do
    u="$(nvidia-smi --id="$gpu" --query-gpu=utilization.gpu --format=csv,noheader,nounits | tr -d ' ')"
    [[ "$u" =~ ^[0-9]+$ ]] && { sum=$((sum + u)); count=$((count + 1)); }
    sleep 0.5
  done
  pyval "round($sum / max(1, $count), 1)"
}

# Kernel-seconds the simulated training job $1 ran so far (its progress file), and now.
train_work() {
  local f; f="$(ls "$work/progress/$1"-* 2>/dev/null | head -n1)"
  echo "$(cut -d' ' -f1 "$f" 2>/dev/null || echo null) $(date +%s.%N)"
}

stop_jobs() { # cancels the jobs (the last first) and waits until each has ended
  local i id
  for ((i = $#; i > 0; i--)); do "$allot" job cancel "${!i}" >/dev/null 2>&1; done
  for id; do
    await 120 "job $id did not end after its cancel" \
      bash -c '"$0" job get "$1" -o json | grep -Eq "\"state\": \"(succeeded|failed|cancelled|timed_out)\""' "$allot" "$id"
  done
}

# phase NAME: runs one phase on fresh jobs and writes its JSON line to $work/NAME.json.
phase() {
  local p="$1" n="$services" ids=() ports=() train="" i id gpu util w0 w1 rate=null
  rm -rf "$work/ports"; mkdir -p "$work/ports" "$work/progress"
  [[ $p == exclusive ]] && n=1
  for ((i = 1; i <= n; i++)); do
    case $p in
      exclusive) id="$(service "$p-s$i" --gpus 1)" ;;
      static) id="$(service "$p-s$i" --gpus "$service_share" --gpu-compute strict --gpu-memory "${SERVICE_MEMORY:-8GiB}")" ;;
      auto) id="$(service "$p-s$i" --gpus auto --gpu-memory "${SERVICE_MEMORY:-8GiB}")" ;;
    esac
    [[ -n "$id" ]] || die "submitting service $p-s$i failed"
    ids+=("$id")
  done
  if [[ $p != exclusive ]]; then
    train="$(trainer "$p")"; [[ -n "$train" ]] || die "submitting the training loop failed"
  fi
  for ((i = 1; i <= n; i++)); do
    await 600 "service $p-s$i did not start (KEEP=1 keeps the logs)" started "$p-s$i" "${ids[i - 1]}"
    ports+=("$(tr -d '[:space:]' <"$work/ports/$p-s$i")")
  done
  local csv; csv="$(IFS=,; echo "${rates[*]:0:n}")"
  gpu="$(job "${ids[0]}" "j['gpu_uuids'][0]")"
  for id in "${ids[@]:1}"; do
    [[ "$(job "$id" "j['gpu_uuids'][0]")" == "$gpu" ]] || echo "$name: $p: services on more than one GPU; utilization is $gpu's" >&2
  done
  [[ $p == auto ]] && ((warmup > 0)) && { echo "auto: ${warmup} s of load for Allot to size the services" >&2; load "$warmup" "$csv" $((seed + 1000)) "${ports[@]}" >/dev/null; }
  w0="$(train_work "$train")"
  load "$seconds" "$csv" "$seed" "${ports[@]}" >"$work/$p.load" &
  pids+=($!)
  sleep 2
  util="$(utilization "$gpu" $((seconds - 4)))"
  wait "${pids[-1]}"; unset 'pids[-1]'
  w1="$(train_work "$train")"
  local shares=() resizes=0
  for id in "${ids[@]}"; do
    shares+=("$(job "$id" "(j['held_gpu_milli'] or j['gpu_milli'] or 1000) / 1000")")
    resizes=$((resizes + $(job "$id" "sum(1 for e in j['events'] if (e['message'] or '').startswith('resized'))")))
  done
  stop_jobs "${ids[@]}" ${train:+"$train"}
  if [[ -n "$train" ]] && ((sim)); then
    rate="$(pyval "(lambda a, b: 'null' if 'null' in (a[0], b[0]) else round((float(b[0]) - float(a[0])) / 0.002 / (float(b[1]) - float(a[1])), 1))('$w0'.split(), '$w1'.split())")"
  elif [[ -n "$train" ]]; then
    rate="$("$allot" job logs "$train" | grep steps_per_s | tail -n1 | json "round(j['steps_per_s'], 1)" 2>/dev/null || echo null)"
  fi
  local list; list="$(IFS=,; echo "${shares[*]}")"
  echo "{\"phase\": \"$p\", \"services\": $n, \"gpu_utilization_pct\": $util, \"shares\": [$list], \"shares_sum\": $(pyval "round(sum([$list]), 3)"), \"resizes\": $resizes, \"load\": $(cat "$work/$p.load"), \"training_steps_per_s\": $rate}" >"$work/$p.json"
  cat "$work/$p.json"
}

echo "$( ((sim)) && echo "SIM: a simulated H200" || nvidia-smi --query-gpu=name --format=csv,noheader | head -n1); $services services at ${rates[*]} req/s, $seconds s per phase; Allot from $bin"
start_allot
for p in exclusive static auto; do phase "$p"; done

get() { json "json.dumps($2)" <"$work/$1.json"; } # get PHASE EXPR: as JSON (null, not None)
row() { printf '%-44s %-14s %-14s %s\n' "$@"; }
echo
row "" exclusive static auto
row "services per GPU" 1 "$services" "$services"
row "GPU utilization (nvidia-smi, mean %)" "$(get exclusive "j['gpu_utilization_pct']")" "$(get static "j['gpu_utilization_pct']")" "$(get auto "j['gpu_utilization_pct']")"
row "services' GPU share (sum)" "$(get exclusive "j['shares_sum']")" "$(get static "j['shares_sum']")" "$(get auto "j['shares_sum']")"
for k in p50_ms p99_ms p99_9_ms over_100ms_share lost; do
  row "request $k" "$(get exclusive "round(j['load']['$k'], 4)")" "$(get static "round(j['load']['$k'], 4)")" "$(get auto "round(j['load']['$k'], 4)")"
done
row "training steps/s (best-effort)" - "$(get static "j['training_steps_per_s']")" "$(get auto "j['training_steps_per_s']")"
echo "auto: each service's share as Allot sized it (req/s: share): $(json "', '.join(f'{r:g}: {s:g}' for r, s in zip([${rates[*]/%/,}], j['shares']))" <"$work/auto.json"); $(get auto "j['resizes']") resizes"
verdict="$(get auto "0 if j['load']['p99_9_ms'] < 100 and j['load']['lost'] == 0 and j['shares_sum'] < $services * $service_share else 1")"
exit "${verdict:-1}"

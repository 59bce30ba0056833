#!/usr/bin/env bash
# The efficiency check on a real GPU: several small inference services and a training loop
# on one GPU under the shim, against one service per GPU. Needs an NVIDIA GPU, its driver
# and PyTorch with CUDA; downloads nothing (random-initialised models); changes no GPU
# setting (no MIG, clock, power or persistence change, no reset): it only reads
# utilization with nvidia-smi. About 4 minutes with the defaults.
#
#   agent/shim/scripts/gpu-efficiency.sh            # builds the shim if cargo is here
#   SHIM_DIR=/path/with/binaries gpu-efficiency.sh  # or uses liballot_shim.so and
#                                                   # allot-shim-exec from there
#
# Settings (environment): SERVICES (6) services shared on the GPU, RPS (40) requests per
# second to each service (Poisson, open loop), PHASE_SECONDS (60) of load per phase,
# SEED (1).
#
# Phases, each measured alone:
#   1. training alone on the GPU (steps/s: what a GPU of its own gives it);
#   2. exclusive: one service alone on the GPU under its load (what one service per GPU
#      leaves the GPU doing);
#   3. shared: SERVICES services, each under the shim with a strict SERVICE_SHARE
#      (thousandths, default 100), plus the training loop with a strict share of what they
#      leave, all under the same per-service load.
# Prints one JSON line per phase and a table:
#   services per GPU (shared against exclusive: SERVICES×), GPU utilization (nvidia-smi's,
#   averaged over the phase) exclusive against shared, request latency p50/p99/p99.9 and
#   the share over 100 ms in each, training steps/s shared against alone.
# Expected on a large GPU (H100/H200 class) with the defaults: shared utilization well
# above exclusive, shared p99.9 under 100 ms, training keeping most of its alone rate.
# Exit status: 0 the shared phase met 100 ms at p99.9 and lost nothing, 1 it did not,
# 2 cannot run here.
set -uo pipefail

name=gpu-efficiency
source "$(dirname "$0")/gpu-common.sh"
services="${SERVICES:-6}"
service_share="${SERVICE_SHARE:-100}"
rps="${RPS:-40}"
seconds="${PHASE_SECONDS:-60}"
seed="${SEED:-1}"
echo "GPU $gpu ($(nvidia-smi --id="$gpu" --query-gpu=name --format=csv,noheader)); $services services at $rps req/s each, $seconds s per phase"

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# Mean GPU utilization (%) over the next N seconds, read-only.
utilization() {
  local n="$1" sum=0 count=0 u
  local end=$((SECONDS + n))
  while ((SECONDS < end)); do
    u="$(nvidia-smi --id="$gpu" --query-gpu=utilization.gpu --format=csv,noheader,nounits | tr -d ' ')"
    [[ "$u" =~ ^[0-9]+$ ]] && { sum=$((sum + u)); count=$((count + 1)); }
    sleep 0.5
  done
  "$python" -c "print(round($sum / max(1, $count), 1))"
}

# start_service NAME [shim-exec limit args...]: starts a service, waits for its port.
start_service() {
  local name="$1"; shift
  if (($#)); then
    "$exec_" --shim "$shim" --gpu "$gpu" "$@" -- "$python" "$here/gpu_efficiency.py" serve "$work/$name.port" &
  else
    CUDA_VISIBLE_DEVICES="$gpu" "$python" "$here/gpu_efficiency.py" serve "$work/$name.port" &
  fi
  pids+=($!)
  for _ in $(seq 1 600); do [[ -s "$work/$name.port" ]] && return 0; sleep 0.1; done
  die "service $name did not start"
}

field() { "$python" -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }

# 1. Training alone.
alone="$(CUDA_VISIBLE_DEVICES="$gpu" "$python" "$here/gpu_efficiency.py" train 30)" || die "training failed"
echo "{\"phase\": \"training alone\", \"result\": $alone}"
alone_rate="$(echo "$alone" | field steps_per_s)"

# 2. Exclusive: one service, alone on the GPU.
start_service solo
"$python" "$here/gpu_efficiency.py" load "$seconds" "$rps" "$seed" "$(cat "$work/solo.port")" >"$work/solo.json" &
loader=$!
sleep 2
util_excl="$(utilization $((seconds - 4)))"
wait "$loader"
kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; pids=()
excl="$(cat "$work/solo.json")"
echo "{\"phase\": \"exclusive\", \"gpu_utilization_pct\": $util_excl, \"load\": $excl}"

# 3. Shared: SERVICES services and the training loop, each with a share.
train_share=$((1000 - services * service_share))
((train_share >= 50)) || die "SERVICES × SERVICE_SHARE leaves the training loop under 5%"
ports=()
for i in $(seq 1 "$services"); do
  start_service "s$i" --compute "$service_share" --mode strict --memory 8GiB
  ports+=("$(cat "$work/s$i.port")")
done
"$exec_" --shim "$shim" --gpu "$gpu" --compute "$train_share" --mode strict --memory 16GiB -- \
  "$python" "$here/gpu_efficiency.py" train $((seconds + 30)) >"$work/train.json" &
trainer=$!
sleep 5
"$python" "$here/gpu_efficiency.py" load "$seconds" "$rps" "$seed" "${ports[@]}" >"$work/shared.json" &
loader=$!
sleep 2
util_shared="$(utilization $((seconds - 4)))"
wait "$loader"
kill -TERM "$trainer" 2>/dev/null; wait "$trainer"
kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null; pids=()
shared="$(cat "$work/shared.json")"
shared_rate="$(field steps_per_s <"$work/train.json" 2>/dev/null || echo 0)"
echo "{\"phase\": \"shared\", \"gpu_utilization_pct\": $util_shared, \"load\": $shared, \"training_steps_per_s\": $shared_rate}"

p999="$(echo "$shared" | field p99_9_ms)"
lost="$(echo "$shared" | field lost)"
printf '\n%-44s %-16s %s\n' "" "exclusive" "shared"
printf '%-44s %-16s %s\n' "services per GPU" "1" "$services"
printf '%-44s %-16s %s\n' "GPU utilization (nvidia-smi, mean %)" "$util_excl" "$util_shared"
for k in p50_ms p99_ms p99_9_ms over_100ms_share lost; do
  printf '%-44s %-16s %s\n' "request $k" "$(echo "$excl" | field "$k")" "$(echo "$shared" | field "$k")"
done
printf '%-44s %-16s %s\n' "training steps/s (alone: $alone_rate)" "-" "$shared_rate"
"$python" -c "import sys; sys.exit(0 if float('$p999') < 100 and int('$lost') == 0 else 1)"

#!/usr/bin/env bash
# Reads this machine's NVIDIA GPUs through the agent's NVML backend and prints a report:
# inventory (UUID, model, memory, PCI bus id), MIG mode and layout, running processes,
# utilization, ECC / retired-page / remapped-row counters, and whether XID events can be
# watched (it listens for them a few seconds). It changes nothing on any GPU: no MIG
# instances, clocks, power limits, persistence mode or resets.
#
#   agent/scripts/gpu-check.sh            # human-readable
#   agent/scripts/gpu-check.sh --json     # one JSON document (also saved to $OUT if set)
#
# Uses $ALLOT_BIN, else `allot` on PATH, else builds it from this checkout (cargo).
# Exit status: 0 all healthy, 1 a GPU is unhealthy or a query failed, 2 no driver.
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
format=human
listen="${LISTEN_SECS:-5}"
for arg in "$@"; do
  case "$arg" in
    --json) format=json ;;
    *) echo "usage: $0 [--json]" >&2; exit 64 ;;
  esac
done

if ! command -v nvidia-smi >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libnvidia-ml.so.1; then
  echo "no NVIDIA driver here (neither nvidia-smi nor libnvidia-ml.so.1)" >&2
  exit 2
fi

bin="${ALLOT_BIN:-}"
if [[ -z "$bin" ]]; then
  if command -v allot >/dev/null 2>&1; then
    bin="$(command -v allot)"
  else
    echo "building allot (release)…" >&2
    (cd "$here" && cargo build --release --quiet -p allot --bin allot)
    bin="$here/target/release/allot"
  fi
fi

if [[ "$format" == json ]]; then
  status=0
  report="$("$bin" gpu check --listen-secs "$listen" -o json)" || status=$?
  echo "$report"
  if [[ -n "${OUT:-}" ]]; then echo "$report" > "$OUT/gpu-check.json"; fi
  exit "$status"
fi
echo "== driver's view (nvidia-smi, read-only) =="
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,mig.mode.current --format=csv 2>/dev/null || true
echo
echo "== the agent's view (NVML backend) =="
exec "$bin" gpu check --listen-secs "$listen"

#!/usr/bin/env bash
# The GPU-sharing shim on a real GPU: run on a machine with an NVIDIA GPU, its driver and
# PyTorch. Changes no GPU setting (no MIG, clock, power or persistence change, no reset).
#
#   agent/shim/scripts/gpu-check.sh            # builds the shim if cargo is here
#   SHIM_DIR=/path/with/binaries gpu-check.sh  # or uses liballot_shim.so and
#                                              # allot-shim-exec from there
#
# Prints a table:
#   1. under a 10 GiB limit: torch.cuda.mem_get_info() reports 10 GiB total, allocating
#      12 GiB raises torch's OutOfMemoryError, 9 GiB succeeds;
#   2. two processes with strict 30% and 70% compute shares running the same matmul loop
#      get throughput in a 3:7 ratio (within ±15%);
#   3. with the shim loaded and no limit, matmul and small-kernel launch throughput are
#      within 2% of running without it.
# Exit status: 0 all pass, 1 a check failed, 2 cannot run here.
set -uo pipefail

name=gpu-check
source "$(dirname "$0")/gpu-common.sh"
window="${WINDOW_SECONDS:-15}"
total_mib="$(nvidia-smi --id="$gpu" --query-gpu=memory.total --format=csv,noheader,nounits | tr -d ' ')"
echo "GPU $gpu ($(nvidia-smi --id="$gpu" --query-gpu=name --format=csv,noheader)), ${total_mib} MiB; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"

run() { # run LIMIT_ARGS... -- workload args: under the shim
  "$exec_" --shim "$shim" --gpu "$gpu" "$@"
}
field() { "$python" -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }

failures=0
rows=()
row() { rows+=("$(printf '%-58s %-28s %s' "$1" "$2" "$3")"); [[ "$3" == pass ]] || failures=$((failures + 1)); }

# 1. Memory under a 10 GiB limit.
limit=$((10 << 30))
out="$(run --memory 10GiB -- "$python" "$here/gpu_check.py" memory "$limit")" || out='{}'
total="$(echo "$out" | field total 2>/dev/null || echo ?)"
a12="$(echo "$out" | field alloc_12gib 2>/dev/null || echo ?)"
a9="$(echo "$out" | field alloc_9gib 2>/dev/null || echo ?)"
row "1a mem_get_info total under a 10 GiB limit" "$total" "$([[ "$total" == "$limit" ]] && echo pass || echo FAIL)"
row "1b allocate 12 GiB under the limit" "$a12" "$([[ "$a12" == oom ]] && echo pass || echo FAIL)"
row "1c allocate 9 GiB under the limit" "$a9" "$([[ "$a9" == ok ]] && echo pass || echo FAIL)"

# 2. Strict 30% and 70% shares side by side.
t30="$(mktemp)"; t70="$(mktemp)"
run --compute 300 --mode strict -- "$python" "$here/gpu_check.py" matmul "$window" >"$t30" &
p30=$!
run --compute 700 --mode strict -- "$python" "$here/gpu_check.py" matmul "$window" >"$t70" &
p70=$!
wait "$p30" "$p70"
r30="$(field matmuls_per_s <"$t30" 2>/dev/null || echo 0)"
r70="$(field matmuls_per_s <"$t70" 2>/dev/null || echo 0)"
ratio="$("$python" -c "a,b=$r30,$r70; print(f'{a/(a+b):.3f}' if a+b else 'nan')")"
ok="$("$python" -c "r='$ratio'; print('pass' if r!='nan' and abs(float(r)-0.3) <= 0.3*0.15 else 'FAIL')")"
row "2  30%:70% strict matmul throughput (30% side's fraction)" "$ratio (${r30%.*}:${r70%.*}/s)" "$ok"
rm -f "$t30" "$t70"

# 3. No limit: throughput with the shim against without, alternated, best of two each.
best() { # best rate of two runs of: "$@"
  local a b
  a="$("$@" | field "$key" 2>/dev/null || echo 0)"
  b="$("$@" | field "$key" 2>/dev/null || echo 0)"
  "$python" -c "print(max($a, $b))"
}
for w in matmul launches; do
  key="$([[ $w == matmul ]] && echo matmuls_per_s || echo launches_per_s)"
  bare="$(best "$python" "$here/gpu_check.py" "$w" "$window")"
  shimmed="$(best run -- "$python" "$here/gpu_check.py" "$w" "$window")"
  diff="$("$python" -c "b,s=$bare,$shimmed; print(f'{(s-b)/b*100:+.2f}%' if b else 'nan')")"
  ok="$("$python" -c "b,s=$bare,$shimmed; print('pass' if b and s >= 0.98*b else 'FAIL')")"
  row "3  $w throughput, shim without limits vs none" "$diff" "$ok"
done

printf '%-58s %-28s %s\n' "check" "measured" "result"
printf '%s\n' "${rows[@]}"
[[ $failures -eq 0 ]] && exit 0 || exit 1

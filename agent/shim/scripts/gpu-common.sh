# Sourced by gpu-check.sh and gpu-efficiency.sh (after setting `name`): checks that this
# machine has an NVIDIA driver and PyTorch with CUDA, finds or builds the shim, and picks
# the first GPU. Sets here, repo, python, shim, exec_ and gpu; defines die (exit 2: cannot
# run here). Reads nothing but nvidia-smi queries; changes no GPU setting.

here="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
python="${PYTHON:-python3}"

die() { echo "$name: $*" >&2; exit 2; }

command -v nvidia-smi >/dev/null || die "no nvidia-smi: no NVIDIA driver here"
"$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
  || die "PyTorch with CUDA is not importable by $python"

if [[ -n "${SHIM_DIR:-}" ]]; then
  bin="$SHIM_DIR"
elif command -v cargo >/dev/null; then
  # Two small crates (libc and thiserror are their only dependencies): seconds.
  (cd "$repo" && cargo build --quiet --release -p allot-shim -p allot-shim-core --bin allot-shim-exec) \
    || die "building the shim failed"
  bin="$repo/target/release"
else
  die "no cargo to build the shim: set SHIM_DIR to a directory with liballot_shim.so and allot-shim-exec"
fi
shim="$bin/liballot_shim.so"
exec_="$bin/allot-shim-exec"
[[ -f "$shim" && -x "$exec_" ]] || die "missing $shim or $exec_"

gpu="$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n1 | tr -d ' ')"
[[ "$gpu" == GPU-* ]] || die "no GPU UUID from nvidia-smi"

"""Workloads for gpu-check.sh, run under the GPU-sharing shim (or without it).

    gpu_check.py memory LIMIT_BYTES   what torch sees and can allocate under a limit
    gpu_check.py matmul SECONDS       4096x4096 fp16 matmuls per second
    gpu_check.py launches SECONDS     tiny-kernel launches per second

Each prints one line of JSON.
"""
import json
import sys
import time

import torch


def memory(limit):
    free, total = torch.cuda.mem_get_info()
    out = {"total": total, "free": free}
    try:
        x = torch.empty(12 << 30, dtype=torch.uint8, device="cuda")
        out["alloc_12gib"] = "ok"
        del x
    except torch.cuda.OutOfMemoryError:
        out["alloc_12gib"] = "oom"
    torch.cuda.empty_cache()
    try:
        x = torch.empty(9 << 30, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        out["alloc_9gib"] = "ok"
        del x
    except torch.cuda.OutOfMemoryError:
        out["alloc_9gib"] = "oom"
    out["limit"] = limit
    return out


def rate(seconds, step, per_sync):
    # Warm up, then count completed steps in the window.
    for _ in range(per_sync):
        step()
    torch.cuda.synchronize()
    n, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(per_sync):
            step()
        torch.cuda.synchronize()
        n += per_sync
    return n / (time.monotonic() - start)


def matmul(seconds):
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    return {"matmuls_per_s": rate(seconds, lambda: torch.mm(a, b), 20)}


def launches(seconds):
    x = torch.zeros(16, device="cuda")
    return {"launches_per_s": rate(seconds, lambda: x.add_(1.0), 1000)}


if __name__ == "__main__":
    what, arg = sys.argv[1], sys.argv[2]
    result = {"memory": lambda: memory(int(arg)),
              "matmul": lambda: matmul(float(arg)),
              "launches": lambda: launches(float(arg))}[what]()
    print(json.dumps(result), flush=True)

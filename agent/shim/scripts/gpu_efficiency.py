"""The efficiency check on a real GPU (run by gpu-efficiency.sh and gpu-auto.sh): small
inference services, a training loop and an open-loop load generator, in PyTorch, with
random-initialised models (nothing is downloaded).

  gpu_efficiency.py serve PORT_FILE      an inference service: 8-byte request ids over TCP,
                                         batched (up to 8) through an MLP, answered in order
  gpu_efficiency.py train SECONDS        a training loop; prints {"steps_per_s": …}; stops
                                         early (and still prints) on SIGTERM
  gpu_efficiency.py load SECONDS RPS SEED PORT...
                                         Poisson arrivals at RPS per service, each request
                                         timed from its scheduled send; prints latencies
                                         (all services', and each one's in "services").
                                         RPS may be a comma-separated list, one rate per
                                         PORT in order (e.g. 120,60,30)

The load mode needs only the Python standard library (no PyTorch, no GPU).

Sizes come from the environment: HIDDEN (default 2048), LAYERS (4), TRAIN_HIDDEN (4096),
TRAIN_BATCH (256).
"""

import json
import os
import random
import signal
import socket
import struct
import sys
import threading
import time


def env_int(name, default):
    return int(os.environ.get(name, default))


def serve(port_file):
    import torch

    hidden, layers = env_int("HIDDEN", 2048), env_int("LAYERS", 4)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[m for _ in range(layers) for m in (torch.nn.Linear(hidden, hidden), torch.nn.ReLU())]
    ).cuda().half().eval()
    lock = threading.Condition()
    queue = []

    def worker():
        with torch.inference_mode():
            while True:
                with lock:
                    while not queue:
                        lock.wait()
                    batch, queue[:] = queue[:8], queue[8:]
                x = torch.randn(len(batch), hidden, device="cuda", dtype=torch.half)
                model(x)
                torch.cuda.synchronize()
                for rid, conn in batch:
                    try:
                        conn.sendall(rid)
                    except OSError:
                        pass

    def reader(conn):
        while True:
            data = b""
            while len(data) < 8:
                chunk = conn.recv(8 - len(data))
                if not chunk:
                    return
                data += chunk
            with lock:
                queue.append((data, conn))
                lock.notify()

    # Warm up (CUDA context, kernels) before saying where we listen.
    with torch.inference_mode():
        model(torch.randn(8, hidden, device="cuda", dtype=torch.half))
        torch.cuda.synchronize()
    threading.Thread(target=worker, daemon=True).start()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.rename(tmp, port_file)
    while True:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=reader, args=(conn,), daemon=True).start()


def train(seconds):
    import torch

    hidden, batch = env_int("TRAIN_HIDDEN", 4096), env_int("TRAIN_BATCH", 256)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, hidden, device="cuda")
    for _ in range(5):
        model(x).square().mean().backward()
    torch.cuda.synchronize()
    steps, t0 = 0, time.monotonic()
    while not stop.is_set() and time.monotonic() - t0 < seconds:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        steps += 1
        if steps % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(json.dumps({"steps_per_s": steps / (time.monotonic() - t0)}), flush=True)


def quantile(sorted_values, p):
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, round((len(sorted_values) - 1) * p))]


def load(seconds, rates, seed, ports):
    if len(rates) == 1:
        rates = rates * len(ports)
    if len(rates) != len(ports):
        sys.exit(f"load: {len(rates)} rates for {len(ports)} ports")
    rng = random.Random(seed)
    start = time.monotonic() + 0.5
    latencies, lost = [], [0]
    per_port = {port: ([], [0]) for port in ports}
    lock = threading.Lock()
    threads = []
    for port, rps in zip(ports, rates):
        sched, t = [], 0.0
        while True:
            t += rng.expovariate(rps)
            if t >= seconds:
                break
            sched.append(start + t)
        conn = socket.create_connection(("127.0.0.1", port))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def send(conn=conn, sched=sched):
            for i, at in enumerate(sched):
                delay = at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                conn.sendall(struct.pack("<Q", i))

        def recv(conn=conn, sched=sched, mine=per_port[port]):
            got = 0
            conn.settimeout(seconds + 10)
            buf = b""
            try:
                while got < len(sched):
                    chunk = conn.recv(8 * 64)
                    if not chunk:
                        break
                    buf += chunk
                    now = time.monotonic()
                    while len(buf) >= 8:
                        (i,) = struct.unpack("<Q", buf[:8])
                        buf = buf[8:]
                        with lock:
                            latencies.append((now - sched[i]) * 1e3)
                            mine[0].append((now - sched[i]) * 1e3)
                        got += 1
            except OSError:
                pass
            with lock:
                lost[0] += len(sched) - got
                mine[1][0] += len(sched) - got

        threads += [threading.Thread(target=send), threading.Thread(target=recv)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lost = lost[0]
    latencies.sort()

    def q(p):
        return quantile(latencies, p)

    services = []
    for port, rps in zip(ports, rates):
        mine, mine_lost = sorted(per_port[port][0]), per_port[port][1][0]
        services.append({
            "port": port, "rps": rps, "requests": len(mine) + mine_lost, "lost": mine_lost,
            "p50_ms": quantile(mine, 0.5), "p99_9_ms": quantile(mine, 0.999),
        })
    over = sum(1 for x in latencies if x > 100.0) + lost
    print(json.dumps({
        "requests": len(latencies) + lost, "lost": lost,
        "p50_ms": q(0.5), "p99_ms": q(0.99), "p99_9_ms": q(0.999),
        "over_100ms_share": over / max(1, len(latencies) + lost),
        "services": services,
    }), flush=True)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "serve":
        serve(sys.argv[2])
    elif what == "train":
        train(float(sys.argv[2]))
    elif what == "load":
        load(float(sys.argv[2]), [float(r) for r in sys.argv[3].split(",")], int(sys.argv[4]),
             [int(p) for p in sys.argv[5:]])
    else:
        sys.exit(f"unknown command {what}")

"""``spikerec bench online``: peak memory and time of online learning vs BPTT.

For a 2-layer LRU and a 2-layer ALIF network and T in {256, 1024, 4096} (``--quick``: 64,
128, 256 and smaller nets), one gradient of a per-step MSE loss is computed by

* ``stream``: :class:`~spikerec.hardware.online.OnlineLearner` one step at a time (memory
  independent of T),
* ``chunked``: the same estimator in blocks of ``--chunk`` steps,
* ``bptt``: autograd through the model's fast sequence path.

Each (network, T, method) runs in a fresh subprocess. Peak memory is the growth of the
process's resident set during the gradient computation: the kernel's peak counter (VmHWM)
is reset through ``/proc/self/clear_refs`` just before the call and read after it; where
that is not allowed a 2 ms sampling thread of the RSS is used instead (the method is
printed). ``tracemalloc`` would not see torch's allocations. Time is the best of
``--repeat`` calls, per step and per sequence.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time

from ..atomic import atomic_path

__all__ = ["main", "run_one"]

SIZES = {"full": dict(T=(256, 1024, 4096), B=8, H=64, N=64), "quick": dict(T=(64, 128, 256), B=4, H=32, N=32)}


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _hwm_kb() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _build(net: str, H: int, N: int):
    import torch

    from spikerec.layers import ALIF, LeakyReadout
    from spikerec.models import RecurrentStack

    if net == "lru":
        from spikerec.layers.lru import LRU

        cells = [LRU(H, N), LRU(H, N)]
        width = cells[-1].output_size
    else:
        cells = [ALIF(H, N), ALIF(N, N)]
        width = N
    torch.manual_seed(0)
    return RecurrentStack(cells, LeakyReadout(width, 10))


def run_one(net: str, method: str, T: int, B: int, H: int, N: int, chunk: int, repeat: int) -> dict:
    """One configuration in this process; returns peak memory growth (MiB) and times."""
    import torch

    from spikerec.hardware.online import OnlineLearner, mse_loss

    torch.set_num_threads(int(os.environ.get("SPIKEREC_BENCH_THREADS", "1")))
    model = _build(net, H, N)
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(T, B, H, generator=g) < 0.2).float() if net == "alif" else torch.randn(T, B, H, generator=g)
    tgt = torch.randn(T, B, 10, generator=g)
    if method == "bptt":
        learner = OnlineLearner(model, rule="bptt")
    elif method == "stream":
        learner = OnlineLearner(model, mode="stream")
    else:
        learner = OnlineLearner(model, mode="chunked", chunk=chunk)
    learner.backward(x[:8], tgt, mse_loss)  # warm-up: first-call allocations
    model.zero_grad()
    base = _rss_kb()
    how = "VmHWM reset via /proc/self/clear_refs"
    peak_box = [base]
    stop = threading.Event()
    if not _reset_hwm():
        how = "RSS sampled every 2 ms"

        def sample():
            while not stop.is_set():
                peak_box[0] = max(peak_box[0], _rss_kb())
                time.sleep(0.002)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
    t0 = time.perf_counter()
    learner.backward(x, tgt, mse_loss)
    times = [time.perf_counter() - t0]
    if how.startswith("VmHWM"):
        peak = _hwm_kb() or base
    else:
        stop.set()
        peak = peak_box[0]
    for _ in range(repeat - 1):
        model.zero_grad()
        t0 = time.perf_counter()
        learner.backward(x, tgt, mse_loss)
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {"net": net, "method": method, "T": T, "peak_mib": max(0, peak - base) / 1024.0,
            "process_peak_mib": peak / 1024.0,
            "seq_s": best, "step_ms": best / T * 1e3, "memory": how}


def _machine() -> str:
    name = platform.processor() or "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                name = line.split(":", 1)[1].strip()
    except Exception:
        pass
    return f"{name}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spikerec bench online", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small T and networks")
    ap.add_argument("--nets", default="lru,alif", help="comma list of lru, alif")
    ap.add_argument("--methods", default="stream,chunked,bptt")
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--T", default=None, help="comma list of sequence lengths (overrides the preset)")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(**json.loads(args.child))))
        return 0
    size = SIZES["quick" if args.quick else "full"]
    Ts = [int(t) for t in args.T.split(",")] if args.T else list(size["T"])
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    for n in nets:
        if n not in ("lru", "alif"):
            print(f"spikerec bench online: unknown net '{n}'; expected lru or alif", file=sys.stderr)
            return 2
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in ("stream", "chunked", "bptt"):
            print(f"spikerec bench online: unknown method '{m}'; expected stream, chunked or bptt", file=sys.stderr)
            return 2
    print(f"machine: {_machine()}; torch threads per run: {os.environ.get('SPIKEREC_BENCH_THREADS', '1')}")
    print(f"sizes: batch {size['B']}, features {size['H']}, state {size['N']}; chunk {args.chunk}")
    rows = []
    header = f"{'net':<5} {'T':>5} {'method':<8} {'peak MiB':>9} {'proc MiB':>9} {'s/seq':>8} {'ms/step':>8}"
    print(header)
    for net in nets:
        if net == "lru":
            try:
                import spikerec.layers.lru  # noqa: F401
            except ImportError:
                print("lru: spikerec.layers.lru is not available; skipped")
                continue
        for T in Ts:
            for m in methods:
                spec = dict(net=net, method=m, T=T, B=size["B"], H=size["H"], N=size["N"], chunk=args.chunk, repeat=args.repeat)
                res = subprocess.run([sys.executable, "-m", "spikerec.bench.online", "--child", json.dumps(spec)],
                                     capture_output=True, text=True)
                if res.returncode != 0:
                    print(f"{net:<5} {T:>5} {m:<8} failed: {res.stderr.strip().splitlines()[-1:]}")
                    continue
                row = json.loads(res.stdout.strip().splitlines()[-1])
                rows.append(row)
                print(f"{net:<5} {T:>5} {m:<8} {row['peak_mib']:>9.1f} {row['process_peak_mib']:>9.1f} "
                      f"{row['seq_s']:>8.3f} {row['step_ms']:>8.3f}", flush=True)
    if rows:
        print(f"peak memory: growth during the call ('peak MiB', {rows[0]['memory']}); "
              f"'proc MiB' = the whole process's peak resident set")
    if args.json:
        with atomic_path(args.json) as tmp, open(tmp, "w") as f:
            json.dump({"machine": _machine(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

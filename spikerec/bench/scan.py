"""``spikerec bench scan``: sequential loop vs the parallel (blocked) scan, vs Triton on CUDA.

Recurrence ``x_t = lambda * x_{t-1} + b_t`` with a per-channel ``lambda`` constant in
time (the LRU case), ``b[T, B, C]``. For each ``T`` it times, in one process:

* ``copy``: a device-to-device copy of ``b`` into a preallocated ``x`` (the same bytes a
  scan must move: read ``b``, write ``x``), the bandwidth reference; on the CPU a fresh
  output also costs first-touch page faults, which every other column includes, so
  ``clone`` (a copy into a fresh tensor) is the floor the ratios use;
* ``loop``: :func:`spikerec.scan.scan_loop` (one step per time index, autograd-capable:
  allocates each state and stacks them);
* ``loop*``: the strongest sequential baseline without autograd: one in-place
  ``addcmul`` per step into a freshly allocated output;
* ``blocked``: the torch blocked (log-depth) scan, ``linear_scan(impl="blocked")``;
* ``linear_scan``: ``linear_scan(lam, b)`` with the default ``impl="auto"``: on the CPU the
  compiled kernel when numba is installed, else the in-place sequential pass for wide
  steps (>= 2048 channels) and the blocked scan otherwise;
* ``triton``: the Triton kernels (CUDA only);
* forward+backward of ``loop`` (autograd through ``T`` steps) and of ``linear_scan``
  (custom reverse-scan backward), for ``T <= --backward-max-t``; the backward moves
  three tensors of the size of ``b`` (read the output gradient and ``x``, write the input
  gradient), so forward+backward is compared with 2.5 copies ("copy of its bytes").

"best" is the faster of the parallel paths (blocked, linear_scan, triton).

Bandwidth = bytes moved (``2 T B C`` elements) / time. All contenders of one ``T`` run
interleaved (round-robin) in one process; the minimum of ``--repeats`` rounds after a
warm-up round is reported (the loops use fewer rounds at large ``T``).
"""
from __future__ import annotations

import platform
import sys
import time

import torch

from ..scan import linear_scan, scan_loop
from ..options import ArgumentParser, whole_number


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _interleaved(fns: dict, device, repeats: int, fewer: dict | None = None) -> dict:
    """Minimum time of each callable over ``repeats`` round-robin rounds after one warm-up round
    (``fewer[name]`` rounds for the slow ones), so that load on the machine hits all alike."""
    fewer = fewer or {}
    for fn in fns.values():
        fn()
    _sync(device)
    best = {k: float("inf") for k in fns}
    for r in range(repeats):
        for k, fn in fns.items():
            if r >= fewer.get(k, repeats):
                continue
            t0 = time.perf_counter()
            fn()
            _sync(device)
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def machine_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def run(Ts, batch: int, channels: int, dtype: torch.dtype, device: torch.device, repeats: int,
        backward_max_t: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for T in Ts:
        real = torch.float64 if dtype in (torch.complex128, torch.float64) else torch.float32
        mag = (0.9 + 0.099 * torch.rand(channels, generator=g)).to(real)
        lam = mag.to(dtype)
        if dtype.is_complex:
            lam = torch.polar(mag, 6.28 * torch.rand(channels, generator=g).to(real))
        lam = lam.to(device)
        b = torch.randn(T, batch, channels, generator=g, dtype=real)
        b = (torch.complex(b, torch.randn(T, batch, channels, generator=g, dtype=real)) if dtype.is_complex else b)
        b = b.to(device)
        out = torch.empty_like(b)
        nbytes = 2 * b.numel() * b.element_size()
        loop_reps = max(1, min(repeats, 16384 // T))

        def loop_inplace():
            y = torch.empty_like(b)  # a fresh output, as any scan returns (first-touch page faults included)
            x = torch.zeros_like(b[0])
            for t in range(T):
                x = torch.addcmul(b[t], lam, x, out=y[t])
            return y

        fwd = {"copy": lambda: out.copy_(b), "clone": lambda: b.clone(), "loop": lambda: scan_loop(lam, b), "loop_inplace": loop_inplace,
               "blocked": lambda: linear_scan(lam, b, impl="blocked"), "scan": lambda: linear_scan(lam, b)}
        if device.type == "cuda":
            from ..kernels import triton_available

            if triton_available():
                fwd["triton"] = lambda: linear_scan(lam, b, impl="triton")
        if T <= backward_max_t:
            cot = torch.randn_like(b)
            lam_p = lam.clone().requires_grad_(True)
            b_p = b.clone().requires_grad_(True)

            def fb(f):
                def go():
                    x = f(lam_p, b_p)
                    torch.autograd.backward(x, cot)
                    lam_p.grad = b_p.grad = None
                return go

            fwd["loop_fb"] = fb(scan_loop)
            fwd["scan_fb"] = fb(lambda a, x: linear_scan(a, x))
            if "triton" in fwd:
                fwd["triton_fb"] = fb(lambda a, x: linear_scan(a, x, impl="triton"))
        slow = {"loop", "loop_inplace", "loop_fb"}
        row = {"T": T, "bytes": nbytes}
        row.update(_interleaved(fwd, device, repeats, {k: loop_reps for k in slow}))
        rows.append(row)
        del b, out
    return rows


def format_table(rows: list[dict]) -> str:
    has_tri = any("triton" in r for r in rows)
    head = ["T", "copy ms", "loop ms", "loop* ms", "blocked ms", "linear_scan ms"] + (["triton ms"] if has_tri else []) + \
           ["best vs loop", "best vs loop*", "copy GB/s", "best GB/s"] + (["triton / copy"] if has_tri else []) + \
           ["fwd+bwd loop ms", "fwd+bwd linear_scan ms", "fwd+bwd speed-up", "clone ms", "linear_scan / clone",
            "fwd+bwd / clones of its bytes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        gb = r["bytes"] / 1e9
        best = min(r["blocked"], r["scan"], r.get("triton", float("inf")))
        cells = [str(r["T"]), f"{1e3 * r['copy']:.2f}", f"{1e3 * r['loop']:.1f}", f"{1e3 * r['loop_inplace']:.1f}",
                 f"{1e3 * r['blocked']:.1f}", f"{1e3 * r['scan']:.1f}"]
        if has_tri:
            cells.append(f"{1e3 * r['triton']:.3f}" if "triton" in r else "-")
        cells += [f"{r['loop'] / best:.1f}x", f"{r['loop_inplace'] / best:.1f}x", f"{gb / r['copy']:.1f}", f"{gb / best:.1f}"]
        if has_tri:
            cells.append(f"{r['triton'] / r['copy']:.2f}x" if "triton" in r else "-")
        if "loop_fb" in r:
            cells += [f"{1e3 * r['loop_fb']:.0f}", f"{1e3 * r['scan_fb']:.1f}", f"{r['loop_fb'] / r['scan_fb']:.1f}x",
                      f"{1e3 * r['clone']:.1f}", f"{r['scan'] / r['clone']:.2f}x", f"{r['scan_fb'] / (2.5 * r['clone']):.2f}x"]
        else:
            cells += ["-", "-", "-", f"{1e3 * r['clone']:.1f}", f"{r['scan'] / r['clone']:.2f}x", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


DTYPES = {"complex64": torch.complex64, "float32": torch.float32, "complex128": torch.complex128,
          "float64": torch.float64}


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="spikerec bench scan", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (B=4, C=256, T in 256, 1024)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default cpu)")
    p.add_argument("--dtype", default="complex64,float32", help="comma-separated: complex64, float32, complex128, float64")
    p.add_argument("--T", default=None, help="comma-separated sequence lengths (default 1024,4096,16384)")
    p.add_argument("--batch", type=whole_number(1), default=8)
    p.add_argument("--channels", type=whole_number(1), default=1536)
    p.add_argument("--repeats", type=whole_number(1), default=5)
    p.add_argument("--threads", type=whole_number(1), default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--backward-max-t", type=whole_number(0), default=4096, help="time forward+backward only up to this T")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("spikerec bench scan: --device cuda requested but CUDA is not available", file=sys.stderr)
        return 2
    try:
        dtypes = [DTYPES[d.strip()] for d in args.dtype.split(",")]
    except KeyError as e:
        print(f"spikerec bench scan: unknown --dtype {e}; expected {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    if args.quick:
        Ts, batch, channels, repeats = [256, 1024], 4, 256, 3
    else:
        Ts, batch, channels, repeats = [1024, 4096, 16384], args.batch, args.channels, args.repeats
    if args.T:
        Ts = [int(t) for t in args.T.split(",")]
    print(f"machine: {machine_description(device)}")
    for dt in dtypes:
        print(f"\nB={batch}, C={channels}, dtype={str(dt).replace('torch.', '')}, lambda constant in time, "
              f"minimum of {repeats} interleaved rounds (loops: fewer at large T)\n")
        rows = run(Ts, batch, channels, dt, device, repeats, args.backward_max_t)
        print(format_table(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

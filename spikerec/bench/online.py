"""``spikerec bench online``: peak memory and time of online learning vs BPTT.

For a 2-layer LRU, a 2-layer ALIF and a 2-layer LIF network (``--nets``; LRU and ALIF by
default) and T in {256, 1024, 4096} (``--quick``: 64, 128, 256 and smaller nets), one gradient
of a per-step MSE loss is computed by

* ``stream``: :meth:`~spikerec.hardware.online.OnlineLearner.step` fed one step at a time from a
  generator (the input is never held whole), with the package's ``mse_step_loss``, then
  ``update()``, on the compiled backend (``backend="auto"``);
* ``stream_ref``: the same with ``backend="reference"`` (a per-step autograd backward and the torch
  partials), for a comparison in one run;
* ``chunked``: :meth:`~spikerec.hardware.online.OnlineLearner.backward` in blocks of ``--chunk``,
  each block with no autograd call where the stack and the loss allow it (:mod:`.block`);
  ``chunked_ref``: with ``backend="reference"`` (the autograd block, the step-loop block scans);
* ``stream_biased``, ``chunked_biased``: with ``--readout leaky``, the same with
  ``readout_filter=False`` (the cheaper estimate, biased for the layer under the readout), to show
  what the readout-filtered traces cost;
* ``bptt``: autograd through the model's fast sequence path with the loss computed in one
  vectorised op, ``0.5 * ((y - target) ** 2).sum()``, with subnormal floats flushed to zero as
  in the online learner's steps (:mod:`spikerec.hardware.online.subnormal`; BPTT keeps no
  decaying traces, and its time did not change with it).

``--readout linear,leaky`` runs every network with a linear readout and again with a leaky one
(``tau`` 20 steps), on which the default learner carries readout-filtered traces
(:mod:`spikerec.hardware.online.readout_filter`): the row's ``readout`` column says which.

``--device cuda`` runs the model, input and learner on the GPU (the online learner's blocks with
the Triton reverse filter; the clock read after a device synchronisation, peak memory from the
CUDA allocator). Every method runs once before the measured runs (compilation, first-call
allocations).

Each method's learner is made once, as the model is, and each run is one sequence through it
(``reset()`` before a stream, ``backward`` starts a fresh one), as a training loop uses it; the
run that measures memory makes a learner of its own, so that the learner's states, traces and
scratch arrays count in its peak.

All methods of one (network, T) run interleaved in one fresh subprocess (so the ratios compare
runs under the same load): a warm-up round, a round that measures memory (not timed: its sampler
runs beside it), then ``--repeat`` timed rounds (20 by default); the time is the best of them. With ``--processes N``
that subprocess runs N times and each method keeps its best time over them (the range is
printed): the BPTT reference's time moves by 10-30 % from one process to another. For the
spiking networks the hidden layers' spike rate is printed (the same network for every method,
so no method does less work by spiking less). Peak memory is taken on
the C allocator: glibc's ``mallinfo2`` (bytes in use in the heap plus mmapped blocks, which is
where torch's CPU tensors live) sampled after every step of ``stream`` and after the call for
the others, and every millisecond by a polling thread, minus the value just before; ``tracemalloc`` would not see torch's allocations and
the resident set counts pages the allocator has freed. Where ``mallinfo2`` is missing the growth
of the peak resident set (VmHWM, reset via ``/proc/self/clear_refs``) is used (the method is
printed).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import threading
import time

from ..atomic import atomic_path
from ..train.memory import _MALLINFO2, alloc_in_use
from ..options import ArgumentParser, whole_number

__all__ = ["main", "run_one", "alloc_in_use"]

_BACKEND = {"stream": "auto", "stream_ref": "reference", "chunked": "auto", "chunked_ref": "reference",
            "stream_biased": "auto", "chunked_biased": "auto"}
READOUT_TAU = 20.0  # the leaky readout's time constant (steps), as the LIF layers' membrane
SIZES = {"full": dict(T=(256, 1024, 4096), B=8, H=64, N=64), "quick": dict(T=(64, 128, 256), B=4, H=32, N=32)}


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


def _build(net: str, H: int, N: int, readout: str = "linear"):
    import torch

    from spikerec.layers import ALIF, LIF, LeakyReadout
    from spikerec.models import RecurrentStack

    torch.manual_seed(0)
    if net == "lru":
        from spikerec.layers.lru import LRU

        cells = [LRU(H, N), LRU(H, N)]
        width = cells[-1].output_size
    elif net == "lif":  # the layer's defaults: tau_mem 20, threshold 1, learned time constants and bias
        cells = [LIF(H, N), LIF(N, N)]
        width = N
    else:
        cells = [ALIF(H, N), ALIF(N, N)]
        width = N
    return RecurrentStack(cells, LeakyReadout(width, 10, tau=READOUT_TAU if readout == "leaky" else None))


class _Peak:
    """Peak growth of the allocator's bytes in use (or of VmHWM) over a region."""

    def __init__(self):
        self.how = "allocator (glibc mallinfo2)" if _MALLINFO2 is not None else "VmHWM (resident set)"

    def __enter__(self):
        gc.collect()  # earlier garbage freed inside the region would hide growth below the baseline
        if _MALLINFO2 is not None:
            self.base = self.peak = alloc_in_use()
            self.stop = threading.Event()

            def poll():  # within-call peaks of the methods that are not sampled per step
                while not self.stop.is_set():
                    self.sample()
                    time.sleep(0.001)

            self.thread = threading.Thread(target=poll, daemon=True)
            self.thread.start()
        else:
            _reset_hwm()
            self.base = self.peak = (_hwm_kb() or 0) * 1024
        return self

    def sample(self):
        if _MALLINFO2 is not None:
            self.peak = max(self.peak, alloc_in_use())

    def __exit__(self, *exc):
        if _MALLINFO2 is not None:
            self.stop.set()
            self.thread.join()
            self.sample()
        else:
            self.peak = (_hwm_kb() or 0) * 1024
        self.mib = max(0, self.peak - self.base) / 2 ** 20


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


class _CudaPeak:
    """Peak growth of the CUDA caching allocator's bytes in use over a region."""

    how = "CUDA allocator (torch.cuda.max_memory_allocated)"

    def __init__(self, device: str):
        self.device = device

    def __enter__(self):
        import torch

        _sync(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = torch.cuda.memory_allocated(self.device)
        return self

    def sample(self):
        pass

    def __exit__(self, *exc):
        import torch

        _sync(self.device)
        self.mib = max(0, torch.cuda.max_memory_allocated(self.device) - self.base) / 2 ** 20


def run_one(net: str, methods: list[str], T: int, B: int, H: int, N: int, chunk: int, repeat: int,
            device: str = "cpu", readout: str = "linear") -> list[dict]:
    """All ``methods`` for one configuration in this process, interleaved; returns one row each.
    On a CUDA ``device`` the clock is read after a device synchronisation and the peak memory is
    the CUDA allocator's."""
    import torch

    from spikerec.hardware.online import OnlineLearner, mse_loss
    from spikerec.hardware.online.learner import mse_step_loss
    from spikerec.hardware.online.subnormal import flush_subnormals

    torch.set_num_threads(int(os.environ.get("SPIKEREC_BENCH_THREADS", "1")))
    model = _build(net, H, N, readout).to(device)
    g = torch.Generator().manual_seed(1)
    spiking = net in ("alif", "lif")
    x = (torch.rand(T, B, H, generator=g) < 0.2).float() if spiking else torch.randn(T, B, H, generator=g)
    tgt = torch.randn(T, B, 10, generator=g)
    x, tgt = x.to(device), tgt.to(device)
    rate = None
    if spiking:  # every method runs this network on this input: one spike rate for all
        with torch.no_grad():
            _, _, hidden = model(x, record=True)
        rate = float(torch.stack([h.mean() for h in hidden]).mean())

    def steps():  # the stream: one step at a time from a generator (no view of every row made up front: its
        for t in range(T):  # objects would count in the stream's memory and grow with T)
            yield x[t], tgt[t]

    learners = {}  # one learner per method, made once as the model is: each run is one sequence

    def learner(m, fresh=False):
        lr = None if fresh else learners.get(m)
        if lr is None:
            filt = False if m.endswith("_biased") else None
            if m.startswith("stream"):
                lr = OnlineLearner(model, mode="stream", loss=mse_step_loss, backend=_BACKEND[m], readout_filter=filt)
            else:
                lr = OnlineLearner(model, mode="chunked", chunk=chunk, backend=_BACKEND[m], readout_filter=filt)
            if not fresh:
                learners[m] = lr
        return lr

    def run(m, peak):
        # the run that measures memory makes its own learner, so that its states, traces and
        # scratch count; the timed runs reuse one
        model.zero_grad()
        if m == "bptt":  # under the online learner's subnormal setting too (no change measured)
            with flush_subnormals():
                y, _ = model(x)
                (0.5 * ((y - tgt) ** 2).sum()).backward()
        elif m.startswith("stream"):
            lr = learner(m, fresh=peak is not None)
            lr.reset()  # a new sequence: states and traces from zero
            for x_t, t_t in steps():
                lr.step(x_t, t_t)
                if peak is not None:
                    peak.sample()
            lr.update()
        else:
            learner(m, fresh=peak is not None).backward(x, tgt, mse_loss)  # (a fresh stream over the sequence)

    for m in methods:  # warm-up: first-call allocations, kernel compilation
        run(m, None)
    _sync(device)
    mem = {}
    for m in methods:  # the memory pass (its sampler runs beside it: not timed)
        with (_CudaPeak(device) if device.startswith("cuda") else _Peak()) as pk:
            run(m, pk)
            _sync(device)
        mem[m] = (pk.mib, pk.how)
    best = {m: float("inf") for m in methods}
    for r in range(repeat):
        for m in methods:
            t0 = time.perf_counter()
            run(m, None)
            _sync(device)
            best[m] = min(best[m], time.perf_counter() - t0)
    rows = []
    for m in methods:
        rows.append({"net": net, "readout": readout, "method": m, "T": T, "peak_mib": mem[m][0], "memory": mem[m][1],
                     "seq_s": best[m], "step_ms": best[m] / T * 1e3,
                     "x_bptt": best[m] / best["bptt"] if "bptt" in best else None, "spike_rate": rate,
                     "device": device})
    return rows


def _best_over_processes(runs: list[list[dict]]) -> list[dict]:
    """One row per method from the rows of several processes: the best time (and the largest
    peak memory) over them, the range of the times, and the ratio of the best times to BPTT's."""
    out = []
    for rows in zip(*runs):
        times = [r["seq_s"] for r in rows]
        row = dict(rows[0], seq_s=min(times), seq_s_min=min(times), seq_s_max=max(times),
                   peak_mib=max(r["peak_mib"] for r in rows))
        row["step_ms"] = row["seq_s"] / row["T"] * 1e3
        out.append(row)
    bptt = next((r["seq_s"] for r in out if r["method"] == "bptt"), None)
    for row in out:
        row["x_bptt"] = row["seq_s"] / bptt if bptt else None
    return out


def _machine(device: str = "cpu") -> str:
    if device.startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}); host {_machine()}"
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
    ap = ArgumentParser(prog="spikerec bench online", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small T and networks")
    ap.add_argument("--nets", default="lru,alif", help="comma list of lru, alif, lif")
    ap.add_argument("--methods", default="stream,chunked,bptt",
                    help="comma list of stream, stream_ref, chunked, chunked_ref, bptt and, with a leaky readout, "
                         "stream_biased, chunked_biased (readout_filter=False)")
    ap.add_argument("--readout", default="linear", help="comma list of linear, leaky: the readout of every network "
                    "(leaky: tau 20 steps, the layer under it with readout-filtered traces)")
    ap.add_argument("--chunk", type=whole_number(1), default=64)
    ap.add_argument("--repeat", type=whole_number(1), default=20, help="timed rounds (after a warm-up round and the "
                    "memory round); each method's time is its best round")
    ap.add_argument("--T", default=None, help="comma list of sequence lengths (overrides the preset)")
    ap.add_argument("--processes", type=whole_number(1), default=1,
                    help="fresh processes per (net, T); each method's time is its best over them and the "
                         "range is printed (the BPTT reference moves by 10-30%% from one process to another)")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N: where the model, input and "
                    "learner run (on CUDA the online learner's blocks use the Triton reverse filter)")
    ap.add_argument("--batch", type=whole_number(1), default=None, help="batch size (overrides the preset)")
    ap.add_argument("--hidden", type=whole_number(1), default=None,
                    help="input features and state size of each layer (overrides the preset)")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(**json.loads(args.child))))
        return 0
    size = dict(SIZES["quick" if args.quick else "full"])
    if args.batch is not None:
        size["B"] = args.batch
    if args.hidden is not None:
        size["H"] = size["N"] = args.hidden
    if min(size["B"], size["H"]) < 1:
        print(f"spikerec bench online: --batch and --hidden must be >= 1, got {size['B']} and {size['H']}",
              file=sys.stderr)
        return 2
    if args.device != "cpu":
        import torch

        try:
            dev = torch.device(args.device)
        except RuntimeError:
            dev = None
        if dev is None or dev.type != "cuda":
            print(f"spikerec bench online: --device must be cpu, cuda or cuda:N, got {args.device!r}", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print(f"spikerec bench online: --device {args.device}: CUDA is not available on this machine",
                  file=sys.stderr)
            return 2
    Ts = [int(t) for t in args.T.split(",")] if args.T else list(size["T"])
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    for n in nets:
        if n not in ("lru", "alif", "lif"):
            print(f"spikerec bench online: unknown net '{n}'; expected lru, alif or lif", file=sys.stderr)
            return 2
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in _BACKEND and m != "bptt":
            print(f"spikerec bench online: unknown method '{m}'; expected stream, stream_ref, chunked, chunked_ref, "
                  f"stream_biased, chunked_biased or bptt", file=sys.stderr)
            return 2
    readouts = [r.strip() for r in args.readout.split(",") if r.strip()]
    if not readouts or any(r not in ("linear", "leaky") for r in readouts):
        print(f"spikerec bench online: --readout must be a comma list of linear, leaky, got {args.readout!r}",
              file=sys.stderr)
        return 2
    if any(m.endswith("_biased") for m in methods) and "leaky" not in readouts:
        print("spikerec bench online: methods stream_biased and chunked_biased need --readout leaky "
              "(the readout filter applies only under a leaky readout; the linear readout's rows skip them)",
              file=sys.stderr)
        return 2
    print(f"machine: {_machine(args.device)}; torch threads per run: {os.environ.get('SPIKEREC_BENCH_THREADS', '1')}; "
          f"numba threads: {os.environ.get('NUMBA_NUM_THREADS', os.environ.get('SPIKEREC_BENCH_THREADS', '1'))}")
    print(f"sizes: batch {size['B']}, features {size['H']}, state {size['N']}; chunk {args.chunk}")
    rows = []
    header = f"{'net':<5} {'readout':<7} {'T':>5} {'method':<16} {'peak MiB':>9} {'s/seq':>8} {'ms/step':>8} {'x BPTT':>7}"
    if args.processes > 1:
        header += f"  s/seq over {args.processes} processes"
    print(header)
    for net, readout in ((n, r) for n in nets for r in readouts):
        for T in Ts:
            run_methods = [m for m in methods if readout == "leaky" or not m.endswith("_biased")]
            spec = dict(net=net, methods=run_methods, T=T, B=size["B"], H=size["H"], N=size["N"], chunk=args.chunk,
                        repeat=args.repeat, device=args.device, readout=readout)
            # numba's parallel kernels (the LRU scan) get the same thread count as torch: an idle
            # pool of one worker per core competes with the measured thread on a loaded machine
            env = dict(os.environ)
            env.setdefault("NUMBA_NUM_THREADS", os.environ.get("SPIKEREC_BENCH_THREADS", "1"))
            # and so does the BLAS that numba's matrix products call (SciPy's OpenBLAS): its idle
            # threads spinning beside a loaded core made some runs of a block ten times slower
            env.setdefault("OPENBLAS_NUM_THREADS", os.environ.get("SPIKEREC_BENCH_THREADS", "1"))
            runs = []
            for _ in range(args.processes):
                res = subprocess.run([sys.executable, "-m", "spikerec.bench.online", "--child", json.dumps(spec)],
                                     capture_output=True, text=True, env=env)
                if res.returncode != 0:
                    print(f"{net:<5} {readout:<7} {T:>5} failed: {res.stderr.strip().splitlines()[-1:]}")
                    break
                runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
            else:
                for row in _best_over_processes(runs):
                    rows.append(row)
                    ratio = f"{row['x_bptt']:>7.2f}" if row["x_bptt"] is not None else f"{'-':>7}"
                    spread = (f"  {row['seq_s_min']:.3f}-{row['seq_s_max']:.3f}" if args.processes > 1 else "")
                    print(f"{net:<5} {readout:<7} {T:>5} {row['method']:<16} {row['peak_mib']:>9.2f} "
                          f"{row['seq_s']:>8.3f} {row['step_ms']:>8.3f} {ratio}{spread}", flush=True)
                if rows and rows[-1].get("spike_rate") is not None:
                    print(f"{net:<5} {readout:<7} {T:>5} spike rate of the hidden layers (every method runs this network): "
                          f"{rows[-1]['spike_rate']:.4f}", flush=True)
    if rows:
        print(f"peak memory: growth during the call, measured on the {rows[0]['memory']}; "
              + ("'x BPTT': time per sequence over the vectorised-loss BPTT of the same process" if args.processes == 1
                 else f"'x BPTT': best time per sequence over the vectorised-loss BPTT's best, each over "
                      f"{args.processes} processes"))
    if args.json:
        with atomic_path(args.json) as tmp, open(tmp, "w") as f:
            json.dump({"machine": _machine(args.device), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

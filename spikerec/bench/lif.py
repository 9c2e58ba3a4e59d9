"""``spikerec bench lif``: forward + backward of a LIF layer against its peers, fairly.

Every contender runs in its fastest documented form, in one process, interleaved
(round-robin over contenders, ``--reps`` rounds after a warm-up round); the minimum
per contender is reported, with its spike rate (so that no one wins by spiking less)
and the bytes its forward saves for the backward (counted with
``torch.autograd.graph.saved_tensors_hooks``, each storage once; the parameters and
constants a contender holds before and after the call, such as its decay and threshold
vectors or weights, are not counted: they cost no memory per call).

Part 1, the neuron alone (input currents ``I[T, B, N]`` given, requiring grad; one
backward with a fixed random output gradient):

* ``spikerec``: :class:`spikerec.kernels.lif_sequence.LIFSequence` (compiled CPU kernel
  for a feed-forward layer when numba is installed);
* ``spikerec-torch``: the same kernel, torch loop forced;
* ``plain loop``: the LIF equations over ``I.unbind(0)`` with a surrogate spike;
* ``snntorch``: ``snn.Leaky`` over ``I.unbind(0)`` (indexing ``I[t]`` inside the loop makes
  every step's backward allocate a zero tensor of the whole sequence);
* ``norse``: ``LIFBoxCell`` over ``I.unbind(0)``; ``norse LIF``: Norse's sequence module
  ``norse.torch.LIF`` (current-based: one more state than the others);
* ``spikingjelly``: ``LIFNode(step_mode="m")``, its multi-step torch backend on the CPU;
* ``copy``: a clone of the four ``T*B*N`` tensors a neuron must move (read currents, write
  spikes; read spike gradients, write current gradients), the bandwidth floor.

Part 2, the whole layer ``Linear + LIF`` from input spikes ``x`` (weights require grad):
each peer's Linear runs on the whole sequence at once, then its neuron; ``Linear`` alone is
the floor. Part 3, an ALIF layer with 512 recurrent units: spikerec's fused kernel (the
layer's forward: compiled steps on the CPU), the same kernel with its torch loop forced, and a
plain loop of the same equations. Dynamics are matched (``alpha = 0.95``, threshold 1,
subtractive reset where the library has it; Norse's inputs are scaled by
``1 / (dt tau_mem_inv)``; Norse resets to zero; SpikingJelly subtracts the threshold before
the decay, so it spikes slightly more). The printed spike rates show what each one did.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings

import torch

from ..atomic import atomic_write_text
from ..options import ArgumentParser, whole_number
from .lif_peers import held_tensors, neuron_contenders, saved_bytes


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _interleaved(contenders: dict, reps: int) -> dict:
    """``{name: min seconds}`` over ``reps`` round-robin rounds after one warm-up round."""
    for fn in contenders.values():
        fn()
    best = {k: float("inf") for k in contenders}
    for _ in range(reps):
        for k, fn in contenders.items():
            best[k] = min(best[k], _time(fn))
    return best


def _bench_neurons(a, libs):
    T, B, N = a.T, a.B, a.N
    torch.manual_seed(0)
    I0 = torch.randn(T, B, N) * 0.5 + 0.3
    gz = torch.randn(T, B, N)
    cont = neuron_contenders(T, B, N, 0.95, libs)
    runs, rates, saved = {}, {}, {}
    for name, (fwd, scale) in cont.items():
        Iin = (I0 * scale).contiguous()

        def run(fwd=fwd, Iin=Iin):
            I = Iin.detach().requires_grad_()
            z = fwd(I)
            z.backward(gz)
            return z

        runs[name] = run
        with torch.no_grad():
            rates[name] = float(fwd(Iin).float().mean())
        saved[name] = saved_bytes(lambda fwd=fwd, Iin=Iin: fwd(Iin.detach().requires_grad_()), getattr(fwd, "held", ()))
    src = torch.empty(T, B, N)
    dst = torch.empty(T, B, N)
    runs["copy"] = lambda: (dst.copy_(src), dst.copy_(src))
    rates["copy"], saved["copy"] = float("nan"), 0
    best = _interleaved(runs, a.reps)
    return best, rates, saved


def _bench_layers(a, libs):
    T, B, N = a.T, a.B, a.N
    from ..layers import LIF

    torch.manual_seed(0)
    x = (torch.rand(T, B, N) < 0.1).float()
    gz = torch.randn(T, B, N)
    beta = 0.95
    cell = LIF(N, N, tau_mem=-1.0 / torch.log(torch.tensor(beta)).item(), reset="subtract", learn_tau=False)
    cont = {"spikerec": (lambda xx: cell(xx)[0], 1.0)}
    for name, v in neuron_contenders(T, B, N, beta, libs).items():
        if name in ("plain loop", "snntorch", "norse", "spikingjelly"):
            cont[name] = v
    runs, rates, saved = {}, {}, {}
    for name, (neuron, scale) in cont.items():
        if name == "spikerec":
            fwd = neuron
            held = held_tensors(cell)
        else:
            fc = torch.nn.Linear(N, N)
            with torch.no_grad():
                fc.weight.copy_(cell.weight * scale)
                fc.bias.copy_(cell.bias * scale)
            fwd = lambda xx, fc=fc, neuron=neuron: neuron(fc(xx))  # noqa: E731
            held = held_tensors(fc) + getattr(neuron, "held", ())
        runs[name] = lambda fwd=fwd: fwd(x).backward(gz)
        with torch.no_grad():
            rates[name] = float(fwd(x).mean())
        held = held + (held_tensors(cell) if name == "spikerec" else ())  # what the first call derived
        saved[name] = saved_bytes(lambda fwd=fwd: fwd(x), held)
    fc0 = torch.nn.Linear(N, N)
    runs["Linear alone"] = lambda: fc0(x).backward(gz)
    rates["Linear alone"], saved["Linear alone"] = float("nan"), saved_bytes(lambda: fc0(x), held_tensors(fc0))
    return _interleaved(runs, a.reps), rates, saved


def _bench_alif(a):
    from ..layers import ALIF

    T, B, N = a.T, a.B, a.alif_n
    torch.manual_seed(0)
    cell = ALIF(N, N, tau_mem=20.0, tau_adapt=100.0, b=1.0, beta=0.5, recurrent=True)
    x = (torch.rand(T, B, N) < 0.1).float() * 3.0
    gz = torch.randn(T, B, N)
    sur = cell.surrogate

    def plain():
        alpha, rho = cell.decays()
        w_t = cell.effective_recurrent_weight().t()
        I = cell.input_current(x)
        v = torch.zeros(B, N)
        ad = torch.zeros(B, N)
        z = torch.zeros(B, N)
        spikes = []
        for it in I.unbind(0):
            ad = rho * ad + (1.0 - rho) * z
            theta = cell.b + cell.beta * ad
            v = alpha * v + it + z @ w_t - (theta * z).detach()
            z = sur(v - theta)
            spikes.append(z)
        return torch.stack(spikes)

    def torch_loop():  # the layer's forward with the kernel's torch loop forced
        from ..kernels.alif_sequence import ALIFSequence

        p = cell.params()
        alpha, rho = cell.decays()
        st = cell.initial_state(B)
        return ALIFSequence.apply(cell.input_current(x), st.v, st.a, alpha, rho, p.b, p.beta, p.recurrent_weight,
                                  sur, cell.detach_reset, "torch")[0]

    cont = {"spikerec fused": lambda: cell(x)[0], "spikerec torch": torch_loop, "plain loop": plain}
    runs = {k: (lambda f=f: f().backward(gz)) for k, f in cont.items()}
    rates = {}
    for k, f in cont.items():
        with torch.no_grad():
            rates[k] = float(f().mean())
    saved = {k: saved_bytes(f, held_tensors(cell)) for k, f in cont.items()}
    return _interleaved(runs, a.reps), rates, saved


def _print(title, best, rates, saved, ref, unit_ref_name):
    print(title)
    print(f"  {'contender':<16} {'ms':>9} {'x ' + unit_ref_name:>14} {'spike rate':>11} {'saved MB':>10}")
    for k, s in best.items():
        r = rates.get(k, float("nan"))
        rs = "-" if r != r else f"{r:.4f}"
        print(f"  {k:<16} {1e3 * s:>9.1f} {s / best[ref]:>14.2f} {rs:>11} {saved.get(k, 0) / 2**20:>10.3f}")


def main(argv=None) -> int:
    ap = ArgumentParser(prog="spikerec bench lif", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=whole_number(1), default=500)
    ap.add_argument("--B", type=whole_number(1), default=16)
    ap.add_argument("--N", type=whole_number(1), default=512)
    ap.add_argument("--alif-n", type=whole_number(1), default=512, help="recurrent units of the ALIF part")
    ap.add_argument("--reps", type=whole_number(1), default=5, help="timed rounds (the minimum is reported)")
    ap.add_argument("--threads", type=whole_number(1), default=os.cpu_count() or 1)
    ap.add_argument("--libs", default="snntorch,norse,spikingjelly", help="peers to include (comma list)")
    ap.add_argument("--parts", default="neuron,layer,alif", help="which parts to run (comma list)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cuda: the GPU bench (spikerec.bench.lif_cuda): the published setup and --sizes")
    ap.add_argument("--sizes", default="512,4096,16384", help="--device cuda: layer widths N (comma list)")
    a = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(a.threads)
    libs = set(filter(None, a.libs.split(",")))
    parts = set(a.parts.split(","))
    if a.device == "cuda":
        from .lif_cuda import run

        result = run(a, libs)
        if a.json:
            atomic_write_text(a.json, json.dumps(result, indent=1))
        return 0
    print(f"T={a.T} B={a.B} N={a.N} float32, {a.threads} threads, {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}; minimum of {a.reps} interleaved rounds after a warm-up")
    result = {"T": a.T, "B": a.B, "N": a.N, "threads": a.threads}
    todo = [p for p in ("neuron", "layer", "alif") if p in parts]

    def progress(part: str) -> None:
        print(f"[{todo.index(part) + 1}/{len(todo)}] timing the {part} part ...", flush=True)

    if "neuron" in parts:
        progress("neuron")
        best, rates, saved = _bench_neurons(a, libs)
        peers = [k for k in best if k not in ("spikerec", "spikerec-torch", "copy")]
        fastest = min(peers, key=best.get)
        _print("LIF neuron part (currents given), forward + backward:", best, rates, saved, "spikerec", "spikerec")
        print(f"  fastest other: {fastest}; spikerec is {best[fastest] / best['spikerec']:.2f}x faster; "
              f"{best['spikerec'] / best['copy']:.2f}x the copy of the same bytes")
        result["neuron"] = {"ms": {k: 1e3 * v for k, v in best.items()}, "rate": rates, "saved_bytes": saved}
    if "layer" in parts:
        progress("layer")
        best, rates, saved = _bench_layers(a, libs)
        _print("Linear + LIF layer from input spikes, forward + backward:", best, rates, saved, "Linear alone", "Linear")
        result["layer"] = {"ms": {k: 1e3 * v for k, v in best.items()}, "rate": rates, "saved_bytes": saved}
    if "alif" in parts:
        progress("alif")
        best, rates, saved = _bench_alif(a)
        _print(f"ALIF, {a.alif_n} recurrent units, forward + backward:", best, rates, saved, "spikerec fused",
               "fused")
        print(f"  fused is {best['plain loop'] / best['spikerec fused']:.2f}x the plain loop")
        result["alif"] = {"ms": {k: 1e3 * v for k, v in best.items()}, "rate": rates, "saved_bytes": saved}
    if a.json:
        atomic_write_text(a.json, json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``spikerec bench lif --device cuda``: spiking layers on a GPU against the peers' fastest GPU forms.

The published setup (the Open Neuromorphic SNN library benchmark: one Linear + LIF layer, 16,384
neurons, batch 16, T = 500, float32, forward + backward, peak memory by
``torch.cuda.max_memory_allocated``) and smaller layers (``--sizes``), every contender in one
process, interleaved (round-robin over contenders, ``--reps`` rounds after a warm-up round), the
minimum per contender, each timed between two device synchronisations:

* ``spikerec``: the LIF kernel (``LIFSequence``, its Triton form on CUDA); ``spikerec-torch``: the
  same with ``impl="torch"``; ``plain loop``: the LIF equations over ``I.unbind(0)`` with a
  surrogate spike, autograd through every step;
* ``snntorch``: ``snn.Leaky`` over ``unbind``; ``norse compiled``: ``LIFBoxCell`` under
  ``torch.compile`` (the step compiled, the loop over ``unbind``); ``spikingjelly``: its multi-step
  ``LIFNode`` (``step_mode="m"``), which dispatches to its fastest GPU implementation itself;
* ``floor``: the bytes a LIF neuron must move (read the currents, write the spikes; read the
  spikes' gradient, write the currents' gradient) as two device-to-device copies of ``T*B*N``
  floats, i.e. at the measured copy bandwidth; ``Linear alone``: the layer's GEMMs.

Part 1 gives the currents (the neuron alone, the floor's own terms); part 2 the whole layer from
input spikes. Dynamics are matched as in the CPU bench (:mod:`spikerec.bench.lif`). Each
contender's peak memory is the allocator's growth during one forward + backward, measured alone.

Part 3, the recurrent ALIF network of the SHD preset (700 inputs, 2 x 256 recurrent ALIF, a
linear readout at every step, cross-entropy, Adam; B = 100, T = 250): the time of one training
step through spikerec's kernels, its torch loop and the step loop of the one definition, and of
an epoch of SHD's training set (8,156 samples, 82 steps) at that step time.
"""
from __future__ import annotations

import torch

from ..errors import ConfigError
from .lif_peers import neuron_contenders

__all__ = ["run"]

SHD_TRAIN = 8156


def _timed(fn) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def _interleaved(runs: dict, reps: int) -> dict:
    for fn in runs.values():
        fn()
    best = {k: float("inf") for k in runs}
    for _ in range(reps):
        for k, fn in runs.items():
            best[k] = min(best[k], _timed(fn))
    return best


def _peak(fn) -> int:
    """Bytes the allocator grows by while ``fn()`` runs (a forward and its backward)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _layer_part(T, B, N, libs, reps, dev, whole_layer: bool):
    torch.manual_seed(0)
    beta = 0.95
    gz = torch.randn(T, B, N, device=dev)
    fc = torch.nn.Linear(N, N, device=dev)
    x = (torch.rand(T, B, N, device=dev) < 0.1).float()
    I0 = (torch.randn(T, B, N, device=dev) * 0.5 + 0.3)
    runs, rates, peaks = {}, {}, {}
    for name, (neuron, scale) in neuron_contenders(T, B, N, beta, libs, device=dev, gpu=True).items():
        if whole_layer:
            lin = torch.nn.Linear(N, N, device=dev)
            with torch.no_grad():
                lin.weight.copy_(fc.weight * scale)
                lin.bias.copy_(fc.bias * scale)

            def fwd(lin=lin, neuron=neuron):
                return neuron(lin(x))
        else:
            Iin = (I0 * scale).contiguous()

            def fwd(neuron=neuron, Iin=Iin):
                return neuron(Iin.detach().requires_grad_())

        def run(fwd=fwd):
            fwd().backward(gz)
        runs[name] = run
        rates[name] = float(fwd().detach().float().mean())  # with grad on, as timed (no second compiled graph)
        run()  # compile / warm up before the memory is measured
        peaks[name] = _peak(run)
    src = torch.empty(T, B, N, device=dev)
    dst = torch.empty_like(src)
    runs["floor (copy)"] = lambda: (dst.copy_(src), dst.copy_(src))
    if whole_layer:
        runs["Linear alone"] = lambda: fc(x).backward(gz)
        peaks["Linear alone"] = _peak(runs["Linear alone"])
    return _interleaved(runs, reps), rates, peaks


def _alif_part(reps, dev, libs):
    from ..layers import ALIF

    T, B, C, H, K = 250, 100, 700, 256, 20
    torch.manual_seed(0)
    x = (torch.rand(T, B, C, device=dev) < 0.02).float()
    y = torch.randint(0, K, (B,), device=dev)
    ce = torch.nn.CrossEntropyLoss()
    runs, rates = {}, {}
    for name, impl, path in (("spikerec", "auto", "forward"), ("spikerec-torch", "torch", "forward"),
                             ("step loop (one definition)", "torch", "step_loop")):
        torch.manual_seed(1)
        # the preset's parameters (spikerec/configs/shd-alif-lsc.toml)
        cells = [ALIF(n_in, H, tau_mem=0.1, tau_adapt=250.0, b=0.01, beta=1.8, beta_init="centered", impl=impl).to(dev)
                 for n_in in (C, H)]
        readout = torch.nn.Linear(H, K, device=dev)
        params = [p for c in cells for p in c.parameters()] + list(readout.parameters())
        opt = torch.optim.Adam(params, lr=1e-3)

        def forward(cells=cells, readout=readout, path=path):
            h = x
            for c in cells:
                h = getattr(c, path)(h)[0]
            return h, readout(h)

        def step(forward=forward, opt=opt):
            opt.zero_grad(set_to_none=True)
            _, out = forward()
            ce(out.reshape(T * B, K), y.repeat(T)).backward()
            opt.step()
        runs[name] = step
        with torch.no_grad():
            rates[name] = float(forward()[0].mean())
    best = _interleaved(runs, reps)
    return best, rates


def _print(title, best, rates, peaks, ref):
    print(title)
    print(f"  {'contender':<28} {'ms':>9} {'x ' + ref:>16} {'spike rate':>11} {'peak MB':>10}")
    for k, s in best.items():
        r = rates.get(k, float("nan"))
        rs = "-" if r != r else f"{r:.4f}"
        pk = peaks.get(k)
        ps = "-" if pk is None else f"{pk / 2**20:.1f}"
        print(f"  {k:<28} {1e3 * s:>9.3f} {s / best[ref]:>16.2f} {rs:>11} {ps:>10}")


def run(a, libs) -> dict:
    """Run the parts named in ``a.parts`` (neuron, layer, alif) at ``a.sizes``; print and return the figures."""
    if not torch.cuda.is_available():
        raise ConfigError("--device = 'cuda' but CUDA is not available on this machine; use cpu")
    dev = torch.device("cuda")
    parts = set(a.parts.split(","))
    sizes = [int(s) for s in str(a.sizes).split(",") if s]
    props = torch.cuda.get_device_properties(dev)
    import triton

    print(f"{props.name}, torch {torch.__version__}, Triton {triton.__version__}, float32; T={a.T} B={a.B}; "
          f"minimum of {a.reps} interleaved rounds after a warm-up")
    result = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__, "T": a.T, "B": a.B}
    for N in sizes:
        for part, whole in (("neuron", False), ("layer", True)):
            if part not in parts:
                continue
            best, rates, peaks = _layer_part(a.T, a.B, N, libs, a.reps, dev, whole)
            title = (f"N={N}: Linear + LIF layer from input spikes, forward + backward" if whole else
                     f"N={N}: LIF neuron part (currents given), forward + backward")
            _print(title, best, rates, peaks, "floor (copy)")
            peers = [k for k in best if k not in ("spikerec", "spikerec-torch", "floor (copy)", "Linear alone")]
            if peers:
                fastest = min(peers, key=best.get)
                print(f"  fastest other: {fastest}; spikerec is {best[fastest] / best['spikerec']:.2f}x faster; "
                      f"{best['spikerec'] / best['floor (copy)']:.2f}x the floor; peak memory "
                      f"{peaks['spikerec'] / 2**20:.1f} MB against the smallest peer's "
                      f"{min(peaks[k] for k in peers) / 2**20:.1f} MB")
            result[f"{part}_{N}"] = {"ms": {k: 1e3 * v for k, v in best.items()}, "rate": rates, "peak_bytes": peaks}
    if "alif" in parts:
        best, rates = _alif_part(a.reps, dev, libs)
        _print("SHD preset network (700 -> 2 x 256 recurrent ALIF -> 20, B=100, T=250): one Adam step",
               best, rates, {}, "spikerec")
        steps = -(-SHD_TRAIN // 100)
        print(f"  epoch of SHD's training set ({SHD_TRAIN} samples, {steps} steps): "
              + ", ".join(f"{k} {steps * v:.2f} s" for k, v in best.items()))
        print(f"  spikerec is {best['spikerec-torch'] / best['spikerec']:.2f}x its torch loop and "
              f"{best['step loop (one definition)'] / best['spikerec']:.2f}x the step loop")
        result["alif_shd"] = {"ms": {k: 1e3 * v for k, v in best.items()}, "rate": rates}
    return result

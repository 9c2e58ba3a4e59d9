"""The LIF contenders of ``spikerec bench lif`` on the CPU (:mod:`spikerec.bench.lif`) and on a GPU
(:mod:`spikerec.bench.lif_cuda`): spikerec's LIF kernel, a plain loop and the peer libraries with
matched dynamics, and the count of the bytes autograd saves for the backward."""
from __future__ import annotations

import sys

import torch

__all__ = ["held_tensors", "saved_bytes", "neuron_contenders"]


def held_tensors(*objs) -> tuple:
    """The parameters and buffers of modules, and plain tensors, among ``objs`` (for ``saved_bytes``)."""
    out = []
    for o in objs:
        if isinstance(o, torch.nn.Module):
            out.extend(o.parameters())
            out.extend(o.buffers())
        elif isinstance(o, torch.Tensor):
            out.append(o)
        elif isinstance(o, (tuple, list)):
            out.extend(held_tensors(*o))
    return tuple(out)


def saved_bytes(fn, held=()) -> int:
    """Bytes of the tensors autograd saves while ``fn()`` runs (each storage counted once), not
    counting the storages of ``held`` (tensors that exist before and after the call)."""
    seen = {}
    skip = set()
    for t in held:
        try:
            skip.add(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            pass

    def pack(t):
        try:
            if t.untyped_storage().data_ptr() in skip:
                return t
            key = (t.untyped_storage().data_ptr(), t.dtype)
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):  # e.g. tensors without storage
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def neuron_contenders(T, B, N, beta, libs, device="cpu", gpu=False):
    """``{name: (make_forward(I) -> spikes, input scale)}`` on ``device``; ``gpu``: each peer in its
    fastest GPU form (Norse's cell under ``torch.compile`` instead of its two eager forms)."""
    from ..kernels.lif_sequence import LIFSequence
    from ..surrogate import get_surrogate

    sur = get_surrogate("fast_sigmoid", slope=25.0)
    alpha = torch.full((N,), beta, device=device)
    thr = torch.ones(N, device=device)
    v0 = torch.zeros(B, N, device=device)
    out = {}

    def spikerec_impl(impl):
        def fwd(I):
            return LIFSequence.apply(I, v0, None, alpha, None, thr, None, sur, "subtract", True, impl)[0]
        fwd.held = (alpha, thr, v0)
        return fwd

    out["spikerec"] = (spikerec_impl("auto"), 1.0)
    out["spikerec-torch"] = (spikerec_impl("torch"), 1.0)

    def plain(I):
        mem = torch.zeros(B, N, device=device)
        spk = torch.zeros(B, N, device=device)
        spikes = []
        for it in I.unbind(0):
            mem = beta * mem + it - spk.detach()
            spk = sur(mem - 1.0)
            spikes.append(spk)
        return torch.stack(spikes)

    out["plain loop"] = (plain, 1.0)
    if "snntorch" in libs:
        import snntorch as snn

        lif = snn.Leaky(beta=beta, threshold=1.0, reset_mechanism="subtract").to(device)

        def snn_fwd(I):
            mem = lif.init_leaky()
            spikes = []
            for it in I.unbind(0):
                spk, mem = lif(it, mem)
                spikes.append(spk)
            return torch.stack(spikes)

        snn_fwd.held = held_tensors(lif)
        out["snntorch"] = (snn_fwd, 1.0)
    if "norse" in libs:
        import norse.torch as nt

        dt = 1e-3
        inv = (1 - beta) / dt
        p = nt.LIFBoxParameters(tau_mem_inv=torch.tensor(inv, device=device), v_th=torch.tensor(1.0, device=device))
        cell = nt.LIFBoxCell(p, dt=dt).to(device)
        if gpu:  # one compiled graph per shape and per first/later step: room for every size of a bench
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        step = torch.compile(cell) if gpu else cell

        def norse_fwd(I):
            s = None
            spikes = []
            for it in I.unbind(0):
                z, s = step(it, s)
                spikes.append(z)
            return torch.stack(spikes)

        norse_fwd.held = held_tensors(cell, list(cell.p))
        out["norse compiled" if gpu else "norse"] = (norse_fwd, 1.0 / (dt * inv))
        if not gpu:
            seq = nt.LIF(nt.LIFParameters(tau_mem_inv=torch.tensor(inv), tau_syn_inv=torch.tensor(1.0 / dt)), dt=dt)

            def norse_seq_fwd(I):
                return seq(I)[0]

            norse_seq_fwd.held = held_tensors(seq, [t for t in seq.p if isinstance(t, torch.Tensor)])
            out["norse LIF"] = (norse_seq_fwd, 1.0 / (dt * inv))
    if "spikingjelly" in libs:
        try:
            from spikingjelly.activation_based import functional as sjf
            from spikingjelly.activation_based import neuron as sjn
            from spikingjelly.activation_based import surrogate as sjs
        except ImportError:
            print("spikingjelly not installed (pip install 'spikerec[bench]'); skipped", file=sys.stderr)
        else:
            node = sjn.LIFNode(tau=1.0 / (1.0 - beta), decay_input=False, v_reset=None, detach_reset=True,
                               surrogate_function=sjs.Sigmoid(), step_mode="m").to(device)

            def sj_fwd(I):
                sjf.reset_net(node)
                return node(I)

            sj_fwd.held = held_tensors(node)
            out["spikingjelly"] = (sj_fwd, 1.0)
    return out

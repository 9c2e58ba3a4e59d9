"""Hand-written spatial backward of one time step (the stream mode's compiled path).

At step ``t`` the online rule needs, for every traced layer ``l``, ``g^l_t = d l_t / d s^l_t``
(the error reaching its state *within* the step) and the direct gradient of every parameter
that acts in an output map (Zucchet et al. 2023, Sec. 3; thesis Zucchet 2025, Sec. 4.3.2: the
"spatial" backward). With the recurrent edges cut this is a chain of small matrix products,
written out here per cell instead of building and walking an autograd graph at every step:

* linear readout ``y = W h + b``:        ``dW += gy^T h``, ``db += sum_b gy``, ``gh = gy W``;
* leaky readout (state ``y``):           ``g_y = gy``, ``gh = g_y W`` (its parameters are traced);
* LRU (Orvieto et al. 2023, Sec. 3), ``y = C_re Re h - C_im Im h + D u``, ``h = lam h' + gamma B u``:
  ``g_re = gy C_re``, ``g_im = -gy C_im``, ``dC_re += gy^T Re h``, ``dC_im -= gy^T Im h``,
  ``dD += gy u`` (``gy^T u`` for a matrix ``D``), ``gu = gy D + (gamma g_re) B_re + (gamma g_im) B_im``;
* ALIF (Bellec et al. 2020; spikerec.neurons.alif), ``z = H(v - b - beta a)`` with surrogate
  derivative ``psi``: ``g_v = gz psi``, ``g_a = -beta gz psi``, ``db -= sum_b gz psi``,
  ``dbeta -= sum_b gz psi a``, ``gx = g_v W``.

The only autograd call left is ``d l_t / d y_t`` of the user's loss on a leaf ``y_t``, and none when the
loss carries its gradient in closed form (``value_and_grad``, as the package's losses do).
The result equals the autograd spatial backward of :meth:`OnlineLearner._stream`
(tests/test_online_fast.py, float64, fresh random inputs). Networks with other cells (LIF, GRU,
...) or with active dropout keep the autograd path.
"""
from __future__ import annotations

import torch

from ...kernels.lif_sequence_numba import surrogate_code
from ...surrogate import heaviside
from ...kernels.alif_online import alif_spatial_numba
from ...kernels.lif_online import lif_spatial_numba
from ... import neurons
from ...kernels.trace_numba import compiled_cpu
from .kinds import compiled_tag
from .traces_base import stream_step

__all__ = ["supported", "compiled_kinds", "compiled_stream_step", "spike_partials", "filter_forms"]


def compiled_kinds(learner) -> list[str]:
    """The per-layer kind tags :func:`compiled_stream_step` dispatches on."""
    return [compiled_tag(tr) for tr in learner.tracers]


def supported(learner) -> bool:
    """Whether every layer of ``learner`` has a hand-written spatial backward (LRU, ALIF, plain LIF, leaky or
    linear readout as the last layer) and no dropout is active."""
    drop = getattr(learner.model, "dropout", None)
    if drop is not None and drop.training:
        return False
    kinds = compiled_kinds(learner)
    if any(k is None for k in kinds) or kinds[-1] not in ("readout", "leaky_readout"):
        return False
    if any(k in ("readout", "leaky_readout") for k in kinds[:-1]):
        return False
    return True


def _acc(spatial: dict | None, p, g, alpha: float = 1.0) -> None:
    """``spatial[p] += alpha * g`` (parameters without ``requires_grad``, or ``spatial`` None, skipped)."""
    if spatial is None or not p.requires_grad:
        return
    acc = spatial.get(p)
    if acc is not None:
        acc.add_(g, alpha=alpha)
    else:
        spatial[p] = g * alpha if (alpha != 1.0 or g._base is not None or not g.is_contiguous()) else g


def accumulator(spatial: dict, p):
    """``p``'s accumulator in ``spatial``, contiguous and of ``p``'s dtype (created as zeros),
    for kernels that add into it in place; ``None`` if ``p`` is not trained."""
    if not p.requires_grad:
        return None
    a = spatial.get(p)
    if a is None or not a.is_contiguous() or a.dtype != p.dtype:
        a = spatial[p] = (torch.zeros_like(p, memory_format=torch.contiguous_format) if a is None
                          else a.contiguous().to(p.dtype))
    return a


def _acc_mm(spatial: dict | None, p, a, b, alpha: float = 1.0) -> None:
    """``spatial[p] += alpha * a @ b`` in place (one ``addmm_``; skipped as :func:`_acc`)."""
    if spatial is None or not p.requires_grad:
        return
    acc = spatial.get(p)
    if acc is not None:
        acc.addmm_(a, b, alpha=alpha)
    else:
        spatial[p] = torch.mm(a, b) if alpha == 1.0 else torch.mm(a, b).mul_(alpha)


def compiled_stream_step(learner, x_t, closure, value_and_grad=None):
    """One stream step of ``learner`` with the hand-written spatial backward; returns
    ``(y_t, loss_t)`` (both detached; ``loss_t`` is ``None`` without a loss). With
    ``value_and_grad(y) -> (loss, d loss / d y) | None`` the loss gradient needs no autograd."""
    tracers, states = learner.tracers, learner.states
    kinds = learner._compiled_kinds
    recs = []
    h = x_t
    with torch.no_grad():
        for l, (tr, kind) in enumerate(zip(tracers, kinds)):
            prev = states[l]
            if kind == "readout":
                c = tr.cell
                y = h @ c.weight.detach().t()
                if c.bias is not None:
                    y = y + c.bias.detach()
                new = type(prev)(y)
                out = y
            elif kind == "lru":
                new = _lru_state(tr, h, prev)
                out = _lru_out(tr.cell, h, new)
            else:
                new = tr.step(h, prev)
                out = _output(tr, kind, new)
            recs.append((h, prev, new, out))
            states[l] = new
            h = out
    y = h
    loss = None
    gy = None
    if closure is not None and value_and_grad is not None:
        lg = value_and_grad(y)
        if lg is not None:
            loss, gy = lg
    elif closure is not None:
        yl = y.detach().requires_grad_()
        with torch.enable_grad():
            loss = closure(yl)
        if loss is not None:
            if loss.dim() != 0:
                raise ValueError(f"loss must return a scalar at step {learner.steps}, got shape {tuple(loss.shape)}")
            if loss.requires_grad:
                (gy,) = torch.autograd.grad(loss, yl, allow_unused=True)
            loss = loss.detach()
    filt = getattr(learner, "_filter", None)
    skip = len(tracers) - 2 if filt is not None else None  # the layer under the leaky readout
    with torch.no_grad():
        gs = _spatial_backward(learner, kinds, recs, gy, skip)
        fused = _compiled_trace_flags(learner, x_t)
        for l, tr in enumerate(tracers):
            if kinds[l] == "readout" or not tr.traced:
                continue
            x_in, prev, new, _ = recs[l]
            if l == skip:  # its traces advance; its gradient comes through the filtered traces
                P = tr.partials(x_in, prev, new)
                stream_step(learner.traces[l], P, None, learner.kernel)
                with torch.enable_grad():
                    filt.step(learner.traces[l], P, x_in, new, gy, **filter_forms(learner, l, kinds[l], recs[l]))
            elif fused[l]:
                tr.compiled_trace_step(learner.traces[l], x_in, prev, new, gs[l])
            else:
                stream_step(learner.traces[l], tr.partials(x_in, prev, new), gs[l], learner.kernel)
    return y, loss


def _compiled_trace_flags(learner, x_t) -> list[bool]:
    """Per layer: whether its whole trace step runs as one compiled kernel (``compiled_trace_step``)."""
    key = (x_t.dtype, x_t.device)
    cache = learner.__dict__.setdefault("_fused", {})
    flags = cache.get(key)
    if flags is None:
        flags = cache[key] = [learner.kernel is not None and hasattr(tr, "compiled_trace_step")
                              and tr.compiled_trace_ready(x_t.dtype, x_t.device) for tr in learner.tracers]
    return flags


def _output(tr, kind, new):
    c = tr.cell
    if kind == "alif":  # the spike z = H(v - b - beta a) (the surrogate's forward is the Heaviside step)
        return heaviside(new.v - (c.b.detach() + c.beta.detach() * new.a))
    if kind == "lif":  # z = H(v - thr)
        return heaviside(new.v - c.threshold.detach())
    return new.y  # leaky readout


def _lru_state(tr, u, prev):
    """``h = lam h' + gamma B u`` on (Re, Im) pairs, with ``gamma`` folded into ``B`` once per
    sequence (the same values as ``LRUTrace.step``, to float rounding)."""
    k = tr.consts(u.dtype)
    N, lr, li = k["N"], k["lr"], k["li"]
    w = u @ k["Bt_gamma"]
    h_re = torch.addcmul(w[:, :N], lr, prev.x_re).addcmul_(li, prev.x_im, value=-1.0)
    h_im = torch.addcmul(w[:, N:], lr, prev.x_im).addcmul_(li, prev.x_re)
    return type(prev)(h_re, h_im)


def _lru_out(c, u, new):
    """``y = C_re Re h - C_im Im h + D u``."""
    D = c.D.detach()
    y = torch.addmm(u * D if D.dim() == 1 else u @ D.t(), new.x_re, c.C_re.detach().t())
    return y.addmm_(new.x_im, c.C_im.detach().t(), alpha=-1.0)


def _lru_interleaved(tr, dtype):
    """``C`` and ``gamma B`` with the (Re, Im) parts of each neuron side by side, so that one
    GEMM gives ``g = (g_re, g_im)`` interleaved (``g_re = gy C_re``, ``g_im = -gy C_im``) and one
    gives the input error ``(gamma g_re) B_re + (gamma g_im) B_im``; per-sequence constants."""
    k = tr.consts(dtype)
    out = k.get("interleaved")
    if out is None:
        c = tr.cell
        C = torch.stack([c.C_re.detach(), -c.C_im.detach()], -1).flatten(1).to(dtype)  # [K, 2N]
        gam = k["gam"][:, None]
        Bm = torch.stack([gam * c.B_re.detach(), gam * c.B_im.detach()], 1).flatten(0, 1).to(dtype)  # [2N, H]
        out = k["interleaved"] = (C, Bm)
    return out


def _compiled_rows(*ts) -> bool:
    """Whether the compiled ALIF spatial pass applies to these ``[rows, N]`` tensors (numba, CPU,
    float32/float64, no autograd)."""
    return compiled_cpu(*ts) and all(not t.requires_grad and t.dim() == 2 for t in ts)


def _spatial_backward(learner, kinds, recs, gy, skip=None):
    """``g^l_t`` ``[B, N, k]`` per layer (``None`` without a loss) and the output-map gradients
    added to ``learner.spatial``. Layer ``skip`` (the one under a readout filter) only passes the
    error on to the layers below: its own gradient comes from the filtered traces."""
    n = len(kinds)
    gs = [None] * n
    if gy is None:
        return gs
    g_out = gy
    for l in range(n - 1, -1, -1):
        g, g_out = layer_errors(learner, l, kinds[l], recs[l], g_out, learner.spatial if l != skip else None)
        gs[l] = g if l != skip else None
    return gs


def layer_errors(learner, l, kind, rec, g_out, sp, below: bool = True):
    """One layer of the spatial backward: from the error ``g_out`` at its output, its state error
    ``g^l`` ``[rows, N, k]`` (``None`` for a linear readout) and the error at its input (``None``
    for the first layer or without ``below``); its output-map gradients are added to ``sp`` (``None``:
    not formed)."""
    tr = learner.tracers[l]
    below = below and l > 0
    c = tr.cell
    h_in, prev, new, _ = rec
    g = None
    if kind == "readout":
        _acc_mm(sp, c.weight, g_out.t(), h_in)
        if c.bias is not None:
            _acc(sp, c.bias, g_out.sum(0))
        return None, g_out @ c.weight.detach()
    if kind == "leaky_readout":
        return g_out.unsqueeze(-1), g_out @ c.weight.detach()
    if kind == "lru":
        Ci, Bi = _lru_interleaved(tr, g_out.dtype)
        g = g_out @ Ci  # [rows, 2N]: (Re, Im) of g per neuron, side by side
        _acc_mm(sp, c.C_re, g_out.t(), new.x_re)
        _acc_mm(sp, c.C_im, g_out.t(), new.x_im, -1.0)
        D = c.D.detach()
        if D.dim() == 1:
            _acc(sp, c.D, (g_out * h_in).sum(0))
            gu = g_out * D
        else:
            _acc_mm(sp, c.D, g_out.t(), h_in)
            gu = g_out @ D
        return g.view(g.shape[0], -1, 2), (torch.addmm(gu, g, Bi) if below else None)
    if kind == "lif":  # z = H(v - thr): d l / d v = gz psi, d l / d thr = -gz psi
        learn_thr = c.threshold.requires_grad and sp is not None
        comp = None
        if _compiled_rows(g_out, new.v):
            k = tr.consts(g_out.dtype)
            sc = k.get("spatial")  # the surrogate's code and the threshold row, once per sequence
            if sc is None:
                N = new.v.shape[-1]
                sc = k["spatial"] = (surrogate_code(c.surrogate), k["thr"].expand(N).contiguous().numpy())
            comp = lif_spatial_numba(g_out, new.v, sc[1], sc[0], learn_thr)
        if comp is not None:  # one compiled pass (a surrogate with an inline form)
            gp, s_thr = comp
        else:
            gp = g_out * c.surrogate.derivative(new.v - c.threshold.detach())
            s_thr = gp.sum(0) if learn_thr else None
        if learn_thr:
            _acc(sp, c.threshold, s_thr, -1.0)
        return gp.unsqueeze(-1), (gp @ c.weight.detach() if below else None)
    # alif
    b, beta = c.b.detach(), c.beta.detach()
    comp = (alif_spatial_numba(g_out, new.v, new.a, b, beta, c.surrogate)
            if _compiled_rows(g_out, new.v, new.a) else None)
    if comp is not None:  # one compiled pass (a surrogate with an inline form)
        gp, g, s_b, s_beta = comp
        _acc(sp, c.b, s_b, -1.0)
        _acc(sp, c.beta, s_beta, -1.0)
    else:
        gp = g_out * c.surrogate.derivative(new.v - (b + beta * new.a))  # d l / d (v - theta)
        if sp is not None:
            _acc(sp, c.b, gp.sum(0), -1.0)
            _acc(sp, c.beta, (gp * new.a).sum(0), -1.0)
        g = torch.empty((*gp.shape, 2), dtype=gp.dtype, device=gp.device)
        g[..., 0] = gp
        torch.mul(gp, -beta, out=g[..., 1])
    return g, (gp @ c.weight.detach() if below else None)


def spike_partials(learner, l, kind, rec):
    """Per sample, ``psi = d z / d s`` ``[rows, N, k]`` and ``{name: d z / d p [rows, N]}`` of the
    spike map of a LIF or ALIF layer (the forms of :meth:`.readout_filter.ReadoutFilter.spike_partials`
    without autograd): ``psi`` is :func:`layer_errors` with a unit error; a LIF's threshold and
    ALIF's ``b`` enter ``z = H(v - theta)`` as ``-1`` and ALIF's ``beta`` as ``-a``. ``None`` for
    another kind (the LRU's filter needs none)."""
    if kind not in ("lif", "alif"):
        return None
    v = rec[2].v
    psi, _ = layer_errors(learner, l, kind, rec, torch.ones_like(v), None, below=False)
    c = learner.tracers[l].cell
    gp = psi[..., 0]
    direct = {}
    if kind == "lif" and c.threshold.requires_grad:
        direct["threshold"] = -gp
    if kind == "alif":
        if c.b.requires_grad:
            direct["b"] = -gp
        if c.beta.requires_grad:
            direct["beta"] = -gp * rec[2].a
    return psi, direct


def filter_forms(learner, l, kind, rec) -> dict:
    """The written-out partials the readout filter of layer ``l`` takes on the compiled paths: the
    spike map's (``partials``, :func:`spike_partials`) or the LRU's output errors at the filtered
    input and state (``output_errors``, :func:`layer_errors` with the filter's error ``u``)."""
    if kind == "lru":
        return {"output_errors": lambda xb, sb, u: layer_errors(learner, l, kind, (xb, None, sb, None), u,
                                                                learner.spatial, below=False)[0]}
    return {"partials": spike_partials(learner, l, kind, rec)}


for _kind in ("lif", "alif", "lru", "readout"):
    neurons.register_backend(_kind, "online_spatial (hand-written spatial backward of the stream step and block, "
                             "layer_errors)", layer_errors,
                             test="tests/test_online_fast.py::test_fast_stream_equals_autograd_stream")
for _kind in ("lif", "alif"):
    neurons.register_backend(_kind, "online_spike_partials (the spike map's per-sample partials, spike_partials)",
                             spike_partials,
                             test="tests/test_online_readout_filter.py::test_written_spike_partials_equal_autograd")

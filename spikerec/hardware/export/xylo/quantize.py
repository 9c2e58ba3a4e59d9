"""Quantise a spikerec CUBA-LIF stack to a :class:`~spikerec.hardware.export.xylo.spec.XyloSpec`.

spikerec's CUBA LIF (see :mod:`spikerec.layers.lif`) adds the input after the synaptic decay,
``i_t = a_s i_{t-1} + W x_t``; Xylo adds it before, ``i_t = a_s (i_{t-1} + W' x_t)``. With
``W' = W / a_s`` (per post-synaptic neuron, ``a_s = 1 - 2^-dash_syn`` the chip's decay) the two
recursions are the same sequence, so the quantiser folds ``1 / a_s`` into every weight matrix
feeding a neuron (input, recurrent and layer-to-layer weights, and the readout). What stays
different from the float model, and is what the integer figures measure: rounding, the one-step
delay per layer of the single recurrent core, the subtraction of the threshold before (not after)
the next decay, multi-spikes, and the output neurons' own synapse (``dash_syn_out = 1``, the fastest
non-zero synapse) in front of the leaky readout.

Per hidden layer one state scale ``s_k`` (state units per float unit) is the largest for which
``HEADROOM x threshold`` and the bias fit 16 bits; the weight mantissas are
``round(s_k W' / 2^shift)`` with one shift per matrix (input, recurrent core, output), the smallest
that keeps every mantissa in int8. A float bias ``b`` of a CUBA neuron enters the current; the chip
adds its bias to the membrane, so ``b / (1 - a_s)`` (the same steady state) is stored (v2 only).
"""
from __future__ import annotations

import copy
import math

import torch

from ..quantized_network import HEADROOM, QuantizationError
from .spec import XYLO_LIMITS, XyloLimitError, XyloSpec, check_limits

__all__ = ["quantize_xylo", "fake_quant_params_xylo", "dash_of", "alpha_of_dash"]

STATE_MAX = 2**15 - 1


def dash_of(alpha: torch.Tensor) -> torch.Tensor:
    """Nearest Xylo dash for a decay factor: ``round(-log2(1 - alpha))`` in 1..15."""
    a = alpha.detach().double().clamp(0.0, 1.0 - 2.0**-16)
    return torch.round(-torch.log2(1.0 - a)).long().clamp(1, 15)


def alpha_of_dash(dash: torch.Tensor) -> torch.Tensor:
    """The decay a dash implements, ``1 - 2^-dash`` (0 for dash 0)."""
    d = dash.double()
    return torch.where(d == 0, torch.zeros_like(d), 1.0 - 2.0 ** (-d))


def _shift_for(s: float, wmax: float, name: str, what: str) -> int:
    if wmax == 0:
        return 0
    need = math.log2(s * wmax / 127.0) if s * wmax > 0 else 0.0
    return max(0, math.ceil(need - 1e-12))


def _check_cells(model, profile_name: str, adapt_reset: bool):
    from ....layers.lif import LIF
    from ....layers.readout import LeakyReadout

    for k, c in enumerate(model.cells):
        name = f"cells.{k}"
        if not isinstance(c, LIF):
            raise QuantizationError(f"layer {name} ({type(c).__name__}): '{profile_name}' runs only (CUBA) LIF layers")
        if not c.cuba:
            raise QuantizationError(
                f"layer {name} (LIF): '{profile_name}' neurons have a synaptic current (input is added, then the synapse "
                "decays); a LIF without synapse cannot be mapped. Build the layer with tau_syn (CUBA LIF) and train it")
        if c.reset != "subtract" and not adapt_reset:
            raise QuantizationError(
                f"layer {name} (LIF): reset '{c.reset}' is not available on '{profile_name}' (it subtracts the threshold); "
                "pass adapt_reset=True (CLI: --adapt-reset) to switch the model to 'subtract' and fine-tune")
    if not isinstance(model.readout, LeakyReadout):
        raise QuantizationError(f"layer readout: '{profile_name}' needs a LeakyReadout")


def quantize_xylo(model, version: int = 1, *, adapt_reset: bool = False) -> tuple[XyloSpec, dict]:
    """The :class:`XyloSpec` of ``model`` and a report ``{"layers": [...], "shifts": {...}}``.

    Raises :class:`~spikerec.hardware.export.xylo.spec.XyloLimitError` (a ``ValueError``) naming the chip limit
    and the layer, and :class:`~spikerec.hardware.export.quantize.QuantizationError` for layers the chip
    cannot run.
    """
    pname = "xylo" if version == 1 else "xylo2"
    if version not in XYLO_LIMITS:
        raise ValueError(f"Xylo version must be 1 or 2, got {version!r}")
    lim = XYLO_LIMITS[version]
    if adapt_reset:
        model = copy.deepcopy(model)
        for c in model.cells:
            c.reset = "subtract"
    names = [f"cells.{k}" for k in range(len(model.cells))]
    sizes = [int(c.weight.shape[0]) for c in model.cells]
    # size limits first: they are the clearest message
    if model.input_size > lim["inputs"]:
        raise XyloLimitError(f"layer {names[0]}: {model.input_size} input channels exceed the limit of {lim['inputs']} "
                             f"inputs on Xylo v{version} (pool the input channels, e.g. to 16)")
    if sum(sizes) > lim["hidden"]:
        raise XyloLimitError(f"layer {names[-1]}: {sum(sizes)} hidden neurons (all hidden layers together, {sizes}) exceed "
                             f"the limit of {lim['hidden']} hidden neurons on Xylo v{version}")
    K = model.readout.weight.shape[0]
    if K > lim["outputs"]:
        raise XyloLimitError(f"layer readout: {K} output neurons exceed the limit of {lim['outputs']} outputs on "
                             f"Xylo v{version}")
    if not lim["bias"]:
        for name, c in zip(names + ["readout"], list(model.cells) + [model.readout]):
            if getattr(c, "bias", None) is not None and bool((c.bias.detach() != 0).any()):
                raise XyloLimitError(f"layer {name}: a bias is not supported on Xylo v1 (use profile 'xylo2', or build "
                                     "the layer with bias=False and train)")
    _check_cells(model, pname, adapt_reset)
    rows, layers = [], []
    for k, c in enumerate(model.cells):
        alpha, alpha_s = (a.detach().double() for a in c.decays())
        dm, ds = dash_of(alpha), dash_of(alpha_s)
        a_s = alpha_of_dash(ds)
        W = c.weight.detach().double() / a_s[:, None]
        Wr = (c.effective_recurrent_weight().detach().double() / a_s[:, None]) if c.recurrent_weight is not None else None
        b = c.bias.detach().double() / (1 - a_s) if getattr(c, "bias", None) is not None else torch.zeros(W.shape[0]).double()
        thr = c.threshold.detach().double().expand(W.shape[0])
        for key, t in (("weight", W), ("recurrent_weight", Wr), ("bias", b), ("threshold", thr)):
            if t is not None and not torch.isfinite(t).all():
                raise QuantizationError(f"layer {names[k]}: {key} has NaN or infinite values")
        if (thr <= 0).any():
            raise QuantizationError(f"layer {names[k]}: thresholds must be > 0 on '{pname}' (min {float(thr.min()):.4g})")
        s = min(STATE_MAX / (HEADROOM * float(thr.max())),
                STATE_MAX / float(b.abs().max()) if b.abs().max() > 0 else math.inf)
        wm = max(float(W.abs().max()), float(Wr.abs().max()) if Wr is not None else 0.0)
        if wm > 0:  # the largest mantissa must fit int8 at the largest shift
            s = min(s, 127.0 * 2 ** lim["shift_max"] / wm)
        layers.append(dict(W=W, Wr=Wr, b=b, thr=thr, dm=dm, ds=ds, s=s))
    # readout
    ro = model.readout
    alpha_o = ro.alpha().detach().double() if ro.leaky else torch.zeros(K, dtype=torch.double)
    dm_o = dash_of(alpha_o) if ro.leaky else torch.zeros(K, dtype=torch.long)
    ds_o = torch.ones(K, dtype=torch.long)
    Wo = ro.weight.detach().double() / alpha_of_dash(ds_o)[:, None]
    bo = ro.bias.detach().double() if getattr(ro, "bias", None) is not None else torch.zeros(K, dtype=torch.double)
    if not torch.isfinite(Wo).all() or not torch.isfinite(bo).all():
        raise QuantizationError("layer readout: weight or bias has NaN or infinite values")
    a_o = alpha_of_dash(dm_o)
    bound = float(((Wo.abs().sum(1) + bo.abs()) / (1 - a_o).clamp_min(1e-3)).max())
    s_o = min(STATE_MAX / max(bound, 1e-12), 127.0 * 2 ** lim["shift_max"] / max(float(Wo.abs().max()), 1e-30))
    # one shift per matrix: the input (layer 0), the core (layer-to-layer and recurrent), the output
    wmax = lambda t: float(t.abs().max()) if t is not None and t.numel() else 0.0  # noqa: E731
    sh_in = _shift_for(layers[0]["s"], wmax(layers[0]["W"]), names[0], "input")
    core = [(L["s"], wmax(L["W"])) for L in layers[1:]] + [(L["s"], wmax(L["Wr"])) for L in layers]
    sh_rec = max([_shift_for(s, w, "", "") for s, w in core] + [0])
    sh_out = _shift_for(s_o, wmax(Wo), "readout", "output")
    sh_in, sh_rec, sh_out = (min(x, lim["shift_max"]) for x in (sh_in, sh_rec, sh_out))

    def mant(t, s, sh):
        return torch.round(t * s / 2**sh).long().clamp(-128, 127)

    N = sum(sizes)
    offs = [sum(sizes[:k]) for k in range(len(sizes))]
    w_in = torch.zeros(model.input_size, N, dtype=torch.long)
    w_rec = torch.zeros(N, N, dtype=torch.long)
    w_out = torch.zeros(N, K, dtype=torch.long)
    thr_q, bias_q = torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long)
    for k, L in enumerate(layers):
        s, o, n = L["s"], offs[k], sizes[k]
        if k == 0:
            w_in[:, o:o + n] = mant(L["W"], s, sh_in).t()
        else:
            p = offs[k - 1]
            w_rec[p:p + sizes[k - 1], o:o + n] = mant(L["W"], s, sh_rec).t()
        if L["Wr"] is not None:
            w_rec[o:o + n, o:o + n] = mant(L["Wr"], s, sh_rec).t()
        thr_q[o:o + n] = torch.round(L["thr"] * s).long().clamp(1, STATE_MAX)
        bias_q[o:o + n] = torch.round(L["b"] * s).long().clamp(-STATE_MAX - 1, STATE_MAX)
        step = 2 ** (sh_in if k == 0 else sh_rec) / s
        rows.append({"name": names[k], "scale": s, "dash_mem": L["dm"].tolist(), "dash_syn": L["ds"].tolist(),
                     "weight_rel_err": float((L["W"] - mant(L["W"], s, sh_in if k == 0 else sh_rec).double() * step).norm()
                                             / L["W"].norm().clamp_min(1e-30))})
    w_out[offs[-1]:offs[-1] + sizes[-1]] = mant(Wo, s_o, sh_out).t()
    for k, L in enumerate(layers):
        sh = sh_in if k == 0 else sh_rec
        if bool((mant(L["W"], L["s"], sh) == 0).all()):
            raise QuantizationError(
                f"layer {names[k]}: weights cannot be represented on '{pname}': with max|W| = {wmax(L['W']):.4g} and "
                f"threshold {float(L['thr'].max()):.4g} the 16-bit membrane (headroom {HEADROOM:g} x threshold) leaves "
                f"{L['s']:.4g} state units per unit of weight, so every int8 mantissa rounds to 0 at shift {sh}")
    spec = XyloSpec(
        weights_in=w_in, weights_rec=w_rec, weights_out=w_out,
        dash_mem=torch.cat([L["dm"] for L in layers]), dash_syn=torch.cat([L["ds"] for L in layers]),
        dash_mem_out=dm_o, dash_syn_out=ds_o, threshold=thr_q,
        threshold_out=torch.full((K,), STATE_MAX, dtype=torch.long),
        weight_shift_in=sh_in, weight_shift_rec=sh_rec, weight_shift_out=sh_out,
        bias=bias_q if version == 2 and bool((bias_q != 0).any()) else None,
        bias_out=torch.round(bo * s_o).long().clamp(-STATE_MAX - 1, STATE_MAX) if version == 2 and bool((bo != 0).any()) else None,
        version=version, layer_sizes=sizes, out_scale=s_o)
    check_limits(spec, names)
    rows.append({"name": "readout", "scale": s_o, "dash_mem": dm_o.tolist(), "dash_syn": ds_o.tolist()})
    return spec, {"profile": pname, "layers": rows,
                  "shifts": {"in": sh_in, "rec": sh_rec, "out": sh_out}}


def _ste(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Forward ``q``, backward identity (straight-through estimator)."""
    return x + (q.to(x.dtype) - x).detach()


def _log_tau(alpha: torch.Tensor, dt: float, fallback: torch.Tensor) -> torch.Tensor:
    ok = (alpha > 0) & (alpha < 1)
    safe = torch.where(ok, alpha, torch.full_like(alpha, 0.5))
    return torch.where(ok, (-dt / torch.log(safe)).log(), fallback.detach())


def fake_quant_params_xylo(model, version: int = 1) -> dict[str, torch.Tensor]:
    """The parameters the chip runs, in float (dequantised from :func:`quantize_xylo`'s spec, the
    ``1 / a_s`` fold undone), each with a straight-through estimator: weights, recurrent weights,
    biases, thresholds and time constants (the dashes' ``1 - 2^-dash``). For
    :func:`torch.func.functional_call` during quantisation-aware fine-tuning."""
    with torch.no_grad():
        spec, rep = quantize_xylo(model, version, adapt_reset=True)
    out = {}
    offs = [sum(spec.layer_sizes[:k]) for k in range(len(spec.layer_sizes))]
    for k, c in enumerate(model.cells):
        o, n, s = offs[k], spec.layer_sizes[k], rep["layers"][k]["scale"]
        ds, dm = spec.dash_syn[o:o + n], spec.dash_mem[o:o + n]
        a_s = alpha_of_dash(ds)
        if k == 0:
            w = spec.weights_in[:, o:o + n].t().double() * 2**spec.weight_shift_in
        else:
            p = offs[k - 1]
            w = spec.weights_rec[p:p + spec.layer_sizes[k - 1], o:o + n].t().double() * 2**spec.weight_shift_rec
        out[f"cells.{k}.weight"] = _ste(c.weight, w * a_s[:, None] / s)
        if c.recurrent_weight is not None:
            wr = spec.weights_rec[o:o + n, o:o + n].t().double() * 2**spec.weight_shift_rec
            out[f"cells.{k}.recurrent_weight"] = _ste(c.recurrent_weight, wr * a_s[:, None] / s)
        if c.bias is not None:
            b = spec.bias[o:o + n].double() if spec.bias is not None else torch.zeros(n, dtype=torch.double)
            out[f"cells.{k}.bias"] = _ste(c.bias, b * (1 - a_s) / s)
        if c.threshold.requires_grad:
            thr = spec.threshold[o:o + n].double() / s
            out[f"cells.{k}.threshold"] = _ste(c.threshold, thr if c.threshold.numel() == n else thr.mean().reshape(c.threshold.shape))
        for name, dash in (("log_tau_mem", dm), ("log_tau_syn", ds)):
            p = getattr(c, name)
            out[f"cells.{k}.{name}"] = _ste(p, _log_tau(alpha_of_dash(dash), c.dt, p).expand_as(p))
    ro, s_o = model.readout, spec.out_scale
    o = offs[-1]
    wo = spec.weights_out[o:].t().double() * 2**spec.weight_shift_out * alpha_of_dash(spec.dash_syn_out)[:, None] / s_o
    out["readout.weight"] = _ste(ro.weight, wo)
    if ro.bias is not None:
        bo = spec.bias_out.double() / s_o if spec.bias_out is not None else torch.zeros_like(ro.bias, dtype=torch.double)
        out["readout.bias"] = _ste(ro.bias, bo)
    if ro.leaky:
        out["readout.log_tau"] = _ste(ro.log_tau, _log_tau(alpha_of_dash(spec.dash_mem_out), ro.dt, ro.log_tau))
    return out

"""Quantise a trained :class:`~spikerec.models.RecurrentStack` to a target profile.

Per layer ``l`` one *state scale* ``s_l`` (integer state units per float unit) is chosen:
``s_l = w_max_int * 2^k / max|W_l, W_rec_l|`` with the largest weight shift ``k`` of the
profile's range for which the threshold, bias and a headroom of ``HEADROOM x threshold``
(readouts: the row-sum bound of ``|y|``) still fit the state width. Then

    W_q   = clip(round(s W / 2^k))                 (mantissas; the layer adds ``W_q x << k``)
    thr_q = round(s thr / 2^ts) << ts              (``ts`` = the profile's threshold shift)
    b_q   = round(s b / 2^e) << e                  (``e`` the smallest bias exponent that fits)
    d     = round((1 - alpha) 2^B)  (mulshift)  or  dash = round(-log2(1 - alpha))  (bitshift)

Rockpool's ``global_quantize`` (``rockpool/transform/quantize_methods.py``) and lava-dl's netx
export follow the same pattern. A :class:`QuantReport` gives the per-layer error; :func:`quantize` warns
(:class:`SilentLayerWarning`) when a layer that fires in float is silent in the integer
simulator on calibration data; :func:`finetune` trains through fake quantisation with a
straight-through estimator (STE) to win back accuracy.
"""
from __future__ import annotations

import copy
import warnings

import torch

from .intsim import simulate
from .profiles import TargetProfile, get_profile
from .quantized_network import HEADROOM, QLayer, QuantizationError, QuantizedNetwork, QuantReport, SilentLayerWarning
from .xylo.network import XyloNetwork
from .xylo.quantize import fake_quant_params_xylo, quantize_xylo

__all__ = [
    "QLayer", "QuantizedNetwork", "QuantReport", "QuantizationError", "SilentLayerWarning",
    "quantize", "finetune", "fake_quant_params", "HEADROOM",
]

# --- scalar rules ------------------------------------------------------------------------
def decay_code(alpha: torch.Tensor, profile: TargetProfile) -> torch.Tensor:
    """Integer decay code of ``alpha`` (per neuron) under the profile's decay rule."""
    alpha = alpha.detach().double().clamp(0.0, 1.0)
    if profile.decay == "mulshift":
        return torch.round((1.0 - alpha) * 2**profile.decay_bits).long().clamp(0, profile.decay_max)
    dash = torch.round(-torch.log2((1.0 - alpha).clamp_min(2.0 ** -(profile.decay_max + 1))))
    return dash.long().clamp(0, profile.decay_max)


def code_alpha(code: torch.Tensor, profile: TargetProfile) -> torch.Tensor:
    """The decay factor a code implements (up to rounding of the state)."""
    code = code.double()
    if profile.decay == "mulshift":
        return 1.0 - code / 2**profile.decay_bits
    return torch.where(code == 0, torch.zeros_like(code), 1.0 - 2.0 ** (-code))


def _full_decay(profile: TargetProfile, n: int) -> torch.Tensor:
    """Code that removes the whole value in one step (a non-leaky state)."""
    return torch.full((n,), 2**profile.decay_bits if profile.decay == "mulshift" else 0, dtype=torch.long)


def _layer_kind(cell) -> str:
    from ...layers.alif import ALIF
    from ...layers.lif import LIF
    from ...layers.readout import LeakyReadout

    if isinstance(cell, LIF):
        return "lif"
    if isinstance(cell, ALIF):
        return "alif"
    if isinstance(cell, LeakyReadout):
        return "readout"
    return type(cell).__name__


def required_features(cell) -> list[str]:
    """The profile features (``LAYER_KINDS``) a layer needs."""
    kind = _layer_kind(cell)
    feats = [kind]
    if kind == "lif" and cell.cuba:
        feats.append("cuba")
    if kind in ("lif", "alif") and cell.recurrent_weight is not None:
        feats.append("recurrent")
    if kind == "readout" and cell.leaky:
        feats.append("readout_leaky")
    if getattr(cell, "bias", None) is not None and bool((cell.bias.detach() != 0).any()):
        feats.append("bias")
    return feats


def check_supported(model, profile: TargetProfile, *, adapt_reset: bool = False) -> None:
    """Raise :class:`QuantizationError` naming the first layer the target cannot run."""
    for k, cell in enumerate(model.layers):
        name = _layer_name(model, k)
        for f in required_features(cell):
            if f not in profile.supports:
                raise QuantizationError(
                    f"layer {name} ({type(cell).__name__}): target '{profile.name}' does not support '{f}' "
                    f"(it supports: {', '.join(profile.supports)})")
        reset = getattr(cell, "reset", None)
        if _layer_kind(cell) == "alif":
            reset = "subtract"
            if not profile.strict_threshold:
                raise QuantizationError(f"layer {name} (ALIF): needs a strict threshold; target '{profile.name}' uses v >= thr")
        if reset is not None and reset not in profile.resets and not adapt_reset:
            raise QuantizationError(
                f"layer {name} ({type(cell).__name__}): reset '{reset}' is not available on target '{profile.name}' "
                f"(it has: {', '.join(profile.resets)}); pass adapt_reset=True (CLI: --adapt-reset) to switch the "
                f"model to '{profile.resets[0]}' and fine-tune")


def _layer_name(model, k: int) -> str:
    return f"cells.{k}" if k < len(model.cells) else "readout"


def adapt_model(model, profile: TargetProfile):
    """A copy of ``model`` whose resets are ones the target has (first of ``profile.resets``)."""
    m = copy.deepcopy(model)
    for c in m.cells:
        if getattr(c, "reset", None) is not None and c.reset not in profile.resets:
            c.reset = profile.resets[0]
    return m


# --- per-layer quantisation ---------------------------------------------------------------------
def _choose_shift(name, wmax, need, profile: TargetProfile) -> tuple[int, float]:
    """Largest weight shift whose scale keeps every ``(value_in_float, limit)`` of ``need`` in range."""
    lo, hi = profile.weight_shift_range
    best = None
    for k in range(lo, hi + 1):
        s = profile.weight_max * 2**k / wmax
        if all(v * s <= lim for v, lim, _ in need):
            best = (k, s)
    if best is None:
        s = profile.weight_max * 2**lo / wmax
        v, lim, what = next((v, lim, w) for v, lim, w in need if v * s > lim)
        raise QuantizationError(
            f"layer {name}: weights cannot be represented on '{profile.name}': with max|W| = {wmax:.4g} "
            f"the {what} ({v:.4g} in float) needs {v * s:.4g} state units, above the limit {lim} "
            f"({profile.weight_bits}-bit weights, {profile.state_bits}-bit state)")
    return best


def _quant_bias(name, b_state: torch.Tensor, profile: TargetProfile) -> torch.Tensor:
    """Round a bias (state units) to ``mant << exp``."""
    bmax = float(b_state.abs().max()) if b_state.numel() else 0.0
    for e in range(0, 2**profile.bias_exp_bits):
        if bmax / 2**e <= profile.bias_max:
            mant = torch.round(b_state / 2**e).long()
            return mant << e
    raise QuantizationError(f"layer {name}: bias {bmax:.4g} state units does not fit {profile.bias_bits}-bit "
                            f"mantissa << {profile.bias_exp_bits}-bit exponent on '{profile.name}'")


def _finite(name, **tensors):
    for k, t in tensors.items():
        if t is not None and not torch.isfinite(t).all():
            raise QuantizationError(f"layer {name}: {k} has NaN or infinite values")


def quantize_layer(cell, name: str, profile: TargetProfile) -> tuple[QLayer, dict]:
    """Quantise one layer; returns the :class:`QLayer` and its error report row."""
    kind = _layer_kind(cell)
    W = cell.weight.detach().double()
    Wr = cell.effective_recurrent_weight().detach().double() if getattr(cell, "recurrent_weight", None) is not None else None
    b = cell.bias.detach().double() if getattr(cell, "bias", None) is not None else torch.zeros(W.shape[0], dtype=torch.double)
    _finite(name, weight=W, recurrent_weight=Wr, bias=b)
    wmax = max(float(W.abs().max()), float(Wr.abs().max()) if Wr is not None else 0.0)
    if wmax == 0.0:
        raise QuantizationError(f"layer {name}: all weights are zero; nothing to scale")
    n = W.shape[0]
    smax = 2 ** (profile.state_bits - 1) - 1
    row = {"name": name, "kind": kind}
    alpha_s = None
    if kind == "readout":
        alpha = cell.alpha().detach().double() if cell.leaky else torch.zeros(n, dtype=torch.double)
        bound = float(((W.abs().sum(1) + b.abs()) / (1 - alpha).clamp_min(1e-3)).max())
        need = [(bound, smax, "readout range (row sum of |W| + |b|) / (1 - alpha)")]
        thr = None
    elif kind == "lif":
        alpha, alpha_s = cell.decays()
        alpha = alpha.detach().double()
        alpha_s = alpha_s.detach().double() if alpha_s is not None else None
        thr = cell.threshold.detach().double()
        _finite(name, threshold=thr)
        need = [(float(thr.max()) * HEADROOM, smax, f"membrane headroom ({HEADROOM:g} x threshold)"),
                (float(thr.max()), profile.threshold_max * 2**profile.threshold_shift, "threshold")]
    elif kind == "alif":
        alpha, rho = (t.detach().double() for t in cell.decays())
        thr = cell.b.detach().double()
        beta = cell.beta.detach().double()
        _finite(name, b=thr, beta=beta)
        peak = float((thr + beta.clamp_min(0)).max())
        need = [(peak * HEADROOM, smax, f"membrane headroom ({HEADROOM:g} x adaptive threshold)"),
                (peak, profile.threshold_max * 2**profile.threshold_shift, "threshold")]
    else:
        raise QuantizationError(f"layer {name}: {kind} layers cannot be quantised (only LIF, ALIF and LeakyReadout)")
    if alpha_s is not None and profile.bias_into == "voltage":
        b = b / (1 - alpha_s).clamp_min(1e-6)  # steady-state equivalent of a bias filtered by the synapse
    if b.abs().max() > 0:
        lim = profile.bias_max * 2 ** (2**profile.bias_exp_bits - 1)
        need.append((float(b.abs().max()), lim, "bias"))
    k, s = _choose_shift(name, wmax, need, profile)
    step = 2**k / s  # float value of one mantissa step
    Wq = torch.round(W / step).clamp(profile.weight_min, profile.weight_max).long()
    Wrq = torch.round(Wr / step).clamp(profile.weight_min, profile.weight_max).long() if Wr is not None else None
    bq = _quant_bias(name, b * s, profile)
    q = QLayer(kind=kind, name=name, weight=Wq, shift=k, bias=bq, scale=s,
               decay_v=decay_code(alpha, profile),
               decay_i=decay_code(alpha_s, profile) if alpha_s is not None else _full_decay(profile, n),
               recurrent_weight=Wrq, cuba=alpha_s is not None)
    if kind == "readout" and not cell.leaky:
        q.decay_v = _full_decay(profile, n)
    if thr is not None:
        if (thr <= 0).any():
            bad = int((thr <= 0).sum())
            raise QuantizationError(
                f"layer {name}: {bad} of {thr.numel()} neurons have a non-positive threshold (min {float(thr.min()):.4g}); "
                f"'{profile.name}' needs thresholds > 0. Clamp them (e.g. ALIF `b`) and fine-tune, "
                "or train with a larger base threshold")
        ts = profile.threshold_shift
        T = (torch.round(thr * s / 2**ts).long() << ts)
        if (T <= 0).any():
            raise QuantizationError(f"layer {name}: threshold {float(thr.min()):.4g} rounds to 0 at scale {s:.4g}; "
                                    f"the weights are too large relative to the threshold for '{profile.name}'")
        if kind == "lif":
            q.reset = cell.reset
            q.reset_amount = T
            q.threshold = T if profile.strict_threshold else T - 1
        else:
            q.reset = "subtract"
            q.b = T
            q.beta = torch.round(beta * s).long()
            q.threshold = T
            q.reset_amount = T
            q.decay_a = decay_code(rho, profile)
            q.adapt_inc = torch.round((1 - rho) * 2**profile.adapt_frac_bits).long()
            row["decay_a_err"] = float((code_alpha(q.decay_a, profile) - rho).abs().max())
    # --- error report (float units) ---
    err = lambda a, qa: float((a - qa).norm() / a.norm().clamp_min(1e-30))  # noqa: E731
    row.update(shift=k, scale=s, weight_rel_err=err(W, Wq.double() * step),
               zeroed_frac=float(((Wq == 0) & (W != 0)).sum()) / max(1, int((W != 0).sum())))
    if Wr is not None:
        row["recurrent_rel_err"] = err(Wr, Wrq.double() * step)
    if thr is not None:
        row["threshold_rel_err"] = float(((q.reset_amount.double() / s - thr).abs() / thr).max())
    row["decay_v_err"] = float((code_alpha(q.decay_v, profile) - alpha).abs().max())
    if alpha_s is not None:
        row["decay_i_err"] = float((code_alpha(q.decay_i, profile) - alpha_s).abs().max())
    if b.abs().max() > 0:
        row["bias_rel_err"] = err(b, bq.double() / s)
    return q, row


def quantize(model, profile="generic", *, calibration: torch.Tensor | None = None, adapt_reset: bool = False,
             **overrides) -> tuple[QuantizedNetwork, QuantReport]:
    """Quantise ``model`` to ``profile``; returns the integer network and the error report.

    ``calibration``: an integer-valued input batch ``[T, B, C]``; with it the report gives each
    layer's firing rate in float and in the integer simulator and their spike agreement, and a
    :class:`SilentLayerWarning` is raised (as a warning) for a layer that goes silent.
    ``adapt_reset`` switches resets the target lacks (see :func:`adapt_model`).
    """
    profile = get_profile(profile, **overrides)
    if profile.chip == "xylo":
        return _quantize_xylo(model, profile, calibration, adapt_reset)
    check_supported(model, profile, adapt_reset=adapt_reset)
    if adapt_reset:
        model = adapt_model(model, profile)
    layers, report = [], QuantReport(profile.name)
    for k, cell in enumerate(model.layers):
        q, row = quantize_layer(cell, _layer_name(model, k), profile)
        layers.append(q)
        report.layers.append(row)
    qnet = QuantizedNetwork(profile, layers, model.readout_mode, model.input_size)
    if calibration is not None:
        activity_report(model, qnet, calibration, report)
    return qnet, report


def _quantize_xylo(model, profile: TargetProfile, calibration, adapt_reset: bool):
    """The Xylo path of :func:`quantize` (:func:`~spikerec.hardware.export.xylo.quantize.quantize_xylo`)."""
    spec, rep = quantize_xylo(model, profile.chip_version, adapt_reset=adapt_reset)
    if adapt_reset:
        model = adapt_model(model, profile)
    names = [f"cells.{k}" for k in range(len(model.cells))]
    qnet = XyloNetwork(profile, spec, model.readout_mode, model.input_size, names)
    report = QuantReport(profile.name, layers=rep["layers"])
    for row in report.layers:
        row["kind"] = "readout" if row["name"] == "readout" else "cuba"
        row["shift"] = rep["shifts"]["out" if row["name"] == "readout" else ("in" if row["name"] == "cells.0" else "rec")]
    if calibration is not None:
        activity_report(model, qnet, calibration, report)
    return qnet, report


@torch.no_grad()
def activity_report(model, qnet: QuantizedNetwork, x: torch.Tensor, report: QuantReport) -> None:
    """Fill firing rates / spike agreement into ``report`` and warn about silent layers."""
    _, _, hidden = model(x.to(next(model.parameters()).dtype), record=True)
    res = simulate(qnet, x)
    for k, (zf, zi) in enumerate(zip(hidden, res.spikes)):
        row = report.layers[k]
        rf, ri = float(zf.mean()), float(zi.double().mean())
        row["rate_float"], row["rate_int"] = rf, ri
        row["spike_agreement"] = float((zf.bool() == zi.bool()).double().mean())
        if rf > 0 and ri == 0:
            msg = (f"layer {row['name']} is silent after quantisation to '{qnet.profile.name}' "
                   f"(float firing rate {rf:.4f}); try finetune() or a profile with more bits")
            report.warnings.append(msg)
            warnings.warn(msg, SilentLayerWarning, stacklevel=3)


# --- quantisation-aware fine-tuning -------------------------------------------------------------
def _ste(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Forward ``q``, backward identity (straight-through estimator)."""
    return x + (q - x).detach()


def fake_quant_params(model, profile: TargetProfile) -> dict[str, torch.Tensor]:
    """Parameters of ``model`` replaced by their dequantised values with an STE (for
    :func:`torch.func.functional_call`): weights, biases, thresholds and time constants. For a chip
    profile (Xylo) these are the values the chip runs (:func:`~spikerec.hardware.export.xylo.quantize.fake_quant_params_xylo`)."""
    if profile.chip == "xylo":
        return fake_quant_params_xylo(model, profile.chip_version)
    params = dict(model.named_parameters())
    out = {}
    for k, cell in enumerate(model.layers):
        prefix = f"cells.{k}." if k < len(model.cells) else "readout."
        with torch.no_grad():
            q, _ = quantize_layer(cell, _layer_name(model, k), profile)
        step = 2**q.shift / q.scale
        out[prefix + "weight"] = _ste(cell.weight, q.weight.to(cell.weight.dtype) * step)
        if q.recurrent_weight is not None:
            out[prefix + "recurrent_weight"] = _ste(cell.recurrent_weight, q.recurrent_weight.to(cell.weight.dtype) * step)
        if getattr(cell, "bias", None) is not None and not (q.cuba and profile.bias_into == "voltage"):
            out[prefix + "bias"] = _ste(cell.bias, q.bias.to(cell.bias.dtype) / q.scale)
        if q.kind == "lif" and cell.threshold.requires_grad:
            out[prefix + "threshold"] = _ste(cell.threshold, q.reset_amount.to(cell.threshold.dtype) / q.scale)
        if q.kind == "alif":
            out[prefix + "b"] = _ste(cell.b, q.b.to(cell.b.dtype) / q.scale)
            out[prefix + "beta"] = _ste(cell.beta, q.beta.to(cell.beta.dtype) / q.scale)
        # time constants: log tau of the quantised decay, where it is finite
        for pname, code in (("log_tau_mem", q.decay_v), ("log_tau_syn", q.decay_i if q.cuba else None),
                            ("log_tau", q.decay_v if q.kind == "readout" else None),
                            ("log_tau_adapt", q.decay_a)):
            p = params.get(prefix + pname)
            if p is None or code is None:
                continue
            a = code_alpha(code, profile).to(p.dtype)
            ok = (a > 0) & (a < 1)
            tau_q = torch.where(ok, -cell.dt / torch.log(torch.where(ok, a, torch.full_like(a, 0.5))), p.detach().exp())
            out[prefix + pname] = _ste(p, tau_q.log())
    return out


def finetune(model, profile, batches, *, epochs: int = 3, lr: float = 1e-3, loss_fn=None, adapt_reset: bool = False,
             **overrides):
    """Quantisation-aware fine-tuning (STE) of a copy of ``model`` on ``batches`` (an iterable of
    ``(x[T, B, C], y)``, re-iterated each epoch); returns the tuned copy. The forward pass uses the
    target's weights, thresholds and decays; gradients pass straight through the rounding."""
    from torch.func import functional_call

    profile = get_profile(profile, **overrides)
    check_supported(model, profile, adapt_reset=adapt_reset)
    m = adapt_model(model, profile) if adapt_reset else copy.deepcopy(model)
    m.train()
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=lr)
    for _ in range(epochs):
        for x, y in batches:
            params = {**dict(m.named_parameters()), **fake_quant_params(m, profile)}
            out, _ = functional_call(m, params, (x.to(next(m.parameters()).dtype),))
            loss = loss_fn(m.logits(out), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    m.eval()
    return m


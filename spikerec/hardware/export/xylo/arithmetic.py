"""The integer arithmetic of the Xylo SNN core (SynSense Xylo, syns61300 "v1" and syns61201 "v2").

These are the rules the vendor's bit-accurate simulator ``xylosim`` (``xylosim.v1.XyloLayer``,
``xylosim.v2.XyloLayer``; wrapped by Rockpool's ``rockpool.devices.xylo.syns61300.XyloSim``)
applies; the tests run ``xylosim`` itself and compare spikes, ``Vmem``, ``Isyn`` and the output
neurons step by step. One time step of the core, for hidden neuron ``j`` (all values integers)::

    i_j  <- sat(i_j + (w << shift))      once per input event, inputs first (channel order),
                                         then the recurrent events (spike counts of step t-1)
    i_j  <- D(i_j, dash_syn_j)                    the synapse decays *after* the input is added
    v_j  <- sat(D(v_j, dash_mem_j) + i_j)                          v1
    v_j  <- sat(v_j + sat(sat(-L(v_j, dash_mem_j) + i_j) + b_j))   v2 (Xylo Audio 2)
    n_j  =  min(floor(v_j / thr_j), 31) if v_j >= thr_j else 0    (multi-spike, at most 31 per step)
    v_j  <- v_j - n_j thr_j                       (subtractive reset, decayed at the next step)

with ``D(x, d) = x - (x >> d)`` (arithmetic shift, i.e. floor) except that a positive ``x`` loses at
least one unit (``x >> d == 0`` removes 1): the decay never stalls above zero; negative values
already lose at least 1 through the floor; ``L(x, d) = x - D(x, d)`` is the amount lost. ``dash = 0``
removes everything, so a synapse with ``dash_syn = 0`` drops all its input. ``sat`` clamps to
``[-2^15, 2^15 - 1]``.

**v2 integrates an increment.** Xylo Audio 2 forms the membrane's change ``-L + i (+ b)`` in 16
bits, saturating after each addition, and then adds it to ``v`` with saturation
(:func:`integrate_v2`); v1 adds the current to the decayed membrane in one saturating sum. The two
agree until an intermediate sum leaves the 16-bit range (strong or dense input, large weight
shifts, a membrane far from zero with a short ``dash_mem``). The increment's first term is the
16-bit negation of ``L``: at ``v = -2^15`` with ``dash_mem = 0`` it wraps to ``-2^15``, as
``xylosim.v2`` computes it, so such a membrane stays at ``-2^15`` until ``i + b`` exceeds ``2^15``. An input channel
delivers at most 15 events per step (larger counts are cut to 15). Output neurons follow the same
synapse/membrane rules on the hidden spike counts of the *previous* step, emit at most one spike
and subtract their threshold once.

Because each ``(w << shift)`` of one pre-synaptic source is added ``count`` times with the same
sign, saturating after every event equals one clamp of ``i + count * (w << shift)`` per source;
only the order of the sources matters (:func:`accumulate`).
"""
from __future__ import annotations

import torch

__all__ = ["STATE_MIN", "STATE_MAX", "INPUT_EVENT_CAP", "SPIKE_CAP", "xylo_decay", "saturate", "accumulate",
           "multi_spike", "integrate_v1", "integrate_v2"]

STATE_MIN, STATE_MAX = -(2**15), 2**15 - 1
INPUT_EVENT_CAP = 15
SPIKE_CAP = 31


def saturate(x: torch.Tensor) -> torch.Tensor:
    """Clamp to the 16-bit signed range ``[-32768, 32767]``."""
    return x.clamp(STATE_MIN, STATE_MAX)


def xylo_decay(x: torch.Tensor, dash: torch.Tensor) -> torch.Tensor:
    """``x - (x >> dash)``, removing at least 1 from a positive ``x`` (0 stays 0)."""
    s = x >> dash
    s = torch.where((x > 0) & (s == 0), torch.ones_like(s), s)
    return x - s


def integrate_v1(v: torch.Tensor, dash: torch.Tensor, i: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Xylo (v1) membrane before the reset: ``D(v, dash) + i (+ b)``; the caller saturates."""
    return xylo_decay(v, dash) + (i if bias is None else i + bias)


def integrate_v2(v: torch.Tensor, dash: torch.Tensor, i: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Xylo Audio 2 membrane before the reset: ``sat(v + sat(sat(-L(v, dash) + i) + b))`` with the
    leak ``L = v - D(v, dash)`` negated in 16 bits (``-(-2^15)`` wraps to ``-2^15``)."""
    neg_leak = xylo_decay(v, dash) - v
    neg_leak = torch.where(neg_leak > STATE_MAX, neg_leak - 2**16, neg_leak)
    dv = saturate(neg_leak + i)
    if bias is not None:
        dv = saturate(dv + bias)
    return saturate(v + dv)


def accumulate(i: torch.Tensor, counts: torch.Tensor, weights: torch.Tensor, shift: int) -> torch.Tensor:
    """Add ``counts[b, p]`` events of ``weights[p, :] << shift`` to ``i[b, :]`` in source order ``p``,
    saturating after each event.

    Fast path: when neither the sum of the positive nor of the negative contributions can leave the
    range, no partial sum saturates and the result is ``i + counts @ (W << shift)``; otherwise the
    sources are applied one by one (a clamp per source is exact, see the module docstring).
    """
    w = weights << shift
    pos = counts @ w.clamp(min=0)
    neg = counts @ w.clamp(max=0)
    if bool(((i + pos) <= STATE_MAX).all()) and bool(((i + neg) >= STATE_MIN).all()):
        return i + pos + neg
    for p in range(w.shape[0]):
        c = counts[:, p:p + 1]
        if bool((c != 0).any()):
            i = saturate(i + c * w[p])
    return i


def multi_spike(v: torch.Tensor, thr: torch.Tensor, cap: int = SPIKE_CAP) -> torch.Tensor:
    """Spike count per neuron: ``min(v // thr, cap)`` where ``v >= thr``, else 0."""
    return torch.where(v >= thr, torch.div(v, thr, rounding_mode="floor").clamp(max=cap), torch.zeros_like(v))

"""Online-learning partials derived from the one neuron step with forward-mode AD.

For a layer of independent modules (no lateral weights, or only their diagonal) every state
field of neuron ``n`` depends on its own previous state and on its own parameters only, so one
Jacobian-vector product of the step (:func:`torch.func.jvp`) with a tangent that is 1 on every
neuron gives, per sample and neuron at once (Williams & Zipser 1989, Eq. 11-12, restricted to
the diagonal as in SnAp-1 of Menick et al. 2021; e-prop's eligibility vectors of Bellec et al.
2020 are the same quantities):

* tangent ``e_j`` on state field ``j`` -> column ``j`` of ``J_t[b, n] = d s_t[b, n] / d s_{t-1}[b, n]``;
* tangent ``1`` on a per-neuron parameter ``p`` -> the immediate partial ``d s_t[b, n] / d p[n]``.

The hand-written partials of :mod:`spikerec.hardware.online.traces_lif` are the registered backend used at run time
(measured faster: see ``docs/online.md``); ``test_online_partials.py`` checks them equal
to these derived ones in float64.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch.func import jvp

__all__ = ["derived_partials"]


def derived_partials(step: Callable, params: NamedTuple, state: NamedTuple, x: torch.Tensor,
                     per_neuron: tuple[str, ...]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(J [B, N, k, k], {name: d s_t / d name [B, N, k]})`` of ``new = step(params, state, x)``.

    ``step(params, state, x) -> new_state`` is the neuron's step (its new state only);
    ``per_neuron`` names the ``[N]``-shaped parameters whose partials are wanted."""
    names = [n for n in params._fields if getattr(params, n) is not None]
    pvals = tuple(getattr(params, n).detach() for n in names)
    svals = tuple(f.detach() for f in state)

    def f(pv, sv):
        p = params._replace(**dict(zip(names, pv)))
        return tuple(step(p, type(state)(*sv), x))

    zp = tuple(torch.zeros_like(v) for v in pvals)
    zs = tuple(torch.zeros_like(v) for v in svals)
    k = len(svals)
    cols = []
    for j in range(k):
        ts = tuple(torch.ones_like(v) if i == j else z for i, (v, z) in enumerate(zip(svals, zs)))
        _, out = jvp(f, (pvals, svals), (zp, ts))
        cols.append(torch.stack(out, -1))  # [B, N, k]: column j
    J = torch.stack(cols, -1)
    vec = {}
    for n in per_neuron:
        if n not in names:
            continue
        i = names.index(n)
        tp = tuple(torch.ones_like(v) if m == i else z for m, (v, z) in enumerate(zip(pvals, zp)))
        _, out = jvp(f, (pvals, svals), (tp, zs))
        vec[n] = torch.stack(out, -1)
    return J, vec

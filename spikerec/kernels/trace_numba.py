"""The block contraction of exact online learning, compiled for the CPU (numba), for every kind with ``k``
in {1, 2} states per neuron (Zucchet et al. 2023; Bellec et al. 2020, Methods). Over a block of ``K`` steps,
lane ``r = (b, n)`` has Jacobians ``J_t``, immediate partials ``V[j, t]`` of ``m`` per-neuron parameters and
errors ``g_t``; the sums of the trace recursion ``e_t = J_t e_{t-1} + v_t``, ``G += g_t . e_t`` are taken by
its adjoint (the reverse filter), without forming a trace per step::

    gh_{K-1} = g_{K-1},  gh_t = g_t + J_{t+1}^T gh_{t+1}        b0 = J_0^T gh_0
    Gv[j, n] += sum_{t, b} gh_t . V[j, t] + sum_b b0 . e_in[j]
    Phi_t = J_{K-1} ... J_{t+1},  phi = Phi_{-1}               e_out[j] = sum_t Phi_t V[j, t] + phi e_in[j]

and for a matrix parameter with immediate partial ``c_t (x) pre_t``, ``P[b, t] = Phi_t c_t`` and
:func:`mat_carry_numba` (the boundary term and the trace's carry). Arrays are planar (neurons last). The torch
form: :func:`spikerec.hardware.online.traces.chunk_contract` (tested equal in float64).
"""
from __future__ import annotations

import numpy as np
import torch

from .. import neurons
from . import as_numpy

try:  # numba is optional (the other online kernels take ``_nb`` from here)
    import numba as _nb
except Exception:  # pragma: no cover - depends on the install
    _nb = None
_HAVE_NUMBA = _nb is not None

__all__ = ["numba_available", "compiled_cpu", "block_lanes_numba", "mat_carry_numba"]

COMPILED_DTYPES = (torch.float32, torch.float64)


def numba_available() -> bool:
    return _HAVE_NUMBA


def compiled_cpu(*tensors) -> bool:
    """Whether the compiled CPU kernels apply: numba installed, every tensor on the CPU in float32 or float64."""
    return _HAVE_NUMBA and all(t.is_cpu and t.dtype in COMPILED_DTYPES for t in tensors)


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _lanes(J, V, G, c, unit, Cr, e_in, use_g, use_J, has_e, carry, need_P, per_lane, GH, A, Gv, b0, P, phi,
               e_out):  # pragma: no cover - compiled
        """:func:`_lanes_k` with ``k = V.shape[3]`` (1 or 2) a compile-time constant (its loops unroll)."""
        if V.shape[3] == 1:
            _lanes_k(1, J, V, G, c, unit, Cr, e_in, use_g, use_J, has_e, carry, need_P, per_lane, GH, A, Gv, b0, P,
                     phi, e_out)
        elif V.shape[3] == 2:
            _lanes_k(2, J, V, G, c, unit, Cr, e_in, use_g, use_J, has_e, carry, need_P, per_lane, GH, A, Gv, b0, P,
                     phi, e_out)
        else:
            raise ValueError("the compiled block pass takes one or two states per neuron")

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _lanes_k(k, J, V, G, c, unit, Cr, e_in, use_g, use_J, has_e, carry, need_P, per_lane, GH, A, Gv, b0, P, phi,
                 e_out):  # pragma: no cover - compiled
        """The block's per-lane work (module docstring) in one sweep back over the steps: ``J [K or 1, B or 1,
        k*k, N]`` (row-major ``k x k``; constant in time or over the batch given once), ``V [m, K, B, k, N]``,
        ``G, GH [K, B, k, N]``, ``c [K or 1, B or 1, k, N]`` (the unit vector ``e_0`` where ``unit``), ``e_in,
        e_out [m, B, k, N]``, ``b0 [B, k, N]``, ``phi [B or 1, k*k, N]`` (one where ``J`` is the same for every
        sample), ``P [B or 1, K, k, N]`` (one where ``c`` is too); ``Gv [m, N]`` (``[m, B, N]`` with
        ``per_lane``) in float64; ``A[r] = gh . Cr[r]`` ``[R, K, B, N]`` (``Cr`` shaped as ``c``)."""
        m, K, B, _, N = V.shape
        Bj = phi.shape[0]
        tmp = np.empty((k * k, N), dtype=J.dtype)
        if carry:
            e_out[:] = 0
            for b in range(Bj):
                for f in range(k * k):
                    for n in range(N):
                        phi[b, f, n] = 1 if f % (k + 1) == 0 else 0
        for t in range(K - 1, -1, -1):
            jt, jn, ct = min(t, J.shape[0] - 1), min(t + 1, J.shape[0] - 1), min(t, c.shape[0] - 1)
            for b in range(B):
                jb, cb, gb, pb = min(b, J.shape[1] - 1), min(b, c.shape[1] - 1), b if per_lane else 0, min(b, Bj - 1)
                if use_g:  # gh_t = g_t + J_{t+1}^T gh_{t+1}
                    for f in range(k):
                        for n in range(N):
                            GH[t, b, f, n] = G[t, b, f, n]
                        for g in range(k if use_J and t < K - 1 else 0):
                            for n in range(N):
                                GH[t, b, f, n] += J[jn, jb, g * k + f, n] * GH[t + 1, b, g, n]
                    for j in range(m):
                        for f in range(k):
                            for n in range(N):
                                Gv[j, gb, n] += GH[t, b, f, n] * V[j, t, b, f, n]
                    for q in range(A.shape[0]):
                        for n in range(N):
                            A[q, t, b, n] = GH[t, b, 0, n] * Cr[q, ct, cb, 0, n]
                        for f in range(1, k):
                            for n in range(N):
                                A[q, t, b, n] += GH[t, b, f, n] * Cr[q, ct, cb, f, n]
                if not carry:
                    continue
                for j in range(m):  # e_out += Phi_t V_t
                    for f in range(k):
                        for g in range(k):
                            for n in range(N):
                                e_out[j, b, f, n] += phi[pb, f * k + g, n] * V[j, t, b, g, n]
                for f in range(k if need_P and b < P.shape[0] else 0):  # P[b, t] = Phi_t c_t
                    for n in range(N):
                        P[b, t, f, n] = phi[pb, f * k, n] if unit else phi[pb, f * k, n] * c[ct, cb, 0, n]
                    for g in range(1, 1 if unit else k):
                        for n in range(N):
                            P[b, t, f, n] += phi[pb, f * k + g, n] * c[ct, cb, g, n]
            for pb in range(Bj if carry else 0):  # Phi_{t-1} = Phi_t J_t
                jb = min(pb, J.shape[1] - 1)
                for f in range(k):
                    for g in range(k):
                        for n in range(N):
                            tmp[f * k + g, n] = phi[pb, f * k, n] * J[jt, jb, g, n]
                        for h in range(1, k):
                            for n in range(N):
                                tmp[f * k + g, n] += phi[pb, f * k + h, n] * J[jt, jb, h * k + g, n]
                for f in range(k * k):
                    for n in range(N):
                        phi[pb, f, n] = tmp[f, n]
        if use_g and use_J:  # b0 = J_0^T gh_0, the boundary term with the traces carried in
            for b in range(B):
                jb, gb = min(b, J.shape[1] - 1), b if per_lane else 0
                for f in range(k):
                    for n in range(N):
                        b0[b, f, n] = J[0, jb, f, n] * GH[0, b, 0, n]
                    for g in range(1, k):
                        for n in range(N):
                            b0[b, f, n] += J[0, jb, g * k + f, n] * GH[0, b, g, n]
                for j in range(m if has_e else 0):
                    for f in range(k):
                        for n in range(N):
                            Gv[j, gb, n] += b0[b, f, n] * e_in[j, b, f, n]
        for j in range(m if carry and has_e else 0):
            for b in range(B):
                for f in range(k):
                    for g in range(k):
                        for n in range(N):
                            e_out[j, b, f, n] += phi[min(b, Bj - 1), f * k + g, n] * e_in[j, b, g, n]

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _mat_carry(E, q, phi, bb, use_b, Gm, carry):  # pragma: no cover - compiled
        """One pass over a matrix trace ``E [N, B, k, H]``: the boundary term ``Gm[n] += sum_{b, f}
        bb[b, f, n] E[n, b, f]`` (``use_b``), then ``E[n, b] <- q[b, (f, n)] + phi[b, :, n] E[n, b]``
        (``carry``; ``q [B, k*N, H]``, ``phi [B, k*k, N]``)."""
        N, B, k, H = E.shape
        for n in range(N):
            for b in range(B):
                if use_b:
                    for f in range(k):
                        s = bb[b, f, n]
                        for h in range(H):
                            Gm[n, h] += s * E[n, b, f, h]
                if carry:
                    pb = min(b, phi.shape[0] - 1)
                    if k == 1:
                        p = phi[pb, 0, n]
                        for h in range(H):
                            E[n, b, 0, h] = q[b, n, h] + p * E[n, b, 0, h]
                    else:
                        p00, p01, p10, p11 = phi[pb, 0, n], phi[pb, 1, n], phi[pb, 2, n], phi[pb, 3, n]
                        for h in range(H):
                            e0, e1 = E[n, b, 0, h], E[n, b, 1, h]
                            E[n, b, 0, h] = q[b, n, h] + p00 * e0 + p01 * e1
                            E[n, b, 1, h] = q[b, N + n, h] + p10 * e0 + p11 * e1


_PADS: dict = {}


def _pad(dt) -> np.ndarray:
    """A ``[1, 1, 1, 1, 1]`` array of ``dt`` for the operands a call does not use (never written: the flags skip them)."""
    p = _PADS.get(dt)
    if p is None:
        p = _PADS[dt] = np.zeros((1, 1, 1, 1, 1), dtype=dt)
    return p


def block_lanes_numba(J, V, G, c, e_in, use_J: bool, carry: bool, per_lane: bool = False, Cr=None,
                      need_P: bool = False, acc=None):
    """The block's per-lane work on planar CPU tensors of one float dtype (module docstring): ``J [K or 1, B or 1,
    k*k, N]``, ``V [m, K, B, k, N]``, ``G [K, B, k, N]`` or ``None``, ``c [K or 1, B or 1, k, N]`` (the matrix
    parameters' immediate coefficient; ``None``: the unit vector ``e_0``), ``e_in [m, B, k, N]`` or ``None``; ``Cr [R,
    K or 1, B or 1, k, N]``: the matrix readers' coefficients; ``need_P``: the matrix traces' carry coefficients;
    ``acc``: a float64 ``[m, 1, N]`` tensor the sums are added to (``Gv`` then not returned). Returns ``(GH, A, Gv,
    b0, P, phi, e_out)`` as numpy arrays, ``None`` where not asked for (``A [R, K, B, N]``; ``Gv`` ``[m, N]``, ``[m,
    B, N]`` with ``per_lane``, float64; ``phi`` and ``P`` with one row where the same for every sample)."""
    m, K, B, k, N = V.shape
    kk, dt = k * k, V.numpy().dtype
    e = lambda *s: np.empty(s, dtype=dt)  # noqa: E731
    use_g = G is not None
    carry = carry and use_J
    need_P = need_P and carry
    Bj = J.shape[1]
    GH = e(K, B, k, N) if use_g else None
    Gv = (acc.numpy() if acc is not None else np.zeros((m, B if per_lane else 1, N), dtype=np.float64)) if use_g else None
    b0 = e(B, k, N) if use_g and use_J else None
    P = e(1 if Bj == 1 and (c is None or c.shape[1] == 1) else B, K, k, N) if need_P else None
    phi = e(Bj, kk, N) if carry else None
    e_out = e(m, B, k, N) if carry else None
    A = e(Cr.shape[0], K, B, N) if (use_g and Cr is not None) else None
    pd = _pad(dt)
    a = lambda t, d: (t.numpy() if isinstance(t, torch.Tensor) else t) if t is not None else pd[(0,) * (5 - d)]  # noqa: E731
    _lanes(J.numpy(), V.numpy(), a(G, 4), a(c, 4), c is None, a(Cr if A is not None else None, 5), a(e_in, 4), use_g,
           use_J, e_in is not None, carry, need_P, per_lane, a(GH, 4), A if A is not None else pd[:0, 0],
           Gv if use_g else pd[0, 0].astype(np.float64), a(b0, 3), a(P, 4), a(phi, 3), a(e_out, 4))
    Gv = None if (Gv is None or acc is not None) else Gv if per_lane else Gv[:, 0]
    return GH, A, Gv, b0, P, phi, e_out


def mat_carry_numba(E, q, phi, bb, Gm) -> None:
    """:func:`_mat_carry` on CPU tensors, ``E`` advanced in place: the boundary term added to ``Gm`` where ``bb
    [B, k, N]`` is given, the carry where ``q [B, k*N, H]`` and ``phi [B or 1, k*k, N]`` are."""
    pd = _pad(E.numpy().dtype)[0, 0]
    _mat_carry(E.numpy(), q.numpy() if q is not None else pd, phi.numpy() if q is not None else pd,
               as_numpy(bb) if bb is not None else pd, bb is not None,
               Gm.numpy() if bb is not None else pd[0], q is not None)


for _kind in ("lif", "alif", "lru", "readout"):
    neurons.register_backend(_kind, "kernels.trace_numba (compiled block contraction: block_lanes_numba, "
                             "mat_carry_numba)", block_lanes_numba,
                             test="tests/test_online_partials.py::test_compiled_block_equals_the_derived_recursion")

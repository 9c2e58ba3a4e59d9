"""The kind-independent compiled CPU kernels (numba) of online learning: the matrix eligibility
trace of one layer (one step, :func:`mat_trace_step_numba`, tested against its torch reference
:func:`mat_trace_step_torch`; its two-state form, ``_mat_nest``) and the
chunked block of a one-state layer (``_chunk1``). For every neuron ``n`` and presynaptic input
``h``, with ``k`` in {1, 2} state fields per neuron::

    eps[n, b, :, h] <- J[b, n] eps[n, b, :, h] + c[b, n, :] x[b, h]          (trace advance)
    G_r[n, h]        = sum_b sum_f g_r[b, n, f] eps[n, b, f, h]              (contraction)

fused in one pass over ``eps`` (read once, written once), parallel over neurons (the eligibility traces of Bellec et al. 2020). The per-kind kernels are in
:mod:`.lif_online`, :mod:`.alif_online` and :mod:`.lru_online`; the Triton form of the matrix
trace in :mod:`.trace_triton`. Used for CPU float32/float64 tensors when numba is installed
(``pip install 'spikerec[fast]'``); other cases take the torch path.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import neurons

try:  # numba is optional
    import numba as _nb

    _HAVE_NUMBA = True
except Exception:  # pragma: no cover - depends on the install
    _HAVE_NUMBA = False

# Reassociation lets LLVM vectorise the dot products of the whole-stack stream step's kernels
# (rounding differs from torch's by ~1 ulp per sum; the same for every run, so checkpoints still
# resume bit-identically). No 'nnan'/'ninf'.
FASTMATH = {"reassoc", "contract", "nsz"}

__all__ = ["numba_available", "compiled_cpu", "compiled_dtype", "as_numpy", "placeholders", "mat_trace_step_torch",
           "filter_mat_step_numba",
           "mat_trace_step_numba"]


def numba_available() -> bool:
    return _HAVE_NUMBA


COMPILED_DTYPES = (torch.float32, torch.float64)


def compiled_cpu(*tensors) -> bool:
    """Whether the compiled kernels apply to ``tensors``: numba installed, every tensor on the CPU
    in float32 or float64 (the one test behind each compiled path's choice)."""
    if not _HAVE_NUMBA:
        return False
    for t in tensors:
        if not t.is_cpu or t.dtype not in COMPILED_DTYPES:
            return False
    return True


def compiled_dtype(dtype, device) -> bool:
    """:func:`compiled_cpu` for a dtype and device not yet held in a tensor."""
    return _HAVE_NUMBA and torch.device(device).type == "cpu" and dtype in COMPILED_DTYPES



def as_numpy(t):
    """A numpy view of ``t`` (a torch tensor, made contiguous; a numpy array as it is: the
    callers pass per-sequence constants already converted). The common case, a contiguous tensor
    without autograd, skips the ``detach``/``contiguous`` calls."""
    if isinstance(t, np.ndarray):
        return t
    if not t.requires_grad and t.is_contiguous():
        return t.numpy()
    return t.detach().contiguous().numpy()


_EMPTY: dict = {}


def placeholders(dt) -> tuple:
    """Zero arrays ``([1, 2], [1])`` of dtype ``dt`` that stand for absent operands of a compiled
    kernel (made once per dtype; the kernels never read them)."""
    z = _EMPTY.get(dt)
    if z is None:
        z = _EMPTY[dt] = (torch.zeros(1, 2, dtype=dt).numpy(), torch.zeros(1, dtype=dt).numpy())
    return z


def mat_trace_step_torch(eps, J, c, x, gs):
    """Reference: advance ``eps [N, B, k, H]`` in place and return ``[G_r [N, H]]`` for ``gs``
    (plain einsums, independent of the torch path in :mod:`spikerec.hardware.online.traces_base`)."""
    N, Bsz, k, H = eps.shape
    eps.copy_(torch.einsum("bnij,nbjh->nbih", J.expand(Bsz, -1, -1, -1), eps)
              + (c.unsqueeze(-1) * x[:, None, None, :]).transpose(0, 1))
    return [None if g is None else torch.einsum("bnf,nbfh->nh", g, eps) for g in gs]


if _HAVE_NUMBA:

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _mat_trace(eps, J, c, x, g1, g2, G1, G2, use_g, two):  # pragma: no cover - compiled
        N, B, k, H = eps.shape
        zero = eps.dtype.type(0)  # constants of the arrays' dtype (a float64 literal would promote float32 math)
        for n in range(N):
            for h in range(H):
                G1[n, h] = 0.0
                G2[n, h] = 0.0
            for b in range(B):
                jb = b if J.shape[0] > 1 else 0
                if k == 1:
                    j00 = J[jb, n, 0, 0]
                    c0 = c[b, n, 0]
                    q = g1[b, n, 0] if use_g else zero
                    r = g2[b, n, 0] if two else zero
                    for h in range(H):
                        e = j00 * eps[n, b, 0, h] + c0 * x[b, h]
                        eps[n, b, 0, h] = e
                        G1[n, h] += q * e
                        G2[n, h] += r * e
                else:
                    j00, j01, j10, j11 = J[jb, n, 0, 0], J[jb, n, 0, 1], J[jb, n, 1, 0], J[jb, n, 1, 1]
                    c0, c1 = c[b, n, 0], c[b, n, 1]
                    q0 = g1[b, n, 0] if use_g else zero
                    q1 = g1[b, n, 1] if use_g else zero
                    r0 = g2[b, n, 0] if two else zero
                    r1 = g2[b, n, 1] if two else zero
                    for h in range(H):
                        e0 = eps[n, b, 0, h]
                        e1 = eps[n, b, 1, h]
                        xv = x[b, h]
                        f0 = j00 * e0 + j01 * e1 + c0 * xv
                        f1 = j10 * e0 + j11 * e1 + c1 * xv
                        eps[n, b, 0, h] = f0
                        eps[n, b, 1, h] = f1
                        G1[n, h] += q0 * f0 + q1 * f1
                        G2[n, h] += r0 * f0 + r1 * f1


def mat_trace_step_numba(eps, J, c, x, gs):
    """Advance ``eps [N, B, k, H]`` in place and return ``[G_r [N, H]]`` for ``gs`` (each ``g_r``
    ``[B, N, k]`` or ``None``); ``J [B or 1, N, k, k]``, ``c [B, N, k]``, ``x [B, H]``."""
    N, B, k, H = eps.shape
    if (not compiled_cpu(eps) or k not in (1, 2) or len(gs) > 2 or not eps.is_contiguous()
            or eps.requires_grad):
        return mat_trace_step_torch(eps, J, c, x, gs)
    dt = eps.dtype
    arr = lambda t: t.detach().to(dt).contiguous().numpy()  # noqa: E731
    Jn = J if J.shape[0] in (1, B) else J.expand(B, -1, -1, -1)
    use_g = gs[0] is not None
    two = use_g and len(gs) == 2 and gs[1] is not None
    cn = arr(c.expand(B, N, k))
    g1 = arr(gs[0]) if use_g else cn
    g2 = arr(gs[1]) if two else g1
    G1 = torch.empty(N, H, dtype=dt)
    G2 = torch.empty(N, H, dtype=dt)
    _mat_trace(eps.numpy(), arr(Jn), cn, arr(x), g1, g2, G1.numpy(), G2.numpy(), use_g, two)
    if not use_g:
        return [None] * len(gs)
    return [G1, G2] if len(gs) == 2 and two else ([G1] if len(gs) == 1 else [G1, None])


for _kind in ("lif", "alif", "readout", "lru"):  # the matrix trace of every kind with one or two states per neuron
    neurons.register_backend(_kind, "kernels.trace_numba (compiled matrix trace of the online stream step)",
                             mat_trace_step_numba,
                             test="tests/test_online_partials.py::test_compiled_matrix_trace_equals_the_derived_recursion")


if _HAVE_NUMBA:

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _mat_nest(em, pre, Jc, g, G, use_g):  # pragma: no cover - compiled
        """The two-state matrix trace ``eps[n, b] <- J[n, b] eps[n, b] + (pre[b], 0)`` (``em [N, B, 2,
        H]``, ``Jc [N, B, 4]`` the 2x2 Jacobians) and, with ``use_g``, ``G[n] += sum_b g[b, n] .
        eps[n, b]``. The inner loops run over contiguous rows without branches and add into a local
        copy of the neuron's accumulator row (so the compiler can tell the rows apart and vectorise
        them)."""
        N, B, _, H = em.shape
        acc = np.empty(H, dtype=G.dtype)
        for n in range(N):
            if use_g:
                for h in range(H):
                    acc[h] = G[n, h]
            for b in range(B):
                j00, j01, j10, j11 = Jc[n, b, 0], Jc[n, b, 1], Jc[n, b, 2], Jc[n, b, 3]
                if use_g:
                    q0, q1 = g[b, n, 0], g[b, n, 1]
                    for h in range(H):
                        e0, e1 = em[n, b, 0, h], em[n, b, 1, h]
                        f0 = j00 * e0 + j01 * e1 + pre[b, h]
                        f1 = j10 * e0 + j11 * e1
                        em[n, b, 0, h] = f0
                        em[n, b, 1, h] = f1
                        acc[h] += q0 * f0 + q1 * f1
                else:
                    for h in range(H):
                        e0, e1 = em[n, b, 0, h], em[n, b, 1, h]
                        em[n, b, 0, h] = j00 * e0 + j01 * e1 + pre[b, h]
                        em[n, b, 1, h] = j10 * e0 + j11 * e1
            if use_g:
                for h in range(H):
                    G[n, h] = acc[h]


# --- the chunked block of a one-state layer (plain LIF) ---------------------------------------

if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True)
    def _chunk1(J, V, G, use_g, ev_in, has_ev, carry, gh, Gv, ev_out, P0, phi, b0, ones):  # pragma: no cover - compiled
        """The per-neuron part of :func:`spikerec.hardware.online.traces_base.chunk_contract` for a one-state layer (``k =
        1``: every Jacobian is a number per sample and neuron), over a block ``J, G [K, B, N]``
        with the immediate partials ``V [m, K, B, N]`` of ``m`` per-neuron parameters:

            gh_{K-1} = g_{K-1},  gh_k = g_k + J_{k+1} gh_{k+1}          (``use_g``)
            Gv[j, n] = sum_{k,b} gh_k V[j, k] + sum_b b0 ev_in[j],  b0 = J_0 gh_0
            P0[b, k] = Phi_k = J_{K-1} ... J_{k+1},  phi = Phi_{-1} = J_{K-1} ... J_0     (``carry``)
            ev_out[j] = sum_k Phi_k V[j, k] + phi ev_in[j]

        (``ev_in`` taken as zero without ``has_ev``; ``V[j]`` taken as ones, and not read, where
        ``ones[j]``: a bias's partial). The sums run in float64."""
        K, B, N = J.shape
        m = V.shape[0]
        for j in range(m):
            for n in range(N):
                Gv[j, n] = 0.0
        if use_g:
            for b in range(B):
                for n in range(N):
                    gh[K - 1, b, n] = G[K - 1, b, n]
            for k in range(K - 2, -1, -1):
                for b in range(B):
                    for n in range(N):
                        gh[k, b, n] = G[k, b, n] + J[k + 1, b, n] * gh[k + 1, b, n]
            for b in range(B):
                for n in range(N):
                    b0[b, n] = J[0, b, n] * gh[0, b, n]
            for j in range(m):
                if ones[j]:
                    for k in range(K):
                        for b in range(B):
                            for n in range(N):
                                Gv[j, n] += gh[k, b, n]
                else:
                    for k in range(K):
                        for b in range(B):
                            for n in range(N):
                                Gv[j, n] += gh[k, b, n] * V[j, k, b, n]
                if has_ev:
                    for b in range(B):
                        for n in range(N):
                            Gv[j, n] += b0[b, n] * ev_in[j, b, n]
        if carry:
            for b in range(B):
                for n in range(N):
                    P0[b, K - 1, n] = 1.0
                for k in range(K - 2, -1, -1):
                    for n in range(N):
                        P0[b, k, n] = P0[b, k + 1, n] * J[k + 1, b, n]
                for n in range(N):
                    phi[b, n] = P0[b, 0, n] * J[0, b, n]
            for j in range(m):
                for b in range(B):
                    for n in range(N):
                        ev_out[j, b, n] = phi[b, n] * ev_in[j, b, n] if has_ev else 0.0
                    if ones[j]:
                        for k in range(K):
                            for n in range(N):
                                ev_out[j, b, n] += P0[b, k, n]
                    else:
                        for k in range(K):
                            for n in range(N):
                                ev_out[j, b, n] += P0[b, k, n] * V[j, k, b, n]


if _HAVE_NUMBA:

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _filter_mat(zbar, psi, em, a, u, has_u, G):  # pragma: no cover - compiled
        """One readout-filter step of a weight matrix's trace, in one pass over ``[N, B, H]``:
        ``zbar[n, b, h] <- a zbar + sum_f psi[b, n, f] em[n, b, f, h]`` and, with ``u``,
        ``G[n, h] += sum_b u[b, n] zbar[n, b, h]``."""
        N, B, k, H = em.shape
        for n in range(N):
            for b in range(B):
                p0 = psi[b, n, 0]
                p1 = psi[b, n, 1] if k == 2 else 0.0
                q = u[b, n] if has_u else 0.0
                zr = zbar[n, b]
                for h in range(H):
                    d = p0 * em[n, b, 0, h]
                    if k == 2:
                        d += p1 * em[n, b, 1, h]
                    z = a * zr[h] + d
                    zr[h] = z
                    if has_u:
                        G[n, h] += q * z


def filter_mat_step_numba(zbar, psi, em, a, u, G) -> None:
    """The compiled form of one readout-filter step of a weight matrix's trace (the matrix part of
    :meth:`spikerec.hardware.online.readout_filter.ReadoutFilter.step`, one decay ``a``): ``zbar
    [N, B, H]`` advanced in place, ``G [N, H]`` added to where ``u [B, N]`` is given. ``psi [B, N, k]``
    (``k`` = 1, 2), ``em [N, B, k, H]``: the spike map's partials and the layer's trace; all
    contiguous CPU tensors of one float dtype."""
    dt = zbar.dtype
    has_u = u is not None
    _filter_mat(zbar.numpy(), psi.detach().to(dt).contiguous().numpy(), em.numpy(), float(a),
                u.detach().to(dt).contiguous().numpy() if has_u else zbar[0].numpy(), has_u,
                G.numpy() if has_u else zbar[0].numpy())


for _kind in ("lif", "alif"):  # the readout filter of the spiking layers' weight traces (whole-stack step)
    neurons.register_backend(_kind, "kernels.trace_numba (compiled readout-filter step of a weight trace)",
                             filter_mat_step_numba,
                             test="tests/test_online_whole_stack.py::test_whole_stack_step_equals_bptt_through_the_neuron_steps")

"""Compiled CPU kernels (numba) of the exact online learning of a plain LIF layer (``v_t = alpha
v_{t-1} + I_t - thr z_{t-1}``, or the zero or no reset, :func:`spikerec.neurons.lif.step`): the
partials of :meth:`spikerec.hardware.online.traces_lif.LIFTrace.partials` (``_lif_coefs``,
``_lif_jac``, ``_lif_dtau``, ``_lif_dthr``), the per-neuron and matrix passes of the chunked block
(``_lif_block_vec``, :func:`lif_block_mat_numba`) and the spatial backward of the spikes
(:func:`lif_spatial_numba`), each tested against the torch form.
"""
from __future__ import annotations

import numpy as np
import torch

try:  # numba is optional
    import numba as _nb

    _HAVE_NUMBA = True
except Exception:  # pragma: no cover - depends on the install
    _HAVE_NUMBA = False

from .. import neurons
from . import numpy_dtype
from .trace_numba import as_numpy

__all__ = ["lif_block_workspace", "lif_block_mat_numba", "lif_spatial_numba", "lif_partials_numba", "lif_step_numba"]

if _HAVE_NUMBA:
    from .surrogate_numba import atan_d, fast_sigmoid_d, sd_consts, sd_typed
    from .trace_numba import _chunk1


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _lif_coefs(cn, rd, has_rd, mode, detach_reset, co):  # pragma: no cover - compiled
        """The per-neuron coefficients of the plain LIF partials (:meth:`spikerec.hardware.online.traces_lif.LIFTrace.partials`)
        into ``co [5, N]``: with ``cn`` rows ``alpha``, ``d alpha / d log_tau_mem``, ``thr``, the
        lateral self-weight ``r`` (0 without), ``nd = 0`` with ``detach_reset`` (else 1) and the
        reset mode's flags ``m0`` (subtract) and ``m1`` (zero), the partials at a previous membrane
        ``v``, its spike ``zp = H(v - thr)`` and surrogate derivative ``psi`` are

            J            = alpha - z1 zp + psi (cJ0 + cJ1 v)        (:func:`_lif_jac`)
            d v / d log_tau_mem = dalpha v (1 - m1 zp)              (:func:`_lif_dtau`)
            d v / d thr  = psi (cT0 + cT1 v) - m0 zp                (:func:`_lif_dthr`)

        with ``co = (z1, cJ0, cJ1, cT0, cT1) = (alpha m1, r - thr nd m0, -alpha nd m1,
        thr nd m0 - r, alpha nd m1)``: subtract reset ``v' = alpha v + I - thr z``, zero reset
        ``v' = alpha (1 - z) v + I``, none ``v' = alpha v + I``, with ``d z / d v = psi`` where the
        reset is not detached and ``I`` holding ``r z``. Returns ``(m0, m1)``."""
        dt = co.dtype.type
        zero, one = dt(0), dt(1)
        nd = zero if detach_reset else one
        m0 = one if mode == 0 else zero
        m1 = one if mode == 1 else zero
        for n in range(co.shape[1]):
            a, t = cn[0, n], cn[2, n]
            r = rd[n] if has_rd else zero
            co[0, n] = a * m1
            co[1, n] = -t * nd * m0 + r
            co[2, n] = -a * nd * m1
            co[3, n] = t * nd * m0 - r
            co[4, n] = a * nd * m1
        return m0, m1

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _lif_jac(alpha, co, n, zp, psi, v):  # pragma: no cover - compiled
        """``J`` of :func:`_lif_coefs` for neuron ``n``."""
        return (alpha - co[0, n] * zp) + psi * (co[1, n] + co[2, n] * v)

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _lif_dtau(dalpha, m1, zp, v, one):  # pragma: no cover - compiled
        """``d v / d log_tau_mem`` of :func:`_lif_coefs`."""
        return dalpha * v * (one - m1 * zp)

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _lif_dthr(co, n, m0, zp, psi, v):  # pragma: no cover - compiled
        """``d v / d thr`` of :func:`_lif_coefs` for neuron ``n``."""
        return psi * (co[3, n] + co[4, n] * v) - m0 * zp



if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _lif_block_vec(Vp, G, use_g, cn, rd, has_rd, mode, detach_reset, sur, p1, p2, cols, ev_in, has_ev, carry,
                       need_zp, J, V, zp_out, gh, Gv, ev_out, P0, phi, b0, Gacc):  # pragma: no cover - compiled
        """The partials of :meth:`spikerec.hardware.online.traces_lif.LIFTrace.partials` on a block's previous membranes
        ``Vp [K, B, N]`` (:func:`_lif_coefs` per sample and neuron, the surrogate derivative of
        ``v - thr`` inline: ``sur`` 1 fast sigmoid, 2 arc-tangent), written as ``J [K, B, N]``,
        the traced columns ``V [m, K, B, N]`` (``cols``: 0 ``log_tau_mem``, 1 ``threshold``,
        2 ``bias``: its column of ones is not written) and, with ``need_zp``, the previous spikes ``zp_out`` (the lateral weights'
        presynaptic term); then :func:`_chunk1` on them, and (``use_g``) its per-neuron sums
        added to the accumulator rows ``Gacc[cols[j]]``. ``cn [3, N]``: ``alpha``,
        ``d alpha / d log_tau_mem``, ``thr``; ``rd`` the lateral self-weights (``has_rd``);
        ``G [K, B, N]`` the spatial error (read with ``use_g``); ``ev_in [m, B, N]`` the carried
        traces (``has_ev``) and ``ev_out`` the new ones (written with ``carry``); ``J, V, zp_out,
        gh, Gv, P0, phi, b0`` the arrays of :func:`lif_block_workspace`, the last four as
        :func:`_chunk1` writes them."""
        K, B, N = Vp.shape
        R = K * B
        dt = Vp.dtype.type
        zero, one = dt(0), dt(1)
        s1, s2 = sd_consts(sur, p1, p2)
        sg1, sg2 = dt(s1), dt(s2)
        v2, J2, zp2 = Vp.reshape(R, N), J.reshape(R, N), zp_out.reshape(-1, zp_out.shape[-1])
        psi = np.empty((R, N), dtype=Vp.dtype)
        # the partials of _lif_coefs, one pass per array written (the reset mode outside the loops)
        co = np.empty((5, N), dtype=Vp.dtype)
        m0, m1 = _lif_coefs(cn, rd, has_rd, mode, detach_reset, co)
        thr = cn[2]
        alpha = cn[0]
        dal = cn[1]
        if sur == 1:  # one loop per formula (a branch inside the loop keeps it scalar)
            for i in range(R):
                for n in range(N):
                    psi[i, n] = fast_sigmoid_d(v2[i, n] - thr[n], sg1, sg2, one)
        else:
            for i in range(R):
                for n in range(N):
                    psi[i, n] = atan_d(v2[i, n] - thr[n], sg1, sg2, one)
        for i in range(R):
            for n in range(N):
                v0 = v2[i, n]
                J2[i, n] = _lif_jac(alpha[n], co, n, one if v0 - thr[n] > zero else zero, psi[i, n], v0)
        for j in range(cols.shape[0]):
            c = cols[j]
            Vj = V[j].reshape(R, N)
            if c == 0:
                for i in range(R):
                    for n in range(N):
                        v0 = v2[i, n]
                        Vj[i, n] = _lif_dtau(dal[n], m1, one if v0 - thr[n] > zero else zero, v0, one)
            elif c == 1:
                for i in range(R):
                    for n in range(N):
                        v0 = v2[i, n]
                        Vj[i, n] = _lif_dthr(co, n, m0, one if v0 - thr[n] > zero else zero, psi[i, n], v0)
            # c == 2 (the bias): a column of ones, not written (_chunk1 reads it as ones)
        if need_zp:
            for i in range(R):
                for n in range(N):
                    zp2[i, n] = one if v2[i, n] - thr[n] > zero else zero
        ones = np.empty(max(cols.shape[0], 1), np.bool_)
        ones[:] = False
        for j in range(cols.shape[0]):
            ones[j] = cols[j] == 2
        _chunk1(J, V, G, use_g, ev_in, has_ev, carry, gh, Gv, ev_out, P0, phi, b0, ones)
        if use_g:
            for j in range(cols.shape[0]):
                r = cols[j]
                for n in range(N):
                    Gacc[r, n] += dt(Gv[j, n])

    @_nb.njit(cache=True, nogil=True)
    def _lif_block_mat(e, has_e, use_g, b0, Gm, carry, q, phi):  # pragma: no cover - compiled
        """The carried matrix trace ``e [N, B, 1, H]`` of a block: ``Gm[n] += sum_b b0[b, n] e[n, b]``
        (``use_g``, with the trace before the block), then ``e[n, b] <- phi[b, n] e[n, b] + q[b, n]``
        (``carry``; ``q [B, N, H] = sum_k Phi_k pre_k``, ``e`` taken as zero without ``has_e``)."""
        N, B, _, H = e.shape
        if use_g and has_e:
            for n in range(N):
                for b in range(B):
                    s = b0[b, n]
                    for h in range(H):
                        Gm[n, h] += s * e[n, b, 0, h]
        if carry:
            for n in range(N):
                for b in range(B):
                    if has_e:
                        f = phi[b, n]
                        for h in range(H):
                            e[n, b, 0, h] = f * e[n, b, 0, h] + q[b, n, h]
                    else:
                        for h in range(H):
                            e[n, b, 0, h] = q[b, n, h]


def lif_block_workspace(K: int, B: int, N: int, m: int, dtype) -> dict:
    """The scratch arrays of the chunked LIF block's compiled per-neuron pass
    (:func:`_lif_block_vec`) for blocks of ``K`` steps, batch ``B``, ``N`` neurons and ``m`` traced
    per-neuron parameters (made once per sequence and block size)."""
    npdt = numpy_dtype(dtype)
    t = lambda *shape: torch.empty(shape, dtype=dtype)  # noqa: E731
    ws = {"J": t(K, B, N), "V": t(m, K, B, N), "zp": t(K, B, N), "gh": t(K, B, N), "P0": t(B, K, N), "phi": t(B, N),
          "b0": t(B, N), "Gv": np.empty((max(m, 1), N), dtype=np.float64), "none3": np.zeros((max(m, 1), 1, 1), npdt),
          "z2": np.zeros((1, 1), npdt), "z3": np.zeros((1, 1, 1), npdt), "no_ones": np.zeros(max(m, 1), np.bool_)}
    ws["np"] = {k: v.numpy() for k, v in ws.items() if isinstance(v, torch.Tensor)}
    ws["gh2"], ws["P0T"] = ws["gh"].view(K * B, N), ws["P0"].transpose(1, 2)  # the views the GEMMs take
    return ws


def lif_block_mat_numba(e, has_e: bool, b0, Gm, carry: bool, q, phi, ws: dict) -> None:
    """:func:`_lif_block_mat` on torch tensors: ``e`` (contiguous)
    updated in place, read as zero without ``has_e``; ``Gm`` added to when ``b0`` is given; ``q``,
    ``phi`` used with ``carry``; ``ws`` a :func:`lif_block_workspace` (its placeholders)."""
    z2 = ws["z2"]
    _lif_block_mat(e.numpy(), has_e, b0 is not None, z2 if b0 is None else b0.numpy(),
                   z2 if b0 is None else Gm.numpy(), carry, q.numpy() if carry else ws["z3"],
                   phi.numpy() if carry else z2)



if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _lif_spatial(gout, v, thr, sur, p1, p2, gp, want_sum, sums):  # pragma: no cover - compiled
        """The spatial backward of a plain LIF layer's spikes ``z = H(v - thr)`` over ``[rows, N]``:
        ``gp = gout sigma'(v - thr)`` (the surrogate inline, the loop vectorised) and, with
        ``want_sum``, ``sums[n] = sum_rows gp`` in float64 (the threshold's gradient is minus it)."""
        s1, s2 = sd_consts(sur, p1, p2)
        sg1, sg2, one = gp.dtype.type(s1), gp.dtype.type(s2), gp.dtype.type(1)
        for r in range(v.shape[0]):
            for n in range(gp.shape[1]):
                gp[r, n] = gout[r, n] * sd_typed(v[r, n] - thr[n], sur, sg1, sg2, one)
            if want_sum:
                for n in range(sums.shape[0]):
                    sums[n] += gp[r, n]


def lif_spatial_numba(gout, v, thr, sur: tuple, want_sum: bool):
    """:func:`_lif_spatial` on torch tensors (``gout``, ``v`` ``[rows, N]``; ``thr`` the threshold
    row ``[N]`` as a numpy array of their dtype; ``sur = (code, slope, scale)`` of
    :func:`surrogate_code`); returns ``(gp, sum gp or None)`` (the sum in the arrays' dtype), or
    ``None`` for a surrogate without an inline form (the caller uses torch)."""
    code, p1, p2 = sur
    if not code:
        return None
    R, N = v.shape
    vn = as_numpy(v)
    gp = torch.empty((R, N), dtype=v.dtype)
    sums = np.zeros(N if want_sum else 1, dtype=np.float64)
    _lif_spatial(as_numpy(gout), vn, thr, code, p1, p2, gp.numpy(), bool(want_sum), sums)
    return gp, (torch.from_numpy(sums.astype(vn.dtype)) if want_sum else None)


neurons.register_backend("lif", "kernels.lif_online (compiled spatial backward of the spikes)", lif_spatial_numba,
                         test="tests/test_online_partials.py::test_compiled_spatial_backward_equals_the_output_gradient")


def lif_partials_numba(v0, consts):
    """The partials of a plain LIF layer at the previous membranes ``v0 [B, N]`` as the chunked
    block's compiled pass computes them (``_lif_block_vec`` on a block of one step, without a loss
    or a carry; the stream step's backward takes the same helpers): ``(J [B, N], [d v_t / d p_j
    [B, N] per traced column j])`` (columns ``cols``: 0 ``log_tau_mem``, 1 ``threshold``, 2
    ``bias``, whose partial is one). ``consts = (cn, rd, has_rd, mode, detach_reset, sur, p1, p2,
    cols)`` as the block passes them
    (:meth:`spikerec.hardware.online.traces_lif.LIFTrace.block_contract`)."""
    B, N = v0.shape
    cols = consts[-1]
    ws = lif_block_workspace(1, B, N, len(cols), v0.dtype)
    w = ws["np"]
    Vp = as_numpy(v0).reshape(1, B, N)
    _lif_block_vec(Vp, w["gh"], False, *consts, ws["none3"], False, False, False, w["J"], w["V"], w["zp"], w["gh"],
                   ws["Gv"], ws["z3"], w["P0"], w["phi"], w["b0"], np.zeros((3, N), dtype=Vp.dtype))
    return ws["J"][0].clone(), [torch.ones_like(v0) if c == 2 else ws["V"][j, 0].clone() for j, c in enumerate(cols)]


# --- the whole-stack stream step's forward and backward of one layer (whole_stack) ---------

if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _lif_fwd(x, v, pv, zp, psi, Wt, bias, has_bias, Rt, has_r, alpha, thr, mode, sur, p1, p2, cur,
                 z):  # pragma: no cover - compiled
        """One plain LIF step in place (the equations of :func:`spikerec.neurons.lif.step`, in its
        order of operations): keeps the previous membrane in ``pv``, the previous spikes
        ``H(v - thr)`` in ``zp`` and their surrogate derivative in ``psi`` (for the trace step),
        writes the new spikes; ``mode`` 0 subtract, 1 zero, 2 no reset. The input current
        ``x W^T`` and the lateral one ``z_{t-1} R^T`` are GEMMs (``cur [B, N]`` scratch)."""
        B, N = v.shape
        zero, one = v.dtype.type(0), v.dtype.type(1)
        s1, s2 = sd_consts(sur, p1, p2)
        sg1, sg2 = v.dtype.type(s1), v.dtype.type(s2)
        for b in range(B):
            for n in range(pv.shape[1]):
                pv[b, n] = v[b, n]
            for n in range(zp.shape[1]):
                zp[b, n] = one if v[b, n] - thr[n] > zero else zero
            for n in range(psi.shape[1]):
                psi[b, n] = sd_typed(v[b, n] - thr[n], sur, sg1, sg2, one)
        np.dot(x, Wt, cur)
        if has_r:
            np.dot(zp, Rt, z)  # z: scratch until the spikes are written below
            for b in range(B):
                for n in range(cur.shape[1]):
                    cur[b, n] += z[b, n]
        if has_bias:
            for b in range(B):
                for n in range(cur.shape[1]):
                    cur[b, n] = cur[b, n] + bias[n]
        for b in range(B):
            if mode == 0:
                for n in range(v.shape[1]):
                    v[b, n] = (alpha[n] * pv[b, n] + cur[b, n]) - thr[n] * zp[b, n]
            elif mode == 1:
                for n in range(v.shape[1]):
                    v[b, n] = alpha[n] * ((one - zp[b, n]) * pv[b, n]) + cur[b, n]
            else:
                for n in range(v.shape[1]):
                    v[b, n] = alpha[n] * pv[b, n] + cur[b, n]
            for n in range(z.shape[1]):
                z[b, n] = one if v[b, n] - thr[n] > zero else zero

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _lif_bwd(gout, use_g, x, v, thr, sur, p1, p2, W, acc_thr, has_thr, gp, gin, need_gin, pv, psi, zp,
                 cn, cols, ev, has_w, has_r, G_vec, Rd, has_rd, mode, detach_reset,
                 Jbuf, gbuf, xbuf, zbuf, co, lslot):  # pragma: no cover - compiled
        """The spatial backward of a plain LIF layer's spikes ``z = H(v - thr)`` (``gp = gout
        sigma'(v - thr)``, ``dthr -= sum gp``, ``gin = gp W``, one GEMM), then its trace step
        (the recursions of :func:`spikerec.hardware.online.traces_base.stream_step` on the partials of
        :meth:`spikerec.hardware.online.traces_lif.LIFTrace.partials`, compiled as :func:`spikerec.kernels.lif_online._lif_coefs`): the
        stacked per-neuron traces ``ev [B, N, 1, m]`` (columns ``cols`` of ``cn``'s rows:
        0 ``log_tau_mem``, 1 ``threshold``, 2 ``bias``) with ``G += g . e``. The input and
        lateral matrix traces ``[N, B, 1, H]`` (``e <- J e + pre``, ``G += g . e``) are
        deferred: this step's ``J``, ``g`` (zero without a loss) and presynaptic rows go to row
        ``lslot[0]`` of the step buffers, applied in closed form every ``LIF_DEFER`` steps
        (:meth:`spikerec.hardware.online.whole_stack.WholeStackStep.flush_lif`). The partials' per-neuron coefficients go to the scratch
        ``co [5, N]``; one pass per array written, so that each vectorises."""
        slot = lslot[0]  # the row of the step buffers this step writes
        B, N = v.shape
        zero, one = v.dtype.type(0), v.dtype.type(1)
        if use_g:
            s1, s2 = sd_consts(sur, p1, p2)
            sg1, sg2 = v.dtype.type(s1), v.dtype.type(s2)
            for b in range(B):
                for n in range(gp.shape[1]):
                    gp[b, n] = gout[b, n] * sd_typed(v[b, n] - thr[n], sur, sg1, sg2, one)
                if has_thr:
                    for n in range(acc_thr.shape[0]):
                        acc_thr[n] -= gp[b, n]
            if need_gin:
                np.dot(gp, W, gin)
        m0, m1 = _lif_coefs(cn, Rd, has_rd, mode, detach_reset, co)
        for b in range(B):
            for n in range(Jbuf.shape[2]):
                Jbuf[slot, b, n] = _lif_jac(cn[0, n], co, n, zp[b, n], psi[b, n], pv[b, n])
        for j in range(cols.shape[0]):
            c = cols[j]
            if c == 0:
                for b in range(B):
                    for n in range(ev.shape[1]):
                        ev[b, n, 0, j] = Jbuf[slot, b, n] * ev[b, n, 0, j] + _lif_dtau(cn[1, n], m1, zp[b, n], pv[b, n], one)
            elif c == 1:
                for b in range(B):
                    for n in range(ev.shape[1]):
                        ev[b, n, 0, j] = (Jbuf[slot, b, n] * ev[b, n, 0, j]
                                          + _lif_dthr(co, n, m0, zp[b, n], psi[b, n], pv[b, n]))
            else:
                for b in range(B):
                    for n in range(ev.shape[1]):
                        ev[b, n, 0, j] = Jbuf[slot, b, n] * ev[b, n, 0, j] + one
            if use_g:
                for b in range(B):
                    for n in range(G_vec.shape[1]):
                        G_vec[c, n] += gp[b, n] * ev[b, n, 0, j]
        if has_w or has_r:
            for b in range(B):
                for n in range(gbuf.shape[2]):
                    gbuf[slot, b, n] = gp[b, n] if use_g else zero
        if has_w:
            for b in range(B):
                for h in range(xbuf.shape[2]):
                    xbuf[slot, b, h] = x[b, h]
        if has_r:
            for b in range(B):
                for n in range(zbuf.shape[2]):
                    zbuf[slot, b, n] = zp[b, n]


_TEST = "tests/test_online_partials.py::test_compiled_partials_equal_derived_ones"
neurons.register_backend("lif", "kernels.lif_online (compiled partials of the online stream step and block)",
                         lif_partials_numba, test=_TEST)


def _step_operands(params, state_v, x_t):
    """The float operands of a compiled forward step: ``(as_np, B, N, x, Wt, bias, has_bias, Rt, has_r)``
    (absent ``bias`` and ``recurrent_weight`` as zero placeholders)."""
    dt = state_v.dtype
    B, N = state_v.shape
    as_np = lambda t: t.detach().to(dt).contiguous().numpy()  # noqa: E731
    has_b, has_r = params.bias is not None, params.recurrent_weight is not None
    return (as_np, B, N, as_np(x_t), as_np(params.weight.t()), as_np(params.bias) if has_b else np.zeros(N, as_np(x_t).dtype),
            has_b, as_np(params.recurrent_weight.t()) if has_r else np.zeros((N, N), as_np(x_t).dtype), has_r)


def lif_step_numba(params, state, x_t, options):
    """One plain LIF step (:func:`spikerec.neurons.lif.step` in float arithmetic, without a synaptic
    current, the bias into the current) by the compiled forward of the whole-stack stream step
    (``_lif_fwd``); returns ``(z_t, LIFState(v_t))`` as new tensors."""
    from ..neurons import lif as _lif
    from .lif_sequence_numba import RESET_CODES, surrogate_code

    if params.log_tau_syn is not None or options.bias_into != "current":
        raise ValueError("lif_step_numba: expected a plain LIF (no log_tau_syn) with bias_into='current'")
    as_np, B, N, x, Wt, bias, has_b, Rt, has_r = _step_operands(params, state.v, x_t)
    alpha = _lif.decays(params, options)[0]
    v = state.v.detach().clone().contiguous()
    pv, zp, psi, cur, z = (np.empty((B, N), dtype=x.dtype) for _ in range(5))
    code, p1, p2 = surrogate_code(options.surrogate)
    _lif_fwd(x, v.numpy(), pv, zp, psi, Wt, bias, has_b, Rt, has_r, as_np(alpha.expand(N)),
             as_np(params.threshold.expand(N)), RESET_CODES[options.reset], code, p1, p2, cur, z)
    return torch.from_numpy(z), _lif.LIFState(v)


neurons.register_backend("lif", "kernels.lif_online (compiled forward of the online stream step)", lif_step_numba,
                         test="tests/test_online_partials.py::test_compiled_forward_steps_equal_the_neuron_steps")

"""The numba kernels behind :mod:`spikerec.kernels.alif_sequence_numba` (imported on first use).

Forward and reverse steps of the ALIF recurrence; the equations are in
:mod:`spikerec.kernels.alif_sequence`. Each call runs the steps ``t0 <= t < t1`` (forward)
or ``t1 > t >= t0`` (reverse) as one pass over the ``[B, N]`` state per step; the caller
adds the recurrent products (torch matmuls) between single-step calls of a recurrent
layer, and runs a feed-forward layer in one call. Compiled on first call, cached on disk.
"""
import numpy as np
from numba import njit

from .surrogate_numba import atan_d, fast_sigmoid_d, sd_consts, sd_typed


@njit(cache=True, nogil=True, error_model="numpy")
def fwd_steps(I, R_in, v_io, a_io, z_io, alpha, rho, b, beta, t0, t1, V, A, Zf, Zb, Rt, rec_inline):  # pragma: no cover
    """Steps ``t0..t1-1`` from the state ``(v, a, z)`` (updated in place); ``R_in`` is added to the
    input current of every step (the recurrent input ``W_rec z_{t-1}`` of a one-step call). With
    ``rec_inline`` the recurrent input is computed here at every step instead, as the sum of the
    rows ``Rt[j]`` (``Rt = W_rec^T``) of the neurons that spiked (for small layers, where a matmul
    call per step costs more than the sum). The state lives in one local array and every loop
    indexes the array it writes, with that array's bounds: the compiler can then tell the rows
    apart and vectorise the loops (17 % faster than row views of seven arrays, bit-identical)."""
    B, N = v_io.shape
    st = np.empty((3, B, N), dtype=v_io.dtype)  # v, a, z
    for j in range(B):
        for n in range(N):
            st[0, j, n] = v_io[j, n]
            st[1, j, n] = a_io[j, n]
            st[2, j, n] = z_io[j, n]
    R = R_in.copy()
    one = np.ones(1, dtype=v_io.dtype)[0]  # constants of the tensors' dtype: float32 stays float32
    zero = one - one
    one_m_rho = one - rho
    for t in range(t0, t1):
        if rec_inline:
            for j in range(B):
                for n in range(R.shape[1]):
                    R[j, n] = zero
                for i in range(N):
                    if st[2, j, i] != zero:
                        for n in range(R.shape[1]):
                            R[j, n] += Rt[i, n]
        for j in range(B):
            for n in range(st.shape[2]):
                zp = st[2, j, n]
                aa = rho[n] * st[1, j, n] + one_m_rho[n] * zp
                th = b[n] + beta[n] * aa
                vv = (I[t, j, n] + R[j, n]) + alpha[n] * st[0, j, n]
                vv = vv - th * zp
                st[0, j, n] = vv
                st[1, j, n] = aa
                st[2, j, n] = one if vv > th else zero
        for j in range(B):
            for n in range(A.shape[2]):
                A[t, j, n] = st[1, j, n]
            for n in range(V.shape[2]):
                V[t, j, n] = st[0, j, n]
            for n in range(Zf.shape[2]):
                Zf[t, j, n] = st[2, j, n]
            for n in range(Zb.shape[2]):
                Zb[t, j, n] = 1 if st[2, j, n] != zero else 0
    for j in range(B):
        for n in range(N):
            v_io[j, n] = st[0, j, n]
            a_io[j, n] = st[1, j, n]
            z_io[j, n] = st[2, j, n]


@njit(cache=True, nogil=True, error_model="numpy")
def bwd_steps(gZ, SD, sur_code, p1, p2, V, A, Zb, v0, a0, z0, alpha, rho, b, beta, detach, t0, t1,
              gv, ga, carry, acc_alpha, acc_rho, acc_b, acc_beta, G):  # pragma: no cover - compiled
    """Reverse steps ``t1-1..t0``. ``gv, ga`` hold ``dL/dv_{t+1}, dL/da_{t+1}`` (at ``t = T-1``:
    ``dL/dv_T, dL/da_T``, read undecayed), ``carry`` the gradient reaching ``z_t`` from step
    ``t+1``; on return they hold ``dL/dv_t0, dL/da_t0`` and the carry into ``z_{t0-1}``, without
    its recurrent part, which the caller adds (``dL/dv_t0 W_rec``). The per-element parameter
    gradient sums ``acc_*`` are accumulated in place; ``dL/dv_t`` is written to ``G[t]``."""
    T, B, N = V.shape
    one = np.ones(1, dtype=V.dtype)[0]
    sd = np.empty((B, N), dtype=V.dtype)
    c1, c2 = sd_consts(sur_code, p1, p2)
    theta = np.empty((B, N), dtype=V.dtype)
    zprev = np.empty((B, N), dtype=V.dtype)
    ones = np.ones(N, dtype=V.dtype)
    neg_beta = -beta
    one_m_rho = one - rho
    for t in range(t1 - 1, t0 - 1, -1):
        Vt, At, gZt, Gt = V[t], A[t], gZ[t], G[t]
        if t > 0:
            Vp, Ap, Zp = V[t - 1], A[t - 1], Zb[t - 1]
        else:
            Vp, Ap, Zp = v0, a0, z0
        al = ones if t == T - 1 else alpha
        ro = ones if t == T - 1 else rho
        for j in range(B):
            for n in range(N):
                theta[j, n] = b[n] + beta[n] * At[j, n]
                zprev[j, n] = one if Zp[j, n] else one - one
        if sur_code == 0:
            sd[:, :] = SD[t]
        elif sur_code == 1:  # one loop per formula (a branch inside the loop keeps it scalar)
            for j in range(B):
                for n in range(N):
                    sd[j, n] = fast_sigmoid_d(Vt[j, n] - theta[j, n], c1, c2, one)
        else:
            for j in range(B):
                for n in range(N):
                    sd[j, n] = atan_d(Vt[j, n] - theta[j, n], c1, c2, one)
        for j in range(B):
            gvj, gaj, cj, sdj, thj, zpj = gv[j], ga[j], carry[j], sd[j], theta[j], zprev[j]
            Gj, gZj, Atj, Vpj, Apj = Gt[j], gZt[j], At[j], Vp[j], Ap[j]
            acc_a, acc_r, acc_bb, acc_be = acc_alpha[j], acc_rho[j], acc_b[j], acc_beta[j]
            for n in range(N):
                gu = sdj[n] * (gZj[n] + cj[n])
                g = gu + al[n] * gvj[n]
                gaa = ro[n] * gaj[n] + neg_beta[n] * gu
                gth = -gu
                if not detach:  # the reset term theta_t z_{t-1} carries a gradient
                    gaa -= beta[n] * zpj[n] * g
                    gth -= g * zpj[n]
                Gj[n] = g
                gvj[n] = g
                gaj[n] = gaa
                acc_a[n] += g * Vpj[n]
                acc_r[n] += gaa * (Apj[n] - zpj[n])
                acc_bb[n] += gth
                acc_be[n] += gth * Atj[n]
                c = one_m_rho[n] * gaa
                if not detach:
                    c -= g * thj[n]
                cj[n] = c


@njit(cache=True, nogil=True, error_model="numpy")
def bwd_initial(SD0, sur_code, p1, p2, v0, a0, alpha, rho, b, beta, gv, ga, carry, acc_alpha, acc_rho, acc_b,
                acc_beta, gv0, ga0, g_alpha, g_rho, g_b, g_beta):  # pragma: no cover - compiled
    """The initial state's share (``z_{-1} = H(v0 - b - beta a0)`` receives ``carry``) and the
    per-neuron parameter gradients (sums over the batch, in float64)."""
    B, N = v0.shape
    c1, c2 = sd_consts(sur_code, p1, p2)
    g_alpha[:] = 0.0
    g_rho[:] = 0.0
    g_b[:] = 0.0
    g_beta[:] = 0.0
    for j in range(B):
        for n in range(N):
            th0 = b[n] + beta[n] * a0[j, n]
            if sur_code == 0:
                sd0 = SD0[j, n]
            else:
                sd0 = sd_typed(v0[j, n] - th0, sur_code, c1, c2, 1.0)
            gu0 = carry[j, n] * sd0
            gv0[j, n] = alpha[n] * gv[j, n] + gu0
            ga0[j, n] = rho[n] * ga[j, n] - beta[n] * gu0
            g_alpha[n] += acc_alpha[j, n]
            g_rho[n] += acc_rho[j, n]
            g_b[n] += acc_b[j, n] - gu0
            g_beta[n] += acc_beta[j, n] - gu0 * a0[j, n]

"""Fused time loop of the LIF neuron with a hand-written backward.

The input currents of all T steps are computed outside (one matmul); this function
runs the recurrence

    J_t   = I_t + W_rec z_{t-1}                       (recurrent layers only)
    i_t   = alpha_s i_{t-1} + J_t                     (current-based synapse, optional)
    v_t   = alpha v_{t-1} + i_t - thr z_{t-1}         (reset "subtract")
          = alpha (1 - z_{t-1}) v_{t-1} + i_t         (reset "zero")
          = alpha v_{t-1} + i_t                       (reset "none")
    z_t   = H(v_t - thr)

with ``z_{-1} = H(v_{-1} - thr)``, and its exact surrogate-gradient backward. The backward
evaluates every surrogate derivative in one vectorised call before its (reverse) loop,
and does the parameter reductions after it, so each step costs a handful of
element-wise ops. It equals autograd through :meth:`LIF.step` (tests check values and
gradients in float64).
"""
from __future__ import annotations

import torch

from ..surrogate import heaviside


class LIFSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, I, v0, i0, alpha, alpha_s, thr, w_rec, surrogate, reset, detach_reset):
        T = I.shape[0]
        V = torch.empty_like(I)
        Zb = torch.empty(I.shape, dtype=torch.bool, device=I.device)
        syn = i0 is not None
        Iseq = torch.empty_like(I) if syn else None
        v = v0.clone()
        i = i0.clone() if syn else None
        z = heaviside(v0 - thr)
        z_init = z
        w_t = w_rec.t() if w_rec is not None else None
        neg_thr = -thr
        for t in range(T):
            J = I[t] if w_t is None else torch.addmm(I[t], z, w_t)
            if syn:
                torch.addcmul(J, alpha_s, i, out=Iseq[t])
                i = J = Iseq[t]
            if reset == "subtract":
                torch.addcmul(J, alpha, v, out=V[t])
                V[t].addcmul_(z, neg_thr)
            elif reset == "zero":
                torch.addcmul(J, alpha * (1.0 - z), v, out=V[t])
            else:
                torch.addcmul(J, alpha, v, out=V[t])
            v = V[t]
            torch.gt(v, thr, out=Zb[t])
            z = Zb[t].to(I.dtype)
        Z = Zb.to(I.dtype)
        ctx.save_for_backward(I, v0, i0, alpha, alpha_s, thr, w_rec, V, Z, Iseq, z_init)
        ctx.surrogate, ctx.reset, ctx.detach_reset = surrogate, reset, detach_reset
        i_final = i.clone() if syn else None
        return Z, v.clone(), i_final

    @staticmethod
    def backward(ctx, gZ, gvT, giT):
        I, v0, i0, alpha, alpha_s, thr, w_rec, V, Z, Iseq, z_init = ctx.saved_tensors
        sur, reset, detach = ctx.surrogate, ctx.reset, ctx.detach_reset
        T = I.shape[0]
        syn = i0 is not None
        if gZ is None:
            gZ = torch.zeros_like(Z)
        SD = sur.derivative(V - thr)  # all surrogate derivatives at once
        Zprev = torch.cat([z_init.unsqueeze(0), Z[:-1]], 0)
        Vprev = torch.cat([v0.unsqueeze(0), V[:-1]], 0) if (ctx.needs_input_grad[3] or reset == "zero") else None
        carries = (w_rec is not None) or (not detach and reset != "none")
        gv = gvT.clone() if gvT is not None else torch.zeros_like(v0)
        gi = (giT.clone() if giT is not None else torch.zeros_like(v0)) if syn else None
        G = torch.empty_like(I)  # dL/dv_t (total)
        DJ = torch.empty_like(I) if syn else G  # dL/dJ_t
        GZ = torch.empty_like(I) if carries else gZ  # dL/dz_t (total)
        decay = alpha * (1.0 - Zprev) if reset == "zero" else None
        carry = None
        if not carries and not syn and reset != "zero":
            # pure reverse linear recurrence: G_t = gZ_t SD_t + alpha G_{t+1}
            GU = gZ * SD
            torch.add(GU[T - 1], gv, out=G[T - 1])
            for t in range(T - 2, -1, -1):
                torch.addcmul(GU[t], alpha, G[t + 1], out=G[t])
            gv = alpha * G[0]
            T_loop = -1
        else:
            T_loop = T - 1
        for t in range(T_loop, -1, -1):
            gz = gZ[t] if carry is None else gZ[t] + carry
            if carries:
                GZ[t] = gz
            gv = torch.addcmul(gv, gz, SD[t])
            G[t] = gv
            if syn:
                gi = gi + gv
                DJ[t] = gi
            if carries:
                carry = None
                if not detach and reset == "subtract":
                    carry = -thr * gv
                elif not detach and reset == "zero":
                    carry = -alpha * Vprev[t] * gv
                if w_rec is not None:
                    c = DJ[t] @ w_rec
                    carry = c if carry is None else carry + c
            if syn:
                gi = alpha_s * gi
            gv = decay[t] * gv if decay is not None else alpha * gv
        # z_{-1} = H(v0 - thr) receives `carry`; parameter reductions only where needed
        need = ctx.needs_input_grad
        g_thr = -(GZ * SD).sum((0, 1)) if need[5] else None
        if carry is not None:
            gu0 = carry * sur.derivative(v0 - thr)
            gv = gv + gu0
            if need[5]:
                g_thr = g_thr - gu0.sum(0)
        g_alpha = None
        if need[3]:
            if reset == "zero":
                g_alpha = (G * (1.0 - Zprev) * Vprev).sum((0, 1))
            else:
                g_alpha = (G * Vprev).sum((0, 1))
        if reset == "subtract" and need[5]:
            g_thr = g_thr - (G * Zprev).sum((0, 1))
        g_alpha_s = None
        if syn and need[4]:
            Iprev = torch.cat([i0.unsqueeze(0), Iseq[:-1]], 0)
            GI = DJ  # dL/di_t equals dL/dJ_t
            g_alpha_s = (GI * Iprev).sum((0, 1))
        g_w = None
        if w_rec is not None and need[6]:
            N = I.shape[-1]
            g_w = DJ.reshape(-1, N).t() @ Zprev.reshape(-1, N)
        return (DJ, gv, gi, g_alpha, g_alpha_s, g_thr, g_w, None, None, None)


class ALIFSequence(torch.autograd.Function):
    """ALIF recurrence of the LSC code form (digest 002 §5.1):

        z_{t-1} = H(v_{t-1} - b - beta a_{t-1})
        a_t     = rho a_{t-1} + (1 - rho) z_{t-1}
        theta_t = b + beta a_t
        v_t     = alpha v_{t-1} + I_t + W_rec z_{t-1} - theta_t z_{t-1}
        z_t     = H(v_t - theta_t)

    with the reset term stop-gradient when ``detach_reset`` (as the official code).
    """

    @staticmethod
    def forward(ctx, I, v0, a0, alpha, rho, b, beta, w_rec, surrogate, detach_reset):
        T = I.shape[0]
        V = torch.empty_like(I)
        A = torch.empty_like(I)
        Z = torch.empty_like(I)
        v, a = v0.clone(), a0.clone()
        z = heaviside(v0 - (b + beta * a0))
        z_init = z
        w_t = w_rec.t() if w_rec is not None else None
        for t in range(T):
            a = z + rho * (a - z)
            theta = b + beta * a
            J = I[t] if w_t is None else torch.addmm(I[t], z, w_t)
            v = torch.addcmul(J, alpha, v) - theta * z
            z = heaviside(v - theta)
            V[t], A[t], Z[t] = v, a, z
        ctx.save_for_backward(I, v0, a0, alpha, rho, b, beta, w_rec, V, A, Z, z_init)
        ctx.surrogate, ctx.detach_reset = surrogate, detach_reset
        return Z, v, a

    @staticmethod
    def backward(ctx, gZ, gvT, gaT):
        I, v0, a0, alpha, rho, b, beta, w_rec, V, A, Z, z_init = ctx.saved_tensors
        sur, detach = ctx.surrogate, ctx.detach_reset
        T = I.shape[0]
        if gZ is None:
            gZ = torch.zeros_like(Z)
        THETA = b + beta * A
        SD = sur.derivative(V - THETA)
        Zprev = torch.cat([z_init.unsqueeze(0), Z[:-1]], 0)
        Vprev = torch.cat([v0.unsqueeze(0), V[:-1]], 0)
        Aprev = torch.cat([a0.unsqueeze(0), A[:-1]], 0)
        gv = gvT.clone() if gvT is not None else torch.zeros_like(v0)
        ga = gaT.clone() if gaT is not None else torch.zeros_like(v0)
        G = torch.empty_like(I)
        GA = torch.empty_like(I)
        GTH = torch.empty_like(I)
        one_m_rho = 1.0 - rho
        carry = None
        for t in range(T - 1, -1, -1):
            gz = gZ[t] if carry is None else gZ[t] + carry
            gu = gz * SD[t]
            gv = gv + gu
            G[t] = gv
            if detach:
                gth = -gu
                carry = None
            else:
                gth = -gu - gv * Zprev[t]
                carry = -gv * THETA[t]
            GTH[t] = gth
            ga = torch.addcmul(ga, beta, gth)
            GA[t] = ga
            c = one_m_rho * ga
            carry = c if carry is None else carry + c
            if w_rec is not None:
                carry = carry + gv @ w_rec
            ga = rho * ga
            gv = alpha * gv
        # z_{-1} = H(v0 - b - beta a0)
        sd0 = sur.derivative(v0 - (b + beta * a0))
        gu0 = carry * sd0
        gv = gv + gu0
        gth0 = -gu0
        ga = ga + beta * gth0
        g_alpha = (G * Vprev).sum((0, 1))
        g_rho = (GA * (Aprev - Zprev)).sum((0, 1))
        g_b = GTH.sum((0, 1)) + gth0.sum(0)
        g_beta = (GTH * A).sum((0, 1)) + (gth0 * a0).sum(0)
        g_w = None
        if w_rec is not None:
            N = I.shape[-1]
            g_w = G.reshape(-1, N).t() @ Zprev.reshape(-1, N)
        return (G, gv, ga, g_alpha, g_rho, g_b, g_beta, g_w, None, None)

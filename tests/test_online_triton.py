"""The Triton forms of the online learner's block (the reverse filter and Jacobian products
``kernels.trace_triton.block_filter``, the LIF/ALIF forward kernels of the block scans) against
the torch forms and the reference block, on the CPU under ``TRITON_INTERPRET=1``.

The interpreter must be switched on before triton is imported, so the checks run in a fresh
interpreter process (numba hidden there, as on the device the Triton forms serve)."""
import os
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

BLOCK_SCRIPT = textwrap.dedent(
    r"""
    import os, sys
    assert os.environ["TRITON_INTERPRET"] == "1"
    sys.modules["numba"] = None  # the device the Triton forms serve: no compiled CPU kernels
    sys.path[:0] = [os.environ["ROOT"]]
    import collections, traceback
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    seed = int(os.environ.get("SEED", "0"))
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    from spikerec.kernels import alif_triton, lif_triton, trace_numba, trace_triton
    from spikerec.hardware.online import traces
    assert not trace_numba.numba_available() and trace_triton.triton_available(torch.zeros(1))
    close = lambda a, b: a.shape == b.shape and torch.allclose(a, b, rtol=1e-12, atol=1e-12)

    # 1. the block's reverse filter and Jacobian products == a plain reverse loop and product loop
    def reverse_loop(J, G):
        K, B, N, k = G.shape
        Je, GH = J.expand(K, B, N, k, k), G.clone()
        for t in range(K - 2, -1, -1):  # gh_t = g_t + J_{t+1}^T gh_{t+1}
            GH[t] += (Je[t + 1].transpose(-1, -2) @ GH[t + 1][..., None])[..., 0]
        return GH

    def product_loop(J, K, B, N, k):
        Je = J.expand(K, B, N, k, k)
        PH, phi = torch.empty(K, B, N, k, k), torch.eye(k).expand(B, N, k, k)
        for t in range(K - 1, -1, -1):  # Phi_t = J_{K-1} ... J_{t+1}, phi = Phi_0 J_0
            PH[t] = phi
            phi = phi @ Je[t]
        return PH, phi

    # J per step [K, B], broadcast over the batch [K, 1], constant [1, 1]; B * N > 128: several programs
    for k, K, B, N, jk, jb in [(1, 7, 3, 5, 1, 1), (2, 9, 2, 6, 1, 1), (2, 4, 3, 4, 1, 0), (1, 6, 2, 3, 1, 0),
                               (2, 5, 3, 50, 0, 0), (1, 8, 3, 50, 0, 0), (1, 1, 2, 3, 1, 1)]:
        J = r(K if jk else 1, B if jb else 1, N, k, k) * 0.7
        G = r(K, B, N, k)
        GH0, (PH0, phi0) = reverse_loop(J, G), product_loop(J, K, B, N, k)
        GH, PH, phi = trace_triton.block_filter(J, G, True)
        assert close(GH, GH0), ("GH", k, jk, jb)
        assert close(PH, PH0), ("PH", k, jk, jb)
        assert close(phi, phi0), ("phi", k, jk, jb)
        GH, PH, phi = trace_triton.block_filter(J, G, False)
        assert close(GH, GH0) and PH is None and phi is None
        if jk:  # no errors (a block without a loss): the products only, J with all K steps
            GH, PH, phi = trace_triton.block_filter(J, None, True)  # the batch of J's
            assert GH is None and close(PH, PH0[:, : J.shape[1]]) and close(phi, phi0[: J.shape[1]]), ("powers", k, jb)

    # ... and the block's per-lane pass with it (fused) == its torch form (traces.lanes_torch, fused=False)
    for k, K, B, N, m, R in [(1, 6, 3, 5, 3, 1), (2, 7, 2, 4, 2, 2), (2, 5, 3, 50, 1, 0)]:
        for use_J, carry, with_g, per_lane in [(True, True, True, False), (True, True, False, False),
                                               (True, False, True, True), (False, True, True, False)]:
            J = r(K, B, k * k, N) * 0.7
            V, c, e_in = r(m, K, B, k, N), r(K, B, k, N), r(m, B, k, N)
            G = r(K, B, k, N) if with_g else None
            Cr = r(R, K, B, k, N) if R else None
            args = (J, V, G, c, e_in, use_J, carry, per_lane)
            calls = []
            real = traces.block_filter
            traces.block_filter = lambda *a: calls.append(1) or real(*a)
            got = traces.lanes_torch(*args, fused=True, Cr=Cr, need_P=True)
            traces.block_filter = real
            ref = traces.lanes_torch(*args, fused=False, Cr=Cr, need_P=True)
            if use_J:  # the filter and the products in one launch
                assert calls == [1], (k, carry, with_g)
            for name, a, b in zip(("GH", "A", "Gv", "b0", "P", "phi", "e_out"), got, ref):
                assert (a is None) == (b is None), name
                assert a is None or close(a, b), (name, k, use_J, carry, with_g)

    # 2. the block scans on the layers' Triton kernels == a loop of the definition's step
    from spikerec.hardware.online.kinds import online_trace
    from spikerec.layers import ALIF, LIF
    from spikerec.neurons import alif as _alif
    from spikerec.neurons import lif as _lif
    calls = collections.Counter()
    def spy(mod, name):
        real = getattr(mod, name)
        setattr(mod, name, lambda *a, **kw: calls.update([name]) or real(*a, **kw))
    spy(lif_triton, "lif_forward"); spy(alif_triton, "alif_forward"); spy(traces, "block_filter")
    K, B, H, N = 6, 3, 4, 5
    cases = [(LIF, _lif, "lif_forward", dict(reset=rs, threshold=0.5)) for rs in ("subtract", "zero", "none")]
    cases += [(LIF, _lif, "lif_forward", dict(reset="subtract", tau_syn=3.0, threshold=0.5))]
    cases += [(ALIF, _alif, "alif_forward", dict(recurrent=rec, tau_adapt=10.0, b=0.5, beta=0.5))
              for rec in (False, True)]
    for cls, mod, kernel, kw in cases:
        cell = cls(H, N, tau_mem=5.0, **kw)
        with torch.no_grad():
            for p in cell.parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
        tr = online_trace(cell, "full", 0)
        tr.prepare()
        s = cell.initial_state(B)
        s = type(s)(*(torch.randn(f.shape, generator=g) + 0.8 for f in s))
        xs = torch.rand(K, B, H, generator=g) * 2
        before = calls[kernel]
        prev, last, new, out = tr.scan_block(xs, s)
        assert calls[kernel] == before + 1, (kernel, kw)
        params, opts = cell.params(), cell.options()
        for t in range(K):
            for f in range(len(s)):
                assert close(prev[f].view(K, B, N)[t], s[f].detach()), (kw, t, f)
            z, s = mod.step(params, s, xs[t], opts)
            for f in range(len(s)):
                assert close(new[f].view(K, B, N)[t], s[f].detach()), (kw, t, f)
            assert torch.equal(out.view(K, B, N)[t], z.detach()), (kw, t)
        for a, b in zip(last, s):
            assert close(a, b.detach()), kw
        assert 0 < float(out.mean()) < 1, kw

    # 3. the chunked learner on the Triton forms == the reference block (float64). On CUDA the compiled
    # backend's per-lane pass takes the Triton filter (traces._run_lanes: fused = tr.compiled and J.is_cuda);
    # here, on CPU tensors, that choice is made for the compiled backend's runs.
    FUSE = [False]
    real_lanes = traces.lanes_torch
    def lanes(J, V, G, c, e_in, use_J, carry, per_lane=False, fused=False, Cr=None, need_P=False):
        return real_lanes(J, V, G, c, e_in, use_J, carry, per_lane, fused or FUSE[0], Cr, need_P)
    traces.lanes_torch = lanes
    from spikerec.hardware.online import OnlineLearner, mse_loss, mse_step_loss
    from spikerec.layers import LeakyReadout
    from spikerec.models import RecurrentStack
    torch.manual_seed(seed)
    stacks = [[LIF(3, 5, tau_mem=5.0, reset="zero"), LIF(5, 4, tau_mem=4.0)],
              [ALIF(3, 5, recurrent=True, tau_mem=5.0, tau_adapt=10.0, b=0.3, beta=0.5), ALIF(5, 4, tau_mem=5.0)]]
    for cells in stacks:
        kernel = type(cells[0]).__name__.lower() + "_forward"
        for tau in (None, 3.0):
            model = RecurrentStack(cells, LeakyReadout(cells[-1].output_size, 2, tau=tau))
            x, tgt = torch.rand(13, 2, 3, generator=g) * 3, torch.randn(13, 2, 2, generator=g)
            runs = []
            for backend in ("auto", "reference"):
                FUSE[0] = backend == "auto"
                model.zero_grad()
                before = dict(calls)
                lr = OnlineLearner(model, mode="chunked", chunk=4, backend=backend)
                L = lr.backward(x, tgt, mse_loss)
                ran = {n for n in calls if calls[n] > before.get(n, 0)}
                assert lr._compiled_block == (backend == "auto")
                assert ran == ({"block_filter", kernel} if backend == "auto" else set()), (backend, ran)
                grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
                # the step API: windows of 4 rows worked as blocks, a reset of one sample mid-stream
                model.zero_grad()
                before = dict(calls)
                lr = OnlineLearner(model, mode="chunked", chunk=4, loss=mse_step_loss, backend=backend)
                ys = []
                for t in range(13):
                    if t == 6:
                        lr.reset(torch.tensor([True, False]))
                    ys.append(lr.step(x[t], None if t % 5 == 3 else tgt[t]).output)
                lr.update()
                ran = {n for n in calls if calls[n] > before.get(n, 0)}
                assert ran == ({"block_filter"} if backend == "auto" else set()), (backend, ran)
                runs.append((L, grads, torch.stack(ys),
                             {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
            FUSE[0] = False
            (L0, g0, y0, s0), (L1, g1, y1, s1) = runs
            assert abs(L0 - L1) < 1e-10 * max(1.0, abs(L1))
            assert torch.allclose(y0, y1, rtol=0, atol=1e-12)
            for a, b in ((g0, g1), (s0, s1)):
                assert a.keys() == b.keys()
                for n in b:
                    assert torch.allclose(a[n], b[n], rtol=1e-10, atol=1e-12), (n, tau)
            assert any(float(v.abs().sum()) > 0 for v in s1.values())

    # 4. no per-step torch work in a block on the Triton forms: the torch ops per block do not grow with K
    class Ops(TorchDispatchMode):
        n = 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not any("interpreter" in f.filename for f in traceback.extract_stack(limit=30)):
                self.n += 1
            return func(*args, **(kwargs or {}))
    FUSE[0] = True
    for cells in stacks:
        model = RecurrentStack(cells, LeakyReadout(cells[-1].output_size, 2))
        x, tgt = torch.rand(16, 2, 3, generator=g) * 3, torch.randn(16, 2, 2, generator=g)
        per_block = []
        for K in (4, 16):
            lr = OnlineLearner(model, mode="chunked", chunk=K)
            lr.backward(x, tgt, mse_loss)
            with Ops() as ops:
                lr.backward(x, tgt, mse_loss)
            per_block.append(ops.n / (16 // K))
        print("OPS", type(cells[0]).__name__, per_block)
        assert per_block[1] < 1.2 * per_block[0], (type(cells[0]).__name__, per_block)
    print("BLOCK-OK", dict(calls))
    """
)


@pytest.mark.slow
def test_block_filter_matches_torch_under_interpreter():
    """The chunked block on the Triton forms (interpreted on the CPU, numba hidden, as on a CUDA
    device), float64: ``block_filter`` (k = 1 and 2; J per step, broadcast over the batch or
    constant; with and without the Jacobian products; without errors) equals a plain reverse loop
    and product loop, and the per-lane pass with it equals its torch form; the LIF/ALIF block scans
    on the layers' Triton kernels equal a loop of the definition's step; the chunked learner on them
    (backward() and the step API, Triton kernels and filter spied) equals the reference block; and a
    block's torch ops do not grow with its length."""
    env = dict(os.environ, TRITON_INTERPRET="1", SEED=str(int(torch.randint(0, 10_000, ()))), ROOT=str(ROOT))
    res = subprocess.run([sys.executable, "-c", BLOCK_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "BLOCK-OK" in res.stdout

"""The fused Triton trace kernel == the torch path and the trace recursion on the step's derived
partials, on the CPU under TRITON_INTERPRET=1.

The interpreter must be switched on before triton is imported, so the checks run in a
fresh interpreter process."""
import os
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    r"""
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    from spikerec.kernels.trace_triton import mat_trace_step, mat_trace_step_torch, triton_available
    from spikerec.hardware.online.traces_base import advance_and_contract
    assert triton_available(torch.zeros(1))
    g = torch.Generator().manual_seed(int(os.environ.get("SEED", "0")))
    r = lambda *s: torch.randn(*s, generator=g)
    for k, bcast, ng, B, N, H in [(1, False, 1, 3, 5, 7), (2, False, 1, 2, 17, 33), (2, True, 2, 3, 6, 40), (2, False, 0, 2, 4, 5)]:
        eps = r(N, B, k, H)
        J = r(1 if bcast else B, N, k, k)
        c, x = r(B, N, k), r(B, H)
        gs = [r(B, N, k) for _ in range(ng)] or [None]
        e1, e2 = eps.clone(), eps.clone()
        o1 = mat_trace_step(e1, J, c, x, gs)
        o2 = mat_trace_step_torch(e2, J, c, x, gs)
        e3 = eps.clone()
        o3 = advance_and_contract(e3, J, c, x, gs)
        assert torch.allclose(e3, e2, rtol=1e-12, atol=1e-12)
        assert torch.allclose(e1, e2, rtol=1e-12, atol=1e-12), ("eps", k, bcast)
        for a, b in list(zip(o1, o2)) + list(zip(o3, o2)):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), ("G", k, bcast)
    # the whole learner: Triton kernels vs torch path
    from spikerec.hardware.online import OnlineLearner, mse_loss
    from spikerec.layers import ALIF, LIF, LeakyReadout
    from spikerec.models import RecurrentStack
    torch.manual_seed(int(os.environ.get("SEED", "0")))
    cells = [ALIF(3, 5, recurrent=True, tau_mem=5.0, tau_adapt=10.0, b=0.3, beta=0.5), LIF(5, 4, tau_mem=5.0)]
    try:
        from spikerec.layers.lru import LRU
        cells.append(LRU(4, 6))
    except ImportError:
        pass
    model = RecurrentStack(cells, LeakyReadout(cells[-1].output_size, 2))
    x, tgt = torch.rand(9, 2, 3) * 3, torch.randn(9, 2, 2)
    import spikerec.hardware.online.learner as learner_mod
    grads = []
    for use in (True, False):  # the Triton matrix-trace step (interpreted on the CPU), then the torch one
        learner_mod.matrix_trace_kernel = (lambda device: mat_trace_step) if use else (lambda device: None)
        model.zero_grad()
        OnlineLearner(model).backward(x, tgt, mse_loss)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for n in grads[1]:
        assert torch.allclose(grads[0][n], grads[1][n], rtol=1e-10, atol=1e-12), n
    # the stream step with the Triton matrix trace == the trace recursion on the step's torch.func partials
    import sys
    sys.path[:0] = [os.environ["ROOT"], os.path.join(os.environ["ROOT"], "tests")]
    from tests.test_online_partials import MATRIX_TRACE_CASES, matrix_trace_against_derived
    for kind, kw in MATRIX_TRACE_CASES:
        matrix_trace_against_derived(kind, kw, mat_trace_step)
    print("TRITON-OK", len(cells))
    """
)


def test_triton_kernel_matches_torch_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", SEED=str(int(torch.randint(0, 10_000, ()))), ROOT=str(ROOT))
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "TRITON-OK" in res.stdout


@pytest.mark.gpu
def test_triton_kernel_on_cuda_matches_fp64_reference():
    from spikerec.kernels.trace_triton import mat_trace_step, mat_trace_step_torch

    B, N, k, H = 8, 64, 2, 128
    eps = torch.randn(N, B, k, H, device="cuda")
    J, c, x, g = (torch.randn(B, N, k, k, device="cuda"), torch.randn(B, N, k, device="cuda"),
                  torch.randn(B, H, device="cuda"), torch.randn(B, N, k, device="cuda"))
    e64 = eps.double().cpu()
    (G,) = mat_trace_step(eps, J, c, x, [g])
    (G64,) = mat_trace_step_torch(e64, J.double().cpu(), c.double().cpu(), x.double().cpu(), [g.double().cpu()])
    assert torch.allclose(eps.double().cpu(), e64, rtol=1e-4, atol=1e-4)
    assert torch.allclose(G.double().cpu(), G64, rtol=1e-4, atol=1e-3)


BLOCK_SCRIPT = textwrap.dedent(
    r"""
    import os, sys
    assert os.environ["TRITON_INTERPRET"] == "1"
    sys.modules["numba"] = None  # the device the Triton forms serve: no compiled CPU kernels
    sys.path[:0] = [os.environ["ROOT"], os.path.join(os.environ["ROOT"], "tests")]
    import collections, traceback
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    seed = int(os.environ.get("SEED", "0"))
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    from spikerec.kernels import alif_triton, lif_triton, trace_triton
    from spikerec.hardware.online import traces_base
    from spikerec.hardware.online.traces_base import jacobian_powers, reverse_filter

    # 1. the block's reverse filter and Jacobian products == the torch forms
    for k, K, B, N, shared in [(1, 7, 3, 5, False), (2, 9, 2, 6, False), (2, 4, 3, 4, True), (1, 1, 2, 3, False)]:
        J = r(K, 1 if shared else B, N, k, k) * 0.7
        G = r(K, B, N, k)
        GH, PH, phi = trace_triton.block_filter(J, G, True)
        PH0, phi0 = jacobian_powers(J, K)
        assert torch.allclose(GH, reverse_filter(J, G), rtol=1e-12, atol=1e-12), ("GH", k, shared)
        assert torch.allclose(PH, PH0.expand_as(PH), rtol=1e-12, atol=1e-12), ("PH", k, shared)
        assert torch.allclose(phi, phi0.expand_as(phi), rtol=1e-12, atol=1e-12), ("phi", k, shared)
        GH, PH, phi = trace_triton.block_filter(J.expand(K, B, N, k, k), None, True)
        assert GH is None and torch.allclose(PH, PH0.expand_as(PH), rtol=1e-12, atol=1e-12)

    # 2. the block scan on the layers' Triton kernels == a loop of the definition's step
    from test_online_partials import BLOCK_CASES, block_cell, random_state
    from spikerec.hardware.online.kinds import online_trace
    calls = collections.Counter()
    def spy(mod, name):
        real = getattr(mod, name)
        setattr(mod, name, lambda *a, **kw: calls.update([name]) or real(*a, **kw))
    spy(lif_triton, "lif_forward"); spy(alif_triton, "alif_forward"); spy(traces_base, "block_filter")
    K, B, H, N = 6, 3, 4, 5
    for kind, kw in BLOCK_CASES:
        if kind == "lru" or (kind == "lif" and kw["recurrent"]):
            continue  # the LRU scans with linear_scan; a recurrent LIF layer keeps its torch loop
        cell, mod, opts = block_cell(kind, kw, H, N)
        tr = online_trace(cell, "full", 0)
        tr.prepare()
        s = random_state(cell, B)
        xs = torch.rand(K, B, H, generator=g) * 2
        before = sum(calls.values())
        prev, last, new = tr.scan_block(xs, s, with_new=True)
        assert sum(calls.values()) == before + 1, (kind, kw)
        params = cell.params()
        for t in range(K):
            for f in range(len(s)):
                assert torch.allclose(prev[f].view(K, B, N)[t], s[f].detach(), rtol=1e-12, atol=1e-12), (kind, t, f)
            s = mod.step(params, s, xs[t], opts)[1]
            for f in range(len(s)):
                assert torch.allclose(new[f].view(K, B, N)[t], s[f].detach(), rtol=1e-12, atol=1e-12), (kind, t, f)
        for a, b in zip(last, s):
            assert torch.allclose(a, b.detach(), rtol=1e-12, atol=1e-12), kind

    # 3. the chunked learner on the Triton forms == the reference block (float64)
    from spikerec.hardware.online import OnlineLearner, mse_loss
    from spikerec.layers import ALIF, LIF, LeakyReadout
    from spikerec.models import RecurrentStack
    torch.manual_seed(seed)
    stacks = [[LIF(3, 5, tau_mem=5.0, reset="zero"), LIF(5, 4, tau_mem=4.0)],
              [ALIF(3, 5, recurrent=True, tau_mem=5.0, tau_adapt=10.0, b=0.3, beta=0.5), ALIF(5, 4, tau_mem=5.0)]]
    for cells in stacks:
        for tau in (None, 3.0):
            model = RecurrentStack(cells, LeakyReadout(cells[-1].output_size, 2, tau=tau))
            x, tgt = torch.rand(13, 2, 3, generator=g) * 3, torch.randn(13, 2, 2, generator=g)
            grads = []
            for backend in ("auto", "reference"):
                model.zero_grad()
                before = dict(calls)
                OnlineLearner(model, mode="chunked", chunk=4, backend=backend).backward(x, tgt, mse_loss)
                ran = {n for n in calls if calls[n] > before.get(n, 0)}
                assert (ran == {"block_filter", type(cells[0]).__name__.lower() + "_forward"}) == (backend == "auto"), ran
                grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            assert grads[0].keys() == grads[1].keys()
            for n in grads[1]:
                assert torch.allclose(grads[0][n], grads[1][n], rtol=1e-10, atol=1e-12), (n, tau)

    # 4. no per-step torch work in a block: the torch ops per block do not grow with K
    class Ops(TorchDispatchMode):
        n = 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not any("interpreter" in f.filename for f in traceback.extract_stack(limit=30)):
                self.n += 1
            return func(*args, **(kwargs or {}))
    for cells in stacks:
        model = RecurrentStack(cells, LeakyReadout(cells[-1].output_size, 2))
        x, tgt = torch.rand(32, 2, 3, generator=g) * 3, torch.randn(32, 2, 2, generator=g)
        per_block = []
        for K in (4, 16):
            lr = OnlineLearner(model, mode="chunked", chunk=K)
            lr.backward(x, tgt, mse_loss)
            with Ops() as ops:
                lr.backward(x, tgt, mse_loss)
            per_block.append(ops.n / (32 // K))
        assert per_block[1] < 1.2 * per_block[0], (type(cells[0]).__name__, per_block)
    print("BLOCK-OK", dict(calls))
    """
)


def test_block_filter_matches_torch_under_interpreter():
    """The chunked block on the Triton forms (interpreted on the CPU, numba hidden, as on a CUDA
    device): the reverse filter and Jacobian products equal the torch forms, the LIF/ALIF block scans
    on the layers' Triton kernels equal a loop of the definition's step, the chunked learner equals
    the reference block in float64, and a block's torch ops do not grow with its length."""
    env = dict(os.environ, TRITON_INTERPRET="1", SEED=str(int(torch.randint(0, 10_000, ()))), ROOT=str(ROOT))
    res = subprocess.run([sys.executable, "-c", BLOCK_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "BLOCK-OK" in res.stdout

"""CUDA paths against the CPU (float64): the Triton kernels compiled for the GPU (the online block's
reverse filter and Jacobian products, the linear scan), and the online learner run end to end on a
CUDA device. Skipped without CUDA (conftest); the same kernels are checked on the CPU under
``TRITON_INTERPRET=1`` in test_online_triton.py and test_scan.py."""
import pytest
import torch

F64 = torch.float64
pytestmark = pytest.mark.gpu


def _gen():
    return torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))


def _reverse_filter_and_products(J, G, K):
    """The plain loops (CPU): ``gh_t = g_t + J_{t+1}^T gh_{t+1}``, ``Phi_t = J_{K-1} ... J_{t+1}`` and
    ``phi = Phi_0 J_0`` for ``J [K or 1, B or 1, N, k, k]``, ``G [K, B, N, k]``."""
    _, B, N, k = G.shape
    Je = J.expand(K, B, N, k, k)
    GH = G.clone()
    for t in range(K - 2, -1, -1):
        GH[t] += (Je[t + 1].transpose(-1, -2) @ GH[t + 1][..., None])[..., 0]
    PH, phi = torch.empty((K, B, N, k, k), dtype=J.dtype), torch.eye(k, dtype=J.dtype).expand(B, N, k, k)
    for t in range(K - 1, -1, -1):
        PH[t] = phi
        phi = phi @ Je[t]
    return GH, PH, phi


@pytest.mark.parametrize("k,shape", [(1, "step"), (2, "step"), (2, "batch"), (1, "const"), (2, "const")])
def test_block_filter_float64_on_cuda(k, shape):
    """``kernels.trace_triton.block_filter`` compiled for the GPU (float64; J per step, broadcast over
    the batch, or constant; ``B * N`` not a multiple of the lanes' tile) equals the plain loops on the
    CPU, and the block's per-lane pass with it (``traces.lanes_torch``, fused) equals its torch form."""
    pytest.importorskip("triton")
    from spikerec.hardware.online.traces import lanes_torch
    from spikerec.kernels.trace_triton import block_filter

    g = _gen()
    K, B, N = 11, 3, 70
    r = lambda *s: torch.randn(*s, dtype=F64, generator=g)  # noqa: E731
    J = r(1 if shape == "const" else K, B if shape == "step" else 1, N, k, k) * 0.7
    G = r(K, B, N, k)
    want = _reverse_filter_and_products(J, G, K)
    got = block_filter(J.cuda(), G.cuda(), True)
    for name, a, b in zip(("GH", "PH", "phi"), got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-12, atol=1e-12, msg=name)
    GH, PH, phi = block_filter(J.cuda(), G.cuda(), False)
    assert PH is None and phi is None
    torch.testing.assert_close(GH.cpu(), want[0], rtol=1e-12, atol=1e-12)
    if shape != "const":  # no errors: the products only
        GH, PH, phi = block_filter(J.cuda(), None, True)  # the batch of J's
        assert GH is None
        torch.testing.assert_close(PH.cpu(), want[1][:, : J.shape[1]], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(phi.cpu(), want[2][: J.shape[1]], rtol=1e-12, atol=1e-12)
    m = 2
    Jp = J.expand(K, B, N, k, k).flatten(-2).transpose(-1, -2).contiguous()  # planar [K, B, k*k, N]
    Gp = G.transpose(-1, -2).contiguous()
    args = (Jp, r(m, K, B, k, N), Gp, r(K, B, k, N), r(m, B, k, N), True, True, False)
    cuda = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    for Gi in (Gp, None):  # with errors, and a block without a loss (the carry only)
        args, cuda = args[:2] + (Gi,) + args[3:], cuda[:2] + [None if Gi is None else Gi.cuda()] + cuda[3:]
        Cr = r(2, K, B, k, N)
        ref = lanes_torch(*args, fused=False, Cr=Cr, need_P=True)
        out = lanes_torch(*cuda, fused=True, Cr=Cr.cuda(), need_P=True)
        for name, a, b in zip(("GH", "A", "Gv", "b0", "P", "phi", "e_out"), out, ref):
            assert (a is None) == (b is None), name
            if a is not None:
                torch.testing.assert_close(a.cpu(), b, rtol=1e-12, atol=1e-12, msg=name)
        assert (ref[0] is None) == (Gi is None) and ref[-1] is not None


@pytest.mark.parametrize("cplx", [False, True])
@pytest.mark.parametrize("rev", [False, True])
def test_scan_triton_on_cuda_matches_torch(cplx, rev):
    pytest.importorskip("triton")
    from spikerec.kernels.scan_triton import scan_triton
    from spikerec.scan import _scan_torch

    g = _gen()
    T, M = 300, 45
    b = torch.randn(T, M, dtype=F64, generator=g)
    a = 0.05 + 0.9 * torch.rand(T, M, dtype=F64, generator=g)
    x0 = torch.randn(M, dtype=F64, generator=g)
    if cplx:
        b = torch.complex(b, torch.randn(T, M, dtype=F64, generator=g))
        a = torch.polar(a, 6.28 * torch.rand(T, M, dtype=F64, generator=g))
        x0 = x0.to(torch.complex128)
    ref = _scan_torch(a, b, x0, rev)
    got = scan_triton(a.cuda(), b.cuda(), x0.cuda(), rev)
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-11, atol=1e-11)


def _mixed_stack(readout_tau=None):
    from spikerec.layers import ALIF, LIF, LeakyReadout
    from spikerec.layers.lru import LRU
    from spikerec.models import RecurrentStack

    lru = LRU(3, 6)
    cells = [lru, ALIF(lru.output_size, 5, tau_mem=5.0, tau_adapt=10.0, b=0.3, beta=0.5), LIF(5, 4, tau_mem=5.0)]
    return RecurrentStack(cells, LeakyReadout(4, 2, tau=readout_tau)).double()


@pytest.mark.parametrize("readout_tau", [None, (4.0, 6.0)])
@pytest.mark.parametrize("mode", ["stream", "chunked", "backward"])
def test_online_learner_on_cuda_equals_cpu(mode, readout_tau, monkeypatch):
    """The learner on a CUDA device on the compiled backend (the window's torch steps, the compiled
    block with the Triton reverse filter; backward(): the block scans on the layers' Triton forward
    kernels and the Triton linear scan) gives the CPU learner's (numba) outputs and gradient,
    stepped through a stream with a reset of one sample in the middle (stream: windows of 64 steps;
    chunked: blocks of 5), or by backward() over the whole sequence in blocks of 5; under a leaky
    readout with the readout-filtered traces too."""
    pytest.importorskip("triton")
    from spikerec.hardware.online import OnlineLearner, mse_loss, mse_step_loss, traces

    g = _gen()
    model = _mixed_stack(None if readout_tau is None else torch.tensor(readout_tau))
    T, B = 23, 3
    x = torch.rand(T, B, 3, dtype=F64, generator=g) * 3
    tgt = torch.randn(T, B, 2, dtype=F64, generator=g)
    mask = torch.tensor([False, True, False])
    filters = []
    real = traces.block_filter
    monkeypatch.setattr(traces, "block_filter", lambda *a: filters.append(a[0].device.type) or real(*a))
    grads, outs = [], []
    for dev in ("cpu", "cuda"):
        m = model.to(dev)
        m.zero_grad()
        filters.clear()
        if mode == "backward":
            lr = OnlineLearner(m, mode="chunked", chunk=5)
            outs.append(torch.tensor(lr.backward(x.to(dev), tgt.to(dev), mse_loss)))
        else:
            lr = OnlineLearner(m, mode=mode, loss=mse_step_loss, **({"chunk": 5} if mode == "chunked" else {}))
            ys = []
            for t in range(T):
                ys.append(lr.step(x[t].to(dev), tgt[t].to(dev)).output.cpu())
                if t == 11:
                    lr.reset(mask.to(dev))
            lr.update()
            outs.append(torch.stack(ys))
        assert lr._compiled_block and (lr._filter is not None) == (readout_tau is not None)
        assert (filters and set(filters) == {"cuda"}) if dev == "cuda" else not filters, (dev, filters)
        grads.append({n: p.grad.detach().cpu().clone() for n, p in m.named_parameters() if p.requires_grad})
    model.cpu()
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-12)
    assert any(float(v.abs().sum()) > 0 for v in grads[0].values())
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-9, atol=1e-11, msg=n)

"""CUDA paths against the CPU (float64): the Triton kernels compiled for the GPU, and the online
learner run end to end on a CUDA device. Skipped without CUDA (conftest); the same kernels are
checked on the CPU under ``TRITON_INTERPRET=1`` in test_online_triton.py and test_scan.py."""
import pytest
import torch

F64 = torch.float64
pytestmark = pytest.mark.gpu


def _gen():
    return torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))


@pytest.mark.parametrize("k,bcast,ng", [(1, False, 1), (2, False, 1), (2, True, 2), (2, False, 0)])
def test_mat_trace_kernel_float64_on_cuda(k, bcast, ng):
    pytest.importorskip("triton")
    from spikerec.kernels.trace_triton import mat_trace_step, mat_trace_step_torch

    g = _gen()
    B, N, H = 5, 37, 70  # not multiples of the tiles: the masks are exercised
    r = lambda *s: torch.randn(*s, dtype=F64, generator=g)  # noqa: E731
    eps, J, c, x = r(N, B, k, H), r(1 if bcast else B, N, k, k), r(B, N, k), r(B, H)
    gs = [r(B, N, k) for _ in range(ng)] or [None]
    e_cpu = eps.clone()
    ref = mat_trace_step_torch(e_cpu, J, c, x, gs)
    e_gpu = eps.cuda()
    out = mat_trace_step(e_gpu, J.cuda(), c.cuda(), x.cuda(), [None if t is None else t.cuda() for t in gs])
    torch.testing.assert_close(e_gpu.cpu(), e_cpu, rtol=1e-12, atol=1e-12)
    for a, b in zip(out, ref):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a.cpu(), b, rtol=1e-12, atol=1e-12)


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
@pytest.mark.parametrize("mode", ["stream", "chunked"])
def test_online_learner_on_cuda_equals_cpu(mode, readout_tau):
    """The learner on a CUDA device (Triton matrix traces in stream mode, torch block scans in
    chunked mode) gives the CPU learner's gradient, stepped through a stream with a reset of one
    sample in the middle; under a leaky readout with the readout-filtered traces too."""
    from spikerec.hardware.online import OnlineLearner, mse_step_loss

    g = _gen()
    model = _mixed_stack(None if readout_tau is None else torch.tensor(readout_tau))
    T, B = 23, 3
    x = torch.rand(T, B, 3, dtype=F64, generator=g) * 3
    tgt = torch.randn(T, B, 2, dtype=F64, generator=g)
    mask = torch.tensor([False, True, False])
    grads, outs = [], []
    for dev in ("cpu", "cuda"):
        m = model.to(dev)
        m.zero_grad()
        lr = OnlineLearner(m, mode=mode, loss=mse_step_loss, **({"chunk": 5} if mode == "chunked" else {}))
        ys = []
        for t in range(T):
            ys.append(lr.step(x[t].to(dev), tgt[t].to(dev)).output.cpu())
            if t == 11:
                lr.reset(mask.to(dev))
        lr.update()
        outs.append(torch.stack(ys))
        grads.append({n: p.grad.detach().cpu().clone() for n, p in m.named_parameters() if p.requires_grad})
    model.cpu()
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-12)
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-9, atol=1e-11, msg=n)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_stream_from_a_cuda_graph_equals_the_eager_stream(dtype):
    """The stream step replayed from a CUDA graph (:mod:`spikerec.hardware.online.cuda_graph`)
    gives the eager step's outputs, losses and gradients, through a step without a target, a
    reset of one sample, an update every 9 steps and a checkpoint read mid-stream; and the graph
    is used (replays counted)."""
    from spikerec.hardware.online import OnlineLearner, mse_step_loss
    from spikerec.hardware.online.cuda_graph import MAX_FAILURES

    g = _gen()
    model = _mixed_stack().to(dtype=dtype, device="cuda")
    T, B = 40, 3
    x = (torch.rand(T, B, 3, generator=g, dtype=F64) * 3).to(dtype=dtype, device="cuda")
    tgt = torch.randn(T, B, 2, generator=g, dtype=F64).to(dtype=dtype, device="cuda")
    mask = torch.tensor([False, True, False], device="cuda")
    runs = []
    for graph in (False, None):
        model.zero_grad()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        lr = OnlineLearner(model, loss=mse_step_loss, optimizer=opt, update_every=9)
        if graph is False:  # the eager compiled step: no capture is tried
            lr._graph_failures = MAX_FAILURES
        ys, ls, ckpt = [], [], None
        for t in range(T):
            r = lr.step(x[t], None if t == 17 else tgt[t])
            ys.append(r.output)
            ls.append(torch.zeros((), device="cuda", dtype=dtype) if r.loss is None else r.loss)
            if t == 25:
                lr.reset(mask)
            if t == 30:
                ckpt = {k: v.clone() for k, v in lr.state_tensors()[0].items()}
        lr.update()
        runs.append((torch.stack(ys), torch.stack(ls), ckpt, {n: p.detach().clone() for n, p in model.named_parameters()},
                     lr.__dict__.get("_graph_replays", 0)))
        with torch.no_grad():  # the same starting parameters for the second run
            for n, p in model.named_parameters():
                p.copy_(init[n])
    (y0, l0, c0, p0, n0), (y1, l1, c1, p1, n1) = runs
    assert n0 == 0 and n1 >= 10, f"graph replays: eager {n0}, graphed {n1}"
    tol = dict(rtol=1e-12, atol=1e-13) if dtype == F64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y1, y0, **tol)
    torch.testing.assert_close(l1, l0, **tol)
    assert c0.keys() == c1.keys()
    for k in c0:
        torch.testing.assert_close(c1[k], c0[k], **tol, msg=k)
    for n in p0:
        torch.testing.assert_close(p1[n], p0[n], **tol, msg=n)


def test_a_step_the_graph_cannot_hold_runs_eagerly():
    """A loss whose gradient reads a value on the host cannot be captured in a CUDA graph: every
    step runs eagerly with the eager result, the learner keeps the reason, and it stops trying
    after MAX_FAILURES captures."""
    from spikerec.hardware.online import OnlineLearner, mse_step_loss
    from spikerec.hardware.online.cuda_graph import MAX_FAILURES

    def host_loss(y, t):
        return mse_step_loss(y, t)

    def host_vg(y, t):
        d = y - t
        if float(d.abs().max()) > 1e6:  # a host read inside the step
            raise ValueError("diverged")
        return mse_step_loss.value_and_grad(y, t)

    host_loss.value_and_grad = host_vg
    g = _gen()
    model = _mixed_stack().cuda()
    T, B = 14, 3
    x = (torch.rand(T, B, 3, generator=g, dtype=F64) * 3).cuda()
    tgt = torch.randn(T, B, 2, generator=g, dtype=F64).cuda()
    runs = []
    for graph in (False, None):
        model.zero_grad()
        lr = OnlineLearner(model, loss=host_loss)
        if graph is False:  # the eager compiled step: no capture is tried
            lr._graph_failures = MAX_FAILURES
        ys = torch.stack([lr.step(x[t], tgt[t]).output for t in range(T)])
        lr.update()
        runs.append((ys, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, lr))
    (y0, g0, _), (y1, g1, lr1) = runs
    assert lr1.__dict__.get("_graph_replays", 0) == 0 and lr1._graph_failures == MAX_FAILURES
    assert lr1._graph_error
    torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=0, atol=0, msg=n)

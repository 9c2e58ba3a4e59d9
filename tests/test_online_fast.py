"""The stream mode's fast path (hand-written spatial backward, fused per-layer kernels) against
the reference path (per-step autograd backward, torch trace updates): outputs, losses, traces
and gradients in float64 on fresh random networks and inputs."""
import pytest
import torch

from spikerec.hardware.online import OnlineLearner
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.layers.lru import LRU
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread, named, step_stream, traces_of  # noqa: F401

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}


def step_loss(y, tgt):
    return 0.5 * ((y - tgt) ** 2).sum() + (y.tanh() * tgt).sum()


def build(kind, leaky, H=5, N=6, K=3, seed=None):
    torch.manual_seed(int(torch.randint(0, 10_000, ())) if seed is None else seed)
    if kind == "lru":
        cells = [LRU(H, N), LRU(H, N, output_size=4)]
        width = 4
    elif kind == "lru_diag_skip":
        cells = [LRU(H, N)]
        width = H
    else:
        cells = [ALIF(H, N, surrogate=SURR, tau_mem=5.0, b=0.3, beta=0.5, detach_reset=(kind == "alif")),
                 ALIF(N, N, surrogate=SURR, tau_mem=5.0, b=0.3, beta=0.5, recurrent=(kind == "alif_reset"),
                      detach_reset=(kind == "alif"), zero_diagonal=False)]
        for c in cells:
            with torch.no_grad():
                c.weight.mul_(3.0)
        width = N
    return RecurrentStack(cells, LeakyReadout(width, K, tau=(4.0 if leaky else None)))


def run(model, x, tgt, backend, resets=(), **kw):
    model.zero_grad()
    lr = OnlineLearner(model, loss=step_loss, backend=backend, **kw)
    ys, ls = step_stream(lr, x, tgt, resets)  # some steps without a loss
    traces = traces_of(lr)
    lr.update()
    grads = {n: p.grad.clone() for n, p in named(model)}
    model.zero_grad()
    return ys, ls, traces, grads, lr


@pytest.mark.parametrize("kind", ["lru", "lru_diag_skip", "alif", "alif_reset"])
@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("rule", ["full", "trunc1", "spatial"])
def test_fast_stream_equals_autograd_stream(kind, leaky, rule):
    model = build(kind, leaky)
    T, B = int(torch.randint(9, 15, ())), 3
    x = torch.randn(T, B, 5) if kind.startswith("lru") else (torch.rand(T, B, 5) < 0.5).double()
    tgt = torch.randn(T, B, 3)
    resets = [(5, torch.tensor([True, False, True]))]
    y0, l0, tr0, g0, lr0 = run(model, x, tgt, "reference", resets=resets, rule=rule)
    y1, l1, tr1, g1, lr1 = run(model, x, tgt, "compiled", resets=resets, rule=rule)
    assert lr0._compiled_kinds is None and lr1._compiled_kinds is not None
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12)
    assert torch.allclose(l0, l1, rtol=0, atol=1e-12)
    assert tr0.keys() == tr1.keys()
    for n in tr0:
        assert torch.allclose(tr0[n], tr1[n], rtol=1e-10, atol=1e-12), n
    assert g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-10, atol=1e-12), (n, (g0[n] - g1[n]).abs().max())
    assert any(g.abs().sum() > 0 for g in g1.values())


def test_fast_path_declines_unsupported_stacks():
    lif = RecurrentStack([LIF(3, 4)], LeakyReadout(4, 2))
    lr = OnlineLearner(lif, loss=step_loss)
    lr.step(torch.randn(2, 3), torch.randn(2, 2))
    assert lr._compiled_kinds == ["lif", "readout"]  # a plain LIF has the hand-written spatial backward
    cuba = RecurrentStack([LIF(3, 4, tau_syn=5.0)], LeakyReadout(4, 2))
    lr = OnlineLearner(cuba, loss=step_loss)
    lr.step(torch.randn(2, 3), torch.randn(2, 2))
    assert lr._compiled_kinds is None  # CUBA LIF: the autograd path
    with pytest.raises(ValueError, match="backend 'compiled'"):
        OnlineLearner(cuba, loss=step_loss, backend="compiled").step(torch.randn(2, 3))
    drop = RecurrentStack([LRU(3, 4)], LeakyReadout(3, 2), dropout=0.5)
    lr = OnlineLearner(drop, loss=step_loss)
    lr.step(torch.randn(2, 3), torch.randn(2, 2))
    assert lr._compiled_kinds is None  # active dropout: the autograd path


@pytest.mark.parametrize("kind", ["lru", "alif"])
@pytest.mark.parametrize("use_numba", [False, True])
def test_fused_kernels_and_torch_partials_equal_the_reference(kind, use_numba, monkeypatch):
    """The compiled stream path with the compiled per-layer kernels (numba) and, where numba is
    missing, with the torch partials, against the reference; float32 within float rounding,
    float64 to 1e-10."""
    from spikerec.hardware.online import learner as learner_mod

    if use_numba:
        pytest.importorskip("numba")
    else:  # as without numba: no compiled kernel for the CPU
        monkeypatch.setattr(learner_mod, "matrix_trace_kernel", lambda device: None)
    # the per-layer step (the whole-stack step, which would take these stacks, is tested on its own)
    monkeypatch.setattr(learner_mod, "whole_stack_supported", lambda *a: False)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        torch.set_default_dtype(dtype)
        model = build(kind, leaky=True)
        T, B = 11, 4
        x = torch.randn(T, B, 5) if kind == "lru" else (torch.rand(T, B, 5) < 0.5).to(dtype)
        tgt = torch.randn(T, B, 3)
        _, _, tr0, g0, _ = run(model, x, tgt, "reference")
        _, _, tr1, g1, lr1 = run(model, x, tgt, "auto")
        assert lr1._fused[(dtype, x.device)][:2] == [use_numba, use_numba]
        for n in tr0:
            assert torch.allclose(tr0[n], tr1[n], rtol=tol, atol=tol), n
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=tol, atol=tol * max(1.0, float(g0[n].abs().max()))), n


def test_lru_block_scans_equal_the_step_loops():
    """Chunked mode's closed-form LRU block scans (``scan_block``: the parallel scan of the states;
    ``reverse_filter``: the reverse scan with ``conj(lam)``) equal the step-by-step loops."""
    from spikerec.hardware.online.traces_base import reverse_filter
    from spikerec.hardware.online.traces_lru import LRUTrace
    from spikerec.layers.lru import LRUState

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    tr = LRUTrace(LRU(5, 7), "full")
    K, B = 9, 3
    x = torch.randn(K, B, 5)
    s = LRUState(torch.randn(B, 7), torch.randn(B, 7))
    with torch.no_grad():
        prevs, last = tr.scan_states(x, s)
        prev, last2 = tr.scan_block(x, s)
        for f in range(2):
            assert torch.allclose(torch.cat([p[f] for p in prevs]), prev[f], rtol=0, atol=1e-12)
            assert torch.allclose(last[f], last2[f], rtol=0, atol=1e-12)
        _, _, new = tr.scan_block(x, s, with_new=True)
        step_new = tr.step(x.reshape(K * B, 5), prev)
        for f in range(2):
            assert torch.allclose(new[f], step_new[f], rtol=0, atol=1e-12)
        G = torch.randn(K, B, 7, 2)
        ref = reverse_filter(tr.consts(torch.float64)["J"][None], G)
        assert torch.allclose(tr.reverse_filter(G), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("recurrent", [True, False])
def test_alif_block_scan_equals_the_step_loop(recurrent):
    """Chunked mode's ALIF block scan (the compiled sequence kernel where it applies) gives the
    step loop's states before and after every step, and its final state."""
    from spikerec.hardware.online.traces_lif import ALIFTrace
    from spikerec.layers.alif import ALIFState

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    cell = ALIF(5, 7, tau_mem=3.0, tau_adapt=20.0, b=0.3, beta=0.5, recurrent=recurrent)
    tr = ALIFTrace(cell, "full")
    K, B = 23, 3
    x = torch.randn(K, B, 5) * 2
    s = ALIFState(torch.randn(B, 7) * 0.5, torch.rand(B, 7) * 0.3)
    with torch.no_grad():
        prevs, last = tr.scan_states(x, s)
        prev, last2, new = tr.scan_block(x, s, with_new=True)
        step_new = tr.step(x.reshape(K * B, 5), prev)
    spikes = (prev.v > cell.b.detach() + cell.beta.detach() * prev.a).double().mean()
    assert 0.02 < spikes < 0.9
    for f in range(2):
        assert torch.allclose(torch.cat([p[f] for p in prevs]), prev[f], rtol=0, atol=1e-12)
        assert torch.allclose(last[f], last2[f], rtol=0, atol=1e-12)
        assert torch.allclose(new[f], step_new[f], rtol=0, atol=1e-12)


@pytest.mark.parametrize("loss", ["mse", "mean", "per_step"])
def test_block_form_of_the_losses_equals_the_per_step_sum(loss):
    """Chunked/parallel modes evaluate a loss's ``block`` form (all K steps in one op); gradients
    and loss equal the per-step loop (``backend="reference"``) in float64."""
    from spikerec.hardware.online import classification_loss, mse_loss

    model = build("lru", leaky=False)
    T, B = 13, 3
    x = torch.randn(T, B, 5)
    if loss == "mse":
        fn, tgt = mse_loss, torch.randn(T, B, 3)
    else:
        fn = classification_loss(loss, T)
        tgt = torch.randint(0, 3, (B,) if loss == "mean" else (T, B))
    assert hasattr(fn, "block")
    for mode, chunk in (("chunked", 4), ("parallel", None)):
        out = []
        for backend in ("reference", "auto"):
            model.zero_grad()
            L = OnlineLearner(model, mode=mode, chunk=chunk, backend=backend).backward(x, tgt, fn)
            out.append((L, {n: p.grad.clone() for n, p in named(model)}))
        (L0, g0), (L1, g1) = out
        assert abs(L0 - L1) <= 1e-12 * max(1.0, abs(L0))
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=1e-10, atol=1e-13), n


def test_fast_path_checkpoint_resume_is_bit_identical(tmp_path, monkeypatch):
    """The per-layer compiled step's state (traces, the kernels' accumulators, the spatial
    accumulators) goes through save_stream/load_stream: stopping at step 11, restoring into a fresh
    learner and continuing gives the uninterrupted run's weights bit for bit (Adam, an update
    policy, a per-sample reset). (The whole-stack step's: tests/test_online_whole_stack.py.)"""
    from spikerec.hardware.online import learner as learner_mod
    from spikerec.hardware.online import load_stream, save_stream

    monkeypatch.setattr(learner_mod, "whole_stack_supported", lambda *a: False)

    def build_learner():
        torch.manual_seed(0)
        lru = LRU(4, 6)
        m = RecurrentStack([lru, ALIF(lru.output_size, 5, recurrent=True, zero_diagonal=False, surrogate=SURR)],
                           LeakyReadout(5, 2, tau=3.0))
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        return m, OnlineLearner(m, optimizer=opt, update_every=3, loss=lambda y, t: 0.5 * ((y - t) ** 2).sum())

    g = torch.Generator().manual_seed(5)
    xs, ts = torch.randn(20, 3, 4, generator=g), torch.randn(20, 3, 2, generator=g)
    mask = torch.tensor([True, False, True])

    def steps(lr, a, b):
        for t in range(a, b):
            if t == 8:
                lr.reset(mask)
            lr.step(xs[t], ts[t])

    m1, lr1 = build_learner()
    steps(lr1, 0, 20)
    assert lr1._compiled_kinds is not None and all(lr1._fused[(torch.float64, xs.device)][:2])
    m2, lr2 = build_learner()
    steps(lr2, 0, 10)  # stop with accumulated, not yet applied gradients (update every 3)
    ck = tmp_path / "ck.safetensors"
    save_stream(ck, lr2, lr2.optimizer)
    m3, lr3 = build_learner()
    load_stream(ck, lr3, lr3.optimizer)
    steps(lr3, 10, 20)
    w1, w3 = m1.state_dict(), m3.state_dict()
    for k in w1:
        assert torch.equal(w1[k], w3[k]), k
    w0 = build_learner()[0].state_dict()
    assert max(float((w1[k] - w0[k]).abs().max()) for k in w0) > 1e-4

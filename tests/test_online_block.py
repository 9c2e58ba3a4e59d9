"""The chunked mode's no-autograd block (:mod:`spikerec.hardware.online.block`) against the
autograd block and the reference stream path, in float64 on fresh random networks and inputs:
outputs, losses, traces and gradients; resets mid-block, update policies with an optimiser,
checkpoint mid-block."""
import pytest
import torch

from spikerec.hardware.online import OnlineLearner, load_stream, save_stream
from spikerec.hardware.online.learner import classification_loss, mse_loss, mse_step_loss
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.layers.lru import LRU
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread, named, step_stream, traces_of  # noqa: F401

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}


def build(kind, leaky, H=5, N=6, K=3):
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    if kind == "lru":
        cells = [LRU(H, N), LRU(H, N, output_size=4)]
        width = 4
    elif kind == "lru_alif":
        lru = LRU(H, N)
        cells = [lru, ALIF(lru.output_size, N, surrogate=SURR, tau_mem=5.0, b=0.3, beta=0.5, recurrent=False)]
        with torch.no_grad():
            cells[1].weight.mul_(3.0)
        width = N
    elif kind == "lru_lif":
        lru = LRU(H, N)
        cells = [lru, LIF(lru.output_size, N, surrogate=SURR, tau_mem=5.0, threshold=0.3, learn_threshold=True)]
        with torch.no_grad():
            cells[1].weight.mul_(3.0)
        width = N
    else:
        cells = [ALIF(H, N, surrogate=SURR, tau_mem=5.0, b=0.3, beta=0.5, recurrent=False),
                 ALIF(N, N, surrogate=SURR, tau_mem=5.0, b=0.3, beta=0.5, recurrent=False)]
        for c in cells:
            with torch.no_grad():
                c.weight.mul_(3.0)
        width = N
    return RecurrentStack(cells, LeakyReadout(width, K, tau=(4.0 if leaky else None)))



def run_steps(model, x, tgt, closed, resets=(), mode="chunked", chunk=4, **kw):
    """``closed``: the compiled backend (the chunked mode's no-autograd block), else the reference."""
    model.zero_grad()
    kw.setdefault("readout_filter", False)  # the unfiltered block (the filtered one: test_online_readout_filter.py)
    lr = OnlineLearner(model, loss=mse_step_loss, mode=mode, chunk=chunk if mode == "chunked" else None,
                       backend="auto" if closed else "reference", **kw)
    ys, ls = step_stream(lr, x, tgt, resets, period=5)  # some steps without a loss
    lr.update()
    tr = traces_of(lr)
    grads = {n: p.grad.clone() for n, p in named(model)}
    model.zero_grad()
    return ys, ls, tr, grads


def close(a, b):
    assert a.keys() == b.keys()
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=1e-10, atol=1e-12), (n, (a[n] - b[n]).abs().max())


@pytest.mark.parametrize("kind", ["lru", "lru_alif", "alif", "lru_lif"])
@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("rule", ["full", "trunc1", "spatial"])
def test_compiled_chunk_block_equals_autograd_block_and_stream(kind, leaky, rule):
    """step() in chunked mode (blocks of 4, a per-sample reset mid-block, steps without a loss):
    the no-autograd block equals the autograd block and the reference stream path."""
    model = build(kind, leaky)
    T, B = int(torch.randint(11, 18, ())), 3
    x = torch.randn(T, B, 5)
    tgt = torch.randn(T, B, 3)
    resets = [(6, torch.tensor([True, False, True]))]
    y0, l0, tr0, g0 = run_steps(model, x, tgt, closed=False, resets=resets, rule=rule)
    y1, l1, tr1, g1 = run_steps(model, x, tgt, closed=True, resets=resets, rule=rule)
    y2, l2, tr2, g2 = run_steps(model, x, tgt, closed=False, resets=resets, rule=rule, mode="stream")
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12) and torch.allclose(y1, y2, rtol=0, atol=1e-12)
    assert torch.allclose(l0, l1, rtol=0, atol=1e-12) and torch.allclose(l1, l2, rtol=0, atol=1e-10)
    close(tr0, tr1)
    close(g0, g1)
    close(g2, g1)
    assert any(g.abs().sum() > 0 for g in g1.values())


@pytest.mark.parametrize("rule,frozen", [("full", ()), ("trunc1", ()), ("full", ("nu_log", "theta_log", "gamma_log")),
                                         ("full", ("gamma_log",))])
def test_lru_compiled_block_equals_its_torch_form(rule, frozen, monkeypatch):
    """LRU layers in chunked mode: the compiled block scan and the reverse filter, block sums and
    per-neuron traces in one compiled call (kernels.?.lru_block_scan_numba /
    lru_block_traces_numba) equal the torch form (complex scans and sums), traces and gradients,
    with a per-sample reset and steps without a loss."""
    from spikerec.hardware.online import traces_lru

    model = build("lru", False)
    for c in model.cells:  # frozen per-neuron parameters: no per-neuron traces (or only some)
        for name in frozen:
            getattr(c, name).requires_grad_(False)
    T, B = 17, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    resets = [(6, torch.tensor([True, False, True]))]
    calls = []
    real = traces_lru.lru_block_traces_numba
    monkeypatch.setattr(traces_lru, "lru_block_traces_numba", lambda *a: calls.append(1) or real(*a))
    y1, l1, tr1, g1 = run_steps(model, x, tgt, closed=True, resets=resets, rule=rule, chunk=5)
    assert calls, "the compiled block was not taken"
    monkeypatch.setattr(traces_lru.LRUTrace, "_compiled_block", lambda self, x: False)
    calls.clear()
    y0, l0, tr0, g0 = run_steps(model, x, tgt, closed=True, resets=resets, rule=rule, chunk=5)
    assert not calls
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12) and torch.allclose(l0, l1, rtol=0, atol=1e-12)
    close(tr0, tr1)
    close(g0, g1)
    assert g1["cells.0.B_re"].abs().sum() > 0
    assert ("nu_log" in frozen) or g1["cells.0.nu_log"].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lru_compiled_reverse_filter_equals_the_reverse_scan(dtype):
    """The LRU's compiled reverse filter ``gh_k = g_k + conj(lam) gh_{k+1}`` on (Re, Im) pairs
    (kernels.lru_online.lru_reverse_filter_numba) equals the flipped complex linear scan on fresh
    random inputs (float64 to 1e-12; float32 to its rounding)."""
    pytest.importorskip("numba")
    from spikerec.kernels.lru_online import lru_reverse_filter_numba
    from spikerec.scan import linear_scan

    g = torch.Generator().manual_seed(7)
    K, B, N = 19, 3, 6
    G = torch.randn(K, B, N, 2, generator=g, dtype=dtype)
    lam = 0.95 * torch.polar(torch.rand(N, generator=g, dtype=dtype), 6.3 * torch.rand(N, generator=g, dtype=dtype))
    got = lru_reverse_filter_numba(G, lam.real.contiguous(), lam.imag.contiguous())
    ref = torch.view_as_real(linear_scan(lam.conj(), torch.view_as_complex(G).flip(0)).flip(0))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(got, ref, rtol=0, atol=tol), (got - ref).abs().max()
    assert torch.equal(got[-1], G[-1])


@pytest.mark.parametrize("recurrent", [False, True])
def test_alif_block_scan_outputs_are_the_spikes_of_its_states(recurrent):
    """ALIFTrace.scan_block(..., with_out=True): the states before and after each step equal the
    step loop's (scan_states / step), and the outputs it takes from the forward kernel equal the
    spikes H(v - b - beta a) of the states after each step, on fresh random inputs (float64)."""
    from spikerec.hardware.online.spatial import _output

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    cell = ALIF(5, 7, surrogate=SURR, tau_mem=5.0, b=0.3, beta=0.5, recurrent=recurrent)
    with torch.no_grad():
        cell.weight.mul_(3.0)
    model = RecurrentStack([cell], LeakyReadout(7, 3))
    lr = OnlineLearner(model, loss=mse_step_loss, mode="chunked", chunk=6)
    K, B = 6, 4
    lr._start(B, torch.device("cpu"), torch.float64)
    tr = lr.tracers[0]
    state = type(lr.states[0])(torch.randn(B, 7), torch.rand(B, 7))
    x = torch.randn(K, B, 5)
    prev, last, new, out = tr.scan_block(x, state, with_new=True, with_out=True)
    prevs, last_ref = tr.scan_states(x, state)
    for f in range(2):
        ref_prev = torch.cat([p[f] for p in prevs])
        assert torch.allclose(prev[f], ref_prev, rtol=0, atol=1e-12)
        assert torch.allclose(last[f], last_ref[f], rtol=0, atol=1e-12)
        assert torch.allclose(new[f], tr.step(x.reshape(K * B, 5), prev)[f], rtol=0, atol=1e-12)
    assert out is not None and out.shape == (K * B, 7)
    assert torch.equal(out, _output(tr, "alif", new))
    assert 0 < float(out.mean()) < 1  # some spikes, not all


@pytest.mark.parametrize("detach,surrogate", [(True, SURR), (False, "atan"), (True, "sigmoid")])
def test_alif_closed_form_traces_equal_the_torch_block_contraction(detach, surrogate, monkeypatch):
    """Recurrent ALIF layers: the compiled block contraction (ALIFTrace.block_contract) equals the
    torch form (chunk_contract on the stacked partials) and the reference stream, traces and
    gradients, with lateral weights, both reset-gradient forms and a per-sample reset; the
    surrogate's derivative inside the kernel (fast sigmoid, arc-tangent) or from torch (sigmoid)."""
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    kw = dict(surrogate=surrogate, tau_mem=5.0, tau_adapt=12.0, b=0.3, beta=0.5, recurrent=True,
              detach_reset=detach)
    cells = [ALIF(5, 6, **kw), ALIF(6, 6, **kw)]
    for c in cells:
        with torch.no_grad():
            c.weight.mul_(3.0)
    model = RecurrentStack(cells, LeakyReadout(6, 3))
    T, B = 17, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    resets = [(6, torch.tensor([True, False, True]))]
    from spikerec.hardware.online import traces_lif

    calls = []
    real = traces_lif.alif_block_numba
    monkeypatch.setattr(traces_lif, "alif_block_numba", lambda *a: calls.append(1) or real(*a))
    out = []
    for backend in ("reference", "compiled"):
        model.zero_grad()
        lr = OnlineLearner(model, loss=mse_step_loss, mode="chunked", chunk=5, backend=backend)
        rs = dict(resets)
        for t in range(T):
            if t in rs:
                lr.reset(rs[t])
            lr.step(x[t], None if t % 5 == 3 else tgt[t])
        tr = traces_of(lr)
        lr.update()
        out.append((tr, {n: p.grad.clone() for n, p in named(model)}))
    _, _, _, g_ref = run_steps(model, x, tgt, closed=False, resets=resets, mode="stream")
    # two layers, five blocks (0-4, 5 cut by the reset at 6, 6-10, 11-15, 16), compiled only when asked
    assert len(calls) == 2 * 5
    close(out[0][0], out[1][0])
    close(out[0][1], out[1][1])
    close(g_ref, out[1][1])
    assert out[1][1]["cells.0.recurrent_weight"].abs().sum() > 0
    with torch.no_grad():
        rate = float(cells[0](x)[0].mean())
    assert 0.02 < rate < 0.9


@pytest.mark.parametrize("reset,detach,recurrent,surrogate", [
    ("subtract", True, False, SURR), ("subtract", False, True, SURR), ("zero", False, False, "atan"),
    ("zero", True, True, SURR), ("none", True, False, SURR), ("subtract", True, True, "sigmoid")])
@pytest.mark.parametrize("rule", ["full", "trunc1", "spatial"])
def test_lif_compiled_chunk_block_equals_autograd_block_and_stream(reset, detach, recurrent, surrogate, rule, monkeypatch):
    """Plain LIF layers (learned time constants and thresholds, lateral weights with their
    self-connection) in chunked mode: the no-autograd block with the compiled per-neuron pass
    (kernels.lif_online._lif_block_vec) equals the autograd block and the reference stream path, and the
    compiled stream path equals the reference one: outputs, losses, traces and gradients, with a
    per-sample reset and steps without a loss; the surrogate's derivative inside the kernel (fast
    sigmoid, arc-tangent), or the torch block for a surrogate without a compiled form (sigmoid)."""
    from spikerec.kernels import lif_online

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    kw = dict(tau_mem=5.0, threshold=0.4, reset=reset, detach_reset=detach, recurrent=recurrent,
              zero_diagonal=False, learn_threshold=True, surrogate=surrogate)
    cells = [LIF(5, 6, **kw), LIF(6, 6, **kw)]
    for c in cells:
        with torch.no_grad():
            c.weight.mul_(2.0)
    model = RecurrentStack(cells, LeakyReadout(6, 3, tau=4.0))
    T, B = int(torch.randint(11, 18, ())), 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    resets = [(6, torch.tensor([True, False, True]))]
    calls = []
    real = lif_online._lif_block_vec
    monkeypatch.setattr(lif_online, "_lif_block_vec", lambda *a: calls.append(1) or real(*a))
    y1, l1, tr1, g1 = run_steps(model, x, tgt, closed=True, resets=resets, rule=rule)
    # the compiled per-neuron pass runs exactly under the J-rule, with a surrogate that has a compiled form
    assert bool(calls) == (rule == "full" and surrogate != "sigmoid")
    y0, l0, tr0, g0 = run_steps(model, x, tgt, closed=False, resets=resets, rule=rule)
    y2, l2, tr2, g2 = run_steps(model, x, tgt, closed=False, resets=resets, rule=rule, mode="stream")
    y3, l3, tr3, g3 = run_steps(model, x, tgt, closed=False, resets=resets, rule=rule, mode="stream")
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12) and torch.allclose(y1, y2, rtol=0, atol=1e-12)
    assert torch.allclose(y2, y3, rtol=0, atol=1e-12)
    assert torch.allclose(l0, l1, rtol=0, atol=1e-12) and torch.allclose(l1, l2, rtol=0, atol=1e-10)
    close(tr0, tr1)
    close(tr2, tr3)
    for g in (g0, g2, g3):
        close(g, g1)
    assert g1["cells.0.weight"].abs().sum() > 0
    with torch.no_grad():
        rate = float(cells[0](x)[0].mean())
    assert 0.02 < rate < 0.9


def test_compiled_chunk_block_is_taken_and_autograd_is_not_called(monkeypatch):
    model = build("lru", False)
    x, tgt = torch.randn(8, 2, 5), torch.randn(8, 2, 3)
    lr = OnlineLearner(model, loss=mse_step_loss, mode="chunked", chunk=4)
    assert lr._compiled_block_ok()

    def boom(*a, **k):
        raise AssertionError("autograd called")

    monkeypatch.setattr(torch.autograd, "grad", boom)
    monkeypatch.setattr(torch.Tensor, "backward", boom)
    for t in range(8):
        lr.step(x[t], tgt[t])
    lr.update()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("kind", ["lru", "lru_alif"])
@pytest.mark.parametrize("loss", ["mse", "ce_mean", "ce_last"])
def test_backward_chunked_closed_form_equals_autograd(kind, loss):
    """backward() over a whole sequence (chunk not dividing T) with the package's losses."""
    model = build(kind, False)
    T, B = 13, 3
    x = torch.randn(T, B, 5)
    if loss == "mse":
        fn, tgt = mse_loss, torch.randn(T, B, 3)
    else:
        fn, tgt = classification_loss(loss[3:], T), torch.randint(0, 3, (B,))
    out = []
    for closed in (False, True):
        model.zero_grad()
        lr = OnlineLearner(model, mode="chunked", chunk=5, backend="auto" if closed else "reference")
        L = lr.backward(x, tgt, fn)
        out.append((L, {n: p.grad.clone() for n, p in named(model)}))
    assert abs(out[0][0] - out[1][0]) < 1e-10 * max(1.0, abs(out[0][0]))
    close(out[0][1], out[1][1])


def test_update_policy_and_checkpoint_mid_block(tmp_path):
    """Adam every 6 steps (not a multiple of the block of 4), a checkpoint mid-block restored
    into a new learner: the same weights as the autograd block's uninterrupted run."""
    kind = "lru_alif"
    model = build(kind, True)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    x, tgt = torch.randn(15, 2, 5), torch.randn(15, 2, 3)

    def make(closed):
        model.load_state_dict(init)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        lr = OnlineLearner(model, loss=mse_step_loss, mode="chunked", chunk=4, optimizer=opt, update_every=6,
                           backend="auto" if closed else "reference")
        return lr, opt

    lr, _ = make(False)
    for t in range(15):
        lr.step(x[t], tgt[t])
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    lr, opt = make(True)
    for t in range(9):
        lr.step(x[t], tgt[t])
    ck = tmp_path / "ck.safetensors"
    save_stream(ck, lr)
    w = {k: v.clone() for k, v in model.state_dict().items()}
    ost = opt.state_dict()
    lr, opt = make(True)
    model.load_state_dict(w)
    opt.load_state_dict(ost)
    load_stream(ck, lr)
    for t in range(9, 15):
        lr.step(x[t], tgt[t])
    for k in ref:
        assert torch.allclose(ref[k], model.state_dict()[k], rtol=1e-9, atol=1e-11), k
    assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-4


def test_mse_block_loss_is_one_call_per_block(monkeypatch):
    """backward() in chunked mode takes mse_loss's whole-block value and gradient, not the per-step one,
    and gets what the per-step form gets."""
    model = build("lru", False)
    T, B = 13, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    block_vg = mse_loss.block_value_and_grad
    monkeypatch.setattr(mse_loss, "block_value_and_grad", None)  # the reference: K per-step calls per block
    model.zero_grad()
    L_ref = OnlineLearner(model, mode="chunked", chunk=5).backward(x, tgt, mse_loss)
    g_ref = {n: p.grad.clone() for n, p in named(model)}
    calls = []

    def per_step(*a):
        raise AssertionError("the per-step loss gradient was called")

    def counted(*a):
        calls.append(a[2:])
        return block_vg(*a)

    monkeypatch.setattr(mse_loss, "value_and_grad", per_step)
    monkeypatch.setattr(mse_loss, "block_value_and_grad", counted)
    model.zero_grad()
    L = OnlineLearner(model, mode="chunked", chunk=5).backward(x, tgt, mse_loss)
    assert calls == [(0, 5), (5, 10), (10, 13)]
    assert abs(L - L_ref) < 1e-12 * max(1.0, abs(L_ref))
    close(g_ref, {n: p.grad.clone() for n, p in named(model)})

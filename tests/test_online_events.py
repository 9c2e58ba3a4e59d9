"""The chunked LIF block's event-driven products (:mod:`spikerec.hardware.online.event_products`)
against the GEMMs they replace, and the prepared LIF-stack block
(:mod:`spikerec.hardware.online.block_lif`) against the general no-autograd block (bit-identical)
and the reference stream path; fresh random networks and inputs."""
import numpy as np
import pytest
import torch

from spikerec.hardware.online import OnlineLearner
from spikerec.hardware.online import block as block_mod
from spikerec.hardware.online import block_lif, event_products
from spikerec.hardware.online.learner import mse_loss, mse_step_loss
from spikerec.layers import LIF, LeakyReadout
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread, named  # noqa: F401

pytestmark = pytest.mark.skipif(not event_products._HAVE_NUMBA, reason="needs numba")


def sparse_input(shape, density, gen, dtype=torch.float64, binary=False):
    """Entries non-zero with probability ``density``: ones, or (not ``binary``) values of both signs."""
    mask = torch.rand(shape, generator=gen) < density
    vals = torch.ones(shape) if binary else torch.randn(shape, generator=gen)
    return (mask * vals).to(dtype)


@pytest.mark.parametrize("dtype,H", [(torch.float64, 7), (torch.float32, 8), (torch.float32, 9)])
@pytest.mark.parametrize("bias", [True, False])
def test_event_products_equal_the_gemms(dtype, H, bias):
    """The three products from the events equal torch's GEMMs (float64 to 1e-12; float32 to
    1e-5): ``pre Wt + b``, ``gh^T pre`` and ``Phi_b^T pre_b``; float32 rows of an odd or even
    number of entries (read as 64-bit words or one entry at a time)."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    K, B, N = int(torch.randint(3, 9, (), generator=g)), int(torch.randint(1, 5, (), generator=g)), 6
    R = K * B
    pre = sparse_input((R, H), 0.06, g, dtype)
    pre[0, 0] = -0.0  # a negative zero is no event
    Wt = torch.randn(H, N, generator=g).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    gh = torch.randn(R, N, generator=g).to(dtype)
    P0 = torch.randn(B, K, N, generator=g).to(dtype)
    ws = event_products.event_workspace(R, H, N, B, dtype)
    assert event_products.spike_events(pre, ws)
    assert ws["ptr"][-1] == int((pre != 0).sum())
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    out = torch.empty(R, N, dtype=dtype)
    event_products.event_current(ws, Wt, b, out)
    ref = pre @ Wt + (b if bias else 0)
    assert torch.allclose(out, ref, **tol)
    for use_g, carry in [(True, True), (True, False), (False, True)]:
        accT, qT = event_products.event_grads(ws, gh.numpy() if use_g else None, P0.numpy(), B, carry)
        if use_g:
            assert torch.allclose(torch.from_numpy(accT), (gh.t() @ pre).t(), **tol)
        if carry:
            q = torch.bmm(P0.transpose(1, 2), pre.view(K, B, H).transpose(0, 1))  # [B, N, H]
            assert torch.allclose(torch.from_numpy(qT), q.transpose(1, 2), **tol)


@pytest.mark.parametrize("bias,trained", [(True, True), (False, True), (True, False)])
def test_event_readout_mse_equals_torch(bias, trained):
    """The readout of spikes listed as events with the MSE and its backward in one call equals
    torch in float64: loss, ``dW += gy^T z``, ``db += sum gy``, ``gz = gy W``."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    R, N, O = 40, 9, 4
    z = sparse_input((R, N), 0.08, g, binary=True)
    W, b, tgt = torch.randn(O, N, generator=g), torch.randn(O, generator=g), torch.randn(R, O, generator=g)
    dW0, db0 = torch.randn(O, N, generator=g), torch.randn(O, generator=g)  # accumulators already holding sums
    ws = event_products.event_workspace(R, N, O, 2, torch.float64)
    assert event_products.spike_events(z, ws)
    y, gy, gz = torch.empty(R, O), torch.empty(R, O), torch.empty(R, N)
    dW, db = dW0.clone(), db0.clone()
    WT = W.t().contiguous().numpy()
    loss = event_products.event_readout_mse(ws, W, WT, b if bias else None, y, tgt, gy, dW if trained else None,
                                            db if (trained and bias) else None, gz)
    y_ref = z @ W.t() + (b if bias else 0)
    d = y_ref - tgt
    assert torch.allclose(y, y_ref, rtol=1e-12, atol=1e-12)
    assert loss == pytest.approx(0.5 * float((d ** 2).sum()), rel=1e-12)
    assert torch.allclose(gz, d @ W, rtol=1e-12, atol=1e-12)
    if trained:
        assert torch.allclose(dW, dW0 + d.t() @ z, rtol=1e-12, atol=1e-12)
        if bias:
            assert torch.allclose(db, db0 + d.sum(0), rtol=1e-12, atol=1e-12)


def test_dense_input_keeps_the_gemms():
    """At or above EVENT_DENSITY non-zeros the events are not listed (the GEMM form runs)."""
    g = torch.Generator().manual_seed(3)
    R, H = 40, 10
    ws = event_products.event_workspace(R, H, 4, 2, torch.float64)
    dense = sparse_input((R, H), 0.5, g)
    assert not event_products.spike_events(dense, ws)
    limit = event_products.event_limit(R * H)
    sparse = torch.zeros(R, H)
    sparse.view(-1)[: limit - 1] = 1.0
    assert event_products.spike_events(sparse, ws)
    sparse.view(-1)[limit - 1] = 1.0
    assert not event_products.spike_events(sparse, ws)
    with pytest.raises(ValueError, match="do not fit"):
        event_products.spike_events(torch.zeros(R + 1, H), ws)


def lif_stack(H=7, N=6, O=3, learn_threshold=True, bias=True, seed=None, threshold=0.5):
    torch.manual_seed(int(torch.randint(0, 10_000, ())) if seed is None else seed)
    kw = dict(tau_mem=5.0, threshold=threshold, learn_threshold=learn_threshold, bias=bias)
    cells = [LIF(H, N, **kw), LIF(N, N, **kw)]
    with torch.no_grad():
        cells[0].weight.mul_(2.0)
        cells[1].weight.mul_(1.5)
    return RecurrentStack(cells, LeakyReadout(N, O))  # a linear readout


def top_rate(model, x):
    """The spike rate of the top LIF layer on ``x``."""
    with torch.no_grad():
        _, _, hidden = model(x, record=True)
    return float(hidden[-1].mean())


def user_mse(y, target, t):
    """The package's MSE as a user's loss (the same closed forms, not the package's object)."""
    return mse_loss(y, target, t)


user_mse.value_and_grad = mse_loss.value_and_grad
user_mse.block_value_and_grad = mse_loss.block_value_and_grad


def run_backward(model, x, tgt, chunk, lean, monkeypatch, loss=user_mse):
    """``backward`` in chunked mode with or without the prepared LIF-stack block; returns the
    gradients, the loss, how many blocks the prepared block ran and how many of them computed
    the readout and MSE in one compiled call."""
    runs, fused = [], []
    real_run, real_mse = block_lif.LIFStackBlock.run, block_lif.event_readout_mse
    monkeypatch.setattr(block_lif.LIFStackBlock, "run", lambda self, *a: runs.append(1) or real_run(self, *a))
    monkeypatch.setattr(block_lif, "event_readout_mse", lambda *a: fused.append(1) or real_mse(*a))
    monkeypatch.setattr(block_mod, "lif_stack_block", block_lif.lif_stack_block if lean else (lambda *a: None))
    model.zero_grad()
    lr = OnlineLearner(model, mode="chunked", chunk=chunk)
    total = lr.backward(x, tgt, loss)
    grads = {n: p.grad.clone() for n, p in named(model)}
    return grads, total, len(runs), len(fused)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("learn_threshold,bias,density", [(True, True, 0.05), (False, False, 0.3)])
def test_lif_stack_block_is_bit_identical_to_the_general_block(dtype, learn_threshold, bias, density, monkeypatch):
    """The prepared block of a LIF stack under a linear readout gives exactly (torch.equal) the
    gradients and loss of the general no-autograd block, over several blocks with a shorter last
    one, for a loss with a whole-block value and gradient; spike inputs sparse enough for the
    event-driven products, or dense."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    model = lif_stack(learn_threshold=learn_threshold, bias=bias).to(dtype)
    T, B = 23, 3
    x = sparse_input((T, B, 7), density, g, dtype, binary=True)
    tgt = torch.randn(T, B, 3, generator=g).to(dtype)
    g1, l1, n1, f1 = run_backward(model, x, tgt, 5, True, monkeypatch)
    g0, l0, n0, _ = run_backward(model, x, tgt, 5, False, monkeypatch)
    assert n1 == 5 and n0 == 0 and f1 == 0
    assert l1 == l0
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    assert g1["cells.0.weight"].abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False])
def test_lif_stack_block_with_the_package_mse_in_one_call(dtype, bias, monkeypatch):
    """With the package's ``mse_loss`` and sparse spikes in the top layer, the prepared block
    computes the readout, the loss and the readout's backward in one compiled call on the spikes'
    events: the loss and gradients equal the general block's (float64 to 1e-12, float32 to 1e-5;
    the compiled sums run in another order)."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    T, B = 23, 3
    for _ in range(50):  # a fresh network whose top layer spikes, sparsely
        model = lif_stack(bias=bias, threshold=1.2, N=16).to(dtype)
        x = sparse_input((T, B, 7), 0.3, g, dtype, binary=True)
        if 0.01 < top_rate(model, x) < event_products.EVENT_DENSITY:
            break
    else:
        pytest.fail("no network with a sparse spiking top layer drawn")
    tgt = torch.randn(T, B, 3, generator=g).to(dtype)
    g1, l1, n1, f1 = run_backward(model, x, tgt, 5, True, monkeypatch, loss=mse_loss)
    g0, l0, _, _ = run_backward(model, x, tgt, 5, False, monkeypatch, loss=mse_loss)
    assert n1 == 5 and f1 >= 1  # (a block whose top-layer spikes are denser takes the torch loss)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    assert l1 == pytest.approx(l0, rel=tol["rtol"])
    for n in g0:
        assert torch.allclose(g0[n], g1[n], **tol), (n, (g0[n] - g1[n]).abs().max())
    assert g1["readout.weight"].abs().sum() > 0
    # a target of another dtype or layout takes the torch loss (no compiled call), same values
    g2, l2, _, f2 = run_backward(model, x, tgt.transpose(0, 1).contiguous().transpose(0, 1), 5, True, monkeypatch,
                                 loss=mse_loss)
    assert f2 == 0 and l2 == pytest.approx(l0, rel=tol["rtol"])


def test_lif_stack_block_in_a_stream_with_resets_and_steps_without_a_loss(monkeypatch):
    """Chunked ``step`` calls (per-step losses, some steps and one whole block without a target,
    a per-sample reset): the prepared block equals the general block exactly and the reference
    stream path to 1e-10 (float64), with the event-driven products taken."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    model = lif_stack()
    T, B = 26, 3
    x = sparse_input((T, B, 7), 0.08, g, binary=True)
    tgt = torch.randn(T, B, 3, generator=g)
    no_loss = {t for t in range(T) if t % 5 == 3} | set(range(8, 12))  # steps 8-11: a whole block of 4

    def stream(mode, lean, **kw):
        monkeypatch.setattr(block_mod, "lif_stack_block", block_lif.lif_stack_block if lean else (lambda *a: None))
        model.zero_grad()
        lr = OnlineLearner(model, loss=mse_step_loss, mode=mode, chunk=4 if mode == "chunked" else None, **kw)
        ys = []
        for t in range(T):
            if t == 14:
                lr.reset(torch.tensor([True, False, True]))
            y, _ = lr.step(x[t], None if t in no_loss else tgt[t])
            ys.append(y)
        lr.update()
        return torch.stack(ys), {n: p.grad.clone() for n, p in named(model)}

    events = []
    real = event_products._events
    monkeypatch.setattr(event_products, "_events", lambda *a: events.append(1) or real(*a))
    y1, g1 = stream("chunked", True)
    assert events, "the event-driven products ran"
    y0, g0 = stream("chunked", False)
    y2, g2 = stream("stream", False, fast=False)
    assert torch.equal(y0, y1)
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
        assert torch.allclose(g1[n], g2[n], rtol=1e-10, atol=1e-12), (n, (g1[n] - g2[n]).abs().max())
    assert torch.allclose(y1, y2, rtol=0, atol=1e-12)


def test_lif_stack_block_applies_only_where_it_fits():
    """Made for plain LIF stacks under a linear readout on the CPU; not for a leaky readout or a
    layer with lateral weights (those take the general block)."""
    x = torch.zeros(4, 2, 7)
    lr = OnlineLearner(lif_stack(), mode="chunked", chunk=4)
    lr._start(2, x.device, x.dtype)
    assert isinstance(block_lif.lif_stack_block(lr, x), block_lif.LIFStackBlock)
    assert block_lif.lif_stack_block(lr, x) is block_lif.lif_stack_block(lr, x)  # kept while the constants are
    leaky = RecurrentStack([LIF(7, 6), LIF(6, 6)], LeakyReadout(6, 3, tau=4.0))
    lateral = RecurrentStack([LIF(7, 6, recurrent=True), LIF(6, 6)], LeakyReadout(6, 3))
    for model in (leaky, lateral):
        lr = OnlineLearner(model, mode="chunked", chunk=4)
        lr._start(2, x.device, x.dtype)
        assert block_lif.lif_stack_block(lr, x) is None


def test_lif_stack_block_checkpoint_mid_block_resumes_bit_identically(tmp_path, monkeypatch):
    """Chunked ``step`` calls on the prepared block with Adam every 6 steps (blocks of 4), a
    checkpoint mid-block restored into a new learner: the weights equal the uninterrupted run's
    exactly (the event lists and scratch arrays carry nothing across blocks)."""
    from spikerec.hardware.online import load_stream, save_stream

    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    model = lif_stack()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    T, B = 19, 3
    x = sparse_input((T, B, 7), 0.08, g, binary=True)
    tgt = torch.randn(T, B, 3, generator=g)
    runs = []
    real_run = block_lif.LIFStackBlock.run
    monkeypatch.setattr(block_lif.LIFStackBlock, "run", lambda self, *a: runs.append(1) or real_run(self, *a))

    def make():
        model.load_state_dict(init)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        return OnlineLearner(model, loss=mse_step_loss, mode="chunked", chunk=4, optimizer=opt, update_every=6), opt

    lr, _ = make()
    for t in range(T):
        lr.step(x[t], tgt[t])
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    assert runs
    lr, opt = make()
    for t in range(10):
        lr.step(x[t], tgt[t])
    ck = tmp_path / "ck.safetensors"
    save_stream(ck, lr)
    w, ost = {k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict()
    lr, opt = make()
    model.load_state_dict(w)
    opt.load_state_dict(ost)
    load_stream(ck, lr)
    for t in range(10, T):
        lr.step(x[t], tgt[t])
    for k in ref:
        assert torch.equal(ref[k], model.state_dict()[k]), k
    assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-4

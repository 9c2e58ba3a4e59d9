"""The whole-stack compiled stream step (``whole_stack``: LRU, ALIF and plain LIF layers under a linear or leaky
readout, with the readout-filtered traces of the layer under a leaky one) against
the reference path (``backend="reference"``: per-step autograd backward, torch trace updates), and the
closed-form loss gradients against autograd. float64, fresh random networks and inputs."""
import pytest
import torch
import torch.nn.functional as F

from spikerec.hardware.online import OnlineLearner, classification_loss, load_stream, mse_loss, save_stream
from spikerec.hardware.online.learner import cross_entropy_step_loss, mse_step_loss
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.layers.lru import LRU
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread, named, step_stream, traces_of  # noqa: F401

pytest.importorskip("numba")


def user_loss(y, tgt):  # no closed form: the fused path takes one autograd call on the output
    return 0.5 * ((y - tgt) ** 2).sum() + (y.tanh() * tgt).sum()


def build(variant, H=5, N=6, K=3):
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    if variant == "matD":  # LRU output size != input size: a matrix skip D
        cells = [LRU(H, N), LRU(H, N, output_size=4)]
        width = 4
    elif variant == "one":
        cells = [LRU(H, N)]
        width = H
    else:  # three layers, vector D everywhere
        cells = [LRU(H, N), LRU(H, N), LRU(H, N)]
        width = H
    return RecurrentStack(cells, LeakyReadout(width, K))


def build_alif(variant, H=5, N=6, K=3):
    """ALIF stacks (lateral weights, both reset-gradient forms, both inline surrogates) and a
    mixed LRU/ALIF stack; spiking inputs."""
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    kw = dict(tau_mem=3.0, tau_adapt=15.0, b=0.2, beta=0.6)
    if variant == "rec":
        cells = [ALIF(H, N, recurrent=True, **kw), ALIF(N, N, recurrent=True, **kw)]
    elif variant == "ff_atan_nodetach":
        cells = [ALIF(H, N, surrogate="atan", detach_reset=False, **kw), ALIF(N, N, recurrent=True,
                                                                            detach_reset=False, **kw)]
    else:  # mixed: ALIF under an LRU, LRU under an ALIF
        cells = [ALIF(H, N, recurrent=True, **kw), LRU(N, N), ALIF(N, N, **kw)]
    return RecurrentStack(cells, LeakyReadout(N, K))


def build_lif(variant, H=5, N=6, K=3):
    """Plain LIF stacks (the three resets, both reset-gradient forms, lateral weights with their
    self-connection, learned thresholds, both inline surrogates) and a mixed LIF/LRU/ALIF stack."""
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    kw = dict(tau_mem=4.0, threshold=0.5, learn_threshold=True)
    if variant == "subtract_rec":
        cells = [LIF(H, N, recurrent=True, zero_diagonal=False, **kw), LIF(N, N, recurrent=True, **kw)]
    elif variant == "zero_atan_nodetach":
        cells = [LIF(H, N, reset="zero", surrogate="atan", detach_reset=False, **kw),
                 LIF(N, N, reset="zero", recurrent=True, zero_diagonal=False, detach_reset=False, **kw)]
    elif variant == "none":
        cells = [LIF(H, N, reset="none", **kw), LIF(N, N, reset="none", recurrent=True, **kw)]
    else:  # mixed: LIF under an LRU and an ALIF
        cells = [LIF(H, N, recurrent=True, **kw), LRU(N, N), ALIF(N, N, tau_mem=3.0, b=0.2, beta=0.6)]
    return RecurrentStack(cells, LeakyReadout(N, K))


def test_fused_lif_needs_an_inline_surrogate_and_a_plain_lif():
    for cells in ([LIF(5, 6, surrogate="gaussian"), LIF(6, 6)], [LIF(5, 6, tau_syn=3.0), LIF(6, 6)]):
        lr = OnlineLearner(RecurrentStack(cells, LeakyReadout(6, 3)), loss=mse_step_loss)
        lr.step(torch.rand(2, 5), torch.randn(2, 3))
        assert lr._whole_stack is None


SPIKING = [("alif", v) for v in ("rec", "ff_atan_nodetach", "mixed")] + \
    [("lif", v) for v in ("subtract_rec", "zero_atan_nodetach", "none", "mixed")]


@pytest.mark.parametrize("kind,variant", SPIKING)
@pytest.mark.parametrize("loss", [user_loss, mse_step_loss])
def test_fused_spiking_equals_reference_with_resets(kind, variant, loss):
    model = (build_alif if kind == "alif" else build_lif)(variant)
    T, B = int(torch.randint(14, 20, ())), 3
    x = (torch.rand(T, B, 5) < 0.4).double() * 1.5
    tgt = torch.randn(T, B, 3)
    resets = [(5, torch.tensor([True, False, True])), (11, None)]
    ref = run(model, x, tgt, False, loss, resets=resets)
    new = run(model, x, tgt, None, loss, resets=resets)
    check_same(ref, new)
    with torch.no_grad():  # the first layer fires, but not always
        rate = float(model.cells[0](x)[0].mean())
    assert 0.01 < rate < 0.9


@pytest.mark.parametrize("kind", ["alif", "lif"])
def test_fused_spiking_float32_close_to_float64_reference(kind):
    model = build_alif("rec") if kind == "alif" else build_lif("subtract_rec")
    T, B = 14, 2
    x = (torch.rand(T, B, 5) < 0.4).double() * 1.5
    tgt = torch.randn(T, B, 3)
    ref = run(model, x, tgt, False, mse_step_loss)
    m32 = model.float()
    new = run(m32, x.float(), tgt.float(), None, mse_step_loss)
    for n in ref[3]:
        assert torch.allclose(ref[3][n], new[3][n].double(), rtol=1e-3, atol=1e-4), n


def test_fused_alif_needs_an_inline_surrogate():
    model = RecurrentStack([ALIF(5, 6, surrogate="gaussian"), ALIF(6, 6)], LeakyReadout(6, 3))
    lr = OnlineLearner(model, loss=mse_step_loss)
    lr.step(torch.rand(2, 5), torch.randn(2, 3))
    assert lr._whole_stack is None  # the per-layer compiled trace steps run instead


def run(model, x, tgt, fused, loss, resets=(), opt_lr=None, **kw):
    """``fused``: ``False`` the reference backend, ``None`` the compiled one taking the whole-stack
    step, ``"layers"`` the compiled one on a stack the whole-stack step does not cover."""
    model.zero_grad()
    opt = torch.optim.SGD(model.parameters(), lr=opt_lr) if opt_lr else None
    lr = OnlineLearner(model, loss=loss, optimizer=opt, backend="reference" if fused is False else "compiled", **kw)
    ys, ls = step_stream(lr, x, tgt, resets)  # some steps without a loss
    assert (lr._whole_stack is not None) == (fused is None)
    traces = traces_of(lr)
    lr.update()
    grads = {n: p.grad.clone() for n, p in named(model) if p.grad is not None}  # an optimiser zeroes them
    model.zero_grad()
    return ys, ls, traces, grads


def check_same(a, b, tol=1e-10, grads=True):
    y0, l0, tr0, g0 = a
    y1, l1, tr1, g1 = b
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12)
    assert torch.allclose(l0, l1, rtol=1e-12, atol=1e-12)
    assert tr0.keys() == tr1.keys()
    for n in tr0:
        assert torch.allclose(tr0[n], tr1[n], rtol=tol, atol=1e-12), n
    assert g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=tol, atol=1e-11), (n, (g0[n] - g1[n]).abs().max())
    assert not grads or any(g.abs().sum() > 0 for g in g1.values())


@pytest.mark.parametrize("variant", ["matD", "one", "three"])
@pytest.mark.parametrize("loss", [user_loss, mse_step_loss])
def test_fused_equals_reference_with_resets(variant, loss):
    model = build(variant)
    T, B = int(torch.randint(10, 16, ())), 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    resets = [(4, torch.tensor([True, False, True])), (8, None)]
    ref = run(model, x, tgt, False, loss, resets=resets)
    new = run(model, x, tgt, None, loss, resets=resets)
    check_same(ref, new)


@pytest.mark.parametrize("net", ["lru", "alif"])
def test_fused_equals_reference_with_updates_every_k_steps(net):
    """Parameters change every 3 steps (SGD): the fused path re-binds its views and constants."""
    model = build("matD") if net == "lru" else build_alif("rec")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    T, B = 14, 2
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    if net == "alif":
        x = (x > 0.3).double() * 1.5
    ref = run(model, x, tgt, False, mse_step_loss, opt_lr=0.002, update_every=3)
    p_ref = {n: p.detach().clone() for n, p in named(model)}
    model.load_state_dict(state)
    new = run(model, x, tgt, None, mse_step_loss, opt_lr=0.002, update_every=3)
    check_same(ref, new, grads=False)
    for n, p in named(model):
        assert not torch.equal(p.detach(), state[n])  # the optimiser did move it
        assert torch.allclose(p.detach(), p_ref[n], rtol=1e-10, atol=1e-12), n


def test_fused_truncate_and_discard():
    model = build("matD")
    T, B = 12, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    out = []
    for fused in (False, None):
        model.zero_grad()
        lr = OnlineLearner(model, loss=mse_step_loss, backend="auto" if fused is None else "reference")
        for t in range(T):
            if t == 3:
                lr.truncate(torch.tensor([False, True, False]))
            if t == 6:
                lr.discard()
            if t == 8:
                lr.truncate()
            lr.step(x[t], tgt[t])
        lr.update()
        out.append({n: p.grad.clone() for n, p in named(model)})
    for n in out[0]:
        assert torch.allclose(out[0][n], out[1][n], rtol=1e-10, atol=1e-12), n


@pytest.mark.parametrize("mode", ["mse", "mean", "last", "per_step"])
def test_fused_backward_equals_reference(mode):
    model = build("three")
    T, B = 9, 4
    x = torch.randn(T, B, 5)
    if mode == "mse":
        tgt, fn = torch.randn(T, B, 3), mse_loss
    else:
        tgt = torch.randint(0, 3, (T, B) if mode == "per_step" else (B,))
        fn = classification_loss(mode, T)
    res = []
    for fused in (False, None):
        model.zero_grad()
        lr = OnlineLearner(model, backend="auto" if fused is None else "reference")
        loss = lr.backward(x, tgt, fn)
        assert (lr._whole_stack is not None) == (fused is None)
        res.append((loss, {n: p.grad.clone() for n, p in named(model)}))
    assert abs(res[0][0] - res[1][0]) <= 1e-12 * max(1.0, abs(res[0][0]))
    for n in res[0][1]:
        assert torch.allclose(res[0][1][n], res[1][1][n], rtol=1e-10, atol=1e-12), n


def test_fused_float32_close_to_float64_reference():
    model = build("matD")
    T, B = 12, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    ref = run(model, x, tgt, False, mse_step_loss)
    m32 = model.float()
    new = run(m32, x.float(), tgt.float(), None, mse_step_loss)
    for n in ref[3]:
        assert torch.allclose(ref[3][n], new[3][n].double(), rtol=1e-3, atol=1e-4), n


@pytest.mark.parametrize("net", ["lru", "alif", "lif", "alif_leaky", "lif_leaky"])
def test_fused_checkpoint_resume_bit_identical(tmp_path, net):
    model = build("matD") if net == "lru" else build_alif("mixed") if net.startswith("alif") else build_lif("mixed")
    if net.endswith("_leaky"):  # the readout's traces and the filtered traces go through the checkpoint too
        model = leaky(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    T, B = 16, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    if net != "lru":
        x = (x > 0.3).double() * 1.5

    def make():
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        return OnlineLearner(model, loss=mse_step_loss, optimizer=opt, update_every=5)

    model.load_state_dict(state)
    lr = make()
    ys = [lr.step(x[t], tgt[t]).output for t in range(T)]
    lr.update()
    end = {n: p.detach().clone() for n, p in named(model)}

    model.load_state_dict(state)
    lr = make()
    ys2 = [lr.step(x[t], tgt[t]).output for t in range(7)]
    save_stream(tmp_path / "s.safetensors", lr)
    model.load_state_dict({k: torch.randn_like(v) for k, v in state.items()})  # overwritten by the load
    lr = make()
    load_stream(tmp_path / "s.safetensors", lr)
    assert lr._whole_stack is not None
    ys2 += [lr.step(x[t], tgt[t]).output for t in range(7, T)]
    lr.update()
    for a, b in zip(ys, ys2):
        assert torch.equal(a, b)
    for n, p in named(model):
        assert torch.equal(p.detach(), end[n]), n


def test_closed_form_loss_gradients_equal_autograd():
    B, K, T = 5, 4, 7
    y = torch.randn(B, K, requires_grad=True)
    tgt = torch.randn(B, K)
    lab = torch.randint(0, K, (B,))
    labs = torch.randint(0, K, (T, B))
    cases = [
        (mse_step_loss, (tgt,), mse_step_loss.value_and_grad),
        (cross_entropy_step_loss(0.3), (lab,), cross_entropy_step_loss(0.3).value_and_grad),
        (mse_loss, (torch.randn(T, B, K), 2), mse_loss.value_and_grad),
    ]
    for mode, target in (("mean", lab), ("per_step", labs), ("last", lab)):
        fn = classification_loss(mode, T)
        cases.append((fn, (target, T - 1), fn.value_and_grad))
    for fn, args, vg in cases:
        ref = fn(y, *args)
        (g_ref,) = torch.autograd.grad(ref, y)
        val, g = vg(y.detach(), *args)
        assert torch.allclose(val, ref.detach(), rtol=1e-13, atol=1e-14)
        assert torch.allclose(g, g_ref, rtol=1e-12, atol=1e-14)
    assert classification_loss("last", T).value_and_grad(y.detach(), lab, 0) is None
    assert torch.allclose(F.cross_entropy(y, lab), cross_entropy_step_loss()(y, lab))


@pytest.mark.parametrize("kind", ["alif", "lru_leaky"])
def test_per_layer_fast_path_with_closed_form_loss_equals_reference(kind):
    """Stacks the whole-stack step does not cover (a surrogate without an inline form; an LRU under
    a leaky readout with its filtered traces) take the per-layer compiled path; with the package's
    loss its gradient comes in closed form, and still equals the reference."""
    from spikerec.layers import ALIF

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    if kind == "alif":
        surr = {"name": "gaussian", "width": 0.5}
        cells = [ALIF(5, 6, surrogate=surr, tau_mem=5.0, b=0.3, beta=0.5),
                 ALIF(6, 6, surrogate=surr, tau_mem=5.0, b=0.3, beta=0.5)]
        for c in cells:
            with torch.no_grad():
                c.weight.mul_(3.0)
        model = RecurrentStack(cells, LeakyReadout(6, 3, tau=4.0))
        x = (torch.rand(13, 3, 5) < 0.5).double()
    else:
        model = RecurrentStack([LRU(5, 6), LRU(5, 6)], LeakyReadout(5, 3, tau=4.0))
        x = torch.randn(13, 3, 5)
    tgt = torch.randn(13, 3, 3)
    resets = [(6, torch.tensor([False, True, True]))]
    ref = run(model, x, tgt, False, mse_step_loss, resets=resets)
    new = run(model, x, tgt, "layers", mse_step_loss, resets=resets)
    check_same(ref, new)


def test_fused_mse_is_one_compiled_call(monkeypatch):
    """mse_step_loss on the whole-stack path: loss and gradient from the compiled MSE, not value_and_grad."""
    model = build("lru")
    x, tgt = torch.randn(6, 2, 5), torch.randn(6, 2, 3)
    lr = OnlineLearner(model, loss=mse_step_loss)

    def boom(*a):
        raise AssertionError("value_and_grad was called")

    monkeypatch.setattr(mse_step_loss, "value_and_grad", boom)
    for t in range(6):
        out, loss = lr.step(x[t], tgt[t])
        assert loss.dtype == out.dtype and loss.dim() == 0
        torch.testing.assert_close(loss, 0.5 * ((out - tgt[t]) ** 2).sum())  # float32: default tolerances
    assert lr._whole_stack is not None  # the whole-stack path ran


def test_lru_c_gradient_across_checkpoints(tmp_path):
    """The LRU layers' C gradient of the whole-stack step equals the reference, and a checkpoint
    mid-stream resumes bit-identically, or, restored into a learner without the whole-stack step,
    equal to rounding; a checkpoint holding C-gradient rows buffered by an earlier version is
    refused."""
    model = build("matD")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    T, B, cut = 77, 3, 41
    g = torch.Generator().manual_seed(5)
    x, tgt = torch.randn(T, B, 5, generator=g), torch.randn(T, B, 3, generator=g)

    def grads(lr):
        lr.update()
        return {n: p.grad.clone() for n, p in named(model)}

    model.load_state_dict(state)
    model.zero_grad()
    ref_lr = OnlineLearner(model, loss=mse_step_loss, backend="reference")
    for t in range(T):
        ref_lr.step(x[t], tgt[t])
    ref = grads(ref_lr)

    model.zero_grad()
    lr = OnlineLearner(model, loss=mse_step_loss)
    for t in range(T):
        lr.step(x[t], tgt[t])
    assert lr._whole_stack is not None
    full = grads(lr)
    for n in ref:
        assert torch.allclose(full[n], ref[n], rtol=1e-10, atol=1e-12), n

    model.zero_grad()
    lr = OnlineLearner(model, loss=mse_step_loss)
    for t in range(cut):
        lr.step(x[t], tgt[t])
    save_stream(tmp_path / "s.safetensors", lr)
    tensors, meta = lr.state_tensors()
    old = OnlineLearner(model, loss=mse_step_loss)
    with pytest.raises(ValueError, match="fused_rows/0/gy"):
        old.load_state_tensors({**tensors, "fused_rows/0/gy": torch.zeros(5, B, 3)}, meta)
    for fused, want, exact in ((None, full, True), (False, ref, False)):
        model.zero_grad()
        lr = OnlineLearner(model, loss=mse_step_loss, backend="auto" if fused is None else "reference")
        load_stream(tmp_path / "s.safetensors", lr)
        for t in range(cut, T):
            lr.step(x[t], tgt[t])
        got = grads(lr)
        for n in want:
            if exact:
                assert torch.equal(got[n], want[n]), n
            else:
                assert torch.allclose(got[n], want[n], rtol=1e-10, atol=1e-12), n


@pytest.mark.parametrize("cells", ["lru", "alif"])
def test_dropout_switched_on_mid_stream_leaves_the_fast_paths(cells):
    """A stream started in eval mode takes the whole-stack step, which has no dropout; a model
    put in training mode in the middle of the stream gets its dropout from the next step on (the
    learner continues on the reference path), with the same outputs and gradients as a learner
    that was on the reference path throughout (the same dropout masks, by seed)."""
    torch.manual_seed(3)
    kw = dict(tau_mem=3.0, tau_adapt=15.0, b=0.2, beta=0.6)
    layers = [LRU(5, 6), LRU(5, 6)] if cells == "lru" else [ALIF(5, 6, **kw), ALIF(6, 6, **kw)]
    model = RecurrentStack(layers, LeakyReadout(layers[-1].output_size, 3), dropout=0.4)
    model.eval()
    T, B = 12, 3
    x = torch.randn(T, B, 5) if cells == "lru" else (torch.rand(T, B, 5) < 0.5).double() * 1.5
    tgt = torch.randn(T, B, 3)
    learners = [OnlineLearner(model, loss=mse_step_loss), OnlineLearner(model, loss=mse_step_loss, backend="reference")]
    no_drop = []
    for t in range(T):
        if t == 6:
            assert learners[0]._whole_stack is not None  # the eval-mode steps took the whole-stack step
            model.train()
        outs = []
        for lr in learners:
            torch.manual_seed(100 + t)
            outs.append(lr.step(x[t], tgt[t]).output)
        assert torch.allclose(outs[0], outs[1], rtol=0, atol=1e-12), t
        no_drop.append(outs[0])
    assert learners[0]._whole_stack is None
    with torch.no_grad():  # the training-mode steps did apply dropout: eval mode gives other outputs
        model.eval()
        y_eval = model(x)[0]
    assert not torch.allclose(torch.stack(no_drop[6:]), y_eval[6:], atol=1e-6)
    grads = []
    for lr in learners:
        model.zero_grad()
        lr.update()
        grads.append({n: p.grad.clone() for n, p in named(model) if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], rtol=1e-9, atol=1e-12), n


@pytest.mark.parametrize("variant", ["subtract_rec", "mixed"])
def test_deferred_lif_matrix_traces_across_windows_and_checkpoints(tmp_path, variant):
    """The LIF layers' input and lateral matrix traces are applied in closed form every
    LIF_DEFER steps: over several windows, with a per-sample reset and a truncation inside a
    window and steps without a loss, the traces and gradients equal the reference stream's; a
    checkpoint inside a window (its steps saved as they are) resumes bit-identically, or,
    restored into a learner without the whole-stack step, applies the saved steps at once
    (equal to rounding)."""
    from spikerec.hardware.online.whole_stack import LIF_DEFER

    model = build_lif(variant)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    T, B, cut = 2 * LIF_DEFER + 13, 3, LIF_DEFER + 9
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    x = (torch.rand(T, B, 5, generator=g) < 0.4).double() * 1.5
    tgt = torch.randn(T, B, 3, generator=g)
    events = {20: ("reset", torch.tensor([True, False, False])), LIF_DEFER + 30: ("truncate", torch.tensor([False, True, False]))}

    def stream(lr, t0, t1):
        for t in range(t0, t1):
            if t in events:
                kind, mask = events[t]
                getattr(lr, kind)(mask)
            lr.step(x[t], None if t % 5 == 4 else tgt[t])

    def grads(lr):
        traces = traces_of(lr)
        lr.update()
        out = {n: p.grad.clone() for n, p in named(model) if p.grad is not None}
        model.zero_grad()
        return traces, out

    model.load_state_dict(state)
    model.zero_grad()
    ref_lr = OnlineLearner(model, loss=mse_step_loss, backend="reference")
    stream(ref_lr, 0, T)
    ref_tr, ref = grads(ref_lr)

    lr = OnlineLearner(model, loss=mse_step_loss)
    stream(lr, 0, T)
    assert lr._whole_stack is not None and lr._whole_stack.lmats
    full_tr, full = grads(lr)
    assert full_tr.keys() == ref_tr.keys() and full.keys() == ref.keys()
    for n in ref_tr:
        assert torch.allclose(full_tr[n], ref_tr[n], rtol=1e-10, atol=1e-12), n
    for n in ref:
        assert torch.allclose(full[n], ref[n], rtol=1e-10, atol=1e-11), (n, (full[n] - ref[n]).abs().max())
    assert full["cells.0.weight"].abs().sum() > 0

    lr = OnlineLearner(model, loss=mse_step_loss)
    stream(lr, 0, cut)
    fill = lr._whole_stack.lfill
    assert 0 < fill < LIF_DEFER  # inside a window (the reset at step 20 started a new one)
    save_stream(tmp_path / "s.safetensors", lr)
    assert lr._whole_stack.lfill == fill, "saving applies no deferred LIF step"
    stream(lr, cut, T)
    _, same = grads(lr)
    for n in full:
        assert torch.equal(same[n], full[n]), n
    for fused, want, exact in ((None, full, True), (False, ref, False)):
        lr = OnlineLearner(model, loss=mse_step_loss, backend="auto" if fused is None else "reference")
        load_stream(tmp_path / "s.safetensors", lr)
        stream(lr, cut, T)
        _, got = grads(lr)
        for n in want:
            if exact:
                assert torch.equal(got[n], want[n]), n
            else:
                assert torch.allclose(got[n], want[n], rtol=1e-10, atol=1e-11), n


LEAKY_STACKS = [("alif", "rec"), ("alif", "ff_atan_nodetach"), ("alif", "mixed"), ("lif", "subtract_rec"),
                ("lif", "zero_atan_nodetach"), ("lif", "none"), ("lif", "mixed"), ("lru", "matD"), ("lru", "three")]


def leaky(model, tau=(3.0, 6.0, 6.0), learn_tau=True, bias=True, learn_weight=True):
    """``model`` with its readout made leaky (per-output time constants, learned by default)."""
    ro = model.readout
    new = LeakyReadout(ro.input_size, ro.output_size, tau=torch.tensor(tau), learn_tau=learn_tau, bias=bias)
    with torch.no_grad():
        new.weight.copy_(ro.weight)
        if bias:
            new.bias.copy_(ro.bias)
    new.weight.requires_grad_(learn_weight)
    model.readout = new
    return model


@pytest.mark.parametrize("kind", ["alif", "lif"])
@pytest.mark.parametrize("readout", [dict(learn_tau=False), dict(bias=False), dict(learn_weight=False)])
def test_whole_stack_under_a_leaky_readout_with_some_parameters_untrained(kind, readout):
    """The leaky readout's trace step without one of its traced parameters (a fixed time constant,
    no bias, a frozen weight) equals the reference (float64)."""
    model = leaky((build_alif("rec") if kind == "alif" else build_lif("subtract_rec")), **readout)
    T, B = 13, 3
    x, tgt = (torch.rand(T, B, 5) < 0.4).double() * 1.5, torch.randn(T, B, 3)
    ref = run(model, x, tgt, False, mse_step_loss)
    new = run(model, x, tgt, None, mse_step_loss)
    check_same(ref, new)


@pytest.mark.parametrize("kind,variant", LEAKY_STACKS)
@pytest.mark.parametrize("filtered", [True, False])
@pytest.mark.parametrize("loss", [user_loss, mse_step_loss])
def test_whole_stack_under_a_leaky_readout_equals_reference(kind, variant, filtered, loss):
    """Under a leaky readout the whole-stack step advances the readout's own traces
    (``_leaky_bwd``) and, by default, the readout-filtered traces of the layer under it (LIF, ALIF;
    an LRU's filter keeps the per-layer step): outputs, losses, traces and gradients equal the
    reference's, through steps without a loss and per-sample resets (float64)."""
    model = leaky({"alif": build_alif, "lif": build_lif, "lru": build}[kind](variant))
    T, B = int(torch.randint(14, 20, ())), 3
    x = torch.randn(T, B, 5) if kind == "lru" else (torch.rand(T, B, 5) < 0.4).double() * 1.5
    tgt = torch.randn(T, B, 3)
    resets = [(5, torch.tensor([True, False, True])), (11, None)]
    filt = None if filtered else False
    whole = None if not (filtered and kind == "lru") else "layers"
    ref = run(model, x, tgt, False, loss, resets=resets, readout_filter=filt)
    new = run(model, x, tgt, whole, loss, resets=resets, readout_filter=filt)
    check_same(ref, new)
    if filtered:  # the filter ran: the layer under the readout learns otherwise than without it
        biased = run(model, x, tgt, False, loss, resets=resets, readout_filter=False)[3]
        top = f"cells.{len(model.cells) - 1}."
        assert any(not torch.allclose(new[3][n], biased[n]) for n in biased if n.startswith(top))


WHOLE_STACK_LAYERS = {
    "lif_subtract": lambda H, N: LIF(H, N, tau_mem=4.0, threshold=0.5, learn_threshold=True, detach_reset=False),
    "lif_zero_atan": lambda H, N: LIF(H, N, tau_mem=4.0, threshold=0.5, learn_threshold=True, reset="zero",
                                      surrogate="atan"),
    "lif_none": lambda H, N: LIF(H, N, tau_mem=4.0, threshold=0.5, reset="none"),
    "alif": lambda H, N: ALIF(H, N, tau_mem=3.0, tau_adapt=15.0, b=0.2, beta=0.6, recurrent=False),
    "alif_atan_nodetach": lambda H, N: ALIF(H, N, tau_mem=3.0, tau_adapt=15.0, b=0.2, beta=0.6, recurrent=False,
                                            surrogate="atan", detach_reset=False),
    "lru": lambda H, N: LRU(H, N),
    "lru_matD": lambda H, N: LRU(H, N, output_size=4),
}


@pytest.mark.parametrize("layer", sorted(WHOLE_STACK_LAYERS))
@pytest.mark.parametrize("loss", [mse_step_loss, user_loss])
@pytest.mark.parametrize("readout", ["linear", "leaky"])
def test_whole_stack_step_equals_bptt_through_the_neuron_steps(layer, loss, readout):
    """The whole-stack compiled stream step (``WholeStackStep.step``, a registered backend of the LIF,
    ALIF, LRU and readout kinds) on one layer without lateral weights under a linear readout, where
    exact online learning is BPTT, gives the gradients of autograd through the loop of the model's
    ``step`` (``spikerec.neurons.<kind>.step`` of each layer), and its outputs and losses: float64,
    fresh random networks and inputs, every reset, both inline surrogates, the closed-form MSE and a
    loss without one. Under a leaky readout with per-output time constants (learned) the same holds
    for a LIF or ALIF layer through its readout-filtered traces."""
    from spikerec import neurons
    from spikerec.hardware.online.whole_stack import WholeStackStep

    if readout == "leaky" and layer.startswith("lru"):
        pytest.skip("an LRU's filtered traces keep the per-layer step")
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    T, B, H, N, K = 10, 3, 5, 6, 3
    cell = WHOLE_STACK_LAYERS[layer](H, N)
    if not layer.startswith("lru"):
        with torch.no_grad():
            cell.weight.mul_(3.0)  # spikes at every layer
    model = RecurrentStack([cell], LeakyReadout(cell.output_size, K))
    if readout == "leaky":
        model = leaky(model)
    x, tgt = torch.rand(T, B, H) * 2, torch.randn(T, B, K)
    model.zero_grad()
    lr = OnlineLearner(model, loss=loss, backend="compiled")
    outs = [lr.step(x[t], tgt[t]) for t in range(T)]
    assert lr._whole_stack is not None, "the whole-stack step ran"
    lr.update()
    got = {n: p.grad.clone() for n, p in named(model) if p.grad is not None}
    model.zero_grad()
    states = model.initial_state(B, x.device, x.dtype)
    total = 0.0
    for t in range(T):
        y, states = model.step(x[t], states)
        l_t = loss(y, tgt[t])
        assert torch.allclose(outs[t][0], y.detach(), rtol=1e-12, atol=1e-12), t
        assert torch.allclose(outs[t][1], l_t.detach(), rtol=1e-12, atol=1e-12), t
        total = total + l_t
    ps = [(n, p) for n, p in named(model) if n in got]
    want = dict(zip([n for n, _ in ps], torch.autograd.grad(total, [p for _, p in ps])))
    assert set(got) == {n for n, p in named(model) if p.requires_grad}
    for n in got:
        assert torch.allclose(got[n], want[n], rtol=1e-9, atol=1e-11), (n, (got[n] - want[n]).abs().max())
    assert float(got["cells.0.weight" if "cells.0.weight" in got else "cells.0.B_re"].abs().sum()) > 0
    kind = {"lif": "lif", "ali": "alif", "lru": "lru"}[layer[:3]]
    for k in (kind, "readout"):
        assert any(b.fn is WholeStackStep.step for b in neurons.backends_of(k).values()), k

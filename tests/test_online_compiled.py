"""The compiled backend against the reference backend (``backend="reference"``: per-step autograd
spatial backward, torch partials, per-step trace updates; the specification), float64 on fresh
random networks and inputs:

* the step API: every step fills the window (``window.StepWindow``) with the kinds' compiled row
  kernels (``lr._window.fast is not None``; a CUBA LIF: the kinds' torch steps), and the window's
  rows are worked as one block by ``block.compiled_block`` (the kinds' hand-written spatial
  backward ``errors``, compiled block partials, the compiled per-lane pass), on LRU, ALIF, LIF and
  mixed stacks under linear and leaky readouts (with the readout-filtered traces), the rules
  full/trunc1/spatial, losses with and without a closed form, per-sample resets, steps without a
  loss, update policies, truncate/discard, checkpoints inside a window, dropout switched on
  mid-stream, float32;
* the batch form ``backward()`` in every mode (blocks of the layers' scans);
* the block scans against the step loops, and the closed-form loss gradients against autograd.
"""
import pytest
import torch
import torch.nn.functional as F

from spikerec.hardware.online import OnlineLearner, classification_loss, load_stream, mse_loss, save_stream
from spikerec.hardware.online.learner import cross_entropy_step_loss, mse_step_loss
from spikerec.hardware.online.window import STREAM_WINDOW
from spikerec.layers import ALIF, GRU, LIF, LeakyReadout
from spikerec.layers.lru import LRU
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread, block_spy, named, step_stream, traces_of  # noqa: F401

pytest.importorskip("numba")

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}
ALIF_KW = dict(tau_mem=3.0, tau_adapt=15.0, b=0.2, beta=0.6)
LIF_KW = dict(tau_mem=4.0, threshold=0.5, learn_threshold=True)


def user_loss(y, tgt):  # no closed form: the window takes one autograd call on the output
    return 0.5 * ((y - tgt) ** 2).sum() + (y.tanh() * tgt).sum()


def reseed():
    torch.manual_seed(int(torch.randint(0, 10_000, ())))


def stronger(cells):
    """Input weights x3: spikes in every layer."""
    for c in cells:
        if not isinstance(c, LRU):
            with torch.no_grad():
                c.weight.mul_(3.0)
    return cells


def lru_cells(variant, H=5, N=6):
    if variant == "matD":  # output size != input size: a matrix skip D
        return [LRU(H, N), LRU(H, N, output_size=4)]
    if variant == "one":  # a vector skip D
        return [LRU(H, N)]
    return [LRU(H, N), LRU(H, N), LRU(H, N)]  # "three": vector D everywhere


def alif_cells(variant, H=5, N=6):
    """ALIF stacks: lateral weights, both reset-gradient forms, both inline surrogates, a surrogate
    without a compiled form (the block's torch surrogate), a mixed LRU/ALIF stack."""
    if variant == "rec":
        return [ALIF(H, N, recurrent=True, **ALIF_KW), ALIF(N, N, recurrent=True, **ALIF_KW)]
    if variant == "ff_atan_nodetach":
        return [ALIF(H, N, surrogate="atan", detach_reset=False, **ALIF_KW),
                ALIF(N, N, recurrent=True, detach_reset=False, **ALIF_KW)]
    if variant == "mixed":  # ALIF under an LRU, LRU under an ALIF
        return [ALIF(H, N, recurrent=True, **ALIF_KW), LRU(N, N), ALIF(N, N, **ALIF_KW)]
    kw = dict(tau_mem=5.0, b=0.3, beta=0.5)
    if variant == "gaussian":
        surr = {"name": "gaussian", "width": 0.5}
        return stronger([ALIF(H, N, surrogate=surr, **kw), ALIF(N, N, surrogate=surr, **kw)])
    if variant == "strong":  # feed-forward, detached reset
        return stronger([ALIF(H, N, surrogate=SURR, **kw), ALIF(N, N, surrogate=SURR, **kw)])
    # "strong_rec_nodetach": lateral weights with their self-connection, the reset's gradient kept
    return stronger([ALIF(H, N, surrogate=SURR, detach_reset=False, **kw),
                     ALIF(N, N, surrogate=SURR, recurrent=True, detach_reset=False, zero_diagonal=False, **kw)])


def lif_cells(variant, H=5, N=6):
    """LIF stacks: the three resets, both reset-gradient forms, lateral weights with their
    self-connection, learned thresholds, both inline surrogates, a surrogate without a compiled
    form, the CUBA LIF (the window's torch steps), a mixed LIF/LRU/ALIF stack."""
    if variant == "subtract_rec":
        return [LIF(H, N, recurrent=True, zero_diagonal=False, **LIF_KW), LIF(N, N, recurrent=True, **LIF_KW)]
    if variant == "zero_atan_nodetach":
        return [LIF(H, N, reset="zero", surrogate="atan", detach_reset=False, **LIF_KW),
                LIF(N, N, reset="zero", recurrent=True, zero_diagonal=False, detach_reset=False, **LIF_KW)]
    if variant == "none":
        return [LIF(H, N, reset="none", **LIF_KW), LIF(N, N, reset="none", recurrent=True, **LIF_KW)]
    if variant == "mixed":  # LIF under an LRU and an ALIF
        return [LIF(H, N, recurrent=True, **LIF_KW), LRU(N, N), ALIF(N, N, tau_mem=3.0, b=0.2, beta=0.6)]
    if variant == "gaussian":
        surr = {"name": "gaussian", "width": 0.5}
        return [LIF(H, N, surrogate=surr, **LIF_KW), LIF(N, N, surrogate=surr, recurrent=True, **LIF_KW)]
    if variant == "cuba":
        return [LIF(H, N, tau_syn=3.0, detach_reset=False, **LIF_KW),
                LIF(N, N, tau_syn=3.0, recurrent=True, zero_diagonal=False, **LIF_KW)]
    # "strong_rec": lateral weights with their self-connection, a fixed threshold
    return stronger([LIF(H, N, surrogate=SURR, tau_mem=5.0), LIF(N, N, surrogate=SURR, tau_mem=5.0,
                                                                 recurrent=True, zero_diagonal=False)])


CELLS = {"lru": lru_cells, "alif": alif_cells, "lif": lif_cells}


def build(kind, variant, tau=None, K=3):
    """A fresh random stack of ``CELLS[kind](variant)`` under a linear (``tau=None``) or leaky readout."""
    reseed()
    cells = CELLS[kind](variant)
    return RecurrentStack(cells, LeakyReadout(cells[-1].output_size, K, tau=tau))


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


def inputs(kind, T, B, H=5, p=0.4, amp=1.5):
    """Real inputs for an LRU stack, spikes (``amp`` where ``rand < p``) for a spiking one."""
    return torch.randn(T, B, H) if kind == "lru" else (torch.rand(T, B, H) < p).double() * amp


def fires_sometimes(model, x):
    """The first layer fires, but not always."""
    with torch.no_grad():
        rate = float(model.cells[0](x)[0].mean())
    assert 0.01 < rate < 0.9, rate


def run(model, x, tgt, backend, loss=user_loss, resets=(), opt_lr=None, fast=True, **kw):
    """Stream ``x`` through ``OnlineLearner(backend=...)`` (``step_stream``: some steps without a
    loss, the ``resets``) and return ``(outputs, losses, traces, grads)``. Checks the path taken:
    the reference never opens a window; the compiled backend works every block by
    ``compiled_block`` (never ``autograd_block``) and its window steps every layer by its compiled
    row kernel (``fast``) or, with ``fast=False``, by the kinds' torch steps."""
    model.zero_grad()
    opt = torch.optim.SGD(model.parameters(), lr=opt_lr) if opt_lr else None
    with block_spy() as calls:
        lr = OnlineLearner(model, loss=loss, optimizer=opt, backend=backend, **kw)
        ys, ls = step_stream(lr, x, tgt, resets)
        traces = traces_of(lr)
        lr.update()
    if backend == "reference":
        assert lr._window is None and calls == {"compiled": 0, "autograd": 0}
    else:
        assert lr._compiled_block and calls["compiled"] > 0 and calls["autograd"] == 0, calls
        assert (lr._window.fast is not None) == fast
    grads = {n: p.grad.clone() for n, p in named(model) if p.grad is not None}  # an optimiser zeroes them
    model.zero_grad()
    return ys, ls, traces, grads


def check_same(a, b, tol=1e-10, atol_g=1e-11, rtol_l=1e-12, grads=True):
    y0, l0, tr0, g0 = a
    y1, l1, tr1, g1 = b
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12)
    assert torch.allclose(l0, l1, rtol=rtol_l, atol=1e-12)
    assert tr0.keys() == tr1.keys()
    for n in tr0:
        assert torch.allclose(tr0[n], tr1[n], rtol=tol, atol=1e-12), n
    assert g0.keys() == g1.keys()
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=tol, atol=atol_g), (n, (g0[n] - g1[n]).abs().max())
    assert not grads or any(g.abs().sum() > 0 for g in g1.values())


# --- the step API against the reference stream ----------------------------------------------------

STREAM_KINDS = {"lru": ("lru", "matD"), "lru_diag_skip": ("lru", "one"), "alif": ("alif", "strong"),
                "alif_reset": ("alif", "strong_rec_nodetach"), "lif": ("lif", "strong_rec"),
                "lif_cuba": ("lif", "cuba")}


@pytest.mark.parametrize("kind", sorted(STREAM_KINDS))
@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("rule", ["full", "trunc1", "spatial"])
def test_compiled_stream_equals_reference_stream(kind, leaky, rule):
    """The hand-written spatial backward (every kind's ``errors``: LRU, ALIF, LIF incl. CUBA, the
    linear and leaky readouts; a registered backend) in the compiled block, against the reference
    stream's per-step autograd backward: outputs, losses, traces and gradients in float64, every
    rule, a per-sample reset, steps without a loss."""
    cells, variant = STREAM_KINDS[kind]
    model = build(cells, variant, tau=4.0 if leaky else None)
    T, B = int(torch.randint(9, 15, ())), 3
    x = torch.randn(T, B, 5) if cells == "lru" else (torch.rand(T, B, 5) < 0.5).double()
    tgt = torch.randn(T, B, 3)
    resets = [(5, torch.tensor([True, False, True]))]
    ref = run(model, x, tgt, "reference", resets=resets, rule=rule)
    new = run(model, x, tgt, "compiled", resets=resets, rule=rule, fast=kind != "lif_cuba")
    check_same(ref, new, atol_g=1e-12, rtol_l=0)
    if cells != "lru":
        fires_sometimes(model, x)


def test_which_steps_and_blocks_a_stack_takes(monkeypatch):
    """Plain LIF, ALIF and LRU stacks: the window's compiled row kernels and the compiled block
    (compiled surrogate derivatives). A CUBA LIF: the compiled block (torch partials) after the
    window's torch steps, on ``auto`` and on ``compiled``. A surrogate without a compiled form: the
    compiled steps (the forward needs no surrogate) and the compiled block with the torch
    surrogate. Active dropout or a cell without a hand-written backward (a GRU): the reference
    paths, and backend ``compiled`` refuses them."""
    from spikerec.kernels import surrogate_numba

    real, sd_calls = surrogate_numba.scaled_derivative, []
    monkeypatch.setattr(surrogate_numba, "scaled_derivative", lambda *a: sd_calls.append(1) or real(*a))

    def one_step(cells, backend="auto", ro=None, **kw):
        model = RecurrentStack(cells, ro or LeakyReadout(cells[-1].output_size, 2), **kw)
        sd_calls.clear()
        with block_spy() as calls:
            lr = OnlineLearner(model, loss=user_loss, backend=backend)
            lr.step((torch.rand(2, 3) < 0.5).double(), torch.randn(2, 2))
            lr.update()
        return lr, calls, len(sd_calls)

    for cells in ([LIF(3, 4)], [ALIF(3, 4, recurrent=True)], [LRU(3, 4)], [LIF(3, 4), LRU(4, 4), ALIF(4, 4)]):
        lr, calls, sd_n = one_step(cells)
        assert lr._compiled_block and lr._window.fast is not None and calls == {"compiled": 1, "autograd": 0}
        assert sd_n == sum(not isinstance(c, LRU) for c in cells)  # one per spiking layer
    for backend in ("auto", "compiled"):
        lr, calls, _ = one_step([LIF(3, 4, tau_syn=5.0)], backend)
        assert lr._compiled_block and lr._window.fast is None and calls == {"compiled": 1, "autograd": 0}
    for cell in (LIF, ALIF):
        lr, calls, sd_n = one_step([cell(3, 4, surrogate="gaussian")])
        assert lr._compiled_block and lr._window.fast is not None and calls == {"compiled": 1, "autograd": 0}
        assert sd_n == 0  # the torch surrogate
    lr, calls, _ = one_step([LRU(3, 4)], ro=LeakyReadout(3, 2), dropout=0.5)
    assert not lr._compiled_block and lr._window is None and calls == {"compiled": 0, "autograd": 0}
    with pytest.raises(ValueError, match="backend 'compiled' needs"):
        one_step([LRU(3, 4)], "compiled", ro=LeakyReadout(3, 2), dropout=0.5)
    lr, calls, _ = one_step([GRU(3, 4)])
    assert not lr._compiled_block and lr._window.fast is None and calls == {"compiled": 0, "autograd": 1}
    with pytest.raises(ValueError, match="backend 'compiled' needs"):
        one_step([GRU(3, 4)], "compiled")


SPIKING = [("alif", v) for v in ("rec", "ff_atan_nodetach", "mixed", "gaussian")] + \
    [("lif", v) for v in ("subtract_rec", "zero_atan_nodetach", "none", "mixed", "gaussian", "cuba")]


@pytest.mark.parametrize("kind,variant", SPIKING)
@pytest.mark.parametrize("loss", [user_loss, mse_step_loss])
def test_compiled_spiking_equals_reference_with_resets(kind, variant, loss):
    model = build(kind, variant)
    T, B = int(torch.randint(14, 20, ())), 3
    x, tgt = inputs(kind, T, B), torch.randn(T, B, 3)
    resets = [(5, torch.tensor([True, False, True])), (11, None)]
    ref = run(model, x, tgt, "reference", loss, resets=resets)
    new = run(model, x, tgt, "compiled", loss, resets=resets, fast=variant != "cuba")
    check_same(ref, new)
    fires_sometimes(model, x)


@pytest.mark.parametrize("variant", ["matD", "one", "three"])
@pytest.mark.parametrize("loss", [user_loss, mse_step_loss])
def test_compiled_lru_equals_reference_with_resets(variant, loss):
    model = build("lru", variant)
    T, B = int(torch.randint(10, 16, ())), 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    resets = [(4, torch.tensor([True, False, True])), (8, None)]
    ref = run(model, x, tgt, "reference", loss, resets=resets)
    new = run(model, x, tgt, "compiled", loss, resets=resets)
    check_same(ref, new)


@pytest.mark.parametrize("kind,variant", [("alif", "gaussian"), ("lru", "two")])
def test_closed_form_loss_through_torch_surrogate_and_lru_filter_equals_reference(kind, variant):
    """A surrogate without a compiled form (the block's torch surrogate) and LRU layers under a
    leaky readout (the LRU's readout-filtered traces), with the package's loss (its gradient in
    closed form, the compiled MSE), equal the reference."""
    reseed()
    if kind == "alif":
        model = RecurrentStack(alif_cells("gaussian"), LeakyReadout(6, 3, tau=4.0))
        x = (torch.rand(13, 3, 5) < 0.5).double()
    else:
        model = RecurrentStack([LRU(5, 6), LRU(5, 6)], LeakyReadout(5, 3, tau=4.0))
        x = torch.randn(13, 3, 5)
    tgt = torch.randn(13, 3, 3)
    resets = [(6, torch.tensor([False, True, True]))]
    ref = run(model, x, tgt, "reference", mse_step_loss, resets=resets)
    new = run(model, x, tgt, "compiled", mse_step_loss, resets=resets)
    check_same(ref, new)
    if kind == "alif":
        fires_sometimes(model, x)


@pytest.mark.parametrize("kind", ["lru", "alif", "lif"])
@pytest.mark.parametrize("use_numba", [False, True])
def test_compiled_kernels_and_torch_forms_equal_the_reference(kind, use_numba, monkeypatch):
    """The compiled backend with its numba kernels (row kernels, block partials, the per-lane
    pass) and, as where numba cannot run, with the kinds' torch steps, torch partials and the torch
    per-lane pass, against the reference: float64 to 1e-10, float32 within float rounding."""
    from spikerec.hardware.online import traces, traces_alif, traces_lif, traces_lru, window

    if not use_numba:  # as without numba: no compiled CPU kernel anywhere on the learner's paths
        for mod in (window, traces, traces_lif, traces_alif, traces_lru):
            monkeypatch.setattr(mod, "compiled_cpu", lambda *t: False)
    real, lanes = traces.block_lanes_numba, []
    monkeypatch.setattr(traces, "block_lanes_numba", lambda *a, **kw: lanes.append(1) or real(*a, **kw))
    variant = {"lru": "matD", "alif": "strong", "lif": "strong_rec"}[kind]
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        torch.set_default_dtype(dtype)
        model = build(kind, variant, tau=4.0)
        T, B = 11, 4
        x = torch.randn(T, B, 5) if kind == "lru" else (torch.rand(T, B, 5) < 0.5).to(dtype)
        tgt = torch.randn(T, B, 3)
        _, _, tr0, g0 = run(model, x, tgt, "reference")
        lanes.clear()
        _, _, tr1, g1 = run(model, x, tgt, "auto", fast=use_numba)
        assert bool(lanes) == use_numba
        for n in tr0:
            assert torch.allclose(tr0[n], tr1[n], rtol=tol, atol=tol), n
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=tol, atol=tol * max(1.0, float(g0[n].abs().max()))), n


@pytest.mark.parametrize("kind", ["alif", "lif"])
def test_compiled_spiking_float32_close_to_float64_reference(kind):
    model = build("alif", "rec") if kind == "alif" else build("lif", "subtract_rec")
    T, B = 14, 2
    x, tgt = inputs(kind, T, B), torch.randn(T, B, 3)
    ref = run(model, x, tgt, "reference", mse_step_loss)
    m32 = model.float()
    new = run(m32, x.float(), tgt.float(), "compiled", mse_step_loss)
    for n in ref[3]:
        assert torch.allclose(ref[3][n], new[3][n].double(), rtol=1e-3, atol=1e-4), n


def test_compiled_lru_float32_close_to_float64_reference():
    model = build("lru", "matD")
    T, B = 12, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    ref = run(model, x, tgt, "reference", mse_step_loss)
    m32 = model.float()
    new = run(m32, x.float(), tgt.float(), "compiled", mse_step_loss)
    for n in ref[3]:
        assert torch.allclose(ref[3][n], new[3][n].double(), rtol=1e-3, atol=1e-4), n


@pytest.mark.parametrize("net", ["lru", "alif"])
def test_compiled_equals_reference_with_updates_every_k_steps(net):
    """Parameters change every 3 steps (SGD): the window works its rows before each update and
    re-binds the layers' constants after it."""
    model = build("lru", "matD") if net == "lru" else build("alif", "rec")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    T, B = 14, 2
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    if net == "alif":
        x = (x > 0.3).double() * 1.5
    ref = run(model, x, tgt, "reference", mse_step_loss, opt_lr=0.002, update_every=3)
    p_ref = {n: p.detach().clone() for n, p in named(model)}
    model.load_state_dict(state)
    new = run(model, x, tgt, "compiled", mse_step_loss, opt_lr=0.002, update_every=3)
    check_same(ref, new, grads=False)
    for n, p in named(model):
        assert not torch.equal(p.detach(), state[n])  # the optimiser did move it
        assert torch.allclose(p.detach(), p_ref[n], rtol=1e-10, atol=1e-12), n


def test_compiled_truncate_and_discard():
    model = build("lru", "matD")
    T, B = 12, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    out = []
    for backend in ("reference", "auto"):
        model.zero_grad()
        with block_spy() as calls:
            lr = OnlineLearner(model, loss=mse_step_loss, backend=backend)
            for t in range(T):
                if t == 3:
                    lr.truncate(torch.tensor([False, True, False]))
                if t == 6:
                    lr.discard()
                if t == 8:
                    lr.truncate()
                lr.step(x[t], tgt[t])
            lr.update()
        # every truncate/discard works the window's rows first: four blocks on the compiled backend
        assert calls == ({"compiled": 0, "autograd": 0} if backend == "reference" else {"compiled": 4, "autograd": 0})
        out.append({n: p.grad.clone() for n, p in named(model)})
    for n in out[0]:
        assert torch.allclose(out[0][n], out[1][n], rtol=1e-10, atol=1e-12), n


@pytest.mark.parametrize("kind,variant", [("lru", "matD"), ("alif", "rec"), ("lif", "subtract_rec")])
def test_compiled_window_without_a_loss_carries_the_traces(kind, variant):
    """Windows in which no step has a target (worked by ``update`` and ``truncate``: blocks with no
    loss at all, whose traces are only carried) leave the traces and gradients of the reference."""
    model = build(kind, variant, tau=4.0)
    T, B = 14, 3
    x, tgt = inputs(kind, T, B), torch.randn(T, B, 3)
    out = []
    for backend in ("reference", "compiled"):
        model.zero_grad()
        with block_spy() as calls:
            lr = OnlineLearner(model, loss=mse_step_loss, backend=backend)
            for t in range(T):
                if t in (4, 11):  # work the window: steps 0-3 and 8-10 had no target
                    lr.update()
                if t == 9:
                    lr.truncate(torch.tensor([True, False, False]))
                lr.step(x[t], tgt[t] if 4 <= t < 8 or t >= 12 else None)
            traces = traces_of(lr)
            lr.update()
        assert calls["autograd"] == 0 and calls["compiled"] == (0 if backend == "reference" else 4)
        out.append((traces, {n: p.grad.clone() for n, p in named(model)}))
    (tr0, g0), (tr1, g1) = out
    assert tr0.keys() == tr1.keys() and g0.keys() == g1.keys()
    for n in tr0:
        assert torch.allclose(tr0[n], tr1[n], rtol=1e-10, atol=1e-12), n
    for n in g0:
        assert torch.allclose(g0[n], g1[n], rtol=1e-10, atol=1e-11), n
    assert any(g.abs().sum() > 0 for g in g1.values())


def test_compiled_mse_is_one_compiled_call(monkeypatch):
    """``mse_step_loss`` on the compiled window: loss and gradient from the compiled MSE
    (``readout_online.mse_row``, once per step), not ``value_and_grad``."""
    from spikerec.kernels import readout_online

    model = build("lru", "three")
    x, tgt = torch.randn(6, 2, 5), torch.randn(6, 2, 3)
    lr = OnlineLearner(model, loss=mse_step_loss)

    def boom(*a):
        raise AssertionError("value_and_grad was called")

    real, rows = readout_online.mse_row, []
    monkeypatch.setattr(mse_step_loss, "value_and_grad", boom)
    monkeypatch.setattr(readout_online, "mse_row", lambda *a: rows.append(1) or real(*a))
    for t in range(6):
        out, loss = lr.step(x[t], tgt[t])
        assert loss.dtype == out.dtype and loss.dim() == 0
        torch.testing.assert_close(loss, 0.5 * ((out - tgt[t]) ** 2).sum())
    assert len(rows) == 6 and lr._window.fast is not None


# --- the readout-filtered traces under a leaky readout ----------------------------------------------

LEAKY_STACKS = [("alif", "rec"), ("alif", "ff_atan_nodetach"), ("alif", "mixed"), ("lif", "subtract_rec"),
                ("lif", "zero_atan_nodetach"), ("lif", "none"), ("lif", "mixed"), ("lru", "matD"), ("lru", "three")]


@pytest.mark.parametrize("kind", ["alif", "lif"])
@pytest.mark.parametrize("readout", [dict(learn_tau=False), dict(bias=False), dict(learn_weight=False)])
def test_compiled_under_a_leaky_readout_with_some_parameters_untrained(kind, readout):
    """The leaky readout without one of its traced parameters (a fixed time constant, no bias, a
    frozen weight) equals the reference (float64)."""
    model = leaky(build("alif", "rec") if kind == "alif" else build("lif", "subtract_rec"), **readout)
    T, B = 13, 3
    x, tgt = inputs(kind, T, B), torch.randn(T, B, 3)
    ref = run(model, x, tgt, "reference", mse_step_loss)
    new = run(model, x, tgt, "compiled", mse_step_loss)
    check_same(ref, new)


@pytest.mark.parametrize("kind,variant", LEAKY_STACKS)
@pytest.mark.parametrize("filtered", [True, False])
@pytest.mark.parametrize("loss", [user_loss, mse_step_loss])
def test_compiled_under_a_leaky_readout_equals_reference(kind, variant, filtered, loss):
    """Under a leaky readout the compiled block works the readout's own traces and, by default,
    the readout-filtered traces of the layer under it (LIF, ALIF, LRU): outputs, losses, traces and
    gradients equal the reference's, through steps without a loss and per-sample resets."""
    model = leaky(build(kind, variant))
    T, B = int(torch.randint(14, 20, ())), 3
    x, tgt = inputs(kind, T, B), torch.randn(T, B, 3)
    resets = [(5, torch.tensor([True, False, True])), (11, None)]
    filt = None if filtered else False
    ref = run(model, x, tgt, "reference", loss, resets=resets, readout_filter=filt)
    new = run(model, x, tgt, "compiled", loss, resets=resets, readout_filter=filt)
    check_same(ref, new)
    if filtered:  # the filter ran: the layer under the readout learns otherwise than without it
        biased = run(model, x, tgt, "reference", loss, resets=resets, readout_filter=False)[3]
        top = f"cells.{len(model.cells) - 1}."
        assert any(not torch.allclose(new[3][n], biased[n]) for n in biased if n.startswith(top))


ONE_LAYER = {
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


@pytest.mark.parametrize("layer", sorted(ONE_LAYER))
@pytest.mark.parametrize("loss", [mse_step_loss, user_loss])
@pytest.mark.parametrize("readout", ["linear", "leaky"])
def test_compiled_step_api_equals_bptt_through_the_neuron_steps(layer, loss, readout):
    """The compiled step API (the window's row kernels, the compiled block) on one layer without
    lateral weights under a linear readout, where exact online learning is BPTT, gives the
    gradients of autograd through the loop of the model's ``step`` (``spikerec.neurons.<kind>.step``
    of each layer), and its outputs and losses: float64, fresh random networks and inputs, every
    reset, both inline surrogates, the closed-form MSE and a loss without one. Under a leaky
    readout with per-output time constants (learned) the same holds through the readout-filtered
    traces of the layer."""
    reseed()
    T, B, H, N, K = 10, 3, 5, 6, 3
    cell = ONE_LAYER[layer](H, N)
    if not layer.startswith("lru"):
        stronger([cell])
    model = RecurrentStack([cell], LeakyReadout(cell.output_size, K))
    if readout == "leaky":
        model = leaky(model)
    x, tgt = torch.rand(T, B, H) * 2, torch.randn(T, B, K)
    model.zero_grad()
    with block_spy() as calls:
        lr = OnlineLearner(model, loss=loss, backend="compiled")
        outs = [lr.step(x[t], tgt[t]) for t in range(T)]
        lr.update()
    assert lr._window.fast is not None and calls == {"compiled": 1, "autograd": 0}
    assert (lr._filter is not None) == (readout == "leaky")
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


# --- dropout --------------------------------------------------------------------------------------

@pytest.mark.parametrize("cells", ["lru", "alif"])
def test_dropout_switched_on_mid_stream_leaves_the_compiled_paths(cells):
    """A stream started in eval mode takes the compiled window and block, which have no dropout; a
    model put in training mode in the middle of the stream gets its dropout from the next step on
    (the learner works its window's rows, then continues on the reference stream), with the same
    outputs and gradients as a learner that was on the reference path throughout (the same dropout
    masks, by seed)."""
    torch.manual_seed(3)
    layers = [LRU(5, 6), LRU(5, 6)] if cells == "lru" else [ALIF(5, 6, **ALIF_KW), ALIF(6, 6, **ALIF_KW)]
    model = RecurrentStack(layers, LeakyReadout(layers[-1].output_size, 3), dropout=0.4)
    model.eval()
    T, B = 12, 3
    x = torch.randn(T, B, 5) if cells == "lru" else (torch.rand(T, B, 5) < 0.5).double() * 1.5
    tgt = torch.randn(T, B, 3)
    learners = [OnlineLearner(model, loss=mse_step_loss), OnlineLearner(model, loss=mse_step_loss, backend="reference")]
    real, per_step = learners[0]._stream, []
    learners[0]._stream = lambda *a: per_step.append(1) or real(*a)
    no_drop = []
    with block_spy() as calls:
        for t in range(T):
            if t == 6:  # the eval-mode steps took the compiled window
                assert learners[0]._window.fast is not None and learners[0]._window.j == 6 and not per_step
                model.train()
            outs = []
            for lr in learners:
                torch.manual_seed(100 + t)
                outs.append(lr.step(x[t], tgt[t]).output)
            assert torch.allclose(outs[0], outs[1], rtol=0, atol=1e-12), t
            no_drop.append(outs[0])
    assert sum(calls.values()) == 1  # the eval-mode window, worked as one block at the switch
    assert len(per_step) == T - 6 and learners[0]._window.j == 0 and not learners[0]._compiled_block
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


# --- checkpoints ----------------------------------------------------------------------------------

def test_checkpoint_with_an_update_policy_resumes_bit_identically(tmp_path):
    """The stream's state (states, traces, accumulators, spatial accumulators and the window's
    pending rows) goes through save_stream/load_stream: stopping at step 10, restoring into a fresh
    learner and continuing gives the uninterrupted run's weights bit for bit (Adam, an update
    policy, a per-sample reset)."""

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
    assert lr1._compiled_block and lr1._window.fast is not None
    m2, lr2 = build_learner()
    steps(lr2, 0, 10)  # stop with accumulated, not yet applied gradients (update every 3) and a pending row
    assert lr2._window.j == 1
    ck = tmp_path / "ck.safetensors"
    save_stream(ck, lr2, lr2.optimizer)
    assert lr2._window.j == 1, "saving works no pending step"
    m3, lr3 = build_learner()
    load_stream(ck, lr3, lr3.optimizer)
    assert lr3._window.j == 1
    steps(lr3, 10, 20)
    w1, w3 = m1.state_dict(), m3.state_dict()
    for k in w1:
        assert torch.equal(w1[k], w3[k]), k
    w0 = build_learner()[0].state_dict()
    assert max(float((w1[k] - w0[k]).abs().max()) for k in w0) > 1e-4


@pytest.mark.parametrize("net", ["lru", "alif", "lif", "alif_leaky", "lif_leaky"])
def test_checkpoint_inside_a_window_resumes_bit_identically(tmp_path, net):
    model = build("lru", "matD") if net == "lru" else build(net.split("_")[0], "mixed")
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
    assert lr._window.fast is not None
    end = {n: p.detach().clone() for n, p in named(model)}

    model.load_state_dict(state)
    lr = make()
    ys2 = [lr.step(x[t], tgt[t]).output for t in range(7)]
    assert lr._window.j == 2  # two steps since the update at step 5, not yet worked
    tensors, _ = lr.state_tensors()
    assert tensors["window/x"].shape[0] == 2
    save_stream(tmp_path / "s.safetensors", lr)
    model.load_state_dict({k: torch.randn_like(v) for k, v in state.items()})  # overwritten by the load
    lr = make()
    load_stream(tmp_path / "s.safetensors", lr)
    assert lr._window is not None and lr._window.j == 2
    ys2 += [lr.step(x[t], tgt[t]).output for t in range(7, T)]
    lr.update()
    assert lr._window.fast is not None
    for a, b in zip(ys, ys2):
        assert torch.equal(a, b)
    for n, p in named(model):
        assert torch.equal(p.detach(), end[n]), n


def test_lru_c_gradient_across_windows_and_checkpoints(tmp_path):
    """The LRU layers' C gradient over more than one window equals the reference, and a checkpoint
    inside the window resumes bit-identically, or, restored into a reference learner (which works
    the saved rows by the autograd block), equal to rounding; a checkpoint whose window holds more
    rows than a window can is refused."""
    model = build("lru", "matD")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    T, B, cut = STREAM_WINDOW + 13, 3, 41
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
    with block_spy() as calls:
        lr = OnlineLearner(model, loss=mse_step_loss)
        for t in range(T):
            lr.step(x[t], tgt[t])
        full = grads(lr)
    assert lr._window.fast is not None and calls == {"compiled": 2, "autograd": 0}  # a full window, then the rest
    for n in ref:
        assert torch.allclose(full[n], ref[n], rtol=1e-10, atol=1e-12), n
    assert any(n.endswith("C_re") and full[n].abs().sum() > 0 for n in full)

    model.zero_grad()
    lr = OnlineLearner(model, loss=mse_step_loss)
    for t in range(cut):
        lr.step(x[t], tgt[t])
    assert lr._window.j == cut
    save_stream(tmp_path / "s.safetensors", lr)
    tensors, meta = lr.state_tensors()
    bad = OnlineLearner(model, loss=mse_step_loss)
    with pytest.raises(ValueError, match="pending steps, the window holds"):
        bad.load_state_tensors({**tensors, "window/x": torch.zeros(STREAM_WINDOW, B, 5)}, meta)
    for backend, want, exact in (("auto", full, True), ("reference", ref, False)):
        model.zero_grad()
        with block_spy() as calls:
            lr = OnlineLearner(model, loss=mse_step_loss, backend=backend)
            load_stream(tmp_path / "s.safetensors", lr)
            for t in range(cut, T):
                lr.step(x[t], tgt[t])
            got = grads(lr)
        assert calls["autograd" if backend == "reference" else "compiled"] > 0
        for n in want:
            if exact:
                assert torch.equal(got[n], want[n]), n
            else:
                assert torch.allclose(got[n], want[n], rtol=1e-10, atol=1e-12), n


@pytest.mark.parametrize("variant", ["subtract_rec", "mixed"])
def test_lif_matrix_traces_across_windows_and_checkpoints(tmp_path, variant):
    """The LIF layers' input and lateral matrix traces, carried from window to window by the
    compiled block: over several windows, with a per-sample reset and a truncation inside a window
    and steps without a loss, the traces and gradients equal the reference stream's; a checkpoint
    inside a window (its rows saved as they are) resumes bit-identically, or, restored into a
    reference learner, works the saved rows at once (equal to rounding)."""
    model = build("lif", variant)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    T, B, cut = 2 * STREAM_WINDOW + 13, 3, STREAM_WINDOW + 9
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    x = (torch.rand(T, B, 5, generator=g) < 0.4).double() * 1.5
    tgt = torch.randn(T, B, 3, generator=g)
    events = {20: ("reset", torch.tensor([True, False, False])),
              STREAM_WINDOW + 30: ("truncate", torch.tensor([False, True, False]))}

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
    assert lr._window.fast is not None
    full_tr, full = grads(lr)
    assert full_tr.keys() == ref_tr.keys() and full.keys() == ref.keys()
    assert any(n.startswith("0/") and n.endswith("weight") for n in full_tr), "the matrix traces were carried"
    for n in ref_tr:
        assert torch.allclose(full_tr[n], ref_tr[n], rtol=1e-10, atol=1e-12), n
    for n in ref:
        assert torch.allclose(full[n], ref[n], rtol=1e-10, atol=1e-11), (n, (full[n] - ref[n]).abs().max())
    assert full["cells.0.weight"].abs().sum() > 0
    fires_sometimes(model, x)

    lr = OnlineLearner(model, loss=mse_step_loss)
    stream(lr, 0, cut)
    fill = lr._window.j
    assert 0 < fill < STREAM_WINDOW  # inside a window (the reset at step 20 started a new one)
    save_stream(tmp_path / "s.safetensors", lr)
    assert lr._window.j == fill, "saving works no pending step"
    stream(lr, cut, T)
    _, same = grads(lr)
    for n in full:
        assert torch.equal(same[n], full[n]), n
    for backend, want, exact in (("auto", full, True), ("reference", ref, False)):
        lr = OnlineLearner(model, loss=mse_step_loss, backend=backend)
        load_stream(tmp_path / "s.safetensors", lr)
        assert lr._window.j == fill
        stream(lr, cut, T)
        _, got = grads(lr)
        for n in want:
            if exact:
                assert torch.equal(got[n], want[n]), n
            else:
                assert torch.allclose(got[n], want[n], rtol=1e-10, atol=1e-11), n


# --- the batch form ---------------------------------------------------------------------------------

@pytest.mark.parametrize("net", [("lru", "three"), ("lif", "mixed")])
@pytest.mark.parametrize("mode", [("stream", None), ("chunked", 4), ("parallel", None)])
@pytest.mark.parametrize("loss", ["mse", "mean", "last", "per_step"])
def test_compiled_backward_equals_reference(net, mode, loss):
    """``backward()`` on the compiled backend (the layers' block scans, blocks of STREAM_WINDOW in
    stream mode, of the chunk, or the whole sequence; the compiled block) equals the reference's
    (per-step autograd in stream mode, the autograd block otherwise)."""
    model = build(*net)
    T, B = 9, 4
    x = inputs(net[0], T, B)
    if loss == "mse":
        tgt, fn = torch.randn(T, B, 3), mse_loss
    else:
        tgt = torch.randint(0, 3, (T, B) if loss == "per_step" else (B,))
        fn = classification_loss(loss, T)
    res = []
    for backend in ("reference", "auto"):
        model.zero_grad()
        with block_spy() as calls:
            lr = OnlineLearner(model, mode=mode[0], chunk=mode[1], backend=backend)
            value = lr.backward(x, tgt, fn)
        blocks = 1 if mode[0] != "chunked" else 3
        if backend == "auto":
            assert calls == {"compiled": blocks, "autograd": 0}
        else:
            assert calls == {"compiled": 0, "autograd": 0 if mode[0] == "stream" else blocks}
        res.append((value, {n: p.grad.clone() for n, p in named(model)}))
    assert abs(res[0][0] - res[1][0]) <= 1e-12 * max(1.0, abs(res[0][0]))
    for n in res[0][1]:
        assert torch.allclose(res[0][1][n], res[1][1][n], rtol=1e-10, atol=1e-12), n
    assert any(g.abs().sum() > 0 for g in res[1][1].values())
    if net[0] != "lru":
        fires_sometimes(model, x)


@pytest.mark.parametrize("loss", ["mse", "mean", "per_step"])
def test_block_form_of_the_losses_equals_the_per_step_sum(loss, monkeypatch):
    """Chunked/parallel modes evaluate a loss's ``block`` form (all K steps in one op) on the
    reference and its closed form on the compiled backend; gradients and loss equal in float64."""
    model = build("lru", "matD")
    T, B = 13, 3
    x = torch.randn(T, B, 5)
    if loss == "mse":
        fn, tgt = mse_loss, torch.randn(T, B, 3)
    else:
        fn = classification_loss(loss, T)
        tgt = torch.randint(0, 3, (B,) if loss == "mean" else (T, B))
    assert hasattr(fn, "block")
    real, block_calls = fn.block, []
    monkeypatch.setattr(fn, "block", lambda *a: block_calls.append(1) or real(*a))
    for mode, chunk in (("chunked", 4), ("parallel", None)):
        out = []
        for backend in ("reference", "auto"):
            model.zero_grad()
            block_calls.clear()
            L = OnlineLearner(model, mode=mode, chunk=chunk, backend=backend).backward(x, tgt, fn)
            assert len(block_calls) == (0 if backend == "auto" else (4 if mode == "chunked" else 1))
            out.append((L, {n: p.grad.clone() for n, p in named(model)}))
        (L0, g0), (L1, g1) = out
        assert abs(L0 - L1) <= 1e-12 * max(1.0, abs(L0))
        for n in g0:
            assert torch.allclose(g0[n], g1[n], rtol=1e-10, atol=1e-13), n


# --- the block scans and the losses' closed forms -------------------------------------------------------

def test_lru_block_scan_and_reverse_filter_equal_the_step_loops():
    """The LRU's block scan (``scan_block``: the parallel scan of the states, its outputs one GEMM)
    equals the step loop (``scan_loop``) and the output map; the block's reverse filter of the
    errors (the per-lane pass, compiled and torch: ``gh_t = g_t + J^T gh_{t+1}``) equals the
    reverse scan with ``conj(lam)``."""
    from spikerec.hardware.online.traces import lanes_torch, planar
    from spikerec.hardware.online.traces_lru import LRUTrace
    from spikerec.kernels.trace_numba import block_lanes_numba
    from spikerec.layers.lru import LRUState

    reseed()
    tr = LRUTrace(LRU(5, 7), "full")
    tr.compiled = True
    K, B = 9, 3
    x = torch.randn(K, B, 5)
    s = LRUState(torch.randn(B, 7), torch.randn(B, 7))
    with torch.no_grad():
        prev, last, new = tr.scan_loop(x, s)
        prev2, last2, new2, y = tr.scan_block(x, s)
        for f in range(2):
            assert torch.allclose(prev[f], prev2[f], rtol=0, atol=1e-12)
            assert torch.allclose(last[f], last2[f], rtol=0, atol=1e-12)
            assert torch.allclose(new[f], new2[f], rtol=0, atol=1e-12)
        assert torch.allclose(y, tr.output(x.reshape(K * B, 5), new), rtol=0, atol=1e-12)
        G = torch.randn(K, B, 7, 2)  # the errors at (Re h, Im h)
        lam = tr.consts(torch.float64)["lam"]
        g = torch.complex(G[..., 0], G[..., 1])
        want = g.clone()
        for t in range(K - 2, -1, -1):
            want[t] += lam.conj() * want[t + 1]
        bp = tr.block_partials(x.reshape(K * B, 5), prev, new, K, B)
        Gp = planar(G).contiguous()
        for GH in (lanes_torch(bp.J, bp.V, Gp, bp.c, None, True, False)[0],
                   torch.from_numpy(block_lanes_numba(bp.J, bp.V, Gp, bp.c, None, True, False)[0])):
            GH = GH.transpose(-1, -2)
            assert torch.allclose(torch.complex(GH[..., 0], GH[..., 1]), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("recurrent", [True, False])
def test_alif_block_scan_equals_the_step_loop(recurrent):
    """The ALIF block scan (the compiled sequence kernel) gives the step loop's states before and
    after every step, its final state, and the spikes of its states."""
    from spikerec.hardware.online.traces_alif import ALIFTrace
    from spikerec.layers.alif import ALIFState

    reseed()
    cell = ALIF(5, 7, tau_mem=3.0, tau_adapt=20.0, b=0.3, beta=0.5, recurrent=recurrent)
    tr = ALIFTrace(cell, "full")
    K, B = 23, 3
    x = torch.randn(K, B, 5) * 2
    s = ALIFState(torch.randn(B, 7) * 0.5, torch.rand(B, 7) * 0.3)
    with torch.no_grad():
        prev, last, new = tr.scan_loop(x, s)
        prev2, last2, new2, z = tr.scan_block(x, s)
    spikes = (prev.v > cell.b.detach() + cell.beta.detach() * prev.a).double().mean()
    assert 0.02 < spikes < 0.9
    for f in range(2):
        assert torch.allclose(prev[f], prev2[f], rtol=0, atol=1e-12)
        assert torch.allclose(last[f], last2[f], rtol=0, atol=1e-12)
        assert torch.allclose(new[f], new2[f], rtol=0, atol=1e-12)
    assert torch.equal(z, tr.output(None, new2))


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
    Y, tg = torch.randn(4, B, K, requires_grad=True), torch.randn(9, B, K)  # the block's closed form
    ref = mse_loss.block(Y, tg, 3, 7)
    val, g = mse_loss.block_value_and_grad(Y.detach(), tg, 3, 7)
    assert torch.allclose(val, ref.detach(), rtol=1e-13, atol=1e-14)
    assert torch.allclose(g, torch.autograd.grad(ref, Y)[0], rtol=1e-12, atol=1e-14)

"""The block engine of online learning (:mod:`spikerec.hardware.online.block`): the compiled block
(``compiled_block``: the layers' hand-written spatial backwards, compiled block partials and the
compiled per-lane pass) against the autograd block (``autograd_block``, the reference) and the
reference stream, in float64 on fresh random networks and inputs: outputs, losses, traces and
gradients through the step API's window (chunked mode, and the compiled backend's stream mode in
windows of ``STREAM_WINDOW`` steps) and through ``backward()`` (chunked and parallel modes);
resets mid-block, steps without a loss, update policies with an optimiser, a checkpoint mid-block."""
import math

import pytest
import torch

from spikerec.hardware.online import OnlineLearner, load_stream, save_stream
from spikerec.hardware.online.learner import classification_loss, mse_loss, mse_step_loss
from spikerec.hardware.online.window import STREAM_WINDOW
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.layers.lru import LRU
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread, block_spy, named, step_stream, traces_of  # noqa: F401

pytest.importorskip("numba")

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


def run_steps(model, x, tgt, compiled, resets=(), mode="chunked", chunk=4, loss=mse_step_loss, setup=None, **kw):
    """The step API over ``x`` (``compiled``: backend ``auto``, else ``reference``), a target at every
    step but ``t % 5 == 3``, then ``update()``: ``(outputs, losses, traces, grads, blocks, lr)`` with
    ``blocks`` the counts of compiled and autograd blocks worked (:func:`online_helpers.block_spy`)."""
    model.zero_grad()
    kw.setdefault("readout_filter", False)  # the unfiltered block (the filtered one: test_online_readout_filter.py)
    lr = OnlineLearner(model, loss=loss, mode=mode, chunk=chunk if mode == "chunked" else None,
                       backend="auto" if compiled else "reference", **kw)
    if setup is not None:
        setup(lr)
    with block_spy() as blocks:
        ys, ls = step_stream(lr, x, tgt, resets, period=5)  # some steps without a loss
        lr.update()
    tr = traces_of(lr)
    grads = {n: p.grad.clone() for n, p in named(model)}
    model.zero_grad()
    return ys, ls, tr, grads, blocks, lr


def close(a, b):
    assert a.keys() == b.keys()
    for n in a:
        assert torch.allclose(a[n], b[n], rtol=1e-10, atol=1e-12), (n, (a[n] - b[n]).abs().max())


def spy_calls(monkeypatch, owner, name):
    """Count the calls of ``owner.name`` (a list, one entry per call)."""
    real, calls = getattr(owner, name), []
    monkeypatch.setattr(owner, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def n_blocks(T, chunk, cuts):
    """Blocks worked by the step API over ``T`` steps with a reset before each step in ``cuts``."""
    edges = [0, *cuts, T]
    return sum(math.ceil((b - a) / chunk) for a, b in zip(edges, edges[1:]))


@pytest.mark.parametrize("kind", ["lru", "lru_alif", "alif", "lru_lif"])
@pytest.mark.parametrize("leaky", [False, True])
@pytest.mark.parametrize("rule", ["full", "trunc1", "spatial"])
def test_compiled_chunk_block_equals_autograd_block_and_stream(kind, leaky, rule):
    """step() in chunked mode (blocks of 4, a per-sample reset mid-block, steps without a loss):
    the compiled block (every layer's step compiled in the window) equals the autograd block, the
    reference stream and the compiled backend's stream mode (windows of ``STREAM_WINDOW`` steps)."""
    model = build(kind, leaky)
    T, B = int(torch.randint(11, 18, ())), 3
    x = torch.randn(T, B, 5)
    tgt = torch.randn(T, B, 3)
    resets = [(6, torch.tensor([True, False, True]))]
    y0, l0, tr0, g0, n0, _ = run_steps(model, x, tgt, compiled=False, resets=resets, rule=rule)
    y1, l1, tr1, g1, n1, lr = run_steps(model, x, tgt, compiled=True, resets=resets, rule=rule)
    y2, l2, tr2, g2, n2, _ = run_steps(model, x, tgt, compiled=False, resets=resets, rule=rule, mode="stream")
    y3, l3, tr3, g3, n3, lr3 = run_steps(model, x, tgt, compiled=True, resets=resets, rule=rule, mode="stream")
    assert lr._compiled_block and lr._window.fast is not None, "the window ran every layer compiled"
    assert lr3._window.fast is not None and lr3._window.W == STREAM_WINDOW
    assert n0 == {"compiled": 0, "autograd": n_blocks(T, 4, [6])}
    assert n1 == {"compiled": n_blocks(T, 4, [6]), "autograd": 0}
    assert n2 == {"compiled": 0, "autograd": 0}  # the reference stream: per-step autograd, no block
    assert n3 == {"compiled": 2, "autograd": 0}  # the stream's window, cut by the reset
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12) and torch.allclose(y1, y2, rtol=0, atol=1e-12)
    assert torch.allclose(y3, y2, rtol=0, atol=1e-12)
    assert torch.allclose(l0, l1, rtol=0, atol=1e-12) and torch.allclose(l1, l2, rtol=0, atol=1e-10)
    assert torch.allclose(l3, l2, rtol=0, atol=1e-10)
    close(tr0, tr1)
    close(tr3, tr1)
    close(g0, g1)
    close(g2, g1)
    close(g2, g3)
    assert any(g.abs().sum() > 0 for g in g1.values())


@pytest.mark.parametrize("rule,frozen", [("full", ()), ("trunc1", ()), ("full", ("nu_log", "theta_log", "gamma_log")),
                                         ("full", ("gamma_log",))])
def test_lru_compiled_block_equals_its_torch_form(rule, frozen, monkeypatch):
    """LRU layers in chunked mode: the compiled block (the compiled block partials
    ``lru_online.lru_block_partials`` and the compiled per-lane pass ``block_lanes_numba``; in
    backward() the compiled block scan) equals the same block on the torch forms (torch partials,
    ``traces.lanes_torch``, the torch linear scan), traces and gradients, with a per-sample reset and
    steps without a loss; with some or all per-neuron parameters frozen (no per-neuron traces)."""
    from spikerec.hardware.online import traces
    from spikerec.kernels import lru_online, scan_numba

    model = build("lru", False)
    for c in model.cells:  # frozen per-neuron parameters: no per-neuron traces (or only some)
        for name in frozen:
            getattr(c, name).requires_grad_(False)
    T, B = 17, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    resets = [(6, torch.tensor([True, False, True]))]
    calls = {"partials": spy_calls(monkeypatch, lru_online, "lru_block_partials"),
             "lanes_numba": spy_calls(monkeypatch, traces, "block_lanes_numba"),
             "lanes_torch": spy_calls(monkeypatch, traces, "lanes_torch"),
             "scan": spy_calls(monkeypatch, scan_numba, "scan_forward")}
    count = lambda: {k: len(v) for k, v in calls.items()}  # noqa: E731

    def torch_forms(lr):  # the compiled block with the layers' torch partials and the torch per-lane pass
        for tr in lr.tracers:
            tr.compiled = False

    y1, l1, tr1, g1, n1, _ = run_steps(model, x, tgt, compiled=True, resets=resets, rule=rule, chunk=5)
    # two layers, five blocks (0-4, 5 cut by the reset at 6, 6-10, 11-15, 16)
    assert count() == {"partials": 2 * 5, "lanes_numba": 2 * 5, "lanes_torch": 0, "scan": 0}
    for v in calls.values():
        v.clear()
    y0, l0, tr0, g0, n0, _ = run_steps(model, x, tgt, compiled=True, resets=resets, rule=rule, chunk=5,
                                       setup=torch_forms)
    assert count() == {"partials": 0, "lanes_numba": 0, "lanes_torch": 2 * 5, "scan": 0}
    assert n0 == n1 == {"compiled": 5, "autograd": 0}
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12) and torch.allclose(l0, l1, rtol=0, atol=1e-12)
    close(tr0, tr1)
    close(g0, g1)
    assert g1["cells.0.B_re"].abs().sum() > 0
    assert ("nu_log" in frozen) or g1["cells.0.nu_log"].abs().sum() > 0
    # backward(): the block scans too (compiled, then the torch linear scan)
    out = []
    for compiled in (True, False):
        for v in calls.values():
            v.clear()
        if not compiled:
            monkeypatch.setattr(scan_numba, "supported", lambda *a: False)
        model.zero_grad()
        lr = OnlineLearner(model, rule=rule, mode="chunked", chunk=5, readout_filter=False)
        if not compiled:
            torch_forms(lr)
        L = lr.backward(x, tgt, mse_loss)
        ran = count()  # two layers, four blocks of at most 5 steps
        assert ran["scan"] == ran["partials"] == (2 * 4 if compiled else 0)
        out.append((L, {n: p.grad.clone() for n, p in named(model)}))
    assert abs(out[0][0] - out[1][0]) < 1e-10 * max(1.0, abs(out[0][0]))
    close(out[0][1], out[1][1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_lanes_reverse_filter_equals_the_complex_scans(dtype):
    """The compiled per-lane pass (``kernels.trace_numba.block_lanes_numba``) with an LRU's constant
    Jacobian (``J = [[Re lam, -Im lam], [Im lam, Re lam]]``, given once for the block): its reverse
    filter ``gh_t = g_t + J^T gh_{t+1}`` is the flipped complex scan with ``conj(lam)``, the carried
    trace the forward complex scan ``e_t = lam e_{t-1} + v_t`` from the traces carried in, the
    Jacobian products ``lam^(K-1-t)`` and ``lam^K``, and the sums ``sum_t Re(conj(g_t) e_t)``, on
    fresh random inputs (float64 to 1e-12; float32 to its rounding)."""
    from spikerec.kernels.trace_numba import block_lanes_numba
    from spikerec.scan import linear_scan

    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    K, B, N, m = 19, 3, 6, 2
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    lam = 0.95 * torch.polar(torch.rand(N, generator=g, dtype=dtype), 6.3 * torch.rand(N, generator=g, dtype=dtype))
    lr_, li = lam.real, lam.imag
    J = torch.stack([lr_, -li, li, lr_])[None, None].contiguous()  # [1, 1, 4, N]
    G, V, e_in = r(K, B, 2, N), r(m, K, B, 2, N), r(m, B, 2, N)
    cplx = lambda t: torch.complex(t.select(-2, 0), t.select(-2, 1))  # noqa: E731  [.., 2, N] -> [.., N]
    GH, A, Gv, b0, P, phi, e_out = block_lanes_numba(J, V, G, None, e_in, True, True, need_P=True)
    assert A is None
    gh = linear_scan(lam.conj(), cplx(G).flip(0)).flip(0)  # [K, B, N]
    es = torch.stack([linear_scan(lam, cplx(V[j]), cplx(e_in[j])) for j in range(m)])  # [m, K, B, N]
    powers = torch.stack([lam ** (K - 1 - t) for t in range(K)])  # Phi_t = lam^(K-1-t)
    want = {"GH": (torch.from_numpy(GH), torch.stack([gh.real, gh.imag], 2)),
            "b0": (torch.from_numpy(b0), torch.stack([(lam.conj() * gh[0]).real, (lam.conj() * gh[0]).imag], 1)),
            "e_out": (torch.from_numpy(e_out), torch.stack([es[:, -1].real, es[:, -1].imag], 2)),
            "P": (torch.from_numpy(P), torch.stack([powers.real, powers.imag], 1)[None]),  # one row: every sample's
            "phi": (torch.from_numpy(phi), torch.stack([(lam ** K).real, -(lam ** K).imag, (lam ** K).imag,
                                                        (lam ** K).real])[None]),
            "Gv": (torch.from_numpy(Gv), (cplx(G).conj()[None] * es).real.sum((1, 2)).to(torch.float64))}
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for name, (got, ref) in want.items():
        scale = 1.0 if name != "Gv" else float(ref.abs().max())  # Gv: a sum of K * B products
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        assert torch.allclose(got.to(ref.dtype), ref, rtol=0, atol=tol * scale), (name, (got - ref).abs().max())
    assert torch.equal(torch.from_numpy(GH)[-1], G[-1])


def test_compiled_lanes_refuse_more_than_two_states_per_neuron():
    """The compiled per-lane pass runs with ``k`` (states per neuron) a compile-time constant, 1 or 2 (every kind
    has one of these); a ``k = 3`` block is refused with an error rather than worked as if ``k`` were 2."""
    from spikerec.kernels.trace_numba import block_lanes_numba

    K, B, k, N = 4, 2, 3, 5
    with pytest.raises(ValueError, match="one or two states per neuron"):
        block_lanes_numba(torch.rand(K, B, k * k, N), torch.rand(1, K, B, k, N), torch.rand(K, B, k, N), None, None,
                          True, False)


@pytest.mark.parametrize("detach,surrogate", [(True, SURR), (False, "atan"), (True, "sigmoid")])
def test_alif_compiled_block_equals_autograd_block_and_stream(detach, surrogate, monkeypatch):
    """Recurrent ALIF layers in chunked mode: the compiled block (``alif_online.alif_block_partials``,
    the hand-written spatial backward, the compiled per-lane pass) equals the autograd block and the
    reference stream, traces (read mid-stream, the window's steps worked first) and gradients, with
    lateral weights, both reset-gradient forms and a per-sample reset; the surrogate's derivative in
    the compiled kernels (fast sigmoid, arc-tangent) or from torch (sigmoid: no compiled form)."""
    from spikerec.kernels import alif_online, surrogate_numba

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
    calls = spy_calls(monkeypatch, alif_online, "alif_block_partials")
    sd = spy_calls(monkeypatch, surrogate_numba, "scaled_derivative")
    out = []
    for backend in ("reference", "compiled"):
        model.zero_grad()
        calls.clear()
        sd.clear()
        lr = OnlineLearner(model, loss=mse_step_loss, mode="chunked", chunk=5, backend=backend)
        rs = dict(resets)
        with block_spy() as blocks:
            for t in range(T):
                if t in rs:
                    lr.reset(rs[t])
                lr.step(x[t], None if t % 5 == 3 else tgt[t])
            tr = traces_of(lr)
            lr.update()
        # two layers, five blocks (0-4, 5 cut by the reset at 6, 6-10, 11-15, 16), compiled only when asked
        if backend == "compiled":
            assert blocks == {"compiled": 5, "autograd": 0} and len(calls) == 2 * 5
            assert bool(sd) == (surrogate != "sigmoid")  # the error through the spikes: compiled where it can be
        else:
            assert blocks == {"compiled": 0, "autograd": 5} and not calls and not sd
        out.append((tr, {n: p.grad.clone() for n, p in named(model)}))
    _, _, _, g_ref, _, _ = run_steps(model, x, tgt, compiled=False, resets=resets, mode="stream")
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
    self-connection) under a leaky readout: the compiled block (``lif_online.lif_block_partials``, the
    hand-written spatial backward, the compiled per-lane pass) equals the autograd block and the
    reference stream, and the compiled backend's stream mode equals the reference stream: outputs,
    losses, traces and gradients, with a per-sample reset and steps without a loss; the surrogate's
    derivative in the compiled kernels (fast sigmoid, arc-tangent) or from torch (sigmoid)."""
    from spikerec.kernels import lif_online, surrogate_numba

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
    calls = spy_calls(monkeypatch, lif_online, "lif_block_partials")
    sd = spy_calls(monkeypatch, surrogate_numba, "scaled_derivative")
    y1, l1, tr1, g1, n1, lr = run_steps(model, x, tgt, compiled=True, resets=resets, rule=rule)
    # the compiled partials of every block of both layers; the spikes' error compiled where the surrogate has a form
    assert len(calls) == 2 * n1["compiled"] and n1 == {"compiled": n_blocks(T, 4, [6]), "autograd": 0}
    assert bool(sd) == (surrogate != "sigmoid") and lr._window.fast is not None
    calls.clear()
    y0, l0, tr0, g0, n0, _ = run_steps(model, x, tgt, compiled=False, resets=resets, rule=rule)
    y2, l2, tr2, g2, _, _ = run_steps(model, x, tgt, compiled=False, resets=resets, rule=rule, mode="stream")
    assert not calls and n0 == {"compiled": 0, "autograd": n_blocks(T, 4, [6])}
    y3, l3, tr3, g3, n3, _ = run_steps(model, x, tgt, compiled=True, resets=resets, rule=rule, mode="stream")
    assert n3 == {"compiled": 2, "autograd": 0} and len(calls) == 2 * 2
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12) and torch.allclose(y1, y2, rtol=0, atol=1e-12)
    assert torch.allclose(y2, y3, rtol=0, atol=1e-12)
    assert torch.allclose(l0, l1, rtol=0, atol=1e-12) and torch.allclose(l1, l2, rtol=0, atol=1e-10)
    assert torch.allclose(l3, l2, rtol=0, atol=1e-10)
    close(tr0, tr1)
    close(tr3, tr1)
    for g in (g0, g2, g3):
        close(g, g1)
    assert g1["cells.0.weight"].abs().sum() > 0
    with torch.no_grad():
        rate = float(cells[0](x)[0].mean())
    assert 0.02 < rate < 0.9


@pytest.mark.parametrize("kind", ["lru", "lru_alif", "alif", "lru_lif"])
@pytest.mark.parametrize("leaky", [False, True])
def test_compiled_block_is_taken_and_autograd_is_not_called(kind, leaky, monkeypatch):
    """On the compiled backend no autograd call is made: the step API in chunked and stream mode
    (every layer's step compiled, the package MSE's error in one compiled call, the compiled block)
    and backward() in chunked and parallel mode (the block scans, ``mse_loss``'s closed form);
    every trained parameter gets a gradient."""
    model = build(kind, leaky)
    T = 8
    x, tgt = torch.randn(T, 2, 5), torch.randn(T, 2, 3)

    def boom(*a, **k):
        raise AssertionError("autograd called")

    monkeypatch.setattr(torch.autograd, "grad", boom)
    monkeypatch.setattr(torch.Tensor, "backward", boom)
    for mode, chunk, blocks in (("chunked", 3, 3), ("stream", None, 1)):
        model.zero_grad()
        lr = OnlineLearner(model, loss=mse_step_loss, mode=mode, chunk=chunk, readout_filter=False)
        with block_spy() as n:
            for t in range(T):
                lr.step(x[t], tgt[t])
            lr.update()
        assert lr._compiled_block and lr._window.fast is not None
        assert n == {"compiled": blocks, "autograd": 0}
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in named(model)), mode
    for mode, chunk, blocks in (("chunked", 3, 3), ("parallel", None, 1)):
        model.zero_grad()
        with block_spy() as n:
            OnlineLearner(model, mode=mode, chunk=chunk, readout_filter=False).backward(x, tgt, mse_loss)
        assert n == {"compiled": blocks, "autograd": 0}
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in named(model)), mode


@pytest.mark.parametrize("kind", ["lru", "lru_alif"])
@pytest.mark.parametrize("loss", ["mse", "ce_mean", "ce_last"])
@pytest.mark.parametrize("mode", ["chunked", "parallel"])
def test_backward_chunked_closed_form_equals_autograd(kind, loss, mode):
    """backward() over a whole sequence (chunk not dividing T; or one block) with the package's
    losses (ce_last: blocks without a loss): the compiled block with the losses' closed forms equals
    the autograd block."""
    model = build(kind, False)
    T, B = 13, 3
    x = torch.randn(T, B, 5)
    if loss == "mse":
        fn, tgt = mse_loss, torch.randn(T, B, 3)
    else:
        fn, tgt = classification_loss(loss[3:], T), torch.randint(0, 3, (B,))
    out = []
    for compiled in (False, True):
        model.zero_grad()
        lr = OnlineLearner(model, mode=mode, chunk=5 if mode == "chunked" else None,
                           backend="auto" if compiled else "reference")
        with block_spy() as n:
            L = lr.backward(x, tgt, fn)
        blocks = 3 if mode == "chunked" else 1
        assert n == ({"compiled": blocks, "autograd": 0} if compiled else {"compiled": 0, "autograd": blocks})
        out.append((L, {n: p.grad.clone() for n, p in named(model)}))
    assert abs(out[0][0] - out[1][0]) < 1e-10 * max(1.0, abs(out[0][0]))
    close(out[0][1], out[1][1])


def user_loss(y, tgt):  # no closed form: one autograd call on the output
    return 0.5 * ((y - tgt) ** 2).sum() + (y.tanh() * tgt).sum()


@pytest.mark.parametrize("kind", ["lru_alif", "lru_lif"])
def test_loss_without_closed_form_on_the_compiled_block(kind):
    """A loss without ``value_and_grad`` (the step's error by one autograd call on its output) on the
    compiled block equals the autograd block and the reference stream (step API), and backward()
    with a per-step loss without closed form or block form equals the reference block."""
    model = build(kind, True)
    T, B = 14, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    resets = [(6, torch.tensor([False, True, False]))]
    y1, l1, tr1, g1, n1, _ = run_steps(model, x, tgt, compiled=True, resets=resets, loss=user_loss)
    y0, l0, tr0, g0, n0, _ = run_steps(model, x, tgt, compiled=False, resets=resets, loss=user_loss)
    y2, l2, _, g2, _, _ = run_steps(model, x, tgt, compiled=False, resets=resets, loss=user_loss, mode="stream")
    assert n1 == {"compiled": n_blocks(T, 4, [6]), "autograd": 0} and n0["compiled"] == 0
    assert torch.allclose(y0, y1, rtol=0, atol=1e-12) and torch.allclose(y2, y1, rtol=0, atol=1e-12)
    assert torch.allclose(l0, l1, rtol=0, atol=1e-12) and torch.allclose(l2, l1, rtol=0, atol=1e-10)
    close(tr0, tr1)
    close(g0, g1)
    close(g2, g1)

    def fn(y, target, t):  # no value_and_grad, no block form
        return user_loss(y, target[t])

    out = []
    for backend in ("reference", "auto"):
        model.zero_grad()
        with block_spy() as n:
            L = OnlineLearner(model, mode="chunked", chunk=4, backend=backend).backward(x, tgt, fn)
        assert n["compiled" if backend == "auto" else "autograd"] == 4
        out.append((L, {k: p.grad.clone() for k, p in named(model)}))
    assert abs(out[0][0] - out[1][0]) < 1e-10 * max(1.0, abs(out[0][0]))
    close(out[0][1], out[1][1])


@pytest.mark.parametrize("kind", ["lru_alif", "lru_lif"])
def test_blocks_without_a_loss_carry_the_traces(kind):
    """Blocks of the step API whose steps all have no target (no error to contract: the traces are
    only carried to the block's end), between and after blocks with a loss: the compiled block equals
    the autograd block and the reference stream, traces and gradients."""
    model = build(kind, True)
    T, B, chunk = 14, 3, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    out = []
    for compiled, mode in ((True, "chunked"), (False, "chunked"), (False, "stream")):
        model.zero_grad()
        lr = OnlineLearner(model, loss=mse_step_loss, mode=mode, chunk=chunk if mode == "chunked" else None,
                           backend="auto" if compiled else "reference", readout_filter=False)
        with block_spy() as n:
            ys = torch.stack([lr.step(x[t], tgt[t] if t in (1, 2, 7, 10) else None).output for t in range(T)])
            lr.update()  # blocks 3-5 and 12-13 without a loss
        tr = traces_of(lr)
        assert n["compiled" if compiled else "autograd"] == (5 if mode == "chunked" else 0)
        out.append((ys, tr, {k: p.grad.clone() for k, p in named(model)}))
    for ys, tr, g in out[1:]:
        assert torch.allclose(ys, out[0][0], rtol=0, atol=1e-12)
        close(g, out[0][2])
    close(out[1][1], out[0][1])
    assert all(v.abs().sum() > 0 for v in out[0][1].values())


@pytest.mark.parametrize("mode", ["chunked", "stream"])
def test_update_policy_and_checkpoint_mid_block(tmp_path, mode):
    """Adam every 6 steps (not a multiple of the block of 4), a checkpoint mid-block (the window's
    pending steps stored as they are) restored into a new learner: the same weights as the
    reference's uninterrupted run (the autograd block; in stream mode the reference stream, the
    compiled backend working windows of ``STREAM_WINDOW`` steps)."""
    kind = "lru_alif"
    model = build(kind, True)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    x, tgt = torch.randn(15, 2, 5), torch.randn(15, 2, 3)

    def make(compiled):
        model.load_state_dict(init)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        lr = OnlineLearner(model, loss=mse_step_loss, mode=mode, chunk=4 if mode == "chunked" else None,
                           optimizer=opt, update_every=6, backend="auto" if compiled else "reference")
        return lr, opt

    lr, _ = make(False)
    for t in range(15):
        lr.step(x[t], tgt[t])
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    lr, opt = make(True)
    for t in range(9):
        lr.step(x[t], tgt[t])
    assert lr._window.j == 3  # steps 6, 7, 8 pending (the update at 6 worked the window)
    ck = tmp_path / "ck.safetensors"
    save_stream(ck, lr)
    w = {k: v.clone() for k, v in model.state_dict().items()}
    ost = opt.state_dict()
    lr, opt = make(True)
    model.load_state_dict(w)
    opt.load_state_dict(ost)
    load_stream(ck, lr)
    with block_spy() as n:
        for t in range(9, 15):
            lr.step(x[t], tgt[t])
    assert n == {"compiled": 2 if mode == "chunked" else 1, "autograd": 0}
    for k in ref:
        assert torch.allclose(ref[k], model.state_dict()[k], rtol=1e-9, atol=1e-11), k
    assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-4


@pytest.mark.parametrize("mode", ["chunked", "parallel"])
def test_mse_block_loss_is_one_call_per_block(monkeypatch, mode):
    """backward() on the compiled block takes mse_loss's whole-block value and gradient, not the
    per-step one, and gets what the per-step form gets."""
    model = build("lru", False)
    T, B = 13, 3
    x, tgt = torch.randn(T, B, 5), torch.randn(T, B, 3)
    chunk = 5 if mode == "chunked" else None
    block_vg = mse_loss.block_value_and_grad
    monkeypatch.setattr(mse_loss, "block_value_and_grad", None)  # the reference: K per-step calls per block
    model.zero_grad()
    L_ref = OnlineLearner(model, mode=mode, chunk=chunk).backward(x, tgt, mse_loss)
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
    with block_spy() as n:
        L = OnlineLearner(model, mode=mode, chunk=chunk).backward(x, tgt, mse_loss)
    assert calls == ([(0, 5), (5, 10), (10, 13)] if mode == "chunked" else [(0, 13)])
    assert n["compiled"] == len(calls) and n["autograd"] == 0
    assert abs(L - L_ref) < 1e-12 * max(1.0, abs(L_ref))
    close(g_ref, {n: p.grad.clone() for n, p in named(model)})

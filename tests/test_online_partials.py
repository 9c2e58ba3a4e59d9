"""Issue 12 item 2: the online-learning partials are a backend of the one neuron step. The
hand-written per-neuron Jacobians and immediate partials of the trace classes, and every compiled
form of the online learner (the kinds' block partials, the per-lane block pass, the block scans,
the row kernels of the step window, the spike map's surrogate gradient), equal the ones derived
with ``torch.func.jvp`` over (or a loop of) ``spikerec.neurons.<kind>.step`` (float64, fresh
random states, inputs, parameters and errors)."""
import pytest
import torch

from spikerec import neurons
from derived_partials import derived_partials
from spikerec.hardware.online import traces
from spikerec.hardware.online.kinds import online_trace
from spikerec.hardware.online.traces import TraceState, chunk_contract, planar, planar_inv, stream_step
from spikerec.hardware.online.traces_readout import LinearReadoutTrace
from spikerec.layers import ALIF, LIF, LRU, LeakyReadout
from spikerec.neurons import alif as _alif
from spikerec.neurons import lif as _lif
from spikerec.neurons import lru as _lru
from spikerec.neurons import readout as _readout

from online_helpers import _fp64_one_thread  # noqa: F401

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}
ATAN = {"name": "atan", "slope": 2.0, "scale": 0.7}
GAUSS = {"name": "gaussian", "width": 0.6, "scale": 0.8}  # no compiled CPU form: psi by torch
MULTI = {"name": "multi_gaussian", "width": 0.6, "scale": 0.8}  # no compiled form at all
ALIF_KW = dict(bias=True, tau_adapt=10.0, b=0.5, beta=0.5)
MODULE = {"lif": (LIF, _lif), "alif": (ALIF, _alif), "readout": (LeakyReadout, _readout), "lru": (LRU, _lru)}

pytestmark = pytest.mark.filterwarnings("ignore:surrogate '.*' has no compiled CPU form")


def block_cell(kind, kw, H, N):
    """A layer of ``kind`` with heterogeneous per-neuron parameters and diagonal lateral weights
    (where the layer's online partials are exact), its definition's module and its step's options
    (``None`` for the LRU). ``kw["frozen"]``: parameters made untrained (not traced)."""
    kw = dict(kw)
    frozen = kw.pop("frozen", ())
    cls, mod = MODULE[kind]
    if kind in ("lru", "readout"):
        cell = cls(H, N, **kw)
    else:
        cell = cls(H, N, tau_mem=5.0, zero_diagonal=False, **{"surrogate": SURR, **kw})
    with torch.no_grad():
        if kind != "lru":
            for n, p in cell.named_parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn_like(p))  # heterogeneous per-neuron values
        if getattr(cell, "recurrent_weight", None) is not None:
            cell.recurrent_weight.copy_(torch.diag(torch.randn(N)))
    for n in frozen:
        getattr(cell, n).requires_grad_(False)
    return cell, mod, (None if kind == "lru" else cell.options())


def step_of(mod, opts):
    """``(params, state, x) -> new state`` of the definition."""
    if opts is None:
        return lambda p, s, x_: mod.step(p, s, x_)[1]
    return lambda p, s, x_: mod.step(p, s, x_, opts)[1]


def detached(params):
    return type(params)(*(None if p is None else p.detach() for p in params))


def random_state(cell, B):
    s = cell.initial_state(B)
    return type(s)(*(torch.randn_like(f) + 0.8 for f in s))


def weight_partials(step, params, state, x, name):
    """``d s_t[b, n] / d W[n, h]`` as ``[B, N, k, H]`` for the matrix ``name`` of ``params`` (one
    ``torch.func.jvp`` of the step per column ``h``; exact where each neuron reads its own row only)."""
    from torch.func import jvp

    W = getattr(params, name).detach()
    cols = []
    for h in range(W.shape[1]):
        tangent = torch.zeros_like(W)
        tangent[:, h] = 1
        _, out = jvp(lambda w: tuple(step(params._replace(**{name: w}), state, x)), (W,), (tangent,))
        cols.append(torch.stack(out, -1))
    return torch.stack(cols, -1)


def spy(monkeypatch, owner, attr):
    """Count the calls of ``owner.attr`` (replaced by a counting wrapper)."""
    real, calls = getattr(owner, attr), []
    monkeypatch.setattr(owner, attr, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def rows_of(states):
    """A list of states ``[B, ..]`` as one state of ``[len * B]`` rows."""
    return type(states[0])(*(torch.cat([s[f] for s in states]) for f in range(len(states[0]))))


def derived_recursion(step, params, states, xs, G, names, use_J=True):
    """The trace recursion ``eps_t = J_t eps_{t-1} + d s_t / d p`` (``J = 0`` without ``use_J``)
    and ``dL/dp = sum_t g_t . eps_t`` run step by step on the partials of ``step`` derived with
    ``torch.func.jvp``: ``(eps after the last step, {name: dL/dp})`` for the parameters ``names``
    (a matrix parameter's trace ``[B, N, k, H]``); ``G[t]`` ``[B, N, k]`` or ``None`` (no loss)."""
    vec_names = tuple(n for n in names if getattr(params, n).dim() <= 1)
    eps, want = {}, {n: 0 for n in names}
    for t in range(len(xs)):
        J, imm = derived_partials(step, params, states[t], xs[t], vec_names)
        for n in names:
            i = imm[n] if n in vec_names else weight_partials(step, params, states[t], xs[t], n)
            e = eps.get(n)
            eps[n] = i if (e is None or not use_J) else (torch.einsum("bnij,bnj...->bni...", J, e) + i)
            if G[t] is not None:
                want[n] = want[n] + torch.einsum("bni,bni...->n...", G[t], eps[n])
    return eps, want


# --- the hand-written (torch) partials and steps ------------------------------------------------------

CASES = [
    ("lif", dict(reset="subtract", detach_reset=False, learn_threshold=True)),
    ("lif", dict(reset="zero", detach_reset=False, learn_threshold=True)),
    ("lif", dict(reset="zero", detach_reset=True)),
    ("lif", dict(reset="none", tau_syn=3.0)),
    ("lif", dict(reset="subtract", tau_syn=3.0, detach_reset=False, learn_threshold=True)),
    ("lif", dict(reset="subtract", detach_reset=False, recurrent=True, learn_threshold=True)),
    ("lif", dict(reset="zero", tau_syn=3.0, detach_reset=False, recurrent=True, learn_threshold=True)),
    ("alif", dict(recurrent=False, detach_reset=False, tau_adapt=10.0, b=0.5, beta=0.5)),
    ("alif", dict(recurrent=False, detach_reset=True, tau_adapt=10.0, b=0.5, beta=0.5)),
    ("alif", dict(recurrent=True, detach_reset=False, tau_adapt=10.0, b=0.5, beta=0.5)),
    ("readout", dict(tau=4.0)),
    ("readout", dict(tau=4.0, learn_tau=True, bias=False)),
    ("lru", {}),
]


@pytest.mark.parametrize("kind,kw", CASES)
def test_hand_written_partials_equal_derived_ones(kind, kw):
    B, H, N = 5, 4, 6
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x = torch.rand(B, H) * 2
    prev = random_state(cell, B)
    new = tr.step(x, prev)
    P = tr.partials(x, prev, new)
    per_neuron = tuple(n for n in P.vec if getattr(cell, n, None) is not None)
    step = step_of(mod, opts)
    J, vec = derived_partials(step, cell.params(), prev, x, per_neuron)
    Jh = P.J.expand_as(J)
    assert torch.allclose(Jh, J, rtol=1e-12, atol=1e-12)
    assert float(J.abs().sum()) > 0
    for n in per_neuron:
        assert torch.allclose(P.vec[n], vec[n], rtol=1e-12, atol=1e-12), n
    assert per_neuron, "vacuous: no per-neuron parameter compared"
    params = detached(cell.params())
    for name, (c, pre) in P.mat.items():  # the matrix parameters' immediate partials c (x) pre
        want = weight_partials(step, params, prev, x, name)
        assert float(want.abs().sum()) > 0, name
        assert torch.allclose(c.expand(B, N, -1)[..., None] * pre[:, None, None, :], want, rtol=1e-12,
                              atol=1e-12), name
    assert any(b.fn is type(tr).partials for b in neurons.backends_of(kind).values())


@pytest.mark.parametrize("kind,kw", CASES)
def test_trace_state_update_equals_the_neuron_step(kind, kw):
    B, H, N = 4, 4, 6
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x, prev = torch.rand(B, H) * 2, random_state(cell, B)
    ref = step_of(mod, opts)(cell.params(), prev, x)
    got = tr.step(x, prev)
    for a, b in zip(got, ref):
        assert torch.equal(a, b.detach()) or torch.allclose(a, b.detach(), rtol=1e-14, atol=1e-14)


MATRIX_TRACE_CASES = [
    ("lif", dict(reset="subtract", detach_reset=False, recurrent=True, learn_threshold=True, surrogate=ATAN)),
    ("lif", dict(reset="zero", detach_reset=False, recurrent=True, tau_syn=3.0, learn_threshold=True)),
    ("alif", dict(detach_reset=False, recurrent=True, surrogate=ATAN, **ALIF_KW)),
    ("lru", {}), ("readout", dict(tau=4.0))]


@pytest.mark.parametrize("kind,kw", MATRIX_TRACE_CASES)
def test_stream_step_equals_the_derived_recursion(kind, kw):
    """The reference stream's trace step (:func:`~spikerec.hardware.online.traces.stream_step`,
    per-step traces in torch) over T steps equals the recursion run on the derived partials: every
    traced parameter's gradient, the per-neuron traces and the matrix traces (one and two states
    per neuron, lateral self-weights; the LRU's ``B_im`` read from the trace of ``B_re``)."""
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    T, B, H, N = 4, 3, 4, 5
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    params, step = detached(cell.params()), step_of(mod, opts)
    s = random_state(cell, B)
    xs = torch.rand(T, B, H) * 2
    G = torch.randn(T, B, N, len(s))
    ts, states = TraceState(tr), [s]
    for t in range(T):
        new = type(s)(*(f.detach() for f in step(params, s, xs[t])))
        stream_step(ts, tr.partials(xs[t], s, new), G[t])
        s = new
        states.append(s)
    got = ts.take()
    assert set(got) == set(tr.traced), sorted(got)
    eps, want = derived_recursion(step, params, states, xs, G, tuple(got))
    for n in got:
        assert torch.allclose(got[n], want[n].reshape(got[n].shape), rtol=1e-10, atol=1e-11), n
    assert set(ts.vec) == {n for n in got if getattr(params, n).dim() <= 1}
    for n, v in ts.vec.items():
        assert torch.allclose(v, planar(eps[n]), rtol=1e-10, atol=1e-11), n
    assert ts.mat, "the matrix traces were carried"
    for n, e in ts.mat.items():
        assert float(want[n].abs().sum()) > 0, n
        assert torch.allclose(e, eps[n].permute(1, 0, 2, 3), rtol=1e-10, atol=1e-11), n


# --- the compiled block partials -----------------------------------------------------------------------

COMPILED_CASES = (
    [("lif", dict(reset=r, detach_reset=d, recurrent=rec, learn_threshold=True, surrogate=SURR if rec else ATAN))
     for r in ("subtract", "zero", "none") for d in (False, True) for rec in (False, True)]
    + [("lif", dict(reset="subtract", detach_reset=False, recurrent=True, learn_threshold=True, surrogate=GAUSS)),
       ("lif", dict(reset="zero", detach_reset=False, recurrent=False, learn_threshold=True, surrogate=MULTI)),
       ("lif", dict(reset="subtract", detach_reset=False, recurrent=True, learn_threshold=True, tau_syn=3.0)),
       ("lif", dict(reset="zero", detach_reset=True, recurrent=False, learn_threshold=True, tau_syn=3.0,
                    surrogate=ATAN))]
    + [("alif", dict(detach_reset=d, recurrent=rec, surrogate=SURR if d else ATAN, **ALIF_KW))
       for d in (False, True) for rec in (False, True)]
    + [("alif", dict(detach_reset=False, recurrent=True, surrogate=GAUSS, **ALIF_KW))]
    + [("lru", {}), ("lru", dict(frozen=("nu_log", "B_im")))])
COMPILED_PARTIALS = {"lif": ("spikerec.kernels.lif_online", "lif_block_partials"),
                     "alif": ("spikerec.kernels.alif_online", "alif_block_partials"),
                     "lru": ("spikerec.kernels.lru_online", "lru_block_partials")}
STATE_PARAMS = {"lif": {"weight", "log_tau_mem", "threshold", "bias"},
                "alif": {"weight", "log_tau_mem", "log_tau_adapt", "b", "beta", "bias"},
                "lru": {"nu_log", "theta_log", "gamma_log", "B_re", "B_im"},
                "readout": {"weight"}}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
@pytest.mark.parametrize("kind,kw", COMPILED_CASES)
def test_compiled_partials_equal_derived_ones(kind, kw, compiled, monkeypatch):
    """The block partials of a kind (``block_partials``: compiled, registered backends of the kinds,
    where ``tr.compiled``: :func:`~spikerec.kernels.lif_online.lif_block_partials` for a plain LIF
    layer, :func:`~spikerec.kernels.alif_online.alif_block_partials`,
    :func:`~spikerec.kernels.lru_online.lru_block_partials`; else the stacked torch partials) of a
    block of ``K x B`` rows equal the ones derived with ``torch.func.jvp`` over
    ``spikerec.neurons.<kind>.step`` (float64, fresh random states and per-neuron parameters, every
    reset mode, with and without the reset's gradient, with a lateral self-connection: the
    recurrent weights are made diagonal, where the layer's partials are exact; surrogates with a
    compiled form and without, whose derivative torch takes): the planar Jacobian ``[K or 1, B or 1,
    k*k, N]``, the per-neuron partials ``[m, K, B, k, N]`` and the matrix parameters' immediate
    partials ``c (x) pre`` (``c`` the unit vector where ``None``; the LRU's ``B_im`` by its reader's
    coefficient ``Cr``)."""
    import importlib

    pytest.importorskip("numba")
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    K, B, H, N = 3, 4, 4, 6
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    tr.compiled = compiled
    owner, attr = importlib.import_module(COMPILED_PARTIALS[kind][0]), COMPILED_PARTIALS[kind][1]
    entry = getattr(owner, attr)
    calls = spy(monkeypatch, owner, attr)
    R = K * B
    x, prev = torch.rand(R, H) * 2, random_state(cell, R)
    new = tr.step(x, prev)
    bp = tr.block_partials(x, prev, new, K, B)
    cuba = kind == "lif" and cell.cuba
    assert len(calls) == (1 if compiled and not cuba else 0), "the compiled block partials ran where they apply"
    k = len(prev)
    step = step_of(mod, opts)
    params = detached(cell.params())
    Jd, vec = derived_partials(step, params, prev, x, tuple(bp.names))
    assert torch.allclose(bp.J.expand(K, B, k * k, N), planar(Jd.flatten(-2)).reshape(K, B, k * k, N),
                          rtol=1e-12, atol=1e-12)
    assert float(Jd.abs().sum()) > 0
    frozen = set(kw.get("frozen", ()))
    assert set(bp.names) == {n for n in tr.traced if getattr(cell, n).dim() <= 1}
    assert {n for n in STATE_PARAMS[kind] if getattr(cell, n).dim() <= 1} - frozen <= set(bp.names)
    assert bp.V.shape == (len(bp.names), K, B, k, N)
    # d v / d thr is 0 where the threshold enters neither the reset's gradient nor a lateral spike
    silent = {"threshold"} if (kind == "lif" and not kw["recurrent"] and (kw["reset"] == "none" or (
        kw["reset"] == "zero" and kw["detach_reset"]))) else set()
    for j, name in enumerate(bp.names):
        assert (float(vec[name].abs().sum()) > 0) != (name in silent), name
        assert torch.allclose(bp.V[j], planar(vec[name]).reshape(K, B, k, N), rtol=1e-12, atol=1e-12), name
    readers = tr.mat_readers(bp.pre)
    assert {r for _, r, _ in readers} == {n for n in tr.traced if getattr(cell, n).dim() == 2}
    c = torch.zeros(1, 1, k, N).index_fill_(2, torch.tensor([0]), 1.0) if bp.c is None else bp.c
    if bp.Cr is not None:
        assert bp.Cr.shape[0] == len(readers)
    for q, (base, reader, M) in enumerate(readers):
        cr = c if M is None else M.to(c.dtype) @ c  # the reader's coefficient M c, planar [.., k, N]
        if bp.Cr is not None:
            assert torch.allclose(bp.Cr[q].expand(K, B, k, N), cr.expand(K, B, k, N), rtol=1e-14, atol=1e-14)
        imm = planar_inv(cr.expand(K, B, k, N)).reshape(R, N, k)[..., None] * bp.pre[base].reshape(R, 1, 1, -1)
        want = weight_partials(step, params, prev, x, reader)
        assert float(want.abs().sum()) > 0, reader
        assert torch.allclose(imm, want, rtol=1e-12, atol=1e-12), reader
    if compiled and not cuba:
        assert any(b.fn is entry for b in neurons.backends_of(kind).values())


# --- the spike map's surrogate gradient and the spatial backward --------------------------------------

@pytest.mark.parametrize("surrogate", [SURR, ATAN, GAUSS, MULTI], ids=lambda s: s["name"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_spike_grad_equals_the_surrogate_autograd(surrogate, dtype, monkeypatch):
    """``spike_grad(g, u, surrogate[, shift])`` (``g sigma'(u - shift)``; on the CPU the surrogate's compiled form,
    :func:`spikerec.kernels.surrogate_numba.scaled_derivative`, where it has one) equals the
    gradient of ``sum(g * surrogate(u))`` by autograd through the surrogate's spike function
    (float64 to 1e-12; float32 to its rounding)."""
    pytest.importorskip("numba")
    from spikerec.kernels import surrogate_numba
    from spikerec.surrogate import get_surrogate

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    sur = get_surrogate(surrogate)
    calls = spy(monkeypatch, surrogate_numba, "scaled_derivative")
    u64, g64 = torch.randn(7, 9) * 1.5, torch.randn(7, 9)
    u = u64.clone().requires_grad_()
    want = torch.autograd.grad((g64 * sur(u)).sum(), u)[0]
    assert float(want.abs().sum()) > 0
    got = traces.spike_grad(g64.to(dtype), u64.to(dtype), sur)
    # a per-neuron shift (the threshold): sigma'(v - thr) with v = u + thr
    thr = torch.rand(9, dtype=torch.float64) + 0.5
    shifted = traces.spike_grad(g64.to(dtype), (u64 + thr).to(dtype), sur, thr.to(dtype))
    assert len(calls) == (2 if surrogate["name"] in ("fast_sigmoid", "atan") else 0), "the compiled form ran"
    assert got.dtype == dtype and shifted.dtype == dtype
    if dtype == torch.float64:
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-14)
        assert torch.allclose(shifted, want, rtol=1e-10, atol=1e-12)
    else:
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
        assert torch.allclose(shifted.double(), want, rtol=1e-4, atol=1e-5)


SPATIAL_CASES = ([("lif", dict(learn_threshold=True, surrogate=s)) for s in (SURR, ATAN, GAUSS)]
                 + [("lif", dict(learn_threshold=True, tau_syn=3.0, surrogate=ATAN))]
                 + [("alif", dict(surrogate=s, **ALIF_KW)) for s in (SURR, ATAN, GAUSS)]
                 + [("lru", {}), ("lru", dict(output_size=3)), ("readout", dict(tau=4.0)), ("readout", {})])


@pytest.mark.parametrize("kind,kw", SPATIAL_CASES)
def test_compiled_spatial_backward_equals_the_output_gradient(kind, kw):
    """The hand-written spatial backward of a layer (``errors`` of its trace, the compiled block's;
    the spikes' surrogate gradient by :func:`~spikerec.hardware.online.traces.spike_grad`) equals
    the gradient of ``sum(g_out * output)`` by autograd through the definition: in the layer's new
    state (the errors handed to the traces), in the output map's parameters (the threshold's; the
    LRU's ``C``, ``D``; a linear readout's ``W``, ``b``) and in the layer's input (the error handed
    to the layer below; float64, fresh random states, inputs, parameters and output errors)."""
    pytest.importorskip("numba")
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    R, H, N = 7, 4, 6
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x, prev = torch.rand(R, H) * 2, random_state(cell, R)
    with torch.no_grad():
        out_new, new = cell.step(x, prev)
    new = type(new)(*(f.detach() for f in new))
    out = cell.output(x, new).detach() if hasattr(cell, "output") else out_new.detach()
    g_out = torch.randn_like(out)
    sp = {}
    with torch.no_grad():
        g, gin = tr.errors((x, prev, new, out), g_out, sp, True)
    # autograd: the state's and the output map's parameters' gradients, then the input's through the step
    leaf = type(new)(*(f.clone().requires_grad_() for f in new))
    trained = [p for p in cell.parameters() if p.requires_grad]
    linear = isinstance(tr, LinearReadoutTrace)  # stateless: its output is its step's
    y = cell.step(x, prev)[0] if linear else cell.output(x, leaf)
    grads = torch.autograd.grad((g_out * y).sum(), [*leaf, *trained], allow_unused=True)
    gs, gp = grads[:len(leaf)], dict(zip(map(id, trained), grads[len(leaf):]))
    xl = x.clone().requires_grad_()
    y_x = cell.step(xl, prev)[0]
    want_in = torch.autograd.grad((g_out * y_x).sum(), xl)[0]
    if linear:  # no trace errors
        assert g is None
    else:
        assert g.shape == (R, N, len(new))
        for f in range(len(new)):
            want = gs[f] if gs[f] is not None else torch.zeros_like(new[f])
            assert torch.allclose(g[..., f], want, rtol=1e-12, atol=1e-13), f
        assert float(g.abs().sum()) > 0
    assert torch.allclose(gin, want_in, rtol=1e-12, atol=1e-12)
    assert float(want_in.abs().sum()) > 0
    for p, v in sp.items():  # the output map's parameters
        want = gp[id(p)]
        assert want is not None and torch.allclose(v.reshape(want.shape), want, rtol=1e-12, atol=1e-12)
    expected = {"lif": {"threshold"}, "alif": {"b", "beta"}, "lru": {"C_re", "C_im", "D"},
                "readout": {"weight", "bias"} if linear else set()}[kind]
    assert {n for n, p in cell.named_parameters() if p in sp} == expected
    for n, p in cell.named_parameters():  # the output map's other parameters have no gradient
        if p.requires_grad and p not in sp:
            assert gp[id(p)] is None or float(gp[id(p)].abs().sum()) == 0, n


# --- the per-lane block pass and the block contraction -----------------------------------------------

LANE_CASES = [  # (k, J broadcast over (K, B), c: "unit" | "full" | "bcast", e_in, G, use_J, carry, per_lane, readers)
    (1, (False, False), "unit", True, True, True, True, False, 1),
    (1, (True, True), "full", False, True, True, True, False, 0),
    (2, (False, False), "unit", True, True, True, True, False, 2),
    (2, (True, True), "bcast", True, True, True, True, False, 2),
    (2, (False, True), "full", True, True, True, True, True, 1),
    (2, (False, False), "full", True, False, True, True, False, 1),
    (1, (False, False), "unit", True, True, False, False, False, 1),
    (2, (False, False), "bcast", False, True, True, False, True, 2),
    (1, (True, False), "unit", False, True, True, False, True, 0),
]


@pytest.mark.parametrize("k,jb,cmode,has_e,has_g,use_J,carry,per_lane,nread", LANE_CASES)
def test_block_lanes_numba_equals_lanes_torch(k, jb, cmode, has_e, has_g, use_J, carry, per_lane, nread):
    """The compiled per-lane pass (:func:`spikerec.kernels.trace_numba.block_lanes_numba`) equals its
    torch form (:func:`spikerec.hardware.online.traces.lanes_torch`) on fresh random planar operands:
    every result (the reverse filter ``GH``, the readers' errors ``A``, the sums ``Gv``, the boundary
    term ``b0``, the matrix traces' carry coefficients ``P``, the Jacobian product ``phi`` and the
    carried traces ``e_out``), with one and two states per neuron, Jacobians and coefficients given
    per step and sample or broadcast (``[1, 1, ..]``; ``P`` and ``phi`` then given once for every sample), the unit coefficient (``c`` None), with and
    without carried traces, errors, the Jacobian, the carry and per-sample sums (float64)."""
    pytest.importorskip("numba")
    from spikerec.kernels.trace_numba import block_lanes_numba

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    m, K, B, N = 3, 5, 3, 4
    J = torch.randn(1 if jb[0] else K, 1 if jb[1] else B, k * k, N) * 0.7
    V = torch.randn(m, K, B, k, N)
    G = torch.randn(K, B, k, N) if has_g else None
    c = None if cmode == "unit" else torch.randn(*((K, B) if cmode == "full" else (1, 1)), k, N)
    cc = torch.zeros(1, 1, k, N).index_fill_(2, torch.tensor([0]), 1.0) if c is None else c
    Ms = [torch.eye(k), torch.randn(k, k)][:nread]
    Cr = torch.stack([(M @ cc).expand(*cc.shape) for M in Ms]).contiguous() if nread else None
    e_in = torch.randn(m, B, k, N) if has_e else None
    need_P = carry
    got = block_lanes_numba(J, V, G, c, e_in, use_J, carry, per_lane, Cr, need_P)
    want = traces.lanes_torch(J, V, G, c, e_in, use_J, carry, per_lane, False, Cr, need_P)
    names = ("GH", "A", "Gv", "b0", "P", "phi", "e_out")
    present = {n for n, w in zip(names, want) if w is not None}
    assert present == {n for n, a in zip(names, got) if a is not None}
    assert present >= ({"GH", "Gv"} if has_g else set()) | ({"phi", "e_out", "P"} if carry and use_J else set())
    for n, a, w in zip(names, got, want):
        if w is None:
            continue
        a = torch.from_numpy(a)
        if n in ("P", "phi") and a.shape != w.shape:  # one row where it is the same for every sample
            assert a.shape[0] == 1 and jb[1] and (n == "phi" or cmode != "full"), (n, a.shape)
            a = a.expand_as(w)
        assert a.shape == w.shape, (n, a.shape, w.shape)
        assert torch.allclose(a.to(w.dtype), w, rtol=1e-12, atol=1e-12), n
    if has_g and use_J and K > 1:  # the filter is not vacuous: gh differs from g
        assert not torch.allclose(want[0], G)


BLOCK_CASES = (  # also used by tests/test_online_triton.py (the Triton forms of the block scans)
    [("lif", dict(reset=r, detach_reset=d, recurrent=rec, learn_threshold=True, bias=True,
                  surrogate=SURR if d else ATAN))
     for r, d, rec in (("subtract", False, True), ("zero", True, False), ("none", True, True), ("subtract", True, False))]
    + [("alif", dict(detach_reset=d, recurrent=rec, surrogate=SURR if d else ATAN, **ALIF_KW))
       for d, rec in ((False, True), (True, False))]
    + [("lru", {})])
BLOCK_RECURSION_CASES = (  # (kind, kw, rule, loss on the first block)
    [(kind, kw, "full", True) for kind, kw in BLOCK_CASES]
    + [("lif", dict(reset="zero", detach_reset=False, recurrent=True, learn_threshold=True, surrogate=GAUSS),
        "full", True),
       ("lif", dict(reset="subtract", detach_reset=False, recurrent=True, learn_threshold=True, tau_syn=3.0,
                    surrogate=ATAN), "full", True),
       ("alif", dict(detach_reset=True, recurrent=True, surrogate=SURR, **ALIF_KW), "full", False),
       ("alif", dict(detach_reset=False, recurrent=True, surrogate=ATAN, **ALIF_KW), "spatial", True),
       ("lru", dict(frozen=("B_re",)), "full", False),
       ("lru", {}, "trunc1", True),
       ("lif", dict(reset="subtract", detach_reset=False, recurrent=True, learn_threshold=True, surrogate=SURR),
        "trunc1", False),
       ("readout", dict(tau=torch.tensor([2.0, 3.0, 5.0, 8.0, 4.0]), learn_tau=True), "full", True),
       ("readout", dict(tau=4.0, bias=False), "full", False)])


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
@pytest.mark.parametrize("kind,kw,rule,loss_first", BLOCK_RECURSION_CASES)
def test_compiled_block_equals_the_derived_recursion(kind, kw, rule, loss_first, compiled, monkeypatch):
    """The block contraction (:func:`~spikerec.hardware.online.traces.chunk_contract` on a
    :class:`~spikerec.hardware.online.traces.TraceState` of the kind's ``block_partials``; with
    ``tr.compiled`` the compiled per-lane pass :func:`spikerec.kernels.trace_numba.block_lanes_numba`
    and matrix-trace carry ``mat_carry_numba``, registered backends of the kinds, else their torch
    form :func:`~spikerec.hardware.online.traces.lanes_torch`) over two blocks of K steps, the second
    taking the traces the first carried, equals the recursion ``eps_t = J_t eps_{t-1} + imm_t``,
    ``dL/dp = sum_t g_t . eps_t`` run step by step with ``J_t``, ``imm_t`` and the matrices' ``d s_t /
    d W`` derived with ``torch.func.jvp`` over ``spikerec.neurons.<kind>.step`` (float64, fresh random
    states, inputs, parameters and errors): the gradients of every traced parameter, the carried
    per-neuron traces and the carried matrix traces (the LRU's ``B_im`` read from ``B_re``'s trace;
    Jacobians and coefficients broadcast over the block, the unit coefficient; rules full, trunc1 and
    spatial; a first block without a loss)."""
    import importlib

    pytest.importorskip("numba")
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    K, B, H, N = 3, 4, 3, 5
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, rule, 0)
    tr.prepare()
    tr.compiled = compiled
    lanes_c, lanes_t = spy(monkeypatch, traces, "block_lanes_numba"), spy(monkeypatch, traces, "lanes_torch")
    carries = spy(monkeypatch, traces, "mat_carry_numba")
    owner = COMPILED_PARTIALS.get(kind)
    partials = spy(monkeypatch, importlib.import_module(owner[0]), owner[1]) if owner else []
    params, step = detached(cell.params()), step_of(mod, opts)
    s = random_state(cell, B)
    xs = torch.rand(2 * K, B, H) * 2
    states = [s]
    for t in range(2 * K):
        states.append(type(s)(*(f.detach() for f in step(params, states[-1], xs[t]))))
    k = len(s)
    G = torch.randn(2 * K, B, N, k)
    Gs = [None if (t < K and not loss_first) else G[t] for t in range(2 * K)]
    ts = TraceState(tr)
    for blk in range(2):
        rows = range(blk * K, blk * K + K)
        x = xs[blk * K:blk * K + K].reshape(K * B, H)
        bp = tr.block_partials(x, rows_of([states[t] for t in rows]), rows_of([states[t + 1] for t in rows]), K, B)
        chunk_contract(ts, bp, None if Gs[blk * K] is None else G[blk * K:blk * K + K], True)
    use_J = tr.use_J()
    assert use_J == (rule == "full")
    ran = 2 if (use_J or loss_first) else 1  # a block without a loss and without the carry has nothing to do
    assert (len(lanes_c), len(lanes_t)) == ((ran, 0) if compiled else (0, ran)), "the compiled pass ran"
    cuba = kind == "lif" and cell.cuba
    assert len(partials) == (2 if compiled and owner and not cuba else 0), "the compiled partials ran"
    got = ts.take()
    assert set(got) == set(tr.traced) and got, sorted(got)
    if rule == "full":
        assert STATE_PARAMS[kind] - set(kw.get("frozen", ())) <= set(got), sorted(got)
    readers = tr.mat_readers(bp.pre)
    bases = {b for b, _, _ in readers}
    eps, want = derived_recursion(step, params, states[:-1], xs, Gs, tuple(got) + tuple(bases - set(got)), use_J)
    mats = {n for n in got if getattr(params, n).dim() == 2}
    assert mats and all(float(want[n].abs().sum()) > 0 for n in mats)
    for n in got:
        assert torch.allclose(got[n], want[n].reshape(got[n].shape), rtol=1e-10, atol=1e-11), n
    if not use_J:  # no memory: nothing carried
        assert ts.ev is None and not ts.mat
        return
    assert set(ts.vec) == {n for n in got if n not in mats}
    for n, v in ts.vec.items():
        assert torch.allclose(v, planar(eps[n]), rtol=1e-10, atol=1e-11), n
    assert set(ts.mat) == bases and bases, "the matrix traces were carried"
    for n, e in ts.mat.items():
        assert torch.allclose(e, eps[n].permute(1, 0, 2, 3), rtol=1e-10, atol=1e-11), n
    assert len(carries) == (len(readers) if compiled else 0), "the compiled matrix-trace carry ran"
    from spikerec.kernels.trace_numba import block_lanes_numba

    assert any(b.fn is block_lanes_numba for b in neurons.backends_of(kind).values())


# --- the block scans ------------------------------------------------------------------------------------

SCAN_CASES = ([("lif", dict(reset=r)) for r in ("subtract", "zero", "none")]
              + [("lif", dict(reset="subtract", tau_syn=3.0)), ("lif", dict(reset="zero", tau_syn=3.0)),
                 ("lif", dict(reset="subtract", recurrent=True))]
              + [("alif", dict(recurrent=rec, **ALIF_KW)) for rec in (False, True)]
              + [("lru", {}), ("lru", dict(output_size=3))]
              + [("readout", dict(tau=torch.tensor([2.0, 3.0, 5.0, 8.0, 4.0]), learn_tau=True)),
                 ("readout", dict(bias=False))])


@pytest.mark.parametrize("kind,kw", SCAN_CASES)
def test_compiled_block_scan_equals_the_step_loop(kind, kw, monkeypatch):
    """The block's scan of the states (``scan_block`` of the kind's trace, a registered backend:
    the layer's own compiled forward kernel on the CPU where it applies, LIF plain and CUBA without
    lateral weights, ALIF, the LRU's compiled complex scan; else its torch loop; the leaky and the
    linear readout by their linear scan / one GEMM) equals a loop of ``spikerec.neurons.<kind>.step``
    (float64, fresh random states, inputs and parameters): the states before each step, after each
    step, the last one and the outputs."""
    pytest.importorskip("numba")
    from spikerec.kernels import alif_sequence_numba, lif_sequence_numba, scan_numba

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    K, B, H, N = 6, 3, 4, 5
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    calls = []
    if kind == "lif":
        real = lif_sequence_numba.forward_kernel
        monkeypatch.setattr(lif_sequence_numba, "forward_kernel",
                            lambda *a, **k: (lambda f: lambda *b: calls.append(1) or f(*b))(real(*a, **k)))
    elif kind in ("alif", "lru"):
        calls = spy(monkeypatch, *{"alif": (alif_sequence_numba, "alif_forward"),
                                   "lru": (scan_numba, "scan_forward")}[kind])
    s = random_state(cell, B)
    xs = torch.rand(K, B, H) * 2
    prev, last, new, out = tr.scan_block(xs, s)
    compiled = kind in ("alif", "lru") or (kind == "lif" and not kw.get("recurrent"))
    assert len(calls) == (1 if compiled else 0), "the compiled scan ran where it applies"
    params = cell.params()
    outs = []
    for t in range(K):
        if prev is not None:
            for f in range(len(s)):
                assert torch.allclose(prev[f].view(K, B, -1)[t], s[f].detach(), rtol=1e-13, atol=1e-13), (t, f)
        o, s = mod.step(params, s, xs[t]) if opts is None else mod.step(params, s, xs[t], opts)
        outs.append(o.detach())
        for f in range(len(s)):
            assert torch.allclose(new[f].view(K, B, -1)[t], s[f].detach(), rtol=1e-13, atol=1e-13), (t, f)
    for a, b in zip(last, s):
        assert torch.allclose(a, b.detach(), rtol=1e-13, atol=1e-13)
    want = torch.cat(outs)
    assert torch.allclose(out.reshape(want.shape), want, rtol=1e-13, atol=1e-13)
    if kind in ("lif", "alif"):
        assert 0 < float(want.sum()) < want.numel(), "spikes and silence both occur"
    if kind != "readout":
        entry = type(tr).scan_block
        assert any(b.fn is entry for b in neurons.backends_of(kind).values())


# --- the compiled row kernels of the step window --------------------------------------------------------

ROW_CASES = ([("lif", dict(reset=r, recurrent=rec)) for r in ("subtract", "zero", "none") for rec in (False, True)]
             + [("lif", dict(tau_syn=3.0))]
             + [("alif", dict(recurrent=rec, **ALIF_KW)) for rec in (False, True)]
             + [("lru", {}), ("lru", dict(output_size=3))]
             + [("readout", dict(tau=torch.tensor([2.0, 3.0, 5.0, 8.0, 4.0]), learn_tau=True)),
                ("readout", dict(bias=False)), ("readout", {})])


@pytest.mark.parametrize("kind,kw", ROW_CASES)
def test_row_kernels_with_the_layers_constants_equal_the_neuron_steps(kind, kw):
    """The row kernel of a layer with the constants its trace gives the step window
    (``tr.row_kernel(dtype, B)``, called as :class:`~spikerec.hardware.online.window.StepWindow`
    calls it: ``fn(j, X, *state rows, O, *consts)``) over several rows of a window equals a loop of
    ``spikerec.neurons.<kind>.step`` (float64, fresh random states, inputs and parameters; lateral
    weights; the CUBA LIF has none: its window steps in torch)."""
    pytest.importorskip("numba")
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    W, B, H, N = 4, 3, 4, 5
    cell, mod, opts = block_cell(kind, kw, H, N)
    if getattr(cell, "recurrent_weight", None) is not None:
        with torch.no_grad():
            cell.recurrent_weight.add_(0.3 * torch.randn(N, N))  # the forward step reads the full lateral weights
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    rk = tr.row_kernel(torch.float64, B)
    if kind == "lif" and cell.cuba:
        assert rk is None
        return
    fn, consts = rk
    s = random_state(cell, B)
    X = torch.rand(W, B, H) * 2
    S = [torch.zeros(W + 1, *f.shape) for f in s]
    for r, f in zip(S, s):
        r[0] = f
    O = torch.zeros(W, B, getattr(cell, "output_size", None) or N)
    for j in range(W):
        fn(j, X.numpy(), *(r.numpy() for r in S), O.numpy(), *consts)
    params = cell.params()
    for j in range(W):
        o, s = mod.step(params, s, X[j]) if opts is None else mod.step(params, s, X[j], opts)
        for r, f in zip(S, s):
            assert torch.allclose(r[j + 1], f.detach(), rtol=1e-13, atol=1e-13), j
        assert torch.allclose(O[j], o.detach(), rtol=1e-13, atol=1e-13), j
    if kind in ("lif", "alif"):
        assert 0 < float(O.sum()) < O.numel(), "spikes and silence both occur"
    assert any(b.fn is type(tr).row_kernel for b in neurons.backends_of(kind).values())



def test_compiled_loss_row_and_input_row_equal_their_torch_forms():
    """The step window's compiled loss row (:func:`spikerec.kernels.readout_online.mse_row`: the
    package's MSE step loss and its error ``d l / d y`` in one call) equals
    :func:`~spikerec.hardware.online.losses.mse_step_loss` and its gradient by autograd, and the
    compiled input row (``copy_row``) copies a row and tells whether it holds a NaN (float64, fresh
    random outputs and targets; rows other than ``j`` untouched)."""
    pytest.importorskip("numba")
    from spikerec.hardware.online.losses import mse_step_loss
    from spikerec.kernels.readout_online import copy_row, mse_row

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    W, B, O, j = 4, 3, 5, 2
    Y, target = torch.randn(W, B, O), torch.randn(B, O)
    GY, L = torch.full((W, B, O), 7.0), torch.full((W,), 7.0)
    mse_row(j, Y.numpy(), target.numpy(), GY.numpy(), L.numpy())
    y = Y[j].clone().requires_grad_()
    loss = mse_step_loss(y, target)
    (grad,) = torch.autograd.grad(loss, y)
    assert torch.allclose(L[j], loss.detach(), rtol=1e-13, atol=1e-13) and float(loss.detach()) > 0
    assert torch.allclose(GY[j], grad, rtol=1e-13, atol=1e-13)
    keep = [r for r in range(W) if r != j]
    assert torch.equal(GY[keep], torch.full((W - 1, B, O), 7.0)) and torch.equal(L[keep], torch.full((W - 1,), 7.0))
    X, u = torch.zeros(W, B, O), torch.randn(B, O)
    assert not copy_row(j, u.numpy(), X.numpy())
    assert torch.equal(X[j], u) and torch.equal(X[keep], torch.zeros(W - 1, B, O))
    u[1, 3] = float("nan")
    assert copy_row(j + 1, u.numpy(), X.numpy())

"""Issue 12 item 2: the online-learning partials are a backend of the one neuron step. The
hand-written per-neuron Jacobians and immediate partials of the trace classes equal the ones
derived with ``torch.func.jvp`` over ``spikerec.neurons.<kind>.step`` (float64), and the trace
classes' state updates equal that step."""
import pytest
import torch

from spikerec import neurons
from derived_partials import derived_partials
from spikerec.hardware.online.kinds import online_trace
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.neurons import alif as _alif
from spikerec.neurons import lif as _lif
from spikerec.neurons import readout as _readout

from online_helpers import _fp64_one_thread  # noqa: F401

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}
CASES = [
    ("lif", dict(reset="subtract", detach_reset=False, learn_threshold=True)),
    ("lif", dict(reset="zero", detach_reset=False, learn_threshold=True)),
    ("lif", dict(reset="zero", detach_reset=True)),
    ("lif", dict(reset="none", tau_syn=3.0)),
    ("lif", dict(reset="subtract", tau_syn=3.0, detach_reset=False, learn_threshold=True)),
    ("alif", dict(recurrent=False, detach_reset=False, tau_adapt=10.0, b=0.5, beta=0.5)),
    ("alif", dict(recurrent=False, detach_reset=True, tau_adapt=10.0, b=0.5, beta=0.5)),
    ("readout", dict(tau=4.0)),
]
MODULE = {"lif": (LIF, _lif), "alif": (ALIF, _alif), "readout": (LeakyReadout, _readout)}


def make(kind, kw, H=4, N=6):
    cls, mod = MODULE[kind]
    cell = cls(H, N, **kw) if kind == "readout" else cls(H, N, surrogate=SURR, tau_mem=5.0, **kw)
    with torch.no_grad():
        for n, p in cell.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))  # heterogeneous per-neuron values
    return cell, mod


def random_state(cell, B):
    s = cell.initial_state(B)
    return type(s)(*(torch.randn_like(f) + 0.8 for f in s))


@pytest.mark.parametrize("kind,kw", CASES)
def test_hand_written_partials_equal_derived_ones(kind, kw):
    B = 5
    cell, mod = make(kind, kw)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x = torch.rand(B, 4) * 2
    prev = random_state(cell, B)
    new = tr.step(x, prev)
    P = tr.partials(x, prev, new)
    per_neuron = tuple(n for n in P.vec if getattr(cell, n, None) is not None)
    J, vec = derived_partials(lambda p, s, x_: mod.step(p, s, x_, cell.options())[1], cell.params(), prev, x,
                              per_neuron)
    Jh = P.J.expand_as(J)
    assert torch.allclose(Jh, J, rtol=1e-12, atol=1e-12)
    assert float(J.abs().sum()) > 0
    for n in per_neuron:
        assert torch.allclose(P.vec[n], vec[n], rtol=1e-12, atol=1e-12), n
    assert per_neuron, "vacuous: no per-neuron parameter compared"
    assert "online_partials" in neurons.backends_of(kind)


@pytest.mark.parametrize("kind,kw", CASES)
def test_trace_state_update_equals_the_neuron_step(kind, kw):
    B = 4
    cell, mod = make(kind, kw)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x, prev = torch.rand(B, 4) * 2, random_state(cell, B)
    ref = mod.step(cell.params(), prev, x, cell.options())[1]
    got = tr.step(x, prev)
    for a, b in zip(got, ref):
        assert torch.equal(a, b.detach()) or torch.allclose(a, b.detach(), rtol=1e-14, atol=1e-14)


COMPILED_CASES = (
    [("lif", dict(reset=r, detach_reset=d, recurrent=rec, learn_threshold=True,
                  surrogate=SURR if rec else {"name": "atan", "slope": 2.0, "scale": 0.7}))
     for r in ("subtract", "zero", "none") for d in (False, True) for rec in (False, True)]
    + [("alif", dict(detach_reset=d, recurrent=rec, bias=True, tau_adapt=10.0, b=0.5, beta=0.5,
                     surrogate=SURR if d else {"name": "atan", "slope": 2.0, "scale": 0.7}))
       for d in (False, True) for rec in (False, True)])


@pytest.mark.parametrize("kind,kw", COMPILED_CASES)
def test_compiled_partials_equal_derived_ones(kind, kw):
    """The compiled (numba) partials of the online paths, registered backends of the neuron kinds,
    equal the ones derived with ``torch.func.jvp`` over ``spikerec.neurons.<kind>.step`` (float64,
    fresh random states and per-neuron parameters, every reset mode, with and without the reset's
    gradient, with a lateral self-connection: the recurrent weights are made diagonal, where the
    layer's partials are exact)."""
    pytest.importorskip("numba")
    from spikerec.kernels.alif_online import alif_partials_numba
    from spikerec.kernels.lif_online import lif_partials_numba
    from spikerec.surrogate import heaviside

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    B, H, N = 5, 4, 6
    cell, mod, _ = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x, prev = torch.rand(B, H) * 2, random_state(cell, B)
    names, cols, cn, Rd = tr.compiled_trace_setup(torch.float64)
    assert (Rd is not None) == kw["recurrent"]
    if kind == "lif":
        J, imm = lif_partials_numba(prev.v, tr._block_plan(torch.float64, 1, B)["consts"])
        J, imm = J[..., None, None], [i[..., None] for i in imm]
    else:
        u = prev.v - (cn[5] + cn[6] * prev.a)
        J, ev = alif_partials_numba(prev.v, prev.a, cell.surrogate.derivative(u), heaviside(u), cn, cols, Rd,
                                    cell.detach_reset)
        imm = list(ev.unbind(-1))
    Jd, vec = derived_partials(lambda p, s, x_: mod.step(p, s, x_, cell.options())[1], cell.params(), prev, x,
                               tuple(names))
    assert torch.allclose(J, Jd, rtol=1e-12, atol=1e-12)
    assert float(Jd.abs().sum()) > 0
    expected = {"lif": {"log_tau_mem", "threshold", "bias"}, "alif": {"log_tau_mem", "log_tau_adapt", "b", "beta",
                                                                      "bias"}}[kind]
    assert expected <= set(names) <= set(vec), (names, sorted(vec))
    for name, got in zip(names, imm):
        assert torch.allclose(got, vec[name], rtol=1e-12, atol=1e-12), name
    assert any(b.name.startswith("kernels.") for b in neurons.backends_of(kind).values())


def test_compiled_lru_trace_step_equals_derived_partials():
    """The compiled LRU trace step (a registered backend of the kind) from zero traces holds the
    immediate partials of ``spikerec.neurons.lru.step`` derived with ``torch.func.jvp`` (float64,
    fresh random states and parameters), the input matrix's trace ``gamma x`` and the contraction
    ``G += sum_b g . eps``."""
    pytest.importorskip("numba")
    from spikerec.kernels.lru_online import lru_trace_step_numba
    from spikerec.layers import LRU
    from spikerec.neurons import lru as _lru

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    B, H, N = 5, 4, 6
    cell = LRU(H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x, prev = torch.randn(B, H), random_state(cell, B)
    new = _lru.step(cell.params(), prev, x)[1]
    cols, names, wnu, wth, lam, gam = tr.compiled_trace_setup(torch.float64)
    assert set(names) == {"nu_log", "theta_log", "gamma_log"}
    ev = torch.zeros(B, N, 2, len(names))
    em = torch.zeros(N, B, 2, H)
    g = torch.randn(B, N, 2)
    G_vec = [torch.zeros(N) for _ in range(3)]
    G_bre, G_bim = torch.zeros(N, H), torch.zeros(N, H)
    lru_trace_step_numba(prev, _lru.LRUState(*(f.detach().contiguous() for f in new)), x, g, lam, gam, wnu, wth,
                         cols, ev, em, G_vec, G_bre, G_bim)
    _, vec = derived_partials(lambda p, s, x_: _lru.step(p, s, x_)[1], cell.params(), prev, x, tuple(names))
    for j, name in enumerate(names):
        assert torch.allclose(ev[..., j], vec[name], rtol=1e-12, atol=1e-12), name
        k = ("nu_log", "theta_log", "gamma_log").index(name)
        assert torch.allclose(G_vec[k], (g * vec[name]).sum((0, 2)), rtol=1e-12, atol=1e-12), name
    assert torch.allclose(em[:, :, 0], gam.detach()[:, None, None] * x[None], rtol=1e-14, atol=1e-14)
    assert torch.equal(em[:, :, 1], torch.zeros(N, B, H))
    assert torch.allclose(G_bre, torch.einsum("bn,nbh->nh", g[..., 0], em[:, :, 0]), rtol=1e-12, atol=1e-12)
    assert torch.allclose(G_bim, torch.einsum("bn,nbh->nh", g[..., 1], em[:, :, 0]), rtol=1e-12, atol=1e-12)
    assert "kernels.lru_online (compiled trace step of online learning)" in neurons.backends_of("lru")


FORWARD_CASES = (
    [("lif", dict(reset=r, recurrent=rec, surrogate=SURR)) for r in ("subtract", "zero", "none") for rec in (False, True)]
    + [("alif", dict(recurrent=rec, bias=True, tau_adapt=10.0, b=0.5, beta=0.5, surrogate=SURR)) for rec in (False, True)]
    + [("lru", dict(dense_skip=d)) for d in (False, True)] + [("readout", dict(bias=b)) for b in (False, True)]
    + [("readout", dict(bias=True, tau=torch.tensor([2.0, 3.0, 5.0, 8.0, 4.0, 6.0]), learn_tau=True))])


@pytest.mark.parametrize("kind,kw", FORWARD_CASES)
def test_compiled_forward_steps_equal_the_neuron_steps(kind, kw):
    """The compiled forward steps of the whole-stack stream step (registered backends of the
    kinds) equal ``spikerec.neurons.<kind>.step`` (float64, fresh random states, inputs and
    per-neuron parameters; every reset mode; lateral weights; an LRU with a diagonal and a dense
    skip; a linear and a leaky readout)."""
    pytest.importorskip("numba")
    from spikerec.kernels.alif_online import alif_step_numba
    from spikerec.kernels.lif_online import lif_step_numba
    from spikerec.kernels.lru_online import lru_step_numba
    from spikerec.kernels.readout_online import readout_step_numba
    from spikerec.layers import LRU
    from spikerec.neurons import lru as _lru

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    B, H, N = 5, 4, 6
    if kind == "lru":
        cell, mod, fn = LRU(H, N, output_size=3 if kw["dense_skip"] else H), _lru, lru_step_numba
        if kw["dense_skip"]:
            assert cell.D.dim() == 2
    elif kind == "readout":
        cell, mod, fn = LeakyReadout(H, N, **kw), _readout, readout_step_numba
    else:
        cls, mod = MODULE[kind]
        cell, fn = cls(H, N, tau_mem=5.0, zero_diagonal=False, **kw), {"lif": lif_step_numba, "alif": alif_step_numba}[kind]
    with torch.no_grad():
        for n, p in cell.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, prev = torch.rand(B, H) * 2, random_state(cell, B)
    opts = cell.options() if hasattr(cell, "options") else None
    out, new = fn(cell.params(), prev, x, opts)
    ref_out, ref_new = mod.step(cell.params(), prev, x, opts)
    for a, b in zip(new, ref_new):
        assert torch.allclose(a, b.detach(), rtol=1e-13, atol=1e-13)
    if kind in ("lru", "readout"):
        assert torch.allclose(out, ref_out.detach(), rtol=1e-13, atol=1e-13)
    else:
        assert torch.equal(out, ref_out.detach()) and 0 < float(out.sum()) < out.numel()
    assert any(b.fn is fn for b in neurons.backends_of(kind).values())


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


@pytest.mark.parametrize("detach,recurrent", [(True, False), (False, False), (True, True), (False, True)])
def test_compiled_alif_trace_step_equals_derived_partials(detach, recurrent):
    """The compiled ALIF trace step (a registered backend of the kind) on fresh random traces: the
    per-neuron traces become ``J eps + imm``, the input and lateral matrix traces ``J eps + d s_t / d W``,
    and ``G += sum_b g . eps``, with ``J``, ``imm`` and ``d s_t / d W`` derived with ``torch.func.jvp``
    over ``spikerec.neurons.alif.step`` (float64, fresh random states, parameters and traces, with and
    without the reset's gradient, with a lateral self-connection)."""
    pytest.importorskip("numba")
    from spikerec.kernels.alif_online import alif_trace_step_numba
    from spikerec.surrogate import heaviside

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    B, H, N = 5, 4, 6
    cell = ALIF(H, N, tau_mem=5.0, zero_diagonal=False, detach_reset=detach, recurrent=recurrent, bias=True,
                tau_adapt=10.0, b=0.5, beta=0.5, surrogate=SURR)
    with torch.no_grad():
        for n, p in cell.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
        if recurrent:
            cell.recurrent_weight.copy_(torch.diag(torch.randn(N)))
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x, prev = torch.rand(B, H) * 2, random_state(cell, B)
    names, cols, cn, Rd = tr.compiled_trace_setup(torch.float64)
    u = prev.v - (cn[5] + cn[6] * prev.a)
    ev0, ew0, g = torch.randn(B, N, 2, len(names)), torch.randn(N, B, 2, H), torch.randn(B, N, 2)
    er0 = torch.randn(N, B, 2, N) if recurrent else None
    ev, ew, er = ev0.clone(), ew0.clone(), (er0.clone() if recurrent else None)
    G_vec, G_w, G_r = torch.zeros(5, N), torch.zeros(N, H), (torch.zeros(N, N) if recurrent else None)
    alif_trace_step_numba(prev.v, prev.a, cell.surrogate.derivative(u), heaviside(u), x, g, cn, cols, ev, ew, er,
                          G_vec, G_w, G_r, Rd, detach)

    step = lambda p, s, x_: _alif.step(p, s, x_, cell.options())[1]  # noqa: E731
    J, vec = derived_partials(step, cell.params(), prev, x, tuple(names))
    assert float(J[..., 1, 0].abs().sum()) > 0, "the membrane enters the adaptation's Jacobian"
    for j, name in enumerate(names):
        want = torch.einsum("bnij,bnj->bni", J, ev0[..., j]) + vec[name]
        assert torch.allclose(ev[..., j], want, rtol=1e-12, atol=1e-12), name
        assert torch.allclose(G_vec[cols[j]], (g * want).sum((0, 2)), rtol=1e-12, atol=1e-12), name
    mats = [("weight", ew0, ew, G_w)] + ([("recurrent_weight", er0, er, G_r)] if recurrent else [])
    for name, e0, e, G in mats:
        imm = weight_partials(step, cell.params(), prev, x, name).detach()  # [B, N, 2, H]
        want = torch.einsum("bnij,nbjh->nbih", J, e0) + imm.permute(1, 0, 2, 3)
        assert float(imm.abs().sum()) > 0
        assert torch.allclose(e, want, rtol=1e-12, atol=1e-12), name
        assert torch.allclose(G, torch.einsum("bni,nbih->nh", g, want), rtol=1e-12, atol=1e-12), name
    assert any(b.fn is alif_trace_step_numba for b in neurons.backends_of("alif").values())


@pytest.mark.parametrize("kind", ["lif", "alif"])
@pytest.mark.parametrize("surrogate", ["fast_sigmoid", "atan"])
def test_compiled_spatial_backward_equals_the_output_gradient(kind, surrogate):
    """The compiled spatial backward of a layer's spikes (a registered backend of the kind) equals
    the gradient of ``sum(g_out * spikerec.neurons.<kind>.output(...))`` by autograd through the
    definition, in the state and the threshold's parameters (float64, fresh random states, parameters
    and output errors)."""
    pytest.importorskip("numba")
    from spikerec.kernels.alif_online import alif_spatial_numba
    from spikerec.kernels.lif_online import lif_spatial_numba
    from spikerec.kernels.lif_sequence_numba import surrogate_code

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    R, H, N = 7, 4, 6
    sur = {"name": surrogate, "slope": 3.0, "scale": 0.7}
    cls, mod = MODULE[kind]
    cell = cls(H, N, tau_mem=5.0, surrogate=sur, **({"learn_threshold": True} if kind == "lif" else
                                                     {"tau_adapt": 10.0, "b": 0.5, "beta": 0.5}))
    state = type(cell.initial_state(R))(*(torch.randn(R, N) * 0.5 + 0.6 for _ in cell.initial_state(R)))
    gout = torch.randn(R, N)
    state = type(state)(*(f.requires_grad_() for f in state))
    params = cell.params()
    thr_names = ("threshold",) if kind == "lif" else ("b", "beta")
    thr = {n: (getattr(params, n).detach().expand(N) + 0.1 * torch.randn(N)).requires_grad_() for n in thr_names}
    params = params._replace(**thr)
    z = mod.output(params, state, cell.options())
    assert 0 < float(z.detach().sum()) < z.numel()
    want = torch.autograd.grad((gout * z).sum(), [*state, *thr.values()])
    if kind == "lif":
        code = surrogate_code(cell.surrogate)
        gp, s = lif_spatial_numba(gout, state.v.detach(), thr["threshold"].detach().numpy(), code, True)
        assert torch.allclose(gp, want[0], rtol=1e-12, atol=1e-13)
        assert torch.allclose(-s, want[1], rtol=1e-12, atol=1e-12)
        fn = lif_spatial_numba
    else:
        gp, gl, s_gp, s_gpa = alif_spatial_numba(gout, state.v.detach(), state.a.detach(), thr["b"].detach(),
                                                 thr["beta"].detach(), cell.surrogate)
        assert torch.allclose(gl[..., 0], want[0], rtol=1e-12, atol=1e-13)
        assert torch.allclose(gl[..., 1], want[1], rtol=1e-12, atol=1e-13)
        assert torch.equal(gp, gl[..., 0])
        assert torch.allclose(-s_gp, want[2], rtol=1e-12, atol=1e-12)
        assert torch.allclose(-s_gpa, want[3], rtol=1e-12, atol=1e-12)
        fn = alif_spatial_numba
    assert any(b.fn is fn for b in neurons.backends_of(kind).values())


BLOCK_CASES = (
    [("lif", dict(reset=r, detach_reset=d, recurrent=rec, learn_threshold=True, bias=True,
                  surrogate=SURR if d else {"name": "atan", "slope": 2.0, "scale": 0.7}))
     for r, d, rec in (("subtract", False, True), ("zero", True, False), ("none", True, True), ("subtract", True, False))]
    + [("alif", dict(detach_reset=d, recurrent=rec, bias=True, tau_adapt=10.0, b=0.5, beta=0.5,
                     surrogate=SURR if d else {"name": "atan", "slope": 2.0, "scale": 0.7}))
       for d, rec in ((False, True), (True, False))]
    + [("lru", {})])
BLOCK_KERNELS = {"lif": ("spikerec.kernels.lif_online", "_lif_block_vec"),
                 "alif": ("spikerec.hardware.online.traces_lif", "alif_block_numba"),
                 "lru": ("spikerec.hardware.online.traces_lru", "lru_block_traces_numba")}
STATE_PARAMS = {"lif": {"weight", "log_tau_mem", "threshold", "bias"},
                "alif": {"weight", "log_tau_mem", "log_tau_adapt", "b", "beta", "bias"},
                "lru": {"nu_log", "theta_log", "gamma_log", "B_re", "B_im"}}


def block_cell(kind, kw, H, N):
    """A layer of ``kind`` with heterogeneous per-neuron parameters and diagonal lateral weights
    (where the layer's online partials are exact), its definition's module and its step's options."""
    from spikerec.layers import LRU
    from spikerec.neurons import lru as _lru

    if kind == "lru":
        return LRU(H, N), _lru, None
    if kind == "readout":
        cell = LeakyReadout(H, N, **kw)
        return cell, _readout, cell.options()
    cls, mod = MODULE[kind]
    cell = cls(H, N, tau_mem=5.0, zero_diagonal=False, **kw)
    with torch.no_grad():
        for n, p in cell.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
        if cell.recurrent_weight is not None:
            cell.recurrent_weight.copy_(torch.diag(torch.randn(N)))
    return cell, mod, cell.options()


@pytest.mark.parametrize("kind,kw", BLOCK_CASES)
def test_compiled_block_equals_the_derived_recursion(kind, kw, monkeypatch):
    """The chunked block's compiled contraction (``block_contract`` of the kind's trace, a registered
    backend) over two blocks of K steps, the second taking the traces the first carried, equals the
    recursion ``eps_t = J_t eps_{t-1} + imm_t``, ``dL/dp = sum_t g_t . eps_t`` run step by step with
    ``J_t``, ``imm_t`` and the matrices' ``d s_t / d W`` derived with ``torch.func.jvp`` over
    ``spikerec.neurons.<kind>.step`` (float64, fresh random states, inputs, parameters and errors):
    the gradients of every traced parameter and the carried traces."""
    pytest.importorskip("numba")
    import importlib

    from spikerec.hardware.online.traces_base import TraceState

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    K, B, H, N = 3, 4, 3, 5
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    tr.compiled = True  # the closed-form block scans, as the compiled chunked path sets
    owner, attr = BLOCK_KERNELS[kind]
    owner = importlib.import_module(owner)
    real, calls = getattr(owner, attr), []
    monkeypatch.setattr(owner, attr, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    params = type(cell.params())(*(None if p is None else p.detach() for p in cell.params()))
    step = (lambda p, s, x_: mod.step(p, s, x_)[1]) if kind == "lru" else (lambda p, s, x_: mod.step(p, s, x_, opts)[1])
    s = random_state(cell, B)
    xs = torch.rand(2 * K, B, H) * 2
    states = [s]
    for t in range(2 * K):
        states.append(type(s)(*(f.detach() for f in step(params, states[-1], xs[t]))))
    k_fields = len(s)
    G = torch.randn(2 * K, B, N, k_fields)
    ts = TraceState(tr)
    for blk in range(2):
        rows = range(blk * K, blk * K + K)
        cat = lambda ss: type(s)(*(torch.cat([st[f] for st in ss]) for f in range(k_fields)))  # noqa: E731
        prev, new = cat([states[t] for t in rows]), cat([states[t + 1] for t in rows])
        tr.block_contract(ts, xs[blk * K:blk * K + K].reshape(K * B, H), prev, new, G[blk * K:blk * K + K], True, K, B)
    assert len(calls) == 2, "the compiled block ran"
    got = ts.take()
    assert STATE_PARAMS[kind] <= set(got), sorted(got)
    eps, want = {}, {n: 0 for n in got}
    vec_names = tuple(n for n in got if getattr(params, n).dim() == 1)
    for t in range(2 * K):
        J, imm = derived_partials(step, params, states[t], xs[t], vec_names)
        for n in got:
            i = imm[n] if n in vec_names else weight_partials(step, params, states[t], xs[t], n)  # [B, N, k(, H)]
            e = eps.get(n)
            eps[n] = i if e is None else (torch.einsum("bnij,bnj...->bni...", J, e) + i)
            want[n] = want[n] + torch.einsum("bni,bni...->n...", G[t], eps[n])
    assert all(float(want[n].abs().sum()) > 0 for n in got if n not in vec_names)
    for n in got:
        assert torch.allclose(got[n], want[n].reshape(got[n].shape), rtol=1e-10, atol=1e-11), n
    for n in vec_names:
        assert torch.allclose(ts.vec[n].reshape(eps[n].shape), eps[n], rtol=1e-10, atol=1e-11), n
    for n, e in ts.mat.items():
        assert torch.allclose(e, eps[n].permute(1, 0, 2, 3), rtol=1e-10, atol=1e-11), n
    assert ts.mat, "the matrix traces were carried"
    entry = type(tr).block_contract
    assert any(b.fn is entry for b in neurons.backends_of(kind).values())


@pytest.mark.parametrize("kind,kw", [("lif", dict(reset=r, surrogate=SURR)) for r in ("subtract", "zero", "none")]
                         + [("alif", dict(recurrent=rec, bias=True, tau_adapt=10.0, b=0.5, beta=0.5, surrogate=SURR))
                            for rec in (False, True)]
                         + [("lru", {})])
def test_compiled_block_scan_equals_the_step_loop(kind, kw, monkeypatch):
    """The chunked block's compiled scan of the states (``scan_block`` of the kind's trace, a
    registered backend) equals a loop of ``spikerec.neurons.<kind>.step`` (float64, fresh random
    states, inputs and parameters): the states before each step, after each step and the last one."""
    pytest.importorskip("numba")
    from spikerec.kernels import lif_sequence_numba_kernels
    from spikerec.hardware.online import traces_lru

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    K, B, H, N = 6, 3, 4, 5
    cell, mod, opts = block_cell(kind, dict(kw, recurrent=False) if kind == "lif" else kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    from spikerec.kernels import alif_sequence_numba

    owner, attr = {"lif": (lif_sequence_numba_kernels, "fwd_serial"), "alif": (alif_sequence_numba, "alif_forward"),
                   "lru": (traces_lru, "lru_block_scan_numba")}[kind]
    real, calls = getattr(owner, attr), []
    monkeypatch.setattr(owner, attr, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    s = random_state(cell, B)
    xs = torch.rand(K, B, H) * 2
    prev, last, new = tr.scan_block(xs, s, with_new=True)
    assert calls, "the compiled scan ran"
    params = cell.params()
    for t in range(K):
        for f in range(len(s)):
            assert torch.allclose(prev[f].view(K, B, N)[t], s[f].detach(), rtol=1e-13, atol=1e-13), (t, f)
        s = (mod.step(params, s, xs[t]) if kind == "lru" else mod.step(params, s, xs[t], opts))[1]
        for f in range(len(s)):
            assert torch.allclose(new[f].view(K, B, N)[t], s[f].detach(), rtol=1e-13, atol=1e-13), (t, f)
    for a, b in zip(last, s):
        assert torch.allclose(a, b.detach(), rtol=1e-13, atol=1e-13)
    entry = type(tr).scan_block
    assert any(b.fn is entry for b in neurons.backends_of(kind).values())


MATRIX_TRACE_CASES = [BLOCK_CASES[0], BLOCK_CASES[4], ("lru", {}), ("readout", dict(tau=4.0))]


@pytest.mark.parametrize("kind,kw", MATRIX_TRACE_CASES)
def test_compiled_matrix_trace_equals_the_derived_recursion(kind, kw):
    """The stream step's compiled matrix trace (``mat_trace_step_numba``, a registered backend of the
    kinds, one and two states per neuron, one and two readers of a trace) over T steps of
    :func:`~spikerec.hardware.online.traces_base.stream_step` equals the recursion ``eps_t = J_t
    eps_{t-1} + d s_t / d W``, ``dL/dW = sum_t g_t . eps_t`` with ``J_t`` and ``d s_t / d W``
    derived with ``torch.func.jvp`` over ``spikerec.neurons.<kind>.step`` (float64, fresh random
    states, inputs, parameters and errors): every traced parameter's gradient and the traces. The
    Triton form runs the same check in ``tests/test_online_triton.py``."""
    pytest.importorskip("numba")
    from spikerec.kernels import trace_numba

    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    matrix_trace_against_derived(kind, kw, trace_numba.mat_trace_step_numba)
    assert any(b.fn is trace_numba.mat_trace_step_numba for b in neurons.backends_of(kind).values())


def matrix_trace_against_derived(kind, kw, matrix_trace):
    """The check of :func:`test_compiled_matrix_trace_equals_the_derived_recursion` for the matrix
    trace step ``matrix_trace`` (a ``kernel`` of ``stream_step``)."""
    from spikerec.hardware.online.traces_base import TraceState, stream_step

    T, B, H, N = 4, 3, 4, 5
    cell, mod, opts = block_cell(kind, kw, H, N)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    calls = []
    kernel = lambda *a: calls.append(1) or matrix_trace(*a)  # noqa: E731
    params = type(cell.params())(*(None if p is None else p.detach() for p in cell.params()))
    step = (lambda p, s, x_: mod.step(p, s, x_, opts)[1]) if opts is not None else (lambda p, s, x_: mod.step(p, s, x_)[1])
    s = random_state(cell, B)
    xs = torch.rand(T, B, H) * 2
    G = torch.randn(T, B, N, len(s))
    ts = TraceState(tr)
    states = [s]
    for t in range(T):
        new = type(s)(*(f.detach() for f in step(params, s, xs[t])))
        stream_step(ts, tr.partials(xs[t], s, new), G[t], kernel=kernel)
        s = new
        states.append(s)
    assert calls, "the compiled matrix trace ran"
    got = ts.take()
    mats = {n for n in got if getattr(params, n).dim() == 2}
    assert mats >= {"lru": {"B_re", "B_im"}}.get(kind, {"weight"}), sorted(got)
    eps, want = {}, {n: 0 for n in got}
    vec_names = tuple(n for n in got if n not in mats)
    for t in range(T):
        J, imm = derived_partials(step, params, states[t], xs[t], vec_names)
        for n in got:
            i = imm[n] if n in vec_names else weight_partials(step, params, states[t], xs[t], n)
            e = eps.get(n)
            eps[n] = i if e is None else (torch.einsum("bnij,bnj...->bni...", J, e) + i)
            want[n] = want[n] + torch.einsum("bni,bni...->n...", G[t], eps[n])
    for n in got:
        assert torch.allclose(got[n], want[n].reshape(got[n].shape), rtol=1e-10, atol=1e-11), n
    for n in mats:
        assert float(want[n].abs().sum()) > 0, n
        if n in ts.mat:
            assert torch.allclose(ts.mat[n], eps[n].permute(1, 0, 2, 3), rtol=1e-10, atol=1e-11), n

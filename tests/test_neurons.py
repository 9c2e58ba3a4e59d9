"""The one-definition neuron core: integer arithmetic through the step, roles, registry, options."""

import pytest
import torch

from spikerec import neurons
from intsim_reference import simulate_reference
from spikerec.hardware.export.quantize import quantize
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.models import build_model
from spikerec.neurons import Role, Transform, alif, lif, parameters_by_role, readout

F64 = torch.float64


# --- an integer arithmetic written here from the profile rules, run through the float model's step ----------
class LoihiLikeArithmetic:
    """Integer rules of :class:`~spikerec.hardware.export.profiles.TargetProfile` (mulshift or bitshift decay,
    wrap or saturate, strict ``v > thr``), written independently of ``spikerec.hardware.export.intsim``."""

    def __init__(self, profile):
        self.p = profile
        self.reset_timing = profile.reset_timing

    @staticmethod
    def _ov(x, bits, mode):
        if mode == "wrap_lava":  # Lava's PyLifModelBitAcc: into (-2^(N-1), 2^(N-1)]
            half = 1 << (bits - 1)
            return half - torch.remainder(half - x, 1 << bits)
        if mode == "wrap":
            half = 1 << (bits - 1)
            return torch.remainder(x + half, 1 << bits) - half
        lim = (1 << (bits - 1)) - 1
        return x.clamp(-lim, lim)

    def synaptic_input(self, x, weight, into=None):
        out = x @ weight.t()
        return out if into is None else into + out

    def decay_factor(self, code, dt):
        return code

    def decay(self, x, code):
        if self.p.decay == "mulshift":
            return torch.sign(x) * ((x.abs() * ((1 << self.p.decay_bits) - code)) >> self.p.decay_bits)
        return x - (x >> code)

    def integrate(self, v, code, i, bias):
        return self.decay(v, code) + (i if bias is None else i + bias)

    def current(self, i):
        return self._ov(i, self.p.current_bits, self.p.current_overflow)

    def state(self, v):
        return self._ov(v, self.p.state_bits, self.p.state_overflow)

    def spike(self, v, thr, surrogate):
        return (v > thr).long()

    def product(self, gain, x):
        return (gain * x) >> self.p.adapt_frac_bits


def _int_layer(q, p):
    """(step module, params, options) of one quantised layer: weights as shifted mantissas, decay codes in the
    time-constant fields."""
    W = q.weight << q.shift
    R = None if q.recurrent_weight is None else q.recurrent_weight << q.shift
    if q.kind == "lif":
        assert torch.equal(q.threshold, q.reset_amount)  # strict-threshold profiles only
        return lif, lif.LIFParams(W, q.bias, R, q.decay_v, q.decay_i if q.cuba else None, q.threshold), \
            lif.LIFOptions(reset=q.reset, bias_into=p.bias_into)
    if q.kind == "alif":
        return alif, alif.ALIFParams(W, q.bias, R, q.decay_v, q.decay_a, q.b, q.beta, adapt_gain=q.adapt_inc), \
            alif.ALIFOptions(bias_into=p.bias_into)
    return readout, readout.ReadoutParams(W, q.bias, q.decay_v), readout.ReadoutOptions(bias_into=p.bias_into)


def _initial(mod, n, B):
    z = torch.zeros(B, n, dtype=torch.long)
    return {lif: lambda cuba: lif.CubaLIFState(z, z) if cuba else lif.LIFState(z),
            alif: lambda cuba: alif.ALIFState(z, z), readout: lambda cuba: readout.ReadoutState(z)}[mod]


def _run_integer_step(qnet, x):
    p = qnet.profile
    arith = LoihiLikeArithmetic(p)
    layers = [_int_layer(q, p) for q in qnet.layers]
    states = [_initial(m, q.size, x.shape[1])(q.cuba) for (m, _, _), q in zip(layers, qnet.layers)]
    ys, spikes = [], [[] for _ in layers[:-1]]
    for t in range(x.shape[0]):
        h = x[t]
        for k, (m, prm, opt) in enumerate(layers):
            h, states[k] = m.step(prm, states[k], h, opt, arith)
            (ys if k == len(layers) - 1 else spikes[k]).append(h)
    return torch.stack(ys), [torch.stack(s) for s in spikes]


def _net(seed, *, reset="subtract", cuba=None, recurrent=True, alif_first=False, readout_tau=5.0):
    torch.manual_seed(seed)
    first = {"kind": "alif", "size": 6, "b": 0.3, "beta": 0.5, "tau_mem": 8.0, "tau_adapt": 20.0} if alif_first else \
        {"kind": "lif", "size": 6, "recurrent": recurrent, "reset": reset, "tau_syn": cuba, "threshold": 0.4, "bias": True}
    m = build_model({"input_size": 5, "layers": [first, {"kind": "lif", "size": 4, "reset": reset, "threshold": 0.3}],
                     "readout": {"size": 3, "tau": readout_tau}})
    with torch.no_grad():
        for c in m.cells:
            c.weight.mul_(2.0)
            if getattr(c, "bias", None) is not None:
                c.bias.uniform_(-0.05, 0.2)
    return m


@pytest.mark.parametrize("profile,overrides,spec", [
    ("loihi2", {}, dict(reset="zero", cuba=4.0)),
    ("loihi2", {}, dict(reset="zero", recurrent=True, readout_tau=None)),
    ("generic", {}, dict(reset="subtract", cuba=3.0)),
    ("generic", {"reset_timing": "immediate", "decay": "bitshift", "decay_bits": 4}, dict(reset="subtract")),
    ("generic", {"bias_into": "voltage"}, dict(reset="none", cuba=3.0)),
    ("generic", {"state_bits": 10, "current_bits": 9, "weight_bits": 4, "threshold_bits": 8,
                 "state_overflow": "wrap", "current_overflow": "wrap"}, dict(reset="zero", cuba=6.0)),
    ("generic", {}, dict(alif_first=True)),
])
def test_integer_arithmetic_through_the_step_equals_reference(profile, overrides, spec):
    """The float model's step, run with an integer arithmetic object, is bit-exact with the plain-Python
    integer reference on a random network: the arithmetic hook expresses the target's rules."""
    for seed in range(2):
        q, _ = quantize(_net(seed, **spec), profile, **overrides)
        g = torch.Generator().manual_seed(100 + seed)
        x = torch.randint(0, 4, (13, 3, 5), generator=g) if seed else (torch.rand(13, 3, 5, generator=g) < 0.4).long()
        assert isinstance(LoihiLikeArithmetic(q.profile), neurons.Arithmetic)
        y, spikes = _run_integer_step(q, x)
        ys_ref, spikes_ref = simulate_reference(q, x)
        assert torch.equal(y, torch.tensor(ys_ref, dtype=torch.long))
        for k, (a, b) in enumerate(zip(spikes, spikes_ref)):
            assert torch.equal(a, torch.tensor(b, dtype=torch.long)), f"layer {k} spikes differ"
        assert sum(int(s.sum()) for s in spikes) > 0, "degenerate case: no spikes"


def test_float_immediate_reset_and_add_then_decay_synapse_by_hand():
    """The orderings that targets disagree on, checked on numbers computed by hand."""

    class Immediate(neurons.FloatArithmetic):
        reset_timing = "immediate"

    one = torch.ones(1, 1, dtype=F64)
    lt = torch.full((1,), float(torch.log(torch.tensor(1.0 / torch.log(torch.tensor(2.0)).item()))), dtype=F64)  # alpha=0.5
    prm = lif.LIFParams(one, None, None, lt, lt, torch.ones(1, dtype=F64))
    from spikerec.surrogate import get_surrogate
    sur = get_surrogate("fast_sigmoid")
    st = lif.CubaLIFState(torch.full((1, 1), 0.4, dtype=F64), torch.full((1, 1), 1.5, dtype=F64))  # v above threshold
    x = torch.full((1, 1), 0.2, dtype=F64)
    o = lif.LIFOptions(surrogate=sur)
    z, s = lif.step(prm, st, x, o)
    # i = 0.5*0.4 + 0.2 = 0.4; v = 0.5*1.5 + 0.4 - 1 = 0.15
    assert s.i.item() == pytest.approx(0.4) and s.v.item() == pytest.approx(0.15) and z.item() == 0
    z, s = lif.step(prm, st, x, lif.LIFOptions(surrogate=sur, synapse="add_then_decay"), Immediate())
    # i = 0.5*(0.4 + 0.2) = 0.3; v = 0.5*(1.5 - 1) + 0.3 = 0.55
    assert s.i.item() == pytest.approx(0.3) and s.v.item() == pytest.approx(0.55)


# --- roles ---------------------------------------------------------------------------------------------
def test_roles_reproduce_the_stability_groups_and_select_without_names():
    torch.manual_seed(0)
    c = LIF(3, 4, tau_syn=5.0, recurrent=True)
    g = c.stability_groups()
    assert [id(p) for p in g["time"]] == [id(c.recurrent_weight), id(c.log_tau_mem), id(c.log_tau_syn)]
    assert [id(p) for p in g["depth"]] == [id(c.weight), id(c.threshold)]
    a = ALIF(3, 4)
    g = a.stability_groups()
    assert [id(p) for p in g["time"]] == [id(a.recurrent_weight), id(a.log_tau_mem), id(a.log_tau_adapt)]
    assert [id(p) for p in g["depth"]] == [id(a.weight), id(a.b), id(a.beta)]
    r = LeakyReadout(4, 2, tau=3.0)
    assert [id(p) for p in r.stability_groups()["time"]] == [id(r.log_tau)]
    assert [id(p) for p in r.stability_groups()["depth"]] == [id(r.weight)]
    # qualified names through a container; absent optional parameters are skipped
    m = torch.nn.ModuleList([LIF(3, 4), ALIF(4, 4, recurrent=False)])
    names = [n for n, _ in parameters_by_role(m, Role.TIME)]
    assert names == ["0.log_tau_mem", "1.log_tau_mem", "1.log_tau_adapt"]
    assert [n for n, _ in parameters_by_role(m, "threshold")] == ["0.threshold", "1.b", "1.beta"]
    assert c.param_specs()["log_tau_mem"].transform is Transform.LOG_TAU


def test_renaming_a_parameter_cannot_silently_change_its_role():
    """A spec naming an attribute that is not a parameter of the cell is skipped only when that attribute is None
    (an optional parameter); a wrong spec type is an error."""

    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))

        @staticmethod
        def param_specs():
            return {"w": "time"}

    with pytest.raises(TypeError, match="expected a ParamSpec"):
        parameters_by_role(Bad(), Role.TIME)


# --- registry ------------------------------------------------------------------------------------------
def test_every_kind_has_a_backend_and_registration_checks_its_arguments():
    """(That every backend's equality test exists: tests/test_compiled_reach.py, over every module.)"""
    import spikerec.layers  # noqa: F401  (registers the layer backends)

    kinds = [k for k in neurons.KINDS if neurons.backends_of(k)]
    assert kinds == list(neurons.KINDS), "every kind has at least its layer's forward as a backend"
    with pytest.raises(ValueError, match="unknown kind"):
        neurons.register_backend("nope", "x", lambda: None, test="tests/a.py::b")
    with pytest.raises(ValueError, match="test must name"):
        neurons.register_backend("lif", "x", lambda: None, test="")


def test_readout_forward_equals_step():
    torch.manual_seed(1)
    for tau in (None, 4.0):
        r = LeakyReadout(5, 3, tau=tau, learn_tau=True).double()
        x = torch.randn(11, 2, 5, dtype=F64)
        y0 = torch.randn(2, 3, dtype=F64)
        outs = []
        for path in ("fused", "loop"):
            r.zero_grad()
            xx = x.clone().requires_grad_()
            y, s = r(xx, readout.ReadoutState(y0)) if path == "fused" else r.step_loop(xx, readout.ReadoutState(y0))
            (y * torch.linspace(-1, 1, y.numel(), dtype=F64).view_as(y)).sum().add(s.y.sum()).backward()
            outs.append((y.detach(), xx.grad, {n: p.grad.clone() for n, p in r.named_parameters()}))
        torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-12, atol=1e-12)
        for n in outs[0][2]:
            torch.testing.assert_close(outs[0][2][n], outs[1][2][n], rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("make,match", [
    (lambda: lif.LIFOptions(reset="soft"), "LIFOptions.reset"),
    (lambda: lif.LIFOptions(dt=0), "LIFOptions.dt"),
    (lambda: lif.LIFOptions(synapse="both"), "LIFOptions.synapse"),
    (lambda: alif.ALIFOptions(bias_into="gate"), "ALIFOptions.bias_into"),
    (lambda: readout.ReadoutOptions(dt=-1), "ReadoutOptions.dt"),
])
def test_bad_options(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("variant", ["linear", "A", "B", "no_tanh"])
def test_wcrnn_forward_equals_step_with_gradients(variant):
    from spikerec.layers import WCRNN

    cell = WCRNN(3, 6, residual="informed", variant=variant, seed=2, trainable_residual=True).double()
    x = torch.randn(9, 2, 3, dtype=F64)
    x0 = torch.randn(2, 6, dtype=F64)
    res = []
    for path in ("forward", "loop"):
        cell.zero_grad()
        xx, hh = x.clone().requires_grad_(), x0.clone().requires_grad_()
        st = type(cell.initial_state(2))(hh)
        y, s = cell(xx, st) if path == "forward" else cell.step_loop(xx, st)
        ((y * torch.linspace(-1, 1, 6, dtype=F64)).sum() + 0.5 * s.x.sum()).backward()
        res.append([y.detach(), s.x.detach(), xx.grad, hh.grad] + [p.grad.clone() for p in cell.parameters()])
    for u, v in zip(*res):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-13)


# --- consumers select by role ------------------------------------------------------------------------------
def _mixed_model():
    torch.manual_seed(3)
    return build_model({"input_size": 3, "layers": [
        {"kind": "lif", "size": 4, "recurrent": True, "tau_syn": 5.0}, {"kind": "alif", "size": 4},
        {"kind": "lru", "size": 5, "output_size": 4}, {"kind": "gru", "size": 4},
        {"kind": "wcrnn", "size": 4, "trainable_residual": True}], "readout": {"size": 2, "tau": 4.0}})


def test_trainer_slow_group_by_role():
    from spikerec.train.trainer import _recurrent_names

    got = _recurrent_names(_mixed_model())
    assert got == {"cells.0.recurrent_weight", "cells.0.log_tau_mem", "cells.0.log_tau_syn",
                   "cells.1.recurrent_weight", "cells.1.log_tau_mem", "cells.1.log_tau_adapt",
                   "cells.2.nu_log", "cells.2.theta_log", "cells.2.gamma_log", "cells.2.B_re", "cells.2.B_im",
                   "cells.3.rnn.weight_hh_l0", "cells.4.weight_xx", "cells.4.residual"}


def test_lru_model_param_groups_by_role():
    from spikerec.lru_model import LRUModel, lru_param_groups

    m = LRUModel(3, 2, d_model=8, d_state=6, n_layers=2)
    groups = lru_param_groups(m, lr=1e-3, lr_factor=0.5, weight_decay=0.1)
    slow = {id(p) for p in groups[0]["params"]}
    names = {n.rsplit(".", 1)[-1] for n, p in m.named_parameters() if id(p) in slow}
    assert groups[0]["name"] == "recurrent" and names == {"nu_log", "theta_log", "gamma_log", "B_re", "B_im"}
    assert len(slow) == 10


def test_lsc_multiplier_scales_by_transform():
    """tau -> kappa tau for log-tau, |lambda|'s time constant exp(-nu) -> kappa exp(-nu), weights -> kappa w, phases
    and non-multiplier parameters untouched; the lists come from the roles, not the names."""
    import math

    from spikerec.stability.lsc import apply_clipped_multiplier

    m = _mixed_model()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    radii = {f"time/{l}": 1.0 for l in range(5)} | {"input/0": 1.0} | {f"depth/{l}": 1.0 for l in range(1, 5)}
    targets = {k: 1.1 for k in radii}
    kappas = apply_clipped_multiplier(m, radii, targets)
    assert all(k == pytest.approx(1.1) for k in kappas.values())
    after = dict(m.named_parameters())
    lk = math.log(1.1)
    torch.testing.assert_close(after["cells.0.log_tau_mem"], before["cells.0.log_tau_mem"] + lk)
    torch.testing.assert_close(after["cells.1.log_tau_adapt"], before["cells.1.log_tau_adapt"] + lk)
    torch.testing.assert_close(after["cells.2.nu_log"], before["cells.2.nu_log"] - lk)
    torch.testing.assert_close(after["cells.0.weight"], before["cells.0.weight"] * 1.1)
    torch.testing.assert_close(after["cells.2.B_re"], before["cells.2.B_re"] * 1.1)
    torch.testing.assert_close(after["cells.3.rnn.weight_hh_l0"], before["cells.3.rnn.weight_hh_l0"] * 1.1)
    for n in ("cells.2.theta_log", "cells.2.gamma_log", "cells.2.D", "cells.2.C_re", "cells.0.bias",
              "cells.3.rnn.bias_hh_l0", "cells.4.bias_xx", "readout.weight"):
        assert torch.equal(after[n], before[n]), n


def test_every_cell_follows_the_one_protocol():
    from spikerec.layers.base import CellProtocol, protocol_missing

    m = _mixed_model()
    for c in m.layers:
        assert isinstance(c, CellProtocol) and protocol_missing(c) == [], type(c).__name__
        assert c.param_specs(), f"{type(c).__name__} declares no parameter roles"
    assert not isinstance(torch.nn.Linear(2, 2), CellProtocol)
    assert "step" in protocol_missing(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="missing"):
        from spikerec.models import RecurrentStack
        RecurrentStack([torch.nn.Linear(2, 2)], LeakyReadout(2, 2))


class XyloLikeArithmetic(LoihiLikeArithmetic):
    """Xylo's rules as its documentation states them: bitshift decay removing at least one LSB, saturation after
    every partial sum of the synaptic input, up to ``n_max`` spikes per step (``v -= n thr``), immediate reset."""

    def __init__(self, profile, n_max=31):
        super().__init__(profile)
        self.reset_timing, self.n_max = "immediate", n_max

    def synaptic_input(self, x, weight, into=None):
        acc = torch.zeros(x.shape[0], weight.shape[0], dtype=torch.long) if into is None else into
        for c in range(x.shape[1]):  # one partial sum per input channel, saturated each time
            acc = self.current(acc + x[:, c:c + 1] * weight[:, c])
        return acc

    def decay(self, x, dash):
        d = x >> dash
        return x - torch.where((d == 0) & (x != 0), torch.sign(x), d)

    def spike(self, v, thr, surrogate):
        return torch.div(v, thr, rounding_mode="floor").clamp(0, self.n_max)


def test_xylo_like_rules_through_the_step_equal_a_plain_loop():
    """Multi-spike counts, add-then-decay synapse, at-least-one-LSB decay, per-event saturation and immediate reset,
    all through the one LIF step, against a plain-Python loop in Xylo's documented order (post-reset state)."""
    from spikerec.hardware.export.profiles import get_profile

    p = get_profile("xylo", current_bits=8, state_bits=10, current_overflow="saturate", state_overflow="saturate")
    ar = XyloLikeArithmetic(p)
    g = torch.Generator().manual_seed(5)
    N, C, T, B = 3, 4, 25, 2
    W = torch.randint(-70, 90, (N, C), generator=g)
    bias = torch.randint(-3, 6, (N,), generator=g)
    d_i, d_v = torch.tensor([1, 2, 3]), torch.tensor([2, 4, 1])
    thr = torch.tensor([20, 35, 50])
    x = torch.randint(0, 3, (T, B, C), generator=g)
    prm = lif.LIFParams(W, bias, None, d_v, d_i, thr)
    opt = lif.LIFOptions(synapse="add_then_decay", bias_into="voltage")
    st = lif.CubaLIFState(torch.zeros(B, N, dtype=torch.long), torch.zeros(B, N, dtype=torch.long))
    counts = []
    for t in range(T):
        n, st = lif.step(prm, st, x[t], opt, ar)
        counts.append(n)
    counts = torch.stack(counts)

    def sat(v, bits):
        lim = (1 << (bits - 1)) - 1
        return max(-lim, min(lim, v))

    def dec(v, dash):
        d = v >> dash
        return v - (d if d != 0 or v == 0 else (1 if v > 0 else -1))

    order_mattered = 0  # steps where saturating every partial sum differs from saturating the total once
    for b in range(B):
        for j in range(N):
            i = v = 0
            for t in range(T):
                i0, alone = i, 0
                for c in range(C):
                    i = sat(i + int(x[t, b, c]) * int(W[j, c]), 8)
                    alone += int(x[t, b, c]) * int(W[j, c])
                order_mattered += i != sat(i0 + alone, 8)
                i = sat(dec(i, int(d_i[j])), 8)
                v = sat(dec(v, int(d_v[j])) + i + int(bias[j]), 10)
                n = max(0, min(31, v // int(thr[j])))
                v -= n * int(thr[j])
                assert int(counts[t, b, j]) == n, (t, b, j)
    assert int(counts.max()) > 1, "degenerate case: no multi-spike step"
    assert order_mattered > 0, "degenerate case: per-event saturation never differed from saturating the sum"


def test_a_cell_without_roles_says_so():
    from spikerec.layers.base import Cell

    class NoRoles(Cell):
        pass

    with pytest.raises(NotImplementedError, match="NoRoles: declares no parameter roles"):
        NoRoles().stability_groups()


def test_neurons_imports_only_torch_and_surrogate():
    """``spikerec.neurons`` sits below ``layers`` in the import order: it imports torch, the standard library,
    ``spikerec.surrogate`` and itself, nothing else of spikerec."""
    import ast
    import pathlib

    root = pathlib.Path(neurons.__file__).parent
    for f in root.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                target = (node.module or "").split(".")[0]
                assert node.level == 1 or target == "surrogate", f"{f.name}: from {'.' * node.level}{node.module}"
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("spikerec"):
                assert node.module in ("spikerec.surrogate",) or node.module.startswith("spikerec.neurons"), f.name
            elif isinstance(node, ast.Import):
                assert all(not a.name.startswith("spikerec") or a.name.startswith("spikerec.neurons") for a in node.names)

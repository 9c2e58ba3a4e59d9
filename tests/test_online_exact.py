"""Online eligibility-trace learning vs autograd BPTT (float64), rules, modes, errors."""
import math

import pytest
import torch

from spikerec.hardware.online import OnlineLearner, classification_loss, mse_loss
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread, bptt_grads, cos, named, online_grads, rel  # noqa: F401

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}


def spiking_cell(kind, H, N, **kw):
    cell = (LIF if kind == "lif" else ALIF)(H, N, surrogate=SURR, **kw)
    with torch.no_grad():
        cell.weight.mul_(3.0)
    return cell


CONFIGS = [
    ("lif", dict(reset="subtract", detach_reset=False, learn_threshold=True, tau_mem=5.0)),
    ("lif", dict(reset="zero", detach_reset=True, learn_threshold=True, tau_mem=5.0)),
    ("lif", dict(reset="none", tau_syn=3.0, tau_mem=5.0)),
    ("lif", dict(reset="subtract", tau_syn=3.0, tau_mem=5.0, detach_reset=False, learn_threshold=True)),
    ("alif", dict(recurrent=False, detach_reset=False, tau_mem=5.0, tau_adapt=10.0, b=0.5, beta=0.5)),
    ("alif", dict(recurrent=False, detach_reset=True, tau_mem=5.0, tau_adapt=10.0, b=0.5, beta=0.5)),
]


@pytest.mark.parametrize("kind,kw", CONFIGS)
def test_spiking_layer_without_lateral_weights_equals_bptt(kind, kw):
    """Bellec et al. 2020 (e-prop), exact on independent modules (thesis Zucchet 2025, Sec. 4.3.1): traces with the reset path in J are exact without lateral weights,
    for either detach_reset setting (the traces follow the cell's own reset gradient)."""
    T, B, H, N = int(torch.randint(12, 25, ())), 3, 4, 6
    model = RecurrentStack([spiking_cell(kind, H, N, **kw)], LeakyReadout(N, 2))
    x, tgt = torch.rand(T, B, H), torch.randn(T, B, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    est = online_grads(model, x, tgt, mse_loss)
    assert sum(float(g.abs().sum()) for g in ref.values()) > 0
    for n in ref:
        assert rel(est[n], ref[n]) < 1e-10, n
        assert ref[n].abs().sum() > 0, f"{n}: vacuous test (zero gradient)"


def test_lateral_weights_are_eprop_approximate():
    """With lateral weights the modules interact: recurrent weights get e-prop traces
    (biased, yet aligned), the readout stays exact."""
    T, B, H, N = 20, 4, 4, 6
    cell = spiking_cell("alif", H, N, recurrent=True, tau_mem=5.0, tau_adapt=10.0, b=0.5, beta=0.5)
    with torch.no_grad():
        cell.recurrent_weight.mul_(2.0)
    model = RecurrentStack([cell], LeakyReadout(N, 2))
    x, tgt = torch.rand(T, B, H), torch.randn(T, B, 2)
    ref, est = bptt_grads(model, x, tgt, mse_loss), online_grads(model, x, tgt, mse_loss)
    assert rel(est["readout.weight"], ref["readout.weight"]) < 1e-10
    assert rel(est["cells.0.recurrent_weight"], ref["cells.0.recurrent_weight"]) > 1e-3
    assert cos(est["cells.0.recurrent_weight"], ref["cells.0.recurrent_weight"]) > 0.5
    assert float(est["cells.0.recurrent_weight"].diagonal().abs().max()) == 0.0  # zero-diagonal mask


def deep_spiking_model(H=4, N=6):
    cells = [spiking_cell("alif", H, N, recurrent=False, tau_mem=5.0, tau_adapt=10.0, b=0.3, beta=0.5),
             spiking_cell("lif", N, N, tau_syn=3.0, tau_mem=5.0, learn_threshold=True, detach_reset=False)]
    return RecurrentStack(cells, LeakyReadout(N, 2))


def test_deep_spiking_last_layer_exact_earlier_biased_but_aligned():
    torch.manual_seed(3)
    T, B = 30, 4
    model = deep_spiking_model()
    x, tgt = torch.rand(T, B, 4), torch.randn(T, B, 2)
    ref, est = bptt_grads(model, x, tgt, mse_loss), online_grads(model, x, tgt, mse_loss)
    for n in ref:
        if n.startswith("cells.1") or n.startswith("readout"):
            assert rel(est[n], ref[n]) < 1e-10, n
    w_est, w_ref = est["cells.0.weight"], ref["cells.0.weight"]
    assert rel(w_est, w_ref) > 1e-3  # would catch an accidental BPTT
    assert cos(w_est, w_ref) > 0.5


@pytest.mark.parametrize("K", [1, 3, 7, 20])
def test_modes_agree(K):
    """stream == chunked(K) == parallel for every parameter (T = 20 not divisible by 3 or 7),
    including the biased first layer and a leaky (traced) readout."""
    torch.manual_seed(5)
    T, B = 20, 3
    model = RecurrentStack(deep_spiking_model().cells, LeakyReadout(6, 2, tau=4.0, learn_tau=True))
    x, tgt = torch.rand(T, B, 4), torch.randn(T, B, 2)
    s = online_grads(model, x, tgt, mse_loss, mode="stream")
    c = online_grads(model, x, tgt, mse_loss, mode="chunked", chunk=K)
    p = online_grads(model, x, tgt, mse_loss, mode="parallel")
    for n in s:
        assert s[n].abs().sum() > 0, n
        assert rel(c[n], s[n]) < 1e-10, n
        assert rel(p[n], s[n]) < 1e-10, n


def test_leaky_readout_is_exact_last_layer():
    """A leaky readout is a traced recurrent layer: exact; the cell below is exact with the
    readout-filtered traces (the default) and biased without them."""
    torch.manual_seed(2)
    T, B = 25, 3
    cell = spiking_cell("lif", 4, 6, tau_mem=5.0)
    model = RecurrentStack([cell], LeakyReadout(6, 2, tau=5.0, learn_tau=True))
    x, tgt = torch.rand(T, B, 4), torch.randn(T, B, 2)
    ref, filtered = bptt_grads(model, x, tgt, mse_loss), online_grads(model, x, tgt, mse_loss)
    for n in ref:
        assert rel(filtered[n], ref[n]) < 1e-10, n
    est = online_grads(model, x, tgt, mse_loss, readout_filter=False)
    for n in ("readout.weight", "readout.bias", "readout.log_tau"):
        assert rel(est[n], ref[n]) < 1e-10, n
    assert rel(est["cells.0.weight"], ref["cells.0.weight"]) > 1e-3
    assert cos(est["cells.0.weight"], ref["cells.0.weight"]) > 0.5


def test_trunc1_equals_autograd_with_detached_states():
    """``trunc1`` = instantaneous partials: autograd of sum_t l_t with every previous state detached."""
    T, B = 15, 3
    model = deep_spiking_model()
    x, tgt = torch.rand(T, B, 4), torch.randn(T, B, 2)
    ref = bptt_grads(model, x, tgt, mse_loss, detach_state=True)
    est = online_grads(model, x, tgt, mse_loss, rule="trunc1")
    for n in ref:
        assert rel(est[n], ref[n]) < 1e-10, n


def test_spatial_and_snap1_rules():
    T, B = 15, 3
    model = deep_spiking_model()
    x, tgt = torch.rand(T, B, 4), torch.randn(T, B, 2)
    tr = online_grads(model, x, tgt, mse_loss, rule="trunc1")
    sp = online_grads(model, x, tgt, mse_loss, rule="spatial")
    full = online_grads(model, x, tgt, mse_loss, rule="full")
    snap = online_grads(model, x, tgt, mse_loss, rule="snap1")
    for n in full:
        assert torch.equal(full[n], snap[n]), n  # extended SnAp-1 == the rule on independent modules
    # spatial: time constants get no gradient, input weights keep their immediate partial
    for n in ("cells.0.log_tau_mem", "cells.0.log_tau_adapt", "cells.1.log_tau_mem", "cells.1.log_tau_syn"):
        assert float(sp[n].abs().max()) == 0.0, n
        assert float(tr[n].abs().max()) > 0.0, n
    for n in ("cells.0.weight", "cells.1.weight", "readout.weight"):
        assert rel(sp[n], tr[n]) < 1e-12, n


def test_bptt_rule_matches_autograd():
    T, B = 12, 2
    model = deep_spiking_model()
    x, tgt = torch.rand(T, B, 4), torch.randn(T, B, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    est = online_grads(model, x, tgt, mse_loss, rule="bptt")
    for n in ref:
        assert rel(est[n], ref[n]) < 1e-10, n


def test_classification_losses_and_return_value():
    T, B = 10, 4
    cell = spiking_cell("lif", 4, 6, tau_mem=5.0)
    model = RecurrentStack([cell], LeakyReadout(6, 3), readout_mode="mean")
    x, y = torch.rand(T, B, 4), torch.randint(0, 3, (B,))
    for mode in ("mean", "last"):
        fn = classification_loss(mode, T)
        ref = bptt_grads(model, x, y, fn)
        model.zero_grad()
        L = OnlineLearner(model).backward(x, y, fn)
        out = model(x)[0]
        expect = (torch.nn.functional.cross_entropy(out.reshape(T * B, 3), y.repeat(T)) if mode == "mean"
                  else torch.nn.functional.cross_entropy(out[-1], y))
        assert math.isclose(L, float(expect.detach()), rel_tol=1e-12)
        for n, p in named(model):
            assert rel(p.grad, ref[n]) < 1e-10, (mode, n)
    with pytest.raises(ValueError, match="per-step"):
        classification_loss("max", T)


def test_updates_every_step_or_block_add_up_to_the_whole_estimate():
    """update() after every step (stream) or block (chunked) with a flush-and-zero of .grad: the
    pieces add up to the whole estimate."""
    T, B = 11, 2
    model = deep_spiking_model()
    x, tgt = torch.rand(T, B, 4), torch.randn(T, B, 2)
    whole = online_grads(model, x, tgt, mse_loss)
    for mode, chunk in (("stream", None), ("chunked", 4)):
        acc = {n: torch.zeros_like(p) for n, p in named(model)}
        model.zero_grad()
        lr = OnlineLearner(model, mode=mode, chunk=chunk, loss=lambda y, t: 0.5 * ((y - t) ** 2).sum())
        calls = 0
        for t in range(T):
            lr.step(x[t], tgt[t])
            if mode == "stream" or (t + 1) % chunk == 0 or t == T - 1:
                lr.update()
                calls += 1
                for n, p in named(model):
                    if p.grad is not None:
                        acc[n] += p.grad
                model.zero_grad()
        assert calls == (T if mode == "stream" else 3)
        for n in whole:
            assert rel(acc[n], whole[n]) < 1e-10, n


def test_backward_accumulates_like_autograd():
    model = deep_spiking_model()
    x, tgt = torch.rand(8, 2, 4), torch.randn(8, 2, 2)
    once = online_grads(model, x, tgt, mse_loss)
    model.zero_grad()
    lr = OnlineLearner(model)
    lr.backward(x, tgt, mse_loss)
    lr.backward(x, tgt, mse_loss)
    for n, p in named(model):
        assert rel(p.grad, 2 * once[n]) < 1e-12


def test_bad_input_errors():
    model = deep_spiking_model()
    with pytest.raises(ValueError, match="rule must be one of"):
        OnlineLearner(model, rule="eprop2")
    with pytest.raises(ValueError, match="mode must be one of"):
        OnlineLearner(model, mode="batch")
    with pytest.raises(ValueError, match="chunk >= 1"):
        OnlineLearner(model, mode="chunked")
    with pytest.raises(ValueError, match="OnlineLearner input x"):
        OnlineLearner(model).backward(torch.rand(5, 2, 3), None, mse_loss)
    with pytest.raises(TypeError, match="RecurrentStack"):
        OnlineLearner(torch.nn.Linear(2, 2))


class _DenseRNNCell(torch.nn.Module):
    """A dense recurrent cell without traces (stands in for a GRU)."""

    def __init__(self, H, N):
        super().__init__()
        from typing import NamedTuple

        class S(NamedTuple):
            h: torch.Tensor

        self.S, self.input_size, self.output_size = S, H, N
        self.w = torch.nn.Linear(H, N)
        self.u = torch.nn.Linear(N, N, bias=False)

    def initial_state(self, batch, device=None, dtype=None):
        return self.S(torch.zeros(batch, self.output_size, device=device, dtype=dtype))

    def step(self, x, s):
        h = torch.tanh(self.w(x) + self.u(s.h))
        return h, self.S(h)

    def forward(self, x, state=None):
        state = state or self.initial_state(x.shape[1], x.device, x.dtype)
        outs = []
        for t in range(x.shape[0]):
            o, state = self.step(x[t], state)
            outs.append(o)
        return torch.stack(outs), state

    def output(self, x, s):
        return s.h

    def state_vector(self, s):
        return s.h

    def stability_groups(self):
        return {"time": [self.u.weight], "depth": [self.w.weight]}


def test_cells_without_traces_learn_by_one_step_truncation_and_say_so():
    """Any cell of the cell protocol is accepted (issue: mixed stacks); cells without eligibility
    traces use 1-step truncation under every rule but bptt, and exactness() says so."""
    from spikerec.layers.gru import GRU

    gru_model = RecurrentStack([GRU(3, 5)], LeakyReadout(5, 2))
    how = dict((k, h) for _, k, h in OnlineLearner(gru_model, rule="full").exactness())
    assert "approximation" in how["GRU"] and "exact" in how["LeakyReadout"]
    model = RecurrentStack([_DenseRNNCell(3, 5)], LeakyReadout(5, 2))
    x, tgt = torch.randn(9, 2, 3), torch.randn(9, 2, 2)
    ref = bptt_grads(model, x, tgt, mse_loss, detach_state=True)
    # the readout is a traced layer: under full/snap1 it is exact BPTT, under trunc1 it is truncated too
    for rule in ("trunc1", "full", "snap1"):
        est = online_grads(model, x, tgt, mse_loss, rule=rule)
        for n in ("cells.0.w.weight", "cells.0.w.bias", "cells.0.u.weight"):
            assert rel(est[n], ref[n]) < 1e-10, (rule, n)
            assert ref[n].abs().sum() > 0
    est = online_grads(model, x, tgt, mse_loss, rule="trunc1")
    for n in ref:
        assert rel(est[n], ref[n]) < 1e-10, n
    # spatial: the recurrent weight gets a zero gradient (not None), the input weights keep theirs
    model.zero_grad()
    OnlineLearner(model, rule="spatial").backward(x, tgt, mse_loss)
    u = model.cells[0].u.weight
    assert u.grad is not None and float(u.grad.abs().max()) == 0.0
    assert rel(model.cells[0].w.weight.grad, ref["cells.0.w.weight"]) < 1e-10


def test_spatial_and_trunc1_set_zero_gradients_not_none():
    model = deep_spiking_model()
    x, tgt = torch.rand(6, 2, 4), torch.randn(6, 2, 2)
    for rule in ("spatial", "trunc1"):
        model.zero_grad(set_to_none=True)
        OnlineLearner(model, rule=rule).backward(x, tgt, mse_loss)
        for n, p in named(model):
            assert p.grad is not None, (rule, n)
        if rule == "spatial":
            assert float(model.cells[0].log_tau_mem.grad.abs().max()) == 0.0


def test_a_registered_kind_gives_the_learner_its_trace_and_exactness():
    """The registry decides a cell's online form: a subclass of LIF that no entry claims as
    itself is claimed by LIF's entry; registering a kind for it gives the learner that kind's
    trace and exactness text. The compiled paths are the trace class's own pieces (``errors``,
    ``row_kernel``, ``block_partials``, ``scan_block``): a trace that inherits LIF's rides them,
    one with only the reference pieces (``step``, ``partials``) is left to the reference (the
    autograd block, the torch steps); both give the LIF kind's gradient."""
    from spikerec.hardware.online import OnlineKind, online_kind, register_online_kind
    from spikerec.hardware.online import kinds as kinds_mod
    from spikerec.hardware.online.traces import LayerTrace
    from spikerec.hardware.online.traces_lif import LIFTrace

    from online_helpers import block_spy

    class MyLIF(LIF):
        pass

    class MyTrace(LIFTrace):
        pass

    class MyReferenceTrace(LayerTrace):
        """LIF's reference pieces only: no hand-written spatial backward, no compiled steps."""

        kind, input_params, k = LIFTrace.kind, LIFTrace.input_params, 1  # a plain LIF without lateral weights
        state_params, make_consts = LIFTrace.state_params, LIFTrace.make_consts
        step, partials = LIFTrace.step, LIFTrace.partials

    def stream(lr, x, tgt):
        lr.model.zero_grad()
        for t in range(x.shape[0]):
            lr.step(x[t], tgt[t])
        lr.update()
        return {n: p.grad.clone() for n, p in named(lr.model)}

    torch.manual_seed(9)
    cell = MyLIF(3, 4, surrogate=SURR, tau_mem=5.0, learn_threshold=True)
    with torch.no_grad():
        cell.weight.abs_().mul_(3.0)  # every neuron spikes
    model = RecurrentStack([cell], LeakyReadout(4, 2))
    x, tgt = torch.rand(12, 2, 3), torch.randn(12, 2, 2)
    step_loss = lambda y, t: ((y - t) ** 2).sum()  # noqa: E731
    assert online_kind(cell).tag == "lif"
    ref = stream(OnlineLearner(model, loss=step_loss, backend="reference"), x, tgt)
    assert all(g.abs().sum() > 0 for g in ref.values())
    saved = list(kinds_mod._KINDS)
    try:
        kinds_mod._KINDS.insert(0, OnlineKind("my_lif", MyLIF, MyTrace, "my exactness"))
        assert online_kind(cell).tag == "my_lif" and online_kind(LIF(3, 4)).tag == "lif"
        register_online_kind(OnlineKind("my_lif", MyLIF, MyTrace, "my own exactness"))
        assert sum(k.tag == "my_lif" for k in kinds_mod._KINDS) == 1  # the same tag is replaced
        lr = OnlineLearner(model, loss=step_loss)
        assert type(lr.tracers[0]) is MyTrace
        assert lr.exactness()[0][2] == "my own exactness"
        with block_spy() as calls:
            got = stream(lr, x, tgt)
        assert lr._compiled_block and lr._window.fast is not None  # LIF's compiled pieces, inherited
        assert calls == {"compiled": 1, "autograd": 0}
        for n in ref:
            assert rel(got[n], ref[n]) < 1e-10, n
        register_online_kind(OnlineKind("my_lif", MyLIF, MyReferenceTrace, "reference only"))
        lr = OnlineLearner(model, loss=step_loss)
        assert type(lr.tracers[0]) is MyReferenceTrace and lr.exactness()[0][2] == "reference only"
        with block_spy() as calls:
            got = stream(lr, x, tgt)
        assert not lr._compiled_block and lr._window.fast is None  # not covered: the reference pieces
        assert calls == {"compiled": 0, "autograd": 1}
        for n in ref:
            assert rel(got[n], ref[n]) < 1e-10, n
        with pytest.raises(ValueError, match="backend 'compiled' needs a stack of LIF, ALIF or LRU"):
            OnlineLearner(model, loss=step_loss, backend="compiled").step(x[0], tgt[0])
    finally:
        kinds_mod._KINDS[:] = saved
    assert online_kind(cell).tag == "lif"

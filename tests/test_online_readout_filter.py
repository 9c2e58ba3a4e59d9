"""Readout-filtered eligibility traces (``readout_filter=True``): the layer under a leaky readout
learns with the exact BPTT gradient (float64), per-output time constants included."""
import pytest
import torch

from spikerec.hardware.online import OnlineLearner, mse_loss, mse_step_loss
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.models import RecurrentStack

from online_helpers import (_fp64_one_thread, block_spy, bptt_grads, cos, counted, named, online_grads,  # noqa: F401
                            rel, torch_forms)

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}
CONFIGS = [
    ("lif", dict(reset="subtract", detach_reset=False, learn_threshold=True, tau_mem=5.0)),
    ("lif", dict(reset="zero", detach_reset=True, learn_threshold=True, tau_mem=5.0)),
    ("lif", dict(reset="subtract", tau_syn=3.0, tau_mem=5.0, detach_reset=False, learn_threshold=True)),
    ("alif", dict(recurrent=False, detach_reset=False, tau_mem=5.0, tau_adapt=10.0, b=0.5, beta=0.5)),
]


def leaky_model(kind, kw, H=4, N=6, tau=(6.0, 3.0)):
    cell = (LIF if kind == "lif" else ALIF)(H, N, surrogate=SURR, **kw)
    with torch.no_grad():
        cell.weight.mul_(3.0)
    return RecurrentStack([cell], LeakyReadout(N, len(tau), tau=torch.tensor(tau), learn_tau=True))


COMPILED = [CONFIGS[0], CONFIGS[1], CONFIGS[3], ("lru", {})]


def compiled_model(kind, kw):
    if kind == "lru":
        from spikerec.layers.lru import LRU

        return RecurrentStack([LRU(4, 6)], LeakyReadout(4, 2, tau=torch.tensor([5.0, 2.0]), learn_tau=True))
    return leaky_model(kind, kw)


@pytest.mark.parametrize("kind,kw", CONFIGS)
def test_layer_under_a_leaky_readout_equals_bptt(kind, kw):
    """Every parameter (weights, bias, time constants, threshold, ALIF's b and beta) equals BPTT;
    without the filter the hidden layer is biased (the test is not vacuous)."""
    torch.manual_seed(1)
    model = leaky_model(kind, kw)
    x, tgt = torch.rand(25, 3, 4), torch.randn(25, 3, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    est = online_grads(model, x, tgt, mse_loss, readout_filter=True)
    plain = online_grads(model, x, tgt, mse_loss, readout_filter=False)
    for n in ref:
        assert ref[n].abs().sum() > 0, f"{n}: vacuous test (zero gradient)"
        assert rel(est[n], ref[n]) < 1e-10, n
    assert rel(plain["cells.0.weight"], ref["cells.0.weight"]) > 0.1


@pytest.mark.parametrize("kind,kw", CONFIGS)
@pytest.mark.parametrize("mode,chunk", [("chunked", 4), ("parallel", None)])
def test_chunked_and_parallel_modes_equal_bptt(mode, chunk, kind, kw):
    """The block form: the readout's errors of the block's later steps through the reverse filter,
    the filtered traces carried across blocks (14 steps: a partial last block)."""
    torch.manual_seed(5)
    model = leaky_model(kind, kw)
    x, tgt = torch.rand(14, 3, 4), torch.randn(14, 3, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    est = online_grads(model, x, tgt, mse_loss, readout_filter=True, mode=mode, chunk=chunk)
    for n in ref:
        assert rel(est[n], ref[n]) < 1e-10, n


def some_steps_loss(y, target, t):
    """The MSE at the steps not divisible by 4 (steps without a loss inside the blocks)."""
    return None if t % 4 == 0 else mse_loss(y, target, t)


@pytest.mark.parametrize("mode,chunk", [("stream", None), ("chunked", 3)])
@pytest.mark.parametrize("kind,kw", CONFIGS + [("lru", {})])
def test_step_api_equals_bptt(kind, kw, mode, chunk):
    """``step`` one step at a time (steps without a target among them), every kind, both modes."""
    torch.manual_seed(6)
    model = compiled_model(kind, kw)
    x, t = torch.rand(11, 2, 4), torch.randn(11, 2, 2)
    ref = bptt_grads(model, x, t, some_steps_loss)
    model.zero_grad()
    learner = OnlineLearner(model, mode=mode, chunk=chunk, loss=mse_step_loss, readout_filter=True)
    for k in range(x.shape[0]):
        learner.step(x[k], None if k % 4 == 0 else t[k])
    learner.update()
    for n, p in named(model):
        assert rel(p.grad, ref[n]) < 1e-10, n


def test_step_api_and_reset_equal_bptt_of_each_sequence():
    """``step`` over two sequences with a (masked) reset between them: the sum of their BPTT
    gradients, so the filtered traces are cleared at the boundary."""
    torch.manual_seed(2)
    model = leaky_model(*CONFIGS[3], tau=(4.0, 4.0))
    xs, ts = [torch.rand(12, 2, 4) for _ in range(2)], [torch.randn(12, 2, 2) for _ in range(2)]
    refs = [bptt_grads(model, x, t, mse_loss) for x, t in zip(xs, ts)]
    model.zero_grad()
    learner = OnlineLearner(model, loss=mse_step_loss, readout_filter=True)
    for j, (x, t) in enumerate(zip(xs, ts)):
        for k in range(x.shape[0]):
            learner.step(x[k], t[k])
        learner.reset(torch.ones(2, dtype=torch.bool) if j == 0 else None)
    learner.update()
    for n, p in named(model):
        assert rel(p.grad, refs[0][n] + refs[1][n]) < 1e-10, n


@pytest.mark.parametrize("backend,mode,chunk", [("reference", "stream", None), ("compiled", "chunked", 3),
                                                ("compiled", "stream", None)])
def test_a_checkpoint_carries_the_filtered_traces(backend, mode, chunk):
    """A stream saved and restored mid-sequence into a fresh learner gives the uninterrupted gradient:
    the reference stream's checkpoint holds the filtered traces; the compiled window's holds the
    filtered traces of the blocks worked (chunked: 3 of the 5 steps) and the pending rows as they
    are (``window/...``; stream: all 5 steps wait in the window, no filtered trace yet)."""
    if backend == "compiled" and "compiled" not in OnlineLearner.supported_backends("cpu"):
        pytest.skip("numba is not installed")
    torch.manual_seed(4)
    model = leaky_model(*CONFIGS[0])
    x, t = torch.rand(10, 2, 4), torch.randn(10, 2, 2)
    ref = bptt_grads(model, x, t, mse_loss)
    model.zero_grad()

    def make():
        return OnlineLearner(model, loss=mse_step_loss, readout_filter=True, backend=backend, mode=mode, chunk=chunk)

    first = make()
    for k in range(5):
        first.step(x[k], t[k])
    tensors, meta = first.state_tensors()
    worked, pending = mode == "chunked" or backend == "reference", backend == "compiled"
    assert any(key.startswith("trace_filt/") for key in tensors) == worked
    assert any(key.startswith("window/") for key in tensors) == pending
    if pending:
        assert tensors["window/x"].shape[0] == (2 if mode == "chunked" else 5)
    second = make()
    second.load_state_tensors(tensors, meta)
    for k in range(5, 10):
        second.step(x[k], t[k])
    second.update()
    for n, p in named(model):
        assert rel(p.grad, ref[n]) < 1e-10, n


def test_lateral_weights_stay_an_approximation():
    """With lateral weights the neurons interact: the filter does not make the traces exact
    (e-prop), though the estimate stays aligned with BPTT."""
    torch.manual_seed(3)
    model = leaky_model("alif", dict(recurrent=True, tau_mem=5.0, tau_adapt=10.0, b=0.5, beta=0.5))
    with torch.no_grad():
        model.cells[0].recurrent_weight.mul_(2.0)
    x, tgt = torch.rand(20, 3, 4), torch.randn(20, 3, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    est = online_grads(model, x, tgt, mse_loss, readout_filter=True)
    assert rel(est["readout.weight"], ref["readout.weight"]) < 1e-10
    assert rel(est["cells.0.weight"], ref["cells.0.weight"]) > 1e-3
    assert cos(est["cells.0.weight"], ref["cells.0.weight"]) > 0.5


def test_readout_filter_refuses_what_it_does_not_cover():
    leaky = leaky_model(*CONFIGS[0])
    with pytest.raises(ValueError, match="rule 'full'"):
        OnlineLearner(leaky, readout_filter=True, rule="trunc1")
    with pytest.raises(ValueError, match="readout_filter must be None, True or False"):
        OnlineLearner(leaky, readout_filter="yes")
    linear = RecurrentStack([LIF(4, 6, surrogate=SURR)], LeakyReadout(6, 2))
    with pytest.raises(ValueError, match="leaky readout"):
        OnlineLearner(linear, readout_filter=True)
    from spikerec.layers.gru import GRU

    with pytest.raises(ValueError, match=r"a layer of a kind with readout-filtered traces \(.*LIF.*\) under the readout, got GRU"):
        OnlineLearner(RecurrentStack([GRU(4, 5)], LeakyReadout(5, 2, tau=5.0)), readout_filter=True)
    for kw in (dict(readout_filter=True), {}):  # on by default where it applies
        how = OnlineLearner(leaky, **kw).exactness()[0][2]
        assert "readout-filtered" in how and "biased" not in how
    assert "biased" in OnlineLearner(leaky, readout_filter=False).exactness()[0][2]
    # where it does not apply, the default leaves it off and says why the layer is biased
    dropped = RecurrentStack([LIF(4, 6, surrogate=SURR)], LeakyReadout(6, 2, tau=5.0), dropout=0.2)
    assert "readout-filtered" not in OnlineLearner(dropped).exactness()[0][2]


def test_in_a_deep_stack_the_top_layer_is_exact_and_lower_ones_stay_biased():
    from test_online_exact import deep_spiking_model

    torch.manual_seed(3)
    model = RecurrentStack(deep_spiking_model().cells, LeakyReadout(6, 2, tau=5.0, learn_tau=True))
    x, tgt = torch.rand(20, 3, 4), torch.randn(20, 3, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    est = online_grads(model, x, tgt, mse_loss, readout_filter=True)
    for n in ref:
        if not n.startswith("cells.0"):
            assert rel(est[n], ref[n]) < 1e-10, n
    assert rel(est["cells.0.weight"], ref["cells.0.weight"]) > 1e-3
    assert cos(est["cells.0.weight"], ref["cells.0.weight"]) > 0.5
    how = [h for _, _, h in OnlineLearner(model, readout_filter=True).exactness()]
    assert "biased" in how[0] and "readout-filtered" in how[1]


@pytest.mark.parametrize("mode,chunk", [("stream", None), ("chunked", 5)])
def test_lru_under_a_leaky_readout_equals_bptt(mode, chunk):
    """The LRU's output map is linear: its traces, state and input are filtered; every parameter
    (``nu``, ``theta``, ``gamma``, ``B``, ``C``, ``D``) equals BPTT, per-output taus included."""
    from spikerec.layers.lru import LRU

    torch.manual_seed(7)
    model = RecurrentStack([LRU(4, 6)], LeakyReadout(4, 2, tau=torch.tensor([5.0, 2.0]), learn_tau=True))
    x, tgt = torch.randn(16, 3, 4), torch.randn(16, 3, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    est = online_grads(model, x, tgt, mse_loss, readout_filter=True, mode=mode, chunk=chunk)
    plain = online_grads(model, x, tgt, mse_loss, mode=mode, chunk=chunk, readout_filter=False)
    for n in ref:
        assert ref[n].abs().sum() > 0, f"{n}: vacuous test (zero gradient)"
        assert rel(est[n], ref[n]) < 1e-10, n
    assert rel(plain["cells.0.B_re"], ref["cells.0.B_re"]) > 1e-3


@pytest.mark.parametrize("mode,chunk", [("stream", None), ("chunked", 4)])
@pytest.mark.parametrize("kind,kw", COMPILED)
def test_compiled_paths_carry_the_filtered_traces(kind, kw, mode, chunk, monkeypatch):
    """``backend="compiled"`` with the filter on by default: ``backward`` (stream: one block of the
    13 steps; chunked: 4 blocks with the filtered traces carried across them) and the step API (the
    window's compiled row kernels for every layer, worked as blocks at the chunk's end or at
    ``update``) run ``block.compiled_block``, never the autograd block, with the readout filter's
    block form; every parameter equals BPTT."""
    if "compiled" not in OnlineLearner.supported_backends("cpu"):
        pytest.skip("numba is not installed")
    from spikerec.hardware.online import readout_filter

    torch.manual_seed(11)
    model = compiled_model(kind, kw)
    x = torch.rand(13, 3, 4) if kind != "lru" else torch.randn(13, 3, 4)
    tgt = torch.randn(13, 3, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    filt_cls = readout_filter.LinearOutputFilter if kind == "lru" else readout_filter.ReadoutFilter
    filtered = counted(monkeypatch, filt_cls, "block")
    learner = OnlineLearner(model, mode=mode, chunk=chunk, backend="compiled")
    assert type(learner._filter) is filt_cls and learner._compiled_block
    model.zero_grad()
    with block_spy() as calls:
        learner.backward(x, tgt, mse_loss)
    blocks = 4 if mode == "chunked" else 1
    assert calls == {"compiled": blocks, "autograd": 0} and len(filtered) == blocks
    for n, p in named(model):
        assert ref[n].abs().sum() > 0, f"{n}: vacuous test (zero gradient)"
        assert rel(p.grad, ref[n]) < 1e-10, n
    filtered.clear()
    model.zero_grad()
    learner = OnlineLearner(model, mode=mode, chunk=chunk, backend="compiled", loss=mse_step_loss)
    with block_spy() as calls:
        for k in range(x.shape[0]):
            learner.step(x[k], tgt[k])
        assert learner._window.fast is not None  # every layer's compiled row kernel
        learner.update()
    assert calls == {"compiled": blocks, "autograd": 0} and len(filtered) == blocks
    for n, p in named(model):
        assert rel(p.grad, ref[n]) < 1e-10, ("step", n)


def test_compiled_step_api_equals_bptt():
    if "compiled" not in OnlineLearner.supported_backends("cpu"):
        pytest.skip("numba is not installed")
    torch.manual_seed(12)
    model = leaky_model(*CONFIGS[3])
    x, t = torch.rand(10, 2, 4), torch.randn(10, 2, 2)
    ref = bptt_grads(model, x, t, mse_loss)
    for mode, chunk in (("stream", None), ("chunked", 3)):
        model.zero_grad()
        learner = OnlineLearner(model, mode=mode, chunk=chunk, loss=mse_step_loss, backend="compiled")
        with block_spy() as calls:
            for k in range(x.shape[0]):
                learner.step(x[k], t[k])
            assert learner._window.fast is not None  # the compiled window: every layer's row kernel
            learner.update()
        assert calls == {"compiled": 4 if mode == "chunked" else 1, "autograd": 0}, mode
        for n, p in named(model):
            assert rel(p.grad, ref[n]) < 1e-10, (mode, n)


@pytest.mark.parametrize("torch_rows", [False, True])
@pytest.mark.parametrize("kind", ["lif", "alif", "lru"])
def test_compiled_paths_in_a_two_layer_stack(kind, torch_rows, monkeypatch):
    """The compiled backend with two hidden layers of different parameters (``backward`` in
    stream and chunked mode, and the step API's window): the top layer (under the readout) equals
    BPTT in every parameter, on the compiled paths as on the reference; the lower layer keeps its
    documented bias, the same on both. ``torch_rows``: the compiled pieces' torch forms (the
    window's torch steps, torch partials, ``lanes_torch``) instead of their numba passes (what a
    CUDA device runs, there with its Triton filter); the hand-written block runs either way."""
    if "compiled" not in OnlineLearner.supported_backends("cpu"):
        pytest.skip("numba is not installed")
    from spikerec.hardware.online import traces
    from spikerec.layers.lru import LRU

    lanes = counted(monkeypatch, traces, "block_lanes_numba")
    if torch_rows:
        torch_forms(monkeypatch)

    torch.manual_seed(21)
    if kind == "lru":
        cells = [LRU(4, 6), LRU(4, 6)]
    else:
        make = (lambda i, o, k: LIF(i, o, surrogate=SURR, tau_mem=4.0 + k, threshold=0.5 + 0.3 * k,
                                    learn_threshold=True)) if kind == "lif" else \
               (lambda i, o, k: ALIF(i, o, surrogate=SURR, recurrent=False, tau_mem=5.0, tau_adapt=8.0 + k,
                                     b=0.3 + 0.4 * k, beta=0.5 + 0.5 * k))
        cells = [make(4, 6, 0), make(6, 5, 1)]
        for c in cells:
            with torch.no_grad():
                c.weight.mul_(3.0)
    model = RecurrentStack(cells, LeakyReadout(cells[-1].output_size, 2, tau=torch.tensor([5.0, 2.0]), learn_tau=True))
    x = torch.rand(13, 3, 4) if kind != "lru" else torch.randn(13, 3, 4)
    tgt = torch.randn(13, 3, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    reference = online_grads(model, x, tgt, mse_loss, backend="reference")
    assert not lanes  # the reference: torch forms only

    def by_steps(mode, chunk):
        model.zero_grad()
        lr = OnlineLearner(model, loss=mse_step_loss, backend="compiled", mode=mode, chunk=chunk)
        for k in range(x.shape[0]):
            lr.step(x[k], tgt[k])
        assert (lr._window.fast is not None) == (not torch_rows)
        lr.update()
        out = {n: p.grad.clone() for n, p in named(model)}
        model.zero_grad()
        return out

    for mode, chunk in (("stream", None), ("chunked", 4)):
        with block_spy() as calls:
            est = online_grads(model, x, tgt, mse_loss, backend="compiled", mode=mode, chunk=chunk)
            steps = by_steps(mode, chunk)
        blocks = 4 if mode == "chunked" else 1
        assert calls == {"compiled": 2 * blocks, "autograd": 0}, mode
        for n in ref:
            assert rel(est[n], reference[n]) < 1e-10, (mode, n)
            assert rel(steps[n], reference[n]) < 1e-10, (mode, "step", n)
            if not n.startswith("cells.0"):
                assert ref[n].abs().sum() > 0, f"{n}: vacuous test (zero gradient)"
                assert rel(est[n], ref[n]) < 1e-10, (mode, n)
    assert bool(lanes) == (not torch_rows)  # numba's per-lane pass ran, or (torch_rows) never
    first = "cells.0.weight" if kind != "lru" else "cells.0.B_re"
    assert rel(reference[first], ref[first]) > 1e-3


def test_a_checkpoint_resumes_only_with_the_same_filter_setting():
    """A stream saved without the filtered traces cannot continue with them (their past is
    missing), nor the reverse: the error names the setting to pass."""
    torch.manual_seed(8)
    model = leaky_model(*CONFIGS[0])
    x, t = torch.rand(4, 2, 4), torch.randn(4, 2, 2)
    for saved_on in (False, True):
        first = OnlineLearner(model, loss=mse_step_loss, readout_filter=saved_on)
        for k in range(4):
            first.step(x[k], t[k])
        tensors, meta = first.state_tensors()
        with pytest.raises(ValueError, match=f"saved with readout_filter={saved_on}"):
            OnlineLearner(model, loss=mse_step_loss, readout_filter=not saved_on).load_state_tensors(tensors, meta)
        OnlineLearner(model, loss=mse_step_loss, readout_filter=saved_on).load_state_tensors(tensors, meta)

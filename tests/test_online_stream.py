"""The streaming interface of the online learner: step-by-step == backward == BPTT (float64),
per-sample resets, update policies, bad input, checkpoint and bit-identical resume in a new
process, the learner with its compiled CPU pieces (numba) against the same without them."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from spikerec.hardware.online import OnlineLearner, load_stream, mse_loss, save_stream
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.layers.lru import LRU
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread, bptt_grads, named, online_grads, rel  # noqa: F401

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}


def step_loss(y, tgt):
    return 0.5 * ((y - tgt) ** 2).sum()


def one_layer(kind, H=4, N=6, K=2):
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    if kind == "lru":
        cell = LRU(H, N)
        return RecurrentStack([cell], LeakyReadout(cell.output_size, K, tau=None))
    kw = {} if kind == "lif" else dict(recurrent=False, tau_adapt=10.0, b=0.5, beta=0.5)
    cell = (LIF if kind == "lif" else ALIF)(H, N, surrogate=SURR, tau_mem=5.0, **kw)
    with torch.no_grad():
        cell.weight.mul_(3.0)
    return RecurrentStack([cell], LeakyReadout(N, K))


def stream_grads(model, x, tgt, resets=(), **kw):
    """Feed ``x`` step by step; ``resets``: (t, mask) pairs applied before step t."""
    model.zero_grad()
    lr = OnlineLearner(model, loss=step_loss, **kw)
    rs = dict(resets)
    for t in range(x.shape[0]):
        if t in rs:
            lr.reset(rs[t])
        lr.step(x[t], tgt[t])
    lr.update()
    out = {n: p.grad.clone() for n, p in named(model)}
    model.zero_grad()
    return out


@pytest.mark.parametrize("kind", ["lru", "lif", "alif"])
def test_step_by_step_equals_backward_equals_bptt(kind):
    T, B = int(torch.randint(10, 20, ())), 3
    model = one_layer(kind)
    x, tgt = torch.randn(T, B, 4) if kind == "lru" else torch.rand(T, B, 4), torch.randn(T, B, 2)
    ref = bptt_grads(model, x, tgt, mse_loss)
    whole = online_grads(model, x, tgt, mse_loss)
    for mode, chunk in (("stream", None), ("chunked", 4)):
        st = stream_grads(model, x, tgt, mode=mode, chunk=chunk)
        for n in ref:
            assert ref[n].abs().sum() > 0, n
            assert rel(st[n], ref[n]) < 1e-10, (mode, n)
            assert rel(st[n], whole[n]) < 1e-12, (mode, n)


def segment_bptt(model, x, tgt, bounds):
    """BPTT where every sample's stream restarts at its own reset times: run per segment."""
    B = x.shape[1]
    total = {n: torch.zeros_like(p) for n, p in named(model)}
    for b in range(B):
        cuts = [0] + sorted(t for t, m in bounds if bool(m[b])) + [x.shape[0]]
        for t0, t1 in zip(cuts[:-1], cuts[1:]):
            if t1 > t0:
                g = bptt_grads(model, x[t0:t1, b:b + 1], tgt[t0:t1, b:b + 1], mse_loss)
                for n in total:
                    total[n] += g[n]
    return total


@pytest.mark.parametrize("kind", ["lru", "alif"])
def test_reset_of_some_samples_mid_stream_equals_bptt_per_segment(kind):
    T, B = 16, 3
    model = one_layer(kind)
    x, tgt = torch.randn(T, B, 4) if kind == "lru" else torch.rand(T, B, 4), torch.randn(T, B, 2)
    resets = [(5, torch.tensor([True, False, False])), (9, torch.tensor([False, True, True])),
              (12, torch.tensor([True, False, True]))]
    ref = segment_bptt(model, x, tgt, resets)
    for mode, chunk in (("stream", None), ("chunked", 3)):
        est = stream_grads(model, x, tgt, resets, mode=mode, chunk=chunk)
        for n in ref:
            assert rel(est[n], ref[n]) < 1e-10, (mode, n)


def test_update_every_k_steps_the_optimizer_and_policies():
    T, B = 12, 2
    model = one_layer("lru")
    x, tgt = torch.randn(T, B, 4), torch.randn(T, B, 2)
    calls = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            calls.append([p.grad.clone() for p in self.param_groups[0]["params"]])
            return super().step(closure)

    opt = Spy(model.parameters(), lr=0.0)  # lr 0: parameters fixed, so the pieces add up to the whole
    lr = OnlineLearner(model, loss=step_loss, optimizer=opt, update_every=5)
    for t in range(T):
        lr.step(x[t], tgt[t])
    assert len(calls) == 2  # after steps 5 and 10
    lr.update()
    assert len(calls) == 3
    whole = online_grads(model, x, tgt, mse_loss)
    for j, (n, p) in enumerate(named(model)):
        acc = sum(c[j] for c in calls)
        assert rel(acc, whole[n]) < 1e-10, n
    # "sequence": one update per reset
    calls.clear()
    lr = OnlineLearner(model, loss=step_loss, optimizer=opt, update_every="sequence")
    for t in range(T):
        lr.step(x[t], tgt[t])
    lr.reset()
    assert len(calls) == 1
    with pytest.raises(ValueError, match="update_every"):
        OnlineLearner(model, update_every=0)


def test_truncate_cuts_the_past_and_discard_drops_the_estimate():
    T, B = 10, 2
    model = one_layer("lru")
    x, tgt = torch.randn(T, B, 4), torch.randn(T, B, 2)
    lr = OnlineLearner(model, loss=step_loss)
    for t in range(T):
        if t == 6:
            lr.truncate()
        lr.step(x[t], tgt[t])
    model.zero_grad()
    lr.update()
    got = {n: p.grad.clone() for n, p in named(model)}
    # reference: autograd with the state detached once, before step 6
    states = model.initial_state(B)
    total = 0.0
    for t in range(T):
        if t == 6:
            states = tuple(type(s)(*(v.detach() for v in s)) for s in states)
        y, states = model.step(x[t], states)
        total = total + mse_loss(y, tgt, t)
    ps = named(model)
    ref = dict(zip([n for n, _ in ps], torch.autograd.grad(total, [p for _, p in ps])))
    for n in ref:
        assert rel(got[n], ref[n]) < 1e-10, n
    lr.step(x[0], tgt[0])
    lr.discard()
    model.zero_grad()
    lr.update()
    assert all(float(p.grad.abs().max()) == 0.0 for _, p in named(model))


def test_bad_streaming_input_errors():
    model = one_layer("lru")
    lr = OnlineLearner(model, loss=step_loss)
    with pytest.raises(ValueError, match=r"x_t: expected shape \[B, 4\]"):
        lr.step(torch.randn(2, 5))
    lr.step(torch.randn(3, 4), torch.randn(3, 2))
    with pytest.raises(ValueError, match="batch size 2, but the stream runs with batch 3"):
        lr.step(torch.randn(2, 4))
    bad = torch.randn(3, 4)
    bad[1, 2] = float("nan")
    assert lr._window.fast is not None  # the compiled window (every layer compiled) checks x_t itself
    before = [f.clone() for s in lr.states for f in s]
    with pytest.raises(ValueError, match=r"step 1\) x_t: contains NaN"):
        lr.step(bad)
    assert all(torch.equal(a, b) for a, b in zip(before, [f for s in lr.states for f in s]))  # state untouched
    with pytest.raises(ValueError, match=r"target_t: expected shape \[3, 2\]"):
        lr.step(torch.randn(3, 4), torch.randn(3, 7))
    with pytest.raises(ValueError, match="batch-first target with 3 samples"):
        lr.step(torch.randn(3, 4), torch.randn(2, 2))
    with pytest.raises(ValueError, match=r"batch_mask must have shape \[3\]"):
        lr.reset(torch.tensor([True, False]))
    with pytest.raises(ValueError, match="batch_mask must be a bool"):
        lr.reset(torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="has no loss"):
        OnlineLearner(model).step(torch.randn(3, 4), torch.randn(3, 2))
    with pytest.raises(ValueError, match="needs the whole sequence"):
        OnlineLearner(model, rule="bptt").step(torch.randn(3, 4))
    # backward: NaN at one step is named, no whole-sequence temporary needed
    x = torch.randn(6, 2, 4)
    x[4, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"step 4\): contains NaN"):
        OnlineLearner(model).backward(x, torch.randn(6, 2, 2), mse_loss)
    x[4, 0, 0] = 0.0  # chunked: one check per block, the first bad step named
    x[5, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"step 5\): contains NaN"):
        OnlineLearner(model, mode="chunked", chunk=4).backward(x, torch.randn(6, 2, 2), mse_loss)


def test_input_dtypes_and_class_labels_are_checked_before_the_step():
    """Boolean spikes are cast to the parameters' dtype (as the model's forward does); a floating
    input of another precision and class labels outside the readout are errors naming the step,
    raised before any state changes, and the stream continues as a clean one."""
    from spikerec.hardware.online.learner import cross_entropy_step_loss

    model = one_layer("alif")
    x = (torch.rand(6, 3, 4) < 0.4)
    labels = torch.tensor([0, 1, 1])

    def run(bad):
        lr = OnlineLearner(model, loss=cross_entropy_step_loss())
        ys = []
        for t in range(6):
            if bad and t == 3:
                before = [f.clone() for s in lr.states for f in s]
                with pytest.raises(ValueError, match=r"step 3\) x_t: dtype torch.float32 but the model's parameters"):
                    lr.step(x[t].float(), labels)
                with pytest.raises(ValueError, match=r"step 3\) target_t: class labels must lie in \[0, 1\]"):
                    lr.step(x[t], torch.tensor([0, 2, 1]))
                assert all(torch.equal(a, b) for a, b in zip(before, [f for s in lr.states for f in s]))
            ys.append(lr.step(x[t], labels).output)  # bool spikes
        return torch.stack(ys)

    assert torch.equal(run(False), run(True))
    with pytest.raises(ValueError, match="OnlineLearner input x: dtype torch.float32"):
        OnlineLearner(model).backward(x.float(), torch.randn(6, 3, 2), mse_loss)


@pytest.mark.parametrize("kw", [{}, {"mode": "chunked", "chunk": 4}, {"backend": "reference"}])
def test_update_then_the_callers_optimiser_equals_the_learners_own(kw):
    """learner.update(); opt.step() with the caller's optimiser: the next step sees the new
    parameters (the learner compares their versions), as with OnlineLearner(optimizer=opt)."""
    g = torch.Generator().manual_seed(3)
    xs, ts = torch.randn(13, 3, 4, generator=g), torch.randn(13, 3, 2, generator=g)
    outs, params = [], []
    for own in (True, False):
        torch.manual_seed(0)
        lru = LRU(4, 6)
        model = RecurrentStack([lru, ALIF(lru.output_size, 5)], LeakyReadout(5, 2))
        init = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        lr = OnlineLearner(model, loss=step_loss, optimizer=opt if own else None, update_every=4 if own else None,
                           **kw)
        ys = []
        for t in range(13):
            ys.append(lr.step(xs[t], ts[t]).output)
            if not own and (t + 1) % 4 == 0:
                lr.update()
                opt.step()
                opt.zero_grad()
        outs.append(torch.stack(ys))
        params.append([p.detach().clone() for p in model.parameters()])
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*params))
    assert not all(torch.equal(a, b) for a, b in zip(init, params[1]))  # the optimiser did step


def test_exactness_names_the_layers_biased_by_the_layers_above():
    from spikerec.layers.gru import GRU

    two = RecurrentStack([LRU(4, 6), LRU(4, 6)], LeakyReadout(4, 2))
    how = [h for _, _, h in OnlineLearner(two).exactness()]
    assert "biased" in how[0] and "biased" not in how[1] and how[2] == "stateless (exact)"
    leaky = RecurrentStack([LRU(4, 6)], LeakyReadout(4, 2, tau=3.0))
    how = [h for _, _, h in OnlineLearner(leaky, readout_filter=False).exactness()]
    assert "biased" in how[0] and "biased" not in how[1]
    how = [h for _, _, h in OnlineLearner(leaky).exactness()]  # the readout-filtered traces, by default
    assert "biased" not in how[0] and "readout-filtered" in how[0]
    gru = RecurrentStack([GRU(4, 5)], LeakyReadout(5, 2))
    assert OnlineLearner(gru, rule="spatial").exactness()[0][2] == "spatial only (recurrent paths cut)"
    x, tgt = torch.randn(7, 3, 4), torch.randn(7, 3, 2)
    gru.zero_grad()
    OnlineLearner(gru, rule="spatial").backward(x, tgt, mse_loss)
    c = gru.cells[0].rnn
    assert float(c.bias_ih_l0.grad.abs().sum()) > 0 and float(c.weight_ih_l0.grad.abs().sum()) > 0  # input parameters
    assert float(c.weight_hh_l0.grad.abs().max()) == 0 and float(c.bias_hh_l0.grad.abs().max()) == 0


RESUME = textwrap.dedent(
    """
    import sys, torch
    from spikerec.hardware.online import OnlineLearner, load_stream, save_stream
    from spikerec.layers import ALIF, LeakyReadout
    from spikerec.layers.lru import LRU
    from spikerec.models import RecurrentStack


    def build():
        torch.manual_seed(0)
        lru = LRU(4, 6)
        m = RecurrentStack([lru, ALIF(lru.output_size, 5, recurrent=False)], LeakyReadout(5, 2), dropout={dropout!r})
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        lr = OnlineLearner(m, mode={mode!r}, chunk={chunk!r}, optimizer=opt, update_every={every!r},
                           loss=lambda y, t: 0.5 * ((y - t) ** 2).sum())
        return m, lr


    def main(start, stop, ck, out=None):
        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(5)
        xs, ts = torch.randn(20, 3, 4, generator=g), torch.randn(20, 3, 2, generator=g)
        mask = torch.tensor([True, False, True])
        m, lr = build()
        if start > 0:
            load_stream(ck, lr)
        for t in range(start, stop):
            if t == 8:
                lr.reset(mask)
            y, l = lr.step(xs[t], ts[t])
        if stop < 20:
            save_stream(ck, lr)
        else:
            torch.save({{k: v for k, v in m.state_dict().items()}}, out)


    if __name__ == "__main__":
        main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    """
)


@pytest.mark.parametrize("mode,chunk", [("stream", None), ("chunked", 4)])
def test_checkpoint_mid_stream_resumes_bit_identically_in_a_new_process(tmp_path, mode, chunk):
    """Adam, a per-sample reset, an update policy, dropout (stream) or a half-filled block
    (chunked): stop at step 11, restore in a new process, continue; the final weights equal an
    uninterrupted run's bit for bit. The uninterrupted run and the run up to the checkpoint are
    done in this process; only the resume needs a new one."""
    script = tmp_path / "run.py"
    dropout = 0.1 if mode == "stream" else 0.0  # active dropout makes chunked step() go step by step
    text = RESUME.format(mode=mode, chunk=chunk, dropout=dropout, every=3 if mode == "stream" else 7)
    script.write_text(text)
    here = {"__name__": "resume_script"}
    exec(compile(text, str(script), "exec"), here)
    ck, a, b = tmp_path / "ck.safetensors", tmp_path / "a.pt", tmp_path / "b.pt"
    here["main"](0, 20, str(ck), str(a))
    here["main"](0, 11, str(ck))
    from safetensors.torch import load_file

    pending = load_file(str(ck))
    # chunked: steps 8-10 wait in the window (the reset before step 8 worked the block before it),
    # stored as they are; stream with active dropout: the reference stream, nothing pending
    assert ("learner/window/x" in pending) == (mode == "chunked")
    if mode == "chunked":
        xs = torch.randn(20, 3, 4, generator=torch.Generator().manual_seed(5))  # the script's inputs
        assert torch.equal(pending["learner/window/x"], xs[8:11])
    r = subprocess.run([sys.executable, str(script), "11", "20", str(ck), str(b)], env=dict(os.environ),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    wa = torch.load(a, weights_only=True)
    wb = torch.load(b, weights_only=True)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    here["main"](0, 1, str(ck))  # a checkpoint after one step only has the initial weights
    w0 = {k[6:]: v for k, v in load_file(str(ck)).items() if k.startswith("model/")}
    assert max(float((wa[k] - w0[k]).abs().max()) for k in w0) > 1e-4


def test_load_stream_errors(tmp_path):
    model = one_layer("lru")
    lr = OnlineLearner(model, loss=step_loss)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_stream(tmp_path / "none.safetensors", lr)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a file")
    with pytest.raises(ValueError, match="not a safetensors file"):
        load_stream(bad, lr)
    lr.step(torch.randn(2, 4), torch.randn(2, 2))
    save_stream(tmp_path / "ok.safetensors", lr)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # every mismatch is found before the model (or an optimiser) is overwritten
    with pytest.raises(ValueError, match="written by a learner with mode 'stream', this learner has 'chunked'"):
        load_stream(tmp_path / "ok.safetensors", OnlineLearner(model, mode="chunked", chunk=2))
    with pytest.raises(ValueError, match="no optimiser state"):
        load_stream(tmp_path / "ok.safetensors", OnlineLearner(model, optimizer=torch.optim.SGD(model.parameters(), 0.1)))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="model tensors of another shape"):
        load_stream(tmp_path / "ok.safetensors", OnlineLearner(RecurrentStack([LRU(4, 9)], LeakyReadout(4, 2))))


def test_an_old_format_checkpoint_is_refused_before_anything_is_overwritten(tmp_path):
    """The per-neuron traces are one tensor per layer (``trace_vec/<layer>``, rows named by
    ``meta["trace_names"]``); a checkpoint of the earlier format (one ``trace_vec/<layer>/<name>``
    per trace, no ``trace_names``) is refused with a message, and, as every other mismatch, before
    the model is overwritten."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    model = one_layer("alif")
    lr = OnlineLearner(model, loss=step_loss)
    for t in range(3):
        lr.step(torch.rand(2, 4), torch.randn(2, 2))
    names = lr.traces[0].names  # (reading the traces works the window)
    assert names and lr._window.j == 0
    save_stream(tmp_path / "ok.safetensors", lr)
    tensors = load_file(str(tmp_path / "ok.safetensors"))
    with safe_open(str(tmp_path / "ok.safetensors"), framework="pt") as f:
        meta = json.loads(f.metadata()["spikerec"])
    assert meta["learner"]["trace_names"][0] == list(names)
    ev = tensors.pop("learner/trace_vec/0")
    assert ev.shape[0] == len(names) and not any(k.startswith("learner/trace_vec/0/") for k in tensors)
    # the earlier format: one [B, N, k] tensor per trace
    for n, v in zip(meta["learner"].pop("trace_names")[0], ev.unbind(0)):
        tensors[f"learner/trace_vec/0/{n}"] = v.transpose(-1, -2).contiguous()
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata={"spikerec": json.dumps(meta)})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="written by an earlier version"):
        load_stream(tmp_path / "old.safetensors", OnlineLearner(model, loss=step_loss))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    load_stream(tmp_path / "ok.safetensors", OnlineLearner(model, loss=step_loss))  # the current format loads


def _hide_numba(monkeypatch):
    """The learner as on an install without numba: :func:`spikerec.kernels.trace_numba.compiled_cpu`
    (which the window, the kinds' ``block_partials``/``scan_block``, the spatial backward's surrogate
    and the per-lane pass ask) and ``numba_available`` read the module's ``_HAVE_NUMBA``."""
    from spikerec.kernels import trace_numba

    monkeypatch.setattr(trace_numba, "_HAVE_NUMBA", False)


@pytest.mark.parametrize("kind", ["alif", "lif", "lru"])
def test_learner_with_and_without_numba_agree(kind, monkeypatch):
    """The compiled pieces (the window's row kernels, the block partials and scans, the per-lane
    pass) and their torch forms give the same gradient, by ``backward`` and by the step API; the
    spies show that numba ran in the first learner and not in the second."""
    pytest.importorskip("numba")
    from spikerec.hardware.online import traces
    from spikerec.hardware.online.learner import mse_step_loss

    T, B = 12, 3
    model = one_layer(kind)
    x, tgt = torch.rand(T, B, 4) if kind != "lru" else torch.randn(T, B, 4), torch.randn(T, B, 2)
    lanes = []
    real = traces.block_lanes_numba
    monkeypatch.setattr(traces, "block_lanes_numba", lambda *a: lanes.append(1) or real(*a))

    def both():
        whole = online_grads(model, x, tgt, mse_loss)
        model.zero_grad()
        lr = OnlineLearner(model, loss=mse_step_loss, mode="chunked", chunk=5)
        for t in range(T):
            lr.step(x[t], tgt[t])
        lr.update()
        steps = {n: p.grad.clone() for n, p in named(model)}
        model.zero_grad()
        return whole, steps, lr._window.fast is not None

    b_whole, b_steps, b_fast = both()
    assert b_fast and lanes  # the compiled window and the compiled per-lane pass ran
    lanes.clear()
    _hide_numba(monkeypatch)
    assert OnlineLearner.supported_backends("cpu") == ("reference",)
    a_whole, a_steps, a_fast = both()
    assert not a_fast and not lanes  # the torch steps and lanes_torch
    for n in a_whole:
        assert a_whole[n].abs().sum() > 0, n
        assert rel(b_whole[n], a_whole[n]) < 1e-12, n
        assert rel(b_steps[n], a_steps[n]) < 1e-12, n
        assert rel(a_steps[n], a_whole[n]) < 1e-12, n

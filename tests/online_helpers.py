"""Shared oracles of the online-learning tests: autograd BPTT through ``model.step`` and the
online learner's gradients, as ``{name: grad}`` dicts, plus the comparison measures."""
import contextlib

import pytest
import torch

from spikerec.hardware.online import OnlineLearner


@pytest.fixture(autouse=True)
def _fp64_one_thread():
    """float64 for the exactness claims; one intra-op thread (these are many tiny ops, and on a
    shared 2-core machine spinning OpenMP workers make them ~10x slower)."""
    old, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(old)
    torch.set_num_threads(threads)


def named(model):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def bptt_grads(model, x, target, loss_fn, detach_state=False):
    """Autograd through the model's ``step`` loop; ``detach_state`` cuts every recurrent edge
    (the 1-step truncation oracle). A ``None`` loss at a step contributes nothing."""
    states = model.initial_state(x.shape[1], x.device, x.dtype)
    total = 0.0
    for t in range(x.shape[0]):
        if detach_state:
            states = tuple(type(s)(*(v.detach() for v in s)) for s in states)
        y, states = model.step(x[t], states)
        l = loss_fn(y, target, t)
        if l is not None:
            total = total + l
    ps = named(model)
    gs = torch.autograd.grad(total, [p for _, p in ps], allow_unused=True)
    return {n: (g if g is not None else torch.zeros_like(p)) for (n, p), g in zip(ps, gs)}


def online_grads(model, x, target, loss_fn, **kw):
    model.zero_grad()
    OnlineLearner(model, **kw).backward(x, target, loss_fn)
    out = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in named(model)}
    model.zero_grad()
    return out


def rel(a, b):
    return float((a - b).norm() / (b.norm() + 1e-300))


def cos(a, b):
    return float((a * b).sum() / (a.norm() * b.norm()))


def step_stream(lr, x, tgt, resets=(), period=4):
    """Feed ``x [T, B, C]`` to ``lr.step`` one step at a time, with ``lr.reset(mask)`` before the
    steps in ``resets`` (``[(t, mask)]``) and no target at the steps ``t % period == 3`` (steps
    without a loss); returns the stacked outputs and losses (0 where there was none)."""
    ys, ls = [], []
    rs = dict(resets)
    for t in range(x.shape[0]):
        if t in rs:
            lr.reset(rs[t])
        y, l = lr.step(x[t], None if t % period == 3 else tgt[t])
        ys.append(y)
        ls.append(torch.zeros(()) if l is None else l)
    return torch.stack(ys), torch.stack(ls)


def traces_of(lr):
    """The learner's traces (``vec`` and ``mat``) by ``layer/name``, copied."""
    return {f"{i}/{n}": v.clone() for i, ts in enumerate(lr.traces) for d in (ts.vec, ts.mat) for n, v in d.items()}


@contextlib.contextmanager
def block_spy():
    """Count the blocks worked by :func:`spikerec.hardware.online.block.compiled_block` (the
    hand-written spatial backward) and by ``autograd_block`` (the reference block) while inside:
    yields ``{"compiled": n, "autograd": n}``. The window and the learner import both functions by
    name, so both modules' names are wrapped (and put back on exit)."""
    from spikerec.hardware.online import learner, window

    calls = {"compiled": 0, "autograd": 0}
    saved = [(m, n, getattr(m, n)) for m in (window, learner) for n in ("compiled_block", "autograd_block")]

    def spy(key, fn):
        def counted(*a, **kw):
            calls[key] += 1
            return fn(*a, **kw)
        return counted

    try:
        for m, n, fn in saved:
            setattr(m, n, spy(n.split("_")[0], fn))
        yield calls
    finally:
        for m, n, fn in saved:
            setattr(m, n, fn)


def counted(monkeypatch, owner, attr):
    """Wrap ``owner.attr`` (a function a module or class holds) so that its calls are counted:
    returns a list that grows by one per call (the call itself runs as before)."""
    calls, real = [], getattr(owner, attr)

    def wrapped(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(owner, attr, wrapped)
    return calls


def torch_forms(monkeypatch):
    """The online learner's compiled pieces in their torch forms, as on a device numba does not
    serve (a CUDA device, without its Triton filter): ``compiled_cpu`` answers ``False`` where the
    window (row kernels), the kinds (``block_partials``, ``scan_block``) and the block engine (the
    per-lane pass, the surrogate of ``spike_grad``) ask it; the backend stays ``compiled`` (the
    hand-written spatial backward ``block.compiled_block`` still runs)."""
    import sys

    import spikerec.hardware.online  # noqa: F401 (every module of the package imported)

    askers = [m for name, m in list(sys.modules.items())
              if name.startswith("spikerec.hardware.online.") and hasattr(m, "compiled_cpu")]
    assert {m.__name__.rsplit(".", 1)[1] for m in askers} >= {"window", "traces", "traces_lif", "traces_alif",
                                                               "traces_lru"}
    for m in askers:
        monkeypatch.setattr(m, "compiled_cpu", lambda *t: False)

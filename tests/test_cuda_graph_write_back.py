"""The CUDA-graph stream step's write-back (:mod:`spikerec.hardware.online.cuda_graph`), checked
on the CPU: a step followed by the write-back leaves the learner pointing at its old tensors,
holding exactly what the eager step computed. (The capture and replay themselves need a GPU:
tests/test_cuda.py.)"""
import pytest
import torch

from spikerec.hardware.online import OnlineLearner, mse_step_loss
from spikerec.hardware.online.cuda_graph import _NotCapturable, _Snapshot
from spikerec.hardware.online.spatial import compiled_stream_step
from spikerec.layers import ALIF, LIF, LRU, LeakyReadout
from spikerec.models import RecurrentStack


def _model():
    lru = LRU(3, 6)
    cells = [lru, ALIF(lru.output_size, 5, tau_mem=5.0, tau_adapt=10.0, b=0.3, beta=0.5), LIF(5, 4, tau_mem=5.0)]
    return RecurrentStack(cells, LeakyReadout(4, 2)).double()


@pytest.fixture(autouse=True)
def _torch_trace_steps(monkeypatch):
    """The compiled stream step with the torch trace steps (no numba, no whole-stack step): the
    path a CUDA device takes, on the CPU."""
    from spikerec.hardware.online import learner as learner_mod

    monkeypatch.setattr(learner_mod, "matrix_trace_kernel", lambda device: None)
    monkeypatch.setattr(learner_mod, "whole_stack_supported", lambda *a: False)


def _learner(model):
    return OnlineLearner(model, loss=mse_step_loss)


def _tensors(lr):
    return ([t for s in lr.states for t in s], [t for ts in lr.traces for d in (ts.vec, ts.mat, ts.G) for t in d.values()],
            list(lr.spatial.values()))


def test_write_back_keeps_the_old_tensors_with_the_eager_values():
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    model = _model()
    T, B = 12, 3
    x = torch.rand(T, B, 3, dtype=torch.float64, generator=g) * 3
    tgt = torch.randn(T, B, 2, dtype=torch.float64, generator=g)
    eager, graphed = _learner(model), _learner(model)
    vg = mse_step_loss.value_and_grad
    for t in range(T):
        ya = eager.step(x[t], tgt[t]).output
        if t < 3:  # the traces and accumulators come into being in the first steps
            yb = graphed.step(x[t], tgt[t]).output
        else:
            before = _tensors(graphed)
            snap = _Snapshot(graphed)
            yb, _ = compiled_stream_step(graphed, x[t], lambda y, tt=tgt[t]: mse_step_loss(y, tt),
                                     lambda y, tt=tgt[t]: vg(y, tt))
            snap.write_back(graphed)
            after = _tensors(graphed)
            assert all(a is b for part_a, part_b in zip(before, after) for a, b in zip(part_a, part_b)), \
                "the learner points at the tensors it had before the step"
            graphed.steps += 1
        assert torch.equal(ya, yb)
        for part_a, part_b in zip(_tensors(eager), _tensors(graphed)):
            assert all(torch.equal(a, b) for a, b in zip(part_a, part_b))


def test_write_back_refuses_a_step_that_creates_an_accumulator():
    model = _model()
    lr = _learner(model)
    x, tgt = torch.rand(2, 3, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)
    lr.step(x, None)  # no loss yet: no accumulators
    snap = _Snapshot(lr)
    compiled_stream_step(lr, x, lambda y: mse_step_loss(y, tgt), lambda y: mse_step_loss.value_and_grad(y, tgt))
    with pytest.raises(_NotCapturable):
        snap.write_back(lr)
    snap.restore(lr)
    assert not lr.spatial and all(not ts.G for ts in lr.traces)

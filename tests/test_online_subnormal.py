"""The online learner's steps run with subnormal floats flushed to zero (:mod:`spikerec.hardware.
online.subnormal`): traces that decay below the smallest normal float become zero instead of
subnormal, and the caller's own setting is restored after every call."""
import pytest
import torch

from spikerec.hardware.online import OnlineLearner, mse_loss
from spikerec.hardware.online.learner import mse_step_loss
from spikerec.hardware.online.subnormal import flush_subnormals, flushing_subnormals
from spikerec.layers import ALIF, LeakyReadout
from spikerec.models import RecurrentStack


@pytest.fixture
def supported():
    """Skip where the CPU has no flush-to-zero mode; leave the thread as it was found (off)."""
    assert not flushing_subnormals(), "the test process started with subnormals flushed"
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(False)


def _stack(H=4, N=6):
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    # a short membrane time constant: a silent input's trace falls by exp(-1 / 0.5) per step
    cells = [ALIF(H, N, tau_mem=0.5, tau_adapt=20.0), ALIF(N, N, tau_mem=0.5, tau_adapt=20.0)]
    return RecurrentStack(cells, LeakyReadout(N, 3)).float()


def _subnormal_entries(learner) -> int:
    tiny = torch.finfo(torch.float32).tiny
    n = 0
    for ts in learner.traces:
        for v in list(ts.mat.values()) + list(ts.vec.values()):
            n += int(((v != 0) & (v.abs() < tiny)).sum())
    return n


def test_context_sets_and_restores_the_callers_setting(supported):
    with flush_subnormals():
        assert flushing_subnormals()
        with flush_subnormals():  # nested: a no-op
            assert flushing_subnormals()
        assert flushing_subnormals()
    assert not flushing_subnormals()
    torch.set_flush_denormal(True)  # a caller that flushes already keeps it
    with flush_subnormals():
        assert flushing_subnormals()
    assert flushing_subnormals()


@pytest.mark.parametrize("mode", ["stream", "chunked"])
def test_learner_calls_restore_the_callers_setting(supported, mode):
    model = _stack()
    x = (torch.rand(12, 2, 4) < 0.3).float()
    tgt = torch.randn(12, 2, 3)
    for caller in (False, True):
        torch.set_flush_denormal(caller)
        lr = OnlineLearner(model, mode=mode, chunk=4 if mode == "chunked" else None, loss=mse_step_loss)
        for t in range(x.shape[0]):
            lr.step(x[t], tgt[t])
            assert flushing_subnormals() == caller
        lr.update()
        lr.backward(x, tgt, mse_loss)
        assert flushing_subnormals() == caller
        torch.set_flush_denormal(False)


def test_decayed_traces_are_zero_not_subnormal(supported):
    """Inputs that spike early and then stay silent: their matrix-trace entries fall by about
    ``exp(-2)`` per step and pass through the subnormal range (below 1.2e-38) some 45 steps
    later. With the flush no trace entry is ever subnormal (read after every step); the same run
    with the context disabled has subnormal entries, so the check can fail."""
    model = _stack()
    T, B = 80, 2
    x = torch.zeros(T, B, 4)
    x[:3] = 1.0
    tgt = torch.randn(T, B, 3)

    def run():
        lr = OnlineLearner(model, mode="stream", loss=mse_step_loss)
        seen = 0
        for t in range(T):
            lr.step(x[t], tgt[t])
            seen += _subnormal_entries(lr)
        return seen

    assert run() == 0
    import spikerec.hardware.online.subnormal as sub

    orig, orig_probe = sub.flush_subnormals.__enter__, sub._SUBNORMAL
    try:  # the context and the step's decorator (which reads the probe as 'flushing already') disabled
        sub.flush_subnormals.__enter__ = lambda self: (setattr(self, "_switched", False), self)[1]
        sub._SUBNORMAL = 0.0
        assert run() > 0
    finally:
        sub.flush_subnormals.__enter__, sub._SUBNORMAL = orig, orig_probe

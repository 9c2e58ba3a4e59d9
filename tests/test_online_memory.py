"""Stream mode keeps memory flat in T, the input included (fed from a generator): the peak of the
C allocator's bytes in use (glibc ``mallinfo2``, where torch's CPU tensors live; sampled after every
step) at T=4096 is within 5% of T=256."""
import gc

import pytest
import torch

from spikerec.train.memory import alloc_in_use
from spikerec.hardware.online import OnlineLearner
from spikerec.hardware.online.learner import mse_step_loss
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.layers.lru import LRU
from spikerec.models import RecurrentStack

from online_helpers import _fp64_one_thread  # noqa: F401


def peak_growth(model, T, B, H, seed, loss=None):
    g = torch.Generator().manual_seed(seed)

    def stream():  # never holds the whole sequence
        for _ in range(T):
            yield torch.randn(B, H, generator=g), torch.randn(B, 3, generator=g)

    lr = OnlineLearner(model, loss=loss or (lambda y, t: 0.5 * ((y - t) ** 2).sum()), update_every=500)
    # garbage of earlier tests collected inside the window would lower the bytes in use below the
    # baseline and hide the growth: collect it first and keep the collector out of the window
    gc.collect()
    gc.disable()
    try:
        base = alloc_in_use()
        peak = base
        for x_t, t_t in stream():
            lr.step(x_t, t_t)
            peak = max(peak, alloc_in_use())
        lr.update()
        peak = max(peak, alloc_in_use())
    finally:
        gc.enable()
    return peak - base


@pytest.mark.skipif(alloc_in_use() is None, reason="needs glibc's mallinfo2")
@pytest.mark.parametrize("net", ["lru_alif", "lif", "lif_mse", "alif_leaky"])
def test_stream_peak_allocator_memory_is_flat_in_T(net):
    """The LRU/ALIF stack and a LIF stack (lateral weights in the first layer), whose steps fill the
    step window and are worked as blocks of ``STREAM_WINDOW`` steps (the window's rows are the same
    size at any T), also with the package's MSE (its loss and gradient in one compiled call per
    step), and an ALIF layer under a leaky readout (with the readout-filtered traces, per-output
    taus: two filtered copies)."""
    torch.manual_seed(0)
    loss = mse_step_loss if net == "lif_mse" else None
    if net == "alif_leaky":
        model = RecurrentStack([ALIF(32, 48, recurrent=False)],
                               LeakyReadout(48, 3, tau=torch.tensor([5.0, 5.0, 20.0])))
        assert OnlineLearner(model)._filter is not None
    elif net.startswith("lif"):
        model = RecurrentStack([LIF(32, 48, recurrent=True), LIF(48, 48)], LeakyReadout(48, 3))
    else:
        lru = LRU(32, 48)
        model = RecurrentStack([lru, ALIF(lru.output_size, 48, recurrent=False)], LeakyReadout(48, 3))
    # warm-up: first-call allocations, including those of the first update in the middle of a
    # stream (the first steps after it load compiled code once)
    peak_growth(model, 600, 8, 32, 0, loss)
    short = peak_growth(model, 256, 8, 32, 1, loss)
    long = peak_growth(model, 4096, 8, 32, 2, loss)
    assert short > 100_000  # the traces themselves are measured (not a vacuous zero)
    assert long <= 1.05 * short, (short, long)


def test_stream_window_shrinks_where_its_rows_would_be_large():
    """The stream's window holds ``STREAM_WINDOW`` steps for a small stack, and fewer (halved, 16 at least) where
    a step's rows times 8 would pass ``WINDOW_BYTES``: the largest such power of two."""
    from spikerec.hardware.online import window

    torch.manual_seed(0)
    model = RecurrentStack([LIF(32, 48), LIF(48, 48)], LeakyReadout(48, 3))
    lr = OnlineLearner(model, loss=mse_step_loss)
    lr.step(torch.randn(4, 32), torch.randn(4, 3))
    assert lr._window.W == window.window_steps(lr) == window.STREAM_WINDOW
    width = 32 + (48 + 48) + (48 + 48) + (3 + 3)  # input; per layer its state and output
    for B, want in ((4, 128), (64, 64), (128, 32), (4096, 16)):
        lr.states = [type(s)(*(f[:1].expand(B, *f.shape[1:]) for f in s)) for s in lr.states]  # no memory
        step = 8 * B * lr.states[0][0].element_size() * width  # (float64 in this module)
        W = window.window_steps(lr)
        assert W == want and (W == 16 or W * step <= window.WINDOW_BYTES), (B, W)
        assert W == window.STREAM_WINDOW or 2 * W * step > window.WINDOW_BYTES, (B, W)

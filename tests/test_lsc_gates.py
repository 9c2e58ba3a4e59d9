"""LSC shuffling of a GRU permutes within each gate block (r, z, n), never across gates, and
a 2-layer GRU then reaches target 0.5 with the paper's per-step shuffling."""
import pytest
import torch

from spikerec.layers.gru import GRU
from spikerec.layers.readout import LeakyReadout
from spikerec.models import RecurrentStack
from spikerec.stability import lsc_pretrain, mean_radii, shuffle_parameters

pytestmark = pytest.mark.usefixtures("one_thread")


def _gru_stack(n, seed=0):
    torch.manual_seed(seed)
    return RecurrentStack([GRU(10, n), GRU(n, n)], LeakyReadout(n, 3))


def test_gru_tensors_are_shuffled_within_gate_blocks():
    model = _gru_stack(8)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert shuffle_parameters(model, 1.0, 1, torch.Generator().manual_seed(3))
    for name, p in model.named_parameters():
        b = before[name]
        if "rnn" in name:  # [3H, ...]: each gate's block keeps its own entries
            for g_old, g_new in zip(b.chunk(3, 0), p.detach().chunk(3, 0)):
                assert torch.equal(g_old.flatten().sort().values, g_new.flatten().sort().values), name
        else:  # other tensors: a permutation of the whole tensor
            assert torch.equal(b.flatten().sort().values, p.detach().flatten().sort().values), name
        if b.unique().numel() > 1:
            assert not torch.equal(b, p.detach()), name  # it did move entries


def _spikes(seed, t=20, b=16):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(t, b, 10, generator=g) < 0.3).float()


@pytest.mark.slow  # 1380 updates until converged: ~20 s on one busy core
def test_gru_reaches_half_with_per_step_shuffling():
    """The package defaults (shuffling every step, run until converged); the step limit only bounds a failure."""
    model = _gru_stack(16)
    cfg = dict(target=0.5, max_steps=3000)
    report = lsc_pretrain(model, _spikes(1), cfg)
    assert report.converged, (report.stop_reason, report.best_radii)
    after = mean_radii(model, _spikes(2), cfg)
    for k, v in after.items():
        assert abs(v["mean"] - 0.5) < 0.05, (k, v)


def test_unconverged_lsc_warns_with_radii_and_what_to_try():
    from spikerec.stability.progress import LSCProgressBar, lsc_warning

    model = _gru_stack(8)
    seen = []
    bar = LSCProgressBar(3)
    report = lsc_pretrain(model, _spikes(1), dict(target=0.5, max_steps=3), progress=lambda s, r: (bar(s, r), seen.append(s)))
    assert seen == [1, 2, 3] and bar.bar.n == 3
    bar.close()
    w = lsc_warning(report)
    assert w.startswith("warning: LSC did not converge: max_steps (3) reached after 3 steps")
    for k, v in report.best_radii.items():
        assert f"{k} {v:.3f} (target 0.5)" in w
    assert "--set lsc.max_steps=6" in w and "--set lsc.shuffle=false" in w
    report.converged = True
    assert lsc_warning(report) is None

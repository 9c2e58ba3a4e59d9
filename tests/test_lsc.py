"""LSC pre-training: convergence in expectation on small random data, multiplier,
shuffling, report, clear errors and divergence handling (Herranz-Celotti & Rouat 2024, "Stabilizing RNN
gradients through pre-training", Sec. II-D, II-G and App. H)."""
import json

import pytest
import torch
from torch import nn

from spikerec.errors import ConfigError
from spikerec.layers.alif import ALIF
from spikerec.layers.readout import LeakyReadout
from spikerec.models import RecurrentStack
from spikerec.stability import LSCConfig, LSCReport, apply_clipped_multiplier, lsc_pretrain, shuffle_parameters
from spikerec.stability.lsc import lsc_targets, make_optimizer, mean_radii

C, N, T, B = 10, 16, 20, 16


pytestmark = pytest.mark.usefixtures("one_thread")


def _stack(kind):
    torch.manual_seed(0)
    if kind == "alif":
        cells = [ALIF(C, N, tau_adapt=20.0), ALIF(N, N, tau_adapt=20.0)]
    elif kind == "lru":
        from spikerec.layers.lru import LRU

        cells = [LRU(C, N, output_size=N), LRU(N, N)]
    elif kind == "gru":
        from spikerec.layers.gru import GRU

        cells = [GRU(C, N), GRU(N, N)]
    elif kind == "mixed":
        from spikerec.layers.gru import GRU
        from spikerec.layers.lru import LRU

        cells = [GRU(C, N), LRU(N, N // 2, output_size=N), ALIF(N, N, tau_adapt=20.0)]
    return RecurrentStack(cells, LeakyReadout(N, 3))


def _spikes(seed, t=T, b=B):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(t, b, C, generator=g) < 0.3).float()


# ALIF: the paper only reaches rho_t = 1 (0.5 "was difficult to converge to", Sec. II-E).
# GRU at rho_t = 1: the clipped multiplier scales the gate weights, which moves the GRU's radii
# non-linearly and overshoots (the depth radius stays 0.05-0.15 off); without it the gradient
# alone converges (max deviation <= 0.02 over three seeds). See docs/lsc.md.
CASES = [("alif", 1.0, {}), ("lru", 1.0, {}), ("lru", 0.5, {}), ("gru", 0.5, {}), ("gru", 1.0, {"multiplier": False}),
         ("mixed", 1.0, {})]


@pytest.mark.parametrize("kind,target,extra", CASES)
def test_lsc_drives_every_mean_radius_to_target(kind, target, extra):
    model = _stack(kind)
    x = _spikes(1)
    cfg = dict(target=target, shuffle=False, square_mode="topleft", max_steps=160, **extra)
    before = mean_radii(model, x, cfg)
    assert max(abs(v["mean"] - target) for v in before.values()) > 0.1  # there is work to do
    report = lsc_pretrain(model, x, cfg)
    assert not report.diverged
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())  # nothing leaks into training's first step
    # the condition holds in expectation on fresh data of the same kind
    after = mean_radii(model, _spikes(2), cfg)
    assert set(after) == set(report.targets)
    for k, v in after.items():
        assert abs(v["mean"] - target) < 0.05, (k, v, report.stop_reason)


def test_targets_and_unbalanced_split():
    model = _stack("alif")
    cfg = LSCConfig(balance="unbalanced")
    t = lsc_targets(model, cfg, seq_len=300)
    assert t["time/0"] == pytest.approx(300 / 302) and t["time/1"] == pytest.approx(300 / 302)
    assert t["input/0"] == pytest.approx(2 / 302) and t["depth/1"] == pytest.approx(2 / 302)
    t = lsc_targets(model, LSCConfig(target=0.5, terms=("time", "depth", "input", "readout")), 50)
    assert t == {"time/0": 0.5, "input/0": 0.5, "time/1": 0.5, "depth/1": 0.5, "readout/2": 1.0}


def test_clipped_multiplier_semantics():
    model = _stack("alif")
    c0, c1 = model.cells
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    radii = {"time/0": 0.5, "input/0": 2.0, "time/1": 1.0 / 1.1, "depth/1": 1.0}
    kappas = apply_clipped_multiplier(model, radii, {k: 1.0 for k in radii}, (0.85, 1.15))
    assert kappas == pytest.approx({"time/0": 1.15, "depth/0": 0.85, "time/1": 1.1, "depth/1": 1.0})
    # weights, b, beta are multiplied; log-time-constants get + log(kappa) (tau <- kappa tau)
    torch.testing.assert_close(c0.recurrent_weight, 1.15 * before["cells.0.recurrent_weight"])
    torch.testing.assert_close(c0.weight, 0.85 * before["cells.0.weight"])
    torch.testing.assert_close(c0.b, 0.85 * before["cells.0.b"])
    torch.testing.assert_close(c0.beta, 0.85 * before["cells.0.beta"])
    torch.testing.assert_close(c0.log_tau_adapt.exp(), 1.15 * before["cells.0.log_tau_adapt"].exp())
    torch.testing.assert_close(c1.log_tau_mem.exp(), 1.1 * before["cells.1.log_tau_mem"].exp())
    torch.testing.assert_close(c1.weight, before["cells.1.weight"])
    torch.testing.assert_close(model.readout.weight, before["readout.weight"])


def test_damped_multiplier_takes_a_power_of_the_correction():
    model = _stack("alif")
    c0 = model.cells[0]
    w = c0.weight.detach().clone()
    radii = {"time/0": 0.64, "input/0": 1.0 / 1.21, "time/1": 4.0, "depth/1": 1.0}
    kappas = apply_clipped_multiplier(model, radii, {k: 1.0 for k in radii}, (0.85, 1.15), gain=0.5)
    # (1 / rho)^0.5: 1.25 is clipped to 1.15, 1.1 and 0.5 (clipped to 0.85) as computed
    assert kappas == pytest.approx({"time/0": 1.15, "depth/0": 1.1, "time/1": 0.85, "depth/1": 1.0})
    torch.testing.assert_close(c0.weight, 1.1 * w)
    with pytest.raises(ConfigError, match="multiplier_gain"):
        LSCConfig.from_dict({"multiplier_gain": 0.0})


def test_lru_nu_is_scaled_as_a_time_constant():
    from spikerec.layers.lru import LRU

    model = RecurrentStack([LRU(4, 6, output_size=5)], LeakyReadout(5, 2))
    lam = model.cells[0].lam().abs().detach()
    apply_clipped_multiplier(model, {"time/0": 0.5}, {"time/0": 1.0}, (0.85, 1.15))
    torch.testing.assert_close(model.cells[0].lam().abs().detach(), lam ** (1 / 1.15))


def test_shuffle_permutes_values_and_optimizer_state_alike():
    model = _stack("alif")
    opt = make_optimizer(model.parameters(), LSCConfig())
    x = _spikes(3, t=3, b=2)
    for _ in range(7):  # past one Lookahead sync, so slow weights exist
        opt.zero_grad()
        model(x)[0].pow(2).mean().backward()
        opt.step()
    w = model.cells[0].recurrent_weight
    slow = opt.state[w]["slow_param"]
    pairs_before = sorted(zip(w.detach().flatten().tolist(), slow.flatten().tolist()))
    before = w.detach().clone()
    assert shuffle_parameters(model, 1.0, 1, torch.Generator().manual_seed(0), opt)
    assert not torch.equal(before, w.detach())
    assert torch.equal(before.flatten().sort().values, w.detach().flatten().sort().values)
    # each entry keeps its own slow weight
    assert sorted(zip(w.detach().flatten().tolist(), slow.flatten().tolist())) == pairs_before
    assert not shuffle_parameters(model, 0.0)


def test_report_history_save_and_plot(tmp_path):
    model = _stack("alif")
    report = lsc_pretrain(model, _spikes(4, t=6, b=4), dict(max_steps=8, verify_every=4))
    h = report.history
    assert report.steps == 8 and len(h["loss"]) == 8
    assert set(h["radius"]) == {"time/0", "input/0", "time/1", "depth/1"}
    assert all(len(v) == 8 for v in h["radius"].values())
    assert set(h["kappa"]) == {"time/0", "depth/0", "time/1", "depth/1"}
    assert all(0.85 <= k <= 1.15 for v in h["kappa"].values() for k in v)
    assert len(h["verify"]) >= 2 and report.best_step >= 0
    path = report.save(tmp_path / "lsc.json")
    d = json.loads(open(path).read())
    assert d["history"]["radius"]["time/0"] == h["radius"]["time/0"]
    assert LSCReport.load(path).best_step == report.best_step
    png = report.plot(tmp_path / "lsc.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lsc")]


class _NoProtocol(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))


def test_clear_errors():
    model = _stack("alif")
    x = _spikes(5, t=4, b=2)
    with pytest.raises(TypeError, match="cell protocol"):
        lsc_pretrain(_NoProtocol(), x, {})
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="target"):
            lsc_pretrain(model, x, {"target": bad})
    with pytest.raises(ValueError, match="unknown options"):
        lsc_pretrain(model, x, {"targte": 1.0})
    with pytest.raises(ValueError, match="channels"):
        lsc_pretrain(model, torch.zeros(4, 2, C + 1), {})
    xn = x.clone()
    xn[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        lsc_pretrain(model, xn, {})
    with torch.no_grad():
        model.cells[0].weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="cells.0.weight"):
        lsc_pretrain(model, x, {})


def test_diverging_run_stops_and_keeps_finite_weights():
    model = _stack("alif")
    x = _spikes(6, t=8, b=2)
    calls = {"n": 0}

    def poison(step, rec):  # a parameter blows up after the 3rd update
        calls["n"] += 1
        if step == 3:
            with torch.no_grad():
                model.cells[1].recurrent_weight.mul_(float("inf"))

    report = lsc_pretrain(model, x, dict(max_steps=20, verify_every=2), progress=poison)
    assert report.diverged and "diverged" in report.stop_reason
    assert report.steps < 20
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_accepts_loader_batches_and_config_dicts_from_toml():
    model = _stack("alif")
    data = [(_spikes(7, t=3, b=2), torch.tensor([0, 1])), (_spikes(8, t=3, b=2), torch.tensor([1, 0]))]
    report = lsc_pretrain(model, data, {"max_steps": 5, "clip": [0.9, 1.1], "terms": ["time", "depth"],
                                        "optimizer": "adam"})
    assert report.steps == 5 and set(report.targets) == {"time/0", "time/1", "depth/1"}
    assert report.history["epoch"][-1] == 0 and report.history["t"][:4] == [0, 1, 2, 0]
    assert all(0.9 <= k <= 1.1 for v in report.history["kappa"].values() for k in v if k is not None)


@pytest.mark.parametrize("state", ["replay", "carry"])
def test_replayed_state_is_the_state_at_the_current_weights(state):
    """state="replay": the radii of step s are those at the weights left by step s-1, in the state
    that these weights reach on x[:t] (a shuffled run, where a carried state comes from other
    weights; so the carried run must differ)."""
    from spikerec.stability.jacobians import model_layers
    from spikerec.stability.lsc import measure_radii

    model = _stack("alif")
    x = _spikes(3, t=6, b=4)
    cfg = LSCConfig(method="exact", square_mode="topleft", state=state, max_steps=5, keep_best=False,
                    verify_every=10 ** 6)
    snaps = [{k: v.clone() for k, v in model.state_dict().items()}]
    report = lsc_pretrain(model, x, cfg, progress=lambda s, r: snaps.append(
        {k: v.clone() for k, v in model.state_dict().items()}))
    cells, readout = model_layers(model)
    layers = cells + [readout]
    keys = list(report.targets)
    worst = 0.0
    for s in range(1, 5):
        model.load_state_dict(snaps[s])
        with torch.no_grad():
            states = tuple(c.initial_state(4, x.device, x.dtype) for c in layers)
            for t in range(s):
                h = x[t]
                new = []
                for c, st in zip(layers, states):
                    h, st = c.step(h, st)
                    new.append(st)
                states = tuple(new)
            radii, _ = measure_radii(model, x[s], states, cfg, keys)
        for k in keys:
            worst = max(worst, abs(float(radii[k].mean()) - report.history["radius"][k][s]))
    if state == "replay":
        assert worst < 1e-5
    else:
        assert worst > 1e-3

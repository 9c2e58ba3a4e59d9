"""LSC pre-trains until its convergence test holds (Herranz-Celotti & Rouat, Sec. II-G: "until
convergence"), on the package defaults with the paper's per-step shuffling: every target (1, 0.5,
unbalanced) for GRU and LRU stacks, ALIF at 1; ALIF at 0.5 (hard for spiking nets, Sec. II-E)
ends with a warning that says so. The runs are bounded by step limits (never by time). GRU at 0.5
with shuffling: tests/test_lsc_gates.py. GRU at 1 with shuffling is left out: at width 16 it stays
0.05 off within 2000 steps (docs/lsc.md); its presets pre-train without shuffling."""
import pytest
import torch

from spikerec.errors import ConfigError
from spikerec.layers.alif import ALIF
from spikerec.layers.gru import GRU
from spikerec.layers.lru import LRU
from spikerec.layers.readout import LeakyReadout
from spikerec.models import RecurrentStack
from spikerec.stability import LSCConfig, lsc_pretrain, mean_radii
from spikerec.stability.lsc import LSCReport
from spikerec.stability.progress import LSCProgressBar, lsc_warning

pytestmark = pytest.mark.usefixtures("one_thread")

C, N, T, B = 10, 16, 10, 16
CELLS = {"gru": lambda i, o: GRU(i, o), "lru": lambda i, o: LRU(i, o, output_size=o),
         "alif": lambda i, o: ALIF(i, o)}


def _stack(kind, seed=0):
    torch.manual_seed(seed)
    return RecurrentStack([CELLS[kind](C, N), CELLS[kind](N, N)], LeakyReadout(N, 3))


def _spikes(seed, t=T):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(t, B, C, generator=g) < 0.3).float()


def _target(target):
    return {"balance": "unbalanced"} if target == "unbalanced" else {"target": float(target)}


def test_defaults_are_until_converged_with_a_wall_clock_bound():
    cfg = LSCConfig()
    assert cfg.max_steps is None and cfg.max_epochs is None and cfg.max_time_s == 3600.0 and cfg.shuffle
    with pytest.raises(ConfigError, match="max_time_s, max_steps and max_epochs are all unset"):
        LSCConfig(max_time_s=None).validate()
    LSCConfig(max_time_s=None, max_steps=5).validate()  # a step limit alone is a bound


# steps: where seed 0 converges (one thread); the bound leaves room for another machine's rounding
CASES = [
    # LRU at 0.5: test_lru_at_half_runs_past_the_old_ten_pass_cap
    pytest.param("lru", "unbalanced", 300, id="lru-unbalanced"),
    pytest.param("gru", "unbalanced", 300, id="gru-unbalanced"),
    pytest.param("lru", "1", 1500, id="lru-1", marks=pytest.mark.slow),
    pytest.param("alif", "1", 1500, id="alif-1", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("kind,target,bound", CASES)
def test_every_target_converges_with_shuffling_on_the_defaults(kind, target, bound):
    model = _stack(kind)
    cfg = dict(_target(target), max_steps=bound)  # everything else: the package defaults (shuffling every step)
    report = lsc_pretrain(model, _spikes(1), cfg)
    assert report.converged, (report.stop_reason, report.best_radii)
    assert report.stop_reason.startswith("converged") and lsc_warning(report) is None
    for k, v in mean_radii(model, _spikes(2), cfg).items():  # fresh data, the weights it returned
        assert abs(v["mean"] - v["target"]) < 0.05, (k, v)


def test_lru_at_half_runs_past_the_old_ten_pass_cap():
    """One batch of T = 2 steps: ten passes were 20 updates; the run goes on until it converges."""
    model = _stack("lru")
    cfg = {"target": 0.5, "max_steps": 400}
    report = lsc_pretrain(model, _spikes(1, t=2), cfg)
    assert report.converged and max(report.history["epoch"]) >= 10, (report.steps, report.stop_reason)
    for k, v in mean_radii(model, _spikes(2), cfg).items():
        assert abs(v["mean"] - 0.5) < 0.05, (k, v)


def test_alif_at_half_warns_that_spiking_nets_reach_target_one():
    model = _stack("alif")
    report = lsc_pretrain(model, _spikes(1), {"target": 0.5, "max_steps": 6})
    if report.converged:  # not expected (Sec. II-E), but then it must hold on fresh data
        for k, v in mean_radii(model, _spikes(2), {"target": 0.5}).items():
            assert abs(v["mean"] - 0.5) < 0.05, (k, v)
        return
    w = lsc_warning(report)
    assert w.startswith("warning: LSC did not converge: max_steps (6) reached after 6 steps")
    assert "Spiking networks were pre-trained only to target 1" in w and "--set lsc.target=1" in w
    assert "--set lsc.max_steps=12" in w
    # a non-spiking stack gets no such note; target 1 neither
    one = {"max_steps": 1, "keep_best": False}
    assert lsc_pretrain(_stack("gru"), _spikes(1), dict(one, target=0.5)).notes == []
    assert lsc_pretrain(_stack("alif"), _spikes(1), dict(one, target=1.0)).notes == []


def test_warning_names_the_budget_that_ended_the_run(tmp_path):
    rep = LSCReport(config={"max_time_s": 600.0, "shuffle": True}, targets={"time/0": 1.0},
                    stop_reason="max_time_s (600.0) reached", steps=50, best_deviation=0.1, best_radii={"time/0": 1.1})
    assert "more time (--set lsc.max_time_s=1200)" in lsc_warning(rep)
    rep.stop_reason, rep.config = "max_epochs (3) reached", {"max_epochs": 3}
    assert "--set lsc.max_epochs=6" in lsc_warning(rep)
    rep.notes = ["A note."]
    assert "(max deviation 0.100). A note. Try" in lsc_warning(rep)
    assert LSCReport.load(rep.save(tmp_path / "r.json")).notes == ["A note."]


def test_data_read_once_or_empty_ends_the_run():
    report = lsc_pretrain(_stack("gru"), iter([_spikes(1, t=3)]), {"target": 0.5, "keep_best": False})
    assert report.steps == 3 and not report.converged and "can be read only once" in report.stop_reason
    assert "data that can be read again" in lsc_warning(report)
    with pytest.raises(ValueError, match="no batches"):
        lsc_pretrain(_stack("gru"), [], {"target": 0.5})


def test_progress_bar_without_a_step_limit_counts_steps():
    with LSCProgressBar(None) as bar:
        bar(3, {"deviation": 0.2})
        assert bar.bar.total is None and bar.bar.n == 3
    with LSCProgressBar(7) as bar:
        assert bar.bar.total == 7

"""Run plots: best epoch, short runs, non-spiking layers, LSC status (files are written; helpers checked)."""
import torch

from spikerec.models import build_model
from spikerec.stability.lsc import LSCReport
from spikerec.stability.plots import _smooth, lsc_status
from spikerec.train.plots import _best_epoch, plot_curves, plot_raster


def _records(n):
    recs = []
    for e in range(1, n + 1):
        recs.append(dict(kind="step", step=e * 3, loss=1.0 / e))
        recs.append(dict(kind="epoch", epoch=e, step=e * 3, train_loss=1.0 / e, valid_loss=abs(e - 3) + 0.5,
                         train_acc=0.5, valid_acc=0.4))
    return recs


def test_best_epoch_is_the_lowest_validation_loss(tmp_path):
    assert _best_epoch([r for r in _records(6) if r["kind"] == "epoch"])["epoch"] == 3
    assert _best_epoch([dict(kind="epoch", epoch=1, step=1, train_loss=1.0)]) is None
    for n in (1, 2, 6):
        p = plot_curves(_records(n), tmp_path / f"c{n}.png")
        assert (tmp_path / f"c{n}.png").stat().st_size > 1000 and p.endswith(f"c{n}.png")


def test_raster_with_a_non_spiking_layer(tmp_path):
    torch.manual_seed(0)
    m = build_model({"input_size": 6, "layers": [{"kind": "lru", "size": 8, "output_size": 5},
                                                 {"kind": "alif", "size": 7}], "readout": {"size": 3}})
    plot_raster(m, (torch.rand(12, 6) < 0.3).float(), tmp_path / "r.png", label=1)
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_lsc_plot_trailing_mean_and_status(tmp_path):
    assert _smooth([1.0, 3.0, 5.0, 7.0], n=2) == [1.0, 2.0, 4.0, 6.0]
    hist = {"step": [0, 1, 2], "loss": [0.3, 0.2, 0.1], "radius": {"time/0": [1.3, 1.1, 1.01]}}
    rep = LSCReport(config={"eps": 0.02}, targets={"time/0": 1.0}, history=hist, converged=False,
                    stop_reason="max_steps (3) reached", steps=3, best_step=2, best_radii={"time/0": 1.01})
    rep.plot(tmp_path / "l.png")
    assert lsc_status(rep) == "not converged: max_steps (3) reached"
    rep.converged = True
    assert lsc_status(rep) == "converged"
    assert (tmp_path / "l.png").stat().st_size > 1000

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


def _drawn(monkeypatch):
    """Capture the figures that the plot functions save (their text, limits and ticks are checked)."""
    import spikerec.train.plots as plots

    figs = []
    real = plots.atomic_save_figure

    def keep(fig, path, **kw):
        figs.append(fig)
        return real(fig, path, **kw)

    monkeypatch.setattr(plots, "atomic_save_figure", keep)
    return figs


def _texts(ax):
    return " ".join(t.get_text() for t in ax.texts)


def test_empty_panels_say_no_data_yet(tmp_path, monkeypatch):
    from spikerec.train.plots import plot_stream

    figs = _drawn(monkeypatch)
    plot_curves([], tmp_path / "c.png")  # train.epochs = 0
    plot_stream([dict(kind="epoch", epoch=1, step=6)], tmp_path / "s.png", log_every=10)  # 6 steps < log_every
    curves, stream = figs
    assert all("no data yet" in _texts(ax) for ax in curves.axes)
    assert all("no data yet" in _texts(ax) and "every 10 training steps" in _texts(ax) for ax in stream.axes)
    plot_curves(_records(2), tmp_path / "c2.png")
    assert not any("no data yet" in _texts(ax) for ax in figs[-1].axes)


def test_curve_cosmetics_one_epoch_perfect_score(tmp_path, monkeypatch):
    figs = _drawn(monkeypatch)
    recs = [dict(kind="step", step=3, loss=0.9),
            dict(kind="epoch", epoch=1, step=6, train_loss=0.8, valid_loss=0.5, train_acc=0.9, valid_acc=1.0)]
    plot_curves(recs, tmp_path / "c.png")
    loss_ax, acc_ax = figs[0].axes
    assert list(acc_ax.get_xticks()) == [1]  # one tick for one epoch, no fractions of an epoch
    assert all(float(t).is_integer() for t in loss_ax.get_xticks())
    assert loss_ax.get_xlim()[0] == 0
    assert acc_ax.get_ylim()[1] > 1.0 and max(acc_ax.get_yticks()) <= 1.0  # a point at 1.0 inside the frame
    for ax in (loss_ax, acc_ax):  # the legends sit below the axes, not over the points
        legend = ax.get_legend()
        assert legend is not None and legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).y1 < 0


def test_stream_plot_running_mean_only_when_it_averages(tmp_path, monkeypatch):
    from spikerec.train.plots import plot_stream

    figs = _drawn(monkeypatch)
    few = [dict(kind="step", step=i, stream_step=10 * i, loss=1.0 / i) for i in range(1, 6)]
    plot_stream(few, tmp_path / "a.png")
    many = [dict(kind="step", step=i, stream_step=10 * i, loss=1.0 / i) for i in range(1, 101)]
    plot_stream(many, tmp_path / "b.png")
    labels = [[t.get_text() for t in f.axes[0].get_legend().get_texts()] for f in figs]
    assert labels[0] == ["logged steps"]
    assert labels[1] == ["logged steps", "running mean of 5 logged steps"]


def test_raster_time_ticks_are_whole_steps(tmp_path, monkeypatch):
    figs = _drawn(monkeypatch)
    torch.manual_seed(0)
    m = build_model({"input_size": 4, "layers": [{"kind": "lif", "size": 5}], "readout": {"size": 2}})
    plot_raster(m, (torch.rand(21, 4) < 0.3).float(), tmp_path / "r.png")
    ticks = [t for t in figs[0].axes[0].get_xticks() if -0.5 <= t <= 20.5]
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks


def test_plots_leave_pyplot_and_its_backend_alone(tmp_path):
    """A notebook's inline backend survives a run's plots: nothing calls matplotlib.use or imports pyplot."""
    import subprocess
    import sys

    code = ("import sys, matplotlib, torch\n"
            "from spikerec.train.plots import plot_curves, plot_raster, plot_stream\n"
            "from spikerec.stability.plots import plot_lsc_history\n"
            "from spikerec.models import build_model\n"
            "import spikerec.analysis.plots as ap\n"
            f"d = {str(tmp_path)!r}\n"
            "plot_curves([dict(kind='epoch', epoch=1, step=2, train_loss=1.0, valid_loss=1.0, valid_acc=0.5)], d + '/c.png')\n"
            "plot_stream([], d + '/s.png')\n"
            "m = build_model({'input_size': 3, 'layers': [{'kind': 'lif', 'size': 4}], 'readout': {'size': 2}})\n"
            "plot_raster(m, torch.ones(5, 3), d + '/r.png')\n"
            "ap.line_plot([1, 2], {'a': [1, 2]}, d + '/l.png', xlabel='x', ylabel='y')\n"
            "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)\n")
    import os

    env = dict(os.environ, MPLBACKEND="svg")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["svg", "False"]
    for name in ("c", "s", "r", "l"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000

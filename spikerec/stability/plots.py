"""Plots of LSC pre-training histories (matplotlib, Agg backend; no display needed)."""
from __future__ import annotations

import os

from ..atomic import atomic_save_figure

__all__ = ["plot_lsc_history"]


def plot_lsc_history(report, path) -> str:
    """Write a PNG: top, every term's batch-mean radius per step (dashed: its target);
    bottom, the loss (log scale). Written to a temp file and renamed."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    hist = report.history
    steps = hist.get("step", [])
    fig = Figure(figsize=(8, 6))
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for i, (key, values) in enumerate(hist.get("radius", {}).items()):
        color = f"C{i % 10}"
        ax.plot(steps, values, color=color, lw=1.2, label=key)
        if key in report.targets:
            ax.axhline(report.targets[key], color=color, ls="--", lw=0.8)
    if report.best_step >= 0:
        ax.axvline(report.best_step, color="0.5", ls=":", lw=0.8, label="best")
    ax.set_ylabel("spectral radius (batch mean)")
    ax.set_title("LSC pre-training: transition-derivative radii" + (" (converged)" if report.converged else ""))
    ax.legend(fontsize=7, ncol=2)
    losses = [max(v, 1e-12) for v in hist.get("loss", [])]
    ax2.plot(steps, losses, color="k", lw=1.0)
    ax2.set_yscale("log")
    ax2.set_xlabel("pre-training step (one per time step)")
    ax2.set_ylabel("LSC loss")
    fig.tight_layout()
    path = os.fspath(path)
    atomic_save_figure(fig, path, dpi=100)
    return path

"""Plots of LSC pre-training histories (matplotlib: an explicit ``Figure`` on the Agg canvas; pyplot's
backend is left as it is, so notebooks keep showing their figures)."""
from __future__ import annotations

import os

from ..atomic import atomic_save_figure

__all__ = ["plot_lsc_history"]


def _smooth(values, n: int = 10):
    """Trailing mean over ``n`` steps (the per-step radii are single-batch estimates, hence noisy)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= n:
            acc -= values[i - n]
        out.append(acc / min(i + 1, n))
    return out


def lsc_status(report) -> str:
    """``"converged"`` or ``"not converged: <why it stopped>"`` (the plot's title says it)."""
    return "converged" if report.converged else "not converged: " + (report.stop_reason or "stopped")


def plot_lsc_history(report, path) -> str:
    """Write a PNG: top, every term's batch-mean radius per step (thin; thick: trailing mean over
    10 steps), its target (dashed) and tolerance band ``target +- eps`` (shaded), and the final radii
    the run reports (stars at the step whose weights were kept, with their values); the title says
    whether the run converged or why it stopped. Bottom: the loss (log scale). Written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    hist = report.history
    steps = hist.get("step", [])
    eps = float((report.config or {}).get("eps", 0.0) or 0.0)
    fig = Figure(figsize=(9, 6))
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    final_step = report.best_step if report.best_step >= 0 else (steps[-1] if steps else 0)
    banded = set()
    for i, (key, values) in enumerate(hist.get("radius", {}).items()):
        color = f"C{i % 10}"
        ax.plot(steps, values, color=color, lw=0.7, alpha=0.35)
        ax.plot(steps, _smooth(values), color=color, lw=1.6, label=f"{key} (mean of 10 steps)")
        tgt = report.targets.get(key)
        if tgt is not None:
            ax.axhline(tgt, color="0.3", ls="--", lw=0.8)
            if eps > 0 and tgt not in banded:
                ax.axhspan(tgt - eps, tgt + eps, color="0.5", alpha=0.15, lw=0,
                           label=f"tolerance: target {tgt:g} +- {eps:g}")
                banded.add(tgt)
        r = (report.best_radii or {}).get(key)
        if r is not None:
            ax.plot([final_step], [r], "*", ms=13, color=color, mec="k", mew=0.5, zorder=5,
                    label=f"{key} reported: {r:.3f}")
    if report.best_step >= 0:
        ax.axvline(report.best_step, color="0.5", ls=":", lw=0.8)
    ax.set_ylabel("spectral radius (batch mean)")
    status = lsc_status(report)
    ax.set_title(f"LSC pre-training: transition-derivative radii ({status})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.grid(alpha=0.3)
    losses = [max(v, 1e-12) for v in hist.get("loss", [])]
    ax2.plot(steps, losses, color="k", lw=1.0)
    if losses and max(losses) / min(losses) > 3:  # a log axis only where the loss spans a range
        ax2.set_yscale("log")
    from matplotlib.ticker import MaxNLocator

    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlabel("pre-training step (one per time step)")
    ax2.set_ylabel("LSC loss" + (" (log scale)" if ax2.get_yscale() == "log" else ""))
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    path = os.fspath(path)
    atomic_save_figure(fig, path, dpi=100, bbox_inches="tight")
    return path

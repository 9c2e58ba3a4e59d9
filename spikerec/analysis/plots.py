"""PNG figures for the analysis tools (matplotlib, Agg; no global pyplot state).

Every function takes the numbers to draw and a ``path``, writes a PNG atomically (temporary
file, then rename) and returns the path. Axes are labelled; log scales follow the papers
(Zucchet & Orvieto Fig. 1/2: log-log against ``1 - lambda``; teacher-student losses: log;
WCRNN: exponents on a linear scale with the ``log|eig R|`` prediction).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..atomic import atomic_save_figure

__all__ = ["line_plot", "plot_sensitivity_scaling", "plot_normalized_sensitivity", "plot_teacher_student",
           "plot_lyapunov_spectrum", "plot_running_exponents", "plot_training_curves"]


def _figure(ncols: int = 1, width: float = 5.0, height: float = 3.8):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), dpi=110)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _save(fig, path) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"path: expected a .png file name, got {str(path)!r}")
    fig.tight_layout()
    atomic_save_figure(fig, path, bbox_inches="tight")
    return path


def _series(ax, x, series: Mapping[str, Sequence[float]], style="-"):
    for label, y in series.items():
        ax.plot(x, np.asarray(y, float), style, label=label)


def line_plot(x, series: Mapping[str, Sequence[float]], path, *, xlabel: str, ylabel: str, title: str = "",
              logx: bool = False, logy: bool = False, points: Mapping[str, tuple] | None = None) -> Path:
    """Curves ``series[label]`` against ``x``; ``points[label] = (x, y)`` adds markers (e.g. Monte Carlo)."""
    fig, (ax,) = _figure()
    _series(ax, x, series)
    for label, (px, py) in (points or {}).items():
        ax.plot(px, py, "o", ms=4, label=label)
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_sensitivity_scaling(one_minus_lam, sensitivity: Mapping[str, Sequence[float]], path, *,
                             h2_reference=None, mc_points: Mapping[str, tuple] | None = None) -> Path:
    """Fig. 1A: ``E[(dh/dlambda)^2]`` against ``1 - lambda`` (log-log), one curve per input
    correlation; ``h2_reference`` draws ``E[h^2]`` (grey) for comparison, ``mc_points`` adds
    Monte Carlo markers ``label -> (1 - lambda, values)``."""
    fig, (ax,) = _figure()
    _series(ax, one_minus_lam, sensitivity)
    if h2_reference is not None:
        ax.plot(one_minus_lam, h2_reference, color="0.6", lw=2, label=r"$E[h^2]$, $\rho=1$")
    for label, (px, py) in (mc_points or {}).items():
        ax.plot(px, py, "kx", ms=5, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.invert_xaxis()
    ax.set_xlabel(r"$1-\lambda$ (memory grows to the right)")
    ax.set_ylabel(r"$E[(dh/d\lambda)^2]$")
    ax.set_title("Curse of memory: sensitivity of the state to $\\lambda$")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_normalized_sensitivity(one_minus_lam, h2: Mapping[str, Sequence[float]],
                                dh2: Mapping[str, Sequence[float]], path) -> Path:
    """Fig. 2: normalised ``E[h^2]`` (A) and ``E[(dh/d omega)^2]`` under ``lambda = exp(-exp omega)``
    with ``gamma = sqrt(1 - lambda^2)`` (B) against ``1 - lambda`` (log-log)."""
    fig, (a, b) = _figure(2)
    for ax, data, ylabel, title in ((a, h2, r"$(1-\lambda^2)\,E[h^2]$", "A: input normalisation"),
                                    (b, dh2, r"$E[(dh/d\omega)^2]$", "B: + exp reparametrisation")):
        _series(ax, one_minus_lam, data)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.invert_xaxis()
        ax.set_xlabel(r"$1-\lambda$")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def plot_teacher_student(nu0, final_losses: Mapping[str, Sequence[float]], path, *, spread=None) -> Path:
    """Fig. 3A: final training loss of each student against the teacher's ``nu0`` (log loss);
    ``spread[label] = (low, high)`` draws a band (e.g. min/max over seeds)."""
    fig, (ax,) = _figure()
    for label, y in final_losses.items():
        ax.plot(nu0, y, "o-", label=label)
        if spread and label in spread:
            lo, hi = spread[label]
            ax.fill_between(nu0, lo, hi, alpha=0.2)
    ax.set_yscale("log")
    ax.set_xlabel(r"teacher $\nu_0$ (smallest eigenvalue modulus)")
    ax.set_ylabel("final training loss")
    ax.set_title("Teacher-student: dense vs diagonal recurrence")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_lyapunov_spectrum(spectra: Mapping[str, Sequence[float]], path, *,
                           predicted: Mapping[str, Sequence[float]] | None = None) -> Path:
    """Sorted Lyapunov exponents against their index, with ``log|eig R|`` predictions dashed."""
    fig, (ax,) = _figure()
    lines = {}
    for label, le in spectra.items():
        le = np.sort(np.asarray(le, float))[::-1]
        (ln,) = ax.plot(np.arange(1, le.size + 1), le, ".", ms=5, label=f"{label} (QR estimate)")
        lines[label] = ln.get_color()
    for label, pr in (predicted or {}).items():
        pr = np.sort(np.asarray(pr, float))[::-1]
        ax.plot(np.arange(1, pr.size + 1), pr, "--", color=lines.get(label, "k"), lw=1,
                label=f"{label}: log|eig R|")
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xlabel("exponent index (sorted)")
    ax.set_ylabel("Lyapunov exponent (per step)")
    ax.set_title("Lyapunov spectra vs residual prediction")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return _save(fig, path)


def plot_running_exponents(running, path, *, predicted=None, exp_scale: bool = True, max_lines: int = 20) -> Path:
    """Running estimates ``[T, k]`` over time (Fig. 2B/5B): ``exp(running LE)`` (per-step growth
    factor, converging to ``|eig R|``) when ``exp_scale``, else the exponents."""
    r = np.asarray(running, float)
    if r.ndim != 2:
        raise ValueError(f"running: expected [T, k], got shape {r.shape}")
    fig, (ax,) = _figure()
    t = np.arange(1, r.shape[0] + 1)
    cols = np.linspace(0, r.shape[1] - 1, min(max_lines, r.shape[1])).astype(int)
    y = np.exp(r[:, cols]) if exp_scale else r[:, cols]
    ax.plot(t, y, lw=0.8)
    if predicted is not None:
        p = np.asarray(predicted, float)
        for v in np.unique(np.round(np.exp(p) if exp_scale else p, 6))[:max_lines]:
            ax.axhline(v, color="k", ls="--", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("time step")
    ax.set_ylabel("exp(running exponent)" if exp_scale else "running exponent")
    ax.set_title("Convergence of the QR estimates")
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def plot_training_curves(curves: Mapping[str, tuple], path, *, xlabel: str = "epoch", ylabel: str = "test accuracy",
                         logy: bool = False) -> Path:
    """``curves[label] = (x, y)``, e.g. accuracy per epoch for several residuals."""
    fig, (ax,) = _figure()
    for label, (x, y) in curves.items():
        ax.plot(x, y, "o-", ms=3, label=label)
    ax.set_yscale("log" if logy else "linear")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)

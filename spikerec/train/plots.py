"""PNG figures of a run: learning curves, a spike raster of one sample and the stream plot.

Drawn on explicit :class:`matplotlib.figure.Figure` objects with the Agg canvas: pyplot and its
global backend are never touched, so ``plt.show()`` in a notebook keeps working after a run.
A panel without data says so ("no data yet") instead of showing an empty frame.
"""
from __future__ import annotations

import torch

from ..atomic import atomic_save_figure

__all__ = ["plot_curves", "plot_raster", "plot_stream"]


def _figure(**kw):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kw)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path) -> str:
    return str(atomic_save_figure(fig, path, dpi=110, bbox_inches="tight"))


def _no_data(ax, why: str) -> None:
    """Mark an axis that has nothing to show yet, and say why."""
    ax.text(0.5, 0.5, f"no data yet\n{why}", ha="center", va="center", transform=ax.transAxes, fontsize=9,
            color="0.35")
    ax.set_xticks([])
    ax.set_yticks([])


def _legend_below(ax, n: int) -> None:
    """The legend under the axis, never over the points (a validation accuracy of 1.0 stays visible)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=n, frameon=False)


def _best_epoch(epochs: list[dict]):
    """The epoch record with the lowest validation loss (the weights ``keep_best`` keeps), or None."""
    valid = [r for r in epochs if r.get("valid_loss") is not None]
    return min(valid, key=lambda r: r["valid_loss"]) if valid else None


def plot_stream(records: list[dict], path, *, log_every: int | None = None) -> str:
    """An endless-stream run (``[online] stream = true``): the loss of each logged step and its
    running mean over a window of a twentieth of the run, against the stream step (left), and the
    growth of the allocator's bytes in use since the stream's first batch (right: flat when the
    memory does not grow with the length of the stream). Dotted lines: the epochs' ends
    (validation; the best weights are copied once there). ``log_every`` (``train.log_every``) is
    named when no step was logged yet."""
    from matplotlib.ticker import MaxNLocator

    steps = [r for r in records if r.get("kind") == "step" and "stream_step" in r]
    fig = _figure(figsize=(10, 3.6))
    a1, a2 = fig.subplots(1, 2)
    a1.set_xlabel("stream step"); a1.set_ylabel("loss per step with a target")
    a2.set_xlabel("stream step"); a2.set_ylabel("allocator memory growth (MiB)")
    if not steps:
        why = (f"a step is logged every {log_every} training steps (train.log_every);\nthis run has not reached one"
               if log_every else "no training step has been logged")
        for ax in (a1, a2):
            _no_data(ax, why)
    else:
        xs = [r["stream_step"] for r in steps]
        losses = [r["loss"] for r in steps]
        w = max(1, len(losses) // 20)
        if w > 1:
            run = [sum(losses[max(0, i - w + 1):i + 1]) / len(losses[max(0, i - w + 1):i + 1])
                   for i in range(len(losses))]
            a1.plot(xs, losses, lw=0.5, alpha=0.35, color="C0", label="logged steps")
            a1.plot(xs, run, lw=1.2, color="C0", label=f"running mean of {w} logged steps")
        else:  # too few points for a running mean
            a1.plot(xs, losses, "o-", lw=1.0, ms=3, color="C0", label="logged steps")
        a1.legend(fontsize=8)
        per = steps[-1]["stream_step"] / max(steps[-1]["step"], 1)  # stream steps per training step
        for r in records:
            if r.get("kind") == "epoch":
                for ax in (a1, a2):
                    ax.axvline(r["step"] * per, color="0.5", ls=":", lw=0.8)
        mem = [(r["stream_step"], r["mem_mib"]) for r in steps if "mem_mib" in r]
        if mem:
            a2.plot(*zip(*mem), lw=1.0, color="C2")
            top = max(1.0, 2.0 * max(abs(m) for _, m in mem))
            a2.set_ylim(min(0.0, min(m for _, m in mem)) - 0.05 * top, top)
        else:
            _no_data(a2, "the C allocator's statistics (glibc mallinfo2) are not available here")
        for ax in (a1, a2):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
    fig.suptitle("one endless stream, learned online step by step (no resets)")
    fig.tight_layout()
    return _save(fig, path)


def plot_curves(records: list[dict], path) -> str:
    """Loss per step and epoch (left) and accuracy per epoch (right), train and validation; the
    best-validation-loss epoch (the weights ``train.keep_best`` keeps) is ringed on both."""
    from matplotlib.ticker import MaxNLocator

    epochs = [r for r in records if r.get("kind") == "epoch"]
    steps = [r for r in records if r.get("kind") == "step"]
    fig = _figure(figsize=(10, 3.9))
    a1, a2 = fig.subplots(1, 2)
    a1.set_xlabel("training step"); a2.set_xlabel("epoch"); a2.set_ylabel("accuracy")
    if steps:
        a1.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.6, alpha=0.4, color="C0",
                label="train (steps)")
    best = _best_epoch(epochs)
    if epochs:
        xs = [r["step"] for r in epochs]
        a1.plot(xs, [r.get("train_loss") for r in epochs], "o-", color="C0", label="train (epoch)")
        if any(r.get("valid_loss") is not None for r in epochs):
            a1.plot(xs, [r.get("valid_loss") for r in epochs], "s-", color="C1", label="validation")
        ep = [r["epoch"] for r in epochs]
        if any(r.get("train_acc") is not None for r in epochs):
            a2.plot(ep, [r.get("train_acc") for r in epochs], "o-", color="C0", label="train")
        if any(r.get("valid_acc") is not None for r in epochs):
            a2.plot(ep, [r.get("valid_acc") for r in epochs], "s-", color="C1", label="validation")
        a2.set_xlim(min(ep) - 0.5, max(ep) + 0.5)
        if len(ep) <= 8:  # a tick per epoch, never fractions of one
            a2.set_xticks(ep)
        else:
            a2.xaxis.set_major_locator(MaxNLocator(integer=True))
    if best is not None:  # a ring around the best point: the point itself stays visible
        lab = f"best validation (epoch {best['epoch']})"
        ring = dict(marker="o", ms=13, mfc="none", mec="C3", mew=1.6, ls="none", label=lab, zorder=5)
        a1.axvline(best["step"], color="0.4", ls=":", lw=1)
        a1.plot([best["step"]], [best["valid_loss"]], **ring)
        a2.axvline(best["epoch"], color="0.4", ls=":", lw=1)
        if best.get("valid_acc") is not None:
            a2.plot([best["epoch"]], [best["valid_acc"]], **ring)
    if not steps and not epochs:
        _no_data(a1, "no training step has been logged\n(train.epochs = 0, or stopped before the first log)")
        _no_data(a2, "no epoch has ended yet")
    else:
        losses = [v for r in steps + epochs for v in (r.get("loss"), r.get("train_loss"), r.get("valid_loss"))
                  if v is not None and v > 0]
        log = bool(losses) and max(losses) / min(losses) > 3  # a log axis only where the loss spans a range
        a1.set_ylabel("loss (log scale)" if log else "loss")
        if log:
            a1.set_yscale("log")
        last = max(r["step"] for r in steps + epochs)
        a1.set_xlim(0, last * 1.04 + 0.5)  # from step 0: a short run's few steps are not spread over fractions
        a1.xaxis.set_major_locator(MaxNLocator(integer=True))
        accs = [v for r in epochs for v in (r.get("train_acc"), r.get("valid_acc")) if v is not None]
        if accs:
            low = max(0.0, min(accs) - 0.05)
            a2.set_yticks([t for t in MaxNLocator().tick_values(low, 1.0) if low - 1e-9 <= t <= 1.0 + 1e-9])
            a2.set_ylim(low, 1.03)  # room above 1.0 for a perfect score
        elif epochs:
            _no_data(a2, "no accuracy (a regression task)")
        else:
            _no_data(a2, "no epoch has ended yet")
        for ax in (a1, a2):
            ax.grid(alpha=0.3)
            _legend_below(ax, 2)
    fig.suptitle("learning curves")
    fig.tight_layout()
    return _save(fig, path)


@torch.no_grad()
def plot_raster(model, x: torch.Tensor, path, *, label=None) -> str:
    """Input spikes, every hidden layer (spike raster, or activity map for non-spiking
    layers) and the readout of one sample ``x[T, C]``."""
    from matplotlib.ticker import MaxNLocator

    was = model.training
    model.eval()
    y, _, hidden = model(x.unsqueeze(1), record=True)
    model.train(was)
    panels = [("input", x, True)] + [
        (f"layer {i} ({type(c).__name__}, {h.shape[-1]})", h[:, 0], getattr(c, "spiking", False))
        for i, (c, h) in enumerate(zip(model.cells, hidden))
    ]
    n = len(panels) + 1
    fig = _figure(figsize=(9, 1.9 * n))
    gs = fig.add_gridspec(n, 2, width_ratios=[40, 1], wspace=0.03, hspace=0.45)
    axes = [fig.add_subplot(gs[0, 0])]
    axes += [fig.add_subplot(gs[i, 0], sharex=axes[0]) for i in range(1, n)]
    T = x.shape[0]
    for i, (ax, (name, a, spiking)) in enumerate(zip(axes, panels)):
        a = a.detach().float().cpu()
        cax = fig.add_subplot(gs[i, 1])
        if spiking:
            t, k = torch.nonzero(a > 0, as_tuple=True)
            ax.scatter(t.numpy(), k.numpy(), s=2, marker="|", color="k")
            ax.set_ylim(-0.5, a.shape[1] - 0.5)
            ax.set_title(f"{name}: {float(a.mean()):.3f} spikes/neuron/step", fontsize=8)
            cax.set_visible(False)
        else:  # neuron index grows upwards, as in the rasters
            im = ax.imshow(a.t().numpy(), aspect="auto", interpolation="nearest", cmap="viridis", origin="lower",
                           extent=(-0.5, T - 0.5, -0.5, a.shape[1] - 0.5))
            fig.colorbar(im, cax=cax)
            cax.tick_params(labelsize=6)
            cax.set_ylabel("output", fontsize=7)
            ax.set_title(name, fontsize=8)
        ax.set_ylabel("neuron" if i else "input channel", fontsize=8)
        ax.tick_params(labelbottom=False)
    yy = y[:, 0].detach().float().cpu()
    ax = axes[-1]
    for k in range(yy.shape[1]):
        ax.plot(yy[:, k].numpy(), lw=1, label=str(k) if yy.shape[1] <= 20 else None)
    ax.set_title("readout" + (f" (label {label}, prediction {int(yy.mean(0).argmax())})" if label is not None else ""),
                 fontsize=8)
    ax.set_xlabel("time step")
    ax.set_ylabel("readout output", fontsize=8)
    ax.tick_params(labelbottom=True)
    ax.set_xlim(-0.5, T - 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole time steps
    lax = fig.add_subplot(gs[-1, 1])
    lax.axis("off")
    if yy.shape[1] <= 20:  # beside the traces, never on them
        ax.legend(fontsize=6, ncol=1 if yy.shape[1] <= 10 else 2, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  title="class", title_fontsize=6, borderaxespad=0)
    return _save(fig, path)

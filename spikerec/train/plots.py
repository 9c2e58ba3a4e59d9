"""PNG figures of a run: learning curves and a spike raster of one sample (matplotlib, Agg)."""
from __future__ import annotations

import torch

from ..atomic import atomic_save_figure

__all__ = ["plot_curves", "plot_raster"]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> str:
    return str(atomic_save_figure(fig, path, dpi=110, bbox_inches="tight"))


def plot_curves(records: list[dict], path) -> str:
    """Loss and accuracy per epoch (train and validation) plus per-step training loss."""
    plt = _plt()
    epochs = [r for r in records if r.get("kind") == "epoch"]
    steps = [r for r in records if r.get("kind") == "step"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    if steps:
        a1.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.6, alpha=0.4, color="C0", label="train (steps)")
    if epochs:
        xs = [r["step"] for r in epochs]
        a1.plot(xs, [r.get("train_loss") for r in epochs], "o-", color="C0", label="train")
        if any(r.get("valid_loss") is not None for r in epochs):
            a1.plot(xs, [r.get("valid_loss") for r in epochs], "s-", color="C1", label="validation")
        if any(r.get("train_acc") is not None for r in epochs):
            a2.plot([r["epoch"] for r in epochs], [r.get("train_acc") for r in epochs], "o-", color="C0", label="train")
        if any(r.get("valid_acc") is not None for r in epochs):
            a2.plot([r["epoch"] for r in epochs], [r.get("valid_acc") for r in epochs], "s-", color="C1", label="validation")
    a1.set_xlabel("step"); a1.set_ylabel("loss"); a1.set_yscale("log")
    a2.set_xlabel("epoch"); a2.set_ylabel("accuracy"); a2.set_ylim(0, 1)
    a2.grid(alpha=0.3)
    for ax in (a1, a2):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("learning curves")
    out = _save(fig, path)
    plt.close(fig)
    return out


@torch.no_grad()
def plot_raster(model, x: torch.Tensor, path, *, label=None) -> str:
    """Input spikes, every hidden layer (spike raster, or activity map for non-spiking
    layers) and the readout of one sample ``x[T, C]``."""
    plt = _plt()
    was = model.training
    model.eval()
    y, _, hidden = model(x.unsqueeze(1), record=True)
    model.train(was)
    panels = [("input", x, True)] + [
        (f"layer {i} ({type(c).__name__}, {h.shape[-1]})", h[:, 0], getattr(c, "spiking", False))
        for i, (c, h) in enumerate(zip(model.cells, hidden))
    ]
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(8, 1.8 * (len(panels) + 1)), sharex=True)
    for ax, (name, a, spiking) in zip(axes, panels):
        a = a.detach().float().cpu()
        if spiking:
            t, n = torch.nonzero(a > 0, as_tuple=True)
            ax.scatter(t.numpy(), n.numpy(), s=2, marker="|", color="k")
            ax.set_ylim(-0.5, a.shape[1] - 0.5)
            rate = float(a.mean())
            ax.set_title(f"{name}: {rate:.3f} spikes/neuron/step", fontsize=8)
        else:
            ax.imshow(a.t().numpy(), aspect="auto", interpolation="nearest", cmap="viridis")
            ax.set_title(name, fontsize=8)
        ax.set_ylabel("neuron", fontsize=8)
    yy = y[:, 0].detach().float().cpu()
    for k in range(yy.shape[1]):
        axes[-1].plot(yy[:, k].numpy(), lw=1, label=str(k) if yy.shape[1] <= 20 else None)
    axes[-1].set_title("readout" + (f" (label {label}, prediction {int(yy.mean(0).argmax())})" if label is not None else ""),
                       fontsize=8)
    axes[-1].set_xlabel("time step")
    if yy.shape[1] <= 20:
        axes[-1].legend(fontsize=6, ncol=10, loc="upper left")
    out = _save(fig, path)
    plt.close(fig)
    return out

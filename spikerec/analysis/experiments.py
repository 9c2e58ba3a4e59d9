"""Small CPU experiments for the notebooks: a sequential-digits task ("sMNIST-lite") and its trainer.

``digits_sequences`` turns scikit-learn's bundled 8x8 digits (1797 images, offline) into
pixel-by-pixel sequences of length 64 in scan-line order, intensities in ``[0, 1]``: the
sequential-MNIST protocol of the WCRNN paper (Sec. 4) at 1/12 of the length. The
characteristic frequency of these sequences is one image row, ``2 pi / 8``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["digits_sequences", "train_sequence_classifier", "evaluate_accuracy"]


def digits_sequences(*, n_test: int = 360, permute: bool = False, seed: int = 0):
    """``(x_train [64, N, 1], y_train [N], x_test, y_test)``; ``permute`` applies one fixed
    random pixel permutation (psMNIST-lite)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.as_tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.as_tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    if permute:
        x = x[:, torch.randperm(64, generator=g)]
    order = torch.randperm(x.shape[0], generator=g)
    x, y = x[order], y[order]
    if not 0 < n_test < x.shape[0]:
        raise ValueError(f"n_test: expected 0 < n_test < {x.shape[0]}, got {n_test}")
    seq = x.t().unsqueeze(-1)  # [64, N, 1]
    return seq[:, n_test:], y[n_test:], seq[:, :n_test], y[:n_test]


def evaluate_accuracy(model, x: torch.Tensor, y: torch.Tensor, batch: int = 512) -> float:
    """Fraction of correct ``argmax model.logits(model(x))`` predictions."""
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[1], batch):
            logits = model.logits(model(x[:, i:i + batch])[0])
            correct += int((logits.argmax(-1) == y[i:i + batch]).sum())
    return correct / x.shape[1]


def train_sequence_classifier(model, x_train, y_train, x_test, y_test, *, epochs: int = 5, lr: float = 0.05,
                              momentum: float = 0.9, batch: int = 64, clip: float | None = None,
                              max_train: int | None = None, seed: int = 0) -> dict:
    """SGD with momentum (the WCRNN paper's optimiser), cross-entropy on ``model.logits``.

    Returns ``{"epoch": [0..epochs], "test_accuracy": [...], "train_loss": [...]}`` (accuracy
    before training at epoch 0). A non-finite loss stops training early (unstable residuals).
    """
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    n = x_train.shape[1] if max_train is None else min(int(max_train), x_train.shape[1])
    hist = {"epoch": [0], "test_accuracy": [evaluate_accuracy(model, x_test, y_test)], "train_loss": [math.nan]}
    for ep in range(1, epochs + 1):
        perm = torch.randperm(x_train.shape[1], generator=g)[:n]
        total, count = 0.0, 0
        for i in range(0, n, batch):
            idx = perm[i:i + batch]
            logits = model.logits(model(x_train[:, idx])[0])
            loss = F.cross_entropy(logits, y_train[idx])
            if not torch.isfinite(loss):
                hist["train_loss"].append(math.inf)
                hist["epoch"].append(ep)
                hist["test_accuracy"].append(math.nan)
                return hist
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            total += loss.item() * idx.numel()
            count += idx.numel()
        hist["epoch"].append(ep)
        hist["train_loss"].append(total / count)
        hist["test_accuracy"].append(evaluate_accuracy(model, x_test, y_test))
    return hist

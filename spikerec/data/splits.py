"""Deterministic split helpers (numpy ``default_rng`` / PCG64 from a fixed seed)."""
from __future__ import annotations

import numpy as np

__all__ = ["stratified_split", "SPLITS"]

SPLITS = ("train", "valid", "test")


def stratified_split(labels, fractions=(0.6, 0.2, 0.2), seed: int = 0) -> dict[str, np.ndarray]:
    """Indices of a stratified ``train/valid/test`` split: within each class (in label order)
    a fixed permutation from ``seed`` is cut at the rounded cumulative fractions. Sorted indices."""
    labels = np.asarray(labels)
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"stratified_split: fractions must be 3 non-negative numbers summing to 1, got {fractions}")
    rng = np.random.default_rng(seed)
    parts = {s: [] for s in SPLITS}
    cum = np.cumsum(fractions)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        cuts = np.rint(cum * len(idx)).astype(int)
        parts["train"].append(idx[: cuts[0]])
        parts["valid"].append(idx[cuts[0]: cuts[1]])
        parts["test"].append(idx[cuts[1]:])
    return {s: np.sort(np.concatenate(v)) for s, v in parts.items()}

"""Synthetic tasks of the papers, generated from a seed (each split has its own stream).

* ``copy`` (Zucchet 2025, ETH Diss. 31520, §4.4.1): ``pattern_length P = 20``, ``pad_length = 7``,
  8 input channels, ``T = 2P + pad + 1 = 48``. Steps ``[0, P)`` carry Bernoulli(1/2) bits in
  channels 0-6, the pad is silent, the stop token (channel 7) is on at step ``P + pad = 27``,
  and the target is the pattern at steps ``[T - P, T) = [28, 48)``. Targets are ``[T, 7]``
  int64 bits with ``-100`` (``ignore_index``) outside the output window; the model has
  ``7 x 2 = 14`` outputs (a 2-class cross-entropy per bit). 20000 training samples.
* ``adding`` (Hochreiter & Schmidhuber 1997; Arjovsky et al. 2016 form): channel 0 holds
  ``U(0, 1)`` values, channel 1 marks one step in each half of the sequence; the target is the
  sum of the two marked values (regression, one output read at the last step).
* ``teacher_student`` (Zucchet & Orvieto 2024, NeurIPS, App. A.1, eqs 12-15): a fixed linear teacher
  ``h_t = A h_{t-1} + B x_t``, ``y_t = C h_t + D x_t`` with ``h_0 = 0``, ``n = 10``, ``A`` from
  ``N(0, 1/n)`` entries whose eigenvalues are mapped to
  ``(nu0 + (1 - nu0) tanh|lambda|) exp(i angle(lambda) theta0 / pi)`` (eq. 15),
  ``B, D ~ N(0,1)/sqrt(d_in)``, ``C ~ N(0,1)/sqrt(n)``; inputs ``x_t ~ N(0, 1)`` iid,
  ``T = 300``. Targets ``y[T, d_out]`` float32 (per-step regression). The teacher comes from
  ``teacher_seed``; inputs from ``seed`` and the split.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .core import ArrayDataset

__all__ = ["copy_dataset", "adding_dataset", "teacher_student_dataset", "linear_teacher", "TASK_OPTIONS",
           "task_info", "IGNORE_INDEX"]

IGNORE_INDEX = -100
_SPLIT_OFFSET = {"train": 0, "valid": 1, "test": 2}

TASK_OPTIONS = {
    "copy": dict(pattern_length=20, pad_length=7, bits=7, n_samples=None, seed=0),
    "adding": dict(steps=100, n_samples=None, seed=0),
    "teacher_student": dict(steps=300, n_hidden=10, d_in=1, d_out=1, nu0=0.99, theta0=math.pi,
                            n_samples=None, seed=0, teacher_seed=0),
}
_DEFAULT_N = {
    "copy": dict(train=20000, valid=2000, test=2000),
    "adding": dict(train=10000, valid=1000, test=1000),
    "teacher_student": dict(train=1280, valid=256, test=256),
}


def _opts(name, options):
    unknown = sorted(set(options) - set(TASK_OPTIONS[name]))
    if unknown:
        raise ValueError(f"dataset {name!r}: unknown option(s) {unknown}; valid: {sorted(TASK_OPTIONS[name])}")
    return {**TASK_OPTIONS[name], **options}


def _rng(seed: int, split: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), _SPLIT_OFFSET[split], 7919])


def _n(name, split, o):
    n = o["n_samples"]
    n = _DEFAULT_N[name][split] if n is None else (n[split] if isinstance(n, dict) else int(n))
    if n < 1:
        raise ValueError(f"dataset {name!r}: n_samples must be >= 1, got {n}")
    return n


def task_info(name: str, **options) -> dict:
    o = _opts(name, options)
    if name == "copy":
        P, pad, bits = int(o["pattern_length"]), int(o["pad_length"]), int(o["bits"])
        T = 2 * P + pad + 1
        return dict(input_size=bits + 1, output_size=2 * bits, steps=T, task="copy", bits=bits,
                    target_window=[T - P, T], stop_step=P + pad, ignore_index=IGNORE_INDEX,
                    target="[T, bits] int64 in {0, 1}, ignore_index outside the window; "
                           "logits [T, B, bits, 2] from the 2*bits outputs")
    if name == "adding":
        return dict(input_size=2, output_size=1, steps=int(o["steps"]), task="regression",
                    target="[1] float32, read at the last step")
    return dict(input_size=int(o["d_in"]), output_size=int(o["d_out"]), steps=int(o["steps"]),
                task="sequence_regression", target="[T, d_out] float32 (per step)")


def copy_dataset(split: str, **options) -> ArrayDataset:
    o = _opts("copy", options)
    P, pad, bits = int(o["pattern_length"]), int(o["pad_length"]), int(o["bits"])
    if P < 1 or pad < 0 or bits < 1:
        raise ValueError(f"dataset 'copy': need pattern_length >= 1, pad_length >= 0, bits >= 1, got {P}, {pad}, {bits}")
    T, n = 2 * P + pad + 1, _n("copy", split, o)
    pattern = _rng(o["seed"], split).integers(0, 2, size=(n, P, bits), dtype=np.int64)
    x = np.zeros((n, T, bits + 1), np.uint8)
    x[:, :P, :bits] = pattern
    x[:, P + pad, bits] = 1
    y = np.full((n, T, bits), IGNORE_INDEX, np.int64)
    y[:, T - P:, :] = pattern
    return ArrayDataset(torch.from_numpy(x), torch.from_numpy(y), per_step_target=True, info=task_info("copy", **options))


def adding_dataset(split: str, **options) -> ArrayDataset:
    o = _opts("adding", options)
    T, n = int(o["steps"]), _n("adding", split, o)
    if T < 2:
        raise ValueError(f"dataset 'adding': steps must be >= 2, got {T}")
    rng = _rng(o["seed"], split)
    vals = rng.random((n, T), dtype=np.float64).astype(np.float32)
    half = T // 2
    i = rng.integers(0, half, n)
    j = rng.integers(half, T, n)
    x = np.zeros((n, T, 2), np.float32)
    x[:, :, 0] = vals
    x[np.arange(n), i, 1] = 1.0
    x[np.arange(n), j, 1] = 1.0
    y = (vals[np.arange(n), i] + vals[np.arange(n), j])[:, None]
    return ArrayDataset(torch.from_numpy(x), torch.from_numpy(y.astype(np.float32)), info=task_info("adding", **options))


def linear_teacher(n_hidden=10, d_in=1, d_out=1, nu0=0.99, theta0=math.pi, seed=0) -> dict[str, np.ndarray]:
    """Teacher matrices ``A[n, n], B[n, d_in], C[d_out, n], D[d_out, d_in]`` (float64; Zucchet & Orvieto 2024, App. A.1)."""
    if not 0 <= nu0 < 1:
        raise ValueError(f"teacher_student: nu0 must lie in [0, 1), got {nu0!r}")
    rng = np.random.default_rng(int(seed))
    n = int(n_hidden)
    A0 = rng.standard_normal((n, n)) / math.sqrt(n)
    lam, P = np.linalg.eig(A0)
    lam = (nu0 + (1 - nu0) * np.tanh(np.abs(lam))) * np.exp(1j * np.angle(lam) * theta0 / math.pi)
    A = np.real(P @ np.diag(lam) @ np.linalg.inv(P))
    B = rng.standard_normal((n, d_in)) / math.sqrt(d_in)
    C = rng.standard_normal((d_out, n)) / math.sqrt(n)
    D = rng.standard_normal((d_out, d_in)) / math.sqrt(d_in)
    return dict(A=A, B=B, C=C, D=D, eigenvalues=lam)


def teacher_student_dataset(split: str, **options) -> ArrayDataset:
    o = _opts("teacher_student", options)
    T, n = int(o["steps"]), _n("teacher_student", split, o)
    t = linear_teacher(o["n_hidden"], int(o["d_in"]), int(o["d_out"]), float(o["nu0"]), float(o["theta0"]), o["teacher_seed"])
    x = _rng(o["seed"], split).standard_normal((n, T, int(o["d_in"])))
    h = np.zeros((n, int(o["n_hidden"])))
    y = np.empty((n, T, int(o["d_out"])))
    for k in range(T):  # h_t = A h_{t-1} + B x_t ; y_t = C h_t + D x_t
        h = h @ t["A"].T + x[:, k] @ t["B"].T
        y[:, k] = h @ t["C"].T + x[:, k] @ t["D"].T
    ds = ArrayDataset(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32)),
                      per_step_target=True, info=task_info("teacher_student", **options))
    ds.teacher = t
    return ds

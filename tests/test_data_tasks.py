"""Synthetic tasks: copy, adding, linear teacher-student."""
import numpy as np
import pytest
import torch

from spikerec.data import dataset_info, get_dataset, make_loader
from spikerec.data.tasks import linear_teacher


def test_copy_task_layout():
    info = dataset_info("copy")
    assert (info["input_size"], info["output_size"], info["steps"], info["stop_step"]) == (8, 14, 48, 27)
    ds = get_dataset("copy", "train", n_samples=64)
    x, y = ds.tensors()
    assert x.shape == (64, 48, 8) and y.shape == (64, 48, 7)
    assert torch.all(x[:, 27, 7] == 1) and x[:, :, 7].sum() == 64            # one stop token, at 27
    assert x[:, 20:27].abs().sum() == 0 and x[:, 28:].abs().sum() == 0      # silent pad and recall
    assert torch.all(y[:, :28] == -100)                                      # ignored outside [28, 48)
    assert torch.equal(y[:, 28:], x[:, :20, :7].long())                      # recall = pattern
    assert 0.4 < x[:, :20, :7].mean() < 0.6
    assert len(get_dataset("copy", "train")) == 20000
    xb, yb = next(iter(make_loader(ds, 16, True, 0)))
    assert xb.shape == (48, 16, 8) and yb.shape == (48, 16, 7)


def test_copy_splits_differ_and_are_reproducible():
    a = get_dataset("copy", "train", n_samples=8).tensors()[0]
    b = get_dataset("copy", "train", n_samples=8).tensors()[0]
    c = get_dataset("copy", "test", n_samples=8).tensors()[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_adding_problem_target():
    x, y = get_dataset("adding", "valid", steps=50, n_samples=32).tensors()
    assert x.shape == (32, 50, 2) and y.shape == (32, 1)
    assert torch.all(x[:, :25, 1].sum(1) == 1) and torch.all(x[:, 25:, 1].sum(1) == 1)
    assert torch.allclose((x[..., 0] * x[..., 1]).sum(1, keepdim=True), y, atol=1e-6)


def test_teacher_student_matches_recurrence_and_eigenvalues():
    ds = get_dataset("teacher_student", "train", n_samples=4, steps=40, n_hidden=6, nu0=0.9)
    t = ds.teacher
    lam = np.linalg.eigvals(t["A"])
    assert np.all(np.abs(lam) >= 0.9 - 1e-9) and np.all(np.abs(lam) < 1)
    x, y = ds.tensors()
    xs = x.double().numpy()
    h = np.zeros((4, 6))
    for k in range(40):
        h = h @ t["A"].T + xs[:, k] @ t["B"].T
        np.testing.assert_allclose(y[:, k].double().numpy(), h @ t["C"].T + xs[:, k] @ t["D"].T, rtol=1e-5, atol=1e-5)
    # theta0 = pi keeps the angles; theta0 = 0 makes every eigenvalue real and positive
    lam0 = np.linalg.eigvals(linear_teacher(6, nu0=0.5, theta0=0.0)["A"])
    assert np.allclose(lam0.imag, 0, atol=1e-8) and np.all(lam0.real > 0)
    with pytest.raises(ValueError, match="nu0"):
        linear_teacher(nu0=1.0)

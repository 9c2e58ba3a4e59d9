"""The step API's window: the last ``W`` steps of every layer as rows, filled one step at a time.

:meth:`.learner.OnlineLearner.step` returns each step's output at once: per layer one call of the kind's compiled step
(its row kernel, numba on the CPU) or its torch step writes the state after the step, the input and the output into
the window's rows; the loss's error ``d l_t / d y_t`` is taken at once too. The gradient work runs on the rows as one
block (:mod:`.block`) when the window is full, or before anything reads or changes the traces, accumulators or
parameters. The sums are the per-step recursion's (float rounding aside); memory is flat in the stream's length.
"""
from __future__ import annotations

import torch

from ... import neurons
from ...kernels import as_numpy, readout_online
from ...kernels.trace_numba import compiled_cpu
from .block import autograd_block, compiled_block, step_loss
from .losses import mse_step_loss
from .traces import advance

__all__ = ["StepWindow", "STREAM_WINDOW", "window_steps"]

STREAM_WINDOW = 128  # the most steps per block of the stream mode's gradient work
WINDOW_BYTES = 64 << 20  # about the most memory a window's rows and its block's temporaries take


def window_steps(learner) -> int:
    """Steps per block of the stream mode: :data:`STREAM_WINDOW`, halved (to 16 at least) while a step's rows
    (every layer's input, state and output) times 8 for the block's temporaries pass :data:`WINDOW_BYTES`."""
    W, s0 = STREAM_WINDOW, learner.states[0][0]
    width = learner.model.input_size + sum(sum(f[0].numel() for f in st) + _out_width(tr, st)
                                           for tr, st in zip(learner.tracers, learner.states))
    step = 8 * s0.shape[0] * s0.element_size() * width
    while W > 16 and W * step > WINDOW_BYTES:
        W //= 2
    return W


def _out_width(tr, st) -> int:
    return getattr(tr.cell, "output_size", None) or st[0].shape[-1]


class StepWindow:
    """The rows of one learner's last steps (:func:`window_steps`, or the chunk) and its step."""

    def __init__(self, learner, W: int):
        self.learner, self.W, self.j, self.gen, self.any_loss = learner, int(W), 0, None, False

    def _bind(self) -> None:
        """Copy the learner's states into the first rows (made once per batch size and dtype); take the constants."""
        lr = self.learner
        s0 = lr.states[0][0]
        B, dt, W = s0.shape[0], s0.dtype, self.W
        compiled = lr._compiled and compiled_cpu(s0) and lr._compiled_block
        if getattr(self, "key", None) != (B, dt, s0.device):
            self.key, self.S, self.O, self.X, self.rowstates = (B, dt, s0.device), [], [], [], []
            x = torch.empty((W, B, lr.model.input_size), dtype=dt, device=s0.device)
            for tr, st in zip(lr.tracers, lr.states):
                S = [torch.empty((W + 1, *f.shape), dtype=f.dtype, device=f.device) for f in st]
                O = torch.empty((W, B, _out_width(tr, st)), dtype=dt, device=s0.device)
                self.X.append(x)
                self.S.append(S)
                self.O.append(O)
                self.rowstates.append([type(st)(*(r[i] for r in S)) for i in range(W + 1)])
                x = O
            self.GY = torch.zeros((W, B, self.O[-1].shape[-1]), dtype=dt, device=s0.device)
        for S, st in zip(self.S, lr.states):
            for r, f in zip(S, st):
                r[0].copy_(f)
        self.calls = [tr.row_kernel(dt, B) if compiled and hasattr(tr, "row_kernel") else None for tr in lr.tracers]
        self._args()
        self.j, self.any_loss, self.gen = 0, False, lr._gen
        self._sync_states()

    def _args(self) -> None:
        """The compiled calls' operands (numpy views of the rows, the kind's constants); new output and loss rows."""
        self.args = [None if rk is None else (x.numpy(), *(r.numpy() for r in S), O.numpy(), *rk[1])
                     for rk, x, S, O in zip(self.calls, self.X, self.S, self.O)]
        self.fast = [(rk[0], a) for rk, a in zip(self.calls, self.args)] if all(self.calls) else None
        self.L = torch.zeros(self.W, dtype=self.O[-1].dtype, device=self.O[-1].device)
        self.yrows, self.lrows = self.O[-1].unbind(0), self.L.unbind(0)
        self.np = (self.X[0].numpy(), self.O[-1].numpy(), self.GY.numpy(), self.L.numpy()) if self.fast else None

    def _sync_states(self) -> None:
        self.learner.states[:] = [rows[self.j] for rows in self.rowstates]

    def step(self, x_t, target_t):
        """One step: ``(y_t, loss_t)`` at ``target_t`` (or ``None``): the package's MSE in one compiled call where the
        target allows, else :func:`.block.step_loss` (the loss's closed form, else one autograd call)."""
        lr = self.learner
        if self.gen != lr._gen:
            self._bind()
        j = self.j
        if self.fast is not None:  # every layer compiled: numpy views of the rows, no torch op
            X0, Y, GY, L = self.np
            if readout_online.copy_row(j, as_numpy(x_t), X0):
                raise ValueError(f"OnlineLearner.step (step {lr.steps}) x_t: contains NaN values")
            for fn, args in self.fast:
                fn(j, *args)
            if (lr.loss is mse_step_loss and type(target_t) is torch.Tensor and target_t.dtype == self.GY.dtype
                    and target_t.dim() == 2 and target_t.is_contiguous() and not target_t.requires_grad):
                readout_online.mse_row(j, Y, target_t.numpy(), GY, L)
                return self._stepped(j, self.yrows[j], self.lrows[j])
        else:
            lr._check_nan(x_t, None)
            self.X[0][j].copy_(x_t)
            with torch.no_grad():
                for l, tr in enumerate(lr.tracers):
                    out, new = advance(tr, self.X[l][j], self.rowstates[l][j])
                    for r, f in zip(self.S[l], new):
                        r[j + 1].copy_(f)
                    self.O[l][j].copy_(out)
        y = self.yrows[j]
        loss, g = (None, None) if target_t is None else self._loss(y, target_t)
        if loss is None:
            self.GY[j].zero_()
        else:
            self.GY[j].copy_(g)
            self.lrows[j].copy_(loss)
        return self._stepped(j, y, None if loss is None else self.lrows[j])

    def _stepped(self, j: int, y, loss):
        if loss is not None:
            self.any_loss = True
        self.j = j + 1
        self._sync_states()
        if self.j == self.W:
            self.flush()
        return y, loss

    def _loss(self, y, target_t):
        lr = self.learner
        vg = getattr(lr.loss, "value_and_grad", None)
        return step_loss(lr._closure(target_t, lr.steps), None if vg is None else (lambda yy: vg(yy, target_t)), y,
                         lr.steps)

    def flush(self) -> None:
        """The window's steps' gradient work as one block; the rows restart from the last state (new output rows)."""
        n = self.j
        if n == 0:
            return
        lr = self.learner
        B = self.X[0].shape[1]
        rows = lambda t, a, b: t[a:b].reshape((b - a) * B, *t.shape[2:])  # noqa: E731
        recs = [(rows(x, 0, n), type(st)(*(rows(r, 0, n) for r in S)), type(st)(*(rows(r, 1, n + 1) for r in S)),
                 rows(O, 0, n)) for x, S, O, st in zip(self.X, self.S, self.O, lr.states)]
        gy = self.GY[:n] if self.any_loss else None
        (compiled_block if lr._compiled_block else autograd_block)(lr, recs, gy, True, n, B)
        for S in self.S:
            for r in S:
                r[0].copy_(r[n])
        self.O[-1] = torch.empty_like(self.O[-1])  # the outputs handed out stay valid
        self._args()
        self.j, self.any_loss = 0, False
        self._sync_states()

    def pending(self) -> dict[str, torch.Tensor]:
        """The rows of the steps not yet worked (for a checkpoint)."""
        n, out = self.j, {}
        if n == 0 or self.gen != self.learner._gen:
            return out
        for l, (x, S, O) in enumerate(zip(self.X, self.S, self.O)):
            if l == 0:
                out["x"] = x[:n]
            out[f"out/{l}"] = O[:n]
            for f, r in enumerate(S):
                out[f"state/{l}/{f}"] = r[: n + 1]
        out["gy"] = self.GY[:n]
        out["loss"] = torch.tensor([self.any_loss])
        return out

    def restore(self, rows: dict[str, torch.Tensor]) -> None:
        """Put back :meth:`pending`'s rows (the learner's states are their last rows)."""
        self._bind()
        n = rows["x"].shape[0]
        if n >= self.W:
            raise ValueError(f"OnlineLearner checkpoint: {n} pending steps, the window holds {self.W}")
        self.X[0][:n].copy_(rows["x"])
        self.GY[:n].copy_(rows["gy"])
        for l, (S, O) in enumerate(zip(self.S, self.O)):
            O[:n].copy_(rows[f"out/{l}"])
            for f, r in enumerate(S):
                r[: n + 1].copy_(rows[f"state/{l}/{f}"])
        self.j, self.any_loss = n, bool(rows["loss"][0])
        self._sync_states()


for _kind in ("lif", "alif", "lru", "readout"):
    neurons.register_backend(_kind, "online_window (the step API's window of compiled steps, StepWindow.step)",
                             StepWindow.step, test="tests/test_online_compiled.py::test_compiled_stream_equals_reference_stream")

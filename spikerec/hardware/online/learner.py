"""Online gradient estimation for a stack of cells (Zucchet et al. 2023, "Online learning of long-range dependencies",
NeurIPS; thesis Zucchet 2025, Sec. 4.3.1-4.3.2 and Fig. 4.2; Bellec et al. 2020, "A solution to the learning dilemma
for recurrent networks of spiking neurons", Nat. Commun., Methods: eligibility traces).

Per step every layer advances from its *detached* previous state with detached parameters in its state update, so
the loss ``l_t`` is backpropagated *spatially* (input -> state -> output -> next layer -> loss), giving ``g^l_t = d
l_t / d s^l_t``, which each traced layer contracts with its eligibility traces (:mod:`.traces`). Exact (float64;
:meth:`exactness`): one recurrent layer under a memoryless readout, and the last recurrent layer and everything
above; earlier ones are biased (thesis Sec. 4.3.2), but the layer under a leaky readout is exact by its
readout-filtered traces (:mod:`.readout_filter`); cells without traces learn by 1-step truncation. Backends: the
torch reference (per-step autograd) and the compiled step window (:mod:`.window`) and block (:mod:`.block`).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

from ...layers.base import match_input_dtype
from .block import autograd_block, compiled_block, compiled_supported, loss_errors, scan_rows, step_loss
from .kinds import online_trace, registered_kinds
from .losses import (bptt_loss, classification_loss, cross_entropy_step_loss, mse_loss,  # noqa: F401 (re-exported)
                     mse_step_loss)
from .readout_filter import ReadoutFilter
from .subnormal import flush_subnormals, with_flushed_subnormals
from .traces import GenericTrace, TraceState, advance, stack_grads, stream_step
from .traces_readout import ReadoutTrace
from .window import StepWindow, window_steps
from ...kernels.trace_numba import numba_available
from ...kernels.trace_triton import triton_available

__all__ = ["OnlineLearner", "RULES", "MODES", "BACKENDS", "StepResult", "classification_loss", "mse_loss",
           "mse_step_loss", "cross_entropy_step_loss", "bptt_loss"]

RULES = ("full", "spatial", "trunc1", "snap1", "bptt")
MODES = ("stream", "chunked", "parallel")
BACKENDS = ("auto", "reference", "compiled")


class StepResult(NamedTuple):
    """:meth:`OnlineLearner.step`'s readout ``output [B, K]`` and loss (0-d; ``None`` without a target), detached."""

    output: torch.Tensor
    loss: torch.Tensor | None


class OnlineLearner:
    """Online (eligibility-trace) gradients for a stack of cells.

    Args:
        model: a stack with ``layers`` (cells incl. the readout), ``initial_state``, ``input_size`` and optional
            ``dropout`` (a :class:`~spikerec.models.RecurrentStack`).
        rule: ``full`` (exact in-layer RTRL + spatial errors), ``snap1`` (extended SnAp-1; identical on these
            independent-module layers), ``trunc1``, ``spatial`` or ``bptt`` (autograd through time,
            :meth:`backward` only: the reference).
        mode: ``stream`` (one step at a time; memory independent of T), ``chunked`` (blocks of ``chunk`` steps, the
            same estimator; :meth:`step` returns outputs at once and works a block when it is full), ``parallel``
            (the whole sequence as one block, :meth:`backward` only: the offline reference).
        loss: the per-step loss ``loss(y_t, target_t) -> scalar`` of :meth:`step`.
        optimizer, update_every: :meth:`update` steps the optimiser; ``update_every`` ``None`` (only when called),
            an int ``K`` (every K steps) or ``"sequence"`` (at every :meth:`reset`).
        backend: ``auto`` (compiled where the stack and device allow, else the reference), ``reference`` or
            ``compiled`` (an error says why where it cannot run); numba on the CPU, Triton on CUDA
            (:meth:`supported_backends`). The compiled stream works its gradient in blocks of
            :func:`.window.window_steps` steps.
        readout_filter: readout-filtered traces in the LIF, ALIF or LRU layer directly under a leaky readout
            (:mod:`.readout_filter`), exact where its own traces are. ``None``: wherever they apply (rule
            ``full``/``snap1``, no dropout); ``True``: required; ``False``: off.
    """

    def __init__(self, model, rule: str = "full", mode: str = "stream", chunk: int | None = None, *,
                 loss: Callable | None = None, optimizer=None, update_every=None, backend: str = "auto",
                 readout_filter: bool | None = None):
        if rule not in RULES:
            raise ValueError(f"OnlineLearner: rule must be one of {RULES}, got {rule!r}")
        if mode not in MODES:
            raise ValueError(f"OnlineLearner: mode must be one of {MODES}, got {mode!r}")
        if backend not in BACKENDS:
            raise ValueError(f"OnlineLearner: backend must be one of {BACKENDS}, got {backend!r}")
        if mode == "chunked" and (chunk is None or int(chunk) < 1):
            raise ValueError(f"OnlineLearner: mode 'chunked' needs chunk >= 1, got {chunk!r}")
        if chunk is not None and mode != "chunked":
            raise ValueError(f"OnlineLearner: chunk is only used with mode 'chunked' (got mode {mode!r})")
        if not (update_every is None or update_every == "sequence"
                or (isinstance(update_every, int) and not isinstance(update_every, bool) and update_every >= 1)):
            raise ValueError(f"OnlineLearner: update_every must be None, a positive int or 'sequence', "
                             f"got {update_every!r}")
        if not all(hasattr(model, a) for a in ("layers", "initial_state", "input_size")):
            raise TypeError(f"OnlineLearner: model must be a stack of cells such as a RecurrentStack (with "
                            f"'layers', 'initial_state' and 'input_size'), got {type(model).__name__}")
        if readout_filter not in (None, True, False):
            raise ValueError(f"OnlineLearner: readout_filter must be None, True or False, got {readout_filter!r}")
        self.model, self.rule, self.mode, self.backend = model, rule, mode, backend
        self.chunk = int(chunk) if chunk is not None else None
        self.loss, self.optimizer, self.update_every = loss, optimizer, update_every
        self.tracers = [] if rule == "bptt" else [online_trace(c, rule, i) for i, c in enumerate(model.layers)]
        self._filter = None if readout_filter is False else self._readout_filter(required=readout_filter is True)
        self.states = None  # no stream yet
        self.steps = self.since_update = 0
        self._target_shape = self._x_shape = self._versions = self._window = None
        self._gen = 0  # bumped when the states or the parameter-derived constants are replaced
        self._all_params = list(model.parameters())
        self._dtype = self._all_params[0].dtype if self._all_params else torch.get_default_dtype()
        self._dropout = getattr(model, "dropout", None)
        self._check_params = False
        dev = self._all_params[0].device if self._all_params else torch.device("cpu")
        if backend == "compiled" and "compiled" not in self.supported_backends(dev):
            raise RuntimeError(f"OnlineLearner: backend 'compiled' on {dev.type} needs "
                               f"{'Triton' if dev.type == 'cuda' else 'numba'} (pip install 'spikerec[fast]'); "
                               f"use backend='auto' or 'reference'")
        for tr in self.tracers:
            tr.compiled = backend != "reference"

    def _readout_filter(self, required: bool) -> ReadoutFilter | None:
        """The readout filter where it applies, else ``None`` (``required``: an error saying why)."""
        why = None
        drop = getattr(self.model, "dropout", None)
        if self.rule not in ("full", "snap1"):
            why = f"rule 'full' or 'snap1' (got {self.rule!r})"
        elif len(self.tracers) < 2 or not isinstance(self.tracers[-1], ReadoutTrace):
            why = "a leaky readout (LeakyReadout with tau) as the last layer"
        elif getattr(getattr(self.tracers[-2], "online_kind", None), "readout_filter", None) is None:
            kinds = ", ".join(k.cell.__name__ for k in registered_kinds() if k.readout_filter is not None)
            why = (f"a layer of a kind with readout-filtered traces ({kinds}) under the readout, got "
                   f"{type(self.tracers[-2].cell).__name__}")
        elif not required and drop is not None and getattr(drop, "p", 0.0) > 0:
            why = "a model without dropout"
        if why is not None:
            if required:
                raise ValueError(f"OnlineLearner: readout_filter=True needs {why}")
            return None
        tr = self.tracers[-2]
        return tr.online_kind.readout_filter(tr, self.tracers[-1].cell)

    @staticmethod
    def supported_backends(device="cpu") -> tuple[str, ...]:
        """The backends that run on ``device``: ``reference``; ``compiled`` with numba (CPU) or Triton (CUDA)."""
        dev = torch.device(device)
        ok = numba_available() if dev.type == "cpu" else (dev.type == "cuda" and triton_available(
            torch.empty(0, device=dev)))
        return ("reference", "compiled") if ok else ("reference",)

    @property
    def _compiled(self) -> bool:
        return self.backend != "reference"

    @property
    def _compiled_block(self) -> bool:
        """Whether blocks run :func:`.block.compiled_block` (else the autograd reference block)."""
        return self._compiled and compiled_supported(self)

    @property
    def traces(self) -> list:
        """The layers' trace states (:class:`.traces.TraceState`), the window's pending steps worked first."""
        if self._window is not None and self._window.j:
            with torch.no_grad(), flush_subnormals():
                self._flush_window()
        return self._trace_states  # AttributeError before the first stream

    @traces.setter
    def traces(self, value: list) -> None:
        self._trace_states = value

    def exactness(self) -> list[tuple[int, str, str]]:
        """``(layer index, cell kind, how its gradient is estimated)`` per layer (exact in the traced layers; lateral
        weights: e-prop; other cells: 1-step truncation; below a recurrent layer: biased, unless readout-filtered)."""
        if self.rule == "bptt":
            return [(i, type(c).__name__, "BPTT (autograd through time)") for i, c in enumerate(self.model.layers)]
        out = []
        stateful = [not (isinstance(tr, GenericTrace) and tr.stateless) for tr in self.tracers]
        for i, tr in enumerate(self.tracers):
            if isinstance(tr, GenericTrace) and tr.stateless:
                how = "stateless (exact)"
            elif self.rule == "spatial":
                how = "spatial only (recurrent paths cut)"
            elif isinstance(tr, GenericTrace) or self.rule == "trunc1":
                how = "1-step truncation (approximation: no traces)"
            elif getattr(tr.cell, "recurrent_weight", None) is not None:
                how = "e-prop traces (approximation: lateral paths between neurons dropped)"
            else:
                how = tr.online_kind.exactness
            if self._filter is not None and tr is self._filter.tr:
                how += "; readout-filtered traces: the leaky readout's errors of every later step reach it"
            elif stateful[i] and any(stateful[i + 1:]):
                how += ("; the layer's gradient is biased: errors from the recurrent layers above arrive through "
                        "the current step only")
            out.append((i, type(tr.cell).__name__, how))
        return out

    # --- the streaming interface ----------------------------------------------------------------
    @with_flushed_subnormals
    def step(self, x_t: torch.Tensor, target_t=None) -> StepResult:
        """Advance the stream by one step ``x_t [B, C]``; with ``target_t`` the loss ``loss(y_t, target_t)`` adds its
        gradient estimate. Returns ``StepResult(output, loss)``; subnormals flushed to zero (:mod:`.subnormal`)."""
        if self.rule == "bptt" or self.mode == "parallel":
            raise ValueError(f"OnlineLearner.step: rule {self.rule!r} / mode {self.mode!r} needs the whole "
                             f"sequence; use backward(), or rule 'full' with mode 'stream' or 'chunked'")
        drop = self._dropout
        per_step = (drop is not None and drop.training) or (self.mode == "stream" and not self._compiled)
        x_t = self._check_step(x_t, None, nan=per_step)
        if self._check_params:
            self._sync_params()
        if target_t is not None:
            if self.loss is None:
                raise ValueError("OnlineLearner.step: a target was given but the learner has no loss; "
                                 "pass loss=fn(y_t, target_t) to OnlineLearner(...)")
            self._check_target(target_t)
        if per_step:  # the reference stream; active dropout: the output and the gradient share one mask
            self._flush_window()
            y, l = self._stream([x_t], [self._closure(target_t, self.steps)])
        else:
            w = self._window
            if w is None:
                w = self._window = StepWindow(self, self.chunk or window_steps(self))
            y, l = w.step(x_t, target_t)
        self.steps += 1
        self.since_update += 1
        if isinstance(self.update_every, int) and self.since_update >= self.update_every:
            self.update()
        return StepResult(y, l)

    def _flush_window(self) -> None:
        """Do the gradient work of the window's pending steps."""
        if self._window is not None and self._window.j:
            self._window.flush()

    def reset(self, batch_mask=None) -> None:
        """Sequence boundary: reset the states and traces of the samples in ``batch_mask`` (bool ``[B]``; ``None`` =
        all). Accumulated gradients are kept; with ``update_every="sequence"`` :meth:`update` is called."""
        if self.states is None:
            if batch_mask is not None:
                raise ValueError("OnlineLearner.reset: batch_mask given before the first step (no stream yet)")
            return
        B = self.states[0][0].shape[0]
        mask = self._mask(batch_mask, B, "reset")
        self._flush_window()
        init = self.model.initial_state(B, self.states[0][0].device, self.states[0][0].dtype)
        if mask is None:
            self.states = [type(s)(*(f.clone() for f in s)) for s in init]
            for ts in self._traces:
                ts.clear()
            self.steps = 0
        else:
            m = lambda f: mask.view(-1, *([1] * (f.dim() - 1)))  # noqa: E731
            self.states = [type(s)(*(torch.where(m(f), i, f) for f, i in zip(s, si))) for s, si in zip(self.states, init)]
            self._zero_traces(mask)
        self._target_shape = None
        self._gen += 1
        if self.update_every == "sequence":
            self.update()

    def truncate(self, batch_mask=None) -> None:
        """Cut the gradient paths through the past: the traces of the samples in ``batch_mask``
        (``None`` = all) are set to zero; states and accumulated gradients are kept."""
        if self.states is None:
            return
        mask = self._mask(batch_mask, self.states[0][0].shape[0], "truncate")
        self._flush_window()
        if mask is None:
            for ts in self._traces:
                ts.clear()
        else:
            self._zero_traces(mask)

    def update(self) -> None:
        """Add the accumulated estimate to ``.grad`` and, with an optimiser, step it and zero its gradients; the
        constants are re-derived (without an optimiser: at the next step if ``update(); opt.step()`` changed them)."""
        self._flush_window()
        self._flush()
        self.since_update = 0
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad()
            self._prepare()
        else:
            self._check_params = True

    def discard(self) -> None:
        """Drop the accumulated (not yet applied) gradient estimate."""
        self._flush_window()
        self.spatial = {}
        for ts in self._traces:
            ts.G, ts.gv, ts.gv_names = {}, None, ()

    def refresh(self) -> None:
        """Re-derive the constants after the parameters changed other than by :meth:`update` (pending steps first)."""
        self._flush_window()
        self._prepare()

    # --- the batch form -------------------------------------------------------------------------
    @with_flushed_subnormals
    def backward(self, x: torch.Tensor, target, loss_fn: Callable) -> float:
        """Add the rule's gradient estimate of ``L = sum_t loss_fn(y_t, target, t)`` to ``.grad`` over
        a fresh stream of the whole ``x [T, B, C]``; returns ``L`` as a float."""
        name = "OnlineLearner input x"
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.model.input_size:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name}: expected shape [T, B, {self.model.input_size}] (time-first), got {got}")
        if x.is_complex():
            raise TypeError(f"{name}: expected a real tensor, got dtype {x.dtype}")
        x = match_input_dtype(x, self._dtype, name)
        if self.rule == "bptt":
            if x.is_floating_point() and torch.isnan(x).any():
                raise ValueError(f"{name}: contains NaN values")
            total = bptt_loss(self.model, x, target, loss_fn)
            total.backward()
            return float(total.detach())
        T = x.shape[0]
        self._start(x.shape[1], x.device, x.dtype)
        drop = self._dropout
        per_step = (drop is not None and drop.training) or (self.mode == "stream" and not self._compiled)
        K = 1 if per_step else (T if self.mode == "parallel" else (self.chunk or window_steps(self)))
        if not per_step:
            self._check_nan_block(x, 0)
        total = 0.0
        for t0 in range(0, T, K):
            t1 = min(T, t0 + K)
            if per_step:
                self._check_step(x[t0], f"OnlineLearner input x (step {t0})", start=False)
                _, l = self._stream([x[t0]], [lambda y, t=t0: loss_fn(y, target, t)])
            else:
                l = self._block(x[t0:t1], target, loss_fn, t0, carry=t1 < T)
            if l is not None:
                total += float(l)
            self.steps += t1 - t0
        self._flush()
        return total

    def _block(self, x, target, loss_fn, t0: int, carry: bool):
        """One block of :meth:`backward` (rows, loss errors, gradient work); its summed loss or ``None``."""
        K, B, t1 = x.shape[0], x.shape[1], t0 + x.shape[0]
        compiled = self._compiled_block
        with torch.no_grad():
            recs, y = scan_rows(self, x, compiled)
        vg = getattr(loss_fn, "value_and_grad", None) if compiled else None  # the reference: autograd
        bvg = getattr(loss_fn, "block_value_and_grad", None) if vg is not None else None
        block = getattr(loss_fn, "block", None) if not compiled else None
        if bvg is not None:
            block_vg = lambda Y: bvg(Y, target, t0, t1)  # noqa: E731
        elif block is not None:  # the block's loss in one op, one autograd call
            block_vg = lambda Y: step_loss(lambda yl: block(yl, target, t0, t1), None, Y)  # noqa: E731
        else:
            block_vg = None
        steps = [] if block_vg is not None else [
            (lambda yy, t=t: loss_fn(yy, target, t), None if vg is None else (lambda yy, t=t: vg(yy, target, t)))
            for t in range(t0, t1)]
        total, gy = loss_errors(y, steps, block_vg)
        (compiled_block if compiled else autograd_block)(self, recs, gy, carry, K, B)
        return total

    # --- checkpoint -----------------------------------------------------------------------------
    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The stream state as ``(tensors, meta)``: layer states, traces, accumulators, counters and the window's
        pending steps as they are (not worked early: a resumed run does the same arithmetic as one uninterrupted)."""
        meta = {"rule": self.rule, "mode": self.mode, "chunk": self.chunk, "steps": self.steps,
                "since_update": self.since_update, "started": self.states is not None,
                "readout_filter": self._filter is not None,
                "target_shape": None if self._target_shape is None else list(self._target_shape)}
        tensors: dict[str, torch.Tensor] = {}
        if self.states is None:
            return tensors, meta
        meta["state_fields"] = [list(type(s)._fields) for s in self.states]
        for l, s in enumerate(self.states):
            for f, v in zip(type(s)._fields, s):
                tensors[f"state/{l}/{f}"] = v
        meta["trace_names"] = [list(ts.names) for ts in self._trace_states]
        meta["acc_vec_names"] = [list(ts.gv_names) for ts in self._trace_states]
        for l, ts in enumerate(self._trace_states):
            for kind, v in (("trace_vec", ts.ev), ("acc_vec", ts.gv)):
                if v is not None:
                    tensors[f"{kind}/{l}"] = v
            for kind, d in (("trace_mat", ts.mat), ("acc", ts.G), ("trace_filt", ts.filt)):
                for n, v in d.items():
                    tensors[f"{kind}/{l}/{n}"] = v
        names = {p: n for n, p in self.model.named_parameters()}
        for p, v in self.spatial.items():
            tensors[f"spatial/{names[p]}"] = v
        if self._window is not None:
            for k, v in self._window.pending().items():
                tensors[f"window/{k}"] = v
        return tensors, meta

    def check_state_meta(self, meta: dict) -> None:
        """Refuse a stream state this learner cannot resume (another rule, mode, chunk or readout-filter
        setting, or an earlier format), before anything is restored."""
        for k in ("rule", "mode", "chunk"):
            if meta.get(k) != getattr(self, k):
                raise ValueError(f"OnlineLearner checkpoint: {k} is {meta.get(k)!r}, this learner has "
                                 f"{getattr(self, k)!r}")
        if meta["started"] and bool(meta.get("readout_filter")) != (self._filter is not None):
            raise ValueError(f"OnlineLearner checkpoint: the stream was saved with readout_filter="
                             f"{bool(meta.get('readout_filter'))}, this learner has it "
                             f"{'on' if self._filter is not None else 'off'}; make the learner with readout_filter="
                             f"{bool(meta.get('readout_filter'))} to resume it (the filtered traces carry the stream's past)")
        if meta["started"] and "trace_names" not in meta:
            raise ValueError("OnlineLearner checkpoint: written by an earlier version (per-name eligibility traces); "
                             "resume the stream with that version")

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Restore what :meth:`state_tensors` returned (same model, rule and mode), after the model's parameters."""
        self.check_state_meta(meta)
        self._prepare()
        self.steps, self.since_update = int(meta["steps"]), int(meta["since_update"])
        self._target_shape = None if meta["target_shape"] is None else tuple(meta["target_shape"])
        self._window = None
        if not meta["started"]:
            self.states = self._x_shape = None
            return
        fields = meta["state_fields"]
        if len(fields) != len(self.model.layers):
            raise ValueError(f"OnlineLearner checkpoint: {len(fields)} layer states, the model has "
                             f"{len(self.model.layers)} layers")
        s0 = tensors[f"state/0/{fields[0][0]}"]
        init = self.model.initial_state(s0.shape[0], s0.device, s0.dtype)
        self.states = []
        for l, (s, names) in enumerate(zip(init, fields)):
            if list(type(s)._fields) != list(names):
                raise ValueError(f"OnlineLearner checkpoint: layer {l} state fields {names}, the model's are "
                                 f"{list(type(s)._fields)}")
            self.states.append(type(s)(*(tensors[f"state/{l}/{f}"].clone() for f in names)))
        self._x_shape = torch.Size((s0.shape[0], self.model.input_size))
        self._begin_traces()
        named = dict(self.model.named_parameters())
        window = {}
        for key, v in tensors.items():
            kind, _, rest = key.partition("/")
            l, _, n = rest.partition("/")
            ts = self._trace_states[int(l)] if kind.startswith(("trace_", "acc")) else None
            if kind == "trace_vec":
                ts.ev, ts.names = v.clone(), tuple(meta["trace_names"][int(l)])
            elif kind == "acc_vec":
                ts.gv, ts.gv_names = v.clone(), tuple(meta["acc_vec_names"][int(l)])
            elif ts is not None:
                {"trace_mat": ts.mat, "acc": ts.G, "trace_filt": ts.filt}[kind][n] = v.clone()
            elif kind == "spatial":
                if rest not in named:
                    raise ValueError(f"OnlineLearner checkpoint: accumulated gradient of unknown parameter {rest!r}")
                self.spatial[named[rest]] = v.clone()
            elif kind == "window":
                window[rest] = v
        self._gen += 1
        if window:
            self._window = StepWindow(self, self.chunk or window_steps(self))
            self._window.restore(window)

    # --- internals ------------------------------------------------------------------------------
    @property
    def _traces(self):
        return self.__dict__.get("_trace_states", [])

    def _mask(self, batch_mask, B, what):
        if batch_mask is None:
            return None
        m = torch.as_tensor(batch_mask)
        if m.dim() != 1 or m.shape[0] != B:
            raise ValueError(f"OnlineLearner.{what}: batch_mask must have shape [{B}] (one flag per sample of "
                             f"the stream's batch), got {tuple(m.shape)}")
        if m.dtype != torch.bool:
            raise ValueError(f"OnlineLearner.{what}: batch_mask must be a bool tensor, got dtype {m.dtype}")
        return m.to(self.states[0][0].device)

    def _zero_traces(self, mask):
        keep = (~mask).to(self._dtype)
        for ts in self._traces:
            if ts.ev is not None:  # [m, B, k, N]
                ts.ev = ts.ev * keep.view(1, -1, 1, 1)
            for v in ts.mat.values():  # [N, B, k, H]
                v.mul_(keep.view(1, -1, 1, 1).to(v.dtype))
            for n, v in ts.filt.items():  # [B, ...]; a filtered matrix trace ("../mat/..") [N, B, ..]
                d = 1 if "/mat/" in n else 0
                v.mul_(keep.view(*([1] * d), -1, *([1] * (v.dim() - 1 - d))).to(v.dtype))

    def _check_nan(self, x_t, name):
        """Raise for NaN in the step input ``x_t`` (``name`` ``None``: the current step's)."""
        if not x_t.is_floating_point() or not math.isnan(float(x_t.detach().sum())) or not bool(torch.isnan(x_t).any()):
            return  # a NaN makes the sum NaN: one reduction decides (then look, for inf - inf)
        raise ValueError(f"{name or f'OnlineLearner.step (step {self.steps}) x_t'}: contains NaN values")

    def _check_nan_block(self, xb, t0):
        """:meth:`_check_nan` of the steps of ``xb [K, B, C]`` by one reduction (the error names the step)."""
        if not xb.is_floating_point() or not math.isnan(xb.detach().sum().item()):
            return
        for k in range(xb.shape[0]):
            if bool(torch.isnan(xb[k]).any()):
                raise ValueError(f"OnlineLearner input x (step {t0 + k}): contains NaN values")

    def _check_step(self, x_t, name, start=True, nan=True):
        """Check one step's input and return it in the parameters' dtype (boolean and integer spikes
        are cast; a floating input of another precision is an error); starts the stream."""
        if type(x_t) is torch.Tensor and x_t.shape == self._x_shape and x_t.dtype == self._dtype:
            if nan:  # the usual step: a tensor of the stream's shape and dtype
                self._check_nan(x_t, name)
            return x_t
        C = self.model.input_size
        name = name or f"OnlineLearner.step (step {self.steps}) x_t"
        if not isinstance(x_t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor of shape [B, {C}], got {type(x_t).__name__}")
        if x_t.dim() != 2 or x_t.shape[-1] != C:
            raise ValueError(f"{name}: expected shape [B, {C}], got {tuple(x_t.shape)}")
        if x_t.is_complex():
            raise TypeError(f"{name}: expected a real tensor, got dtype {x_t.dtype}")
        x_t = match_input_dtype(x_t, self._dtype, name)
        if self.states is None:
            if start:
                self._start(x_t.shape[0], x_t.device, x_t.dtype)
        elif x_t.shape[0] != self.states[0][0].shape[0]:
            raise ValueError(f"{name}: batch size {x_t.shape[0]}, but the stream runs with batch "
                             f"{self.states[0][0].shape[0]} (call reset() on a new learner for another batch size)")
        if nan:
            self._check_nan(x_t, name)
        return x_t

    def _check_target(self, target_t):
        known = self._target_shape
        if known is not None and type(target_t) is torch.Tensor and target_t.is_floating_point() and target_t.shape == known:
            return  # a floating target of the shape the stream's first target was checked with
        name = f"OnlineLearner.step (step {self.steps}) target_t"
        if not isinstance(target_t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(target_t).__name__}")
        B = self.states[0][0].shape[0]
        if target_t.dim() == 0 or target_t.shape[0] != B:
            raise ValueError(f"{name}: expected a batch-first target with {B} samples, got shape "
                             f"{tuple(target_t.shape)}")
        out = self.tracers[-1].cell.output_size
        if target_t.is_floating_point() and target_t.dim() == 2 and target_t.shape[1] != out:
            raise ValueError(f"{name}: expected shape [{B}, {out}] (the readout's size), got {tuple(target_t.shape)}")
        if target_t.dim() == 1 and not (target_t.is_floating_point() or target_t.is_complex()
                                        or target_t.dtype == torch.bool):
            bad = (target_t != -100) & ((target_t < 0) | (target_t >= out))  # -100: ignored, as in cross_entropy
            if bool(bad.any()):
                raise ValueError(f"{name}: class labels must lie in [0, {out - 1}] (the readout's {out} outputs) or "
                                 f"be -100 (ignored), got {int(target_t[bad][0])}")
        if self._target_shape is None:
            self._target_shape = tuple(target_t.shape)
        elif tuple(target_t.shape) != self._target_shape:
            raise ValueError(f"{name}: shape {tuple(target_t.shape)} differs from the stream's earlier targets "
                             f"{self._target_shape}")

    def _closure(self, target_t, step_no):
        """The step's loss as a function of the output (``None`` without a target)."""
        if target_t is None:
            return None
        loss = self.loss

        def closure(y):
            try:
                return loss(y, target_t)
            except (RuntimeError, ValueError, IndexError) as e:
                raise ValueError(f"OnlineLearner.step (step {step_no}): the loss failed on output "
                                 f"{tuple(y.shape)} and target {tuple(target_t.shape)}: {e}") from None
        return closure

    def _start(self, B, device, dtype):
        """A fresh stream: initial states, empty traces and accumulators."""
        self.states = list(self.model.initial_state(B, device, dtype))
        self._x_shape = torch.Size((B, self.model.input_size))
        self._prepare()
        self._begin_traces()
        self.steps = self.since_update = 0
        self._target_shape = self._window = None

    def _begin_traces(self):
        self.traces = [TraceState(tr) for tr in self.tracers]
        self.spatial = {}
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.frozen = set()
        for tr in self.tracers:
            if isinstance(tr, GenericTrace):
                self.frozen |= tr.frozen
        if self._filter is not None:  # their spatial partials are replaced by the filtered ones
            self.frozen |= {id(p) for p in self._filter.tr.cell.parameters()}
        if self.backend == "compiled" and not self._compiled_block:
            raise ValueError("OnlineLearner: backend 'compiled' needs a stack of LIF, ALIF or LRU layers with a leaky "
                             "or linear readout and no active dropout; use backend='auto' or 'reference'")

    def _prepare(self):
        self._gen += 1
        for tr in self.tracers:
            tr.prepare()
        self._versions = tuple(p._version for p in self._all_params)

    def _sync_params(self) -> None:
        """Re-derive the constants if the parameters changed (after :meth:`update` without an optimiser)."""
        self._check_params = False
        if tuple(p._version for p in self._all_params) != self._versions:
            self._prepare()

    def _add_spatial(self, grads) -> None:
        """Accumulate the immediate (spatial) partials of the parameters, one per ``self.params``."""
        for p, gp in zip(self.params, grads):
            if gp is not None and id(p) not in self.frozen:
                self.spatial[p] = self.spatial[p].add_(gp) if p in self.spatial else gp.clone()

    def _forward_step(self, x_t):
        """One step of every layer with the spatial graph; returns ``(y_t, [(input, prev, new)])``."""
        h, recs = x_t, []
        n_cells = len(self.tracers) - 1
        drop = self._dropout
        for l, tr in enumerate(self.tracers):
            prev = self.states[l]
            out, new = advance(tr, h, prev, fresh=True)
            recs.append((h.detach(), prev, new))
            self.states[l] = type(new)(*(s.detach() for s in new))
            h = out
            if l < n_cells and drop is not None:
                h = drop(h)
        return h, recs

    def _stream(self, xs, losses):
        """The reference stream over ``xs`` (autograd, torch partials, :func:`.traces.stream_step`); ``(y, loss)``."""
        total, all_recs, y = None, [], None
        for k, (x_t, lf) in enumerate(zip(xs, losses)):
            y, recs = self._forward_step(x_t)
            all_recs.append(recs)
            l = lf(y) if lf is not None else None
            if l is not None:
                if l.dim() != 0:
                    raise ValueError(f"loss must return a scalar at step {self.steps + k}, got shape {tuple(l.shape)}")
                total = l if total is None else total + l
        traced = [i for i, tr in enumerate(self.tracers) if tr.traced]
        gs = {i: [None] * len(xs) for i in traced}
        if total is not None and total.requires_grad:
            inputs = [s for recs in all_recs for i in traced for s in recs[i][2]]
            grads = torch.autograd.grad(total, inputs + self.params, allow_unused=True)
            self._add_spatial(grads[len(inputs):])
            it = iter(grads[: len(inputs)])
            for k, recs in enumerate(all_recs):
                for i in traced:
                    g = [next(it) for _ in recs[i][2]]
                    if any(v is not None for v in g):
                        gs[i][k] = stack_grads(g, recs[i][2])
        filt = self._filter
        if filt is not None and self._dropout is not None and self._dropout.training:
            raise ValueError("OnlineLearner: readout_filter=True does not support active dropout "
                             "(call model.eval() or drop the filter)")
        with torch.no_grad():
            for i in traced:
                tr, ts = self.tracers[i], self._trace_states[i]
                for k, (recs, g) in enumerate(zip(all_recs, gs[i])):
                    x_in, prev, new = recs[i]
                    new = type(new)(*(v.detach() for v in new))
                    P = tr.partials(x_in, prev, new)
                    filtered = filt is not None and tr is filt.tr
                    stream_step(ts, P, None if filtered else g)
                    if filtered:  # the readout's learning signal d l_t / d y_t, through the filtered traces
                        d = gs[len(self.tracers) - 1][k]
                        filt.step(ts, P, x_in, new, None if d is None else d[..., 0])
        return y.detach(), (None if total is None else total.detach())

    def _flush(self):
        """Add the estimate to ``.grad``; parameters the rule does not train get a zero gradient (not ``None``)."""
        if "_trace_states" not in self.__dict__:
            return
        with torch.no_grad():
            extra: dict = {}
            for ts in self._trace_states:
                for name, G in ts.take().items():
                    p = ts.tr.params[name]
                    extra[p] = extra[p] + G if p in extra else G
            for p in self.params:
                g = self.spatial.get(p)
                if p in extra:
                    g = extra[p] if g is None else g + extra[p]
                if p.grad is None:
                    p.grad = torch.zeros_like(p) if g is None else g.detach().clone()
                elif g is not None:
                    p.grad += g
            self.spatial = {}

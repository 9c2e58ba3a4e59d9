"""Online gradient estimation for a stack of cells (Zucchet et al. 2023, "Online learning of
long-range dependencies", NeurIPS; thesis Zucchet 2025, Sec. 4.3.1-4.3.2 and Fig. 4.2; Bellec
et al. 2020, "A solution to the learning dilemma for recurrent networks of spiking neurons",
Nat. Commun., Methods: eligibility traces).

Per time step ``t``:

1. every layer is advanced from its *detached* previous state (recurrent edges cut) with
   its parameters detached inside the state update, so the step's autograd graph only
   carries the spatial path input -> state -> output -> next layer -> loss;
2. the instantaneous loss ``l_t`` is backpropagated *spatially*, giving
   ``g^l_t = d l_t / d s^l_t`` for every layer and ``d l_t / d theta`` through the output
   maps (readout weights, LRU ``C``/``D``, LIF thresholds in the spike read-out, ...);
3. each traced layer contracts ``g^l_t`` with its eligibility traces (:mod:`.traces_base`).

The streaming interface carries everything across calls::

    learner = OnlineLearner(model, loss=lambda y, tgt: F.mse_loss(y, tgt, reduction="sum"),
                            optimizer=opt, update_every=100)
    for x_t, target_t in stream:                      # x_t [B, C]; one step at a time, forever
        y_t, l_t = learner.step(x_t, target_t)
        if some_samples_ended:
            learner.reset(ended_mask)                 # per-sample sequence boundary

The gradient estimate is the sum over steps of the terms above; it is accumulated inside the
learner and written into ``.grad`` (added, like ``loss.backward()``) by :meth:`OnlineLearner.update`,
which also steps the optimiser when one was given. ``update_every=K`` calls it every K steps,
``update_every="sequence"`` at every :meth:`reset`, ``None`` only when called. After an
optimiser step the traces mix parameter versions (the "real-time" variant of Williams & Zipser
1989, as opposed to accumulating over the whole sequence).
:meth:`OnlineLearner.backward` is the batch convenience on top: a fresh stream over a whole
``[T, B, C]`` sequence, the estimate added to ``.grad`` at the end.

Loss convention: the total loss is ``L = sum_t l_t`` over the readout outputs ``y_t [B, K]``.
For :meth:`backward` the per-step loss is ``loss_fn(y_t, target, t)`` (``None`` at steps without
a loss); for :meth:`step` it is ``loss(y_t, target_t)``. For classification use
:func:`classification_loss`: ``mean`` readout -> per-step cross-entropy of the label at every step,
averaged over T; ``last`` -> cross-entropy at the last step only; ``per_step`` -> one label per step.
A loss on the time-*mean* of the readout is not a per-step loss and cannot be learned online;
``rule="bptt"`` handles any loss.

Exactness (float64, see :meth:`OnlineLearner.exactness`): one recurrent layer with a memoryless
readout -> every parameter equals BPTT except those upstream of the recurrent layer; several
layers -> the last recurrent layer and everything downstream are exact, earlier layers are
biased (only their future error terms are missing; thesis Sec. 4.3.2). A *leaky*
readout is itself a traced recurrent layer, so it becomes the exact "last" layer; the LIF, ALIF
or LRU layer directly under it is exact too, by the readout-filtered traces it carries by default
(:mod:`.readout_filter`; ``readout_filter=False`` turns them off). Cells without eligibility traces (a GRU, any other cell that follows the cell protocol) learn with their
immediate partials only (1-step truncation; SnAp-1 of Menick et al. 2021 would keep a diagonal
trace): an approximation.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from ...layers.base import match_input_dtype
from .block import block_supported, compiled_chunk_block
from .cuda_graph import drop_graph, graph_ready, graph_step
from .whole_stack import WholeStackStep, any_nan, whole_stack_supported
from .spatial import compiled_kinds, compiled_stream_step, supported as compiled_supported
from .subnormal import flush_subnormals, with_flushed_subnormals
from .kinds import online_trace, registered_kinds
from .readout_filter import ReadoutFilter, reverse_readout_filter
from .traces_base import GenericTrace, TraceState, chunk_contract, stack_partials, stream_step
from .traces_lif import LIFTrace

__all__ = ["OnlineLearner", "RULES", "MODES", "BACKENDS", "StepResult", "classification_loss", "mse_loss", "mse_step_loss",
           "cross_entropy_step_loss", "bptt_loss"]

RULES = ("full", "spatial", "trunc1", "snap1", "bptt")
MODES = ("stream", "chunked", "parallel")
BACKENDS = ("auto", "reference", "compiled")


def matrix_trace_kernel(device: torch.device) -> Callable | None:
    """The compiled matrix-trace step of ``device`` (:func:`.traces_base.stream_step`'s
    ``kernel``): Triton on CUDA, numba on the CPU; ``None`` where its compiler is missing."""
    if device.type == "cuda":
        from ...kernels.trace_triton import mat_trace_step, triton_available

        return mat_trace_step if triton_available(torch.empty(0, device=device)) else None
    if device.type == "cpu":
        from ...kernels.trace_numba import mat_trace_step_numba, numba_available

        return mat_trace_step_numba if numba_available() else None
    return None


class StepResult(NamedTuple):
    """What :meth:`OnlineLearner.step` returns: the readout ``output [B, K]`` (detached) and the
    step's loss (a detached 0-d tensor, ``None`` without a target)."""

    output: torch.Tensor
    loss: torch.Tensor | None


# --- losses ---------------------------------------------------------------------------------


def classification_loss(readout_mode: str, steps: int) -> Callable:
    """Per-step cross-entropy for ``target [B]`` (or ``[T, B]`` with ``per_step``).

    * ``mean``: ``l_t = CE(y_t, target) / T`` at every step;
    * ``last``: ``l_{T-1} = CE(y_{T-1}, target)``, no loss elsewhere;
    * ``per_step``: ``l_t = CE(y_t, target[t]) / T``.
    """
    T = int(steps)
    if readout_mode == "mean":
        def mean(y, target, t):
            return F.cross_entropy(y, target) / T

        mean.value_and_grad = lambda y, target, t: _ce_value_and_grad(y, target, 1.0 / T)

        # all K steps of a block in one op: sum_k CE_mean(y_k) / T = K * CE_mean(all K*B rows) / T
        mean.block = lambda y, target, t0, t1: F.cross_entropy(
            y.flatten(0, 1), target.repeat(t1 - t0)) * ((t1 - t0) / T)
        return mean
    if readout_mode == "last":
        def last(y, target, t):
            return F.cross_entropy(y, target) if t == T - 1 else None

        last.value_and_grad = lambda y, target, t: _ce_value_and_grad(y, target, 1.0) if t == T - 1 else None
        return last
    if readout_mode == "per_step":
        def per_step(y, target, t):
            return F.cross_entropy(y, target[t]) / T

        per_step.value_and_grad = lambda y, target, t: _ce_value_and_grad(y, target[t], 1.0 / T)

        per_step.block = lambda y, target, t0, t1: F.cross_entropy(
            y.flatten(0, 1), target[t0:t1].flatten(0, 1)) * ((t1 - t0) / T)
        return per_step
    raise ValueError(f"classification_loss: readout mode '{readout_mode}' has no per-step form; "
                     f"use 'mean', 'last' or 'per_step' (or rule='bptt')")


def mse_loss(y, target, t):
    """``l_t = 0.5 * sum over batch and features of (y_t - target[t])^2`` for ``target [T, B, K]``."""
    return 0.5 * ((y - target[t]) ** 2).sum()


def _mse_value_and_grad(y, target_t):
    """``(0.5 sum (y - target)^2, y - target)``: the loss and its gradient in closed form."""
    d = torch.sub(y, target_t if target_t.dtype == y.dtype else target_t.to(y.dtype))
    flat = d.reshape(-1)
    return torch.dot(flat, flat).mul_(0.5), d


def _ce_value_and_grad(y, label, scale):
    """``scale * CE_mean(y, label)`` and its gradient ``scale * (softmax(y) - onehot(label)) / B``."""
    logp = torch.log_softmax(y, -1)
    B = y.shape[0]
    loss = -logp.gather(1, label.view(-1, 1)).sum() * (scale / B)
    g = logp.exp_()
    g[torch.arange(B, device=y.device), label] -= 1.0
    return loss, g.mul_(scale / B)


mse_loss.value_and_grad = lambda y, target, t: _mse_value_and_grad(y, target[t])


def mse_step_loss(y_t, target_t):
    """The per-step loss of :meth:`OnlineLearner.step`: ``0.5 * sum (y_t - target_t)^2`` over batch
    and features (``target_t [B, K]``). Its gradient is known in closed form, so the stream's
    compiled path needs no autograd call."""
    return 0.5 * ((y_t - target_t) ** 2).sum()


mse_step_loss.value_and_grad = _mse_value_and_grad


def cross_entropy_step_loss(scale: float = 1.0) -> Callable:
    """The per-step loss ``scale * CE(y_t, label_t)`` (mean over the batch; ``label_t [B]``) for
    :meth:`OnlineLearner.step`, with its gradient in closed form (``scale (softmax(y) - onehot) / B``)."""
    scale = float(scale)

    def ce(y_t, label_t):
        return F.cross_entropy(y_t, label_t) * scale

    ce.value_and_grad = lambda y, label: _ce_value_and_grad(y, label, scale)
    return ce


# A per-step loss may carry ``block(y [K, B, ...], target, t0, t1)``: the sum of its steps t0..t1-1
# in one op, which the chunked and parallel modes use instead of K separate loss graphs.
mse_loss.block = lambda y, target, t0, t1: 0.5 * ((y - target[t0:t1]) ** 2).sum()


# the summed loss of steps t0..t1-1 and its gradient Y - target[t0:t1], in one call
mse_loss.block_value_and_grad = lambda Y, target, t0, t1: _mse_value_and_grad(Y, target[t0:t1])


def bptt_loss(model, x, target, loss_fn):
    """``sum_t loss_fn(y_t, target, t)`` through the model's fast sequence path (graph kept)."""
    y, _ = model(x)
    total = None
    for t in range(y.shape[0]):
        l = loss_fn(y[t], target, t)
        if l is not None:
            total = l if total is None else total + l
    if total is None:
        raise ValueError("loss_fn returned None at every step: no loss to differentiate")
    return total


# --- the learner ----------------------------------------------------------------------------

class OnlineLearner:
    """Online (eligibility-trace) gradients for a stack of cells.

    Args:
        model: a stack with ``layers`` (cells incl. the readout), ``initial_state``, ``input_size``
            and optional ``dropout`` (a :class:`~spikerec.models.RecurrentStack`); any cell that
            follows the cell protocol (``initial_state``, ``step``, ``output``) may appear in it.
        rule: ``full`` (exact in-layer RTRL + spatial errors), ``snap1`` (extended SnAp-1;
            identical to ``full`` on these independent-module layers), ``trunc1``, ``spatial``
            or ``bptt`` (autograd through time over whole sequences, the reference; only
            :meth:`backward`).
        mode: ``stream`` (one step at a time; memory independent of T), ``chunked`` (blocks of
            ``chunk`` steps, one spatial backward and a reverse filter per block: the same
            estimator; :meth:`step` then returns outputs at once and does the gradient work of a
            block when it is full), ``parallel`` (one block of the whole sequence, only
            :meth:`backward`: the offline reference).
        chunk: block length for ``chunked``.
        loss: the per-step loss ``loss(y_t, target_t) -> scalar`` used by :meth:`step`.
        optimizer: stepped (and its gradients zeroed) by :meth:`update`.
        update_every: ``None`` (update only when :meth:`update` is called), an int ``K`` (every
            K steps) or ``"sequence"`` (at every :meth:`reset`).
        backend: ``auto`` (the compiled paths where the stack, the loss and the device allow them,
            else the reference), ``reference`` (the readable torch form: a per-step autograd
            spatial backward, torch partials, step loops; the specification the tests compare
            with) or ``compiled`` (the compiled stream step or chunked block; an error says why
            where it cannot be used). The compiler follows the device: numba on the CPU, Triton on
            CUDA (with the stream step replayed from a CUDA graph, :mod:`.cuda_graph`).
            :meth:`supported_backends` lists what runs here. A model switched to training mode
            with dropout in the middle of a stream continues on the reference path (which applies
            the dropout).
        readout_filter: carry readout-filtered eligibility traces in the LIF, ALIF or LRU layer
            directly under a leaky readout (:mod:`.readout_filter`; Bellec et al. 2020, Methods), which
            makes that layer's gradient exact where its own traces are (no lateral weights).
            ``None`` (the default): on wherever it applies (rule ``full``/``snap1``, a leaky
            readout over a LIF, ALIF or LRU layer, a model without dropout); ``True``: required
            (an error says what is missing); ``False``: off, the cheaper estimate that is biased
            for that layer. With the filter, ``chunked`` and ``parallel`` blocks carry the filtered
            traces across blocks (the same sums as ``stream``: :meth:`.readout_filter.ReadoutFilter.block`).
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
        if mode == "chunked":
            if chunk is None or int(chunk) < 1:
                raise ValueError(f"OnlineLearner: mode 'chunked' needs chunk >= 1, got {chunk!r}")
        elif chunk is not None and mode != "chunked":
            raise ValueError(f"OnlineLearner: chunk is only used with mode 'chunked' (got mode {mode!r})")
        if not (update_every is None or update_every == "sequence"
                or (isinstance(update_every, int) and not isinstance(update_every, bool) and update_every >= 1)):
            raise ValueError(f"OnlineLearner: update_every must be None, a positive int or 'sequence', "
                             f"got {update_every!r}")
        if not hasattr(model, "layers") or not hasattr(model, "initial_state") or not hasattr(model, "input_size"):
            raise TypeError(f"OnlineLearner: model must be a stack of cells such as a RecurrentStack (with "
                            f"'layers', 'initial_state' and 'input_size'), got {type(model).__name__}")
        self.model, self.rule, self.mode = model, rule, mode
        self.chunk = int(chunk) if chunk is not None else None
        self.backend = backend
        self.loss, self.optimizer, self.update_every = loss, optimizer, update_every
        self.tracers = [] if rule == "bptt" else [online_trace(c, rule, i) for i, c in enumerate(model.layers)]
        if readout_filter not in (None, True, False):
            raise ValueError(f"OnlineLearner: readout_filter must be None, True or False, got {readout_filter!r}")
        self._filter = None if readout_filter is False else self._readout_filter(required=readout_filter is True)
        self.states = None  # no stream yet
        self.steps = 0  # steps of the current stream
        self.since_update = 0
        self._pending: list = []  # chunked step(): (x_t, loss closure) of the block being filled
        self._block_start = None  # chunked step(): layer states at the start of that block
        self._target_shape = None
        self._whole_stack = None  # the whole-stack compiled stream step, when it applies
        self._gen = 0  # bumped whenever states, traces or accumulators are replaced (re-binds the fused views)
        self._all_params = list(model.parameters())
        self._dtype = self._all_params[0].dtype if self._all_params else torch.get_default_dtype()
        self._dropout = getattr(model, "dropout", None)  # the stack's dropout module (its mode is read per step)
        self._x_shape = None  # [B, C] of the stream's steps (set when a stream starts)
        self._versions = None  # the parameters' versions when the constants were derived (_sync_params)
        self._check_params = False  # compare them at the next step (after update() without an optimiser)
        if backend == "compiled":
            dev = self._all_params[0].device if self._all_params else torch.device("cpu")
            if "compiled" not in self.supported_backends(dev):
                raise RuntimeError(f"OnlineLearner: backend 'compiled' on {dev.type} needs "
                                   f"{'Triton' if dev.type == 'cuda' else 'numba'} (pip install 'spikerec[fast]'); "
                                   f"use backend='auto' or 'reference'")

    def _readout_filter(self, required: bool) -> ReadoutFilter | None:
        """The filtered traces of the layer under the leaky readout where they apply; else
        ``None``, or with ``required`` (``readout_filter=True``) an error naming what is missing."""
        why = None
        drop = getattr(self.model, "dropout", None)
        if self.rule not in ("full", "snap1"):
            why = f"rule 'full' or 'snap1' (got {self.rule!r})"
        elif len(self.tracers) < 2 or type(self.tracers[-1]).__name__ != "ReadoutTrace":
            why = "a leaky readout (LeakyReadout with tau) as the last layer"
        elif getattr(getattr(self.tracers[-2], "online_kind", None), "readout_filter", None) is None:
            kinds = ", ".join(k.cell.__name__ for k in registered_kinds() if k.readout_filter is not None)
            why = (f"a layer of a kind with readout-filtered traces ({kinds}) under the readout, got "
                   f"{type(self.tracers[-2].cell).__name__}")
        elif not required and drop is not None and getattr(drop, "p", 0.0) > 0:
            why = "a model without dropout"  # (required: refused at the first step with dropout active)
        if why is not None:
            if required:
                raise ValueError(f"OnlineLearner: readout_filter=True needs {why}")
            return None
        tr = self.tracers[-2]
        return tr.online_kind.readout_filter(tr, self.tracers[-1].cell)

    @staticmethod
    def supported_backends(device="cpu") -> tuple[str, ...]:
        """The backends that run on ``device`` here: ``reference`` always, ``compiled`` where its
        compiler is installed (numba for the CPU, Triton for CUDA); ``auto`` picks between them."""
        return ("reference", "compiled") if matrix_trace_kernel(torch.device(device)) is not None else ("reference",)

    @property
    def _compiled(self) -> bool:
        """Whether the compiled paths may be taken (``backend`` not ``reference``)."""
        return self.backend != "reference"

    @property
    def traces(self) -> list:
        """The layers' trace states (``TraceState``: traces and their gradient accumulators), with
        any matrix-trace steps the whole-stack step has deferred applied first
        (:meth:`.whole_stack.WholeStackStep.flush_lif`)."""
        fs = self.__dict__.get("_whole_stack")
        if fs is not None and (fs.lfill or fs.restore_lif is not None):
            with flush_subnormals():  # as in the steps (:mod:`.subnormal`)
                fs.flush_lif()
                if fs.restore_lif is not None:  # restored deferred LIF steps, read before the next step
                    (rows, any_g), fs.restore_lif = fs.restore_lif, None
                    self._apply_saved_lif(rows, any_g)
        return self._trace_states  # AttributeError before the first stream

    @traces.setter
    def traces(self, value: list) -> None:
        self._trace_states = value

    # --- what is exact ------------------------------------------------------------------------
    def exactness(self) -> list[tuple[int, str, str]]:
        """``(layer index, cell kind, how its gradient is estimated)`` for every layer.

        Traced cells (LRU, LIF/ALIF without lateral weights, the leaky readout) are exact within the
        layer; lateral weights get the e-prop approximation (paths between neurons dropped; Bellec
        et al. 2020); other cells (GRU, ...) use 1-step truncation. Errors reaching a
        layer from above are spatial only, so every layer below the last recurrent one is biased,
        except the layer directly under a leaky readout when it carries the readout-filtered traces
        (the default where they apply).
        """
        if self.rule == "bptt":
            return [(i, type(c).__name__, "BPTT (autograd through time)") for i, c in enumerate(self.model.layers)]
        out = []
        stateful = [not (isinstance(tr, GenericTrace) and tr.stateless) for tr in self.tracers]
        for i, tr in enumerate(self.tracers):
            kind = type(tr.cell).__name__
            if isinstance(tr, GenericTrace) and tr.stateless:
                how = "stateless (exact)"
            elif self.rule == "spatial":
                how = "spatial only (recurrent paths cut)"
            elif isinstance(tr, GenericTrace) or self.rule == "trunc1":
                how = "1-step truncation (approximation: no traces)"
            else:
                how = tr.online_kind.exactness
                if getattr(tr.cell, "recurrent_weight", None) is not None:
                    how = "e-prop traces (approximation: lateral paths between neurons dropped)"
            if self._filter is not None and tr is self._filter.tr:
                how += "; readout-filtered traces: the leaky readout's errors of every later step reach it"
            elif stateful[i] and any(stateful[i + 1:]):
                how += "; the layer's gradient is biased: errors from the recurrent layers above arrive through the current step only"
            out.append((i, kind, how))
        return out

    # --- the streaming interface ----------------------------------------------------------------
    @with_flushed_subnormals
    def step(self, x_t: torch.Tensor, target_t=None) -> StepResult:
        """Advance the stream by one step ``x_t [B, C]``; with ``target_t`` the step's loss
        ``loss(y_t, target_t)`` adds its gradient estimate to the accumulators. Returns
        ``StepResult(output, loss)``. Runs with subnormal floats flushed to zero, the caller's
        setting restored after (:mod:`.subnormal`), as do :meth:`backward` and trace reads."""
        if self.rule == "bptt" or self.mode == "parallel":
            raise ValueError(f"OnlineLearner.step: rule {self.rule!r} / mode {self.mode!r} needs the whole "
                             f"sequence; use backward(), or rule 'full' with mode 'stream' or 'chunked'")
        drop = self._dropout
        if drop is not None and drop.training and (self._whole_stack is not None
                                                   or getattr(self, "_compiled_kinds", None) is not None):
            self._leave_compiled_paths()  # dropout switched on mid-stream: those paths do not apply it
        fused = self._whole_stack if self.mode == "stream" else None
        # the whole-stack step checks x_t for NaN in its own compiled pass (same error)
        x_t = self._check_step(x_t, None, nan=fused is None)  # None: the step's name, built only for an error
        if self._check_params:
            self._sync_params()
        if target_t is not None:
            if self.loss is None:
                raise ValueError("OnlineLearner.step: a target was given but the learner has no loss; "
                                 "pass loss=fn(y_t, target_t) to OnlineLearner(...)")
            self._check_target(target_t)
        if self.mode == "stream" or (drop is not None and drop.training):
            # active dropout: step by step, so the output returned and the gradient share one mask
            if self._pending:
                self._finish_block(carry=True)
            fused = self._whole_stack
            compiled_mse = (fused is not None and target_t is not None and self.loss is mse_step_loss
                            and target_t.dim() == 2 and target_t.dtype == fused.dtype
                            and target_t.device.type == "cpu" and target_t.is_contiguous()
                            and not target_t.requires_grad)
            vg = None if target_t is None or compiled_mse else getattr(self.loss, "value_and_grad", None)
            vg = None if vg is None else (lambda y, vg=vg: vg(y, target_t))
            if compiled_mse:
                y, l = fused.step(x_t, None, mse_target=target_t, check_nan=True)  # the package's MSE: one call
            elif fused is not None:
                y, l = fused.step(x_t, self._closure(target_t, self.steps), vg, check_nan=True)
            elif self._compiled_kinds is not None and self.mode == "stream" and graph_ready(self, x_t, target_t):
                vgl, step_no = self.loss.value_and_grad, self.steps  # the step on the graph's static buffers
                y, l = graph_step(self, x_t, target_t, lambda xs, ts: compiled_stream_step(
                    self, xs, self._closure(ts, step_no), lambda yy: vgl(yy, ts)))
            elif self._compiled_kinds is not None and self.mode == "stream":
                drop_graph(self)  # the learner's tensors are replaced: a graph would read stale ones
                y, l = compiled_stream_step(self, x_t, self._closure(target_t, self.steps), vg)
            else:
                drop_graph(self)
                y, l = self._stream([x_t], [self._closure(target_t, self.steps)])
        else:
            y, l = self._chunk_step(x_t, target_t)
        return self._stepped(y, l)

    def _stepped(self, y, l) -> StepResult:
        """Count the step and apply the update policy (``update_every``)."""
        self.steps += 1
        self.since_update += 1
        if isinstance(self.update_every, int) and self.since_update >= self.update_every:
            self.update()
        return StepResult(y, l)

    def reset(self, batch_mask=None) -> None:
        """Sequence boundary: reset the layer states and the traces of the samples in
        ``batch_mask`` (bool ``[B]``; ``None`` = all). Accumulated gradients are kept; with
        ``update_every="sequence"`` :meth:`update` is called."""
        if self.states is None:
            if batch_mask is not None:
                raise ValueError("OnlineLearner.reset: batch_mask given before the first step (no stream yet)")
            return
        B = self.states[0][0].shape[0]
        mask = self._mask(batch_mask, B, "reset")
        self._finish_block(carry=True)
        init = self.model.initial_state(B, self.states[0][0].device, self.states[0][0].dtype)
        if mask is None:
            self.states = [type(s)(*(f.clone() for f in s)) for s in init]
            for ts in self._traces:
                ts.vec.clear()
                ts.mat.clear()
                ts.filt.clear()
            self.steps = 0
        else:
            self.states = [type(s)(*(torch.where(mask.view(-1, *([1] * (f.dim() - 1))), i, f) for f, i in zip(s, si)))
                           for s, si in zip(self.states, init)]
            self._zero_traces(mask)
        self._target_shape = None
        self._gen += 1
        if self.update_every == "sequence":
            self.update()

    def truncate(self, batch_mask=None) -> None:
        """Cut the gradient paths through the past (user-controlled truncation): the eligibility
        traces of the samples in ``batch_mask`` (``None`` = all) are set to zero; states and
        accumulated gradients are kept."""
        if self.states is None:
            return
        mask = self._mask(batch_mask, self.states[0][0].shape[0], "truncate")
        self._finish_block(carry=True)
        if mask is None:
            for ts in self._traces:
                ts.vec.clear()
                ts.mat.clear()
                ts.filt.clear()
        else:
            self._zero_traces(mask)
        self._gen += 1

    def update(self) -> None:
        """Write the accumulated estimate into ``.grad`` (added) and, with an optimiser, step it
        and zero its gradients. Parameter-derived constants are recomputed afterwards; without an
        optimiser, at the next step if the parameters changed in between (``update();
        opt.step()``, see :meth:`refresh`)."""
        self._finish_block(carry=True)
        self._flush()
        self.since_update = 0
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad()
            self._prepare()
        else:  # the caller may step an optimiser now: compare the parameters at the next step
            self._check_params = True

    def discard(self) -> None:
        """Drop the accumulated (not yet applied) gradient estimate."""
        self._finish_block(carry=True)
        self.spatial = {}
        for ts in self._traces:
            ts.G = {}
        self._gen += 1

    # --- the batch convenience ------------------------------------------------------------------
    @with_flushed_subnormals
    def backward(self, x: torch.Tensor, target, loss_fn: Callable) -> float:
        """Accumulate the rule's gradient estimate of ``L = sum_t loss_fn(y_t, target, t)`` into
        ``.grad`` over a fresh stream of the whole ``x [T, B, C]``; returns ``L`` as a float."""
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
        K = 1 if self.mode == "stream" else (T if self.mode == "parallel" else self.chunk)
        self._start(x.shape[1], x.device, x.dtype)
        total = 0.0
        if self.mode != "stream":  # one reduction over the whole input (a NaN is then found per step)
            self._check_nan_block(x, 0)
        for t0 in range(0, T, K):
            t1 = min(T, t0 + K)
            if self.mode == "stream":
                self._check_step(x[t0], f"OnlineLearner input x (step {t0})", start=False, nan=True)
                if self._whole_stack is not None:
                    vg = getattr(loss_fn, "value_and_grad", None)
                    _, l = self._whole_stack.step(x[t0], lambda y, t=t0: loss_fn(y, target, t),
                                                  None if vg is None else (lambda y, t=t0: vg(y, target, t)))
                elif self._compiled_kinds is not None:
                    vg = getattr(loss_fn, "value_and_grad", None)
                    _, l = compiled_stream_step(self, x[t0], lambda y, t=t0: loss_fn(y, target, t),
                                            None if vg is None else (lambda y, t=t0: vg(y, target, t)))
                else:
                    _, l = self._stream([x[t0]], [lambda y, t=t0: loss_fn(y, target, t)])
            else:
                block = getattr(loss_fn, "block", None) if self._compiled else None
                vg = getattr(loss_fn, "value_and_grad", None) if self._compiled_block_ok() else None
                bvg = getattr(loss_fn, "block_value_and_grad", None) if vg is not None else None
                if bvg is not None:  # the whole block's loss in one call: no per-step closures
                    l = self._block_batched(x[t0:t1], None, carry=t1 < T, vgs=(),
                                            block_vg=lambda Y, t0=t0, t1=t1: bvg(Y, target, t0, t1))
                else:
                    l = self._block_batched(x[t0:t1], [lambda y, t=t: loss_fn(y, target, t) for t in range(t0, t1)],
                                            block_loss=None if block is None else
                                            (lambda h, t0=t0, t1=t1: block(h, target, t0, t1)),
                                            carry=t1 < T,
                                            vgs=None if vg is None else
                                            [lambda y, t=t: vg(y, target, t) for t in range(t0, t1)])
            if l is not None:
                total += float(l)
            self.steps += t1 - t0
        self._flush()
        return total

    # --- checkpoint -----------------------------------------------------------------------------
    def state_tensors(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The learner's stream state as ``(tensors, meta)``: layer states, traces, gradient
        accumulators and counters (the model's parameters and the optimiser are not included;
        see :func:`spikerec.hardware.online.checkpoint.save_stream`). A chunked block being
        filled is stored as it is (its inputs, targets and start states), not finished early, so
        that a resumed run does the same arithmetic as an uninterrupted one."""
        tensors: dict[str, torch.Tensor] = {}
        meta = {"rule": self.rule, "mode": self.mode, "chunk": self.chunk, "steps": self.steps,
                "since_update": self.since_update, "started": self.states is not None,
                "readout_filter": self._filter is not None,
                "target_shape": None if self._target_shape is None else list(self._target_shape)}
        if self.states is None:
            return tensors, meta
        meta["state_fields"] = [list(type(s)._fields) for s in self.states]
        for l, s in enumerate(self.states):
            for f, v in zip(type(s)._fields, s):
                tensors[f"state/{l}/{f}"] = v
        fs = self._whole_stack
        if fs is not None:  # the LIF window is stored as it is
            lif_rows, lif_any = fs.saved_lif()
            meta["fused_lif"] = [len(lif_rows), lif_any]
            for j, bufs in enumerate(lif_rows):
                for name, v in zip(("J", "g", "x", "z"), bufs):
                    tensors[f"fused_lif/{j}/{name}"] = v
        for l, ts in enumerate(self._trace_states):
            for n, v in ts.vec.items():
                tensors[f"trace_vec/{l}/{_key(n)}"] = v
            for n, v in ts.mat.items():
                tensors[f"trace_mat/{l}/{_key(n)}"] = v
            for n, v in ts.G.items():
                tensors[f"acc/{l}/{n}"] = v
            for n, v in ts.filt.items():
                tensors[f"trace_filt/{l}/{n}"] = v
        names = {p: n for n, p in self.model.named_parameters()}
        for p, v in self.spatial.items():
            tensors[f"spatial/{names[p]}"] = v
        meta["pending"] = []
        for j, (x_t, target_t, step_no) in enumerate(self._pending):
            tensors[f"pending/{j}/x"] = x_t
            if target_t is not None:
                tensors[f"pending/{j}/target"] = target_t
            meta["pending"].append(step_no)
        if self._pending:
            for l, s in enumerate(self._block_start):
                for f, v in zip(type(s)._fields, s):
                    tensors[f"block_start/{l}/{f}"] = v
        return tensors, meta

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        """Restore what :meth:`state_tensors` returned (same model structure, rule and mode)."""
        for k in ("rule", "mode", "chunk"):
            if meta.get(k) != getattr(self, k):
                raise ValueError(f"OnlineLearner checkpoint: {k} is {meta.get(k)!r}, this learner has "
                                 f"{getattr(self, k)!r}")
        # (earlier versions wrote no flag: filtered traces were stored only with the filter on)
        saved = meta.get("readout_filter", any(key.startswith("trace_filt/") for key in tensors))
        if meta["started"] and bool(saved) != (self._filter is not None):
            raise ValueError(f"OnlineLearner checkpoint: the stream was saved with readout_filter={bool(saved)}, this "
                             f"learner has it {'on' if self._filter is not None else 'off'}; make the learner with "
                             f"readout_filter={bool(saved)} to resume it (the filtered traces carry the stream's past)")
        if any(key.startswith("trace_filt/") and "/mat/" not in key and v.dim() == 3 for key, v in tensors.items()):
            raise ValueError("OnlineLearner checkpoint: filtered weight traces stored batch-first by an earlier "
                             "version; resume the stream with that version")
        self.steps, self.since_update = int(meta["steps"]), int(meta["since_update"])
        self._target_shape = None if meta["target_shape"] is None else tuple(meta["target_shape"])
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
        self._begin_traces(s0.device)
        named = dict(self.model.named_parameters())
        for key, v in tensors.items():
            kind, _, rest = key.partition("/")
            if kind in ("trace_vec", "trace_mat", "acc", "trace_filt"):
                l, _, n = rest.partition("/")
                ts = self._traces[int(l)]
                d = {"trace_vec": ts.vec, "trace_mat": ts.mat, "acc": ts.G, "trace_filt": ts.filt}[kind]
                d[_unkey(n)] = v.clone()
            elif kind in ("pending", "block_start", "fused_lif"):
                continue
            elif kind == "fused_rows":  # written by earlier versions, which buffered the LRU's C gradient
                if v.shape[0]:
                    raise ValueError(f"OnlineLearner checkpoint: {key!r} holds C-gradient rows buffered by an earlier "
                                     f"version, which this one cannot add; resume it with that version")
            elif kind == "spatial":
                if rest not in named:
                    raise ValueError(f"OnlineLearner checkpoint: accumulated gradient of unknown parameter {rest!r}")
                self.spatial[named[rest]] = v.clone()
        self._pending = [(tensors[f"pending/{j}/x"].clone(), tensors.get(f"pending/{j}/target"), int(step_no))
                         for j, step_no in enumerate(meta.get("pending", []))]
        self._block_start = None
        if self._pending:
            self._block_start = [type(s)(*(tensors[f"block_start/{l}/{f}"].clone() for f in type(s)._fields))
                                 for l, s in enumerate(self.states)]
        self._whole_stack = None
        if self._compiled_kinds is not None and whole_stack_supported(self, s0.dtype, s0.device):
            self._whole_stack = WholeStackStep(self, s0.dtype)
        n_lif, lif_any = meta.get("fused_lif", (0, False))
        lif_rows = [tuple(tensors[f"fused_lif/{j}/{n}"] for n in ("J", "g", "x", "z")) for j in range(int(n_lif))]
        if lif_rows and lif_rows[0][0].shape[0]:
            if self._whole_stack is not None:
                self._whole_stack.restore_lif = (lif_rows, bool(lif_any))
            else:  # this learner takes another path: apply the deferred steps to the traces now
                self._apply_saved_lif(lif_rows, bool(lif_any))
        self._gen += 1

    # --- internals ------------------------------------------------------------------------------
    @property
    def _traces(self):
        return getattr(self, "traces", [])

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
        keep = (~mask)
        for ts in self._traces:
            for n, v in ts.vec.items():  # [B, N, ...]
                v.mul_(keep.view(-1, *([1] * (v.dim() - 1))).to(v.dtype))
            for n, v in ts.mat.items():  # [N, B, k, H]
                v.mul_(keep.view(1, -1, *([1] * (v.dim() - 2))).to(v.dtype))
            for n, v in ts.filt.items():  # [B, ...]; a filtered matrix trace (".../mat/...") [N, B, k, H]
                d = 1 if "/mat/" in n else 0
                v.mul_(keep.view(*([1] * d), -1, *([1] * (v.dim() - 1 - d))).to(v.dtype))

    def _check_nan(self, x_t, name):
        """Raise for NaN in the step input ``x_t`` (``name`` ``None``: the current step's)."""
        if not x_t.is_floating_point():
            return
        if x_t.device.type == "cpu":
            found = any_nan(x_t)  # one compiled pass where it applies
            if found is False:
                return
            # a NaN makes the sum NaN: one reduction decides (then look, for inf - inf)
            if found is None and (not math.isnan(x_t.detach().sum().item()) or not bool(torch.isnan(x_t).any())):
                return
        elif not bool(torch.isnan(x_t).any()):
            return
        raise ValueError(f"{name or f'OnlineLearner.step (step {self.steps}) x_t'}: contains NaN values")

    def _check_nan_block(self, xb, t0):
        """:meth:`_check_nan` of the steps ``t0, t0+1, ...`` of ``xb [K, B, C]`` with one reduction
        (no temporary the size of ``xb``); the error names the first step with a NaN."""
        if not xb.is_floating_point() or not math.isnan(xb.detach().sum().item()):
            return
        for k in range(xb.shape[0]):  # a NaN (or inf - inf) in the sum: look step by step
            if bool(torch.isnan(xb[k]).any()):
                raise ValueError(f"OnlineLearner input x (step {t0 + k}): contains NaN values")

    def _check_step(self, x_t, name, start=True, nan=True):
        """Check one step's input and return it in the parameters' dtype (boolean and integer
        spikes are cast; a floating input of another precision is an error); starts the stream.
        ``name`` (for the error messages) ``None``: ``OnlineLearner.step (step N) x_t``."""
        C = self.model.input_size
        if type(x_t) is torch.Tensor and x_t.shape == self._x_shape and x_t.dtype == self._dtype:
            if nan:  # the usual step: a tensor of the stream's shape and dtype
                self._check_nan(x_t, name)
            return x_t
        if name is None:
            name = f"OnlineLearner.step (step {self.steps}) x_t"
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
        else:
            B = self.states[0][0].shape[0]
            if x_t.shape[0] != B:
                raise ValueError(f"{name}: batch size {x_t.shape[0]}, but the stream runs with batch {B} "
                                 f"(call reset() on a new learner for another batch size)")
        if nan:
            self._check_nan(x_t, name)
        return x_t

    def _check_target(self, target_t):
        known = self._target_shape
        if (known is not None and type(target_t) is torch.Tensor and target_t.is_floating_point()
                and target_t.shape == known):
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
            # class labels [B] (-100: ignored, as in cross_entropy): checked before the step runs
            bad = (target_t != -100) & ((target_t < 0) | (target_t >= out))
            if bool(bad.any()):
                raise ValueError(f"{name}: class labels must lie in [0, {out - 1}] (the readout's {out} outputs) or "
                                 f"be -100 (ignored), got {int(target_t[bad][0])}")
        if self._target_shape is None:
            self._target_shape = tuple(target_t.shape)
        elif tuple(target_t.shape) != self._target_shape:
            raise ValueError(f"{name}: shape {tuple(target_t.shape)} differs from the stream's earlier targets "
                             f"{self._target_shape}")

    def _start(self, B, device, dtype):
        """A fresh stream: initial states, empty traces and accumulators."""
        self.states = list(self.model.initial_state(B, device, dtype))
        self._x_shape = torch.Size((B, self.model.input_size))
        self._prepare()
        self._begin_traces(device)
        self.steps, self.since_update = 0, 0
        self._pending, self._block_start, self._target_shape = [], None, None
        self._whole_stack = None  # (with its buffered rows: the accumulators start empty above)
        if self._compiled_kinds is not None and whole_stack_supported(self, dtype, device):
            self._whole_stack = WholeStackStep(self, dtype)
        self._gen += 1

    def _begin_traces(self, device):
        self.traces = [TraceState(tr) for tr in self.tracers]
        self.spatial = {}
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.frozen = set()
        for tr in self.tracers:
            if isinstance(tr, GenericTrace):
                self.frozen |= tr.frozen
        if self._filter is not None:  # their spatial partials are replaced by the filtered ones
            self.frozen |= {id(p) for p in self._filter.tr.cell.parameters()}
        self.kernel = None
        self._compiled_kinds = None
        self._fused = {}
        for tr in self.tracers:
            tr.compiled = self._compiled  # chunked: closed-form block scans where a cell has them
        if self.mode == "stream" and self._compiled:
            if compiled_supported(self):
                self._compiled_kinds = compiled_kinds(self)
            elif self.backend == "compiled":
                raise ValueError("OnlineLearner: backend 'compiled' in stream mode needs a stack of LRU, ALIF or plain "
                                 "(non-CUBA) LIF layers with a leaky or linear readout and no active dropout; use "
                                 "backend='auto' or 'reference'")
        if self._compiled:
            self.kernel = matrix_trace_kernel(torch.device(device))

    def _leave_compiled_paths(self):
        """Continue the stream on the reference path (it applies the model's dropout): the
        whole-stack step's deferred LIF trace steps are applied first; states and traces are
        shared, so nothing else moves. The compiled paths are chosen again when a stream starts."""
        if self._whole_stack is not None:
            self._whole_stack.flush_lif()
        self._whole_stack = None
        self._compiled_kinds = None
        self._gen += 1

    def _prepare(self):
        self._gen = getattr(self, "_gen", 0) + 1
        for tr in self.tracers:
            if not isinstance(tr, GenericTrace):
                tr.prepare()
        self._versions = self._param_versions()

    def _param_versions(self) -> tuple:
        """The version counters of the model's parameters (an in-place change, such as an
        optimiser step or ``load_state_dict``, bumps them)."""
        return tuple(p._version for p in self._all_params)

    def refresh(self) -> None:
        """Re-derive the parameter-derived constants (decays, eigenvalues, transposed weights)
        from the current parameters. The learner does this itself after its own optimiser step
        and, at the next step, after :meth:`update` without an optimiser (when the caller steps
        one); call it after changing the parameters any other way in the middle of a stream."""
        self._prepare()

    def _sync_params(self) -> None:
        """:meth:`refresh` if the parameters changed since the constants were derived (checked
        at the first step after an :meth:`update` without an optimiser)."""
        self._check_params = False
        if self._param_versions() != self._versions:
            self._prepare()

    def _add_spatial(self, grads) -> None:
        """Accumulate the immediate (spatial) partials of the parameters, one per ``self.params``."""
        for p, gp in zip(self.params, grads):
            if gp is not None and id(p) not in self.frozen:
                if p in self.spatial:
                    self.spatial[p] += gp
                else:
                    self.spatial[p] = gp.clone()

    def _forward_step(self, x_t):
        """One step of every layer; returns (y_t, per-layer (input, prev, new) records)."""
        model = self.model
        h = x_t
        recs = []
        n_cells = len(self.tracers) - 1
        drop = getattr(model, "dropout", None)
        for l, tr in enumerate(self.tracers):
            prev = self.states[l]
            if not isinstance(tr, GenericTrace):
                new = tr.step(h, prev)
                # fresh nodes per field: g_f is then the partial d l_t / d s_t[f] with the other fields
                # held (a field computed from another inside the step, CUBA's v from i, is reached
                # through the traces, not twice); the graph to the layer input is kept
                new = type(new)(*(s.view_as(s) if s.requires_grad else s.detach().requires_grad_() for s in new))
                out = tr.output(h, new)
            else:
                out, new = tr.cell.step(h, prev)
            recs.append((h.detach(), prev, new))
            self.states[l] = type(new)(*(s.detach() for s in new))
            h = out
            if l < n_cells and drop is not None:
                h = drop(h)
        return h, recs

    def _stream(self, xs, losses):
        """Steps ``xs`` one at a time with the forward recursions; returns ``(y_last, loss)``."""
        total = None
        all_recs = []
        y = None
        for k, (x_t, lf) in enumerate(zip(xs, losses)):
            y, recs = self._forward_step(x_t)
            all_recs.append(recs)
            l = lf(y) if lf is not None else None
            if l is not None:
                if l.dim() != 0:
                    raise ValueError(f"loss must return a scalar at step {self.steps + k}, got shape {tuple(l.shape)}")
                total = l if total is None else total + l
        traced = [i for i, tr in enumerate(self.tracers) if not isinstance(tr, GenericTrace)]
        gs = {i: [None] * len(xs) for i in traced}
        if total is not None and total.requires_grad:
            inputs, index = [], []
            for k, recs in enumerate(all_recs):
                for i in traced:
                    for f, s in enumerate(recs[i][2]):
                        inputs.append(s)
                        index.append((k, i, f))
            grads = torch.autograd.grad(total, inputs + self.params, allow_unused=True)
            n = len(inputs)
            self._add_spatial(grads[n:])
            fields: dict[tuple[int, int], list] = {}
            for (k, i, f), gsf in zip(index, grads[:n]):
                fields.setdefault((k, i), []).append(gsf)
            for (k, i), lst in fields.items():
                if all(v is None for v in lst):
                    continue
                ref = next(v for v in lst if v is not None)
                gs[i][k] = torch.stack([v if v is not None else torch.zeros_like(ref) for v in lst], -1)
        filt = self._filter
        if filt is not None and self._dropout is not None and self._dropout.training:
            raise ValueError("OnlineLearner: readout_filter=True does not support active dropout "
                             "(call model.eval() or drop the filter)")
        with torch.no_grad():
            for i in traced:
                tr, ts = self.tracers[i], self.traces[i]
                if not tr.traced:
                    continue
                filtered = filt is not None and tr is filt.tr
                for k, (recs, g) in enumerate(zip(all_recs, gs[i])):
                    x_in, prev, new = recs[i]
                    new = type(new)(*(v.detach() for v in new))
                    P = tr.partials(x_in, prev, new)
                    stream_step(ts, P, None if filtered else g, self.kernel)
                    if filtered:  # the readout's learning signal d l_t / d y_t, through the filtered traces
                        d = gs[len(self.tracers) - 1][k]
                        with torch.enable_grad():
                            filt.step(ts, P, x_in, new, None if d is None else d[..., 0])
        return y.detach(), (None if total is None else total.detach())

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

    def _chunk_step(self, x_t, target_t):
        """``step`` in chunked mode: the output now (a forward step without autograd), the
        gradient work when the block of ``chunk`` steps is full."""
        if not self._pending:
            self._block_start = list(self.states)
        closure = self._closure(target_t, self.steps)
        with torch.no_grad():
            h = x_t
            for l, tr in enumerate(self.tracers):
                if isinstance(tr, GenericTrace):
                    h, new = tr.cell.step(h, self.states[l])
                else:
                    new = tr.step(h, self.states[l])
                    h = tr.output(h, new)
                self.states[l] = new
            l = closure(h) if closure is not None else None
        self._pending.append((x_t, target_t, self.steps))
        if len(self._pending) == self.chunk:
            self._finish_block(carry=True)
        return h, (None if l is None else l.detach())

    def _finish_block(self, carry: bool):
        """Do the gradient work of the pending chunked block (no-op otherwise)."""
        if not self._pending:
            return
        pend, self._pending = self._pending, []
        end_states, self.states = self.states, self._block_start
        vg = getattr(self.loss, "value_and_grad", None) if self._compiled_block_ok() else None
        vgs = None if vg is None else [None if p[1] is None else (lambda y, tt=p[1]: vg(y, tt)) for p in pend]
        self._block_batched(torch.stack([p[0] for p in pend]), [self._closure(p[1], p[2]) for p in pend], carry,
                            vgs=vgs)
        self.states = end_states

    def _compiled_block_ok(self) -> bool:
        """Whether a block may take the no-autograd path of :mod:`.block` (the loss aside)."""
        return self._compiled and block_supported(self)

    def _block_batched(self, x, losses, carry, block_loss=None, vgs=None, block_vg=None):
        """A block of K steps with whole-block tensor ops (chunked / parallel modes). Within the
        block every step starts from the *detached* previous state, so once the states are known
        (one cheap pass without autograd) the steps of a layer are independent rows: each layer is
        advanced for all K steps in one ``[K*B, ...]`` call with the spatial graph, and one
        backward gives ``g_t`` for every step. Same estimator as the step-by-step form. With
        ``vgs`` (per step ``y -> (loss, d loss / d y) | None``) the block runs with no autograd
        call (:func:`.block.compiled_chunk_block`); ``block_vg`` gives the whole block's loss and
        gradient in one call instead."""
        if vgs is not None:
            return compiled_chunk_block(self, x, vgs, carry, block_vg)
        model = self.model
        K, B = x.shape[0], x.shape[1]
        drop = getattr(model, "dropout", None)
        if drop is not None and drop.training:
            total = None
            # step by step: active dropout (so the masks match the stream form)
            for k in range(K):
                y_, l_ = self._stream([x[k]], [losses[k]])
                if l_ is not None:
                    total = l_ if total is None else total + l_
            return total
        h = x
        recs = []
        n_cells = len(self.tracers) - 1
        for l, tr in enumerate(self.tracers):
            generic = isinstance(tr, GenericTrace)
            hd = h.detach()
            s = self.states[l]
            hf = h.reshape(K * B, *h.shape[2:])
            if generic and tr.stateless:  # the state is not read: no sequential pass
                prev = tr.cell.initial_state(K * B, x.device, x.dtype)
                out, new = tr.cell.step(hf, prev)
                self.states[l] = type(new)(*(f.detach()[(K - 1) * B:] for f in new))
            elif generic:
                prevs = []
                with torch.no_grad():  # the previous states of the block's steps
                    for t in range(K):
                        prevs.append(s)
                        s = tr.cell.step(hd[t], s)[1]
                self.states[l] = type(s)(*(f.detach() for f in s))
                prev = type(s)(*(torch.cat([p[f] for p in prevs]) for f in range(len(s))))
                out, new = tr.cell.step(hf, prev)
            else:
                with torch.no_grad():  # the previous states of the block's steps
                    scan = tr.scan_block if (tr.compiled and hasattr(tr, "scan_block")) else tr.scan_loop
                    prev, s = scan(hd, s)  # [K*B] fields (scan_block: all K at once)
                self.states[l] = type(s)(*(f.detach() for f in s))
                new = tr.step(hf, prev)
                new = type(new)(*(f.view_as(f) if f.requires_grad else f.detach().requires_grad_() for f in new))
                out = tr.output(hf, new)
            recs.append((hd.reshape(K * B, *hd.shape[2:]), prev, new))
            h = out.reshape(K, B, *out.shape[1:])
            if l < n_cells and drop is not None:
                h = drop(h)
        total = None
        if block_loss is not None:  # the loss of all K steps in one op (the loss's ``block`` form)
            total = block_loss(h)
        for k in range(K if block_loss is None else 0):
            l_ = losses[k](h[k]) if losses[k] is not None else None
            if l_ is not None:
                if l_.dim() != 0:
                    raise ValueError(f"loss must return a scalar at step {self.steps + k}, got shape {tuple(l_.shape)}")
                total = l_ if total is None else total + l_
        traced = [i for i, tr in enumerate(self.tracers) if not isinstance(tr, GenericTrace) and tr.traced]
        gs: dict[int, torch.Tensor | None] = {i: None for i in traced}
        filt = self._filter
        fl = len(self.tracers) - 2 if filt is not None else None  # the layer under the leaky readout
        gbar = None
        if total is not None and total.requires_grad:
            inputs, index = [], []
            for i in traced:
                for f, v in enumerate(recs[i][2]):
                    inputs.append(v)
                    index.append(i)
            grads = torch.autograd.grad(total, inputs + self.params, allow_unused=True, retain_graph=filt is not None)
            n = len(inputs)
            self._add_spatial(grads[n:])
            for i in traced:
                lst = [g for g, j in zip(grads[:n], index) if j == i]
                if all(v is None for v in lst):
                    continue
                fields = [v if v is not None else torch.zeros_like(f) for v, f in zip(lst, recs[i][2])]
                G = torch.stack(fields, -1)
                gs[i] = G.reshape(K, B, *G.shape[1:])
            gy = gs.get(len(self.tracers) - 1)
            if filt is not None and gy is not None:  # the readout's errors of the block's later steps
                gbar = reverse_readout_filter(filt.readout.alpha().detach().to(gy.dtype), gy[..., 0])
                gs[fl] = self._filtered_block_errors(recs, fl, gbar, K, B)
        with torch.no_grad():
            for i in traced:
                tr = self.tracers[i]
                x_in, prev, new = recs[i]
                new = type(new)(*(v.detach() for v in new))
                P = stack_partials(tr.partials(x_in, prev, new), K, B)
                if i == fl:  # before the traces are carried: the filtered traces meet them
                    with torch.enable_grad():
                        filt.block(self.traces[i], P, x_in, new, gbar, K, B)
                chunk_contract(self.traces[i], P, gs[i], carry)
        return None if total is None else total.detach()

    def _filtered_block_errors(self, recs, l, gbar, K, B):
        """``d (gbar . y) / d s^l`` ``[K, B, N, k]`` of the layer ``l`` under the leaky readout,
        and the same for its output-map parameters (added to its accumulators): the readout's
        errors of every later step of the block, ``gbar`` (:func:`.readout_filter.reverse_readout_filter`)."""
        tr, ts = self.tracers[l], self.traces[l]
        fields = list(recs[l][2])
        params = {n: p for n, p in tr.cell.named_parameters() if p.requires_grad}
        y = recs[l + 1][2][0]  # the readout's state rows [K*B, outputs]
        grads = torch.autograd.grad(y, fields + list(params.values()), gbar.reshape(K * B, -1), allow_unused=True)
        for n, g in zip(params, grads[len(fields):]):
            if g is not None:
                ts.add(n, g)
        G = torch.stack([g if g is not None else torch.zeros_like(f) for g, f in zip(grads, fields)], -1)
        return G.reshape(K, B, *G.shape[1:])

    def _apply_saved_lif(self, rows, any_g: bool) -> None:
        """Apply deferred LIF matrix-trace steps saved by a learner that took the whole-stack step
        (:meth:`load_state_tensors`) to this learner's traces and accumulators."""
        from .whole_stack import apply_lif_window

        lif = [(tr, ts) for tr, ts in zip(self.tracers, self._trace_states) if isinstance(tr, LIFTrace)
               and not tr.cell.cuba and any(n in tr.traced for n in ("weight", "recurrent_weight"))]
        if len(lif) != len(rows):
            raise ValueError(f"OnlineLearner checkpoint: {len(rows)} deferred LIF trace buffers, the model has "
                             f"{len(lif)} plain LIF layers with traced weights")
        with torch.no_grad(), flush_subnormals():
            for (tr, ts), bufs in zip(lif, rows):
                mats = []
                for name, pre in (("weight", bufs[2]), ("recurrent_weight", bufs[3])):
                    e = ts.mat.get(name) if name in tr.traced else None
                    if e is not None:
                        e = ts.mat[name] = e.contiguous()
                        G = ts.G.get(name)
                        if G is None or not G.is_contiguous():
                            G = ts.G[name] = (torch.zeros_like(tr.params[name], memory_format=torch.contiguous_format)
                                              if G is None else G.contiguous())
                    mats.append((pre, e, G if e is not None else None))
                apply_lif_window(bufs, mats, bufs[0].shape[0], any_g)

    def _flush(self):
        """Add the accumulated estimate to ``.grad`` and reset the accumulators. Parameters the
        rule does not train get a zero gradient (not ``None``), so clipping and norm logging see
        every parameter."""
        if not hasattr(self, "traces"):
            return
        with torch.no_grad():
            extra: dict = {}
            for ts in self.traces:
                for name, G in ts.take().items():
                    p = ts.tr.params[name]
                    extra[p] = extra[p] + G if p in extra else G
            for p in self.params:
                g = None
                if p in self.spatial:
                    g = self.spatial[p]
                if p in extra:
                    g = extra[p] if g is None else g + extra[p]
                if p.grad is None:
                    p.grad = torch.zeros_like(p) if g is None else g.detach().clone()
                elif g is not None:
                    p.grad += g
            self.spatial = {}
            self._gen += 1


def _key(name: str) -> str:
    return "__stacked__" if name.startswith("\0") else name


def _unkey(name: str) -> str:
    return "\0stacked" if name == "__stacked__" else name

"""The stream step on a CUDA device replayed from a CUDA graph.

On a GPU the stream step of a small network is bound by kernel launches, not by arithmetic: the
compiled stream path (:func:`.spatial.compiled_stream_step` and the layers' trace steps) issues about 90
small kernels per step, and the host spends far longer issuing them than the GPU works on
them. A CUDA graph records those launches once and replays them as one.

What is captured is the step itself on *static* tensors: the input and target buffers, and the
learner's states, traces and gradient accumulators as they are when the graph is made. Where the
step replaces one of those tensors by a new one (a new state, a new trace), the graph ends by
copying the new values into the old tensor, and the learner keeps pointing at the old one; so
after each replay the learner's tensors hold the stream's state, exactly as after an eager step,
and everything outside the step (checkpoints, :meth:`~.learner.OnlineLearner.reset`,
:meth:`~.learner.OnlineLearner.update`) reads them as usual.

A graph is made after :data:`GRAPH_AFTER` eager steps with a target in one generation of the
learner (its ``_gen``: a reset, an update, a truncation, a checkpoint load or new parameters end
one) and used while the generation, the shapes and the dtypes stay; an eager step in between
(a step without a target) drops it. The input checks run before each replay on the host, so a
NaN input is still reported before any state changes. A step the graph cannot hold (a tensor
read on the host inside the step, a trace created or reshaped by it) is run eagerly; after
:data:`MAX_FAILURES` such captures the learner stops trying.

tests/test_cuda.py compares the graphed stream with the eager one; docs/online.md has the figures.
"""
from __future__ import annotations

import torch

__all__ = ["GRAPH_AFTER", "MAX_FAILURES", "StreamGraph", "drop_graph", "graph_ready", "graph_step"]

GRAPH_AFTER = 3  # eager steps with a target, in one generation, before the step is captured
MAX_FAILURES = 3  # captures that could not hold the step before the learner stops trying


class _NotCapturable(Exception):
    """The step changed the learner in a way a replayed graph cannot repeat."""


def graph_ready(learner, x_t, target_t) -> bool:
    """Whether ``learner``'s stream step on ``x_t``, ``target_t`` may run from a CUDA graph: a CUDA
    input, the compiled stream path, no readout-filtered traces (not in the graph's snapshot) and a
    loss with a closed-form ``value_and_grad``."""
    return (x_t.is_cuda and target_t is not None
            and isinstance(target_t, torch.Tensor) and target_t.device == x_t.device
            and getattr(learner, "_compiled_kinds", None) is not None
            and getattr(learner, "_filter", None) is None  # (its filtered traces are not in the snapshot)
            and getattr(learner.loss, "value_and_grad", None) is not None
            and getattr(learner, "_graph_failures", 0) < MAX_FAILURES)


class _Snapshot:
    """The learner's step-facing tensors before the captured step: its states, its traces'
    dictionaries (``vec``, ``mat``, ``G``) and its spatial accumulators."""

    _DICTS = ("vec", "mat", "G")

    def __init__(self, learner):
        self.states = list(learner.states)
        self.traces = [(ts, dict(ts.__dict__), {n: dict(getattr(ts, n)) for n in self._DICTS})
                       for ts in learner._trace_states]
        self.spatial_dict = learner.spatial
        self.spatial = dict(learner.spatial)

    def restore(self, learner) -> None:
        """Put back every reference the (failed) capture replaced."""
        learner.states[:] = self.states
        for ts, attrs, dicts in self.traces:
            ts.__dict__.clear()
            ts.__dict__.update(attrs)
            for n, d in dicts.items():
                getattr(ts, n).clear()
                getattr(ts, n).update(d)
        learner.spatial = self.spatial_dict
        learner.spatial.clear()
        learner.spatial.update(self.spatial)

    def write_back(self, learner) -> None:
        """Inside the capture: copy every replaced tensor's new value into the tensor it replaced
        and point the learner back at the old one; raise :class:`_NotCapturable` for a change a
        replay cannot repeat (a new or missing entry, another shape or dtype, an old tensor
        reused in another place)."""
        olds = {id(t) for s in self.states for t in s}
        for _, _, dicts in self.traces:
            olds.update(id(t) for d in dicts.values() for t in d.values())
        olds.update(id(t) for t in self.spatial.values())
        pairs = []
        for l, (old, new) in enumerate(zip(self.states, learner.states)):
            if len(old) != len(new):
                raise _NotCapturable(f"layer {l}'s state changed its fields")
            pairs += [(o, n) for o, n in zip(old, new)]
        for ts, attrs, dicts in self.traces:
            if ts.__dict__.keys() != attrs.keys() or any(
                    ts.__dict__[k] is not v for k, v in attrs.items() if k not in self._DICTS):
                raise _NotCapturable("a trace state changed an attribute")
            for n, before in dicts.items():
                pairs += _dict_pairs(getattr(ts, n), before)
        if learner.spatial is not self.spatial_dict:
            raise _NotCapturable("the spatial accumulators were replaced")
        pairs += _dict_pairs(learner.spatial, self.spatial)
        for old, new in pairs:
            if new is old:
                continue
            if id(new) in olds or new.shape != old.shape or new.dtype != old.dtype:
                raise _NotCapturable("a tensor of the step was reused or reshaped")
            old.copy_(new)
        learner.states[:] = self.states
        for ts, _, dicts in self.traces:
            for n, before in dicts.items():
                getattr(ts, n).update(before)
        learner.spatial.update(self.spatial)


def _dict_pairs(now: dict, before: dict) -> list:
    if now.keys() != before.keys():
        raise _NotCapturable("the step created or removed a trace or accumulator")
    return [(before[k], now[k]) for k in before]


class StreamGraph:
    """One captured stream step: the static input and target, the graph, its outputs, and what
    it is valid for (the learner's generation, the input's and target's shapes and dtypes)."""

    def __init__(self, learner, x_t, target_t):
        self.gen = learner._gen
        self.key = (x_t.shape, x_t.dtype, x_t.device, target_t.shape, target_t.dtype)
        self.x = x_t.detach().clone()
        self.target = target_t.detach().clone()
        self.graph = torch.cuda.CUDAGraph()
        self.y = self.loss = None

    def valid(self, learner, x_t, target_t) -> bool:
        return (self.gen == learner._gen and x_t.shape == self.key[0] and x_t.dtype == self.key[1]
                and x_t.device == self.key[2] and target_t.shape == self.key[3] and target_t.dtype == self.key[4])

    def capture(self, learner, run) -> bool:
        """Record ``run(x, target) -> (y, loss)`` (the eager step on the static buffers) and its
        write-back, then replay it once (the capture itself runs nothing); returns whether the
        graph holds the step (else the learner is as before and the step is still to be run)."""
        # the states the graph reads and writes are its own copies: the last eager step's output
        # is also the readout's state, and the caller may hold it
        learner.states[:] = [type(s)(*(f.clone() if isinstance(f, torch.Tensor) else f for f in s))
                             for s in learner.states]
        snap = _Snapshot(learner)
        torch.cuda.synchronize(self.x.device)
        try:
            with torch.cuda.graph(self.graph):
                y, loss = run(self.x, self.target)
                snap.write_back(learner)
        except Exception as e:  # the step read a tensor on the host, or changed what a replay cannot repeat
            snap.restore(learner)
            torch.cuda.synchronize(self.x.device)
            learner._graph_error = f"{type(e).__name__}: {e}"  # why the step runs eagerly (for diagnosis)
            return False
        self.y, self.loss = y, loss
        return True

    def replay(self, x_t, target_t):
        """The step on ``x_t``, ``target_t``: copy them into the static buffers, replay, and return
        copies of the output and the loss."""
        self.x.copy_(x_t)
        self.target.copy_(target_t)
        self.graph.replay()
        return self.y.clone(), (None if self.loss is None else self.loss.clone())


def graph_step(learner, x_t, target_t, run):
    """The stream step through the learner's graph when it is valid, capturing one when enough
    eager steps of this generation have run; ``run(x, target) -> (y, loss)`` is the eager step.
    Returns ``(y, loss)``."""
    g = learner.__dict__.get("_graph")
    if g is not None and g.valid(learner, x_t, target_t):
        learner._graph_replays = learner.__dict__.get("_graph_replays", 0) + 1
        return g.replay(x_t, target_t)
    learner._graph = None
    count = learner.__dict__.get("_graph_count")
    n = count[1] + 1 if count is not None and count[0] == learner._gen else 1
    learner._graph_count = (learner._gen, n)
    if n > GRAPH_AFTER:
        g = StreamGraph(learner, x_t, target_t)
        if g.capture(learner, run):
            learner._graph = g
            learner._graph_replays = learner.__dict__.get("_graph_replays", 0) + 1
            return g.replay(x_t, target_t)
        learner._graph_failures = getattr(learner, "_graph_failures", 0) + 1
    return run(x_t, target_t)


def drop_graph(learner) -> None:
    """Forget the learner's graph (an eager step ran, so the static tensors are no longer the
    learner's)."""
    if learner.__dict__.get("_graph") is not None:
        learner._graph = None

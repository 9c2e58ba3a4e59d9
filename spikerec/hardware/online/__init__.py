"""Online eligibility-trace learning (Zucchet et al. 2023; Bellec et al. 2020): exact in-layer
RTRL for independent recurrent modules (LRU, LIF/ALIF without lateral weights, leaky readouts),
spatial errors across layers, a streaming interface that carries states, traces and gradient
accumulators across calls, chunked / parallel evaluation, compiled CPU (numba) and Triton forms::

    learner = OnlineLearner(model, loss=step_loss, optimizer=opt, update_every=64)
    for x_t, target_t in stream:
        y_t, l_t = learner.step(x_t, target_t)

    loss = learner.backward(x, target, classification_loss("mean", x.shape[0]))   # batch form
"""
from .checkpoint import load_stream, save_stream
from .kinds import OnlineKind, online_kind, online_trace, register_online_kind
from .learner import BACKENDS, MODES, RULES, OnlineLearner, StepResult
from .losses import bptt_loss, classification_loss, cross_entropy_step_loss, mse_loss, mse_step_loss

__all__ = ["OnlineLearner", "StepResult", "RULES", "MODES", "BACKENDS", "classification_loss", "mse_loss",
           "mse_step_loss", "cross_entropy_step_loss", "bptt_loss", "OnlineKind", "register_online_kind", "online_kind",
           "online_trace", "save_stream", "load_stream"]

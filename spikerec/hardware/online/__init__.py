"""Online eligibility-trace learning (digest 003 §3-§8): exact in-layer RTRL for independent
recurrent modules (LRU, LIF/ALIF without lateral weights, leaky readouts), spatial errors
across layers, streaming / chunked / parallel evaluation, Triton kernels on CUDA.

    learner = OnlineLearner(model, rule="full", mode="stream")
    loss = learner.backward(x, target, classification_loss("mean", x.shape[0]))
    optimizer.step(); optimizer.zero_grad()
"""
from .learner import MODES, RULES, OnlineLearner, bptt_loss, classification_loss, mse_loss, tracer_for

__all__ = ["OnlineLearner", "RULES", "MODES", "classification_loss", "mse_loss", "bptt_loss", "tracer_for"]

"""Smallest reproductions of two snnTorch 1.0 NIR-import bugs that spikerec's cross-check names and
does not count as its own agreement (run: python hardware/scripts/snntorch_nir_bugs.py).

1. Recurrent layers: ``import_from_nir`` rewrites ``Linear -> LIF <-> Linear(W_rec)`` into a sub-graph
   whose input edge enters ``W_rec``, so the layer input is multiplied by ``W_rec``. With ``W = I``,
   ``W_rec = 0`` and an input far above threshold, no neuron fires.
2. Per-neuron time constants: for a ``LIF`` whose ``r dt / tau`` is not 1, the importer divides the
   threshold by the first of the sorted distinct values only (``hack_w_scale``), so neurons with
   another ``tau`` get a wrong threshold.
"""
import contextlib
import io

import nir
import numpy as np
import torch
from snntorch.import_nir import import_from_nir

dt = 1e-4  # snnTorch's importer hard-codes this step
zeros, ones = np.zeros(2, np.float32), np.ones(2, np.float32)


def load(graph):
    with contextlib.redirect_stdout(io.StringIO()):
        return import_from_nir(graph)


tau = np.full(2, 1e-3, np.float32)
rec = nir.NIRGraph(
    nodes={"input": nir.Input(np.array([2])), "w": nir.Linear(weight=np.eye(2, dtype=np.float32)),
           "lif": nir.LIF(tau=tau, r=tau / dt, v_leak=zeros, v_threshold=ones),
           "w_rec": nir.Linear(weight=np.zeros((2, 2), np.float32)), "output": nir.Output(np.array([2]))},
    edges=[("input", "w"), ("w", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")])
out, _ = load(rec)(torch.full((1, 2), 5.0), None)
print("1. recurrent layer, input 5 > threshold 1: spikes", out.tolist(), "- NIR (forward Euler) gives [[1.0, 1.0]]")

tau2 = np.array([1e-3, 2e-3], np.float32)
ff = nir.NIRGraph(
    nodes={"input": nir.Input(np.array([2])), "w": nir.Linear(weight=np.eye(2, dtype=np.float32)),
           "lif": nir.LIF(tau=tau2, r=ones, v_leak=zeros, v_threshold=ones), "output": nir.Output(np.array([2]))},
    edges=[("input", "w"), ("w", "lif"), ("lif", "output")])
out, _ = load(ff)(torch.full((1, 2), 12.0), None)
print("2. taus 1e-3 and 2e-3, r = 1, input 12: spikes", out.tolist(),
      "- NIR gives [[1.0, 0.0]] (v = dt/tau r x = [1.2, 0.6])")

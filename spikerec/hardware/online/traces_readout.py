"""The online form of the readout (:mod:`spikerec.neurons.readout`): the leaky integrator ``y_t =
alpha y_{t-1} + W h_t + b`` is a layer of 1-d linear modules with exact traces (``J = alpha``);
the linear readout ``y_t = W h_t + b`` is stateless, its gradient the spatial one.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import neurons
from ...kernels import readout_online
from ...layers.readout import ReadoutState
from ...scan import linear_scan
from .traces import GenericTrace, LayerTrace, Partials, acc_add, acc_mm
from .traces_lif import block_current, decay_partials

__all__ = ["ReadoutTrace", "LinearReadoutTrace"]


def _row_kernel(c, dtype, leaky: bool, B: int):
    """:func:`spikerec.kernels.readout_online.readout_rows` and its constants for readout ``c``."""
    if readout_online.readout_rows is None:
        return None
    O = c.weight.shape[0]
    f = lambda t: t.detach().to(dtype).expand(O).contiguous().numpy()  # noqa: E731
    z = np.zeros(O, dtype=f(c.weight[0, :1]).dtype)
    return readout_online.readout_rows, (c.weight.detach().t().to(dtype).contiguous().numpy(),
                                         z if c.bias is None else f(c.bias), c.bias is not None,
                                         f(c.alpha()) if leaky else z, leaky, np.zeros((B, O), dtype=z.dtype))


class ReadoutTrace(LayerTrace):
    """The leaky readout."""

    kind = "LeakyReadout"
    input_params = ("weight", "bias")

    def state_params(self):
        return ("weight", "bias", "log_tau")

    def make_consts(self, dtype):
        c = self.cell
        O = c.weight.shape[0]
        alpha, dalpha = decay_partials(c.log_tau, c.dt)
        return {"alpha_s": c.alpha().detach().to(dtype), "alpha": alpha.to(dtype).expand(O),
                "dalpha": dalpha.to(dtype).expand(O), "Wt": c.weight.detach().t().to(dtype),
                "bias": None if c.bias is None else c.bias.detach().to(dtype)}

    def step(self, x, prev):
        k = self.consts(x.dtype)
        y = torch.addmm(k["bias"], x, k["Wt"]) if k["bias"] is not None else x @ k["Wt"]
        return ReadoutState(k["alpha_s"] * prev.y + y)

    def partials(self, x, prev, new):
        k = self.consts(x.dtype)
        one = torch.ones_like(prev.y)
        vec = {"log_tau": (prev.y * k["dalpha"])[..., None]}
        if self.cell.bias is not None:
            vec["bias"] = one[..., None]
        return Partials(k["alpha"].expand_as(prev.y)[..., None, None], vec, {"weight": (one[..., None], x)})

    def errors(self, rec, g_out, sp, below: bool):
        """The state is the output: ``g = g_y``; the input's error ``g_y W``."""
        return g_out[..., None], (g_out @ self.consts(g_out.dtype)["Wt"].t() if below else None)

    def scan_block(self, x, state):
        k = self.consts(x.dtype)
        u = block_current(k, x)
        K, B, O = u.shape
        ys = linear_scan(k["alpha_s"].expand(O), u, state.y)
        new = ReadoutState(ys.reshape(K * B, O))
        return ReadoutState(torch.cat([state.y[None], ys[:-1]]).reshape(K * B, O)), ReadoutState(ys[-1]), new, new.y

    def row_kernel(self, dtype, B: int):
        return _row_kernel(self.cell, dtype, True, B)


class LinearReadoutTrace(GenericTrace):
    """The linear readout: stateless (exact); its spatial backward ``dW += g_y^T h``, ``db += sum g_y``, ``g_y W``."""

    def __init__(self, cell, rule):
        super().__init__(cell, rule, stateless=True)

    def prepare(self) -> None:
        self._W = {}

    def errors(self, rec, g_out, sp, below: bool):
        c = self.cell
        acc_mm(sp, c.weight, g_out.t(), rec[0])
        if c.bias is not None:
            acc_add(sp, c.bias, g_out.sum(0))
        if not below:
            return None, None
        W = self.__dict__.setdefault("_W", {}).get(g_out.dtype)  # the weight as the step saw it
        if W is None:
            W = self._W[g_out.dtype] = c.weight.detach().to(g_out.dtype).clone()
        return None, g_out @ W

    def scan_block(self, x, state):
        K, B = x.shape[0], x.shape[1]
        c = self.cell
        h = x.reshape(K * B, -1)
        y = h @ c.weight.detach().t() if c.bias is None else torch.addmm(c.bias.detach(), h, c.weight.detach().t())
        return None, ReadoutState(y[(K - 1) * B:]), ReadoutState(y), y

    def row_kernel(self, dtype, B: int):
        return _row_kernel(self.cell, dtype, False, B)


neurons.register_backend("readout", "online_partials (ReadoutTrace.partials)", ReadoutTrace.partials,
                         test="tests/test_online_partials.py::test_hand_written_partials_equal_derived_ones")
neurons.register_backend("readout", "online_spatial (ReadoutTrace.errors, LinearReadoutTrace.errors)",
                         LinearReadoutTrace.errors, test="tests/test_online_compiled.py::test_compiled_stream_equals_reference_stream")
neurons.register_backend("readout", "online_rows (the compiled step of the step window, ReadoutTrace.row_kernel)", ReadoutTrace.row_kernel,
                         test="tests/test_online_partials.py::test_row_kernels_with_the_layers_constants_equal_the_neuron_steps")
neurons.register_backend("readout", "online_rows (the linear readout's compiled step, LinearReadoutTrace.row_kernel)",
                         LinearReadoutTrace.row_kernel, test="tests/test_online_partials.py::test_row_kernels_with_the_layers_constants_equal_the_neuron_steps")

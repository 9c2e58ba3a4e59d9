"""Cross-simulator check: spikerec float model vs the exported NIR graph in snnTorch and in Norse
vs the integer simulator.

Neither snnTorch 1.0 nor Norse 1.1 imports NIR ``LI`` nodes, so the graphs they run are cut after
each spiking layer (:func:`spiking_subgraph`) and the readout is applied to their last layer's
spikes by spikerec's own readout (it is linear given the spikes). Conventions each reader needs:

* **snnTorch** (``snntorch.import_nir.import_from_nir``): ``dt = 1e-4`` is hard-coded, so the
  graph must be written with ``dt = 1e-4`` (the default). snnTorch 1.0 rewires a recurrent
  ``lif <-> w_rec`` cycle into a sub-graph whose input edge enters ``w_rec`` (so the layer's input
  is multiplied by ``W_rec``); for recurrent graphs the runner therefore applies snnTorch's own
  node mapping (``_nir_to_snntorch_module``) to the flat graph through ``nirtorch.nir_to_torch``. It builds ``Leaky``/``Synaptic``/
  ``RLeaky``/``RSynaptic`` with ``reset_mechanism="zero"``, ``reset_delay=False`` (NIR's hard reset),
  which gives spikerec's zero-reset spikes. For ``subtract``/``none`` layers the runner sets
  ``reset_mechanism`` from the node metadata and ``reset_delay=True`` (= spikerec's timing).
* **Norse** (``norse.torch.from_nir(graph, dt=...)``): give it the graph's ``dt``; it ignores ``r``
  of ``LIF`` nodes, so it gets :func:`~spikerec.hardware.nir_io.fold_lif_r` of the graph. Its reset is
  reset-to-value (exact for ``zero``); for ``subtract``/``none`` layers the runner gives the cells a
  ``reset_method`` from the metadata (Norse resets right after the spike, so subtracting
  ``thr / alpha`` there equals spikerec's subtraction of ``thr`` after the next decay).
* ALIF nodes (spikerec extension) are refused by both.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging

import numpy as np
import torch

from .intsim import check_integer_input, logits, simulate
from .nir_io import DEFAULT_DT, fold_lif_r, to_nir
from .xylo_network import XyloNetwork
from .xylosim_bridge import run_xylosim, xylosim_available

__all__ = ["spiking_subgraph", "run_snntorch", "run_norse", "spike_agreement", "cross_check", "UnsupportedBySimulator"]


class UnsupportedBySimulator(ValueError):
    """The graph holds a node the external simulator cannot run (named in the message)."""


def spiking_subgraph(graph, layer: int):
    """The part of a spikerec NIR graph from the input to ``layer{layer}.lif`` (its spikes are the output)."""
    import nir

    keep = {"input"}
    for k in range(layer + 1):
        keep |= {f"layer{k}.affine", f"layer{k}.lif", f"layer{k}.w_rec"}
    nodes = {k: v for k, v in graph.nodes.items() if k in keep}
    if f"layer{layer}.lif" not in nodes:
        raise ValueError(f"spiking_subgraph: graph has no node 'layer{layer}.lif'")
    n = int(np.asarray(nodes[f"layer{layer}.lif"].v_threshold).size)
    nodes["output"] = nir.Output(output_type=np.array([n]))
    edges = [(s, d) for s, d in graph.edges if s in nodes and d in nodes] + [(f"layer{layer}.lif", "output")]
    return nir.NIRGraph(nodes=nodes, edges=edges, metadata=dict(graph.metadata))


def _refuse_extensions(graph, who: str):
    for name, node in graph.nodes.items():
        meta = getattr(node, "metadata", {}) or {}
        if meta.get("spikerec_kind") == "alif":
            raise UnsupportedBySimulator(f"node '{name}' is an ALIF (spikerec NIR extension); {who} cannot run it")


def _neuron_meta(graph) -> dict:
    """sanitised module name -> node metadata, for neuron nodes."""
    out = {}
    for name, node in graph.nodes.items():
        if name.endswith(".lif"):
            out[name.replace(".", "_")] = dict(getattr(node, "metadata", {}) or {})
    return out


@torch.no_grad()
def run_snntorch(graph, x: torch.Tensor) -> torch.Tensor:
    """Run a NIR graph with snnTorch's importer, step by step; returns the output sequence."""
    import snntorch
    from snntorch.import_nir import import_from_nir

    _refuse_extensions(graph, "snnTorch")
    if abs(float(graph.metadata.get("dt", DEFAULT_DT)) - 1e-4) > 1e-12:
        raise UnsupportedBySimulator("snnTorch's NIR importer assumes dt = 1e-4; write the graph with dt=1e-4")
    recurrent = any((d, s) in graph.edges for s, d in graph.edges)
    with contextlib.redirect_stdout(io.StringIO()):
        if not recurrent:
            net = import_from_nir(copy.deepcopy(graph))
        else:
            # snnTorch 1.0's import_from_nir rewires a lif <-> w_rec cycle into a sub-graph whose input
            # edge goes into w_rec (the layer input is multiplied by W_rec); run snnTorch's own node
            # mapping on the flat graph with nirtorch's interpreter, which handles the cycle.
            import nir
            import nirtorch
            from snntorch.import_nir import _nir_to_snntorch_module

            mapping = lambda n: _nir_to_snntorch_module(n, init_hidden=True)  # noqa: E731
            node_map = {t: mapping for t in (nir.Affine, nir.Linear, nir.LIF, nir.CubaLIF, nir.IF)}
            net = nirtorch.nir_to_torch(copy.deepcopy(graph), node_map)
    metas = _neuron_meta(graph)
    for name, mod in net.named_modules():
        if isinstance(mod, snntorch.SpikingNeuron) and name in metas:
            reset = metas[name].get("reset", "zero")
            if reset != "zero":
                mod.reset_mechanism = reset
                # Leaky/Synaptic pick their update at construction; re-pick it for the new reset
                mod.state_function = mod._base_sub if reset == "subtract" else mod._base_int
                mod.reset_delay = True
    state, outs = None, []
    for t in range(x.shape[0]):
        out, state = net(x[t].float(), state)
        outs.append(out)
    return torch.stack(outs)


@torch.no_grad()
def run_norse(graph, x: torch.Tensor) -> torch.Tensor:
    """Run a NIR graph with ``norse.torch.from_nir`` at the graph's dt (``r`` of LIF folded)."""
    import norse.torch as norse
    from norse.torch.functional import reset as norse_reset
    from norse.torch.module.lif_box import LIFBoxCell

    _refuse_extensions(graph, "Norse")
    dt = float(graph.metadata.get("dt", DEFAULT_DT))
    metas = _neuron_meta(graph)
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        net = norse.from_nir(fold_lif_r(graph), dt=dt, reset_method=norse_reset.reset_value)
    finally:
        logger.setLevel(level)
    for name, mod in net.named_modules():
        reset = metas.get(name.split(".")[0], {}).get("reset", "zero")
        if isinstance(mod, LIFBoxCell) and reset != "zero":
            mod.p = mod.p._replace(reset_method=_norse_reset(reset, 1.0 - dt * mod.p.tau_mem_inv))
    state, outs = None, []
    for t in range(x.shape[0]):
        out, state = net(x[t].float(), state)
        outs.append(out)
    return torch.stack(outs)


def _norse_reset(reset: str, alpha: torch.Tensor):
    """A Norse ``reset_method`` (called right after the spike) equal to spikerec's reset timing:
    subtracting ``thr / alpha`` now equals subtracting ``thr`` after the next decay."""
    if reset == "none":
        return lambda z, v, v_reset, v_th: v
    amount = torch.where(alpha > 0, 1.0 / alpha.clamp_min(1e-12), torch.zeros_like(alpha))
    return lambda z, v, v_reset, v_th: v - z * v_th * amount


def spike_agreement(a: torch.Tensor, b: torch.Tensor) -> dict:
    """``matched``: fraction of spikes (union of both trains) at the same neuron and step;
    ``bins``: fraction of (step, sample, neuron) bins that agree."""
    a, b = a.bool(), b.bool()
    union = int((a | b).sum())
    both = int((a & b).sum())
    return {"matched": 1.0 if union == 0 else both / union, "bins": float((a == b).double().mean()),
            "spikes_a": int(a.sum()), "spikes_b": int(b.sum()), "both": both, "union": union}


@torch.no_grad()
def cross_check(model, x: torch.Tensor, labels=None, *, qnet=None, dt: float = DEFAULT_DT,
                simulators=("snntorch", "norse", "intsim")) -> dict:
    """Spike-train agreement of each simulator with the float model on ``x[T, B, C]`` for every
    hidden layer, and accuracies if ``labels`` are given. A simulator that cannot run the graph is
    reported with its reason instead of numbers."""
    graph = to_nir(model, dt=dt)
    dtype = next(model.parameters()).dtype
    y_ref, _, hidden = model(x.to(dtype), record=True)
    report = {"float": {"firing_rates": [float(z.mean()) for z in hidden]}}
    if labels is not None:
        labels = torch.as_tensor(labels)
        report["float"]["accuracy"] = float((model.logits(y_ref).argmax(-1) == labels).double().mean())
    if isinstance(qnet, XyloNetwork) and "intsim" in simulators and "xylosim" not in simulators:
        simulators = tuple(simulators) + ("xylosim",)
    for sim in simulators:
        try:
            if sim == "xylosim":
                if not isinstance(qnet, XyloNetwork):
                    continue
                if not xylosim_available():
                    raise UnsupportedBySimulator("xylosim is not installed (pip install 'spikerec[xylo]')")
                xi = check_integer_input(x, qnet.input_size)
                ref, ours = run_xylosim(qnet.spec, xi), qnet.run(xi)
                layers, acc_logits = qnet.layer_spikes(ref.spikes), logits(qnet, ref.vmem_out)
                same = {k: bool(torch.equal(getattr(ref, k), getattr(ours, k))) for k in ref.__dict__}
            elif sim == "intsim":
                if qnet is None:
                    continue
                res = simulate(qnet, x)
                layers, acc_logits = res.spikes, logits(qnet, res.y)
            else:
                run = {"snntorch": run_snntorch, "norse": run_norse}[sim]
                layers = [run(spiking_subgraph(graph, k), x) for k in range(len(model.cells))]
                y = model.readout(layers[-1].to(dtype))[0]
                acc_logits = model.logits(y)
        except UnsupportedBySimulator as e:
            report[sim] = {"skipped": str(e)}
            continue
        entry = {"layers": [spike_agreement(zf, zs) for zf, zs in zip(hidden, layers)]}
        if sim == "xylosim":
            entry["bit_identical_to_intsim"] = all(same.values())
            entry["identical_fields"] = same
        entry["matched"] = min(e["matched"] for e in entry["layers"])
        if labels is not None:
            entry["accuracy"] = float((acc_logits.argmax(-1) == labels).double().mean())
        report[sim] = entry
    return report

"""Cross-simulator check: spikerec float model vs the exported NIR graph in snnTorch and in Norse,
each run **unpatched** as a user loads the file, vs the integer simulator (and ``xylosim`` for Xylo).

Neither snnTorch 1.0 nor Norse 1.1 imports NIR ``LI`` nodes, so the graphs they run are cut after
each spiking layer (:func:`spiking_subgraph`) and the readout is applied to their last layer's
spikes by spikerec's own readout (linear given the spikes); the report says so. What each reader
does with spikerec's graphs:

* **snnTorch** (``snntorch.import_nir.import_from_nir``): ``dt = 1e-4`` is hard-coded, so the
  graph must be written with ``dt = 1e-4`` (the default). It builds ``Leaky``/``Synaptic`` with a
  hard reset, which is spikerec's reset ``zero``. Its recurrent import is wrong
  (:data:`SNNTORCH_RECURRENT_BUG`); the report names the bug, does not count that figure as spikerec's
  agreement, and adds a labelled figure from snnTorch's own node mapping on the flat graph.
* **Norse** (``norse.torch.from_nir(graph, dt=...)``): give it the graph's ``dt``. It ignores ``r``
  of ``LIF`` nodes; spikerec writes ``r = 1`` (folded into the weights), so it reads the file as is.
* **Rockpool** (``rockpool.nn.modules.torch.nir.from_nir``), when installed: a further reader, run
  unpatched; Rockpool 3.1 fails on NIR ``LIF`` nodes (it reads ``tau_mem``) and runs ``CubaLIF``
  with its own dynamics, so its figure is reported, not required. (Sinabs is not a checked reader:
  installing it next to Rockpool downgrades ``nir``.)
* Reset ``subtract``/``none`` and ALIF are not NIR: such models get no graph unless written with
  spikerec's extensions, and then the unpatched figures come first and a figure with the reset
  patched from the metadata is labelled as such.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings

import numpy as np
import torch

from .intsim import check_integer_input, logits, simulate
from .nir_io import DEFAULT_DT, NIRExportError, fold_lif_r, nir_extensions_needed, to_nir
from .xylo.network import XyloNetwork
from .xylo.xylosim_bridge import run_xylosim, xylosim_available

__all__ = ["spiking_subgraph", "run_snntorch", "run_norse", "run_rockpool", "spike_agreement", "cross_check", "UnsupportedBySimulator"]


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


#: snnTorch 1.0's own bug, reported and not counted as spikerec's agreement (smallest reproduction in
#: ``docs/export.md``): ``import_from_nir`` turns a ``lif <-> w_rec`` cycle into a sub-graph whose input
#: edge enters ``w_rec``, so the layer's input is multiplied by ``W_rec`` instead of reaching the neuron.
SNNTORCH_RECURRENT_BUG = ("snnTorch 1.0 import_from_nir feeds a recurrent layer's input through W_rec (its own bug; "
                          "see docs/export.md); the figure is not spikerec's agreement")


#: snnTorch 1.0's own bug: for a ``LIF`` node whose input scale ``r dt / tau`` is not 1, its importer
#: divides the threshold by the *first* distinct value only (``hack_w_scale``), wrong when the neurons'
#: ``tau`` differ (learned time constants). spikerec writes ``r = 1`` (Norse ignores ``r``), so such
#: layers hit it. Not counted as spikerec's agreement.
SNNTORCH_W_SCALE_BUG = ("snnTorch 1.0 import_from_nir scales a LIF layer's threshold by the first of its neurons' "
                        "r*dt/tau values only (its own bug when taus differ; see docs/export.md); the figure is not "
                        "spikerec's agreement")


def _snntorch_w_scale_bug(graph) -> bool:
    import nir

    for node in graph.nodes.values():
        if isinstance(node, nir.LIF):
            w = np.asarray(node.r, np.float64) * float(graph.metadata.get("dt", DEFAULT_DT)) / np.asarray(node.tau, np.float64)
            if np.unique(np.round(w, 12)).size > 1:
                return True
    return False


def _is_recurrent(graph) -> bool:
    return any((d, s) in graph.edges for s, d in graph.edges)


@torch.no_grad()
def run_snntorch(graph, x: torch.Tensor, *, patched: bool = False, flat: bool = False) -> torch.Tensor:
    """Run a NIR graph with snnTorch, step by step; returns the output sequence.

    Default: exactly as a user loads a file, ``snntorch.import_nir.import_from_nir(graph)``.
    ``flat=True``: snnTorch's own node mapping run by ``nirtorch.nir_to_torch`` on the flat graph (a
    workaround for snnTorch's recurrent import, :data:`SNNTORCH_RECURRENT_BUG`). ``patched=True``: the
    neurons' reset taken from spikerec's metadata (``reset_delay=True``) - a patched figure."""
    import snntorch
    from snntorch.import_nir import import_from_nir

    if patched:
        _refuse_extensions(graph, "snnTorch")
    if abs(float(graph.metadata.get("dt", DEFAULT_DT)) - 1e-4) > 1e-12:
        raise UnsupportedBySimulator("snnTorch's NIR importer assumes dt = 1e-4; write the graph with dt=1e-4")
    with contextlib.redirect_stdout(io.StringIO()):
        if not flat:
            net = import_from_nir(copy.deepcopy(graph))
        else:
            import nir
            import nirtorch
            from snntorch.import_nir import _nir_to_snntorch_module

            mapping = lambda n: _nir_to_snntorch_module(n, init_hidden=True)  # noqa: E731
            node_map = {t: mapping for t in (nir.Affine, nir.Linear, nir.LIF, nir.CubaLIF, nir.IF)}
            net = nirtorch.nir_to_torch(copy.deepcopy(graph), node_map)
    if patched:
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
def run_norse(graph, x: torch.Tensor, *, patched: bool = False) -> torch.Tensor:
    """Run a NIR graph with ``norse.torch.from_nir(graph, dt=<the graph's dt>)``, as a user loads a file.
    ``patched=True``: ``r`` folded (:func:`fold_lif_r`, a no-op for spikerec's own graphs) and the
    neurons' reset taken from spikerec's metadata - a patched figure."""
    with warnings.catch_warnings():  # Norse scripts its modules with torch.jit, which torch 2.14 deprecates
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated", category=FutureWarning)
        import norse.torch as norse
        from norse.torch.module.lif_box import LIFBoxCell

    if patched:
        _refuse_extensions(graph, "Norse")
    dt = float(graph.metadata.get("dt", DEFAULT_DT))
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        net = norse.from_nir(fold_lif_r(graph) if patched else copy.deepcopy(graph), dt=dt)
    finally:
        logger.setLevel(level)
    if patched:
        metas = _neuron_meta(graph)
        for name, mod in net.named_modules():
            reset = metas.get(name.split(".")[0], {}).get("reset", "zero")
            if isinstance(mod, LIFBoxCell) and reset != "zero":
                mod.p = mod.p._replace(reset_method=_norse_reset(reset, 1.0 - dt * mod.p.tau_mem_inv))
    state, outs = None, []
    for t in range(x.shape[0]):
        out, state = net(x[t].float(), state)
        outs.append(out)
    return torch.stack(outs)


@torch.no_grad()
def run_rockpool(graph, x: torch.Tensor) -> torch.Tensor:
    """Run a NIR graph with Rockpool's importer (``rockpool.nn.modules.torch.nir.from_nir``), unpatched,
    batch-first as Rockpool expects; returns ``[T, B, N]``. Skipped when Rockpool is not installed
    (``pip install "spikerec[rockpool]"``) or its importer fails on the graph (the reason is reported)."""
    try:
        from rockpool.nn.modules.torch.nir import from_nir as rockpool_from_nir
    except ImportError:
        raise UnsupportedBySimulator("Rockpool is not installed (pip install 'spikerec[rockpool]')") from None
    try:
        net = rockpool_from_nir(copy.deepcopy(graph))
        out = net(x.float().transpose(0, 1))[0]
    except Exception as e:  # the reader's own failure, reported instead of a figure
        raise UnsupportedBySimulator(f"Rockpool's from_nir cannot run this graph ({type(e).__name__}: {e})") from None
    return out.transpose(0, 1)


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


PEERS = ("snntorch", "norse", "rockpool")
READOUT_NOTE = "LI readout not read by snnTorch 1.0 / Norse 1.1: spikerec's readout is applied to their last layer's spikes"


@torch.no_grad()
def cross_check(model, x: torch.Tensor, labels=None, *, qnet=None, dt: float = DEFAULT_DT,
                simulators=("snntorch", "norse", "rockpool", "intsim"), extensions: bool = False) -> dict:
    """Spike-train agreement of each simulator with the float model on ``x[T, B, C]`` for every
    hidden layer, and accuracies if ``labels`` are given. A simulator that cannot run the graph is
    reported with its reason instead of numbers.

    Peers (snnTorch, Norse) run the NIR graph **unpatched**, as a user loads the file (entries
    ``snntorch``, ``norse``). Further entries are labelled: ``snntorch (flat graph)`` (snnTorch's own
    node mapping, a workaround for its recurrent import bug, which is named in the ``snntorch`` entry)
    and, for graphs written with ``extensions=True``, ``<peer> (patched from spikerec metadata)``.
    A model NIR cannot express without extensions (:func:`~spikerec.hardware.export.nir_io.to_nir`) makes the
    peers report why they were skipped."""
    dtype = next(model.parameters()).dtype
    y_ref, _, hidden = model(x.to(dtype), record=True)
    report = {"float": {"firing_rates": [float(z.mean()) for z in hidden]}}
    if labels is not None:
        labels = torch.as_tensor(labels)
        report["float"]["accuracy"] = float((model.logits(y_ref).argmax(-1) == labels).double().mean())
    try:
        graph, graph_error = to_nir(model, dt=dt, extensions=extensions), None
    except NIRExportError:
        graph, graph_error = None, ("NIR cannot express " + "; ".join(nir_extensions_needed(model)) +
                                    " (train with reset 'zero', or --nir-extensions for spikerec metadata)")
    runs = []  # (entry name, runner, note)
    for sim in simulators:
        if sim in PEERS:
            if graph is None:
                report[sim] = {"skipped": f"no NIR graph: {graph_error}"}
                continue
            if sim == "snntorch":
                rec = _is_recurrent(graph)
                bugs = [b for b, hit in ((SNNTORCH_RECURRENT_BUG, rec), (SNNTORCH_W_SCALE_BUG, _snntorch_w_scale_bug(graph)))
                        if hit]
                runs.append(("snntorch", lambda g, xx: run_snntorch(g, xx), "; ".join(bugs) or None))
                if rec:
                    runs.append(("snntorch (flat graph)", lambda g, xx: run_snntorch(g, xx, flat=True),
                                 "workaround: snnTorch's node mapping on the flat graph"))
            elif sim == "rockpool":
                runs.append(("rockpool", lambda g, xx: run_rockpool(g, xx), None))
            else:
                runs.append(("norse", lambda g, xx: run_norse(g, xx), None))
            if extensions and nir_extensions_needed(model) and sim != "rockpool":
                patched = (lambda g, xx: run_snntorch(g, xx, patched=True, flat=True)) if sim == "snntorch" else \
                    (lambda g, xx: run_norse(g, xx, patched=True))
                runs.append((f"{sim} (patched from spikerec metadata)", patched,
                             "patched: the reset read from spikerec's extension metadata, not as a user loads the file"))
        else:
            runs.append((sim, None, None))
    if isinstance(qnet, XyloNetwork) and "intsim" in simulators and "xylosim" not in simulators:
        runs.append(("xylosim", None, None))
    for name, runner, note in runs:
        try:
            if name == "xylosim":
                if not isinstance(qnet, XyloNetwork):
                    continue
                if not xylosim_available():
                    raise UnsupportedBySimulator("xylosim is not installed (pip install 'spikerec[xylo]')")
                xi = check_integer_input(x, qnet.input_size)
                ref, ours = run_xylosim(qnet.spec, xi), qnet.run(xi)
                layers, acc_logits = qnet.layer_spikes(ref.spikes), logits(qnet, ref.vmem_out)
                same = {k: bool(torch.equal(getattr(ref, k), getattr(ours, k))) for k in ref.__dict__}
            elif name == "intsim":
                if qnet is None:
                    continue
                res = simulate(qnet, x)
                layers, acc_logits = res.spikes, logits(qnet, res.y)
            else:
                layers = [runner(spiking_subgraph(graph, k), x) for k in range(len(model.cells))]
                y = model.readout(layers[-1].to(dtype))[0]
                acc_logits = model.logits(y)
        except UnsupportedBySimulator as e:
            report[name] = {"skipped": str(e)}
            continue
        entry = {"layers": [spike_agreement(zf, zs) for zf, zs in zip(hidden, layers)]}
        entry["matched"] = min(e["matched"] for e in entry["layers"])
        if labels is not None:
            entry["accuracy"] = float((acc_logits.argmax(-1) == labels).double().mean())
        if note and ("SNNTORCH" in note.upper() and "own bug" in note):
            entry["peer_bug"] = note
        elif note:
            entry["label"] = note
        if runner is not None and model.readout.leaky:
            entry["readout"] = READOUT_NOTE
        if name == "xylosim":
            entry["bit_identical_to_intsim"] = all(same.values())
            entry["identical_fields"] = same
        report[name] = entry
    return report

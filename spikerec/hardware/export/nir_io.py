"""NIR export and import of spikerec models (``nir`` 1.0 graphs, HDF5 files).

**dt mapping** (the convention of snnTorch's ``export_to_nir``/``import_from_nir``). NIR neurons are
continuous: ``tau dv/dt = (v_leak - v) + r I``. A reader integrating with forward Euler at step
``dt`` gets ``v <- (1 - dt/tau) v + (dt/tau) r I``. spikerec's discrete ``v <- alpha v + J`` with
``alpha = exp(-dt_model / tau_model)`` is therefore written as::

    LIF:      tau = dt / (1 - alpha),  r = 1 (the factor tau / dt folded into the preceding Affine/Linear
              and the recurrent Linear), v_leak = 0, v_reset = 0
    CubaLIF:  tau_syn = dt / (1 - alpha_syn), w_in = tau_syn / dt, tau_mem = dt / (1 - alpha), r = tau_mem / dt
    LI:       tau = dt / (1 - alpha), r = tau / dt (leaky readout; a plain readout is just the Affine)

with ``dt = 1e-4`` by default: snnTorch's importer hard-codes ``dt = 1e-4``; Norse's ``from_nir`` takes
``dt=`` and must be given the same value (and ignores ``r`` of ``LIF`` nodes, see
:func:`fold_lif_r`). The bias is the ``Affine`` bias (inside ``J``, filtered by the synapse for
CubaLIF, exactly as spikerec). Graph metadata holds ``dt``; every neuron node's metadata holds
``reset``, ``reset_timing`` and ``spikerec_kind``. Each neuron kind's mapping, both directions, is one
entry of :data:`spikerec.hardware.export.nir_map.MAPPINGS`; this module walks the graph.

**What NIR cannot express is refused.** NIR neurons reset to ``v_reset``: spikerec's reset
``zero`` is exactly that; ``subtract`` and ``none`` and the ALIF are not NIR, and every reader
would run them as a zero reset. :func:`to_nir` therefore raises :class:`NIRExportError` for them
unless ``extensions=True`` (CLI ``--nir-extensions``), which writes them as spikerec extensions in the
node metadata (only spikerec's :func:`from_nir` reads them). The conversion path: train or fine-tune
with reset ``"zero"`` (``adapt_reset`` in :func:`~spikerec.hardware.export.quantize.finetune` for a target
with the zero reset, such as ``loihi2``).

**Reset timing.** spikerec's state ``v`` is the membrane before the reset; the reset is applied at
the next step (snnTorch ``reset_delay=True``). For reset ``zero`` this gives the same spikes as
NIR's immediate reset to ``v_reset = 0``. For ``subtract`` it is snnTorch's ``reset_delay=True``
(the subtraction is not decayed), which NIR cannot express: metadata only.

**Recurrence**: ``layer{k}.lif -> layer{k}.w_rec -> layer{k}.lif`` (a cycle of two edges; the
``w_rec`` Linear holds the effective matrix with its zero diagonal), the form snnTorch reads.

**ALIF** is a spikerec extension: a ``LIF`` node (``tau`` = membrane, ``v_threshold = b``) whose
metadata has ``spikerec_kind = "alif"``, ``tau_adapt`` (same dt mapping: ``dt / (1 - rho)``) and
``beta``. :func:`from_nir` restores it exactly; readers that ignore metadata would run a plain
LIF, so :mod:`spikerec.hardware.export.crosscheck` refuses to run such graphs in snnTorch/Norse.
"""
from __future__ import annotations

import copy
import os

import nir
import numpy as np
import torch

from ...atomic import atomic_path
from ...errors import ExportError
from ...layers.readout import LeakyReadout
from ...models import RecurrentStack
from .nir_map import MAPPINGS, SPIKING_NODE_TYPES, NIRImportError, _np, assign_params, mapping_for_cell, mapping_for_node

__all__ = ["to_nir", "write_nir", "read_nir", "from_nir", "fold_lif_r", "NIRImportError", "NIRExportError", "DEFAULT_DT",
           "flatten_graph", "nir_extensions_needed"]

DEFAULT_DT = 1e-4
FORMAT = "spikerec-nir-1"


class NIRExportError(ExportError):
    """A model NIR cannot express without spikerec's extensions; the message names the layer and the way out."""


def nir_extensions_needed(model) -> list[str]:
    """``["cells.k: why", ...]`` for each layer NIR cannot express (empty: plain NIR suffices)."""
    out = []
    for k, cell in enumerate(model.cells):
        mapping = mapping_for_cell(cell)
        why = mapping.extension(cell) if mapping is not None else None
        if why:
            out.append(f"cells.{k}: {why}")
    return out


def _fold(gain: np.ndarray, node):
    """Scale an Affine/Linear node's rows by ``gain`` (float64), in place."""
    node.weight = (np.asarray(node.weight, np.float64) * gain[:, None]).astype(np.float32)
    if isinstance(node, nir.Affine):
        node.bias = (np.asarray(node.bias, np.float64) * gain).astype(np.float32)


def _affine(weight, bias):
    W = _np(weight)
    return nir.Affine(weight=W, bias=_np(bias)) if bias is not None else nir.Linear(weight=W)


def to_nir(model, *, dt: float = DEFAULT_DT, extensions: bool = False):
    """The :class:`nir.NIRGraph` of a :class:`~spikerec.models.RecurrentStack` of LIF/ALIF cells and a
    ``LeakyReadout`` (see the module docstring for the mapping; each neuron is written by its entry of
    :data:`spikerec.hardware.export.nir_map.MAPPINGS`). Raises :class:`NIRExportError` for layers NIR cannot
    express (reset ``subtract``/``none``, ALIF) unless ``extensions=True``."""
    if not (dt > 0):
        raise ValueError(f"to_nir: dt must be > 0, got {dt!r}")
    needed = nir_extensions_needed(model)
    if needed and not extensions:
        raise NIRExportError(
            "NIR cannot express " + "; ".join(needed) + ". Every NIR reader would run a reset to zero instead. "
            "Train or fine-tune the model with reset 'zero' (e.g. finetune(model, 'loihi2', ..., adapt_reset=True)), "
            "or write spikerec's extension metadata with extensions=True (CLI: --nir-extensions), "
            "which only spikerec's from_nir reads")
    nodes = {"input": nir.Input(input_type=np.array([model.input_size]))}
    edges = []
    prev = "input"
    for k, cell in enumerate(model.cells):
        mapping = mapping_for_cell(cell)
        if mapping is None or mapping.kind == "readout":
            raise ValueError(f"to_nir: layer cells.{k} ({type(cell).__name__}) has no NIR form (only LIF and ALIF)")
        pre = f"layer{k}"
        p = cell.params()
        nodes[f"{pre}.affine"] = _affine(p.weight, p.bias)
        written = mapping.to_node(cell, dt)
        if written.gain is not None:
            _fold(written.gain, nodes[f"{pre}.affine"])
        nodes[f"{pre}.lif"] = written.node
        edges += [(prev, f"{pre}.affine"), (f"{pre}.affine", f"{pre}.lif")]
        if p.recurrent_weight is not None:
            nodes[f"{pre}.w_rec"] = nir.Linear(weight=_np(p.recurrent_weight))
            if written.gain is not None:
                _fold(written.gain, nodes[f"{pre}.w_rec"])
            edges += [(f"{pre}.lif", f"{pre}.w_rec"), (f"{pre}.w_rec", f"{pre}.lif")]
        prev = f"{pre}.lif"
    ro = model.readout
    p = ro.params()
    nodes["readout.affine"] = _affine(p.weight, p.bias)
    edges.append((prev, "readout.affine"))
    prev = "readout.affine"
    written = MAPPINGS["readout"].to_node(ro, dt)
    if written is not None:
        nodes["readout.li"] = written.node
        edges.append((prev, "readout.li"))
        prev = "readout.li"
    nodes["output"] = nir.Output(output_type=np.array([ro.output_size]))
    edges.append((prev, "output"))
    meta = {"format": FORMAT, "producer": "spikerec", "dt": dt, "readout_mode": model.readout_mode,
            "discretisation": "forward Euler: v <- (1 - dt/tau) v + (dt/tau) (v_leak + r I)"}
    return nir.NIRGraph(nodes=nodes, edges=edges, metadata=meta)


def write_nir(model_or_graph, path: str, *, dt: float = DEFAULT_DT, extensions: bool = False) -> str:
    """Write a model (or a graph) to a NIR HDF5 file, through a temporary file and a rename
    (:func:`to_nir`; nothing is written when it refuses)."""
    graph = model_or_graph if isinstance(model_or_graph, nir.NIRGraph) else to_nir(model_or_graph, dt=dt,
                                                                                    extensions=extensions)
    with atomic_path(path) as tmp:
        nir.write(str(tmp), graph)
    return path


def read_nir(path: str):
    """Read a NIR file; a clear error for a missing, corrupt or foreign file."""
    if not os.path.exists(path):
        raise NIRImportError(f"NIR file '{path}': no such file")
    try:
        g = nir.read(path)
    except Exception as e:  # h5py raises OSError, KeyError, ValueError ... for broken files
        raise NIRImportError(f"NIR file '{path}': not a readable NIR graph ({type(e).__name__}: {e})") from None
    if not isinstance(g, nir.NIRGraph):
        raise NIRImportError(f"NIR file '{path}': holds a single {type(g).__name__} node, not a graph")
    return g


# --- import ----------------------------------------------------------------------------------
def flatten_graph(graph):
    """Inline nested sub-graphs (snnTorch writes recurrent layers as ``NIRGraph`` nodes holding
    ``input -> lif <-> w_rec -> output``); returns ``(nodes, edges)`` of the flat graph."""
    nodes, edges = {}, []
    inner_in, inner_out = {}, {}
    for name, node in graph.nodes.items():
        if isinstance(node, nir.NIRGraph):
            sub_nodes, sub_edges = flatten_graph(node)
            ins = [k for k, v in sub_nodes.items() if isinstance(v, nir.Input)]
            outs = [k for k, v in sub_nodes.items() if isinstance(v, nir.Output)]
            if len(ins) != 1 or len(outs) != 1:
                raise NIRImportError(f"node '{name}': sub-graph needs one Input and one Output node")
            for k, v in sub_nodes.items():
                if k not in ins + outs:
                    nodes[f"{name}/{k}"] = v
            inner_in[name] = [f"{name}/{d}" for s, d in sub_edges if s == ins[0]]
            inner_out[name] = [f"{name}/{s}" for s, d in sub_edges if d == outs[0]]
            edges += [(f"{name}/{s}", f"{name}/{d}") for s, d in sub_edges if s not in ins and d not in outs]
        else:
            nodes[name] = node
    for s, d in graph.edges:
        for ss in inner_out.get(s, [s]):
            for dd in inner_in.get(d, [d]):
                edges.append((ss, dd))
    # snnTorch's sub-graphs wire their Input to w_rec; an input edge into w_rec of a lif<->w_rec pair
    # belongs to the lif node.
    fixed = []
    for s, d in edges:
        node = nodes.get(d)
        if isinstance(node, (nir.Linear, nir.Affine)):
            outs = [dd for ss, dd in edges if ss == d]
            if len(outs) == 1 and (outs[0], d) in edges and s != outs[0]:
                fixed.append((s, outs[0]))
                continue
        fixed.append((s, d))
    return nodes, list(dict.fromkeys(fixed))


def _weight_of(node, name):
    if isinstance(node, (nir.Affine, nir.Linear)):
        w = np.asarray(node.weight, np.float64)
        b = getattr(node, "bias", None) if isinstance(node, nir.Affine) else None
        b = np.zeros(w.shape[0]) if b is None else np.asarray(b, np.float64).reshape(-1)
        for field, a in (("weight", w), ("bias", b)):
            if not np.all(np.isfinite(a)):
                raise NIRImportError(f"node '{name}': field '{field}' has NaN or infinite values")
        return w, b
    raise NIRImportError(f"node '{name}': expected an Affine or Linear node, got {type(node).__name__}")


def from_nir(graph_or_path, *, dt: float | None = None, readout_mode: str | None = None):
    """A :class:`~spikerec.models.RecurrentStack` from a NIR graph (or file).

    Reads graphs of the form ``Input -> (Affine|Linear -> LIF|CubaLIF|IF [<-> Linear])* ->
    Affine|Linear [-> LI] -> Output`` as written by spikerec, snnTorch (``export_to_nir``) and Norse
    (``to_nir``), including snnTorch's recurrent sub-graphs. ``dt``: the integration step the graph
    was written for (default: the graph's ``dt`` metadata, else 1e-4 as snnTorch). Norse 1.1's
    ``to_nir`` writes ``tau = dt / tau_mem_inv`` (``dt * tau``, Norse issue #411) with ``r = 1``; its
    discrete decay ``1 - dt tau_mem_inv`` equals ``1 - dt^2 / tau``, so read such graphs with
    ``dt = dt_norse ** 2`` (``1e-6`` for Norse's default ``dt = 1e-3``). Each NIR neuron becomes the exact discrete update ``v <- (1 - dt/tau) v + (dt/tau) r I``;
    ``(dt/tau) r`` is folded into the incoming weights. A graph that ends in a spiking layer gets an
    identity readout (``y_t = z_t``, mode ``mean``: spike counts).
    """
    graph = read_nir(graph_or_path) if isinstance(graph_or_path, (str, os.PathLike)) else graph_or_path
    if not isinstance(graph, nir.NIRGraph):
        raise NIRImportError(f"from_nir: expected a nir.NIRGraph or a file path, got {type(graph).__name__}")
    gmeta = dict(getattr(graph, "metadata", {}) or {})
    dt = float(dt if dt is not None else gmeta.get("dt", DEFAULT_DT))
    nodes, edges = flatten_graph(graph)
    supported = (nir.Input, nir.Output, nir.Affine, nir.Linear, *{t for m in MAPPINGS.values() for t in m.node_types})
    for name, node in nodes.items():
        if not isinstance(node, supported):
            raise NIRImportError(f"node '{name}': NIR {type(node).__name__} is not supported by spikerec "
                                 f"(Affine/Linear, LIF, CubaLIF, IF, LI and recurrent cycles only)")
    succ = {k: [d for s, d in edges if s == k] for k in nodes}
    pred = {k: [s for s, d in edges if d == k] for k in nodes}
    for s, d in edges:
        if s not in nodes or d not in nodes:
            raise NIRImportError(f"edge ({s!r}, {d!r}) refers to a node that does not exist")
    inputs = [k for k, v in nodes.items() if isinstance(v, nir.Input)]
    if len(inputs) != 1:
        raise NIRImportError(f"graph needs exactly one Input node, found {inputs}")
    neuron_t = SPIKING_NODE_TYPES

    def rec_partner(name):
        for w in succ[name]:
            if isinstance(nodes[w], (nir.Linear, nir.Affine)) and succ[w] == [name] and pred[w] == [name]:
                return w
        return None

    cells = []
    cur = inputs[0]
    width = None
    ro_cell = None
    while True:
        nxt = [d for d in succ[cur] if d != rec_partner(cur)] if isinstance(nodes[cur], neuron_t) else succ[cur]
        if len(nxt) != 1:
            raise NIRImportError(f"node '{cur}': expected one successor in a feed-forward chain, found {nxt or 'none'}")
        wname = nxt[0]
        if isinstance(nodes[wname], nir.Output):
            if not cells:
                raise NIRImportError("graph has no spiking layer")
            n = cells[-1].hidden_size
            ro_cell = LeakyReadout(n, n, tau=None, bias=False)
            assign_params(ro_cell, weight=torch.eye(n))
            readout_mode = readout_mode or "mean"
            break
        W, b = _weight_of(nodes[wname], wname)
        if width is None:
            width = W.shape[1]
        if len(succ[wname]) != 1:
            raise NIRImportError(f"node '{wname}': expected one successor, found {succ[wname]}")
        nname = succ[wname][0]
        node = nodes[nname]
        n = W.shape[0]
        if isinstance(node, nir.Output) or MAPPINGS["readout"].claims(node, {}):
            if isinstance(node, nir.Output):
                ro_cell = LeakyReadout(W.shape[1], n, tau=None)
            else:
                read = MAPPINGS["readout"].from_node(node, nname, n, dt, {})
                W, b = W * read.gain[:, None], b * read.gain + read.offset
                ro_cell = read.build(W.shape[1], n, b, False)
                if len(succ[nname]) != 1 or not isinstance(nodes[succ[nname][0]], nir.Output):
                    raise NIRImportError(f"node '{nname}': an LI readout must be followed by the Output node")
            assign_params(ro_cell, weight=torch.tensor(W), bias=torch.tensor(b))
            readout_mode = readout_mode or gmeta.get("readout_mode", "mean")
            break
        mapping = mapping_for_node(node)
        if not isinstance(node, neuron_t) or mapping is None:
            raise NIRImportError(f"node '{nname}': expected a neuron (LIF, CubaLIF, IF) after '{wname}', got {type(node).__name__}")
        read = mapping.from_node(node, nname, n, dt, dict(getattr(node, "metadata", {}) or {}))
        g = read.gain
        W, b = W * g[:, None], b * g + read.offset
        wr_name = rec_partner(nname)
        Wr = None
        if wr_name is not None:
            Wr, br = _weight_of(nodes[wr_name], wr_name)
            if Wr.shape != (n, n):
                raise NIRImportError(f"node '{wr_name}': recurrent weight shape {Wr.shape}, expected {(n, n)}")
            if np.any(br != 0):
                raise NIRImportError(f"node '{wr_name}': field 'bias' of a recurrent Affine must be 0 (a recurrent bias "
                                     "is not supported; fold it into the input Affine's bias)")
            Wr = Wr * g[:, None]
        extra = [p for p in pred[nname] if p not in (wname, wr_name)]
        if extra:
            raise NIRImportError(f"node '{nname}': unsupported extra inputs {extra}")
        cell = read.build(W.shape[1], n, b, Wr is not None)
        weights = {"weight": torch.tensor(W)}
        if cell.bias is not None:
            weights["bias"] = torch.tensor(b)
        if Wr is not None:
            weights["recurrent_weight"] = torch.tensor(Wr)
        assign_params(cell, **weights)
        if cells and cells[-1].hidden_size != W.shape[1]:
            raise NIRImportError(f"node '{wname}': takes {W.shape[1]} inputs but the previous layer has {cells[-1].hidden_size}")
        cells.append(cell)
        cur = nname
    if not cells:
        raise NIRImportError("graph has no spiking layer between Input and the readout")
    return RecurrentStack(cells, ro_cell, readout_mode=readout_mode)


def fold_lif_r(graph):
    """A copy of ``graph`` with each ``LIF`` node's ``r`` folded into its incoming Affine/Linear
    weights (``r = 1`` afterwards). Equivalent NIR semantics; needed by readers that ignore ``r``
    of ``LIF`` (Norse 1.1's ``from_nir`` warns and drops it)."""
    g = copy.deepcopy(graph)
    nodes = g.nodes
    for name, node in list(nodes.items()):
        if isinstance(node, nir.NIRGraph):
            nodes[name] = fold_lif_r(node)
            continue
        if not isinstance(node, nir.LIF):
            continue
        r = np.asarray(node.r, np.float64).reshape(-1)
        for s, d in g.edges:
            if d == name:
                w = nodes[s]
                if not isinstance(w, (nir.Affine, nir.Linear)):
                    raise NIRImportError(f"node '{name}': cannot fold r into input '{s}' ({type(w).__name__})")
                w.weight = (np.asarray(w.weight, np.float64) * r[:, None]).astype(np.float32)
                if isinstance(w, nir.Affine) and w.bias is not None:
                    w.bias = (np.asarray(w.bias, np.float64) * r).astype(np.float32)
        node.r = np.ones_like(np.asarray(node.r))
    return g


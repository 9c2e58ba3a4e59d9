"""Every compiled function of the package (numba ``@njit``/``@jit``, ``@triton.jit``) is reached, in the
package's static call graph (:mod:`call_graph`), from the callable of a backend registered with
:func:`spikerec.neurons.register_backend`, and every registered backend names an equality test that
exists: so each compiled function lies on a path that some equality test against a neuron kind's
definition runs. A compiled function added without a registered backend that reaches it fails here,
with its name and module."""
from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path

import pytest

import spikerec
from spikerec import neurons

from call_graph import CallGraph

ROOT = Path(spikerec.__file__).parent
TESTS = Path(__file__).parent

# Compiled functions that no registered backend reaches yet, by the test that runs each against its
# torch form: the backward kernels of the online learner's whole-stack stream step. Kept short: such
# a kernel belongs in a backend.
NOT_YET_REACHED = {
    "tests/test_online_fused.py::test_fused_spiking_equals_reference_with_resets": [
        "spikerec.kernels.lif_online._lif_bwd", "spikerec.kernels.alif_online._alif_bwd"],
    "tests/test_online_fused.py::test_fused_equals_reference_with_resets": [
        "spikerec.kernels.lru_online._lru_bwd", "spikerec.kernels.readout_online._linear_bwd"],
    "tests/test_online_fused.py::test_fused_mse_is_one_compiled_call": [
        "spikerec.kernels.readout_online._readout_mse", "spikerec.kernels.readout_online._mse",
        "spikerec.kernels.readout_online._any_nan"],
}


@pytest.fixture(scope="module")
def graph() -> CallGraph:
    return CallGraph(ROOT)


@pytest.fixture(scope="module")
def backends() -> list[neurons.Backend]:
    for info in pkgutil.walk_packages(spikerec.__path__, "spikerec."):
        if info.name.endswith("__main__"):
            continue
        try:  # every module, so that every registration runs (optional dependencies may be missing)
            importlib.import_module(info.name)
        except ImportError:
            pass
    return [b for kind in neurons.KINDS for b in neurons.backends_of(kind).values()]


@functools.lru_cache(maxsize=None)
def nodes_in(path: str) -> frozenset[str]:
    """The pytest nodes that ``path`` defines: ``path::test_x`` and ``path::TestClass::test_x``."""
    file = TESTS.parent / path
    if not file.is_file():
        return frozenset()
    out = set()
    for n in ast.parse(file.read_text()).body:
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test"):
            out.add(f"{path}::{n.name}")
        elif isinstance(n, ast.ClassDef):
            out.update(f"{path}::{n.name}::{m.name}" for m in n.body
                       if isinstance(m, ast.FunctionDef) and m.name.startswith("test"))
    return frozenset(out)



def node_defined(node_id: str) -> bool:
    """Whether the pytest node ``tests/<file>.py::<name>`` (or ``::<Class>::<name>``) is defined."""
    return node_id in nodes_in(node_id.split("::")[0])


def test_the_scan_finds_the_compiled_functions(graph):
    assert len(graph.compiled) > 50, "the scan found too few compiled functions"
    assert any(".kernels.lif_triton." in q for q in graph.compiled) and any("_online." in q for q in graph.compiled)
    assert "spikerec.kernels.surrogate_numba.sd_typed" in graph.compiled


def test_every_compiled_function_is_reached_from_a_registered_backend(graph, backends):
    reached: dict[str, list[str]] = {}
    for b in backends:
        entry = graph.entry_of(b.fn)
        assert entry, f"{b.kind}/{b.name}: its callable {b.fn!r} is not found in the package's source"
        for q in graph.reached_from([entry]) & set(graph.compiled):
            reached.setdefault(q, []).append(f"{b.kind}/{b.name}")
    pending = {q for qs in NOT_YET_REACHED.values() for q in qs}
    unreached = [q for q in graph.compiled if q not in reached and q not in pending]
    assert not unreached, "compiled functions that no registered backend reaches (module.function): " + ", ".join(unreached)
    stale = sorted(pending & reached.keys())
    assert not stale, f"reached from a registered backend now, remove from NOT_YET_REACHED: {stale}"
    assert pending <= set(graph.compiled), sorted(pending - set(graph.compiled))
    missing = [t for t in NOT_YET_REACHED if not node_defined(t)]
    assert not missing, f"NOT_YET_REACHED names tests that do not exist: {missing}"


def test_every_registered_backend_names_an_existing_equality_test(backends):
    assert {b.kind for b in backends} == set(neurons.KINDS)
    missing = [f"{b.kind}/{b.name}: {b.test}" for b in backends if not node_defined(b.test)]
    assert not missing, f"backends whose equality test does not exist: {missing}"


def test_the_call_graph_follows_imports_aliases_modules_and_methods(graph):
    """The graph's rules on known paths: a function-level import of a module returned as a value
    (``alif_sequence_numba._kernels``), an autograd Function's ``apply`` (its forward and backward),
    ``from . import x as y`` aliases, and no path where there is none."""
    alif_layer = graph.reached_from(["spikerec.layers.alif.ALIF.forward"])
    assert {"spikerec.kernels.alif_sequence_numba_kernels.fwd_steps",
            "spikerec.kernels.alif_sequence_numba_kernels.bwd_steps",
            "spikerec.kernels.alif_sequence.ALIFSequence.backward"} <= alif_layer
    lif_fn = graph.reached_from(["spikerec.kernels.lif_sequence.LIFSequence"])
    assert "spikerec.kernels.lif_sequence_numba_kernels.bwd" in lif_fn
    assert "spikerec.kernels.lif_triton._lif_bwd" in lif_fn
    assert "spikerec.kernels.lif_online._lif_bwd" not in lif_fn
    step = graph.reached_from(["spikerec.kernels.lif_online.lif_step_numba"])
    assert {"spikerec.kernels.lif_online._lif_fwd", "spikerec.kernels.surrogate_numba.sd_typed"} <= step
    assert not any(".lif_sequence_numba_kernels." in q for q in step)
    assert graph.reached_from(["spikerec.neurons.lif.step"]).isdisjoint(graph.compiled)

"""Every compiled function of the package (numba ``@njit``/``@jit``, ``@triton.jit``) is reached, in the
package's static call graph (:mod:`call_graph`), from the callable of a backend registered with
:func:`spikerec.neurons.register_backend`, and every registered backend names an equality test that
exists: so each compiled function lies on a path that some equality test against a neuron kind's
definition runs. A compiled function added without a registered backend that reaches it fails here,
with its name and module."""
from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import spikerec
from spikerec import neurons

from call_graph import CallGraph

ROOT = Path(spikerec.__file__).parent
TESTS = Path(__file__).parent

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
def source_of(path: str) -> str:
    file = TESTS.parent / path
    return file.read_text() if file.is_file() else ""


def node_defined(node_id: str) -> bool:
    """Whether the pytest node ``tests/<file>.py::test_x`` (or ``::TestClass::test_x``) is defined."""
    path, *names = node_id.split("::")
    text = source_of(path)
    if len(names) == 1:
        return names[0].startswith("test") and re.search(rf"^def {re.escape(names[0])}\(", text, re.M) is not None
    if len(names) == 2:
        cls = re.search(rf"^class {re.escape(names[0])}\b.*?(?=^\S|\Z)", text, re.M | re.S)
        return cls is not None and re.search(rf"^    def {re.escape(names[1])}\(", cls.group(0), re.M) is not None
    return False


JIT_LINE = re.compile(r"^\s*@(?:\w+\.)*n?jit\b", re.M)


def test_the_scan_finds_the_compiled_functions(graph):
    """The scan lists one function per ``@njit``/``@jit``/``@triton.jit`` decorator written in the
    package's source (counted as text, independently of the scan: a compiled function defined
    where the scan does not look, nested in a function say, fails here), and the known ones of
    every compiled family: the layers' kernels (numba, Triton), the online learner's (row kernels,
    block partials, the per-lane block pass and matrix-trace carry, the Triton reverse filter), the
    surrogates' helpers."""
    written = sum(len(JIT_LINE.findall(p.read_text())) for p in ROOT.rglob("*.py"))
    assert written >= 30 and len(graph.compiled) == written, (len(graph.compiled), written)
    assert len(set(graph.compiled)) == len(graph.compiled)
    assert any(".kernels.lif_triton." in q for q in graph.compiled) and any("_online." in q for q in graph.compiled)
    known = {"spikerec.kernels.surrogate_numba.sd_typed", "spikerec.kernels.surrogate_numba.scaled_derivative",
             "spikerec.kernels.lif_online.lif_rows", "spikerec.kernels.lif_online._partials",
             "spikerec.kernels.alif_online.alif_rows", "spikerec.kernels.alif_online._partials",
             "spikerec.kernels.lru_online.lru_rows", "spikerec.kernels.lru_online._partials",
             "spikerec.kernels.readout_online.readout_rows", "spikerec.kernels.readout_online.events",
             "spikerec.kernels.trace_numba._lanes", "spikerec.kernels.trace_numba._mat_carry",
             "spikerec.kernels.trace_triton._block_filter_kernel", "spikerec.kernels.lif_sequence_numba_kernels.fwd",
             "spikerec.kernels.alif_sequence_numba_kernels.fwd_steps", "spikerec.kernels.scan_numba_kernels.fwd"}
    assert known <= set(graph.compiled), sorted(known - set(graph.compiled))


def compiled_types() -> tuple[type, ...]:
    """The run-time types of compiled functions: numba's dispatchers and Triton's JIT functions
    (interpreted ones too), where these compilers import."""
    out = []
    try:
        from numba.core.dispatcher import Dispatcher

        out.append(Dispatcher)
    except Exception:  # numba missing or broken
        pass
    try:
        from triton.runtime.jit import KernelInterface

        out.append(KernelInterface)
    except Exception:  # triton missing or broken
        pass
    return tuple(out)


def test_the_scan_finds_every_compiled_object_at_run_time(graph, backends):
    """The static scan and the imported package agree: every numba dispatcher and Triton JIT function
    that a module of the package holds is one the scan lists (so none escapes the check by being made
    another way than a decorator), and each listed function of an imported module is such an object.
    Checks the compilers that import; skips without either."""
    types = compiled_types()
    if not types:
        pytest.skip("neither numba nor Triton imports")
    found = set()
    for name, mod in list(sys.modules.items()):
        if not (name == "spikerec" or name.startswith("spikerec.")):
            continue
        for obj in vars(mod).values():
            if isinstance(obj, types):
                fn = getattr(obj, "py_func", None) or getattr(obj, "fn", None)
                if fn is not None and fn.__module__.startswith("spikerec."):
                    found.add(f"{fn.__module__}.{fn.__qualname__}")
    missing = sorted(found - set(graph.compiled))
    assert not missing, f"compiled at run time but not found by the scan: {missing}"
    listed = 0
    for q in graph.compiled:  # those of the imported modules (a compiler's modules import where it does)
        m, _, f = q.rpartition(".")
        obj = getattr(sys.modules.get(m), f, None)
        if obj is not None:
            assert isinstance(obj, types), f"{q} is listed as compiled but is a {type(obj)}"
            listed += 1
    assert listed and found


def test_every_compiled_function_is_reached_from_a_registered_backend(graph, backends):
    reached: set[str] = set()
    for b in backends:  # each backend on its own: what it reaches, not what all of them reach together
        entry = graph.entry_of(b.fn)
        assert entry, f"{b.kind}/{b.name}: its callable {b.fn!r} is not found in the package's source"
        reached |= graph.reached_from([entry])
    unreached = [q for q in graph.compiled if q not in reached]
    assert not unreached, "compiled functions that no registered backend reaches (module.function): " + ", ".join(unreached)


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
    assert not any(".lif_online." in q for q in lif_fn)
    step = graph.reached_from(["spikerec.hardware.online.traces_lif.LIFTrace.row_kernel"])  # imports under ``if _nb``
    assert {"spikerec.kernels.lif_online.lif_rows", "spikerec.kernels.readout_online.events"} <= step
    assert not any(".lif_sequence_numba_kernels." in q or ".surrogate_numba." in q for q in step)
    assert "spikerec.kernels.lif_online._partials" not in step
    partials = graph.reached_from(["spikerec.kernels.alif_online.alif_block_partials"])
    assert {"spikerec.kernels.alif_online._partials", "spikerec.kernels.surrogate_numba.sd_typed",
            "spikerec.kernels.surrogate_numba.sd_consts"} <= partials
    errors = graph.reached_from(["spikerec.hardware.online.traces_lif.LIFTrace.errors"])  # function-level import
    assert "spikerec.kernels.surrogate_numba.scaled_derivative" in errors
    assert graph.reached_from(["spikerec.neurons.lif.step"]).isdisjoint(graph.compiled)

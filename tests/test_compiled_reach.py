"""Every compiled function of the package (numba ``@njit``/``@jit``, ``@triton.jit``) is reachable
from a registered backend of a neuron kind: its module is imported, directly or through other
modules of the package, by the module of a backend registered with
:func:`spikerec.neurons.register_backend` (whose equality test then runs it), and the function
itself is used (called or imported) somewhere in the package. A compiled function added without
a registered backend that reaches it, or left unused, fails here."""
from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import spikerec
from spikerec import neurons

ROOT = Path(spikerec.__file__).parent
# Compiled modules that serve every kind alike and so belong to no kind's backend, each with the test
# that runs it against its torch reference (kept short: a kind's kernel belongs in a backend).
KIND_INDEPENDENT = {
    "spikerec.kernels.trace_triton": "tests/test_online_triton.py::test_triton_kernel_matches_torch_under_interpreter",
}
JIT_PREFIXES = ("numba.", "nb.", "_nb.", "triton.")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {module_name(p): p for p in ROOT.rglob("*.py")}
TREES = {m: ast.parse(p.read_text(), str(p)) for m, p in SOURCES.items()}


def is_jit(decorator) -> bool:
    name = ast.unparse(decorator.func if isinstance(decorator, ast.Call) else decorator)
    return name in ("njit", "jit") or (name.startswith(JIT_PREFIXES) and name.rsplit(".", 1)[-1] in ("njit", "jit"))


def compiled_functions() -> dict[str, list[str]]:
    out = {}
    for m, tree in TREES.items():
        names = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and any(map(is_jit, n.decorator_list))]
        if names:
            out[m] = names
    return out


def imports_of(m: str) -> set[str]:
    """The package's modules that ``m`` imports anywhere in its source (function-level imports too)."""
    pkg = m if SOURCES[m].name == "__init__.py" else m.rpartition(".")[0]
    out = set()
    for n in ast.walk(TREES[m]):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = pkg
            for _ in range(max(n.level - 1, 0)):
                base = base.rpartition(".")[0]
            base = (base + "." + n.module if n.module else base) if n.level else n.module
            out.add(base)
            out.update(f"{base}.{a.name}" for a in n.names)
    return {x for x in out if x in SOURCES}


def reached_from(start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for x in imports_of(todo.pop()):
            if x not in seen:
                seen.add(x)
                todo.append(x)
    return seen


def registered_backend_modules() -> dict[str, list[str]]:
    for info in pkgutil.walk_packages(spikerec.__path__, "spikerec."):
        if info.name.endswith("__main__"):
            continue
        try:  # every module, so that every registration runs (optional dependencies may be missing)
            importlib.import_module(info.name)
        except ImportError:
            pass
    out: dict[str, list[str]] = {}
    for kind, backends in neurons.BACKENDS.items():
        for b in backends.values():
            owner = getattr(b.fn, "__self__", None)
            m = owner.__module__ if isinstance(owner, type) else b.fn.__module__
            out.setdefault(m, []).append(f"{kind}: {b.name}")
    return out


def test_every_compiled_function_is_reached_from_a_registered_backend_and_used():
    compiled = compiled_functions()
    assert sum(map(len, compiled.values())) > 50, "the scan found too few compiled functions"
    assert any("triton" in m for m in compiled) and any("online" in m for m in compiled)
    backends = registered_backend_modules()
    reach = {m: reached_from(m) for m in backends if m in SOURCES}
    unreached = [m for m in compiled if not any(m in r for r in reach.values()) and m not in KIND_INDEPENDENT]
    assert not unreached, f"compiled kernels whose module no registered backend reaches: {unreached}"
    for m, test in KIND_INDEPENDENT.items():
        path, name = test.split("::")
        assert m in compiled and f"def {name}(" in (ROOT.parent / path).read_text(), (m, test)
    texts = {m: p.read_text() for m, p in SOURCES.items()}
    unused = [f"{m}.{f}" for m, names in compiled.items() for f in names
              if texts[m].count(f + "(") + texts[m].count(f + "[") < 2
              and not any(f in t for other, t in texts.items() if other != m)]
    assert not unused, f"compiled functions that nothing calls: {unused}"

"""A static call graph of the ``spikerec`` package, read from its source with :mod:`ast` (nothing is
imported), for :mod:`test_compiled_reach`.

Nodes are the package's functions, classes, methods and module- or class-level variables, named
``module.qualname``. A node's edges are the names its body uses (called or only referenced), resolved
through the module's imports (function-level ones too) and their aliases, re-exports through
``__init__`` modules, ``module.attribute`` chains and ``self.``/``cls.`` members of the enclosing class
and its bases in the package. Methods called on objects of unknown type are followed the way *rapid
type analysis* does: a method is reached when its class is reached and some reached code uses an
attribute of its name. A reached class also reaches the methods called on its behalf by Python and
torch (the dunders, ``forward``, ``backward``, ``setup_context``), so ``Fn.apply`` of an autograd
Function and ``module(x)`` of an ``nn.Module`` reach their forward and backward. A module used as a
value (``from . import kernels as k; return k``) reaches, in the same way, its names that reached
code reads as attributes.
"""
from __future__ import annotations

import ast
from pathlib import Path

PROTOCOL = {"forward", "backward", "setup_context", "jvp", "vjp"}  # called by torch, not by name
JIT_PREFIXES = ("numba.", "nb.", "_nb.", "triton.")


def is_jit(decorator) -> bool:
    """``@njit``, ``@jit``, ``@numba.njit(...)``, ``@_nb.njit``, ``@triton.jit`` and the like."""
    name = ".".join(_chain(decorator.func if isinstance(decorator, ast.Call) else decorator) or ())
    return name in ("njit", "jit") or (name.startswith(JIT_PREFIXES) and name.rsplit(".", 1)[-1] in ("njit", "jit"))


def _top_level(body):
    """The statements of a module or class body, looking inside ``if``/``try``/``with`` blocks."""
    for s in body:
        if isinstance(s, (ast.If, ast.Try, ast.With)):
            for part in (s.body, getattr(s, "orelse", []), getattr(s, "finalbody", []),
                         *[h.body for h in getattr(s, "handlers", [])]):
                yield from _top_level(part)
        else:
            yield s


def _chain(node) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]`` (None unless rooted in a plain name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


class CallGraph:
    def __init__(self, root: Path):
        self.root = root
        self.sources = {self._module_name(p): p for p in sorted(root.rglob("*.py"))}
        self.scope: dict[str, dict[str, str]] = {}  # module -> {bound name: absolute dotted path}
        self.nodes: dict[str, tuple[str, str | None, list]] = {}  # qualname -> (module, class, AST bodies)
        self.members: dict[str, dict[str, str]] = {}  # class qualname -> {member name: qualname}
        self.bases: dict[str, list[str]] = {}  # class qualname -> dotted names of its bases
        self.compiled: list[str] = []
        self.trees = {m: ast.parse(p.read_text(), str(p)) for m, p in self.sources.items()}
        for m, tree in self.trees.items():
            self.scope[m] = {}
            self._bind(m, None, m, tree.body, self.scope[m])
        self._edges: dict[str, tuple[set[str], set[str]]] = {}

    def _module_name(self, path: Path) -> str:
        parts = path.relative_to(self.root.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def _package(self, m: str) -> str:
        return m if self.sources[m].name == "__init__.py" else m.rpartition(".")[0]

    def _imports(self, m: str, stmt, into: dict[str, str]) -> None:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                into[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                pkg = self._package(m)
                for _ in range(stmt.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{stmt.module}" if stmt.module else pkg
            for a in stmt.names:
                into[a.asname or a.name] = f"{base}.{a.name}"

    def _bind(self, m: str, cls: str | None, prefix: str, body, into: dict[str, str]) -> None:
        """The names that a module or class body binds: its defs, classes, variables and imports."""
        for s in _top_level(body):
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{prefix}.{s.name}"
                into[s.name] = q
                self.nodes[q] = (m, cls, [s])
                if any(map(is_jit, s.decorator_list)):
                    self.compiled.append(q)
            elif isinstance(s, ast.ClassDef):
                q = f"{prefix}.{s.name}"
                into[s.name] = q
                self.members[q] = {}
                self.bases[q] = [".".join(c) for c in map(_chain, s.bases) if c]
                rest = [x for x in s.body if not isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
                self.nodes[q] = (m, None, [*s.bases, *s.decorator_list, *rest])
                self._bind(m, q, q, s.body, self.members[q])
            elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = s.targets if isinstance(s, ast.Assign) else [s.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            q = f"{prefix}.{n.id}"
                            into[n.id] = q
                            old = self.nodes.get(q, (m, cls, []))[2]
                            self.nodes[q] = (m, cls, old + ([s.value] if s.value is not None else []))
            elif m == prefix:
                self._imports(m, s, into)

    # --- resolution -------------------------------------------------------------------------------
    def member(self, cls: str, name: str, seen=()) -> str | None:
        """``cls.name`` looked up in the class and then its bases in the package."""
        if name in self.members.get(cls, {}):
            return self.members[cls][name]
        for b in self.bases.get(cls, []):
            base = self.resolve(self._in_module(self.nodes[cls][0], b))
            if base in self.members and base not in seen:
                found = self.member(base, name, (*seen, cls))
                if found:
                    return found
        return None

    def _in_module(self, m: str, dotted: str, local: dict | None = None) -> str:
        head, _, rest = dotted.partition(".")
        bound = (local or {}).get(head) or self.scope[m].get(head) or head
        return f"{bound}.{rest}" if rest else bound

    def resolve(self, dotted: str, depth: int = 0) -> str | None:
        """The node or module that the absolute ``dotted`` path names (None outside the package)."""
        if dotted in self.nodes or dotted in self.sources:
            return dotted
        head, _, last = dotted.rpartition(".")
        if not head or depth > 20:
            return None
        base = self.resolve(head, depth + 1)
        if base in self.sources:
            if f"{base}.{last}" in self.sources:
                return f"{base}.{last}"
            target = self.scope[base].get(last)
            return self.resolve(target, depth + 1) if target and target != dotted else None
        if base in self.members:
            return self.member(base, last)
        return None

    def edges(self, q: str) -> tuple[set[str], set[str]]:
        """``(nodes or modules used by q, attribute names used by q)``."""
        if q in self._edges:
            return self._edges[q]
        m, cls, bodies = self.nodes[q]
        local: dict[str, str] = {}
        for b in bodies:
            for n in ast.walk(b):
                if isinstance(n, (ast.Import, ast.ImportFrom)):
                    self._imports(m, n, local)
        selves = set()
        if cls and bodies and isinstance(bodies[0], (ast.FunctionDef, ast.AsyncFunctionDef)) and bodies[0].args.args:
            selves = {bodies[0].args.args[0].arg}
        used, attrs = set(), set()
        for b in bodies:
            prefixes = {id(n.value) for n in ast.walk(b) if isinstance(n, ast.Attribute)}
            for n in ast.walk(b):
                if isinstance(n, ast.Attribute):
                    attrs.add(n.attr)
                chain = _chain(n) if isinstance(n, (ast.Name, ast.Attribute)) else None
                if not chain:
                    continue
                if chain[0] in selves and len(chain) > 1:
                    target = self.member(cls, chain[1])
                elif chain[0] in selves:
                    target = cls
                else:
                    target = self.resolve(self._in_module(m, ".".join(chain), local))
                if target and not (target in self.sources and id(n) in prefixes):  # ``mod.x``: x, not mod
                    used.add(target)
        self._edges[q] = (used, attrs)
        return used, attrs

    def reached_from(self, entries) -> set[str]:
        """Every node reached from ``entries`` (rapid type analysis for methods of unknown receivers)."""
        seen: set[str] = set()
        attrs: set[str] = set()
        todo = list(entries)
        while todo:
            while todo:
                q = todo.pop()
                if q in seen or (q not in self.nodes and q not in self.sources):
                    continue
                seen.add(q)
                if q in self.nodes:
                    used, a = self.edges(q)
                    attrs |= a
                    todo.extend(used - seen)
            for m in [m for m in seen if m in self.sources]:  # a module used as a value: the names read from it
                for name in attrs & self.scope[m].keys():
                    q = self.resolve(f"{m}.{name}")
                    if q and q not in seen:
                        todo.append(q)
            for c in [c for c in seen if c in self.members]:  # the methods of reached classes
                for name in self._all_members(c):
                    if name in attrs or name in PROTOCOL or (name.startswith("__") and name.endswith("__")):
                        q = self.member(c, name)
                        if q and q not in seen:
                            todo.append(q)
        return seen - self.sources.keys()

    def _all_members(self, cls: str, seen=()) -> set[str]:
        out = set(self.members.get(cls, {}))
        for b in self.bases.get(cls, []):
            base = self.resolve(self._in_module(self.nodes[cls][0], b))
            if base in self.members and base not in seen:
                out |= self._all_members(base, (*seen, cls))
        return out

    def entry_of(self, fn) -> str | None:
        """The node of a registered backend's callable (a function, a method, an autograd Function's
        ``apply``: its class, a bound method of an instance: its class's method)."""
        fn = getattr(fn, "__wrapped__", fn)
        owner = getattr(fn, "__self__", None)
        if owner is not None:
            cls = owner if isinstance(owner, type) else type(owner)
            q = f"{cls.__module__}.{cls.__qualname__}"
            return self.member(q, fn.__name__) or (q if q in self.nodes else None)
        q = f"{fn.__module__}.{fn.__qualname__}"
        return q if q in self.nodes else None

"""The whole-stack stream step with the package's MSE loss as one compiled call.

:class:`.fused_stack.FusedStack` makes five or more compiled calls per step (a forward and a
backward per layer, the readout with the loss). Each call has its arguments checked by numba's
dispatcher, about 45 ns for each of some 115 arrays and flags per step, and the Python loop around
the calls costs as much again: together about 12 µs per step, a third of a 2-layer LIF stack's
step. Here the arrays a binding holds are fields of one numba ``StructRef`` built once per
binding, and a small function generated for the stack's layout makes the same calls in the same
order from compiled code: one dispatch of six arguments per step. The kernels are the same
functions with the same arguments, so the result is bit-identical to the call-by-call step
(tests/test_online_fused.py).

The generated function and the struct's constructor are compiled once per layout (the kinds of
layers and the types of their arguments) and process, in 2-3 s. So that short streams do not pay
for it, a layout's driver is compiled once streams of that layout have run ``AFTER_STEPS`` steps
in this process (in one stream or over many, such as the batch form's one stream per sequence),
and taken at once by every later binding of the layout: tiered, as a JIT compiles a loop once
it has run often.
"""
from __future__ import annotations

__all__ = ["available", "build", "count_step"]

try:  # numba is optional, and StructRef is an experimental part of it
    import numba as _nb
    from numba.core import types as _types
    from numba.experimental import structref as _structref

    @_structref.register
    class _BoundType(_types.StructRef):
        """The fields of one binding (arrays, flags and counts, in call order)."""

        def preprocess_fields(self, fields):
            return tuple((n, _types.unliteral(t)) for n, t in fields)

    class _Bound(_structref.StructRefProxy):
        """A binding's arrays as one object for the compiled driver."""

    _structref.define_boxing(_BoundType, _Bound)
    _OK = True
except Exception:  # pragma: no cover - depends on the numba version
    _OK = False

_COMPILED: dict = {}  # layout number -> (constructor, driver)
_LAYOUTS: dict = {}  # layout key (the driver's source, kernels and field types) -> layout number
_STEPS: dict = {}  # layout number -> steps run without the driver in this process
AFTER_STEPS = 512  # steps of one layout after which its driver is compiled


def count_step(layout: int) -> bool:
    """Count a step of ``layout`` run without its driver; True once the layout has run
    ``AFTER_STEPS`` such steps (its driver is then worth compiling)."""
    n = _STEPS[layout] = _STEPS.get(layout, 0) + 1
    return n >= AFTER_STEPS


def available() -> bool:
    return _OK


def build(layers, readout, any_nan, readout_mse, slot_kind, compile_new: bool = True):
    """``(bound, driver)`` for a binding: ``layers`` ``[(fwd, fwd args, bwd, bwd args, index of
    the input error in the bwd args)]`` (the last fwd arg is the layer's output), ``readout``
    ``(W, bias, has_b, y, gy, dW, db, has_w, has_db, gh)``, the NaN check and the readout/MSE
    kernel, and each layer's step-buffer slot (0 the LRU's rows, 1 the ALIF's and 2 the LIF's
    matrix-trace steps). ``driver(bound, u, target, check_nan, s0, s1, s2)`` returns
    ``(loss, found_nan)``; with ``found_nan`` nothing was changed. Returns ``(bound, driver,
    layout number)``; without ``compile_new``, ``(None, None, layout number)`` where this layout's
    driver is not compiled yet."""
    values: list = []

    def field(v) -> str:
        values.append(v)
        return f"st.f{len(values) - 1}"

    glob = {"ANY_NAN": any_nan, "RO": readout_mse}
    lines = ["def drv(st, u, target, check_nan, s0, s1, s2):",
             "    if check_nan and ANY_NAN(u):",
             "        return 0.0, True",
             "    x0 = u"]
    bwd_fields = []
    for l, (f, fa, b, ba, gi) in enumerate(layers):
        glob[f"F{l}"], glob[f"B{l}"] = f, b
        names = [field(v) for v in fa]
        lines.append(f"    F{l}(x{l}, {', '.join(names)})")
        lines.append(f"    x{l + 1} = {names[-1]}")
        bwd_fields.append(([field(v) for v in ba], gi))
    ro = [field(v) for v in readout]
    W, bias, has_b, y, gy, dW, db, has_w, has_db, gh = ro
    L = len(layers)
    lines.append(f"    loss = RO(x{L}, {W}, {bias}, {has_b}, {y}, target, {gy}, {dW}, {db}, {has_w}, {has_db}, {gh})")
    gcur = gh
    for l in range(L - 1, -1, -1):
        names, gi = bwd_fields[l]
        lines.append(f"    B{l}({gcur}, True, x{l}, s{slot_kind[l]}, {', '.join(names)})")
        gcur = names[gi]
    lines.append("    return loss, False")
    src = "\n".join(lines) + "\n"
    ftypes = tuple(_nb.typeof(v) for v in values)
    key = (src, tuple(f.__name__ for f, _, b, _, _ in layers for f in (f, b)), ftypes)
    layout = _LAYOUTS.setdefault(key, len(_LAYOUTS))
    made = _COMPILED.get(layout)
    if made is None and not compile_new:
        return None, None, layout
    if made is None:
        st_type = _BoundType([(f"f{i}", t) for i, t in enumerate(ftypes)])
        params = ", ".join(f"f{i}" for i in range(len(values)))
        ctor_src = (f"def ctor({params}):\n    st = structref.new(st_type)\n"
                    + "".join(f"    st.f{i} = f{i}\n" for i in range(len(values))) + "    return st\n")
        ns = {"structref": _structref, "st_type": st_type}
        exec(ctor_src, ns)  # noqa: S102 - generated from the layout above, no outside input
        exec(src, glob)  # noqa: S102
        made = _COMPILED[layout] = (_nb.njit(ns["ctor"]), _nb.njit(glob["drv"]))
    ctor, drv = made
    return ctor(*values), drv, layout

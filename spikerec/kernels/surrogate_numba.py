"""The compiled CPU forms (numba) of the surrogate derivatives, one helper per formula, called by
every compiled kernel that needs one (the codes of :meth:`spikerec.surrogate.Surrogate.compiled_form`
that numba handles; :func:`spikerec.kernels.lif_sequence_numba.surrogate_code` picks them):

* 1, the fast sigmoid (Zenke & Ganguli 2018, eq. 5, its derivative): ``scale / (1 + slope |x|)^2``;
* 2, the arc-tangent (Fang et al. 2021): ``scale (slope / 2) / (1 + (pi/2 slope x)^2)``.

Imported on first use (``import spikerec`` never loads numba).
"""
import math

from numba import njit


@njit(cache=True, nogil=True, error_model="numpy")
def fast_sigmoid_d(x, c1, c2, one):  # pragma: no cover - compiled
    """``c2 / (1 + c1 |x|)^2`` in the type of its arguments (``c1`` the slope, ``c2`` the scale)."""
    d = one + c1 * abs(x)
    return c2 / (d * d)


@njit(cache=True, nogil=True, error_model="numpy")
def atan_d(x, c1, c2, one):  # pragma: no cover - compiled
    """``c2 / (1 + (c1 x)^2)`` in the type of its arguments (``c1 = pi/2 slope``, ``c2 = scale slope / 2``)."""
    u = c1 * x
    return c2 / (one + u * u)


@njit(cache=True, nogil=True)
def sd_consts(code, p1, p2):  # pragma: no cover - compiled
    """The constants ``(c1, c2)`` of :func:`sd_typed` for surrogate ``code`` with slope ``p1`` and
    scale ``p2``: fast sigmoid ``(slope, scale)``, arc-tangent ``(pi/2 slope, scale slope / 2)``."""
    if code == 1:
        return p1, p2
    return (math.pi / 2.0) * p1, p2 * (p1 / 2.0)


@njit(cache=True, nogil=True, error_model="numpy")
def sd_typed(x, code, c1, c2, one):  # pragma: no cover - compiled
    """The surrogate derivative in the type of its arguments (``c1, c2`` from :func:`sd_consts`,
    ``one`` = 1, all of ``x``'s type: float32 stays float32, so a loop over it vectorises):
    fast sigmoid ``scale / (1 + slope |x|)^2``, arc-tangent ``scale (slope / 2) / (1 + (pi/2 slope
    x)^2)``. Compiled with ``error_model="numpy"``: no division-by-zero branch (the denominators
    are >= 1), so the compiler inlines it into a caller's loop and vectorises that."""
    if code == 1:
        return fast_sigmoid_d(x, c1, c2, one)
    return atan_d(x, c1, c2, one)


@njit(cache=True, nogil=True, error_model="numpy")
def scaled_derivative(g, u, shift, code, c1, c2, out):  # pragma: no cover - compiled
    """``out = g * sigma'(u - shift)`` over ``[rows, N]`` (the error through a spike map ``z = H(u - shift)``,
    ``shift [N]`` per neuron), one loop per formula so that it vectorises; ``c1, c2`` from :func:`sd_consts`,
    of the arrays' type."""
    one = out.dtype.type(1)
    if code == 1:
        for r in range(u.shape[0]):
            for n in range(u.shape[1]):
                out[r, n] = g[r, n] * fast_sigmoid_d(u[r, n] - shift[n], c1, c2, one)
    else:
        for r in range(u.shape[0]):
            for n in range(u.shape[1]):
                out[r, n] = g[r, n] * atan_d(u[r, n] - shift[n], c1, c2, one)

"""Spectral radius ``rho(M) = max_i |lambda_i(M)|`` of per-sample Jacobians (LSC paper Sec. II-A).

The radius is the largest eigenvalue modulus, not a norm (``rho(M) <= ||M||_2``).

* ``method="exact"``: ``torch.linalg.eigvals`` of the full block, then the max modulus
  (what the official code does, with ``tf.linalg.eig``). Differentiable; the gradient is
  ill-conditioned near repeated eigenvalues.
* ``method="arnoldi"`` (alias ``"iterative"``): ``m`` steps of Arnoldi (classical
  Gram-Schmidt, re-orthogonalised twice) from a random start, then the largest modulus
  of the Ritz values (eigenvalues of the ``m x m`` Hessenberg matrix). Works on a dense
  block or matrix-free on a :class:`~spikerec.stability.jacobians.LinearOp` (``jvp``), is
  exact once ``m = n``, and is differentiable through the products and the basis (the
  exact derivative of the Ritz value; holding the basis fixed, the Ritz-vector
  approximation ``u^H dM v / u^H v``, was measured further from the eigenvalue's true
  gradient where Arnoldi has not converged). Where no gradient is needed (verification,
  measurements under ``no_grad``) the basis lives in one ``[B, m, n]`` buffer filled in
  place, without autograd. Unlike plain power iteration it handles complex-conjugate
  dominant pairs.
* ``method="gelfand"``: ``(prod_j ||M q_j||)^(1/k)`` with ``q_{j+1} = M q_j / ||M q_j||``,
  i.e. ``||M^k q_0||^(1/k)`` with normalisation per step (Gelfand's formula). It does
  not oscillate on complex pairs but converges slowly (error ``O(log(c)/k)``).

Non-square blocks (input ``700 -> 2n``, width changes, readout) have no eigenvalues;
``square_mode`` picks a square matrix (``docs/decisions.md``, analysis 4):

* ``"subsample"`` (official code): ``min(n_out, n_in)`` indices of the longer axis drawn
  without replacement, kept sorted, redrawn on every call (one draw for the batch);
* ``"topleft"``: the leading ``min x min`` block, deterministic. Zero-padding to square
  gives the same non-zero eigenvalues, so it also stands for ``"pad"``;
* ``"svd"``: the largest singular value instead of a radius (an upper bound of the
  radius of any square sub-block; a different quantity; dense only).
"""
from __future__ import annotations

from typing import Union

import torch

from .jacobians import LinearOp, all_finite

__all__ = ["spectral_radius", "square", "arnoldi_radius", "gelfand_radius", "METHODS", "SQUARE_MODES"]

METHODS = ("exact", "arnoldi", "iterative", "gelfand")
SQUARE_MODES = ("subsample", "topleft", "pad", "svd")

Matrix = Union[torch.Tensor, LinearOp]


def _indices(n_long: int, n_short: int, mode: str, generator, device) -> torch.Tensor:
    if mode == "subsample":
        idx = torch.randperm(n_long, generator=generator)[:n_short]
        return idx.sort().values.to(device)
    return torch.arange(n_short, device=device)


def square(M: torch.Tensor, mode: str = "subsample", generator: torch.Generator | None = None) -> torch.Tensor:
    """Square ``[..., k, k]`` sub-block of ``M [..., n_out, n_in]``, ``k = min(n_out, n_in)``."""
    if mode not in ("subsample", "topleft", "pad"):
        raise ValueError(f"square_mode: expected 'subsample', 'topleft' or 'pad' here, got {mode!r}")
    n_out, n_in = M.shape[-2:]
    if n_out == n_in:
        return M
    k = min(n_out, n_in)
    idx = _indices(max(n_out, n_in), k, mode, generator, M.device)
    return M.index_select(-2, idx) if n_out > n_in else M.index_select(-1, idx)


class _SquareOp:
    """Matrix-free square restriction of a non-square operator (same rules as :func:`square`)."""

    def __init__(self, op: LinearOp, mode: str, generator):
        B, n_out, n_in = op.shape
        self.k = min(n_out, n_in)
        self.op, self.n_out, self.n_in = op, n_out, n_in
        self.idx = None if n_out == n_in else _indices(max(n_out, n_in), self.k, mode, generator, op.device)

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        if self.idx is None:
            return self.op.matvec(v)
        if self.n_out > self.n_in:  # keep k rows
            return self.op.matvec(v).index_select(-1, self.idx)
        full = v.new_zeros(v.shape[0], self.n_in).index_copy(-1, self.idx, v)  # embed into k columns
        return self.op.matvec(full)


def _check(M: torch.Tensor, name: str) -> None:
    if M.dim() < 2:
        raise ValueError(f"{name}: expected a matrix [..., n, m], got shape {tuple(M.shape)}")
    if not all_finite(M):
        raise FloatingPointError(f"{name}: the matrix contains NaN or inf entries")


def _max_modulus(S: torch.Tensor) -> torch.Tensor:
    """``max |eig(S)|`` per matrix, computed in float64 (more accurate; and the complex64
    eigen-backward is very slow on some CPU LAPACK builds), returned in ``S.dtype``."""
    wide = S.to(torch.float64) if S.dtype in (torch.float32, torch.float16, torch.bfloat16) else S
    return torch.linalg.eigvals(wide).abs().amax(-1).to(S.dtype)


# The batched products below are written as row vectors times matrices: ``bmm`` of a
# ``[B, n, n]`` matrix with a column ``[B, n, 1]`` takes a slow path in the CPU BLAS, forward
# and backward, while ``[B, 1, n] @ [B, n, n]`` (also with a transposed view) takes the fast
# one (docs/decisions.md, LSC speed 2). Same products, same gradients.
def _batched_matvec(S: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``S_b v_b`` for ``S [B, n, m]``, ``v [B, m]`` (as ``v^T S^T``)."""
    return torch.bmm(v.unsqueeze(1), S.mT).squeeze(1)


class _Gather(torch.autograd.Function):
    """Identity on ``S`` whose backward, run once every product of :class:`_DenseProducts` has run its own, gives
    ``dS = sum_j g_j v_j^T`` as one batched product of the gathered ``g_j`` and ``v_j``."""

    @staticmethod
    def forward(ctx, S, box):
        ctx.box = box
        return S.view_as(S)

    @staticmethod
    def backward(ctx, _zero):
        box = ctx.box
        dS = torch.bmm(torch.stack(box.g, 2), torch.stack(box.v, 1)) if box.g else None
        box.g, box.v, box.placed = [], [], False
        return dS, None


class _Product(torch.autograd.Function):
    """``S_b v_b`` whose backward gives ``v`` its gradient ``S^T g`` and hands ``(g, v)`` to :class:`_Gather`."""

    @staticmethod
    def forward(ctx, S, v, box):
        ctx.box = box
        ctx.save_for_backward(S, v)
        return _batched_matvec(S, v)

    @staticmethod
    def backward(ctx, g):
        S, v = ctx.saved_tensors
        box = ctx.box
        box.g.append(g)
        box.v.append(v)
        zero = None if box.placed else S.new_zeros(()).expand(S.shape)  # one (free) placeholder reaches _Gather
        box.placed = True
        return zero, torch.bmm(g.unsqueeze(1), S).squeeze(1), None


class _DenseProducts:
    """``v -> S_b v_b`` for the Krylov products on a dense block ``S [B, n, n]``, the exact gradient of ``S`` taken
    once (:class:`_Gather`) rather than as one ``[B, n, n]`` outer product per product, added up by autograd."""

    def __init__(self, S: torch.Tensor):
        self.g, self.v, self.placed = [], [], False
        self.S = _Gather.apply(S, self)

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        return _Product.apply(self.S, v, self)


def _coefficients(Q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``h_bj = sum_n Q_bjn w_bn`` (projections of ``w`` on the basis rows, as ``w^T Q^T``)."""
    return torch.bmm(w.unsqueeze(1), Q.mT).squeeze(1)


def _combination(Q: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``sum_j h_bj Q_bjn`` (the basis combination with coefficients ``h``)."""
    return torch.bmm(h.unsqueeze(1), Q).squeeze(1)


def _start(B: int, n: int, dtype, device, generator) -> torch.Tensor:
    v = torch.randn(B, n, generator=generator, dtype=dtype if dtype.is_floating_point else torch.float64)
    return v.to(device=device, dtype=dtype)


def arnoldi_radius(matvec, B: int, n: int, m: int = 64, *, dtype=torch.float32, device=None,
                   generator: torch.Generator | None = None, v0: torch.Tensor | None = None,
                   tol: float = 1e-10) -> torch.Tensor:
    """Largest Ritz-value modulus after ``min(m, n)`` Arnoldi steps, per sample ``[B]``.

    ``matvec(V[B, n]) -> [B, n]``. On a breakdown (an invariant subspace, ``h_{j+1,j} ~ 0``)
    the sample's next basis vector is zero, so its Ritz values are exact eigenvalues.
    """
    m = max(1, min(int(m), n))
    q = v0 if v0 is not None else _start(B, n, dtype, device, generator)
    q = q / q.norm(dim=-1, keepdim=True)
    w = matvec(q)
    if not w.requires_grad:
        return _max_modulus(_arnoldi_no_graph(matvec, q, w, m, tol))
    # differentiable: through the products and the basis (the Ritz value's exact derivative;
    # holding the basis fixed gave a worse gradient where Arnoldi has not converged)
    Q = [q]
    cols = []
    for j in range(m):
        if j > 0:
            w = matvec(Q[-1])
        Qm = torch.stack(Q, dim=1)  # [B, j+1, n]
        h = _coefficients(Qm, w)
        w = w - _combination(Qm, h)
        h2 = _coefficients(Qm, w)  # re-orthogonalise
        w = w - _combination(Qm, h2)
        h = h + h2
        hn = w.norm(dim=-1)
        scale = h.abs().amax(-1).clamp_min(1.0)
        ok = hn > tol * scale
        safe = torch.where(ok, hn, torch.ones_like(hn))
        cols.append(torch.cat([h, torch.where(ok, hn, torch.zeros_like(hn))[:, None], w.new_zeros(B, m - j - 1)], dim=1))
        if j < m - 1:
            Q.append(torch.where(ok[:, None], w / safe[:, None], torch.zeros_like(w)))
    H = torch.stack(cols, dim=2)[:, :m, :m]
    return _max_modulus(H)


@torch.no_grad()
def _arnoldi_no_graph(matvec, q, w, m: int, tol: float) -> torch.Tensor:
    """Hessenberg matrix ``H [B, m, m]`` of ``m`` Arnoldi steps from ``q`` (``w = M q``), without
    autograd: the basis lives in one ``[B, m, n]`` buffer filled in place (never restacked)."""
    B, n = q.shape
    Q = q.new_zeros(B, m, n)
    H = q.new_zeros(B, m, m)
    Q[:, 0] = q
    for j in range(m):
        if j > 0:
            w = matvec(Q[:, j])
        Qj = Q[:, : j + 1]
        h = _coefficients(Qj, w)
        w = w - _combination(Qj, h)
        h2 = _coefficients(Qj, w)  # re-orthogonalise
        w = w - _combination(Qj, h2)
        h = h + h2
        hn = w.norm(dim=-1)
        ok = hn > tol * h.abs().amax(-1).clamp_min(1.0)
        H[:, : j + 1, j] = h
        if j < m - 1:
            H[:, j + 1, j] = torch.where(ok, hn, torch.zeros_like(hn))
            Q[:, j + 1] = torch.where(ok[:, None], w / torch.where(ok, hn, torch.ones_like(hn))[:, None],
                                      torch.zeros_like(w))
    return H


def gelfand_radius(matvec, B: int, n: int, k: int = 100, *, burn_in: int | None = None, dtype=torch.float32,
                   device=None, generator: torch.Generator | None = None, v0: torch.Tensor | None = None) -> torch.Tensor:
    """``||M^k q||^(1/k)`` with normalisation per step, averaged after a burn-in (``k // 4`` steps)."""
    burn_in = k // 4 if burn_in is None else int(burn_in)
    q = v0 if v0 is not None else _start(B, n, dtype, device, generator)
    q = q / q.norm(dim=-1, keepdim=True)
    logs = []
    for j in range(k):
        w = matvec(q)
        nrm = w.norm(dim=-1).clamp_min(torch.finfo(w.dtype).tiny)
        if j >= burn_in:
            logs.append(nrm.log())
        q = w / nrm[:, None]
    return torch.stack(logs, 0).mean(0).exp()


def spectral_radius(M: Matrix, method: str = "exact", *, square_mode: str = "subsample", n_iter: int = 64,
                    generator: torch.Generator | None = None, name: str = "M") -> torch.Tensor:
    """Spectral radius of each matrix of a batch: ``M [B, n, m]`` (or ``[n, m]``) or a :class:`LinearOp`.

    Returns ``[B]`` (a scalar tensor for a single matrix). ``n_iter`` is the Krylov dimension
    (``arnoldi``) or the number of products (``gelfand``). See the module docstring for
    ``method`` and ``square_mode``.
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if square_mode not in SQUARE_MODES:
        raise ValueError(f"square_mode: expected one of {SQUARE_MODES}, got {square_mode!r}")
    if isinstance(M, LinearOp):
        if square_mode == "svd":
            M = M.dense()
        elif method == "exact":
            M = M.dense()
        else:
            sq = _SquareOp(M, "topleft" if square_mode == "pad" else square_mode, generator)
            fn = arnoldi_radius if method in ("arnoldi", "iterative") else gelfand_radius
            return fn(sq, M.shape[0], sq.k, n_iter, dtype=M.dtype, device=M.device, generator=generator)
    if not isinstance(M, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor [B, n, m] or a LinearOp, got {type(M).__name__}")
    _check(M, name)
    single = M.dim() == 2
    Mb = M.unsqueeze(0) if single else M.reshape(-1, *M.shape[-2:])
    if square_mode == "svd":
        r = torch.linalg.matrix_norm(Mb, ord=2)
    else:
        S = square(Mb, "topleft" if square_mode == "pad" else square_mode, generator)
        if method == "exact":
            r = _max_modulus(S)
        else:
            mv = _DenseProducts(S) if S.requires_grad and torch.is_grad_enabled() else (lambda v: _batched_matvec(S, v))
            fn = arnoldi_radius if method in ("arnoldi", "iterative") else gelfand_radius
            r = fn(mv, S.shape[0], S.shape[-1], n_iter, dtype=S.dtype, device=S.device, generator=generator)
    return r[0] if single else r.reshape(M.shape[:-2])

"""Surrogate derivatives: closed forms, finite differences of their primitives, autograd, torch.func."""
import math

import pytest
import torch

from spikerec.surrogate import SURROGATES, get_surrogate, heaviside

ALL = [(name, {}) for name in SURROGATES] + [
    ("fast_sigmoid", {"slope": 2.0, "scale": 0.5}),
    ("atan", {"slope": 5.0, "scale": 0.3}),
    ("triangle", {"width": 0.3, "scale": 2.0}),
    ("gaussian", {"width": 0.2}),
    ("sigmoid", {"slope": 10.0, "scale": 0.7}),
    ("exponential", {"width": 0.1, "scale": 1.5}),
    ("multi_gaussian", {"width": 0.3}),
]


def closed_form(name, p, x):
    s, k = p.get("slope"), p.get("scale", 1.0)
    w = p.get("width")
    if name == "fast_sigmoid":
        return k / (1 + s * abs(x)) ** 2
    if name == "atan":
        return k * s / 2 / (1 + (math.pi / 2 * s * x) ** 2)
    if name == "triangle":
        return k * max(0.0, 1 - abs(x) / w) / w
    if name == "gaussian":
        return k * math.exp(-x * x / (2 * w * w)) / (math.sqrt(2 * math.pi) * w)
    if name == "sigmoid":
        sg = 1 / (1 + math.exp(-s * x))
        return k * s * sg * (1 - sg)
    if name == "exponential":
        return k * math.exp(-abs(x) / w) / (2 * w)
    if name == "multi_gaussian":
        h, c = 0.15, 6.0
        n = lambda x, m, sd: math.exp(-0.5 * ((x - m) / sd) ** 2) / (math.sqrt(2 * math.pi) * sd)  # noqa: E731
        return k * ((1 + h) * n(x, 0, w) - h * n(x, w, c * w) - h * n(x, -w, c * w))
    raise AssertionError(name)


@pytest.mark.parametrize("name,opts", ALL)
def test_derivative_matches_closed_form(name, opts):
    sur = get_surrogate(name, **opts)
    full = {**{f: getattr(sur, f) for f in sur.__dataclass_fields__ if f != "name"}}
    xs = torch.linspace(-3, 3, 61, dtype=torch.float64)
    got = sur.derivative(xs)
    want = torch.tensor([closed_form(name, full, float(x)) for x in xs], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name,opts", ALL)
def test_derivative_is_finite_difference_of_primitive(name, opts):
    sur = get_surrogate(name, **opts)
    x = torch.randn(200, dtype=torch.float64) * 1.5
    h = 1e-6
    fd = (sur.primitive(x + h) - sur.primitive(x - h)) / (2 * h)
    torch.testing.assert_close(sur.derivative(x), fd, rtol=1e-5, atol=1e-6)
    # the primitive is a smoothed step: 0 far left, `scale` far right
    ends = sur.primitive(torch.tensor([-1e9, 1e9], dtype=torch.float64))
    top = sur.scale * (1 - sur.height) if name == "multi_gaussian" else sur.scale  # side lobes integrate to -h
    if name != "fast_sigmoid":  # x/(1+s|x|) tends to +-scale/s, symmetric about 0
        torch.testing.assert_close(ends, torch.tensor([0.0, top], dtype=torch.float64), atol=1e-6, rtol=0)
    else:
        torch.testing.assert_close(ends[1] - ends[0], torch.tensor(2 * sur.scale / sur.slope, dtype=torch.float64), atol=1e-3, rtol=0)


@pytest.mark.parametrize("name,opts", ALL)
def test_spike_forward_is_strict_heaviside_and_backward_is_derivative(name, opts):
    sur = get_surrogate(name, **opts)
    x = torch.tensor([-1.0, -1e-9, 0.0, 1e-9, 2.0], dtype=torch.float64, requires_grad=True)
    z = sur(x)
    assert z.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    g = torch.randn(5, dtype=torch.float64)
    z.backward(g)
    torch.testing.assert_close(x.grad, g * sur.derivative(x.detach()))


def test_lsc_paper_values():
    # Herranz-Celotti & Rouat 2024, App. H: dH/dv = gamma f(omega v), f the fast-sigmoid derivative, omega=1,
    # gamma=0.5; written gamma/(1+|2 omega v|)^2 as in the authors' code -> 0.5, 0.222, 0.125, 0.0556
    sur = get_surrogate("fast_sigmoid", slope=2.0, scale=0.5)
    got = sur.derivative(torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(got, torch.tensor([0.5, 0.2222222, 0.125, 0.0555556], dtype=torch.float64), atol=1e-6, rtol=0)


def test_works_under_torch_func():
    sur = get_surrogate("atan")
    x = torch.randn(4, 3, dtype=torch.float64)
    jac = torch.func.vmap(torch.func.jacrev(lambda v: sur(v)))(x)
    torch.testing.assert_close(jac, torch.diag_embed(sur.derivative(x)))
    t = torch.randn_like(x)
    _, jv = torch.func.jvp(lambda v: sur(v), (x,), (t,))
    torch.testing.assert_close(jv, t * sur.derivative(x))


def test_vmap_rule_keeps_batch_dimensions_and_second_derivatives():
    """The spike function's vmap rule (elementwise: run on the batched tensor as it is) gives what a loop over
    the samples gives: nested, with the batch dimension not first, with an input that is not batched, and the
    second derivative through a vmapped Jacobian (what LSC's loss differentiates) equal to a per-sample double
    backward (float64)."""
    torch.manual_seed(int(torch.randint(0, 10_000, ())))
    sur = get_surrogate("fast_sigmoid")
    x = torch.randn(5, 4, 3, dtype=torch.float64)
    assert torch.equal(torch.func.vmap(torch.func.vmap(sur, in_dims=1), in_dims=2)(x), heaviside(x).permute(2, 1, 0))
    x0, y = torch.randn(3, dtype=torch.float64) + 0.5, torch.randn(7, dtype=torch.float64)
    assert torch.equal(torch.func.vmap(lambda yy: sur(x0) * yy)(y), heaviside(x0)[None, :] * y[:, None])
    xs = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    J = torch.func.vmap(torch.func.jacrev(lambda v: sur(2.0 * v) * v))(xs)
    (got,) = torch.autograd.grad((J * torch.arange(1.0, 10.0, dtype=torch.float64).view(3, 3)).sum(), xs)
    want = []
    for i in range(4):
        xi = xs[i].detach().clone().requires_grad_()
        rows = [torch.autograd.grad((sur(2.0 * xi) * xi)[j], xi, create_graph=True)[0] for j in range(3)]
        Ji = torch.stack(rows)
        want.append(torch.autograd.grad((Ji * torch.arange(1.0, 10.0, dtype=torch.float64).view(3, 3)).sum(), xi)[0])
    assert float(got.abs().sum()) > 0
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-12, atol=1e-14)


def test_lookup_and_errors():
    assert get_surrogate("SuperSpike").name == "fast_sigmoid"
    assert get_surrogate({"name": "gaussian", "width": 0.3}).width == 0.3
    s = get_surrogate("triangle")
    assert get_surrogate(s) is s
    assert get_surrogate(s.to_config()) == s
    with pytest.raises(ValueError, match="unknown surrogate 'nope'.*fast_sigmoid"):
        get_surrogate("nope")
    with pytest.raises(ValueError, match="unknown option.*'alpha'"):
        get_surrogate("atan", alpha=2.0)
    with pytest.raises(ValueError, match="slope must be a positive"):
        get_surrogate("sigmoid", slope=-1.0)
    with pytest.raises(ValueError, match="missing 'name'"):
        get_surrogate({"slope": 1.0})
    assert heaviside(torch.tensor([0.0, 0.5])).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_heaviside_written_in_place_equals_the_cast_comparison(dtype):
    """The fast form (torch.gt into a tensor of x's dtype) against the boolean comparison and
    its cast, on fresh random values and the edge cases (signed zeros, subnormals, inf, NaN);
    the autograd and torch.func branches give the same values."""
    edge = torch.tensor([0.0, -0.0, 1e-40, -1e-40, float("inf"), -float("inf"), float("nan")], dtype=dtype)
    x = torch.cat([torch.randn(1000, dtype=dtype), edge])
    ref = (x > 0).to(dtype)
    fast = heaviside(x)
    assert fast.dtype == dtype and torch.equal(fast, ref)
    xg = x.clone().requires_grad_()
    assert torch.equal(heaviside(xg), ref)
    assert torch.equal(torch.func.vmap(heaviside)(x.view(-1, 1)).view(-1), ref)


def test_spike_without_a_recorder_is_the_heaviside_and_every_derivative_mode_still_works():
    """Where nothing records the call (no autograd graph, no forward-mode dual, no torch.func
    transform) the spike is the Heaviside step itself; where something does, the surrogate
    derivative reaches it: backward, torch.func.jvp and forward-mode dual tensors alike."""
    import torch.autograd.forward_ad as fwd

    from spikerec.surrogate import get_surrogate, heaviside

    sur = get_surrogate("fast_sigmoid")
    x = torch.randn(64, dtype=torch.float64)
    assert torch.equal(sur(x), heaviside(x))
    with torch.no_grad():
        assert torch.equal(sur(x.clone().requires_grad_()), heaviside(x))
    want = sur.derivative(x)
    xr = x.clone().requires_grad_()
    sur(xr).sum().backward()
    assert torch.allclose(xr.grad, want, rtol=1e-14, atol=0)
    assert torch.allclose(torch.func.jvp(sur, (x,), (torch.ones_like(x),))[1], want, rtol=1e-14, atol=0)
    with fwd.dual_level():
        tangent = fwd.unpack_dual(sur(fwd.make_dual(x, torch.ones_like(x)))).tangent
    assert tangent is not None and torch.allclose(tangent, want, rtol=1e-14, atol=0)

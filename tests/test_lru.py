"""LRU cell (Orvieto et al. 2023, "Resurrecting recurrent neural networks for long sequences": Lemma 3.2,
§3.2-3.4, eqs. (6)-(7), App. A), the deep LRU model and its optimiser recipe."""
import math

import pytest
import torch
from scipy import stats

from spikerec.layers.lru import LRU, LRUState, sample_ring
from spikerec.lru_model import LRUModel, lru_param_groups, warmup_cosine
from spikerec.scan import linear_scan

F64 = torch.float64


def _run(cell, x, s0, path):
    cell.zero_grad()
    xx = x.clone().requires_grad_()
    s = LRUState(*[t.clone().requires_grad_() for t in s0])
    y, sT = cell(xx, s) if path == "scan" else cell.step_loop(xx, s)
    w = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(7))
    ((y * w).sum() + 1.3 * sT.x_re.sum() - 0.7 * sT.x_im.sum()).backward()
    grads = {n: p.grad.clone() for n, p in cell.named_parameters()}
    return y.detach(), [t.detach() for t in sT], xx.grad, [t.grad for t in s], grads


@pytest.mark.parametrize("T,out", [(1, None), (150, None), (70, 5)])
def test_forward_scan_equals_step_loop(T, out):
    cell = LRU(4, 6, output_size=out, r_min=0.5, r_max=0.99).double()
    x = torch.randn(T, 3, 4, dtype=F64)
    s0 = LRUState(torch.randn(3, 6, dtype=F64), torch.randn(3, 6, dtype=F64))
    a, b = _run(cell, x, s0, "scan"), _run(cell, x, s0, "loop")
    torch.testing.assert_close(a[0], b[0], rtol=1e-11, atol=1e-11)
    for u, v in zip(a[1] + [a[2]] + a[3], b[1] + [b[2]] + b[3]):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-10)
    assert a[4].keys() == b[4].keys() == {"nu_log", "theta_log", "gamma_log", "B_re", "B_im", "C_re", "C_im", "D"}
    for k in a[4]:
        torch.testing.assert_close(a[4][k], b[4][k], rtol=1e-9, atol=1e-10, msg=k)


def test_eigenvalues_strictly_inside_unit_disk():
    cell = LRU(3, 4096)  # default ring [0, 1]: the clamp keeps |lambda| < 1
    assert (cell.lam().abs() <= 1).all()  # fp32: exp(-exp(nu_log)) may round to 1 (< 1 only in exact arithmetic, §3.3)
    assert (cell.double().lam().abs() < 1).all()
    with torch.no_grad():
        cell.nu_log.copy_(torch.linspace(-30, 5, 4096, dtype=F64))
    lam = cell.lam()
    assert (lam.abs() < 1).all() and (lam.abs() > 0).all()
    torch.testing.assert_close(cell.spectral_radius(), lam.abs().max())
    nu, _ = sample_ring(1000, 1.0, 1.0)  # r_max = 1 is allowed and clamped
    assert torch.isfinite(nu).all() and (torch.exp(-torch.exp(nu)) < 1).all()


@pytest.mark.parametrize("r_min,r_max,max_phase", [(0.0, 1.0, 6.28), (0.9, 0.999, 6.28), (0.5, 0.9, math.pi / 10)])
def test_ring_init_statistics(r_min, r_max, max_phase):
    """Lemma 3.2: |lambda|^2 ~ U[r_min^2, r_max^2], theta ~ U[0, max_phase], KS p > 1e-3 (n = 1e5)."""
    g = torch.Generator().manual_seed(int(1000 * r_max + 10 * r_min))
    nu_log, theta_log = sample_ring(100_000, r_min, r_max, max_phase, generator=g)
    r2 = torch.exp(-2 * torch.exp(nu_log))
    theta = torch.exp(theta_log)
    assert (r2.sqrt() >= r_min - 1e-9).all() and (r2.sqrt() <= r_max).all()
    assert (theta >= 0).all() and (theta <= max_phase).all()
    u = ((r2 - r_min ** 2) / (r_max ** 2 - r_min ** 2)).numpy()
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert stats.kstest((theta / max_phase).numpy(), "uniform").pvalue > 1e-3
    assert abs(r2.mean().item() - (r_min ** 2 + r_max ** 2) / 2) < 5e-3
    assert abs(stats.pearsonr(u, theta.numpy())[0]) < 0.02  # magnitude and phase independent


def test_init_gamma_and_matrix_scales():
    H, N = 64, 512
    cell = LRU(H, N, r_min=0.4, r_max=0.99)
    torch.testing.assert_close(cell.gamma() ** 2 + cell.lam().abs() ** 2, torch.ones(N), rtol=0, atol=1e-6)
    # App. A code: B halved per component (1/(2H)), C not halved (1/N), D ~ N(0, 1)
    assert abs(cell.B_re.var().item() * 2 * H - 1) < 0.05 and abs(cell.B_im.var().item() * 2 * H - 1) < 0.05
    assert abs(cell.C_re.var().item() * N - 1) < 0.05 and abs(cell.C_im.var().item() * N - 1) < 0.05
    assert cell.D.shape == (H,) and 0.5 < cell.D.var().item() < 1.6


def test_white_noise_state_variance_oracle():
    """E|x_T,n|^2 = sigma^2 |gamma_n B_n|^2 (1 - |lambda_n|^{2T}) / (1 - |lambda_n|^2) (Eq. 6, per channel);
    at init gamma_n^2 = 1 - |lambda_n|^2 so it is ~ sigma^2 |B_n|^2. Monte Carlo with M samples: |x|^2 has a
    relative std <= sqrt(2/M) (chi-square bound), tolerance 4 sqrt(2/M) = 4%."""
    H, N, T, M, sigma = 6, 8, 40, 20_000, 1.5
    cell = LRU(H, N, r_min=0.2, r_max=0.75).double()
    with torch.no_grad():
        cell.gamma_log.add_(0.3 * torch.randn(N, dtype=F64))  # away from the normalised init
        u = sigma * torch.randn(T, M, H, dtype=F64)
        xT = cell.states(u)[-1]
        emp = (xT.abs() ** 2).mean(0)
        lam2 = cell.lam().abs() ** 2
        gB2 = (cell.gamma()[:, None] ** 2 * (cell.B_re ** 2 + cell.B_im ** 2)).sum(1)
        pred = sigma ** 2 * gB2 * (1 - lam2 ** T) / (1 - lam2)
    tol = 4 * math.sqrt(2 / M)
    assert ((emp / pred - 1).abs() < tol).all(), (emp / pred)


def test_normalised_outputs_have_unit_variance_at_init():
    """Derived from eq. (7) and the App. A initialisation (Orvieto et al. 2023): gamma = sqrt(1 - |lambda|^2) gives
    E|x_n|^2 = sigma^2 for white-noise input, so Var[Re(C x)_h] ~ sigma^2 on average over h (tolerance 15%)."""
    H, N, T, M = 32, 256, 60, 400
    cell = LRU(H, N, r_min=0.0, r_max=0.9).double()
    with torch.no_grad():
        xs = cell.states(torch.randn(T, M, H, dtype=F64))[-1]
        re_cx = xs.real @ cell.C_re.t() - xs.imag @ cell.C_im.t()
    assert abs(re_cx.var(0).mean().item() - 1) < 0.15


def _block(lr, li):
    return torch.cat([torch.cat([torch.diag(lr), -torch.diag(li)], 1), torch.cat([torch.diag(li), torch.diag(lr)], 1)], 0)


def test_time_jacobian_is_diag_lambda():
    cell = LRU(3, 5, r_min=0.3, r_max=0.95).double()
    expected = _block(*cell._lam_parts()).detach()
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        u = torch.randn(3, dtype=F64, generator=g)
        s = torch.randn(10, dtype=F64, generator=g) * 3

        def f(vec):
            _, new = cell.step(u[None], cell.state_from_vector(vec[None]))
            return cell.state_vector(new)[0]

        J = torch.func.jacrev(f)(s)
        assert torch.equal(J, expected)
    A = cell.to_dense_real()[0].detach()
    assert torch.equal(A, expected)
    ev = torch.linalg.eigvals(A)
    lam = cell.lam().detach()
    torch.testing.assert_close(torch.sort(ev.abs())[0], torch.sort(torch.cat([lam.abs(), lam.abs()]))[0])
    assert cell.state_size == 10
    st = cell.state_from_vector(s[None])
    assert torch.equal(cell.state_vector(st)[0], s)


def test_dense_to_diagonal_equivalence_uses_C_P():
    """§3.2.1: A = P diag(lam) P^-1, B_bar = P^-1 B, C_bar = C P (the paper's C P^-1 is wrong)."""
    g = torch.Generator().manual_seed(11)
    n, h, o, T = 6, 3, 2, 60
    A = torch.randn(n, n, dtype=F64, generator=g) / math.sqrt(n)
    A = 0.9 * A / torch.linalg.eigvals(A).abs().max()
    Bm, Cm = torch.randn(n, h, dtype=F64, generator=g), torch.randn(o, n, dtype=F64, generator=g)
    u = torch.randn(T, 2, h, dtype=F64, generator=g)
    x = torch.zeros(2, n, dtype=F64)
    ys = []
    for t in range(T):
        x = x @ A.t() + u[t] @ Bm.t()
        ys.append(x @ Cm.t())
    y_dense = torch.stack(ys)
    lam, P = torch.linalg.eig(A)
    Pinv = torch.linalg.inv(P)
    xbar = linear_scan(lam, u.to(P.dtype) @ (Pinv @ Bm.to(P.dtype)).t())
    y_diag = xbar @ (Cm.to(P.dtype) @ P).t()
    torch.testing.assert_close(y_diag.real, y_dense, rtol=1e-10, atol=1e-10)
    assert y_diag.imag.abs().max() < 1e-10
    y_wrong = (xbar @ (Cm.to(P.dtype) @ Pinv).t()).real
    assert (y_wrong - y_dense).abs().max() > 1e-2


def test_to_dense_real_reproduces_forward():
    cell = LRU(3, 4, r_min=0.5, r_max=0.95).double()
    A, Bd, Cd, Dd = (t.detach() for t in cell.to_dense_real())
    u = torch.randn(50, 2, 3, dtype=F64)
    s = torch.zeros(2, 8, dtype=F64)
    ys = []
    for t in range(50):
        s = s @ A.t() + u[t] @ Bd.t()
        ys.append(s @ Cd.t() + u[t] @ Dd.t())
    torch.testing.assert_close(cell(u)[0].detach(), torch.stack(ys), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("H,N", [(5, 7), (16, 32)])
def test_parameter_count(H, N):
    assert sum(p.numel() for p in LRU(H, N).parameters()) == 4 * N * H + 3 * N + H
    assert sum(p.numel() for p in LRU(H, N, output_size=3).parameters()) == 2 * N * H + 2 * N * 3 + 3 * N + 3 * H


def test_stability_groups():
    cell = LRU(3, 4)
    gr = cell.stability_groups()
    assert gr["time"] == [cell.nu_log]
    assert [id(p) for p in gr["depth"]] == [id(cell.B_re), id(cell.B_im)]  # C enters the next layer's depth term
    assert not cell.spiking


def test_bad_inputs():
    with pytest.raises(ValueError, match="r_min .* must not exceed r_max"):
        LRU(3, 4, r_min=0.9, r_max=0.5)
    with pytest.raises(ValueError, match="r_max must be <= 1"):
        LRU(3, 4, r_max=1.01)
    with pytest.raises(ValueError, match="r_min must be >= 0"):
        LRU(3, 4, r_min=-0.1)
    with pytest.raises(ValueError, match="max_phase"):
        LRU(3, 4, max_phase=0.0)
    with pytest.raises(ValueError, match="state_size"):
        LRU(3, 0)
    cell = LRU(3, 4)
    with pytest.raises(ValueError, match="expected 3 features"):
        cell(torch.randn(5, 2, 4))
    with pytest.raises(ValueError, match="time-first"):
        cell(torch.randn(5, 3))
    with pytest.raises(TypeError, match="real tensor"):
        cell(torch.randn(5, 2, 3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="real tensor"):
        cell.step(torch.randn(2, 3, dtype=torch.complex64), cell.initial_state(2))
    with pytest.raises(ValueError, match=r"LRU step input: expected shape \[B, 3\]"):
        cell.step(torch.randn(2, 5), cell.initial_state(2))
    with pytest.raises(ValueError, match="state.x_re"):
        cell.step(torch.randn(2, 3), LRUState(torch.zeros(2, 5), torch.zeros(2, 5)))


# --------------------------------------------------------------------------- deep model and optimiser
@pytest.mark.parametrize("norm,mix,pool", [("batch", "glu", "mean"), ("layer", "half_glu", "last"), ("batch", "mlp", "none")])
def test_lru_model_forward_and_backward(norm, mix, pool):
    m = LRUModel(5, 3, d_model=8, d_state=6, n_layers=2, norm=norm, mix=mix, dropout=0.1, pool=pool, r_min=0.5, r_max=0.99)
    x = torch.randn(20, 4, 5)
    out = m(x)
    assert out.shape == ((20, 4, 3) if pool == "none" else (4, 3))
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    m.eval()
    torch.testing.assert_close(m(x), m(x))  # no dropout in eval


def test_lru_model_blocks_are_prenorm_residual():
    m = LRUModel(4, 2, d_model=6, d_state=4, n_layers=1, norm="layer").double().eval()
    h = torch.randn(10, 3, 6, dtype=F64)
    blk = m.blocks[0]
    manual = h + blk.mix(blk.lru(blk.norm.norm(h))[0])
    torch.testing.assert_close(blk(h), manual)
    with pytest.raises(ValueError, match="norm"):
        LRUModel(4, 2, norm="group")
    with pytest.raises(ValueError, match="pool"):
        LRUModel(4, 2, pool="max")


def test_param_groups_and_schedule():
    m = LRUModel(5, 3, d_model=8, d_state=6, n_layers=2)
    groups = lru_param_groups(m, lr=4e-3, lr_factor=0.25, weight_decay=0.05)
    rec, other = groups
    names = {id(p): n for n, p in m.named_parameters()}
    assert {names[id(p)].rsplit(".", 1)[-1] for p in rec["params"]} == {"nu_log", "theta_log", "gamma_log", "B_re", "B_im"}
    assert rec["lr"] == pytest.approx(1e-3) and rec["weight_decay"] == 0.0
    assert other["lr"] == 4e-3 and other["weight_decay"] == 0.05
    assert len(rec["params"]) + len(other["params"]) == len(list(m.parameters()))
    assert not {"C_re", "C_im", "D"} & {names[id(p)].rsplit(".", 1)[-1] for p in rec["params"]}
    opt = torch.optim.AdamW(groups)
    sched = warmup_cosine(opt, total_steps=100, warmup_fraction=0.1)
    lrs = []
    for _ in range(101):
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx([1e-7, 1e-7])
    assert lrs[10] == pytest.approx([1e-3, 4e-3])
    assert lrs[100] == pytest.approx([1e-7, 1e-7])
    assert lrs[5][1] == pytest.approx(1e-7 + (4e-3 - 1e-7) * 0.5)
    second = [r[1] for r in lrs[10:]]
    assert all(a >= b for a, b in zip(second, second[1:]))
    with pytest.raises(ValueError):
        lru_param_groups(m, lr=-1.0)


@pytest.mark.parametrize("gamma", ["learned", "none"])
def test_complex_diagonal_rnn_equals_the_lru_layer(gamma):
    """The teacher-student ablation's complex diagonal RNN under the ``exp`` parametrisation (a
    registered backend of the LRU kind) equals the LRU layer with the same parameters (``gamma =
    1`` where it has none), float64, fresh random parameters and inputs."""
    from spikerec.analysis.teacher_student import ComplexDiagonalRNN
    from spikerec import neurons

    seed = int(torch.randint(0, 10_000, ()))
    net = ComplexDiagonalRNN(6, r_min=0.4, r_max=0.95, param="exp", gamma=gamma, d_in=3, d_out=2, seed=seed).double()
    lru = LRU(3, 6, output_size=2).double()
    with torch.no_grad():
        for n in ("nu_log", "theta_log", "B_re", "B_im", "C_re", "C_im", "D"):
            getattr(lru, n).copy_(getattr(net, n))
        lru.gamma_log.copy_(net.gamma_log if net.gamma_log is not None else torch.zeros(6))
    x = torch.randn(17, 4, 3, dtype=torch.float64)
    y_ref, _ = lru(x)
    assert torch.allclose(net(x), y_ref, rtol=1e-12, atol=1e-12)
    assert float(y_ref.abs().sum()) > 0
    assert "analysis.teacher_student.ComplexDiagonalRNN.forward (param='exp')" in neurons.backends_of("lru")

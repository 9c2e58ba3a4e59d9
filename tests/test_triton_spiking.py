"""The Triton LIF and ALIF kernels (kernels/lif_triton.py, kernels/alif_triton.py) and the surrogates'
Triton forms, against the one definition: on the CPU under TRITON_INTERPRET=1 (in a fresh process,
since the interpreter must be on before triton is imported), and compiled on a GPU when one is there."""
import itertools
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64

SCRIPT = textwrap.dedent(
    r"""
    import itertools, os, sys
    assert os.environ["TRITON_INTERPRET"] == "1"
    sys.path.insert(0, os.environ["ROOT"])
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(int(os.environ["SEED"]))
    from tests.test_lif_alif import assert_paths_equal
    from spikerec.layers import ALIF, LIF
    from spikerec.kernels.lif_sequence import LIFSequence
    from spikerec.kernels.alif_sequence import ALIFSequence
    from spikerec.kernels import surrogate_triton
    from spikerec.surrogate import SURROGATES
    from tests.surrogate_triton_probe import derivative

    # 1. the layers through the Triton kernels == autograd through the one definition's step (float64)
    for reset, tau_syn, detach in itertools.product(["subtract", "zero", "none"], [None, 4.0], [True, False]):
        cell = LIF(5, 7, tau_mem=torch.rand(7) * 10 + 1, tau_syn=tau_syn, reset=reset, detach_reset=detach,
                   learn_threshold=True, threshold=0.6, surrogate="atan", impl="triton")
        assert_paths_equal(cell)
    for recurrent, detach in itertools.product([False, True], [True, False]):
        cell = ALIF(5, 7, tau_mem=3.0, tau_adapt=20.0, b=0.3, beta=0.5, recurrent=recurrent, detach_reset=detach,
                    impl="triton")
        assert_paths_equal(cell)
    # a layer wider than one tile and more samples than one program holds (masks, several column tiles)
    assert_paths_equal(ALIF(6, 70, tau_mem=3.0, tau_adapt=20.0, b=0.3, beta=0.5, recurrent=True, impl="triton"),
                       T=5, B=18)
    assert_paths_equal(LIF(6, 300, tau_mem=5.0, threshold=0.6, impl="triton"), T=5, B=2)

    # 2. every surrogate's Triton form == its derivative (float64), shared parameters, fresh inputs
    x = torch.randn(1000, dtype=torch.float64) * 2
    for name, cls in SURROGATES.items():
        sur = cls()
        if surrogate_triton.triton_form(sur, warn=False) is None:
            assert name == "multi_gaussian", name
            continue
        got = derivative(sur, x)
        torch.testing.assert_close(got, sur.derivative(x), rtol=1e-12, atol=1e-14, msg=name)

    # 3. float32 (tl.dot in IEEE float32) and bfloat16 inputs with a float32 state, against the torch loop
    B, N, T = 17, 40, 9
    for dt in (torch.float32, torch.bfloat16):
        I = (torch.randn(T, B, N) * 0.8 + 0.5).to(dt).requires_grad_()
        v0, a0 = torch.randn(B, N), torch.rand(B, N)
        pars = [torch.rand(N) * 0.5 + 0.4 for _ in range(4)]
        W = torch.randn(N, N) * 0.3
        sur = SURROGATES["fast_sigmoid"](slope=2.0, scale=0.5)
        gz = torch.randn(T, B, N)
        res = {}
        for impl in ("torch", "triton"):
            Ii = I if impl == "triton" else I.float()
            Z, vT, aT = ALIFSequence.apply(Ii, v0, a0, *pars, W, sur, True, impl)
            g, = torch.autograd.grad((Z.float() * gz).sum() + vT.sum(), I)
            res[impl] = (Z.float(), vT, g.float())
            Z, vT, _ = LIFSequence.apply(Ii, v0, None, pars[0], None, pars[2], None, sur, "subtract", True, impl)
            g, = torch.autograd.grad((Z.float() * gz).sum() + vT.sum(), I)
            res[impl] += (Z.float(), vT, g.float())
        assert res["triton"][0].dtype == torch.float32
        tol = 1e-5 if dt == torch.float32 else 8e-3  # the input gradient is rounded to bfloat16 (8 bits)
        for k, (a, b) in enumerate(zip(res["torch"], res["triton"])):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=f"{dt} output {k}")
    # an empty sequence returns the initial state (impl="triton" asked, the torch loop answers)
    for cell in (LIF(3, 4, impl="triton"), ALIF(3, 4, impl="triton")):
        s0 = cell.initial_state(2)
        z, sT = cell(torch.zeros(0, 2, 3), s0)
        assert z.shape == (0, 2, 4) and all(torch.equal(a, b) for a, b in zip(sT, s0))
    print("TRITON-SPIKING-OK")
    """
)


@pytest.mark.slow
def test_triton_layers_equal_step_loop_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", ROOT=str(ROOT), SEED=str(int(torch.randint(0, 10_000, ()))))
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "TRITON-SPIKING-OK" in res.stdout


def test_triton_impl_refuses_what_it_cannot_run():
    from spikerec.kernels.alif_sequence import ALIFSequence
    from spikerec.kernels.lif_sequence import LIFSequence
    from spikerec.surrogate import get_surrogate

    I, v0, p = torch.randn(3, 2, 4), torch.zeros(2, 4), torch.full((4,), 0.9)
    sur = get_surrogate("fast_sigmoid")
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            LIFSequence.apply(I, v0, None, p, None, p, None, sur, "subtract", True, "triton")
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            ALIFSequence.apply(I, v0, v0, p, p, p, p, None, sur, True, "triton")
    with pytest.raises(ValueError, match="only feed-forward"):
        LIFSequence.apply(I, v0, None, p, None, p, torch.eye(4), sur, "subtract", True, "triton")
    with pytest.raises(ValueError, match="impl must be one of"):
        LIFSequence.apply(I, v0, None, p, None, p, None, sur, "subtract", True, "cuda")
    from spikerec.layers import ALIF, LIF

    with pytest.raises(ValueError, match="impl must be one of"):
        LIF(2, 3, impl="fast")
    with pytest.raises(ValueError, match="impl must be one of"):
        ALIF(2, 3, impl="fast")


def test_surrogate_without_triton_form_warns_once_by_name():
    from spikerec.kernels import surrogate_triton
    from spikerec.surrogate import MultiGaussian, get_surrogate

    surrogate_triton._WARNED.discard("multi_gaussian")
    with pytest.warns(RuntimeWarning, match="'multi_gaussian'"):
        assert surrogate_triton.triton_form(MultiGaussian()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert surrogate_triton.triton_form(MultiGaussian()) is None  # once only
    code, (p, scale, q) = surrogate_triton.triton_form(get_surrogate("atan", slope=3.0, scale=0.5))
    assert (code, p, scale) == (2, 3.0, 0.5)
    assert q == 3.0 * 3.141592653589793 / 2


# --- compiled on a GPU ------------------------------------------------------------------------------
def _run(cell, x, s0, path):
    """Forward (``cell(x)`` or the step loop), a weighted loss, backward: outputs and every gradient."""
    cell.zero_grad()
    xx = x.clone().requires_grad_()
    s = type(s0)(*[t.clone().requires_grad_() for t in s0])
    z, sT = (cell(xx, s) if path == "fused" else cell.step_loop(xx, s))
    w = torch.randn(z.shape, dtype=F64, generator=torch.Generator().manual_seed(7)).to(z.device, z.dtype)
    loss = (z * w).sum() + sum(((k + 1.3) * t).sum() for k, t in enumerate(sT))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in cell.named_parameters() if p.grad is not None}
    return z.detach(), [t.detach() for t in sT], xx.grad, [t.grad for t in s], grads


def _gpu_paths(cell, T, B, dtype):
    """The cell's forward on CUDA (Triton, auto) and its step loop in float64 on the CPU."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    x = torch.randn(T, B, cell.input_size, dtype=F64, generator=g) * 1.5
    s0 = type(cell.initial_state(B))(*[torch.randn(B, cell.hidden_size, dtype=F64, generator=g) * 0.7
                                       for _ in cell.initial_state(B)])
    ref = _run(cell.double(), x, s0, "loop")
    cuda = cell.to(device="cuda", dtype=dtype)
    got = _run(cuda, x.to("cuda", dtype), type(s0)(*[t.to("cuda", dtype) for t in s0]), "fused")
    cell.double().cpu()
    return got, ref


def _close(got, ref, rtol, atol, min_spike_agreement):
    agree = (got[0].cpu().double() == ref[0]).double().mean().item()
    assert agree >= min_spike_agreement, agree
    if agree == 1.0:
        for u, v in zip(got[1], ref[1]):
            torch.testing.assert_close(u.cpu().double(), v, rtol=rtol, atol=atol)
        torch.testing.assert_close(got[2].cpu().double(), ref[2], rtol=rtol, atol=atol)
        for k in ref[4]:
            torch.testing.assert_close(got[4][k].cpu().double(), ref[4][k], rtol=rtol, atol=atol, msg=k)


@pytest.mark.gpu
@pytest.mark.parametrize("reset,tau_syn,detach", list(itertools.product(["subtract", "zero", "none"], [None, 4.0],
                                                                          [True, False])))
def test_lif_triton_on_cuda_float64_equals_step_loop(reset, tau_syn, detach):
    from spikerec.layers import LIF

    cell = LIF(6, 300, tau_mem=torch.rand(300) * 10 + 1, tau_syn=tau_syn, reset=reset, detach_reset=detach,
               learn_threshold=True, threshold=0.6, surrogate="atan")
    got, ref = _gpu_paths(cell, 40, 5, F64)
    _close(got, ref, 1e-10, 1e-12, 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("recurrent,detach,n", [(False, True, 70), (True, True, 70), (True, False, 70),
                                                 (True, True, 256)])
def test_alif_triton_on_cuda_equals_step_loop(recurrent, detach, n):
    from spikerec.layers import ALIF

    cell = ALIF(6, n, tau_mem=3.0, tau_adapt=20.0, b=0.3, beta=0.5, recurrent=recurrent, detach_reset=detach)
    got, ref = _gpu_paths(cell, 30, 20, F64)
    _close(got, ref, 1e-10, 1e-12, 1.0)
    # float32: tl.dot in IEEE float32, not TF32; spikes may flip only where v sits within rounding of theta
    got, ref = _gpu_paths(cell, 30, 20, torch.float32)
    _close(got, ref, 1e-3, 1e-3, 0.999)


@pytest.mark.gpu
def test_triton_kernels_float32_and_bfloat16_on_cuda_against_torch_loop():
    from spikerec.kernels.alif_sequence import ALIFSequence
    from spikerec.kernels.lif_sequence import LIFSequence
    from spikerec.surrogate import get_surrogate

    T, B, N = 50, 16, 512
    sur = get_surrogate("fast_sigmoid", slope=2.0, scale=0.5)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        I = (torch.randn(T, B, N, device="cuda") * 0.8 + 0.5).to(dt).requires_grad_()
        v0, a0 = torch.randn(B, N, device="cuda"), torch.rand(B, N, device="cuda")
        pars = [torch.rand(N, device="cuda") * 0.5 + 0.4 for _ in range(4)]
        gz = torch.randn(T, B, N, device="cuda")
        for fn in (lambda Ii, impl: LIFSequence.apply(Ii, v0, None, pars[0], None, pars[2], None, sur, "subtract",
                                                      True, impl),
                   lambda Ii, impl: ALIFSequence.apply(Ii, v0, a0, *pars, None, sur, True, impl)):
            out = {}
            for impl in ("torch", "triton"):
                Z, vT, _ = fn(I if impl == "triton" else I.float(), impl)
                g, = torch.autograd.grad((Z.float() * gz).sum() + vT.float().sum(), I)
                out[impl] = (Z.float(), vT.float(), g.float())
            assert Z.dtype == dt and g.dtype == dt  # spikes and input gradient in the input's dtype
            agree = (out["torch"][0] == out["triton"][0]).float().mean().item()
            assert agree > 0.999, (dt, agree)
            if agree == 1.0:
                torch.testing.assert_close(out["triton"][2], out["torch"][2].to(dt).float(), rtol=2e-2, atol=2e-2)


def test_bench_lif_on_cuda_without_cuda_is_a_one_line_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    from spikerec.cli import main

    assert main(["bench", "lif", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA is not available" in err[0]

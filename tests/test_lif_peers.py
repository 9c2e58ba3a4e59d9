"""LIF dynamics equal snnTorch's Leaky/Synaptic and Norse's LIFBox/LIF under matched parameters.

Mappings (documented in spikerec.layers.lif):
* snnTorch ``Leaky(beta)`` / ``Synaptic(alpha, beta)`` with ``reset_delay=True`` (default):
  identical dynamics with ``beta = exp(-dt/tau_mem)``, ``alpha = exp(-dt/tau_syn)``; snnTorch's
  ``mem`` is our pre-reset ``v``; reset mechanisms map one to one.
* Norse (forward Euler, immediate reset to ``v_reset = 0``): our reset "zero" with
  ``exp(-dt/tau) = 1 - dt/tau_norse`` and the input scaled by ``dt/tau_mem_norse``; Norse stores
  the post-reset membrane, ours the pre-reset one, so spikes match exactly and the membranes
  match where no spike occurred.
"""
import math
import warnings

import pytest
import torch

from spikerec.layers import LIF

warnings.filterwarnings("ignore")
snn = pytest.importorskip("snntorch")
norse = pytest.importorskip("norse.torch")

F64 = torch.float64
T, B, N = 60, 4, 12


def identity_lif(tau_mem, tau_syn=None, reset="subtract", threshold=1.0):
    cell = LIF(N, N, tau_mem=tau_mem, tau_syn=tau_syn, reset=reset, threshold=threshold, bias=False).double()
    with torch.no_grad():
        cell.weight.copy_(torch.eye(N, dtype=F64))
        cell.log_tau_mem.fill_(math.log(tau_mem))  # set in float64, not rounded through float32
        if tau_syn is not None:
            cell.log_tau_syn.fill_(math.log(tau_syn))
    return cell


def drive():
    g = torch.Generator().manual_seed(11)
    return torch.rand(T, B, N, generator=g, dtype=F64) * 0.8


@pytest.mark.parametrize("reset", ["subtract", "zero", "none"])
def test_matches_snntorch_leaky(reset):
    beta = 0.85
    cell = identity_lif(-1.0 / math.log(beta), reset=reset, threshold=1.0)
    x = drive()
    ours = []
    st = cell.initial_state(B, dtype=F64)
    for t in range(T):
        z, st = cell.step(x[t], st)
        ours.append((z, st.v))
    leaky = snn.Leaky(beta=torch.tensor(beta, dtype=F64), threshold=1.0, reset_mechanism=reset)
    mem = torch.zeros(B, N, dtype=F64)
    n_spikes = 0
    for t in range(T):
        spk, mem = leaky(x[t], mem)
        assert torch.equal(spk.to(F64), ours[t][0]), f"spikes differ at t={t}"
        torch.testing.assert_close(mem, ours[t][1], rtol=1e-12, atol=1e-12)
        n_spikes += int(spk.sum())
    assert n_spikes > 20


@pytest.mark.parametrize("reset", ["subtract", "none"])
def test_matches_snntorch_synaptic(reset):
    # snnTorch's Synaptic "zero" reset zeroes the *new* membrane (this step's input is lost),
    # unlike its own Leaky and Norse, which zero the old one; spikerec follows Leaky/Norse.
    alpha, beta = 0.7, 0.9
    cell = identity_lif(-1.0 / math.log(beta), tau_syn=-1.0 / math.log(alpha), reset=reset)
    x = drive() * 0.5
    z_ours, st = cell(x)
    syn_mod = snn.Synaptic(alpha=torch.tensor(alpha, dtype=F64), beta=torch.tensor(beta, dtype=F64),
                           threshold=1.0, reset_mechanism=reset)
    syn = torch.zeros(B, N, dtype=F64)
    mem = torch.zeros(B, N, dtype=F64)
    spikes = []
    for t in range(T):
        spk, syn, mem = syn_mod(x[t], syn, mem)
        spikes.append(spk.to(F64))
    assert torch.equal(torch.stack(spikes), z_ours)
    torch.testing.assert_close(syn, st.i, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mem, st.v, rtol=1e-12, atol=1e-12)
    assert z_ours.sum() > 20


def test_matches_norse_lifbox():
    from norse.torch.functional.lif_box import LIFBoxFeedForwardState, LIFBoxParameters, lif_box_feed_forward_step

    dt, tau_inv = 1e-3, 150.0
    c = dt * tau_inv
    cell = identity_lif(-1.0 / math.log(1 - c), reset="zero")
    x = drive() * 6.0
    z_ours, _ = cell(x * c)
    p = LIFBoxParameters(tau_mem_inv=torch.tensor(tau_inv, dtype=F64), v_th=torch.tensor(1.0, dtype=F64),
                         v_reset=torch.tensor(0.0, dtype=F64), v_leak=torch.tensor(0.0, dtype=F64))
    s = LIFBoxFeedForwardState(v=torch.zeros(B, N, dtype=F64))
    zs = []
    for t in range(T):
        z, s = lif_box_feed_forward_step(x[t], s, p, dt=dt)
        zs.append(z)
    assert torch.equal(torch.stack(zs).to(F64), z_ours)
    assert z_ours.sum() > 20


def test_matches_norse_cuba_lif():
    from norse.torch.functional.lif import LIFFeedForwardState, LIFParameters, lif_feed_forward_step

    dt, tm, ts = 1e-3, 100.0, 200.0
    cm, cs = dt * tm, dt * ts
    cell = identity_lif(-1.0 / math.log(1 - cm), tau_syn=-1.0 / math.log(1 - cs), reset="zero")
    x = drive() * 3.0
    z_ours, _ = cell(x * cm)
    p = LIFParameters(tau_syn_inv=torch.tensor(ts, dtype=F64), tau_mem_inv=torch.tensor(tm, dtype=F64),
                      v_th=torch.tensor(1.0, dtype=F64), v_reset=torch.tensor(0.0, dtype=F64),
                      v_leak=torch.tensor(0.0, dtype=F64))
    s = LIFFeedForwardState(v=torch.zeros(B, N, dtype=F64), i=torch.zeros(B, N, dtype=F64))
    zs = []
    for t in range(T):
        z, s = lif_feed_forward_step(x[t], s, p, dt=dt)
        zs.append(z.to_dense() if z.is_sparse else z)
    assert torch.equal(torch.stack(zs).to(F64), z_ours)
    assert z_ours.sum() > 20

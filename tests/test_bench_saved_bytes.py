"""The saved-activation count of ``spikerec bench lif`` (bytes autograd keeps for the backward)."""
import torch

from spikerec.bench.lif_peers import held_tensors, neuron_contenders, saved_bytes


def test_held_parameters_are_not_counted_and_activations_are():
    fc = torch.nn.Linear(16, 8)
    x = torch.randn(5, 16, requires_grad=True)
    every = saved_bytes(lambda: fc(x))
    without_params = saved_bytes(lambda: fc(x), held_tensors(fc))
    assert without_params == x.numel() * 4  # the input, for the weight's gradient
    assert every == without_params + fc.weight.numel() * 4  # and the weight, for the input's gradient


def test_spikerec_neuron_saves_no_more_than_a_plain_loop():
    T, B, N = 20, 3, 16
    cont = neuron_contenders(T, B, N, 0.95, [])
    I = torch.randn(T, B, N) * 0.5 + 0.3
    got = {k: saved_bytes(lambda f=f: f(I.clone().requires_grad_()), getattr(f, "held", ()))
           for k, (f, _) in cont.items()}
    assert got["plain loop"] == T * B * N * 4  # one float per neuron and step (the surrogate's input)
    assert got["spikerec"] <= got["plain loop"] and got["spikerec-torch"] <= got["plain loop"]


def test_lif_layer_with_fixed_tau_saves_no_more_than_linear_and_plain_loop():
    from spikerec.layers import LIF

    T, B, N = 20, 3, 16
    torch.manual_seed(1)
    cell = LIF(N, N, tau_mem=19.5, learn_tau=False)
    x = (torch.rand(T, B, N) < 0.3).float()
    cell(x)  # derives the fixed decay, which the layer then holds
    got = saved_bytes(lambda: cell(x)[0], held_tensors(cell))
    # the Linear's input (T B N floats) and one membrane per neuron and step
    assert got == 2 * T * B * N * 4


def test_fixed_decay_follows_in_place_edits_moves_and_learning():
    from spikerec.layers import LIF

    torch.manual_seed(2)
    cell = LIF(6, 5, tau_mem=8.0, tau_syn=3.0, learn_tau=False).double()
    x = torch.rand(12, 2, 6, dtype=torch.float64) * 2

    def fresh():
        ref = LIF(6, 5, tau_mem=8.0, tau_syn=3.0, learn_tau=False).double()
        ref.load_state_dict(cell.state_dict())
        return ref(x)[1].v

    first = cell(x)[1].v
    assert torch.equal(first, fresh())
    a1 = cell._fixed_alpha
    cell(x)
    assert cell._fixed_alpha is a1  # derived once
    with torch.no_grad():
        cell.log_tau_mem.add_(0.3)
        cell.log_tau_syn.sub_(0.2)
    edited = cell(x)[1].v
    assert not torch.equal(edited, first) and torch.equal(edited, fresh())
    cell.log_tau_mem = torch.nn.Parameter(torch.full((5,), 1.0, dtype=torch.float64), requires_grad=False)
    assert torch.equal(cell(x)[1].v, fresh())
    cell.float()
    assert cell(x.float())[1].v.dtype == torch.float32
    assert torch.allclose(cell._fixed_alpha.double(), torch.exp(-1.0 / cell.log_tau_mem.double().exp()))
    cell.log_tau_mem.requires_grad_(True)  # learned again: the gradient reaches log tau
    cell(x.float())[0].sum().backward()
    assert cell.log_tau_mem.grad is not None

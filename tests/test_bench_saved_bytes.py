"""The saved-activation count of ``spikerec bench lif`` (bytes autograd keeps for the backward)."""
import torch

from spikerec.bench.lif import _neuron_contenders, held_tensors, saved_bytes


def test_held_parameters_are_not_counted_and_activations_are():
    fc = torch.nn.Linear(16, 8)
    x = torch.randn(5, 16, requires_grad=True)
    every = saved_bytes(lambda: fc(x))
    without_params = saved_bytes(lambda: fc(x), held_tensors(fc))
    assert without_params == x.numel() * 4  # the input, for the weight's gradient
    assert every == without_params + fc.weight.numel() * 4  # and the weight, for the input's gradient


def test_spikerec_neuron_saves_no_more_than_a_plain_loop():
    T, B, N = 20, 3, 16
    cont = _neuron_contenders(T, B, N, 0.95, [])
    I = torch.randn(T, B, N) * 0.5 + 0.3
    got = {k: saved_bytes(lambda f=f: f(I.clone().requires_grad_()), getattr(f, "held", ()))
           for k, (f, _) in cont.items()}
    assert got["plain loop"] == T * B * N * 4  # one float per neuron and step (the surrogate's input)
    assert got["spikerec"] <= got["plain loop"] and got["spikerec-torch"] <= got["plain loop"]

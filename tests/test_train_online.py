"""--learning online: with one LRU layer and a leaky-free readout the online (exact RTRL) gradient
equals BPTT, so both learning rules give the same weights after training."""
import torch
from safetensors.torch import load_file

from spikerec.cli import main

ARGS = ["copy-online", "--quiet", "--set", "data.options.n_samples=60",
        "--set", "data.batch_size=20", "--set", "model.layers=[{kind=\"lru\", size=8, output_size=12}]",
        "--set", "train.threads=1"]


def test_online_learning_matches_bptt_for_one_lru_layer(tmp_path, capsys):
    a, b = tmp_path / "online", tmp_path / "bptt"
    assert main(["train", *ARGS, "--epochs", "1", "--learning", "online", "--out", str(a)]) == 0
    assert main(["train", *ARGS, "--epochs", "1", "--learning", "bptt", "--out", str(b)]) == 0
    capsys.readouterr()
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)
    c = tmp_path / "init"  # zero epochs: the initial weights, to show that training moved them
    assert main(["train", *ARGS, "--epochs", "0", "--out", str(c)]) == 0
    wc = load_file(str(c / "model.safetensors"))
    assert max(float((wa[k] - wc[k]).abs().max()) for k in wa) > 1e-3

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
    c = tmp_path / "init"  # stopped before the first step: the initial weights, to show that training moved them
    assert main(["train", *ARGS, "--stop-after-steps", "0", "--out", str(c)]) == 0
    wc = {k[len("model/"):]: v for k, v in load_file(str(c / "checkpoints" / "step-00000000" / "state.safetensors")).items()
          if k.startswith("model/")}
    assert wc.keys() == wa.keys()
    assert max(float((wa[k] - wc[k]).abs().max()) for k in wa) > 1e-3


STREAM = ["copy-stream", "--quiet", "--set", "data.options.n_samples=48", "--set", "data.batch_size=8",
          "--set", "data.options.pattern_length=3", "--set", "data.options.pad_length=1",
          "--set", "model.layers=[{kind=\"lru\", size=8, output_size=8}]", "--set", "train.threads=1",
          "--set", "train.keep_best=false", "--set", "train.log_every=1", "--epochs", "2"]


def test_stream_training_carries_the_stream_and_resumes_bit_identically(tmp_path, capsys):
    """``[online] stream = true``: the batches are one stream per lane (the states are carried
    from one batch to the next, so the result differs from learning the same batches as
    separate sequences); a run stopped mid-epoch and resumed ends with the same weights; the run
    folder holds the stream plot and the step records the allocator memory."""
    import json

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main(["train", *STREAM, "--out", str(a)]) == 0
    listed = next(line for line in capsys.readouterr().out.splitlines() if "model.safetensors, config.json" in line)
    assert "stream.png" in listed  # the run folder's files as printed
    assert main(["train", *STREAM, "--out", str(b), "--stop-after-steps", "7"]) == 0
    assert main(["train", "--resume", str(b), "--quiet"]) == 0
    assert main(["train", *STREAM, "--set", "online.stream=false", "--out", str(c)]) == 0
    capsys.readouterr()
    wa, wb, wc = (load_file(str(p / "model.safetensors")) for p in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert max(float((wa[k] - wc[k]).abs().max()) for k in wa) > 1e-4
    assert (a / "stream.png").is_file()
    steps = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r.get("kind") == "step"]
    assert len(steps) == 2 * (48 // 8) and all("mem_mib" in r and r["stream_step"] == r["step"] * 8 for r in steps)


def test_stream_batches_are_one_stream():
    """Two batches through stream_batch equal one stream over the two sequences put end to end
    (the gradients; a reset between the batches changes them): nothing is reset between batches."""
    from spikerec.hardware.online import OnlineLearner
    from spikerec.layers import LeakyReadout
    from spikerec.layers.lru import LRU
    from spikerec.models import RecurrentStack
    from spikerec.train.stream import StreamLoss, stream_batch, stream_targets

    torch.manual_seed(0)
    model = RecurrentStack([LRU(3, 5)], LeakyReadout(3, 4))
    x = torch.randn(2, 6, 2, 3)  # two batches of 6 steps, 2 lanes
    y = torch.randint(0, 2, (2, 6, 2, 2))  # per-step targets: 2 outputs of 2 classes
    y[:, :3] = -100  # no target in the first half of each sequence
    loss = StreamLoss("per_step")
    grads = []
    for split in ("stream", "one", "reset"):
        model.zero_grad()
        lr = OnlineLearner(model, loss=loss)
        if split != "one":
            tot = 0.0
            for i in range(2):
                if split == "reset" and i == 1:
                    lr.reset()
                tot += stream_batch(lr, x[i], stream_targets(y[i], 6, "cross_entropy", "per_step"), loss)[0]
        else:
            tot = 0.0
            for t, (x_t, y_t) in enumerate(zip(torch.cat([x[0], x[1]]), torch.cat([y[0], y[1]]))):
                out, l = lr.step(x_t, None if t % 6 < 3 else y_t)
                tot += 0.0 if l is None else float(l)
            lr.update()
        grads.append([p.grad.clone() for p in model.parameters()])
        assert tot > 0
    for a, b in zip(grads[0], grads[1]):  # the same sums, added to .grad once per batch or once
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert max(float((a - b).abs().max()) for a, b in zip(grads[0], grads[2])) > 1e-3  # a reset would change it

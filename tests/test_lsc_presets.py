"""Every LSC preset states its LSC time in its description (``spikerec train --list``) and bounds its
pre-training; the GPU-sized ones converge with their own ``[lsc]`` settings on a reduced width
(16 neurons, 16 input channels, random spikes; a step limit bounds a failure, never a time limit)."""
from pathlib import Path

import pytest
import torch

import spikerec
from spikerec.stability import LSCConfig, lsc_pretrain
from spikerec.train.config import LSC_RUN_KEYS, load_config
from spikerec.train.runs import build_from_config

pytestmark = pytest.mark.usefixtures("one_thread")

PRESETS = sorted(p.stem for p in (Path(spikerec.__file__).parent / "configs").glob("*-lsc.toml"))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_states_its_lsc_time_and_a_bound(name):
    cfg = load_config(name)
    assert cfg["lsc"]["enabled"]
    assert "until converged" in cfg["description"] or "converges in" in cfg["description"], cfg["description"]
    lsc = LSCConfig.from_dict({k: v for k, v in cfg["lsc"].items() if k not in LSC_RUN_KEYS})
    assert lsc.max_time_s is not None or lsc.max_steps is not None


def _reduced(name, width=16, channels=16):
    cfg = load_config(name)
    mc = dict(cfg["model"], input_size=channels, readout={"size": 20, "mode": "per_step"})
    mc["layers"] = [dict(l, size=2 * width, output_size=width) if l["kind"] == "lru" else dict(l, size=width)
                    for l in mc["layers"]]
    torch.manual_seed(0)
    return build_from_config(mc), {k: v for k, v in cfg["lsc"].items() if k not in LSC_RUN_KEYS}


# measured with seed 0 on one thread: shd-alif-lsc 180 steps, shd-gru-lsc 90, shd-gru5-lsc 470
@pytest.mark.slow
@pytest.mark.parametrize("name", ["shd-alif-lsc", "shd-gru-lsc", "shd-gru5-lsc"])
def test_gpu_sized_preset_converges_on_a_reduced_width(name):
    model, lsc = _reduced(name)
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(10, 16, 16, generator=g) < 0.3).float()
    report = lsc_pretrain(model, x, dict(lsc, max_steps=1000))
    assert report.converged, (report.stop_reason, report.best_radii)

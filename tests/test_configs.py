"""Presets and config validation (spikerec.train.config)."""
import pytest

from spikerec.data import dataset_info
from spikerec.train.config import ConfigError, apply_override, list_presets, load_config, resolve_sizes
from spikerec.train.trainer import build_from_config

PRESETS = sorted(list_presets())


def test_required_presets_exist():
    for name in ["quickstart", "lru-deep", "copy-online", "shd-alif-lsc", "shd-alif5-lsc", "shd-gru-lsc",
                 "shd-lru-lsc", "slmnist-alif-lsc", "slmnist-alif5-lsc", "slmnist-gru-lsc", "slmnist-lru-lsc", "ssc-alif-lsc"]:
        assert name in PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_validates_and_builds(name):
    cfg = load_config(name)
    assert cfg["description"], f"preset {name} has no description"
    resolve_sizes(cfg, dataset_info(cfg["data"]["name"], **cfg["data"]["options"]))
    model = build_from_config(cfg["model"])
    assert sum(p.numel() for p in model.parameters()) > 0


def test_table_s1_parameter_counts():
    """Herranz-Celotti & Rouat, App. G Table S1: ALIF n_in n + n^2 + 4n per layer plus the readout; GRU as Keras reset_after."""
    def count(name):
        cfg = load_config(name)
        resolve_sizes(cfg, dataset_info(cfg["data"]["name"], **cfg["data"]["options"]))
        return sum(p.numel() for p in build_from_config(cfg["model"]).parameters())
    assert count("slmnist-alif-lsc") == 151_818
    assert count("shd-alif-lsc") == 382_996
    assert count("slmnist-gru-lsc") == 151_113
    assert count("shd-gru-lsc") == 372_665
    assert count("ssc-alif-lsc") == 382_996 + 15 * 257  # the SHD preset with a 35-class readout


def test_inherit_and_overrides():
    cfg = load_config("shd-alif5-lsc", ["train.lr=3e-3", "model.layers.0.size=64", "data.options.preset=\"zenke100\""])
    assert len(cfg["model"]["layers"]) == 5 and cfg["model"]["layers"][0]["size"] == 64
    assert cfg["train"]["lr"] == 3e-3 and cfg["train"]["epochs"] == 450  # inherited
    assert cfg["data"]["options"]["preset"] == "zenke100"
    assert isinstance(load_config("quickstart", ["train.lr=1"])["train"]["lr"], float)  # int accepted for float


@pytest.mark.parametrize("override, words", [
    ("train.lrr=1e-3", ["train.lrr", "did you mean lr", "valid keys in [train]"]),
    ("trian.lr=1e-3", ["trian.lr", "sections"]),
    ("train.epochs=ten", ["train.epochs", "integer"]),
    ("train.epochs=2.5", ["train.epochs", "integer"]),
    ("train.deterministic=1", ["train.deterministic", "boolean"]),
    ("train.optimizer=\"sgd\"", ["train.optimizer", "adam, adamw"]),
    ("train.lr=-1", ["train.lr", "> 0"]),
    ("model.layers.0.kind=\"lstm\"", ["model.layers.0.kind", "alif"]),
    ("model.layers.0.tau_mem_x=3", ["model.layers.0.tau_mem_x", "tau_mem"]),
    ("model.layers.3.size=4", ["index 3 out of range"]),
    ("data.name=\"mnist2\"", ["data.name", "digits"]),
    ("data.options.stepz=3", ["data.options.stepz", "steps"]),
    ("lsc.targett=1", ["lsc.targett", "target"]),
    ("lsc.order=\"x\"", ["lsc", "order"]),
    ("train.lr", ["KEY=VALUE"]),
])
def test_bad_overrides_name_the_key(override, words):
    with pytest.raises(ConfigError) as e:
        load_config("quickstart", [override])
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_unknown_preset_lists_presets(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config("quickstrat")
    assert "quickstart" in str(e.value) and "Available presets" in str(e.value)
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nepochs = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(bad))
    odd = tmp_path / "odd.toml"
    odd.write_text('inherit = "quickstart"\n[trainer]\nepochs = 1\n')
    with pytest.raises(ConfigError, match="trainer"):
        load_config(str(odd))


def test_resolve_sizes_checks_input_size():
    cfg = load_config("quickstart", ["model.input_size=10"])
    with pytest.raises(ConfigError, match="64 input channels"):
        resolve_sizes(cfg, dataset_info("digits"))
    cfg = load_config("quickstart")
    resolve_sizes(cfg, dataset_info("digits"))
    assert cfg["model"]["input_size"] == 64 and cfg["model"]["readout"]["size"] == 10


def test_apply_override_lists():
    cfg = load_config("quickstart")
    apply_override(cfg, "train.betas=[0.8, 0.9]")
    assert cfg["train"]["betas"] == [0.8, 0.9]
    with pytest.raises(ConfigError, match="list"):
        apply_override(cfg, "train.betas=0.9")

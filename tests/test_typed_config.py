"""Typed configs (spikerec.schema) and the shared optimisation pieces (spikerec.optim)."""
import math
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest
import torch

from spikerec import optim, schema
from spikerec.errors import ConfigError
from spikerec.lru_model import LRUModel, lru_param_groups, warmup_cosine
from spikerec.models import build_model
from spikerec.schema import Range
from spikerec.stability.lsc import LSCConfig
from spikerec.stability.lsc import make_optimizer as lsc_optimizer
from spikerec.train.config import (DEFAULTS, LSCSection, TrainSection, load_config, typed, validate_config)
from spikerec.train.trainer import make_optimizer, param_groups


@dataclass
class Demo:
    n: Annotated[int, Range(ge=1)] = 3
    x: float = 0.5
    rate: Annotated[float, Range(gt=0, le=1)] = 0.1
    big: Annotated[float, Range(gt=0, finite=False)] = math.inf
    mode: Literal["a", "b"] = "a"
    flag: bool = False
    pair: tuple[float, float] = (1.0, 2.0)
    names: list[str] = field(default_factory=list)
    maybe: Annotated[int, Range(ge=0)] | None = None


@pytest.mark.parametrize("key, value, words", [
    ("n", 0, ["'demo.n'", ">= 1"]),
    ("n", 2.0, ["'demo.n'", "an integer"]),
    ("n", True, ["'demo.n'", "an integer"]),
    ("x", "1", ["'demo.x'", "a number"]),
    ("x", math.inf, ["'demo.x'", "finite"]),
    ("x", math.nan, ["'demo.x'", "finite"]),
    ("rate", 1.5, ["'demo.rate'", "> 0 and <= 1"]),
    ("big", math.nan, ["'demo.big'", "finite"]),
    ("mode", "c", ["'demo.mode'", "one of a, b"]),
    ("flag", 1, ["'demo.flag'", "boolean"]),
    ("pair", [1.0], ["'demo.pair'", "2 items"]),
    ("pair", 1.0, ["'demo.pair'", "a list"]),
    ("names", ["a", 3], ["'demo.names[1]'", "a string"]),
    ("maybe", -1, ["'demo.maybe'", ">= 0"]),
    ("nope", 1, ["unknown key 'demo.nope'", "valid keys in [demo]"]),
])
def test_schema_refuses_from_the_field_types(key, value, words):
    with pytest.raises(ConfigError) as e:
        schema.from_dict(Demo, {key: value}, "demo")
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_schema_accepts_and_normalises():
    d = schema.from_dict(Demo, {"n": 4, "x": 2, "big": math.inf, "pair": [3, 4], "names": ("p",), "maybe": None}, "demo")
    assert d.n == 4 and d.x == 2.0 and isinstance(d.x, float) and d.big == math.inf
    assert d.pair == (3.0, 4.0) and d.names == ["p"] and d.maybe is None
    assert schema.defaults(Demo)["pair"] == [1.0, 2.0]
    assert schema.validate(Demo(), "demo") == Demo()
    with pytest.raises(ConfigError, match="'demo.mode'"):
        schema.validate(Demo(mode="z"), "demo")


def test_defaults_come_from_the_dataclasses():
    assert DEFAULTS["train"] == schema.defaults(TrainSection)
    assert set(DEFAULTS["lsc"]) == {"enabled", "batch_size", "batches"}
    cfg = load_config("quickstart")
    t = typed(cfg)
    assert isinstance(t.train, TrainSection) and isinstance(t.lsc, LSCSection) and isinstance(t.lsc, LSCConfig)
    assert t.train.lr == cfg["train"]["lr"] and t.lsc.target == cfg["lsc"]["target"] and t.lsc.enabled
    assert t.train.betas == tuple(cfg["train"]["betas"])


@pytest.mark.parametrize("section, key, value, words", [
    ("train", "lr", math.inf, ["train.lr", "finite"]),
    ("train", "eps", 0.0, ["train.eps", "> 0"]),
    ("train", "betas", [0.9, 1.0], ["train.betas[1]", "< 1"]),
    ("data", "batch_size", 0, ["data.batch_size", "> 0"]),
    ("lsc", "clip", [1.2, 1.3], ["lsc.clip", "lo <= 1 <= hi"]),
    ("lsc", "terms", [], ["lsc.terms", "non-empty"]),
    ("online", "chunk", -1, ["online.chunk", ">= 0"]),
])
def test_validate_config_names_the_key(section, key, value, words):
    cfg = load_config("quickstart")
    cfg[section][key] = value
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_lsc_config_is_checked_by_the_same_schema():
    for bad, word in (({"target": math.inf}, "target"), ({"lr": -1.0}, "lr"), ({"square_mode": "x"}, "square_mode"),
                      ({"verify_points": 0}, "verify_points")):
        with pytest.raises(ConfigError, match=word):
            LSCConfig.from_dict(bad)
    with pytest.raises(ConfigError, match="lsc.n_iter"):
        LSCConfig(n_iter=0).validate()


# --- one parameter-group function, one optimiser factory, one schedule -------------------------------------
TC = {"lr": 2e-3, "recurrent_lr_factor": 0.5, "recurrent_weight_decay": 0.01, "weight_decay": 0.1,
      "optimizer": "adamw", "betas": [0.8, 0.99], "eps": 1e-7}


def _ids(groups):
    return [[id(p) for p in g["params"]] for g in groups]


def test_trainer_and_lru_recipe_use_the_same_groups():
    torch.manual_seed(0)
    m = LRUModel(4, 3, d_model=8, d_state=6, n_layers=2)
    a = lru_param_groups(m, lr=4e-3, lr_factor=0.25, weight_decay=0.05)
    b = optim.param_groups(m, 4e-3, weight_decay=0.05, slow_lr_factor=0.25, slow_weight_decay=0.0)
    assert _ids(a) == _ids(b) and [g["lr"] for g in a] == [g["lr"] for g in b]
    c = param_groups(m, dict(TC, lr=4e-3, recurrent_lr_factor=0.25, recurrent_weight_decay=0.0, weight_decay=0.05))
    assert _ids(a) == _ids(c) and [g["weight_decay"] for g in c] == [0.0, 0.05]


def test_readout_is_never_in_the_slow_group():
    m = build_model({"input_size": 3, "layers": [{"kind": "alif", "size": 4}], "readout": {"size": 2, "tau": 4.0}})
    slow = optim.slow_parameter_ids(m)
    assert slow and not slow & {id(p) for p in m.readout.parameters()}


def test_optimiser_factory_matches_direct_construction():
    torch.manual_seed(1)
    m = build_model({"input_size": 3, "layers": [{"kind": "lif", "size": 5, "recurrent": True}], "readout": {"size": 2}})
    opt = make_optimizer(m, TC)
    assert isinstance(opt, torch.optim.AdamW)
    for g in opt.param_groups:
        assert g["betas"] == (0.8, 0.99) and g["eps"] == 1e-7 and g["base_lr"] == g["lr"]
    x = torch.rand(6, 2, 3)
    m2 = build_model({"input_size": 3, "layers": [{"kind": "lif", "size": 5, "recurrent": True}], "readout": {"size": 2}})
    m2.load_state_dict(m.state_dict())
    ref = torch.optim.AdamW(param_groups(m2, TC), lr=TC["lr"], betas=(0.8, 0.99), eps=1e-7)
    for model, o in ((m, opt), (m2, ref)):
        for _ in range(3):
            o.zero_grad()
            model(x)[0].square().mean().backward()
            o.step()
    for p, q in zip(m.parameters(), m2.parameters()):
        assert torch.equal(p, q)
    lsc = lsc_optimizer(m.parameters(), LSCConfig())
    assert type(lsc).__name__ == "Lookahead"
    assert isinstance(lsc_optimizer(m.parameters(), LSCConfig(optimizer="adam")), torch.optim.Adam)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        optim.make_optimizer(m.parameters(), "sgd", 1e-3)


def test_lru_schedule_is_the_shared_lr_factor():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p], "lr": 3e-3}], lr=3e-3)
    sched = warmup_cosine(opt, total_steps=50, warmup_fraction=0.2)
    for step in range(51):
        f = optim.lr_factor(step, 50, 0.2, "cosine", 1e-7 / 3e-3, 1e-7 / 3e-3)
        assert opt.param_groups[0]["lr"] == pytest.approx(3e-3 * f, rel=1e-12)
        opt.step()
        sched.step()
    assert optim.lr_factor(0, 10, 0.5) == pytest.approx(0.2)  # trainer warm-up: (step + 1) / w
    with pytest.raises(ValueError, match="schedule"):
        optim.lr_factor(5, 10, 0.0, "linear")

"""Run configurations: TOML presets, ``--set`` overrides, validation.

A config has the sections ``[model]`` (the :func:`spikerec.models.build_model` dict;
``input_size = "auto"`` and ``readout.size = "auto"`` are filled from
:func:`spikerec.data.dataset_info`), ``[data]``, ``[train]``, ``[lsc]`` (the
:class:`spikerec.stability.lsc.LSCConfig` fields plus ``enabled``) and ``[online]``.
Presets live in ``spikerec/configs/<name>.toml``; a preset may name another in
``inherit = "name"`` and then only lists what differs.

Overrides are ``section.key=value`` (nested: ``model.layers.0.size=64``,
``data.options.steps=30``); the value is read as a TOML value (``3e-3``, ``true``,
``"adamw"``, ``[0.9, 0.99]``), else as a plain string.

The sections ``[data]``, ``[train]``, ``[lsc]`` and ``[online]`` are dataclasses
(:class:`DataSection`, :class:`TrainSection`, :class:`LSCSection`, :class:`OnlineSection`)
whose field types are the schema (:mod:`spikerec.schema`): types, choices (``Literal``),
ranges and finiteness are checked from them, with one error naming the key. :func:`typed`
gives the typed view of a config dict; the trainer and the run folder keep the plain dict
(``config.json``).
"""
from __future__ import annotations

import copy
import inspect
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from .. import schema
from ..data import DATASETS, dataset_options
from ..errors import ConfigError
from ..layers.readout import READOUT_MODES, LeakyReadout
from ..lru_model import LRUModel
from ..models import CELL_KINDS, cell_class
from ..schema import Range
from ..stability.lsc import LSCConfig
from .presets import PRESET_DIR, list_presets, preset_path
from .presets import read_toml as _read_toml

__all__ = ["DEFAULTS", "DataSection", "TrainSection", "LSCSection", "OnlineSection", "RunConfig", "typed",
           "SECTION_TYPES", "ConfigError", "load_config", "list_presets", "preset_path", "apply_override",
           "validate_config", "resolve_sizes", "PRESET_DIR"]



_POS_INT = Annotated[int, Range(gt=0)]
_COUNT = Annotated[int, Range(ge=0)]
_NONNEG = Annotated[float, Range(ge=0)]
_BETA = Annotated[float, Range(ge=0, lt=1)]


@dataclass
class DataSection:
    """``[data]``: which data set and how it is batched."""

    name: str = "digits"                      # spikerec.data name
    options: dict = field(default_factory=dict)  # keyword options of get_dataset / dataset_info
    batch_size: _POS_INT = 64                 # global batch (split across processes with DDP)
    eval_batch_size: _POS_INT = 256
    valid_split: str = "valid"                # split used for per-epoch validation ("" = none)
    num_workers: _COUNT = 0


@dataclass
class TrainSection:
    """``[train]``: optimiser, schedule, loss, devices and checkpoints of the trainer."""

    epochs: _POS_INT = 10
    optimizer: Literal["adam", "adamw"] = "adam"
    lr: Annotated[float, Range(gt=0)] = 1e-3
    betas: tuple[_BETA, _BETA] = (0.9, 0.999)
    eps: Annotated[float, Range(gt=0)] = 1e-8
    weight_decay: _NONNEG = 0.0
    recurrent_lr_factor: _NONNEG = 1.0        # lr multiplier of the recurrent parameters
    recurrent_weight_decay: _NONNEG = 0.0     # weight decay of the recurrent parameters
    warmup: Annotated[float, Range(ge=0, lt=1)] = 0.0  # fraction of all steps with a linear warm-up
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_factor: _NONNEG = 0.0              # cosine ends at lr * min_lr_factor
    grad_clip: _NONNEG = 0.0                  # max global gradient norm (0 = off)
    loss: Literal["cross_entropy", "mse"] = "cross_entropy"
    loss_on: Literal["readout", "last", "mean", "per_step"] = "readout"  # readout: the model's readout mode
    accuracy: Literal["mode", "readout"] = "mode"  # mode: argmax_c mean_t y; readout: argmax of the logits
    seed: int = 0
    deterministic: bool = False
    amp: Literal["off", "bf16", "fp16"] = "off"  # CUDA only
    device: str = "auto"                      # auto | cpu | cuda | cuda:N
    learning: Literal["bptt", "online"] = "bptt"
    early_stop_patience: _COUNT = 0           # epochs without a better validation loss (0 = off)
    keep_best: bool = True                    # final weights = best validation loss
    checkpoint_every: _COUNT = 0              # also checkpoint every N steps (0 = end of each epoch only)
    keep_checkpoints: _POS_INT = 2
    log_every: _COUNT = 10                    # steps between step records in metrics.jsonl
    threads: _COUNT = 0                       # torch intra-op threads (0 = torch's default)


@dataclass
class LSCSection(LSCConfig):
    """``[lsc]``: the :class:`~spikerec.stability.lsc.LSCConfig` options plus how the trainer runs it."""

    enabled: bool = False
    batch_size: _COUNT = 0                    # pre-training batch (0 = data.batch_size)
    batches: _COUNT = 0                       # number of batches per LSC epoch (0 = all)


@dataclass
class OnlineSection:
    """``[online]``: the rule and mode of :class:`spikerec.hardware.online.OnlineLearner`."""

    rule: str = "full"
    mode: str = "stream"
    chunk: _COUNT = 0                         # 0 = none
    stream: bool = False                      # one endless stream: sequences back to back, no resets (train/stream.py)
    readout_filter: Literal["auto", "on", "off"] = "auto"  # readout-filtered traces under a leaky readout (auto: where they apply)


#: the typed sections; ``[model]`` is free-form (checked against the cell constructors instead)
SECTION_TYPES = {"data": DataSection, "train": TrainSection, "lsc": LSCSection, "online": OnlineSection}
#: keys of ``[lsc]`` that the trainer owns; the LSC options are stored only where a preset sets them
LSC_RUN_KEYS = ("enabled", "batch_size", "batches")
DEFAULTS: dict[str, dict[str, Any]] = {
    "data": schema.defaults(DataSection),
    "train": schema.defaults(TrainSection),
    "lsc": {k: v for k, v in schema.defaults(LSCSection).items() if k in LSC_RUN_KEYS},
    "online": schema.defaults(OnlineSection),
}

_HINTS = {s: typing.get_type_hints(t, include_extras=True) for s, t in SECTION_TYPES.items()}

TOP_LEVEL = {"description": str, "inherit": str, "preset": str}
SECTIONS = ("model", "data", "train", "lsc", "online")


@dataclass
class RunConfig:
    """A whole run config, typed: what :func:`typed` returns for a validated config dict."""

    model: dict
    data: DataSection
    train: TrainSection
    lsc: LSCSection
    online: OnlineSection
    description: str = ""
    preset: str = ""


def typed(cfg: dict) -> RunConfig:
    """The typed view of a config dict (validated on the way)."""
    return RunConfig(model=cfg.get("model", {}),
                     **{s: schema.from_dict(t, cfg.get(s, {}), s) for s, t in SECTION_TYPES.items()},
                     description=cfg.get("description", ""), preset=cfg.get("preset", ""))


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _load_raw(name_or_path, seen: tuple = ()) -> dict:
    path = preset_path(name_or_path)
    if path in seen:
        raise ConfigError(f"config '{path}': 'inherit' loop through {[str(s) for s in seen]}")
    raw = _read_toml(path)
    parent = raw.get("inherit", "")
    if parent:
        if not isinstance(parent, str):
            raise ConfigError(f"config '{path}': 'inherit' must be a preset name, got {parent!r}")
        base = _load_raw(parent, seen + (path,))
        base.pop("description", None)
        raw = _merge(base, {k: v for k, v in raw.items() if k != "inherit"})
    return raw


def _parse_value(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _type_name(v) -> str:
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string",
            list: "a list", tuple: "a list", dict: "a table"}.get(type(v), type(v).__name__)


_unknown = schema.unknown_key


def apply_override(cfg: dict, text: str) -> None:
    """Apply one ``section.key[.sub...]=value`` override in place (type-checked)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected KEY=VALUE, e.g. train.lr=3e-3")
    key, _, val = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    value = _parse_value(val.strip())
    if parts[0] in TOP_LEVEL:
        cfg[parts[0]] = value
        return
    if parts[0] not in SECTIONS:
        raise _unknown(key, list(SECTIONS) + list(TOP_LEVEL), "the config (sections)")
    if len(parts) < 2:
        raise ConfigError(f"override '{text}': name a key inside [{parts[0]}], e.g. {parts[0]}.KEY=VALUE")
    node = cfg.setdefault(parts[0], {})
    section = parts[0]
    stype = SECTION_TYPES.get(section)
    if stype is not None and parts[1] not in schema.field_names(stype):
        raise _unknown(key, schema.field_names(stype), f"[{section}]")
    for i, p in enumerate(parts[1:-1], start=1):
        if isinstance(node, list):
            node = _list_item(node, p, ".".join(parts[: i + 1]))
        else:
            if p not in node:
                if section == "model" or p == "options":
                    node[p] = {}
                else:
                    raise _unknown(".".join(parts[: i + 1]), node, f"[{'.'.join(parts[:i])}]")
            node = node[p]
    last = parts[-1]
    if isinstance(node, list):
        idx = _index(node, last, key)
        node[idx] = value
        return
    if not isinstance(node, dict):
        raise ConfigError(f"override '{text}': '{'.'.join(parts[:-1])}' is not a table")
    if stype is not None and len(parts) == 2:
        value = _plain(schema.check_value(key, _HINTS[section][last], value, shown=repr(val.strip())))
    node[last] = value


def _index(lst: list, p: str, key: str) -> int:
    try:
        i = int(p)
    except ValueError:
        raise ConfigError(f"'{key}': '{p}' indexes a list; use a number 0..{len(lst) - 1}") from None
    if not -len(lst) <= i < len(lst):
        raise ConfigError(f"'{key}': index {i} out of range (the list has {len(lst)} entries)")
    return i


def _list_item(lst: list, p: str, key: str):
    return lst[_index(lst, p, key)]


def _check_kwargs(cls, spec: dict, where: str) -> None:
    sig = inspect.signature(cls.__init__)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    valid = [n for n, p in sig.parameters.items() if n != "self" and p.kind == p.KEYWORD_ONLY]
    for k in spec:
        if k not in valid:
            raise _unknown(f"{where}.{k}", valid + ["kind", "size"], f"[{where}] ({cls.__name__} options)")


def validate_config(cfg: dict) -> dict:
    """Check sections, keys, types, ranges and choices against the typed sections (and the
    model and data options against their constructors); raise :class:`ConfigError` naming
    the bad key. The typed sections are normalised in place (an int given for a float
    becomes a float)."""
    for k in cfg:
        if k not in SECTIONS and k not in TOP_LEVEL:
            raise _unknown(k, list(SECTIONS) + list(TOP_LEVEL), "the config (sections)")
    for k, t in TOP_LEVEL.items():
        if k in cfg and not isinstance(cfg[k], t):
            raise ConfigError(f"'{k}' must be {_type_name(t())}, got {cfg[k]!r}")
    for section, stype in SECTION_TYPES.items():
        sec = cfg.get(section, {})
        if not isinstance(sec, dict):
            raise ConfigError(f"[{section}] must be a table, got {sec!r}")
        obj = schema.from_dict(stype, sec, section)
        if section in cfg:
            cfg[section] = {k: _plain(getattr(obj, k)) for k in sec}
    _validate_data(cfg.get("data", {}))
    _validate_model(cfg.get("model"))
    return cfg


def _plain(v):
    """Tuples as lists, as JSON and TOML give them back."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _validate_data(d: dict) -> None:
    name = d.get("name", DEFAULTS["data"]["name"])
    if name not in DATASETS:
        raise ConfigError(f"'data.name': unknown data set '{name}'; available: {', '.join(sorted(DATASETS))}")
    opts = d.get("options", {})
    if not isinstance(opts, dict):
        raise ConfigError(f"'data.options' must be a table, got {opts!r}")
    valid = dataset_options(name)
    for k in opts:
        if k not in valid:
            raise _unknown(f"data.options.{k}", valid, f"[data.options] of '{name}'")


def _validate_model(m) -> None:
    if not isinstance(m, dict):
        raise ConfigError("[model] is missing: it needs input_size, layers (kind, size, ...) and readout (size, mode)")
    if m.get("kind", "stack") == "lru_deep":
        return _validate_lru_deep(m)
    if m.get("kind", "stack") != "stack":
        raise ConfigError(f"'model.kind' must be \"stack\" (cells + readout) or \"lru_deep\", got {m.get('kind')!r}")
    valid = {"input_size", "layers", "readout", "dropout", "kind"}
    for k in m:
        if k not in valid:
            raise _unknown(f"model.{k}", valid, "[model]")
    ins = m.get("input_size", "auto")
    if not (ins == "auto" or (isinstance(ins, int) and not isinstance(ins, bool) and ins > 0)):
        raise ConfigError(f"'model.input_size' must be a positive integer or \"auto\", got {ins!r}")
    layers = m.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ConfigError("'model.layers' must be a non-empty list of tables ([[model.layers]] kind = ..., size = ...)")
    for i, spec in enumerate(layers):
        where = f"model.layers.{i}"
        if not isinstance(spec, dict):
            raise ConfigError(f"'{where}' must be a table, got {spec!r}")
        kind, size = spec.get("kind"), spec.get("size")
        if kind not in CELL_KINDS:
            raise ConfigError(f"'{where}.kind': unknown layer kind {kind!r}; valid: {', '.join(sorted(CELL_KINDS))}")
        if not (isinstance(size, int) and not isinstance(size, bool) and size > 0):
            raise ConfigError(f"'{where}.size' must be a positive integer, got {size!r}")
        try:
            cls = cell_class(kind)
        except ImportError:
            continue  # the cell's module is not installed; build_model will say so
        _check_kwargs(cls, {k: v for k, v in spec.items() if k not in ("kind", "size")}, where)
    ro = m.get("readout")
    if not isinstance(ro, dict):
        raise ConfigError("'model.readout' must be a table with size (number of outputs or \"auto\") and mode")
    size = ro.get("size", "auto")
    if not (size == "auto" or (isinstance(size, int) and not isinstance(size, bool) and size > 0)):
        raise ConfigError(f"'model.readout.size' must be a positive integer or \"auto\", got {size!r}")
    if ro.get("mode", "mean") not in READOUT_MODES:
        raise ConfigError(f"'model.readout.mode' must be one of {', '.join(READOUT_MODES)}, got {ro.get('mode')!r}")
    _check_kwargs(LeakyReadout, {k: v for k, v in ro.items() if k not in ("size", "mode")}, "model.readout")
    dr = m.get("dropout", 0.0)
    if not (isinstance(dr, (int, float)) and not isinstance(dr, bool) and 0 <= dr < 1):
        raise ConfigError(f"'model.dropout' must be a number in [0, 1), got {dr!r}")


def _validate_lru_deep(m: dict) -> None:
    for k in ("input_size", "output_size"):
        v = m.get(k, "auto")
        if not (v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v > 0)):
            raise ConfigError(f"'model.{k}' must be a positive integer or \"auto\", got {v!r}")
    _check_kwargs(LRUModel, {k: v for k, v in m.items() if k not in ("kind", "input_size", "output_size")}, "model")


def load_config(name_or_path: str | os.PathLike = "quickstart", overrides: list[str] | None = None) -> dict:
    """Read a preset (or TOML file), fill the defaults, apply ``overrides``, validate.

    Returns the resolved config dict (``model.input_size`` may still be ``"auto"``; see
    :func:`resolve_sizes`).
    """
    raw = _load_raw(name_or_path)
    cfg = _merge({"description": "", **{s: {} for s in SECTIONS}}, DEFAULTS)
    cfg = _merge(cfg, {k: v for k, v in raw.items() if k != "inherit"})
    for k in raw:
        if k not in SECTIONS and k not in TOP_LEVEL:
            raise _unknown(k, list(SECTIONS) + list(TOP_LEVEL), f"'{preset_path(name_or_path)}' (sections)")
    cfg["preset"] = Path(preset_path(name_or_path)).stem
    for o in overrides or []:
        apply_override(cfg, o)
    validate_config(cfg)
    return cfg


def resolve_sizes(cfg: dict, info: dict) -> dict:
    """Fill ``model.input_size`` and ``model.readout.size`` given as ``"auto"`` from ``dataset_info``."""
    m = cfg["model"]
    if m.get("input_size", "auto") == "auto":
        m["input_size"] = int(info["input_size"])
    elif int(m["input_size"]) != int(info["input_size"]):
        raise ConfigError(f"'model.input_size' = {m['input_size']} but data set '{cfg['data']['name']}' has "
                          f"{info['input_size']} input channels (use \"auto\")")
    n_out = info.get("num_classes", info.get("output_size"))
    if m.get("kind") == "lru_deep":
        if m.get("output_size", "auto") == "auto":
            m["output_size"] = int(n_out)
        return cfg
    ro = m["readout"]
    if ro.get("size", "auto") == "auto":
        if n_out is None:
            raise ConfigError(f"'model.readout.size' = \"auto\" but data set '{cfg['data']['name']}' gives no "
                              f"num_classes/output_size; set it explicitly")
        ro["size"] = int(n_out)
    return cfg

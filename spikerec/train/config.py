"""Run configurations: TOML presets, ``--set`` overrides, validation.

A config has the sections ``[model]`` (the :func:`spikerec.models.build_model` dict;
``input_size = "auto"`` and ``readout.size = "auto"`` are filled from
:func:`spikerec.data.dataset_info`), ``[data]``, ``[train]``, ``[lsc]`` (the
:class:`spikerec.stability.lsc.LSCConfig` fields plus ``enabled``) and ``[online]``.
Presets live in ``spikerec/configs/<name>.toml``; a preset may name another in
``inherit = "name"`` and then only lists what differs.

Overrides are ``section.key=value`` (nested: ``model.layers.0.size=64``,
``data.options.steps=30``); the value is read as a TOML value (``3e-3``, ``true``,
``"adamw"``, ``[0.9, 0.99]``), else as a plain string, and must have the type of the
default it replaces.
"""
from __future__ import annotations

import copy
import difflib
import os
from pathlib import Path
from typing import Any

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..errors import ConfigError

__all__ = ["DEFAULTS", "ConfigError", "load_config", "list_presets", "preset_path", "apply_override",
           "validate_config", "resolve_sizes", "PRESET_DIR"]

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


# Defaults of the fixed-schema sections. ``[model]`` and the ``options`` tables are free-form
# (checked against the cell constructors / dataset options instead).
DEFAULTS: dict[str, dict[str, Any]] = {
    "data": {
        "name": "digits",          # spikerec.data name
        "options": {},             # keyword options of get_dataset / dataset_info
        "batch_size": 64,          # global batch (split across processes with DDP)
        "eval_batch_size": 256,
        "valid_split": "valid",    # split used for per-epoch validation ("" = none)
        "num_workers": 0,
    },
    "train": {
        "epochs": 10,
        "optimizer": "adam",       # adam | adamw
        "lr": 1e-3,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "weight_decay": 0.0,
        "recurrent_lr_factor": 1.0,      # lr multiplier of the recurrent parameters
        "recurrent_weight_decay": 0.0,   # weight decay of the recurrent parameters
        "warmup": 0.0,             # fraction of all steps with a linear warm-up
        "schedule": "cosine",      # cosine | constant
        "min_lr_factor": 0.0,      # cosine ends at lr * min_lr_factor
        "grad_clip": 0.0,          # max global gradient norm (0 = off)
        "loss": "cross_entropy",   # cross_entropy | mse
        "loss_on": "readout",      # readout (the model's readout mode) | last | mean | per_step
        "accuracy": "mode",        # mode (argmax_c mean_t y) | readout (argmax of the readout logits)
        "seed": 0,
        "deterministic": False,
        "amp": "off",              # off | bf16 | fp16 (CUDA only)
        "device": "auto",          # auto | cpu | cuda | cuda:N
        "learning": "bptt",        # bptt | online
        "early_stop_patience": 0,  # epochs without a better validation loss (0 = off)
        "keep_best": True,         # final weights = best validation loss
        "checkpoint_every": 0,     # also checkpoint every N steps (0 = end of each epoch only)
        "keep_checkpoints": 2,
        "log_every": 10,           # steps between step records in metrics.jsonl
        "threads": 0,              # torch intra-op threads (0 = torch's default)
    },
    "lsc": {
        "enabled": False,
        "batch_size": 0,           # pre-training batch (0 = data.batch_size)
        "batches": 0,              # number of batches per LSC epoch (0 = all)
    },
    "online": {
        "rule": "full",
        "mode": "stream",
        "chunk": 0,                # 0 = none
    },
}

TOP_LEVEL = {"description": str, "inherit": str, "preset": str}
SECTIONS = ("model", "data", "train", "lsc", "online")
CHOICES = {
    ("train", "optimizer"): ("adam", "adamw"),
    ("train", "schedule"): ("cosine", "constant"),
    ("train", "loss"): ("cross_entropy", "mse"),
    ("train", "loss_on"): ("readout", "last", "mean", "per_step"),
    ("train", "accuracy"): ("mode", "readout"),
    ("train", "amp"): ("off", "bf16", "fp16"),
    ("train", "learning"): ("bptt", "online"),
}
POSITIVE = {("data", "batch_size"), ("data", "eval_batch_size"), ("train", "lr"), ("train", "keep_checkpoints")}
NON_NEGATIVE = {("train", "epochs"), ("train", "weight_decay"), ("train", "recurrent_weight_decay"),
                ("train", "grad_clip"), ("train", "warmup"), ("train", "min_lr_factor"),
                ("train", "early_stop_patience"), ("train", "checkpoint_every"), ("train", "log_every"), ("train", "threads"),
                ("train", "recurrent_lr_factor"), ("lsc", "batch_size"), ("lsc", "batches"), ("online", "chunk"),
                ("data", "num_workers")}


def _lsc_fields() -> dict[str, Any]:
    """The LSC pre-training options and their defaults (from ``LSCConfig``)."""
    try:
        from dataclasses import fields

        from ..stability.lsc import LSCConfig
    except ImportError:  # pragma: no cover - stability module missing
        return {}
    return {f.name: getattr(LSCConfig(), f.name) for f in fields(LSCConfig)}


def list_presets() -> dict[str, str]:
    """``{name: description}`` of the shipped presets."""
    out = {}
    for p in sorted(PRESET_DIR.glob("*.toml")):
        try:
            out[p.stem] = _read_toml(p).get("description", "")
        except ConfigError as e:
            out[p.stem] = f"(broken: {e})"
    return out


def preset_path(name_or_path: str | os.PathLike) -> Path:
    """A preset name (``quickstart``) or a path to a ``.toml`` file -> its path."""
    s = os.fspath(name_or_path)
    p = Path(s)
    if s.endswith(".toml") or os.sep in s:
        if not p.is_file():
            raise ConfigError(f"config file '{s}' does not exist")
        return p
    cand = PRESET_DIR / f"{s}.toml"
    if cand.is_file():
        return cand
    names = sorted(list_presets())
    close = difflib.get_close_matches(s, names, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown preset '{s}'.{hint} Available presets: {', '.join(names)} "
                      f"(or give a path to a .toml file)")


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file '{path}': not valid TOML: {e}") from None


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


def _type_ok(default, value) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if default is None:
        return True
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))


def _type_name(v) -> str:
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string",
            list: "a list", tuple: "a list", dict: "a table"}.get(type(v), type(v).__name__)


def _unknown(key: str, valid, where: str) -> ConfigError:
    valid = sorted(valid)
    close = difflib.get_close_matches(key.split(".")[-1], valid, n=2)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return ConfigError(f"unknown key '{key}'{hint}; valid keys in {where}: {', '.join(valid)}")


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
    schema = DEFAULTS.get(section)
    if section == "lsc":
        schema = {**DEFAULTS["lsc"], **_lsc_fields()}
    if schema is not None and parts[1] not in schema and not (section == "lsc" and not _lsc_fields()):
        raise _unknown(key, schema, f"[{section}]")
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
    if schema is not None and len(parts) == 2:
        default = schema[last]
        if section == "lsc" and last == "clip" or isinstance(default, tuple):
            default = list(default)
        if not _type_ok(default, value):
            raise ConfigError(f"'{key}' must be {_type_name(default)}, got {val.strip()!r}")
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
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
    import inspect

    sig = inspect.signature(cls.__init__)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    valid = [n for n, p in sig.parameters.items() if n != "self" and p.kind == p.KEYWORD_ONLY]
    for k in spec:
        if k not in valid:
            raise _unknown(f"{where}.{k}", valid + ["kind", "size"], f"[{where}] ({cls.__name__} options)")


def validate_config(cfg: dict) -> dict:
    """Check sections, keys, types and choices; raise :class:`ConfigError` naming the bad key."""
    for k in cfg:
        if k not in SECTIONS and k not in TOP_LEVEL:
            raise _unknown(k, list(SECTIONS) + list(TOP_LEVEL), "the config (sections)")
    for k, t in TOP_LEVEL.items():
        if k in cfg and not isinstance(cfg[k], t):
            raise ConfigError(f"'{k}' must be {_type_name(t())}, got {cfg[k]!r}")
    for section, schema in DEFAULTS.items():
        sec = cfg.get(section, {})
        if not isinstance(sec, dict):
            raise ConfigError(f"[{section}] must be a table, got {sec!r}")
        full = dict(schema)
        if section == "lsc":
            full.update(_lsc_fields())
        for k, v in sec.items():
            if k not in full:
                if section == "lsc" and not _lsc_fields():
                    continue
                raise _unknown(f"{section}.{k}", full, f"[{section}]")
            d = full[k]
            d = list(d) if isinstance(d, tuple) else d
            if not _type_ok(d, v):
                raise ConfigError(f"'{section}.{k}' must be {_type_name(d)}, got {v!r}")
            if (section, k) in CHOICES and v not in CHOICES[(section, k)]:
                raise ConfigError(f"'{section}.{k}' must be one of {', '.join(CHOICES[(section, k)])}, got {v!r}")
            if (section, k) in POSITIVE and not v > 0:
                raise ConfigError(f"'{section}.{k}' must be > 0, got {v!r}")
            if (section, k) in NON_NEGATIVE and not v >= 0:
                raise ConfigError(f"'{section}.{k}' must be >= 0, got {v!r}")
    t = cfg.get("train", {})
    if not 0.0 <= t.get("warmup", 0.0) < 1.0:
        raise ConfigError(f"'train.warmup' is a fraction of all steps in [0, 1), got {t['warmup']!r}")
    _validate_data(cfg.get("data", {}))
    _validate_model(cfg.get("model"))
    lsc = {k: v for k, v in cfg.get("lsc", {}).items() if k not in DEFAULTS["lsc"]}
    if lsc and _lsc_fields():
        from ..stability.lsc import LSCConfig

        try:
            LSCConfig.from_dict(lsc).validate()
        except (ValueError, TypeError) as e:
            raise ConfigError(f"[lsc]: {e}") from None
    return cfg


def _validate_data(d: dict) -> None:
    from ..data import DATASETS

    name = d.get("name", DEFAULTS["data"]["name"])
    if name not in DATASETS:
        raise ConfigError(f"'data.name': unknown data set '{name}'; available: {', '.join(sorted(DATASETS))}")
    opts = d.get("options", {})
    if not isinstance(opts, dict):
        raise ConfigError(f"'data.options' must be a table, got {opts!r}")
    try:
        from ..data import dataset_options

        valid = dataset_options(name)
    except Exception:  # pragma: no cover - option list unavailable
        return
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
    from ..models import CELL_KINDS, cell_class

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
    from ..layers.readout import READOUT_MODES, LeakyReadout

    if ro.get("mode", "mean") not in READOUT_MODES:
        raise ConfigError(f"'model.readout.mode' must be one of {', '.join(READOUT_MODES)}, got {ro.get('mode')!r}")
    _check_kwargs(LeakyReadout, {k: v for k, v in ro.items() if k not in ("size", "mode")}, "model.readout")
    dr = m.get("dropout", 0.0)
    if not (isinstance(dr, (int, float)) and not isinstance(dr, bool) and 0 <= dr < 1):
        raise ConfigError(f"'model.dropout' must be a number in [0, 1), got {dr!r}")


def _validate_lru_deep(m: dict) -> None:
    from ..lru_model import LRUModel

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

"""Checkpoint of a running online-learning stream: one safetensors file (no pickles) with the model's
parameters and buffers, the learner's stream state (layer states, eligibility traces, gradient
accumulators, counters), optionally the optimiser's state, and the torch CPU random state (the
non-tensor parts as JSON in the header). Restored into a learner built the same way (model, rule,
mode, optimiser class and hyper-parameters), the continued stream is bit-identical to an uninterrupted one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open

from ...atomic import atomic_path

__all__ = ["save_stream", "load_stream"]

FORMAT = "spikerec-online-stream/1"


def _pack_optimizer(opt) -> tuple[dict[str, torch.Tensor], dict]:
    sd = opt.state_dict()
    tensors, state_meta = {}, {}
    for idx, st in sd["state"].items():
        entry = {}
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"optim/{idx}/{k}"] = v
            else:
                entry[k] = v
        state_meta[str(idx)] = entry
    return tensors, {"class": type(opt).__name__, "state": state_meta, "param_groups": sd["param_groups"]}


def _unpack_optimizer(opt, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    if meta["class"] != type(opt).__name__:
        raise ValueError(f"online checkpoint: optimiser state of a {meta['class']}, got a {type(opt).__name__}")
    state: dict = {int(i): dict(v) for i, v in meta["state"].items()}
    for key, v in tensors.items():
        _, idx, k = key.split("/", 2)
        state.setdefault(int(idx), {})[k] = v
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_stream(path: str | os.PathLike, learner, optimizer=None) -> Path:
    """Write the stream's checkpoint to ``path`` (atomically); ``optimizer`` defaults to the learner's own."""
    opt = optimizer if optimizer is not None else learner.optimizer
    st, smeta = learner.state_tensors()
    tensors = {f"learner/{k}": v for k, v in st.items()}
    tensors.update({f"model/{k}": v for k, v in learner.model.state_dict().items()})
    meta = {"format": FORMAT, "learner": smeta, "optimizer": None}
    if opt is not None:
        ot, ometa = _pack_optimizer(opt)
        tensors.update(ot)
        meta["optimizer"] = ometa
    tensors["rng/torch"] = torch.random.get_rng_state()
    tensors = {k: v.detach().contiguous().cpu() if v.device.type != "cpu" else v.detach().contiguous().clone()
               for k, v in tensors.items()}
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"spikerec": json.dumps(meta)})
    return path


def load_stream(path: str | os.PathLike, learner, optimizer=None) -> None:
    """Restore a :func:`save_stream` checkpoint into ``learner``: model, stream state, optimiser, random state."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"online checkpoint {path}: no such file")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"online checkpoint {path}: not a safetensors file ({e})") from None
    if "spikerec" not in header:
        raise ValueError(f"online checkpoint {path}: no spikerec metadata (not written by save_stream)")
    meta = json.loads(header["spikerec"])
    if meta.get("format") != FORMAT:
        raise ValueError(f"online checkpoint {path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    model = learner.model
    dev = next(model.parameters()).device
    msd = {k[6:]: v.to(dev) for k, v in tensors.items() if k.startswith("model/")}
    # every check before anything is overwritten: the learner's rule and mode, the model's
    # tensors and shapes, the optimiser's class
    lmeta = meta["learner"]
    for k in ("rule", "mode", "chunk"):
        if lmeta.get(k) != getattr(learner, k):
            raise ValueError(f"online checkpoint {path}: written by a learner with {k} {lmeta.get(k)!r}, this "
                             f"learner has {getattr(learner, k)!r}")
    own = model.state_dict()
    missing = set(own) - set(msd)
    if missing:
        raise ValueError(f"online checkpoint {path}: model tensors missing: {sorted(missing)[:5]}")
    wrong = [f"{k} {tuple(msd[k].shape)} (the model's {tuple(v.shape)})" for k, v in own.items()
             if tuple(msd[k].shape) != tuple(v.shape)]
    if wrong:
        raise ValueError(f"online checkpoint {path}: model tensors of another shape: {', '.join(wrong[:3])}")
    opt = optimizer if optimizer is not None else learner.optimizer
    if meta["optimizer"] is None and opt is not None:
        raise ValueError(f"online checkpoint {path}: has no optimiser state, but an optimiser was given")
    if meta["optimizer"] is not None and opt is not None and meta["optimizer"]["class"] != type(opt).__name__:
        raise ValueError(f"online checkpoint {path}: optimiser state of a {meta['optimizer']['class']}, got a "
                         f"{type(opt).__name__}")
    learner.check_state_meta(lmeta)
    model.load_state_dict(msd)
    if meta["optimizer"] is not None and opt is not None:
        _unpack_optimizer(opt, {k: v.to(dev) for k, v in tensors.items() if k.startswith("optim/")}, meta["optimizer"])
    learner.load_state_tensors({k[8:]: v.to(dev) for k, v in tensors.items() if k.startswith("learner/")},
                               meta["learner"])
    torch.random.set_rng_state(tensors["rng/torch"])

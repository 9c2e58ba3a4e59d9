"""``spikerec export RUN --target T``: quantise a finished run for a target, write its files
(NIR graph, quantised network, netx HDF5 for loihi2, report) and cross-check the simulators.

The cross-check runs the float model, the NIR graph in snnTorch and in Norse, and the integer
simulator on the run's test set, and reports per-layer spike-train agreement with the float model
and each simulator's accuracy (see :mod:`spikerec.hardware.crosscheck`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from contextlib import nullcontext

import torch

from ..atomic import atomic_write_text
from ..train.runs import RunFolderError, RunLock  # a command module: it moves to spikerec.cli
from .profiles import PROFILES

__all__ = ["main", "load_run_model", "load_test_batches", "export_run"]


def load_run_model(run_dir: str):
    """The run's model: ``spikerec.train.runs.load_model`` when available, else
    ``build_model(config["model"])`` + ``model.safetensors``."""
    try:
        from ..train.runs import load_model  # type: ignore[attr-defined]
    except ImportError:
        load_model = None
    if load_model is not None:
        return load_model(run_dir)
    from safetensors.torch import load_file

    from ..models import build_model

    cfg_path, w_path = os.path.join(run_dir, "config.json"), os.path.join(run_dir, "model.safetensors")
    for p in (cfg_path, w_path):
        if not os.path.exists(p):
            raise FileNotFoundError(f"run folder '{run_dir}': missing {os.path.basename(p)}")
    cfg = json.load(open(cfg_path))
    if "model" not in cfg:
        raise ValueError(f"{cfg_path}: no 'model' section")
    model = build_model(cfg["model"])
    model.load_state_dict(load_file(w_path))
    return model.eval()


def load_test_batches(run_dir: str, split: str = "test", limit: int = 512, batch_size: int = 128):
    """``[(x[T, B, C], y)]`` from the run's data set (``config["data"]``), at most ``limit`` samples."""
    from .. import data as sdata

    cfg = json.load(open(os.path.join(run_dir, "config.json")))
    dcfg = dict(cfg.get("data", {}))
    name = dcfg.pop("name", None)
    if name is None:
        raise ValueError(f"run folder '{run_dir}': config.json has no data.name")
    # the trainer keeps data-set options under data.options; older folders had them flat
    if "options" in dcfg:
        opts = dict(dcfg["options"] or {})
    else:
        opts = {k: v for k, v in dcfg.items()
                if k not in ("batch_size", "eval_batch_size", "num_workers", "shuffle", "valid_split")}
    ds = sdata.get_dataset(name, split, **opts)
    n = min(len(ds), limit)
    batches = []
    for s in range(0, n, batch_size):
        items = [ds[i] for i in range(s, min(n, s + batch_size))]
        x = torch.stack([torch.as_tensor(it[0]) for it in items], 1).float()
        y = torch.as_tensor([int(it[1]) for it in items])
        batches.append((x, y))
    return batches


def export_run(run_dir: str, target: str, out_dir: str | None = None, *, samples: int = 512, dt: float = 1e-4,
               finetune_epochs: int = 0, adapt_reset: bool = False, lr: float = 1e-3, random_input: bool = False) -> dict:
    """Do the whole export of one run; returns the report (also written as ``report.json``)."""
    from .crosscheck import cross_check
    from .nir_io import write_nir
    from .quantize import finetune, quantize

    model = load_run_model(run_dir).float().eval()
    out_dir = out_dir or os.path.join(run_dir, "export", target)
    os.makedirs(out_dir, exist_ok=True)
    if random_input:
        g = torch.Generator().manual_seed(0)
        batches = [((torch.rand(50, 64, model.input_size, generator=g) < 0.1).float(), None)]
    else:
        batches = load_test_batches(run_dir, "test", samples)
    if finetune_epochs > 0:
        train = load_test_batches(run_dir, "train", 10**9)
        model = finetune(model, target, train, epochs=finetune_epochs, lr=lr, adapt_reset=adapt_reset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qnet, qrep = quantize(model, target, calibration=batches[0][0], adapt_reset=adapt_reset)
    if adapt_reset:
        from .quantize import adapt_model

        model = adapt_model(model, qnet.profile)
    files = {"nir": write_nir(model, os.path.join(out_dir, "model.nir"), dt=dt)}
    files["quantized"] = list(qnet.save(out_dir))
    if target == "loihi2":
        from .netx import write_netx

        files["netx"] = write_netx(qnet, os.path.join(out_dir, "netx.h5"))
    # cross-check over all batches, pooled
    pooled: dict = {}
    n_total = 0
    for x, y in batches:
        r = cross_check(model, x, y, qnet=qnet, dt=dt)
        b = x.shape[1]
        n_total += b
        for sim, entry in r.items():
            acc = pooled.setdefault(sim, {"n": 0})
            if "skipped" in entry:
                acc["skipped"] = entry["skipped"]
                continue
            if "accuracy" in entry:
                acc["accuracy"] = acc.get("accuracy", 0.0) + entry["accuracy"] * b
            for k, lay in enumerate(entry.get("layers", [])):
                acc.setdefault("layers", [dict(spikes_float=0, spikes_sim=0, both=0, union=0) for _ in entry["layers"]])
                for key, src in (("spikes_float", "spikes_a"), ("spikes_sim", "spikes_b"), ("both", "both"), ("union", "union")):
                    acc["layers"][k][key] += lay[src]
            acc["n"] += b
    for sim, acc in pooled.items():
        if "accuracy" in acc:
            acc["accuracy"] /= max(1, acc["n"])
        for lay in acc.get("layers", []):
            lay["matched"] = lay["both"] / lay["union"] if lay["union"] else 1.0
        if acc.get("layers"):
            acc["matched"] = min(lay["matched"] for lay in acc["layers"])
    pooled["float"]["firing_rates"] = cross_check(model, batches[0][0], None, simulators=())["float"]["firing_rates"]
    report = {"run": run_dir, "target": target, "dt": dt, "samples": n_total, "files": files,
              "quantization": qrep.to_dict(), "warnings": [str(w.message) for w in caught], "simulators": pooled}
    path = os.path.join(out_dir, "report.json")
    atomic_write_text(path, json.dumps(report, indent=1, default=str))
    return report


def _summary(rep: dict) -> str:
    lines = [f"export of {rep['run']} to '{rep['target']}' ({rep['samples']} samples, NIR dt = {rep['dt']:g})"]
    for sim, e in rep["simulators"].items():
        if "skipped" in e:
            lines.append(f"  {sim:<9} skipped: {e['skipped']}")
            continue
        acc = f"accuracy {100 * e['accuracy']:.2f}%" if "accuracy" in e else ""
        match = f"spike agreement {100 * e['matched']:.2f}%" if "matched" in e else \
            "firing rates " + " ".join(f"{r:.3f}" for r in e.get("firing_rates", []))
        lines.append(f"  {sim:<9} {acc}  {match}")
    for w in rep["warnings"]:
        lines.append(f"  warning: {w}")
    paths = []
    for v in rep["files"].values():
        paths += v if isinstance(v, list) else [v["path"]] if isinstance(v, dict) else [v]
    lines.append("  files: " + ", ".join(paths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spikerec export", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="run folder (config.json + model.safetensors)")
    ap.add_argument("--target", required=True, choices=sorted(PROFILES), help="target profile")
    ap.add_argument("--out", default=None, help="output folder (default RUN/export/TARGET)")
    ap.add_argument("--samples", type=int, default=512, help="test samples for the cross-check")
    ap.add_argument("--dt", type=float, default=1e-4, help="NIR dt (snnTorch's importer needs 1e-4)")
    ap.add_argument("--finetune-epochs", type=int, default=0, help="quantisation-aware fine-tuning epochs (STE)")
    ap.add_argument("--lr", type=float, default=1e-3, help="fine-tuning learning rate")
    ap.add_argument("--adapt-reset", action="store_true", help="switch resets the target lacks (then fine-tune)")
    ap.add_argument("--random-input", action="store_true", help="cross-check on random spikes instead of the test set")
    args = ap.parse_args(argv)
    try:
        with RunLock(args.run, "spikerec export") if os.path.isdir(args.run) else nullcontext():
            rep = export_run(args.run, args.target, args.out, samples=args.samples, dt=args.dt,
                             finetune_epochs=args.finetune_epochs, adapt_reset=args.adapt_reset, lr=args.lr,
                             random_input=args.random_input)
    except (FileNotFoundError, ValueError, RunFolderError) as e:
        print(f"spikerec export: {e}", file=sys.stderr)
        return 2
    print(_summary(rep))
    return 0

"""``spikerec lsc``: Local Stability Condition pre-training of a configured model, alone.

Builds the model of a preset, runs :func:`spikerec.stability.lsc_pretrain` on batches of
the preset's training data (labels unused: the condition is on the transition derivatives alone, Herranz-Celotti & Rouat, Sec. II-B), and writes a run folder with
the pre-trained weights (``model.safetensors``, ``config.json``, ``model.json``), the
report (``lsc.json``) and its plot (``lsc.png``). ``spikerec evaluate`` and
``spikerec export`` read that folder like any other run.
"""
from __future__ import annotations

import argparse
import sys

import torch

from ..data import dataset_info, get_dataset, make_loader
from ..errors import ConfigError
from ..stability import lsc_pretrain
from ..stability.progress import LSCProgressBar, lsc_warning
from ..train.config import load_config, resolve_sizes
from ..train.runs import clear_unstarted, new_run_dir, prepare_out, save_model, write_config
from ..train.trainer import build_from_config, seed_everything
from .common import ArgumentParser

__all__ = ["main"]


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="spikerec lsc", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="LSC pre-training (Herranz-Celotti & Rouat): drive the spectral radius of every transition "
                    "derivative (time, depth, input) towards a target (1, 0.5) with the clipped weight multiplier "
                    "and shuffling, then save the pre-trained model and a report of the radii.",
        epilog="examples:\n  spikerec lsc                          the quickstart model on the digits\n"
               "  spikerec lsc shd-alif-lsc --target 0.5 --set lsc.max_steps=500\n"
               "  spikerec lsc quickstart --out runs/lsc-test")
    p.add_argument("preset", nargs="?", default="quickstart", help="preset name or .toml path (default quickstart)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set lsc.max_steps=100 (repeatable)")
    p.add_argument("--target", type=float, help="target radius (shortcut for --set lsc.target=...)")
    p.add_argument("--out", help="output folder (default runs/<preset>-lsc-<time>)")
    p.add_argument("--quiet", action="store_true", help="print only the result")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    overrides = list(args.overrides) + ["lsc.enabled=true"]
    if args.target is not None:
        overrides.append(f"lsc.target={args.target}")
    cfg = load_config(args.preset, overrides)
    dc = cfg["data"]
    resolve_sizes(cfg, dataset_info(dc["name"], **dc["options"]))
    train_set = get_dataset(dc["name"], "train", **dc["options"])
    tc, lc = cfg["train"], cfg["lsc"]
    if tc["threads"]:
        torch.set_num_threads(int(tc["threads"]))
    seed_everything(int(tc["seed"]), bool(tc["deterministic"]))
    model = build_from_config(cfg["model"])
    if not hasattr(model, "cells"):
        raise ConfigError("LSC pre-training needs a stack of cells ([model] layers); this preset's model has none")
    bs = int(lc["batch_size"]) or int(dc["batch_size"])
    loader = make_loader(train_set, bs, True, int(tc["seed"]) + 7919)
    data = [b for _, b in zip(range(int(lc["batches"])), loader)] if lc["batches"] else loader
    options = {k: v for k, v in lc.items() if k not in ("enabled", "batch_size", "batches")}
    out = prepare_out(args.out, flag=None) if args.out else new_run_dir(f"{cfg.get('preset', 'run')}-lsc")  # never onto an existing run
    clear_unstarted(out)  # what a start killed before its config left there
    if not args.quiet:
        print(f"LSC pre-training of '{cfg.get('preset')}' towards radius {options.get('target', 1.0)} ...", flush=True)
    with LSCProgressBar(options.get("max_steps"), disable=args.quiet) as bar:
        report = lsc_pretrain(model, data, options, progress=bar)
    cfg["train"]["epochs"] = 0
    write_config(out, cfg)
    save_model(out, model, cfg, extra={"lsc": {"converged": report.converged, "steps": report.steps,
                                               "best_radii": report.best_radii}})
    report.save(out / "lsc.json")
    report.plot(out / "lsc.png")
    radii = ", ".join(f"{k} {v:.3f}" for k, v in (report.best_radii or {}).items())
    print(f"{report.stop_reason or 'done'} after {report.steps} steps ({report.wall_time_s:.1f} s)")
    print(f"radii: {radii}")
    if lsc_warning(report):
        print(lsc_warning(report))
    print(f"folder: {out} (model.safetensors, lsc.json, lsc.png)")
    return 0 if not report.diverged else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``spikerec export RUN --target T``: quantise a finished run for a target, write its files (NIR
graph, quantised network or Xylo specification, netx HDF5 for loihi2, report) and cross-check the
simulators. The work is :func:`spikerec.hardware.export.pipeline.export_model`; this module reads the run
and the arguments.
"""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch

from ..analysis.deployment_metrics import deployment_metrics, format_metrics
from ..hardware.export.pipeline import export_model, load_test_batches, summary
from ..hardware.export.profiles import PROFILES
from ..train.runs import RunLock, load_model, read_config
from .common import ArgumentParser, real_number, whole_number

__all__ = ["main", "build_parser", "export_run"]


def export_run(run_dir: str, target: str, out_dir: str | None = None, *, samples: int = 512, dt: float = 1e-4,
               finetune_epochs: int = 0, adapt_reset: bool = False, lr: float = 1e-3, random_input: bool = False,
               nir_extensions: bool = False, no_metrics: bool = False) -> dict:
    """Export one run folder (``config.json`` + ``model.safetensors``); returns the report. A folder
    that is not a run raises :class:`~spikerec.train.runs.RunError`, a missing or unreadable model
    :class:`~spikerec.errors.CheckpointError`, a model the target cannot take an
    :class:`~spikerec.errors.ExportError` (exit codes 2, 5 and 6 of ``spikerec export``)."""
    read_config(run_dir)
    model = load_model(run_dir).float().eval()
    if random_input:
        g = torch.Generator().manual_seed(0)
        batches = [((torch.rand(50, 64, model.input_size, generator=g) < 0.1).float(), None)]
    else:
        batches = load_test_batches(run_dir, "test", samples)
    train = load_test_batches(run_dir, "train", 10**9) if finetune_epochs > 0 else None
    return export_model(model, target, out_dir or os.path.join(run_dir, "export", target), batches,
                        train_batches=train, run_label=str(run_dir), dt=dt, finetune_epochs=finetune_epochs,
                        adapt_reset=adapt_reset, lr=lr, nir_extensions=nir_extensions,
                        metrics=None if no_metrics else _export_metrics)


def _export_metrics(model, batches) -> dict:
    """NeuroBench deployment metrics of the exported float model on the cross-check samples, with
    the footprint at the float width and at every export profile's (as ``spikerec evaluate``)."""
    m = deployment_metrics(model, batches, profiles=PROFILES)
    m["split"] = "test (cross-check samples)"
    return m


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="spikerec export", description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="run folder (config.json + model.safetensors)")
    ap.add_argument("--target", required=True, choices=sorted(PROFILES), help="target profile")
    ap.add_argument("--out", default=None, help="output folder (default RUN/export/TARGET)")
    ap.add_argument("--samples", type=whole_number(1), default=512, help="test samples for the cross-check")
    ap.add_argument("--dt", type=real_number(0, inclusive=False), default=1e-4,
                    help="NIR dt (snnTorch's importer needs 1e-4)")
    ap.add_argument("--finetune-epochs", type=whole_number(0), default=0,
                    help="quantisation-aware fine-tuning epochs (STE)")
    ap.add_argument("--lr", type=real_number(0, inclusive=False), default=1e-3, help="fine-tuning learning rate")
    ap.add_argument("--adapt-reset", action="store_true", help="switch resets the target lacks (then fine-tune)")
    ap.add_argument("--random-input", action="store_true", help="cross-check on random spikes instead of the test set")
    ap.add_argument("--nir-extensions", action="store_true",
                    help="write what NIR cannot express (reset subtract/none, ALIF) as spikerec extension metadata "
                         "(only spikerec reads it); without it such models get no model.nir")
    ap.add_argument("--no-metrics", action="store_true",
                    help="skip the deployment metrics (NeuroBench: synaptic operations, sparsity, footprint per "
                         "profile) of the exported model, otherwise printed and written to report.json")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Errors reach the command's handler (one line, the exit code of ``docs/errors.md``)."""
    args = build_parser().parse_args(argv)
    with RunLock(args.run, "spikerec export") if os.path.isdir(args.run) else nullcontext():
        rep = export_run(args.run, args.target, args.out, samples=args.samples, dt=args.dt,
                         finetune_epochs=args.finetune_epochs, adapt_reset=args.adapt_reset, lr=args.lr,
                         random_input=args.random_input, nir_extensions=args.nir_extensions,
                         no_metrics=args.no_metrics)
    print(summary(rep))
    m = rep.get("deployment_metrics")
    if m and "skipped" not in m:
        print("\n".join(f"  {line}" for line in format_metrics(m)))
    return 0

"""``spikerec evaluate RUN``: test a finished (or checkpointed) run again."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..analysis.deployment_metrics import deployment_metrics, format_metrics
from ..data import get_dataset, make_loader
from ..errors import CheckpointError
from ..hardware.export.profiles import PROFILES
from ..train.checkpoint import atomic_write_json
from ..train.runs import load_model, read_config, weights_source
from ..train.trainer import evaluate
from .common import ArgumentParser, check_device, whole_number

__all__ = ["main"]


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="spikerec evaluate",
        description="Load a run folder made by 'spikerec train' (config.json + model.safetensors), evaluate it on a "
                    "split of its data set and print the loss, the accuracy and the firing rate of every spiking layer.",
        epilog="example: spikerec evaluate runs/quickstart-20250101-120000 --split valid")
    p.add_argument("run", help="run folder")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"), help="data split (default test)")
    p.add_argument("--batch-size", type=whole_number(1), default=None, help="evaluation batch size (default: the run's)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--checkpoint", action="store_true", help="use the newest checkpoint instead of the final weights")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-metrics", action="store_true",
                   help="skip the deployment metrics (NeuroBench: synaptic operations, activation and connection "
                        "sparsity, footprint), which are otherwise printed and written to RUN/summary.json")
    p.add_argument("--metrics-batches", type=whole_number(1), default=None,
                   help="compute the deployment metrics on the first N batches only (default: the whole split)")
    return p


def _deployment(model, loader, args, res: dict) -> list[str]:
    """Deployment metrics into ``res["deployment_metrics"]`` and RUN/summary.json; the lines to print."""
    try:
        m = deployment_metrics(model, loader, profiles=PROFILES, max_batches=args.metrics_batches)
    except (ImportError, ValueError) as e:
        return [f"deployment metrics skipped: {e}"]
    m["split"] = args.split
    res["deployment_metrics"] = m
    path = Path(args.run) / "summary.json"
    try:
        summary = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        summary = {}
    summary["deployment_metrics"] = m
    atomic_write_json(path, summary)
    return format_metrics(m)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    check_device(args.device, "--device")
    cfg = read_config(args.run)
    final = Path(args.run) / "model.safetensors"
    if not args.checkpoint and not final.is_file():
        raise CheckpointError(f"'{final}' is missing (the run did not finish); evaluate its newest checkpoint "
                              f"explicitly with --checkpoint")
    model = load_model(args.run, map_location=args.device, checkpoint=args.checkpoint)
    weights = weights_source(args.run, args.checkpoint)
    dc = cfg["data"]
    ds = get_dataset(dc["name"], args.split, **dc.get("options", {}))
    bs = args.batch_size or int(dc.get("eval_batch_size", 256))
    loader = make_loader(ds, bs, False, 0)
    res = evaluate(model, loader, cfg["train"], torch.device(args.device))
    res.update({"run": str(args.run), "split": args.split, "data": dc["name"], "weights": weights})
    lines = [] if args.no_metrics else _deployment(model, loader, args, res)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    acc = res.get("accuracy")
    line = f"{args.run} ({weights}): {args.split} split of '{dc['name']}' ({res['samples']} samples): loss {res['loss']:.4f}"
    if acc is not None:
        line += f", accuracy {100 * acc:.2f}% ({cfg['train'].get('accuracy', 'mode')})"
    print(line)
    rates = {k: v for k, v in res.items() if k.startswith("rate_")}
    if rates:
        print("firing rates (spikes/neuron/step): " + ", ".join(f"layer {k[5:]} {v:.4f}" for k, v in rates.items()))
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""``spikerec evaluate RUN``: test a finished (or checkpointed) run again."""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spikerec evaluate",
        description="Load a run folder made by 'spikerec train' (config.json + model.safetensors), evaluate it on a "
                    "split of its data set and print the loss, the accuracy and the firing rate of every spiking layer.",
        epilog="example: spikerec evaluate runs/quickstart-20250101-120000 --split valid")
    p.add_argument("run", help="run folder")
    p.add_argument("--split", default="test", choices=("train", "valid", "test"), help="data split (default test)")
    p.add_argument("--batch-size", type=int, default=None, help="evaluation batch size (default: the run's)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--checkpoint", action="store_true", help="use the newest checkpoint instead of the final weights")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-metrics", action="store_true",
                   help="skip the deployment metrics (NeuroBench: synaptic operations, activation and connection "
                        "sparsity, footprint), which are otherwise printed and written to RUN/summary.json")
    p.add_argument("--metrics-batches", type=int, default=None,
                   help="compute the deployment metrics on the first N batches only (default: the whole split)")
    return p


def _deployment(model, loader, args, res: dict) -> list[str]:
    """Deployment metrics into ``res["deployment_metrics"]`` and RUN/summary.json; the lines to print."""
    from pathlib import Path

    from ..analysis.deployment_metrics import deployment_metrics, format_metrics
    from ..hardware.profiles import PROFILES
    from .checkpoint import atomic_write_json

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
    import torch

    from ..data import DataError, DatasetMissingError, get_dataset, make_loader
    from .runs import RunError, load_model, read_config
    from .trainer import evaluate

    try:
        cfg = read_config(args.run)
        model = load_model(args.run, map_location=args.device, checkpoint=args.checkpoint)
        dc = cfg["data"]
        ds = get_dataset(dc["name"], args.split, **dc.get("options", {}))
    except (RunError, DatasetMissingError, DataError, ValueError) as e:
        print(f"spikerec evaluate: {e}", file=sys.stderr)
        return 2
    bs = args.batch_size or int(dc.get("eval_batch_size", 256))
    loader = make_loader(ds, bs, False, 0)
    res = evaluate(model, loader, cfg["train"], torch.device(args.device))
    res.update({"run": str(args.run), "split": args.split, "data": dc["name"]})
    lines = [] if args.no_metrics else _deployment(model, loader, args, res)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    acc = res.get("accuracy")
    line = f"{args.run}: {args.split} split of '{dc['name']}' ({res['samples']} samples): loss {res['loss']:.4f}"
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

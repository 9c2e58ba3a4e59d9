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
    p.add_argument("--checkpoint", action="store_true",
                   help="use the newest checkpoint instead of the final weights (never chosen silently)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    import torch

    from ..data import DataError, DatasetMissingError, get_dataset, make_loader
    from .runs import RunError, load_model, read_config, weights_source
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
    res.update({"run": str(args.run), "split": args.split, "data": dc["name"],
                "weights": weights_source(args.run, args.checkpoint)})
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    acc = res.get("accuracy")
    line = f"{args.run}: {args.split} split of '{dc['name']}' ({res['samples']} samples): loss {res['loss']:.4f}"
    if acc is not None:
        line += f", accuracy {100 * acc:.2f}% ({cfg['train'].get('accuracy', 'mode')})"
    print(line)
    print(f"weights: {res['weights']}")
    rates = {k: v for k, v in res.items() if k.startswith("rate_")}
    if rates:
        print("firing rates (spikes/neuron/step): " + ", ".join(f"layer {k[5:]} {v:.4f}" for k, v in rates.items()))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

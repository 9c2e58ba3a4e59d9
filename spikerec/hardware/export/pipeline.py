"""The export of a trained model to a target: quantise, (fine-tune), write the files (NIR graph,
quantised network or the Xylo specification, netx HDF5 for loihi2, report) and cross-check the
simulators (:mod:`spikerec.hardware.export.crosscheck`). The command ``spikerec export RUN --target T``
(:mod:`spikerec.cli.export`) loads the run and calls :func:`export_model`.

The cross-check runs the float model, the NIR graph in snnTorch and in Norse (unpatched, as a
user loads the file), and the integer simulator (and SynSense's xylosim for Xylo) on the test set,
and reports per-layer spike-train agreement with the float model and each simulator's accuracy.
"""
from __future__ import annotations

import json
import os
import warnings

import torch

from ... import data as sdata
from ...atomic import atomic_write_text
from .crosscheck import cross_check
from .loihi2_netx import write_netx
from .nir_io import NIRExportError, write_nir
from .quantize import adapt_model, finetune, quantize

__all__ = ["load_test_batches", "export_model", "summary"]


def load_test_batches(run_dir: str, split: str = "test", limit: int = 512, batch_size: int = 128):
    """``[(x[T, B, C], y)]`` from the run's data set (``config["data"]``), at most ``limit`` samples."""
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


@torch.no_grad()
def _accuracy(model, batches) -> float | None:
    n = correct = 0
    for x, y in batches:
        if y is None:
            return None
        out, _ = model(x.to(next(model.parameters()).dtype))
        correct += int((model.logits(out).argmax(-1) == y).sum())
        n += len(y)
    return correct / max(1, n)


def export_model(model, target: str, out_dir: str, batches, *, train_batches=None, run_label: str = "", dt: float = 1e-4,
                 finetune_epochs: int = 0, adapt_reset: bool = False, lr: float = 1e-3,
                 nir_extensions: bool = False, metrics=None) -> dict:
    """Do the whole export of ``model`` to ``out_dir``; returns the report (also written as
    ``report.json``). ``batches``: ``[(x[T, B, C], labels or None)]`` for the cross-check (the first one
    calibrates); ``train_batches``: for fine-tuning; ``metrics``: ``fn(model, batches) -> dict`` run on
    the exported float model (after fine-tuning), its result stored as ``deployment_metrics`` (or the
    reason it was skipped). Nothing is written if quantisation fails."""
    model = model.float().eval()
    trained_accuracy = None
    if finetune_epochs > 0:
        if not train_batches:
            raise ValueError("export: fine-tuning needs training batches")
        trained_accuracy = _accuracy(model, batches)
        model = finetune(model, target, train_batches, epochs=finetune_epochs, lr=lr, adapt_reset=adapt_reset)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qnet, qrep = quantize(model, target, calibration=batches[0][0], adapt_reset=adapt_reset)
    if adapt_reset:
        model = adapt_model(model, qnet.profile)
    files, notes = {}, []
    try:
        files["nir"] = write_nir(model, os.path.join(out_dir, "model.nir"), dt=dt, extensions=nir_extensions)
    except NIRExportError as e:
        notes.append(f"model.nir not written: {e}")
    files["quantized" if not hasattr(qnet, "spec") else "xylo_spec"] = list(qnet.save(out_dir))
    if target == "loihi2":
        files["netx"] = write_netx(qnet, os.path.join(out_dir, "netx.h5"))
    # cross-check over all batches, pooled
    pooled: dict = {}
    n_total = 0
    for x, y in batches:
        r = cross_check(model, x, y, qnet=qnet, dt=dt, extensions=nir_extensions)
        b = x.shape[1]
        n_total += b
        for sim, entry in r.items():
            acc = pooled.setdefault(sim, {"n": 0})
            if "skipped" in entry:
                acc["skipped"] = entry["skipped"]
                continue
            if "accuracy" in entry:
                acc["accuracy"] = acc.get("accuracy", 0.0) + entry["accuracy"] * b
            for key in ("peer_bug", "label", "readout"):
                if key in entry:
                    acc[key] = entry[key]
            if "bit_identical_to_intsim" in entry:
                acc["bit_identical_to_intsim"] = acc.get("bit_identical_to_intsim", True) and entry["bit_identical_to_intsim"]
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
    if trained_accuracy is not None:
        pooled["float"]["accuracy_before_finetune"] = trained_accuracy
    pooled["float"]["firing_rates"] = cross_check(model, batches[0][0], None, simulators=())["float"]["firing_rates"]
    report = {"run": run_label, "target": target, "dt": dt, "samples": n_total, "files": files,
              "quantization": qrep.to_dict(), "warnings": [str(w.message) for w in caught] + notes,
              "simulators": pooled}
    if metrics is not None:
        try:
            report["deployment_metrics"] = metrics(model, batches)
        except (ImportError, ValueError) as e:  # neurobench missing, or a model its adapter does not cover
            report["deployment_metrics"] = {"skipped": str(e)}
    path = os.path.join(out_dir, "report.json")
    files["report"] = path
    atomic_write_text(path, json.dumps(report, indent=1, default=str))
    return report


def summary(rep: dict) -> str:
    """The report as printed by ``spikerec export``."""
    lines = [f"export of {rep['run']} to '{rep['target']}' ({rep['samples']} samples, NIR dt = {rep['dt']:g})"]
    for sim, e in rep["simulators"].items():
        if "skipped" in e:
            lines.append(f"  {sim:<9} skipped: {e['skipped']}")
            continue
        acc = f"accuracy {100 * e['accuracy']:.2f}%" if "accuracy" in e else ""
        if e.get("accuracy_before_finetune") is not None:
            acc += f" (trained model before fine-tuning: {100 * e['accuracy_before_finetune']:.2f}%)"
        if "bit_identical_to_intsim" in e:
            acc += "  bit-identical to intsim" if e["bit_identical_to_intsim"] else "  DIFFERS from intsim"
        match = f"spike agreement {100 * e['matched']:.2f}%" if "matched" in e else \
            "firing rates " + " ".join(f"{r:.3f}" for r in e.get("firing_rates", []))
        lines.append(f"  {sim:<9} {acc}  {match}")
        for key in ("peer_bug", "label"):
            if key in e:
                lines.append(f"            ({e[key]})")
    m = rep.get("deployment_metrics")
    if m and "skipped" in m:
        lines.append(f"  deployment metrics skipped: {m['skipped']}")
    for w in rep["warnings"]:
        lines.append(f"  warning: {w}")
    paths = []
    for v in rep["files"].values():
        paths += v if isinstance(v, list) else [v["path"]] if isinstance(v, dict) else [v]
    lines.append("  files: " + ", ".join(paths))
    return "\n".join(lines)

"""``spikerec train``: train a model from a preset (default ``quickstart``)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path


from ..errors import ConfigError, DataError
from ..train.presets import list_presets
from . import run_command
from .common import ArgumentParser, Interrupted, check_device, real_number, whole_number

__all__ = ["main", "build_parser"]

EPILOG = """\
examples:
  spikerec train                                  quickstart: ALIF + LSC on the embedded digits (offline, under a minute on 2 CPU cores)
  spikerec train shd-alif-lsc                     the LSC paper's 2-layer ALIF on SHD (needs the SHD files: spikerec datasets)
  spikerec train quickstart --set train.epochs=5 --set model.layers.0.size=64
  spikerec train quickstart --lsc target=0.5      LSC pre-training towards radius 0.5 first
  spikerec train copy-online --learning online    eligibility-trace learning instead of BPTT
  spikerec train quickstart --nproc-per-node 2    data-parallel with torchrun (gloo on CPU, NCCL on GPU)
  spikerec train --resume runs/quickstart-20250101-120000
  spikerec train --out runs/mine --sibling         a fresh runs/mine-2 (-3, ...) if runs/mine already holds a run
  spikerec train --list                           the presets

A run folder holds config.json, model.safetensors + model.json, metrics.jsonl/.csv,
checkpoints/, curves.png, raster.png (stream.png, lsc.png) and summary.json; 'spikerec evaluate
RUN' re-tests it. A run folder is never overwritten and is used by one process at a time: --out
onto another run is refused, while the same command again continues its own unfinished run (or
starts afresh if no checkpoint was written). Ctrl-C, SIGTERM and --stop-after-steps write a
checkpoint and print the --resume command.
"""


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="spikerec train", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Train a spiking or recurrent network from a TOML preset: optional LSC pre-training, then "
                    "BPTT (or online) training, evaluation on the test split, and a run folder with everything.")
    p.add_argument("preset", nargs="?", default=None,
                   help="preset name (see --list) or path to a .toml config (default: quickstart)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set train.lr=3e-3 (repeatable)")
    p.add_argument("--lsc", nargs="*", metavar="KEY=VALUE", default=None,
                   help="enable LSC pre-training, optionally with options (e.g. --lsc target=1 max_steps=200); "
                        "'--lsc off' disables it")
    p.add_argument("--learning", choices=("bptt", "online"), help="learning rule (overrides train.learning)")
    p.add_argument("--epochs", type=whole_number(1), help="shortcut for --set train.epochs=N")
    p.add_argument("--seed", type=int, help="shortcut for --set train.seed=N")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto (shortcut for --set train.device=...)")
    p.add_argument("--out", help="run folder (default runs/<preset>-<time>); another run is never overwritten, "
                                 "this command's own unfinished run is continued")
    p.add_argument("--sibling", action="store_true",
                   help="if --out already holds something, start a fresh numbered sibling OUT-2, OUT-3, ... instead")
    p.add_argument("--resume", metavar="RUN", help="continue RUN from its newest intact checkpoint (same result as uninterrupted)")
    p.add_argument("--from-scratch", action="store_true",
                   help="with --resume: confirm training RUN again from the start when it has no checkpoint")
    p.add_argument("--checkpoint-minutes", type=real_number(0), default=10.0, metavar="M",
                   help="also write a checkpoint every M minutes of training (default 10; 0: off)")
    p.add_argument("--nproc-per-node", type=whole_number(1), default=1, metavar="N",
                   help="launch N data-parallel processes with torchrun (the global batch is split)")
    p.add_argument("--stop-after-steps", type=whole_number(0), default=None, metavar="N",
                   help="stop after N optimiser steps with a checkpoint (continue with --resume)")
    p.add_argument("--quiet", action="store_true", help="no progress bars; one line per epoch (for logs)")
    p.add_argument("--list", action="store_true", help="list the presets and exit")
    p.add_argument("--show-config", action="store_true", help="print the resolved config as JSON and exit")
    return p


def _overrides(args) -> list[str]:
    o = list(args.overrides)
    if args.lsc is not None:
        if args.lsc == ["off"]:
            o.append("lsc.enabled=false")
        else:
            o.append("lsc.enabled=true")
            for kv in args.lsc:
                if "=" not in kv:
                    raise ConfigError(f"--lsc expects KEY=VALUE pairs (e.g. --lsc target=1), got {kv!r}")
                o.append(f"lsc.{kv}")
    if args.learning:
        o.append(f"train.learning=\"{args.learning}\"")
    if args.epochs is not None:
        o.append(f"train.epochs={args.epochs}")
    if args.seed is not None:
        o.append(f"train.seed={args.seed}")
    if args.device:
        o.append(f"train.device=\"{args.device}\"")
    return o


def _strip_launch_args(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--nproc-per-node":
            skip = True
            continue
        if a.startswith("--nproc-per-node="):
            continue
        out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.list:
        for name, desc in list_presets().items():
            print(f"  {name:<22} {desc}")
        return 0
    # the rest needs torch; imported here so that --help and --list answer at once
    from ..data import DatasetMissingError, dataset_info
    from ..train.config import load_config, resolve_sizes, validate_config
    from ..train.distributed import launch
    from ..train.runs import (RunFolderError, RunLock, clear_unstarted, describe_run, new_run_dir, prepare_out,
                              read_config, remove_debris, resume_status, same_config_status, stop_message)
    from ..train.trainer import Trainer, TrainingStopped
    if args.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.nproc_per_node > 1 and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        rest = _strip_launch_args(argv)
        if not args.resume:  # every process must write to the same folder
            out = prepare_out(args.out, sibling=args.sibling) if args.out else new_run_dir(args.preset or "quickstart")
            rest = _strip_out(rest) + ["--out", str(out)]
        return launch(rest, args.nproc_per_node)

    overrides = _overrides(args)
    if args.resume:
        if args.preset or overrides:
            raise ConfigError("--resume continues a run with its own config.json; do not give a preset or overrides")
        cfg = read_config(args.resume)
        validate_config(cfg)
        run_dir = Path(args.resume)
    else:
        cfg = load_config(args.preset or "quickstart", overrides)
        info = dataset_info(cfg["data"]["name"], **cfg["data"]["options"])
        resolve_sizes(cfg, info)
        if args.show_config:
            print(json.dumps(cfg, indent=1))
            return 0
        run_dir = None
    check_device(cfg["train"]["device"], "train.device (--device)")

    main_proc = int(os.environ.get("RANK", "0")) == 0
    torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if run_dir is None and torchrun and not args.out:
        raise ConfigError("under torchrun give --out DIR (every process must use the same run folder)")
    created = False
    again = None  # --out holds a run of this same config: the same command run again
    if run_dir is None:
        created = main_proc and not (args.out and Path(args.out).exists())
        if main_proc and args.out and not torchrun:
            again = None if args.sibling else same_config_status(args.out, cfg)
            run_dir = Path(args.out) if again else prepare_out(args.out, sibling=args.sibling)  # never onto another run
            created = created or run_dir != Path(args.out)
        else:  # under torchrun the launcher prepared --out
            run_dir = new_run_dir(cfg.get("preset", "run"), args.out) if main_proc else Path(args.out)
    lock = RunLock(run_dir, "spikerec train").acquire() if main_proc else None
    resume = bool(args.resume)
    try:
        if main_proc and (args.resume or again):
            status = resume_status(run_dir)
            if status == "finished":
                print(f"run '{run_dir}' is {describe_run(run_dir)}: nothing to {'resume' if args.resume else 'do'}, "
                      f"nothing changed. Re-test it with: spikerec evaluate {run_dir}")
                return 0
            if args.resume and status == "none" and not args.from_scratch:
                raise RunFolderError(f"run '{run_dir}' has no checkpoint to resume from (it stopped before its first "
                                     f"one); to train it again from the start in the same folder, add --from-scratch")
            if again and status == "checkpoint":
                print(f"'{run_dir}' holds this command's unfinished run (the same config): continuing it", flush=True)
            resume = resume or status == "checkpoint"
        if main_proc and not resume:  # what an interrupted start of this run left: nothing of value
            cleared = clear_unstarted(run_dir, same_config=again == "none")
            if cleared:
                print(f"'{run_dir}' held an interrupted start without a checkpoint: removed "
                      f"{', '.join(cleared)}; starting afresh", flush=True)
        if main_proc:
            removed = remove_debris(run_dir)
            if removed:
                print(f"removed {len(removed)} leftover(s) of an interrupted write: "
                      f"{', '.join(str(p) for p in removed[:3])}{' ...' if len(removed) > 3 else ''}")
        trainer = Trainer(cfg, run_dir, quiet=args.quiet, resume=resume,
                          stop_after_steps=args.stop_after_steps,
                          echo=(lambda s: print(s, flush=True)) if main_proc else (lambda s: None),
                          checkpoint_minutes=args.checkpoint_minutes or None)
        try:
            summary = trainer.fit()
        except TrainingStopped as e:
            what, hint = stop_message(e).split("\n", 1)
            if e.signum is None:
                if main_proc:
                    print(f"{what}\n{hint}", flush=True)
                return 0
            if main_proc:
                print(what, flush=True)
            raise Interrupted(hint) from None  # the hint once, as the one line on stderr; exit 130
        except (DatasetMissingError, DataError) as e:
            _release_and_discard(lock, run_dir, created)
            raise DataError(f"data set '{cfg['data']['name']}' is not available: {' '.join(str(e).split())} "
                            f"(see 'spikerec datasets' for what is installed and how to get the rest)") from None
        except KeyboardInterrupt:  # a second Ctrl-C: stop at once
            _release_and_discard(lock, run_dir, created)
            raise Interrupted(_resume_hint(run_dir)) from None
        except BaseException:
            _release_and_discard(lock, run_dir, created)
            raise
    finally:
        if lock is not None:
            lock.release()
    if "stopped_at_step" in summary or not main_proc:
        return 0
    _print_summary(summary)
    return 0


def _strip_out(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out=") and a != "--sibling":
            out.append(a)
    return out


def _resume_hint(run_dir: Path) -> str:
    ck = Path(run_dir) / "checkpoints"
    if ck.is_dir() and any(ck.glob("step-*")):
        return f"continue with: spikerec train --resume {run_dir}"
    return "no checkpoint had been written yet, so nothing can be resumed; run the same command again to start afresh"


def _discard_unstarted(run_dir: Path, created: bool) -> None:
    """Leave nothing behind when a run folder this command created ends before its first
    checkpoint (a folder that existed before, or a run with a checkpoint, is kept)."""
    run_dir = Path(run_dir)
    if not created or any((run_dir / "checkpoints").glob("step-*")):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        if run_dir.parent.name == "runs":
            run_dir.parent.rmdir()  # only if empty
    except OSError:
        pass


def _release_and_discard(lock, run_dir: Path, created: bool) -> None:
    if lock is not None:
        lock.release()
    _discard_unstarted(run_dir, created)


def _print_summary(s: dict) -> None:
    acc = s.get("test_accuracy")
    what = f"{100 * acc:.1f}%" if acc is not None else "n/a (regression)"
    print(f"\ntest accuracy: {what}  (loss {s['test_loss']:.4f}; {s['test_samples']} test samples of "
          f"'{s['data']}', {s['weights']} weights; {s['steps']} steps in {s['wall_time_s']:.0f} s)")
    d = s["run_dir"]
    print(f"run folder:    {d}")
    files = [f for f in ("model.safetensors", "config.json", "metrics.csv", "curves.png", "raster.png", "stream.png",
                         "lsc.png", "summary.json") if (Path(d) / f).exists()]
    print(f"               {', '.join(files)}")
    print(f"re-evaluate:   spikerec evaluate {d}")


if __name__ == "__main__":  # torchrun entry point (with the top-level error handler)
    sys.exit(run_command("train", [a for a in sys.argv[1:] if a != "--debug"], debug="--debug" in sys.argv))

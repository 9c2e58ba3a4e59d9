"""The training loop: optional LSC pre-training, then BPTT (or online) training.

Per step: forward the batch ``x[T, B, C]`` through the model, the loss of
:mod:`spikerec.train.metrics`, backward (or :class:`spikerec.hardware.online.OnlineLearner`
with ``learning = "online"``; with ``[online] stream = true`` the batches are the next stretches
of one endless stream, :mod:`spikerec.train.stream`), gradient clipping of the global norm,
Adam/AdamW with two parameter groups (recurrent parameters with ``lr * recurrent_lr_factor``), learning rate
``lr * f(step)`` with a linear warm-up over ``warmup`` of all steps and a cosine to
``lr * min_lr_factor`` (the LRU recipe: Orvieto et al. 2023, §2.2, App. D.2); the groups, the
optimiser and the schedule are :mod:`spikerec.optim`'s, shared with LSC and the deep LRU model.

Resuming is exact: the batch order depends only on ``(seed, epoch)``
(:func:`spikerec.data.make_loader`), and a checkpoint stores the weights, the optimiser
moments, the step, the position in the epoch, the running sums of the epoch, the best
weights and the RNG states; a resumed run replays the same arithmetic as an uninterrupted
one. A non-finite loss stops the run at once: no checkpoint is written for that step and
the error names the step and the last good checkpoint.

Nothing is lost on a stop: ``--stop-after-steps N``, Ctrl-C (SIGINT) and SIGTERM finish the
current step, write a checkpoint and end with :class:`TrainingStopped` (the command prints the
resume command); a checkpoint is also written every ``checkpoint_minutes`` of wall time (for
long epochs). A resume uses the newest *intact* checkpoint (an unreadable newer one is
skipped and named) and cuts the metrics files back to it, so no record is duplicated. The
summary's ``wall_time_s`` is the training time summed over all sessions of the run.
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm  # text bars everywhere (the automatic choice warns in a notebook without ipywidgets)

from .. import optim
from ..errors import ConfigError
from ..data import dataset_info, get_dataset, make_loader
from ..hardware.online import OnlineLearner
from .memory import alloc_in_use
from ..optim import lr_factor
from ..stability import lsc_pretrain
from ..stability.progress import LSCProgressBar, lsc_warning
from . import checkpoint as ckpt
from . import distributed as ddp
from .config import load_config, resolve_sizes
from .metrics import MetricsLogger, accuracy_counts, firing_rates, sequence_loss, step_loss_fn
from .plots import plot_curves, plot_raster, plot_stream
from .stream import StreamLoss, stream_batch, stream_targets
from .runs import build_from_config, save_model, write_config

__all__ = ["Trainer", "NonFiniteLoss", "StopRequested", "TrainingStopped", "build_from_config", "lr_factor", "param_groups",
           "select_device", "seed_everything", "forward_sequence", "evaluate"]


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf; the message names the step and the last good checkpoint."""

    def __init__(self, msg: str, step: int):
        super().__init__(msg)
        self.step = step


class StopRequested(Exception):
    """``--stop-after-steps`` reached (internal: :meth:`Trainer.fit` turns it into :class:`TrainingStopped`)."""


class TrainingStopped(Exception):
    """The run stopped early (``--stop-after-steps``, SIGINT, SIGTERM) after writing a checkpoint.

    ``reason`` says why, ``step`` is the step of ``checkpoint`` (``None`` when the stop came
    before the first step could be saved, e.g. during LSC pre-training)."""

    def __init__(self, reason: str, step: int, checkpoint: str | None, run_dir, signum: int | None = None):
        self.reason, self.step, self.checkpoint, self.run_dir, self.signum = reason, step, checkpoint, str(run_dir), signum
        where = f"checkpoint written at step {step}: {checkpoint}" if checkpoint else "no checkpoint yet"
        super().__init__(f"stopped by {reason} after {step} steps; {where}")


# --- building blocks ---------------------------------------------------------------------------
def select_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"train.device = '{name}' but CUDA is not available; use 'cpu' or 'auto'")
        if name == "cuda":
            name = f"cuda:{local_rank}"
    return torch.device(name)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True


def _recurrent_names(model) -> set[str]:
    """Names of the parameters in the slow learning-rate group (:func:`spikerec.optim.slow_parameter_ids`)."""
    ids = optim.slow_parameter_ids(model)
    return {n for n, p in model.named_parameters() if id(p) in ids}


def param_groups(model, tc: dict) -> list[dict]:
    """:func:`spikerec.optim.param_groups` with the ``[train]`` options: the recurrent (slow)
    group gets ``lr * recurrent_lr_factor`` and ``recurrent_weight_decay``."""
    return optim.param_groups(model, tc["lr"], weight_decay=tc["weight_decay"],
                              slow_lr_factor=tc["recurrent_lr_factor"], slow_weight_decay=tc["recurrent_weight_decay"])


def make_optimizer(model, tc: dict) -> torch.optim.Optimizer:
    """:func:`spikerec.optim.make_optimizer` (Adam or AdamW) over :func:`param_groups`."""
    return optim.make_optimizer(param_groups(model, tc), tc["optimizer"], tc["lr"], betas=tc["betas"], eps=tc["eps"])


def forward_sequence(model, x: torch.Tensor, record: bool = False):
    """``(y[T', B, K], hidden list)``; an ``LRUModel``'s pooled logits count as one step."""
    if hasattr(getattr(model, "module", model), "cells"):  # a stack, maybe inside DDP
        if record:
            y, _, hidden = model(x, record=True)
            return y, hidden
        y, _ = model(x)
        return y, []
    out = model(x)
    return (out.unsqueeze(0) if out.dim() == 2 else out), []


def _readout_mode(model) -> str:
    return getattr(model, "readout_mode", "last")


@torch.no_grad()
def evaluate(model, loader, tc: dict, device, info: ddp.DistInfo | None = None, amp=None) -> dict:
    """Mean loss, accuracy and firing rates of ``model`` over ``loader`` (sharded with DDP)."""
    info = info or ddp.DistInfo()
    was = model.training
    model.eval()
    tot = [0.0, 0.0, 0.0, 0.0]  # loss sum, samples, correct, counted
    rates: dict[str, float] = {}
    batches = 0
    cells = list(getattr(model, "cells", []))
    for x, y in loader:
        x, y = ddp.shard(x.to(device), y.to(device), info)
        if x.shape[1] == 0:
            continue
        with _autocast(device, amp):
            ys, hidden = forward_sequence(model, x, record=bool(cells))
        ys = ys.float()
        tot[0] += float(sequence_loss(ys, y, loss=tc["loss"], loss_on=tc["loss_on"],
                                      readout_mode=_readout_mode(model), reduction="sum"))
        tot[1] += x.shape[1]
        c, n = accuracy_counts(ys, y, kind=tc["accuracy"], readout_mode=_readout_mode(model), loss=tc["loss"])
        tot[2] += c
        tot[3] += n
        for k, v in firing_rates(hidden, cells).items():
            rates[k] = rates.get(k, 0.0) + v * x.shape[1]
        batches += 1
    keys = sorted(rates)
    red = ddp.all_reduce_sum(tot + [rates[k] for k in keys], info, device)
    model.train(was)
    out = {"loss": red[0] / max(red[1], 1), "samples": int(red[1])}
    out["accuracy"] = red[2] / red[3] if red[3] else None
    for i, k in enumerate(keys):
        out[k] = red[4 + i] / max(red[1], 1)
    return out


def _autocast(device, amp):
    if amp in ("bf16", "fp16") and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16 if amp == "bf16" else torch.float16)
    return contextlib.nullcontext()


# --- the trainer -------------------------------------------------------------------------------
class Trainer:
    """Train the model of a config into ``run_dir``: ``Trainer(cfg, run_dir).fit() -> summary``.

    Args:
        cfg: a config dict (:func:`spikerec.train.config.load_config`) or a preset name / TOML path;
            ``"auto"`` sizes are filled from the data set (``dataset_info``) at set-up. Data sets of
            your own: :func:`spikerec.data.register_dataset`, then ``data.name`` = that name.
        run_dir: the run folder (created when missing).
        quiet: no progress bars (one line per epoch).
        resume: continue from the newest checkpoint in ``run_dir/checkpoints``.
        stop_after_steps: stop after this many steps with a checkpoint (raises :class:`TrainingStopped`).
        echo: where progress lines go (``print``-like callable).
        checkpoint_minutes: also write a checkpoint when this many minutes passed since the last
            one (``None`` or 0: only ``train.checkpoint_every`` and epoch ends).
        handle_signals: turn SIGINT/SIGTERM into a checkpoint and :class:`TrainingStopped`
            (single process, main thread only).
    """

    def __init__(self, cfg: dict | str, run_dir, *, quiet: bool = False, resume: bool = False,
                 stop_after_steps: int | None = None, echo=None, checkpoint_minutes: float | None = 10.0,
                 handle_signals: bool = True):
        if not isinstance(cfg, dict):
            cfg = load_config(cfg)
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.quiet = quiet
        self.resume = resume
        self.stop_after = stop_after_steps
        self.checkpoint_minutes = checkpoint_minutes
        self.handle_signals = handle_signals
        self.signal_received: int | None = None
        self.echo = echo or (lambda s: print(s, flush=True))
        self.tc = cfg["train"]
        self.dc = cfg["data"]

    # ------------------------------------------------------------------ setup
    def _setup(self):
        tc, dc = self.tc, self.dc
        self.device = select_device(tc["device"], int(os.environ.get("LOCAL_RANK", "0")))
        self.dist = ddp.init_distributed(self.device)
        self.main = self.dist.main
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if tc["threads"]:
            torch.set_num_threads(int(tc["threads"]))
        seed_everything(int(tc["seed"]), bool(tc["deterministic"]))
        self.amp = tc["amp"] if self.device.type == "cuda" else "off"
        if tc["amp"] != "off" and self.device.type != "cuda" and self.main:
            self.echo(f"note: train.amp = '{tc['amp']}' is for CUDA only; training in float32 on {self.device}")
        opts = dict(dc["options"])
        self.info = dataset_info(dc["name"], **opts)
        resolve_sizes(self.cfg, self.info)  # "auto" sizes; a fixed size that disagrees is a ConfigError
        self.train_set = get_dataset(dc["name"], "train", **opts)
        self.valid_set = get_dataset(dc["name"], dc["valid_split"], **opts) if dc["valid_split"] else None
        self.test_set = get_dataset(dc["name"], "test", **opts)
        seed = int(tc["seed"])
        kw = {"num_workers": int(dc["num_workers"])} if dc["num_workers"] else {}
        stream = tc["learning"] == "online" and bool(self.cfg["online"].get("stream", False))
        if stream and len(self.train_set) < dc["batch_size"]:
            raise ConfigError(f"[online] stream = true: the training set has {len(self.train_set)} sequences, fewer "
                              f"than one batch of data.batch_size = {dc['batch_size']} lanes")
        # a stream keeps its batch (lanes) throughout: the last, smaller batch of an epoch is dropped
        self.train_loader = make_loader(self.train_set, dc["batch_size"], True, seed, drop_last=stream, **kw)
        ev = dc["eval_batch_size"]
        self.valid_loader = make_loader(self.valid_set, ev, False, seed, **kw) if self.valid_set is not None else None
        self.test_loader = make_loader(self.test_set, ev, False, seed, **kw)
        self.model = build_from_config(self.cfg["model"]).to(self.device)
        self.cells = list(getattr(self.model, "cells", []))
        self.opt = make_optimizer(self.model, tc)
        self.steps_per_epoch = len(self.train_loader)
        self.total_steps = max(1, self.steps_per_epoch * int(tc["epochs"]))
        self.scaler = torch.amp.GradScaler("cuda") if self.amp == "fp16" else None
        self.metrics = MetricsLogger(self.run_dir, enabled=self.main)
        self.fwd = self.model
        if self.dist.enabled and tc["learning"] == "bptt":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            unused = ddp.has_unused_parameters(self.model, self.cfg["model"]["input_size"], self.device)
            self.fwd = DDP(self.model, device_ids=ids, find_unused_parameters=unused)
        elif self.dist.enabled:
            ddp.broadcast_parameters(self.model, self.dist)
        self.learner = None
        self.stream = stream
        self.stream_loss = self.mem_base = None
        if tc["learning"] == "online":
            oc = self.cfg["online"]
            if self.stream:  # one endless stream (train/stream.py): the learner carries its states across batches
                kind = ("mse" if tc["loss"] == "mse" else
                        "per_step" if getattr(self.train_set, "per_step_target", False) else "label")
                self.stream_loss = StreamLoss(kind)
            self.learner = OnlineLearner(self.model, rule=oc["rule"], mode=oc["mode"], chunk=oc["chunk"] or None,
                                         loss=self.stream_loss,
                                         readout_filter={"auto": None, "on": True, "off": False}[oc["readout_filter"]])
        # state
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.running = [0.0, 0.0, 0.0, 0.0]
        self.run_rates: dict[str, float] = {}
        self.best = None
        self.best_loss = math.inf
        self.bad_epochs = 0
        self.lsc_done = False
        self.last_ckpt: str | None = None
        self.ckpt_step: int | None = None
        self.rng_pending = None
        self.elapsed_before = 0.0  # training time of earlier sessions of this run (resume)
        self.t_session = time.perf_counter()
        self.t_last_ckpt = time.perf_counter()

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint(self) -> None:
        if not self.main:
            return
        tensors = {f"model/{k}": v for k, v in self.model.state_dict().items()}
        if self.best is not None:
            tensors.update({f"best/{k}": v for k, v in self.best.items()})
        ot, ometa = ckpt.pack_optimizer(self.opt)
        tensors.update(ot)
        rt, rmeta = ckpt.get_rng_state()
        tensors.update(rt)
        stream_meta = None
        if self.stream:  # the stream's layer states and traces (the accumulators are empty after update)
            st, stream_meta = self.learner.state_tensors()
            tensors.update({f"stream/{k}": v for k, v in st.items()})
        meta = {
            "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "running": self.running,
            "running_rates": self.run_rates, "best_loss": self.best_loss if math.isfinite(self.best_loss) else None,
            "has_best": self.best is not None, "bad_epochs": self.bad_epochs, "lsc_done": self.lsc_done,
            "optimizer": ometa, "rng": rmeta, "metrics_offsets": self.metrics.offsets(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "elapsed_s": self._elapsed(), "stream": stream_meta,
        }
        path = ckpt.save_checkpoint(self.run_dir / "checkpoints", self.step, tensors, meta,
                                    keep=int(self.tc["keep_checkpoints"]))
        self.last_ckpt = str(path)
        self.ckpt_step = self.step
        self.t_last_ckpt = time.perf_counter()

    def _elapsed(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self.t_session)

    def _check_checkpoint(self, tensors: dict, meta: dict) -> None:
        """Raise if a checkpoint does not fit this run (missing fields, other weights)."""
        missing = [k for k in ("step", "epoch", "batch_in_epoch", "running", "running_rates", "best_loss", "has_best",
                               "bad_epochs", "lsc_done", "optimizer", "rng", "metrics_offsets") if k not in meta]
        if missing:
            raise ckpt.CheckpointError(f"state.json lacks {', '.join(missing)}")
        want = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}
        got = {k[6:]: tuple(v.shape) for k, v in tensors.items() if k.startswith("model/")}
        if want != got:
            raise ckpt.CheckpointError("its model weights do not match config.json's model")

    def _restore(self) -> bool:
        root = self.run_dir / "checkpoints"
        if not ckpt.checkpoints_newest_first(root):
            return False
        tensors, meta, skipped = ckpt.load_newest_intact(root, self._check_checkpoint)
        for d, why in skipped:
            self.echo(f"note: checkpoint {d} cannot be used ({why}); falling back to an older one")
        if self.main:
            ckpt.settle_checkpoints(root, Path(meta["path"]), int(self.tc["keep_checkpoints"]))
        self.model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model/")})
        if meta["has_best"]:
            self.best = {k[5:]: v.to(self.device) for k, v in tensors.items() if k.startswith("best/")}
        ckpt.unpack_optimizer(self.opt, {k: v.to(self.device) for k, v in tensors.items() if k.startswith("optim/")},
                              meta["optimizer"])
        self.step, self.epoch, self.batch_in_epoch = int(meta["step"]), int(meta["epoch"]), int(meta["batch_in_epoch"])
        self.running = list(meta["running"])
        self.run_rates = dict(meta["running_rates"])
        self.best_loss = math.inf if meta["best_loss"] is None else float(meta["best_loss"])
        self.bad_epochs = int(meta["bad_epochs"])
        self.lsc_done = bool(meta["lsc_done"])
        if self.scaler is not None and meta.get("scaler"):
            self.scaler.load_state_dict(meta["scaler"])
        self.metrics.truncate(meta["metrics_offsets"])
        self.rng_pending = ({k: v for k, v in tensors.items() if k.startswith("rng/")}, meta["rng"])
        self.last_ckpt = meta["path"]
        self.ckpt_step = self.step
        self.elapsed_before = float(meta.get("elapsed_s", 0.0))
        if self.stream and meta.get("stream") is not None:
            self.learner.load_state_tensors({k[7:]: v.to(self.device) for k, v in tensors.items()
                                             if k.startswith("stream/")}, meta["stream"])
            self.mem_base = alloc_in_use()  # this process's allocator: growth from the resumed stream on
        return True

    # ------------------------------------------------------------------ LSC phase
    def _lsc(self) -> None:
        lc = {k: v for k, v in self.cfg["lsc"].items() if k not in ("enabled", "batch_size", "batches")}
        if not self.cells:
            raise ValueError("LSC pre-training needs a stack of cells ([model] layers); this model has none")
        report = None
        if self.main:
            bs = int(self.cfg["lsc"]["batch_size"]) or int(self.dc["batch_size"])
            loader = make_loader(self.train_set, bs, True, int(self.tc["seed"]) + 7919)
            n = int(self.cfg["lsc"]["batches"])
            data = [b for _, b in zip(range(n), loader)] if n else loader
            t0 = time.perf_counter()
            if not self.quiet:
                self.echo(f"LSC pre-training (target radius {lc.get('target', 1.0)}) ...")
            bar = LSCProgressBar(lc.get("max_steps"), disable=self.quiet)

            def progress(step, rec):
                bar(step, rec)
                if self.signal_received is not None:
                    raise StopRequested()

            try:
                report = lsc_pretrain(self.model, data, lc, progress=progress)
            finally:
                bar.close()
            hist = report.history
            for i, s in enumerate(hist.get("step", [])):
                rec = {"kind": "lsc", "step": s, "loss": hist["loss"][i], "deviation": hist["deviation"][i]}
                rec.update({f"radius_{k.replace('/', '_')}": v[i] for k, v in hist["radius"].items()})
                self.metrics.log(rec)
            report.save(self.run_dir / "lsc.json")
            try:
                report.plot(self.run_dir / "lsc.png")
            except Exception as e:  # noqa: BLE001 - a plot must not end the run
                self.echo(f"note: LSC plot failed: {e}")
            radii = ", ".join(f"{k} {v:.3f}" for k, v in (report.best_radii or {}).items())
            self.echo(f"LSC: {report.stop_reason or 'done'} after {report.steps} steps "
                      f"({time.perf_counter() - t0:.1f} s); radii: {radii}")
            warn = lsc_warning(report)
            if warn:
                self.echo(warn)
            self.lsc_report = report
        ddp.broadcast_parameters(self.model, self.dist)
        self.lsc_done = True

    # ------------------------------------------------------------------ one step
    def _train_step(self, x, y) -> tuple[float, int, int, int, dict]:
        tc = self.tc
        B_global = x.shape[1]
        if x.device.type == "cpu" and x.is_floating_point() and bool(torch.isnan(x).any()):
            # checked here, on the host copy of the batch (no device sync); the layers skip it on the hot path
            raise ValueError(f"training data: batch {self.batch_in_epoch + 1} of epoch {self.epoch + 1} "
                             f"(step {self.step + 1}) contains NaN values; check the dataset")
        x, y = ddp.shard(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True), self.dist)
        scale = self.dist.world_size / B_global  # per-process sum -> global mean after DDP's average
        rates: dict[str, float] = {}
        correct = counted = 0
        count = float(x.shape[1])  # what the loss sum is averaged over: samples (stream: steps with a loss)
        mode = _readout_mode(self.model)
        if self.stream:
            targets = stream_targets(y, x.shape[0], tc["loss"], tc["loss_on"])
            loss_val, n, correct, counted = stream_batch(self.learner, x, targets, self.stream_loss)
            count = float(n)
            ddp.all_reduce_grads(self.model.parameters(), self.dist)
            if self.mem_base is None:  # after the first batch's allocations: the stream's growth from here on
                self.mem_base = alloc_in_use()
        elif self.learner is not None:
            fn = step_loss_fn(loss=tc["loss"], loss_on=tc["loss_on"], readout_mode=mode, steps=x.shape[0],
                              scale=x.shape[1] * scale)
            loss_val = float(self.learner.backward(x, y, fn)) / scale  # back to a per-process sum
            ddp.all_reduce_grads(self.model.parameters(), self.dist)
        else:
            with _autocast(self.device, self.amp):
                ys, hidden = forward_sequence(self.fwd, x, record=bool(self.cells))
            ys = ys.float()
            loss_sum = sequence_loss(ys, y, loss=tc["loss"], loss_on=tc["loss_on"], readout_mode=mode, reduction="sum")
            loss = loss_sum * scale
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
            loss_val = float(loss_sum.detach())
            correct, counted = accuracy_counts(ys.detach(), y, kind=tc["accuracy"], readout_mode=mode, loss=tc["loss"])
            rates = {k: v * x.shape[1] for k, v in firing_rates(hidden, self.cells).items()}
        keys = sorted(rates)
        red = ddp.all_reduce_sum([loss_val, count, float(correct), float(counted)] + [rates[k] for k in keys],
                                 self.dist, self.device)
        if not math.isfinite(red[0]):
            self.opt.zero_grad(set_to_none=True)
            where = f"the last good checkpoint is {self.last_ckpt}" if self.last_ckpt else "no checkpoint was written yet"
            raise NonFiniteLoss(f"training loss became {red[0]} at step {self.step + 1} (epoch {self.epoch + 1}, "
                                f"batch {self.batch_in_epoch + 1}); stopped; {where}. Try a lower train.lr, "
                                f"train.grad_clip > 0 or LSC pre-training.", self.step + 1)
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        if tc["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_([p for g in self.opt.param_groups for p in g["params"]], tc["grad_clip"])
        f = lr_factor(self.step, self.total_steps, tc["warmup"], tc["schedule"], tc["min_lr_factor"])
        for g in self.opt.param_groups:
            g["lr"] = g["base_lr"] * f
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return red[0], int(red[1]), int(red[2]), int(red[3]), {k: red[4 + i] for i, k in enumerate(keys)}

    # ------------------------------------------------------------------ main loop
    def fit(self) -> dict:
        """Run the whole job; returns the summary dict (also written to ``summary.json``).

        Raises :class:`TrainingStopped` after ``--stop-after-steps`` or SIGINT/SIGTERM (a checkpoint
        was written) and :class:`NonFiniteLoss` when the loss diverges."""
        threads = torch.get_num_threads()
        old = self._install_signals()
        try:
            return self._fit()
        finally:
            for sig, h in (old or {}).items():
                signal.signal(sig, h)
            torch.set_num_threads(threads)  # train.threads applies to this run only

    def _install_signals(self):
        """SIGINT/SIGTERM set a flag checked after every step (a second one stops at once)."""
        if not self.handle_signals or threading.current_thread() is not threading.main_thread() \
                or int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return None

        def handler(signum, frame):
            if self.signal_received is not None:
                raise KeyboardInterrupt
            self.signal_received = signum

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _maybe_stop(self) -> None:
        if self.signal_received is not None or (self.stop_after is not None and self.step >= self.stop_after):
            raise StopRequested()

    def _checkpoint_due(self) -> bool:
        tc = self.tc
        if tc["checkpoint_every"] and self.step % int(tc["checkpoint_every"]) == 0:
            return True
        return bool(self.checkpoint_minutes) and time.perf_counter() - self.t_last_ckpt >= 60.0 * self.checkpoint_minutes

    def _stop_reason(self) -> str:
        if self.signal_received is not None:
            return signal.Signals(self.signal_received).name
        return f"--stop-after-steps {self.stop_after}"

    def _fit(self) -> dict:
        self._setup()
        self.t_session = self.t_last_ckpt = time.perf_counter()
        resumed = self.resume and self._restore()
        if self.main:
            write_config(self.run_dir, self.cfg)
            if resumed:
                self.echo(f"resuming {self.run_dir} at step {self.step} (epoch {self.epoch + 1}, "
                          f"batch {self.batch_in_epoch}) from {self.last_ckpt}")
            elif self.resume:  # started again from scratch in the same folder: drop the old records
                self.metrics.truncate({})

        tc = self.tc
        epochs = int(tc["epochs"])
        bar = None
        try:
            if self.cfg["lsc"]["enabled"] and not self.lsc_done:
                self._lsc()
                self._checkpoint()
            self._maybe_stop()
            while self.epoch < epochs:
                self.train_loader.set_epoch(self.epoch)
                skip = self.batch_in_epoch
                # Creating a DataLoader iterator draws a base seed from the global RNG. A checkpoint from
                # an epoch's end was taken before that draw, one from inside an epoch after it: restore
                # the RNG where the original run stood when it wrote the checkpoint.
                if self.rng_pending is not None and skip == 0:
                    ckpt.set_rng_state(*self.rng_pending)
                    self.rng_pending = None
                it = iter(self.train_loader)
                for _ in range(skip):
                    next(it)
                if self.rng_pending is not None:
                    ckpt.set_rng_state(*self.rng_pending)
                    self.rng_pending = None
                if skip == 0:
                    self.running, self.run_rates = [0.0, 0.0, 0.0, 0.0], {}
                bar = tqdm(total=self.steps_per_epoch, initial=skip, desc=f"epoch {self.epoch + 1}/{epochs}",
                           disable=self.quiet or not self.main, leave=False, dynamic_ncols=True, file=sys.stderr)
                self.fwd.train()
                for x, y in it:
                    lsum, n, c, k, rates = self._train_step(x, y)
                    self.step += 1
                    self.batch_in_epoch += 1
                    r = self.running
                    r[0] += lsum; r[1] += n; r[2] += c; r[3] += k
                    for kk, v in rates.items():
                        self.run_rates[kk] = self.run_rates.get(kk, 0.0) + v
                    post = {"loss": f"{r[0] / max(r[1], 1):.4f}"}
                    if r[3]:
                        post["acc"] = f"{r[2] / r[3]:.3f}"
                    bar.set_postfix(post, refresh=False)
                    bar.update(1)
                    if tc["log_every"] and self.step % int(tc["log_every"]) == 0:
                        rec = {"kind": "step", "step": self.step, "epoch": self.epoch + 1,
                               "loss": lsum / max(n, 1), "lr": self.opt.param_groups[-1]["lr"]}
                        if self.stream:
                            rec.update(self._stream_record(x.shape[0], c, k))
                        self.metrics.log(rec)
                    if self.batch_in_epoch < self.steps_per_epoch and self._checkpoint_due():
                        self._checkpoint()
                    self._maybe_stop()
                bar.close()
                if self._end_epoch(self._elapsed()):
                    break
                self._maybe_stop()
        except StopRequested:
            if bar is not None:
                bar.close()
            lsc_pending = self.cfg["lsc"]["enabled"] and not self.lsc_done
            if not lsc_pending and self.ckpt_step != self.step:
                self._checkpoint()
            saved = self.last_ckpt if (self.ckpt_step == self.step and not lsc_pending) else None
            self.metrics.close()
            ddp.cleanup(self.dist)
            raise TrainingStopped(self._stop_reason(), self.step, saved, self.run_dir, self.signal_received) from None
        except NonFiniteLoss:
            self.metrics.close()
            ddp.cleanup(self.dist)
            raise
        summary = self._finish(self._elapsed())
        ddp.barrier(self.dist)  # every process leaves the group together (none tears down while rank 0 still works)
        ddp.cleanup(self.dist)
        return summary

    def _stream_record(self, T: int, correct: int, counted: int) -> dict:
        """The stream's position (steps so far) and the growth of the allocator's bytes in use
        since the end of its first batch (glibc ``mallinfo2``; absent where it is missing)."""
        rec = {"stream_step": self.step * T}
        if counted:
            rec["acc"] = correct / counted
        now = alloc_in_use()
        if now is not None and self.mem_base is not None:
            rec["mem_mib"] = (now - self.mem_base) / 2 ** 20
        return rec

    def _end_epoch(self, elapsed: float) -> bool:
        """Validation, epoch record, best weights, early stopping, checkpoint. True = stop."""
        tc = self.tc
        r = self.running
        rec = {"kind": "epoch", "epoch": self.epoch + 1, "step": self.step, "train_loss": r[0] / max(r[1], 1),
               "train_acc": (r[2] / r[3]) if r[3] else None, "lr": self.opt.param_groups[-1]["lr"]}
        rec.update({k: v / max(r[1], 1) for k, v in sorted(self.run_rates.items())})
        stop = False
        if self.valid_loader is not None:
            ev = evaluate(self.model, self.valid_loader, tc, self.device, self.dist, self.amp)
            rec["valid_loss"], rec["valid_acc"] = ev["loss"], ev["accuracy"]
            if ev["loss"] < self.best_loss:
                self.best_loss, self.bad_epochs = ev["loss"], 0
                if tc["keep_best"]:
                    self.best = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            else:
                self.bad_epochs += 1
                if tc["early_stop_patience"] and self.bad_epochs >= int(tc["early_stop_patience"]):
                    stop = True
        rec["time_s"] = round(elapsed, 3)
        self.metrics.log(rec)
        if self.main:
            acc = f", train acc {rec['train_acc']:.3f}" if rec["train_acc"] is not None else ""
            val = ""
            if "valid_loss" in rec:
                val = f" | valid loss {rec['valid_loss']:.4f}" + (f", acc {rec['valid_acc']:.3f}" if rec["valid_acc"] is not None else "")
            mem = ""
            if self.stream:
                grown = [r["mem_mib"] for r in self.metrics.records if r.get("kind") == "step" and "mem_mib" in r]
                if grown:
                    mem = f" | stream memory growth since its first batch: max {max(grown):.2f} MiB"
            self.echo(f"epoch {self.epoch + 1}/{tc['epochs']}: train loss {rec['train_loss']:.4f}{acc}{val}{mem} "
                      f"({elapsed:.0f} s)")
            if stop:
                self.echo(f"early stop: validation loss did not improve for {tc['early_stop_patience']} epochs")
        self.epoch += 1
        self.batch_in_epoch = 0
        self.running, self.run_rates = [0.0, 0.0, 0.0, 0.0], {}
        self._checkpoint()
        return stop

    def _finish(self, elapsed: float) -> dict:
        if self.best is not None and self.tc["keep_best"]:
            self.model.load_state_dict(self.best)
        test = evaluate(self.model, self.test_loader, self.tc, self.device, self.dist, self.amp)
        summary = {
            "run_dir": str(self.run_dir), "preset": self.cfg.get("preset", ""), "data": self.dc["name"],
            "steps": self.step, "epochs": self.epoch, "wall_time_s": round(elapsed, 2),
            "test_loss": test["loss"], "test_accuracy": test["accuracy"], "test_samples": test["samples"],
            "best_valid_loss": self.best_loss if math.isfinite(self.best_loss) else None,
            "weights": "best validation loss" if (self.best is not None and self.tc["keep_best"]) else "last",
            "world_size": self.dist.world_size, "device": str(self.device), "learning": self.tc["learning"],
            "lsc": bool(self.cfg["lsc"]["enabled"]),
        }
        summary.update({f"test_{k}": v for k, v in test.items() if k.startswith("rate_")})
        if not self.main:
            return summary
        self.metrics.log({"kind": "test", "step": self.step, **{k: v for k, v in test.items()}})
        save_model(self.run_dir, self.model, self.cfg, extra={"test_accuracy": test["accuracy"],
                                                              "test_loss": test["loss"], "steps": self.step})
        try:
            plot_curves(self.metrics.records, self.run_dir / "curves.png")
            if self.stream:
                plot_stream(self.metrics.records, self.run_dir / "stream.png",
                            log_every=int(self.cfg["train"]["log_every"] or 0) or None)
            if self.cells:
                x0, y0 = self.test_set[0]
                plot_raster(self.model, x0.to(self.device), self.run_dir / "raster.png", label=y0 if isinstance(y0, int) else None)
        except Exception as e:  # noqa: BLE001 - plots must not lose a finished run
            self.echo(f"note: plotting failed: {e}")
        ckpt.atomic_write_json(self.run_dir / "summary.json", summary)
        self.metrics.close()
        return summary

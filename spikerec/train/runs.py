"""Run folders and loading a trained model.

A run folder holds::

    config.json          the resolved config (its "model" section is the build_model dict)
    model.safetensors    final weights            model.json   metadata (sizes, data, metrics)
    metrics.jsonl        every record (step, epoch, lsc, test)   metrics.csv  one row per epoch
    checkpoints/         step-XXXXXXXX/{state.safetensors, state.json}, latest.json
    curves.png, raster.png, stream.png (a stream run), lsc.json, lsc.png (when LSC ran), summary.json
    tensorboard/         TensorBoard event files (when the tensorboard package is installed)
    .lock                while in use: advisory lock (``fcntl.flock``) and the PID of the process using it

A run folder is never destroyed or shared: :func:`prepare_out` refuses a folder that already
holds something (or picks a fresh numbered sibling), :class:`RunLock` gives one process at a
time the folder (train, resume, export), and :func:`remove_debris` deletes what an interrupted
atomic write left behind (``checkpoints/.tmp-step-*``, ``*.part``, ``.tmp*``).

A start killed before it wrote ``config.json`` leaves at most the lock file, ``tensorboard/``
and atomic-write temporaries: such a folder holds no run (:func:`killed_start_leftovers`), and
:func:`clear_unstarted` empties it for a fresh start; so does a folder whose ``config.json``
equals the new run's and that holds no checkpoint, model or summary (:func:`same_config_status`).
A finished run or one with a checkpoint is never emptied.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..errors import CheckpointError, ConfigError, SpikerecError
from ..lru_model import LRUModel
from ..models import RecurrentStack, build_model
from .checkpoint import (_json_default, atomic_write_json, checkpoints_newest_first, latest_checkpoint, load_checkpoint,
                         save_tensors_atomic)

__all__ = ["build_from_config", "new_run_dir", "write_config", "read_config", "save_model", "load_model", "read_weights",
           "load_weights", "RunError", "RunFolderError", "RunInUseError", "RunLock", "prepare_out", "remove_debris",
           "describe_run", "weights_source", "resume_status", "stop_message", "LOCK_NAME",
           "killed_start_leftovers", "clear_unstarted", "same_config_status", "lock_holder"]

LOCK_NAME = ".lock"


class RunError(CheckpointError):
    """The folder given as a run is not one (``config.json`` missing or unresolved): a bad
    command-line argument, exit code 2. Files of a real run that cannot be used raise
    :class:`~spikerec.errors.CheckpointError` (exit code 5)."""

    exit_code = 2


class RunFolderError(SpikerecError):
    """A run folder that cannot be used as asked (exists already, in use, nothing to resume):
    a command-line choice to change, exit code 2."""

    exit_code = 2


class RunInUseError(RunFolderError):
    """Another process holds the run folder's lock."""


def build_from_config(model_cfg: dict):
    """``build_model`` for stacks; ``kind = "lru_deep"`` builds :class:`spikerec.lru_model.LRUModel`."""
    m = dict(model_cfg)
    if m.get("kind", "stack") == "lru_deep":
        m.pop("kind")
        return LRUModel(int(m.pop("input_size")), int(m.pop("output_size")), **m)
    m.pop("kind", None)
    return build_model(m)


def new_run_dir(preset: str, out: str | os.PathLike | None = None, root: str | os.PathLike = "runs") -> Path:
    """``out`` if given, else ``runs/<preset>-<YYYYmmdd-HHMMSS>`` (suffixed if it exists)."""
    if out is not None:
        p = Path(out)
    else:
        base = Path(root) / f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"
        p, i = base, 1
        while p.exists():
            p, i = Path(f"{base}-{i}"), i + 1
    p.mkdir(parents=True, exist_ok=True)
    for q in p.iterdir():  # what a run killed before its first file was complete left behind
        if _is_write_debris(q):
            q.unlink(missing_ok=True)
    return p


def write_config(run_dir, cfg: dict) -> None:
    atomic_write_json(Path(run_dir) / "config.json", cfg)


def read_config(run_dir) -> dict:
    p = Path(run_dir) / "config.json"
    if not p.is_file() and killed_start_leftovers(run_dir):
        raise RunError(f"'{run_dir}' holds only what a start killed before writing its config.json left "
                       f"({', '.join(killed_start_leftovers(run_dir))}): there is no run to use; run the "
                       f"'spikerec train ... --out {run_dir}' command again to start it afresh")
    if not p.is_file():
        raise RunError(f"'{run_dir}' is not a spikerec run folder: {p.name} is missing "
                       f"(runs are made by 'spikerec train', default folder runs/<preset>-<time>)")
    try:
        with open(p) as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"'{p}' is not valid JSON ({e}); restore it from a copy or re-run 'spikerec train'") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"'{p}' must hold a JSON object (the resolved config), got {type(cfg).__name__}")
    return cfg


def _state_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items()}


def save_model(run_dir, model: RecurrentStack, cfg: dict, extra: dict | None = None) -> Path:
    """``model.safetensors`` (weights) and ``model.json`` (what built them), both atomic."""
    run_dir = Path(run_dir)
    path = run_dir / "model.safetensors"
    save_tensors_atomic(path, _state_tensors(model), metadata={"format": "spikerec-model", "version": "1"})
    meta = {
        "format": "spikerec-model", "version": 1, "model": cfg["model"], "data": cfg.get("data", {}),
        "preset": cfg.get("preset", ""), "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "layers": [type(c).__name__ for c in getattr(model, "layers", [model])], "torch": torch.__version__,
        **(extra or {}),
    }
    atomic_write_json(run_dir / "model.json", meta)
    return path


def load_model(run_dir, *, map_location="cpu", checkpoint: bool = False):
    """Rebuild the model of a run from ``config.json`` and load ``model.safetensors``: a
    :class:`~spikerec.models.RecurrentStack` (or an ``LRUModel`` for ``kind = "lru_deep"``).

    With ``checkpoint=True`` the weights of the newest checkpoint are loaded instead. A run
    without ``model.safetensors`` (unfinished, or the file was removed) raises
    :class:`~spikerec.errors.CheckpointError` saying so and pointing at ``checkpoint=True`` (``--checkpoint``):
    the weights are never switched silently. :func:`weights_source` says which ones are used.
    """
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    if cfg.get("model", {}).get("input_size", "auto") == "auto":
        raise RunError(f"'{run_dir}/config.json' has no resolved model input size")
    model = build_from_config(cfg["model"])
    weights = run_dir / "model.safetensors"
    if not checkpoint and not weights.is_file():
        has = latest_checkpoint(run_dir / "checkpoints") is not None
        raise CheckpointError(f"'{weights}' is missing (the run did not finish{' or the file was removed' if has else ''}); "
                       + ("to use its newest checkpoint instead, say so with --checkpoint" if has
                          else "it has no checkpoint either"))
    if checkpoint:
        if not (run_dir / "checkpoints").is_dir():
            raise RunError(f"'{run_dir}' has neither model.safetensors nor checkpoints/ (the run did not finish a step)")
        tensors, _ = load_checkpoint(run_dir / "checkpoints")
        state = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    else:
        try:
            state = read_weights(weights)
        except CheckpointError as e:
            if latest_checkpoint(run_dir / "checkpoints") is None:
                raise
            raise CheckpointError(f"{e}; or use the run's newest checkpoint: 'spikerec evaluate {run_dir} "
                                  f"--checkpoint'") from None
    load_weights(model, state, weights, run_dir / "config.json")
    return model.to(map_location)


def read_weights(path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a truncated, pickled or otherwise unreadable file raises
    :class:`~spikerec.errors.CheckpointError` naming it (nothing is ever unpickled)."""
    path = Path(path)
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"'{path}' is missing") from None
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for a bad header
        raise CheckpointError(f"'{path}' is not a readable safetensors file ({type(e).__name__}: {e}); it is "
                              f"truncated or in another format (spikerec never loads pickles). Restore the file "
                              f"or re-run the training") from None


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], weights, config) -> None:
    """``model.load_state_dict(state)`` with one clear error naming the file and the first tensor
    whose name or shape does not match the model that ``config`` describes."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise CheckpointError(f"'{weights}' does not match the model of '{config}': missing tensors {missing[:4]}, "
                              f"unexpected tensors {unexpected[:4]} (was the config edited after training?)")
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise CheckpointError(f"'{weights}': tensor '{k}' has shape {list(state[k].shape)} but the model of "
                                  f"'{config}' needs {list(v.shape)} (a layer size in the config differs from the "
                                  f"trained one; restore config.json or retrain)")
    model.load_state_dict(state)


# --- protecting run folders ------------------------------------------------------------------
def describe_run(run_dir) -> str:
    """A few words on what a run folder holds (for messages)."""
    d = Path(run_dir)
    if (d / "summary.json").is_file():
        try:
            s = json.loads((d / "summary.json").read_text())
            acc = s.get("test_accuracy")
            what = f", test accuracy {100 * acc:.1f}%" if isinstance(acc, (int, float)) else ""
            return f"a finished run ({s.get('steps', '?')} steps{what})"
        except (OSError, ValueError):
            return "a finished run"
    ck = latest_checkpoint(d / "checkpoints")
    if ck is not None:
        return f"an unfinished run with a checkpoint at step {int(ck.name.split('-')[-1])}"
    if (d / "model.safetensors").is_file():
        return "a model (model.safetensors)"
    if (d / "config.json").is_file():
        return "a run that stopped before its first checkpoint"
    names = sorted(p.name for p in d.iterdir())
    return f"{len(names)} {'entry' if len(names) == 1 else 'entries'} ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"


def _is_write_debris(p: Path) -> bool:
    """A temporary file an interrupted atomic write left behind (``.tmp*``, ``*.part``)."""
    return p.is_file() and not p.is_symlink() and (p.name.startswith(".tmp") or p.name.endswith(".part"))


def killed_start_leftovers(run_dir) -> list[str] | None:
    """What a start killed before it wrote ``config.json`` left in ``run_dir`` (besides the lock
    file): write temporaries and a ``tensorboard/`` folder of event files, as names (folders with a
    trailing ``/``); ``[]`` for an empty or missing folder; ``None`` when the folder holds anything
    else (a run, or files that are not spikerec's), which must never be removed."""
    d = Path(run_dir)
    if not d.is_dir():
        return []
    left = []
    for p in sorted(d.iterdir()):
        if p.name == LOCK_NAME:
            continue
        if _is_write_debris(p):
            left.append(p.name)
        elif p.name == "tensorboard" and p.is_dir() and not p.is_symlink() and all(
                q.is_file() and q.name.startswith("events.out.tfevents.") for q in p.iterdir()):
            left.append("tensorboard/")
        else:
            return None
    return left


def _nonempty(d: Path) -> bool:
    """Holds anything but what a start killed before its config left (lock, write debris, TensorBoard events)."""
    return d.is_dir() and killed_start_leftovers(d) is None


def lock_holder(run_dir) -> str | None:
    """``"PID command"`` of the process holding ``run_dir``'s :class:`RunLock`, else ``None`` (the lock
    file is only read: nothing is created or changed)."""
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        return os.read(fd, 256).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)


def _refusal(p: Path, flag: str | None) -> RunFolderError:
    """Why ``p`` cannot be a new run's folder, and what to do instead (by what it holds)."""
    holder = lock_holder(p)
    if holder is not None:
        pid, _, cmd = holder.partition(" ")
        return RunInUseError(f"run folder '{p}' is in use by PID {pid}{f' ({cmd})' if cmd else ''}; wait for it to "
                             f"finish or stop it, or choose another --out")
    has_config = (p / "config.json").is_file()
    if (p / "summary.json").is_file():
        todo = f"Re-test it with 'spikerec evaluate {p}'. "
    elif has_config and latest_checkpoint(p / "checkpoints") is not None:
        todo = f"Its config differs from this command's; continue it with its own by 'spikerec train --resume {p}'. "
    elif has_config and not (p / "model.safetensors").is_file():
        todo = (f"Its config differs from this command's; train it again with its own by "
                f"'spikerec train --resume {p} --from-scratch'. ")
    else:
        todo = ""
    return RunFolderError(f"run folder '{p}' already exists and holds {describe_run(p)}; it is never overwritten. "
                          f"{todo}Choose another --out" + (f", or add {flag} to start a fresh numbered sibling "
                                                           f"({p}-2, ...)" if flag else ""))


def prepare_out(out, *, sibling: bool = False, flag: str | None = "--sibling") -> Path:
    """The folder for a new run at ``out``: created if missing, used if it holds no run
    (empty, or what a start killed before its config left: :func:`killed_start_leftovers`;
    the caller empties it with :func:`clear_unstarted` once it holds the :class:`RunLock`).

    A folder that holds anything else is never reused: without ``sibling`` this raises
    :class:`RunFolderError` (naming what the folder holds, what to do with it and ``flag``;
    :class:`RunInUseError` when another process holds it); with ``sibling`` the first free
    ``<out>-2``, ``<out>-3``, ... is created and returned.
    """
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise RunFolderError(f"--out '{p}' is a file, not a folder; give a new folder name")
    if _nonempty(p):
        if not sibling:
            raise _refusal(p, flag)
        i = 2
        while _nonempty(Path(f"{p}-{i}")) or Path(f"{p}-{i}").is_file():
            i += 1
        p = Path(f"{p}-{i}")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _plain_json(obj):
    """``obj`` as ``config.json`` stores it (tuples become lists, numbers as JSON reads them back)."""
    return json.loads(json.dumps(obj, default=_json_default))


def same_config_status(out, cfg: dict) -> str | None:
    """When ``out`` holds a run whose ``config.json`` equals ``cfg``: ``"finished"``, ``"checkpoint"``
    (unfinished, resumable) or ``"none"`` (no checkpoint, model or summary: nothing of value, a fresh
    start may empty it); ``None`` otherwise (no such folder, another config, an unreadable one, or a
    model without a summary, e.g. ``spikerec lsc``'s)."""
    d = Path(out)
    try:
        same = json.loads((d / "config.json").read_text()) == _plain_json(cfg)
    except (OSError, ValueError):
        return None
    if not same:
        return None
    if (d / "summary.json").is_file():
        return "finished"
    if latest_checkpoint(d / "checkpoints") is not None:
        return "checkpoint"
    return None if (d / "model.safetensors").exists() else "none"


def clear_unstarted(run_dir, same_config: bool = False) -> list[str]:
    """Empty a folder that holds no run yet, keeping the lock file; returns what was removed
    (names, folders with a trailing ``/``). That is what a start killed before its config left
    (:func:`killed_start_leftovers`) and, with ``same_config`` (the caller checked
    :func:`same_config_status` is ``"none"``), a run stopped before its first checkpoint.
    Anything else is left alone and ``[]`` returned. Call it while holding the :class:`RunLock`."""
    d = Path(run_dir)
    left = killed_start_leftovers(d)
    if left is None and same_config and not ((d / "summary.json").exists() or (d / "model.safetensors").exists()
                                             or latest_checkpoint(d / "checkpoints") is not None):
        left = [p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in sorted(d.iterdir())
                if p.name != LOCK_NAME]
    for name in left or []:
        q = d / name.rstrip("/")
        if q.is_dir() and not q.is_symlink():
            shutil.rmtree(q)
        else:
            q.unlink(missing_ok=True)
    return left or []


class RunLock:
    """Advisory lock (``fcntl.flock`` on ``<run>/.lock``) held while a process uses a run folder.

    A second process gets :class:`RunInUseError`: "run X is in use by PID N (command)". The
    lock dies with its process (also on ``kill -9``), so a stale ``.lock`` file never blocks;
    the file is removed on release, so using a run leaves its folder's contents as they were.
    Use as a context manager or call :meth:`acquire` / :meth:`release`.
    """

    def __init__(self, run_dir, command: str = "spikerec"):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.command = command
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    holder = os.read(fd, 256).decode(errors="replace").strip() or "unknown PID"
                finally:
                    os.close(fd)
                pid, _, cmd = holder.partition(" ")
                raise RunInUseError(f"run '{self.run_dir}' is in use by PID {pid}{f' ({cmd})' if cmd else ''}; "
                                    f"wait for it to finish or stop it, then try again") from None
            try:  # the holder before us may have removed the file: lock the file that is there now
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.command}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file and unlock: a run folder holds ``.lock`` only while it is in use
        (or after its user was killed; the next user takes the stale file over)."""
        if self.fd is not None:
            try:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def remove_debris(run_dir) -> list[Path]:
    """Delete what interrupted writes left in a run folder and return it: temporary checkpoint
    folders (``checkpoints/.tmp-step-*``), step folders missing a file (an interrupted prune),
    atomic-write temporaries (``*.part``, ``.tmp*``) and empty folders under ``export/``.
    Call it while holding the run's :class:`RunLock`."""
    d = Path(run_dir)
    gone: list[Path] = []
    if not d.is_dir():
        return gone
    ck = d / "checkpoints"
    if ck.is_dir():
        for p in ck.iterdir():
            if p.is_dir() and (p.name.startswith(".tmp") or (p.name.startswith("step-") and not (
                    (p / "state.safetensors").is_file() and (p / "state.json").is_file()))):
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
    for p in sorted(d.rglob("*")):
        if p.is_file() and not p.is_symlink() and (p.name.endswith(".part") or p.name.startswith(".tmp")):
            p.unlink(missing_ok=True)
            gone.append(p)
    ex = d / "export"
    if ex.is_dir():
        for p in sorted(ex.rglob("*"), key=lambda q: -len(q.parts)):
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()
                gone.append(p)
        if not any(ex.iterdir()):
            ex.rmdir()
            gone.append(ex)
    return gone


def weights_source(run_dir, checkpoint: bool = False) -> str:
    """Which weights :func:`load_model` uses: ``"model.safetensors"`` or ``"checkpoint checkpoints/step-N"``."""
    d = Path(run_dir)
    if not checkpoint:
        return "model.safetensors"
    ck = latest_checkpoint(d / "checkpoints")
    return f"checkpoint {ck.relative_to(d)}" if ck is not None else "no checkpoint"


def resume_status(run_dir) -> str:
    """``"finished"`` (``summary.json`` written), ``"checkpoint"`` (an unfinished run with a
    checkpoint) or ``"none"`` (nothing to resume from). Raises :class:`RunError` for a folder
    that is not a run."""
    d = Path(run_dir)
    read_config(d)
    if (d / "summary.json").is_file():
        return "finished"
    return "checkpoint" if checkpoints_newest_first(d / "checkpoints") else "none"


def stop_message(stop) -> str:
    """What to print when a run stopped early (a :class:`spikerec.train.trainer.TrainingStopped`):
    why, the checkpoint written and the command that continues it."""
    if stop.checkpoint:
        return (f"stopped after {stop.step} steps ({stop.reason}); checkpoint written: {stop.checkpoint}\n"
                f"continue with: spikerec train --resume {stop.run_dir}")
    return (f"stopped after {stop.step} steps ({stop.reason}) before the first checkpoint (during LSC "
            f"pre-training); nothing to resume from.\nstart it again with: spikerec train --resume {stop.run_dir} "
            f"--from-scratch")

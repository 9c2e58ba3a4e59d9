"""Data-parallel training with ``torchrun`` (PyTorch DDP; gloo on the CPU, NCCL on CUDA).

``spikerec train ... --nproc-per-node N`` re-launches the same command under
``python -m torch.distributed.run --standalone --nproc-per-node N``. Every process reads
the same global batch (same seed, same order) and keeps its contiguous shard of
``B / N`` samples; each process's loss is its *sum* over its samples divided by the global
batch size times ``N``, so the averaged gradient equals the single-process gradient of
the global batch exactly (up to float summation order).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["DistInfo", "launch", "init_distributed", "shard", "all_reduce_sum", "all_reduce_grads", "barrier",
           "cleanup", "has_unused_parameters"]


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def launch(argv: list[str], nproc: int) -> int:
    """Run ``spikerec train argv`` under torchrun with ``nproc`` processes on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={int(nproc)}",
           "-m", "spikerec.cli.train", *argv]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.call(cmd, env=env)


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group that torchrun set up (no-op when ``WORLD_SIZE`` is unset or 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def shard(x: torch.Tensor, y: torch.Tensor, info: DistInfo, batch_dim_x: int = 1):
    """This process's contiguous part of a global batch (``x[T, B, C]``; ``y[B]`` or ``y[T, B, ...]``)."""
    if not info.enabled:
        return x, y
    B = x.shape[batch_dim_x]
    per = -(-B // info.world_size)
    lo, hi = min(B, info.rank * per), min(B, (info.rank + 1) * per)
    xs = x.narrow(batch_dim_x, lo, hi - lo)
    ydim = 1 if (y.dim() >= 2 and y.shape[0] == x.shape[0] and y.shape[1] == B) else 0
    return xs, y.narrow(ydim, lo, hi - lo)


def all_reduce_sum(values: list[float], info: DistInfo, device) -> list[float]:
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_grads(params, info: DistInfo) -> None:
    """Average ``.grad`` over processes (the online path, where DDP's hooks do not run)."""
    if not info.enabled:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(info.world_size)


def broadcast_parameters(module: torch.nn.Module, info: DistInfo) -> None:
    if not info.enabled:
        return
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=0)


def has_unused_parameters(model: torch.nn.Module, input_size: int, device: torch.device) -> bool:
    """Whether some trainable parameter of ``model`` gets no gradient from a forward and backward pass
    on a short input ``[2, 1, input_size]``: DDP's ``find_unused_parameters`` (a search of the autograd
    graph every step, and a warning per process when it finds nothing) is needed only then. The random
    number generators are left as they were."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return False
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        out = model(torch.ones(2, 1, int(input_size), device=device))
        y = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(y.float().sum(), params, allow_unused=True)
    return any(g is None for g in grads)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()

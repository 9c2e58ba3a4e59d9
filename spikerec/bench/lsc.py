"""``spikerec bench lsc``: wall time of one LSC pre-training step and of a full pre-training
of a 2 x 256 ALIF stack on SHD-shaped input (700 channels, random spikes).

Each step takes the time, depth and input transition Jacobians of both layers at one time
step, their spectral radii (matrix-free Arnoldi for the 512-wide ALIF states, or exact
``eigvals`` with ``--method exact``), the loss gradient, one AdaBelief+Lookahead update,
the clipped multiplier, the shuffle and the replay of the state at the new weights
(``--state carry``: the official code's carried state). The full run stops when converged (the mean
radii over the batch within ``eps`` of the target) or at ``--budget`` seconds.
"""
from __future__ import annotations

import json
import platform
import subprocess
import time

import torch
from ..options import ArgumentParser, real_number, whole_number

__all__ = ["main", "run"]


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown CPU"


def _model(width: int, channels: int, tau_adapt: float, seed: int):
    from ..layers.alif import ALIF
    from ..layers.readout import LeakyReadout
    from ..models import RecurrentStack

    torch.manual_seed(seed)
    return RecurrentStack([ALIF(channels, width, tau_adapt=tau_adapt), ALIF(width, width, tau_adapt=tau_adapt)],
                          LeakyReadout(width, 20))


def run(width=256, channels=700, steps=100, batch=8, rate=0.05, method="auto", n_iter=32, budget=300.0,
        step_repeats=5, seed=0, target=1.0, eps=0.02, shuffle=True, state="replay") -> dict:
    from ..stability.lsc import LSCConfig, lsc_pretrain

    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(steps, batch, channels, generator=g) < rate).float()
    cfg = dict(target=target, method=method, n_iter=n_iter, eps=eps, shuffle=shuffle, state=state)
    # one step (after one warm-up step)
    model = _model(width, channels, steps / 2, seed)
    lsc_pretrain(model, x[:2], dict(cfg, max_steps=1, keep_best=False))
    t0 = time.perf_counter()
    lsc_pretrain(model, x[: step_repeats + 1], dict(cfg, max_steps=step_repeats, keep_best=False,
                                                   verify_every=10 ** 9))
    step_s = (time.perf_counter() - t0) / step_repeats
    # full pre-training from a fresh model
    model = _model(width, channels, steps / 2, seed)
    t0 = time.perf_counter()
    report = lsc_pretrain(model, x, LSCConfig(**dict(cfg, max_steps=10 ** 6, max_epochs=10 ** 6, max_time_s=budget)))
    full_s = time.perf_counter() - t0
    return {
        "cpu": _cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "model": f"2 x {width} ALIF, {channels} inputs",
        "input": f"T={steps}, B={batch}, spike rate {rate}",
        "shuffle": shuffle,
        "state": state,
        "method": method if method != "auto" else ("exact" if 2 * width <= 128 else f"Arnoldi (m={n_iter}) on dense blocks"),
        "step_s": step_s,
        "full_s": full_s,
        "steps": report.steps,
        "converged": report.converged,
        "stop_reason": report.stop_reason,
        "best_deviation": report.best_deviation,
        "best_radii": report.best_radii,
    }


def main(argv=None) -> int:
    ap = ArgumentParser(prog="spikerec bench lsc", description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=whole_number(1), default=256)
    ap.add_argument("--channels", type=whole_number(1), default=700)
    ap.add_argument("--steps", type=whole_number(1), default=100, help="time bins T of the input")
    ap.add_argument("--batch", type=whole_number(1), default=8)
    ap.add_argument("--rate", type=real_number(0, inclusive=False), default=0.05, help="spike probability per bin and channel")
    ap.add_argument("--method", default="auto", choices=["auto", "exact", "arnoldi", "gelfand"])
    ap.add_argument("--n-iter", type=whole_number(1), default=32)
    ap.add_argument("--budget", type=real_number(0, inclusive=False), default=300.0, help="seconds allowed for the full pre-training")
    ap.add_argument("--target", type=real_number(0, inclusive=False), default=1.0)
    ap.add_argument("--eps", type=real_number(0, inclusive=False), default=0.02)
    ap.add_argument("--no-shuffle", action="store_true",
                    help="pre-train without the per-step weight shuffling (not the paper's method; for comparison)")
    ap.add_argument("--state", default="replay", choices=["replay", "carry"],
                    help="replay the state under the current weights (default) or carry it across updates "
                         "(the official code)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    ap.add_argument("--threads", type=whole_number(1), default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.quick:
        a.width, a.channels, a.steps, a.batch, a.budget = 16, 40, 10, 4, 20.0
    r = run(a.width, a.channels, a.steps, a.batch, a.rate, a.method, a.n_iter, a.budget, target=a.target, eps=a.eps,
            shuffle=not a.no_shuffle, state=a.state)
    if a.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"machine: {r['cpu']}, {r['threads']} threads, torch {r['torch']}")
    print(f"model: {r['model']}; input {r['input']}; radius: {r['method']}"
          + ("" if r["shuffle"] else "; no weight shuffling")
          + ("; state replayed at the current weights" if r["state"] == "replay" else "; state carried across updates"))
    print("| what | wall time |")
    print("|---|---|")
    what = "Jacobians + radii + update + kappa" + (" + shuffle" if r["shuffle"] else "")
    print(f"| one LSC step ({what}) | {r['step_s']:.3f} s |")
    state = "converged" if r["converged"] else "not converged"
    print(f"| full pre-training ({r['steps']} steps, {state}) | {r['full_s']:.1f} s |")
    print(f"stop: {r['stop_reason']}; best worst-deviation of the mean radii {r['best_deviation']:.3f}")
    print("best mean radii: " + ", ".join(f"{k} {v:.3f}" for k, v in r["best_radii"].items()))
    return 0

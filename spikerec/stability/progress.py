"""What LSC pre-training tells its user while and after it runs: a progress bar and, when it
stopped at its step budget without converging, a warning with the radii it reached.

Both are used by ``spikerec train`` (LSC phase) and ``spikerec lsc``; :func:`lsc_pretrain`
itself stays silent (it takes any ``progress(step, record)`` callable).
"""
from __future__ import annotations

import sys

from tqdm import tqdm  # text bars everywhere (the automatic choice warns in a notebook without ipywidgets)

__all__ = ["LSCProgressBar", "lsc_warning"]


class LSCProgressBar:
    """A ``progress(step, record)`` callable for :func:`~spikerec.stability.lsc_pretrain` that
    drives a tqdm bar over ``max_steps`` updates (a step counter with its rate when there is no step
    limit: the run lasts until it converges), showing the worst deviation ``max_k |rho_k - rho_t|``."""

    def __init__(self, max_steps: int | None, *, disable: bool = False, desc: str = "LSC"):
        self.bar = tqdm(total=None if max_steps is None else int(max_steps), desc=desc, disable=disable, leave=False,
                        dynamic_ncols=True, file=sys.stderr, unit="step")

    def __call__(self, step: int, record: dict) -> None:
        self.bar.set_postfix({"max |rho - target|": f"{record.get('deviation', float('nan')):.3f}"}, refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "LSCProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lsc_warning(report) -> str | None:
    """A warning line when LSC stopped at a budget (``max_steps``, ``max_epochs``, ``max_time_s``)
    or at the end of data that can be read once, without converging: the radii it reached (checked means, the kept weights) against their
    targets, the report's notes (e.g. a spiking network at target 0.5) and what to try. ``None``
    when it converged or diverged (that has its own message)."""
    if report.converged or report.diverged or not report.stop_reason:
        return None
    radii = report.best_radii or {}
    got = ", ".join(f"{k} {v:.3f} (target {report.targets.get(k, float('nan')):g})" for k, v in radii.items())
    cfg = report.config or {}
    limit = report.stop_reason.split(" ", 1)[0]  # the budget that ended the run
    if limit == "max_time_s":
        tips = [f"more time (--set lsc.max_time_s={2 * float(cfg.get('max_time_s') or report.wall_time_s):g})"]
    elif not limit.startswith("max_"):  # the data ran out
        tips = ["data that can be read again (a list of batches or a loader)"]
    elif limit == "max_epochs":
        tips = [f"more passes over the data (--set lsc.max_epochs={2 * int(cfg.get('max_epochs') or 1)})"]
    else:
        tips = [f"more steps (--set lsc.max_steps={2 * int(cfg.get('max_steps') or report.steps)})"]
    if cfg.get("shuffle", False):
        tips.append("no shuffling (--set lsc.shuffle=false), which adds a fluctuation of order 1/sqrt(width)")
    tips.append("more LSC data (--set lsc.batches=N) or a looser tolerance (--set lsc.eps=0.05)")
    notes = "".join(f" {n}" for n in getattr(report, "notes", None) or [])
    return (f"warning: LSC did not converge: {report.stop_reason} after {report.steps} steps; kept weights have "
            f"{got or 'no checked radii'} (max deviation {report.best_deviation:.3f}).{notes} Try "
            + "; or ".join(tips) + ".")

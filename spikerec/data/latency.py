"""Spike-latency code: each value fires at most one spike, earlier for larger values.

    T(x) = tau_eff * ln(x / (x - theta))     for x > theta,   no spike for x <= theta

(the time to threshold of a leaky integrator driven by a constant current ``x``; Zenke &
Vogels 2021, Neural Computation 33(4), Sec. 4; Herranz-Celotti & Rouat 2024, Sec. II-F). Times are in the unit of ``tau_eff``; the spike falls in step
``round(T / dt) + first_step`` (or ``floor``) and is dropped when that step is ``>= steps``.

Presets (``LATENCY_PRESETS``), all with one spike per pixel per channel:

* ``stork``    tau_eff = 50 ms, theta = 0.2, dt = 1 ms, 100 steps (Zenke/stork convention);
* ``spytorch`` tau_eff = 20 ms, theta = 0.2, dt = 1 ms, 100 steps (SpyTorch tutorial);
* ``lsc``      the convention of the LSC paper's code (Herranz-Celotti & Rouat 2024, Sec. II-F): ``x' = 50 x``, threshold 0.2 on
  ``x'``, ``T = 500 ln(x'/(x' - 0.2))`` steps, 100 steps, ``time_repeat = 2`` -> 200 steps.
  It equals ``tau_eff = 500, theta = 0.004, dt = 1``. The raster is ``[T, 784]`` with one
  spike per channel, i.e. the code's reshape of ``[784, T]`` into ``[T, 784]`` is *not*
  reproduced (it scrambles pixels and times).

:func:`snntorch_latency` reproduces ``snntorch.spikegen.latency`` (log and linear codes,
``normalize``, ``clip``, ``first_spike_time``) so that equal options give equal rasters.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch

__all__ = ["LatencyCode", "LATENCY_PRESETS", "latency_times", "latency_steps", "latency_encode", "snntorch_latency"]


@dataclass(frozen=True)
class LatencyCode:
    """Parameters of the latency code (see the module docstring)."""

    tau_eff: float = 0.05
    theta: float = 0.2
    dt: float = 0.001
    steps: int = 100
    first_step: int = 0
    rounding: str = "round"  # "round" (half to even, as torch.round) or "floor"
    time_repeat: int = 1

    def __post_init__(self):
        if not (self.tau_eff > 0 and math.isfinite(self.tau_eff)):
            raise ValueError(f"latency code: tau_eff must be > 0, got {self.tau_eff!r}")
        if not (0 <= self.theta < 1):
            raise ValueError(f"latency code: theta must lie in [0, 1), got {self.theta!r}")
        if not self.dt > 0:
            raise ValueError(f"latency code: dt must be > 0, got {self.dt!r}")
        if int(self.steps) < 1 or int(self.first_step) < 0 or int(self.time_repeat) < 1:
            raise ValueError("latency code: steps >= 1, first_step >= 0 and time_repeat >= 1 are required, got "
                             f"steps={self.steps}, first_step={self.first_step}, time_repeat={self.time_repeat}")
        if self.rounding not in ("round", "floor"):
            raise ValueError(f"latency code: rounding must be 'round' or 'floor', got {self.rounding!r}")

    def with_options(self, **kw) -> "LatencyCode":
        unknown = sorted(set(kw) - set(asdict(self)))
        if unknown:
            raise ValueError(f"latency code: unknown option(s) {unknown}; valid: {sorted(asdict(self))}")
        return replace(self, **kw)

    @property
    def total_steps(self) -> int:
        return int(self.steps) * int(self.time_repeat)


LATENCY_PRESETS: dict[str, LatencyCode] = {
    "stork": LatencyCode(tau_eff=0.05, theta=0.2, dt=0.001, steps=100),
    "spytorch": LatencyCode(tau_eff=0.02, theta=0.2, dt=0.001, steps=100),
    "lsc": LatencyCode(tau_eff=500.0, theta=0.004, dt=1.0, steps=100, time_repeat=2),
}


def latency_times(x: torch.Tensor, tau_eff: float, theta: float) -> torch.Tensor:
    """``T(x) = tau_eff ln(x / (x - theta))`` for ``x > theta``, ``+inf`` otherwise (same dtype as x)."""
    if not torch.is_tensor(x):
        x = torch.as_tensor(x)
    if not x.is_floating_point():
        x = x.to(torch.float32)
    if x.numel() and (bool(torch.isnan(x).any()) or float(x.min()) < 0 or float(x.max()) > 1):
        raise ValueError(f"latency code: values must lie in [0, 1], got range "
                         f"[{float(x.min()) if x.numel() else 0}, {float(x.max()) if x.numel() else 0}]")
    spikes = x > theta
    safe = torch.where(spikes, x, torch.ones_like(x))
    t = tau_eff * torch.log(safe / (safe - theta))
    return torch.where(spikes, t, torch.full_like(x, math.inf))


def latency_steps(x: torch.Tensor, code: LatencyCode) -> torch.Tensor:
    """Step index of each value's spike (int64), ``-1`` for no spike (below theta or past the window)."""
    t = latency_times(x, code.tau_eff, code.theta) / code.dt
    finite = torch.isfinite(t)
    t = torch.where(finite, t, torch.zeros_like(t))
    k = (torch.round(t) if code.rounding == "round" else torch.floor(t)).to(torch.int64) + int(code.first_step)
    keep = finite & (k < int(code.steps)) & (k >= 0)
    return torch.where(keep, k, torch.full_like(k, -1))


def latency_encode(x: torch.Tensor, code: LatencyCode | str = "stork", **options) -> torch.Tensor:
    """Raster ``[total_steps, *x.shape]`` float32 with at most one spike per value (time-first).

    ``code`` is a :class:`LatencyCode` or a preset name; ``options`` override its fields.
    """
    if isinstance(code, str):
        if code not in LATENCY_PRESETS:
            raise ValueError(f"latency code: unknown preset {code!r}; valid: {sorted(LATENCY_PRESETS)}")
        code = LATENCY_PRESETS[code]
    if options:
        code = code.with_options(**options)
    k = latency_steps(x, code)
    grid = torch.arange(code.steps).view(code.steps, *([1] * k.dim()))
    out = (k.unsqueeze(0) == grid).to(torch.float32)
    if code.time_repeat > 1:
        out = out.repeat_interleave(code.time_repeat, dim=0)
    return out


def snntorch_latency(data: torch.Tensor, num_steps: int, threshold: float = 0.01, tau: float = 1.0,
                     first_spike_time: int = 0, clip: bool = False, normalize: bool = False,
                     linear: bool = False, epsilon: float = 1e-7) -> torch.Tensor:
    """The raster of ``snntorch.spikegen.latency(data, num_steps, ..., bypass=True)`` (``on_target=1``,
    ``off_target=0``, no interpolation), re-implemented from its documented equations
    (snnTorch documentation of ``spikegen.latency``; Eshraghian et al. 2023, Proc. IEEE 111(9)):

    * log code: ``x <- max(x, theta + eps)``, ``t = tau ln(x / (x - theta)) + first_spike_time``;
      with ``normalize``: ``t <- (t - t0)(num_steps - t0 - 1) / max(t - t0) + t0``;
    * linear code: ``tau <- num_steps - 1 - t0`` if ``normalize``; ``t = min(-tau(x - 1), -tau(theta - 1)) + t0``;
    * one spike at ``round(t)``; ``round(t) > num_steps - 1`` is dropped; ``clip`` removes ``x < theta``.

    Unlike :func:`latency_encode`, values below threshold fire late (at the saturated time)
    unless ``clip``; with ``clip=True`` and no ``normalize`` the two agree for ``x != theta``.
    """
    if not (0 < threshold < 1):
        raise ValueError(f"snntorch_latency: threshold must lie in (0, 1), got {threshold!r}")
    if tau <= 0:
        raise ValueError(f"snntorch_latency: tau must be > 0, got {tau!r}")
    if data.numel() and (float(data.min()) < 0 or float(data.max()) > 1):
        raise ValueError("snntorch_latency: data must lie in [0, 1]")
    below = data < threshold
    if linear:
        if normalize:
            tau = num_steps - 1 - first_spike_time
        t = torch.clamp_max(-tau * (data - 1), -tau * (threshold - 1)) + first_spike_time
    else:
        d = torch.clamp(data, threshold + epsilon)
        t = tau * torch.log(d / (d - threshold))
        if first_spike_time > 0:
            t = t + first_spike_time
        if normalize:
            t = (t - first_spike_time) * (num_steps - first_spike_time - 1) / torch.max(t - first_spike_time) + first_spike_time
    r = torch.round(t)
    drop = r.long() > num_steps - 1
    idx = torch.round(torch.clamp_max(t, num_steps - 1)).long()
    out = torch.zeros((num_steps, *data.shape), dtype=data.dtype)
    out = out.scatter(0, idx.unsqueeze(0), 1) * ~drop
    if clip:
        out = out * ~below
    return out

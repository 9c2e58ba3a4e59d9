"""Target profiles: the fixed-point arithmetic of a neuromorphic target, as data.

A :class:`TargetProfile` says how a quantised layer is stored and stepped by
:mod:`spikerec.hardware.export.intsim`. Every quantity lives in integer *state units*;
one layer step is (Lava's ``PyLifModelBitAcc`` for the order of operations)::

    a     = (W_q x + W_rec_q z_{t-1}) << shift           weight mantissas, per-layer left shift
    i     = wrap_or_sat_I( decay(i, d_i) + a )             current (plain LIF: d_i removes all of i)
    v_in  = v - thr z_{t-1}   (reset "subtract", timing "immediate": decayed with v)
    v     = wrap_or_sat_V( decay(v_in, d_v) + i [+ bias] [- thr z_{t-1}  (subtract, timing "next_step")] )
            (reset "zero": v_in = 0 where z_{t-1})
    z     = [v > thr]                                       strict (the quantiser stores thr+1 for ``>=`` chips)

Decay rules: ``"mulshift"`` ``x <- sign(x) * ((|x| * (2^B - d)) >> B)`` (Loihi, rounding toward
zero; ``d`` is the *effective* decay, Lava's ``du + 1`` / ``dv``) and ``"bitshift"``
``x <- x - (x >> dash)`` (Xylo, arithmetic shift = floor; ``dash = 0`` removes all of ``x``).
Overflow: ``"wrap"`` (two's complement) or ``"saturate"`` (to ``±(2^(N-1) - 1)``).

``loihi2`` follows Lava's ``PyLifModelBitAcc`` (see ``hardware/loihi2/README.md`` for the release);
``xylo``/``xylo2`` are the Xylo core itself, simulated by :mod:`spikerec.hardware.export.xylo.spec` and tested
bit for bit against SynSense's ``xylosim``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

__all__ = ["TargetProfile", "PROFILES", "get_profile", "LAYER_KINDS"]

#: overflow rules: two's complement, Lava's wrap into (-2^(N-1), 2^(N-1)], symmetric saturation
OVERFLOWS = ("wrap", "wrap_lava", "saturate")

#: layer kinds a profile may support
LAYER_KINDS = ("lif", "cuba", "recurrent", "alif", "readout", "readout_leaky", "bias")


@dataclass(frozen=True)
class TargetProfile:
    """Fixed-point rules of one target.

    Attributes:
        name: profile name (``loihi2``, ``xylo``, ``generic``).
        weight_bits: signed mantissa bits of a weight (8: -128..127).
        weight_shift_range: allowed per-layer left shifts of the weights (Loihi: ``6 + weight_exp``,
            ``weight_exp`` in 0..7; Xylo: the ``weight_shift`` register).
        current_bits, state_bits: signed widths of the synaptic current ``i`` and membrane ``v``.
        current_overflow, state_overflow: ``"wrap"`` (two's complement), ``"wrap_lava"`` (Lava's
            ``PyLifModelBitAcc``: into ``(-2^(N-1), 2^(N-1)]``) or ``"saturate"``.
        threshold_bits: unsigned bits of the stored threshold mantissa.
        threshold_shift: the stored threshold is ``mant << threshold_shift`` (Loihi ``vth << 6``).
        bias_bits, bias_exp_bits: signed bias mantissa and exponent (``bias = mant << exp``).
        decay: ``"mulshift"`` or ``"bitshift"``.
        decay_bits: ``B`` of the mulshift rule (12 = Loihi's ``/4096``) or the bits of ``dash``.
        resets: reset modes the target implements (``zero``, ``subtract``, ``none``).
        reset_timing: ``"next_step"`` (spikerec / snnTorch ``reset_delay=True``: the subtraction is not
            decayed) or ``"immediate"`` (hardware: reset right after the spike, decayed at the next step).
        strict_threshold: the chip fires on ``v > thr`` (True) or ``v >= thr`` (False).
        bias_into: ``"current"`` (spikerec: the bias is part of ``J`` and is filtered by the CUBA
            synapse) or ``"voltage"`` (Loihi, Xylo: added to ``v`` each step; the quantiser then stores
            ``b / (1 - alpha_syn)``, equal in steady state).
        adapt_frac_bits: fractional bits of the ALIF adaptation variable.
        supports: layer kinds the target runs (see :data:`LAYER_KINDS`).
        description: one line for reports.
        chip: ``"xylo"`` when the profile is a chip whose whole core spikerec simulates bit for bit
            (:mod:`spikerec.hardware.export.xylo.spec`); ``""`` for the per-layer rules above.
        chip_version: the chip's version (Xylo: 1 = syns61300, 2 = syns61201).
    """

    name: str
    weight_bits: int = 8
    weight_shift_range: tuple[int, int] = (0, 0)
    current_bits: int = 16
    state_bits: int = 16
    current_overflow: str = "saturate"
    state_overflow: str = "saturate"
    threshold_bits: int = 16
    threshold_shift: int = 0
    bias_bits: int = 16
    bias_exp_bits: int = 0
    decay: str = "mulshift"
    decay_bits: int = 12
    resets: tuple[str, ...] = ("zero", "subtract", "none")
    reset_timing: str = "next_step"
    strict_threshold: bool = True
    bias_into: str = "current"
    adapt_frac_bits: int = 12
    supports: tuple[str, ...] = LAYER_KINDS
    description: str = ""
    chip: str = ""
    chip_version: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        checks = [
            (self.weight_bits >= 2, "weight_bits must be >= 2"),
            (self.current_bits >= 2 and self.state_bits >= 2, "current_bits/state_bits must be >= 2"),
            (self.current_bits <= 48 and self.state_bits <= 48, "current_bits/state_bits must be <= 48"),
            (self.decay in ("mulshift", "bitshift"), f"decay must be 'mulshift' or 'bitshift', got {self.decay!r}"),
            (self.current_overflow in OVERFLOWS and self.state_overflow in OVERFLOWS,
             f"current_overflow/state_overflow must be one of {OVERFLOWS}"),
            (self.bias_into in ("current", "voltage"), "bias_into must be 'current' or 'voltage'"),
            (self.reset_timing in ("next_step", "immediate"), "reset_timing must be 'next_step' or 'immediate'"),
            (set(self.resets) <= {"zero", "subtract", "none"}, "resets must be a subset of zero/subtract/none"),
            (set(self.supports) <= set(LAYER_KINDS), f"supports must be a subset of {LAYER_KINDS}"),
            (self.weight_shift_range[0] <= self.weight_shift_range[1] and self.weight_shift_range[0] >= 0,
             "weight_shift_range must be (lo, hi) with 0 <= lo <= hi"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"profile '{self.name}': {msg}")

    # --- derived limits --------------------------------------------------------------
    @property
    def weight_max(self) -> int:
        return 2 ** (self.weight_bits - 1) - 1

    @property
    def weight_min(self) -> int:
        return -(2 ** (self.weight_bits - 1))

    @property
    def threshold_max(self) -> int:
        return 2**self.threshold_bits - 1

    @property
    def bias_max(self) -> int:
        return 2 ** (self.bias_bits - 1) - 1

    @property
    def decay_max(self) -> int:
        """Largest decay code: ``2^B`` (mulshift, removes everything) or ``2^B - 1`` (largest dash)."""
        return 2**self.decay_bits if self.decay == "mulshift" else 2**self.decay_bits - 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["weight_shift_range"] = list(self.weight_shift_range)
        d["resets"], d["supports"] = list(self.resets), list(self.supports)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TargetProfile":
        d = dict(d)
        for k in ("weight_shift_range", "resets", "supports"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


PROFILES: dict[str, TargetProfile] = {
    # Lava 0.10.0 PyLifModelBitAcc (src/lava/proc/lif/models.py): 24-bit u wraps into (-2^23, 2^23],
    # v saturates to +-(2^23 - 1), du/dv 12-bit (>> 12, toward zero), a_in << 6, vth << 6 (17-bit
    # mantissa), bias 13-bit mantissa << 3-bit exponent, reset to 0 right after the spike, strict >.
    "loihi2": TargetProfile(
        name="loihi2",
        weight_bits=8,
        weight_shift_range=(6, 13),
        current_bits=24,
        state_bits=24,
        current_overflow="wrap_lava",
        state_overflow="saturate",
        threshold_bits=17,
        threshold_shift=6,
        bias_bits=13,
        bias_exp_bits=3,
        decay="mulshift",
        decay_bits=12,
        resets=("zero",),
        reset_timing="immediate",
        strict_threshold=True,
        bias_into="voltage",
        supports=("lif", "cuba", "recurrent", "readout", "readout_leaky", "bias"),
        description="Loihi-2-like CUBA: int8 weights << (6 + exp), 24-bit u (wrap) and v (saturate), "
                    "12-bit multiply-and-shift decays, zero reset, v > vth",
    ),
    # Xylo SNN core (SynSense), bit-exact with the vendor's simulator xylosim: see spikerec.hardware.export.xylo.arithmetic
    # and hardware/xylo/README.md. Version 1 (syns61300) has no bias; version 2 (syns61201, "xylo2") has one.
    "xylo": TargetProfile(
        name="xylo",
        weight_bits=8,
        weight_shift_range=(0, 7),
        current_bits=16,
        state_bits=16,
        current_overflow="saturate",
        state_overflow="saturate",
        threshold_bits=15,
        threshold_shift=0,
        bias_bits=16,
        decay="bitshift",
        decay_bits=4,
        resets=("subtract",),
        reset_timing="immediate",
        strict_threshold=False,
        bias_into="voltage",
        supports=("lif", "cuba", "recurrent", "readout", "readout_leaky"),
        chip="xylo",
        chip_version=1,
        description="Xylo v1 (syns61300) SNN core, bit-exact with xylosim: CUBA LIF, int8 weights with one shift "
                    "per matrix, 16-bit saturating state, dash decays, multi-spike subtractive reset, no bias",
    ),
    "xylo2": TargetProfile(
        name="xylo2",
        weight_bits=8,
        weight_shift_range=(0, 7),
        current_bits=16,
        state_bits=16,
        current_overflow="saturate",
        state_overflow="saturate",
        threshold_bits=15,
        threshold_shift=0,
        bias_bits=16,
        decay="bitshift",
        decay_bits=4,
        resets=("subtract",),
        reset_timing="immediate",
        strict_threshold=False,
        bias_into="voltage",
        supports=("lif", "cuba", "recurrent", "readout", "readout_leaky", "bias"),
        chip="xylo",
        chip_version=2,
        description="Xylo v2 (syns61201) SNN core, bit-exact with xylosim: as 'xylo' plus a 16-bit bias per neuron",
    ),
    # Configurable: defaults follow spikerec's float semantics on an 8-bit / 16-bit grid.
    "generic": TargetProfile(
        name="generic",
        weight_bits=8,
        weight_shift_range=(0, 8),
        current_bits=24,
        state_bits=24,
        threshold_bits=23,
        bias_bits=24,
        decay="mulshift",
        decay_bits=12,
        description="generic intN: signed N-bit weights with a per-layer shift, 24-bit saturating state, "
                    "12-bit multiply-and-shift decays, every reset mode, ALIF",
    ),
}


def get_profile(profile, **overrides) -> TargetProfile:
    """A profile by name (``loihi2``, ``xylo``, ``generic``) or instance, with field overrides,
    e.g. ``get_profile("generic", weight_bits=4, state_bits=12, state_overflow="wrap")``."""
    if isinstance(profile, TargetProfile):
        base = profile
    elif isinstance(profile, str) and profile in PROFILES:
        base = PROFILES[profile]
    else:
        raise ValueError(f"unknown target profile {profile!r}; expected one of {sorted(PROFILES)} or a TargetProfile")
    unknown = set(overrides) - set(TargetProfile.__dataclass_fields__)
    if unknown:
        raise ValueError(f"profile '{base.name}': unknown field(s) {sorted(unknown)}")
    return replace(base, **overrides) if overrides else base

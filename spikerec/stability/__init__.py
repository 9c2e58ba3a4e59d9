"""Transition Jacobians, spectral-radius estimators, LSC pre-training and theory helpers.

See ``docs/lsc.md``. Main entry points: :func:`transition_jacobians`,
:func:`cell_time_jacobian`, :func:`spectral_radius`, :func:`lsc_pretrain`.
"""
from .jacobians import LinearOp, cell_time_jacobian, transition_jacobians, transition_operators
from .lsc import LSCConfig, LSCReport, apply_clipped_multiplier, lsc_pretrain, mean_radii, shuffle_parameters
from .radius import spectral_radius

__all__ = [
    "LinearOp",
    "cell_time_jacobian",
    "transition_jacobians",
    "transition_operators",
    "spectral_radius",
    "LSCConfig",
    "LSCReport",
    "lsc_pretrain",
    "mean_radii",
    "apply_clipped_multiplier",
    "shuffle_parameters",
]

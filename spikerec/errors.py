"""The package's own error types.

Every error that a user can cause (a bad config, a missing or malformed file, a run
folder that does not match its model, an export a target cannot take) is one of these.
Each message names the file, option, tensor or layer, says what was expected and, where
there is one, what to do. The ``spikerec`` command turns them into one line on stderr and
the exit code of the class (``docs/errors.md`` lists them); library users catch them like
any ``ValueError``.

=====================  ====  ===============================================================
class                  exit  raised for
=====================  ====  ===============================================================
``SpikerecError``      1     base class (``ValueError``)
``ConfigError``        2     a preset, ``--set`` override, option or config value
``DataError``          3     a data file or data-set option (missing files: ``DatasetMissingError``
                             in :mod:`spikerec.data`, also exit 3)
``CheckpointError``    5     a run folder, ``config.json``, ``model.safetensors`` or checkpoint
``ExportError``        6     a model a target profile (or NIR) cannot represent
=====================  ====  ===============================================================
"""
from __future__ import annotations

__all__ = ["SpikerecError", "ConfigError", "DataError", "CheckpointError", "ExportError", "EXIT_CODES"]


class SpikerecError(ValueError):
    """Base class of spikerec's own errors; ``exit_code`` is what the command returns."""

    exit_code = 1


class ConfigError(SpikerecError):
    """A bad preset name, option, key or value; the message names it and lists the valid choices."""

    exit_code = 2


class DataError(SpikerecError):
    """A data file or data-set option is malformed; the message names the file/option and the problem."""

    exit_code = 3


class CheckpointError(SpikerecError):
    """A run folder, model file or checkpoint that cannot be used (names the file and what is wrong)."""

    exit_code = 5


class ExportError(SpikerecError):
    """A model that the chosen target (or format) cannot represent; names the layer and the limit."""

    exit_code = 6


#: exit codes of the ``spikerec`` command (see ``docs/errors.md``)
EXIT_CODES = {
    0: "success",
    1: "the command ran but its result is a failure (e.g. LSC diverged), or an unexpected internal error",
    2: "bad command line or config (unknown preset/option, wrong type or range, --device not available)",
    3: "data set missing or malformed",
    4: "training stopped: the loss became NaN or inf",
    5: "run folder, model file or checkpoint unusable (missing, truncated, not safetensors, wrong shapes)",
    6: "export: the model does not fit the target",
    7: "the operating system refused a write (read-only folder, permission denied, disk full)",
    130: "interrupted (Ctrl-C or SIGTERM)",
}

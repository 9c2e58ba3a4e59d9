"""Pieces every subcommand shares: an argument parser whose errors are one line, number
options checked for their range, the interruption that carries a resume hint, and the device check."""
from __future__ import annotations


from ..errors import ConfigError
from ..options import ArgumentParser, real_number, whole_number  # noqa: F401  (re-exported for the commands)

__all__ = ["ArgumentParser", "Interrupted", "check_device", "whole_number", "real_number"]




class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while a command runs; ``hint`` says how to continue."""

    def __init__(self, hint: str = ""):
        super().__init__(hint)
        self.hint = hint


def check_device(name: str, option: str) -> None:
    """A clear :class:`ConfigError` when ``name`` asks for CUDA (or an index) that this machine lacks."""
    name = str(name)
    if name in ("auto", "cpu"):
        return
    if not (name == "cuda" or name.startswith("cuda:")):
        raise ConfigError(f"{option} = '{name}': expected cpu, cuda, cuda:N or auto")
    import torch  # here, not at the top: commands that never touch a device start without torch

    if not torch.cuda.is_available():
        raise ConfigError(f"{option} = '{name}' but CUDA is not available on this machine; use cpu or auto")
    if name.startswith("cuda:"):
        idx = name[5:]
        if not idx.isdigit() or int(idx) >= torch.cuda.device_count():
            raise ConfigError(f"{option} = '{name}': this machine has CUDA devices 0..{torch.cuda.device_count() - 1}")

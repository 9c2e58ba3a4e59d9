"""Pieces every subcommand shares: an argument parser whose errors are one line, number
options checked for their range, the interruption that carries a resume hint, and the device check."""
from __future__ import annotations

import argparse
import math

from ..errors import ConfigError

__all__ = ["ArgumentParser", "Interrupted", "check_device", "whole_number", "real_number"]


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors become :class:`ConfigError` (one line, exit code 2)
    instead of a usage block and ``SystemExit``."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise ConfigError(f"{message} (see '{self.prog} --help')")


def whole_number(minimum: int):
    """An ``argparse`` type: an integer ``>= minimum`` (a bad one is a one-line error naming the option)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"whole number >= {minimum}"
    return parse


def real_number(minimum: float, *, inclusive: bool = True):
    """An ``argparse`` type: a finite number ``>= minimum`` (``> minimum`` unless ``inclusive``)."""
    bound = f"{'>=' if inclusive else '>'} {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bound}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value

    parse.__name__ = f"number {bound}"
    return parse


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

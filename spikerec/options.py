"""Command-line options checked where they are parsed: an ``argparse`` parser whose usage errors are one
line (:class:`spikerec.errors.ConfigError`, exit code 2) and number types that name the option and the
range expected. Shared by the commands (:mod:`spikerec.cli`) and the benchmarks (:mod:`spikerec.bench`)."""
from __future__ import annotations

import argparse
import math

from .errors import ConfigError

__all__ = ["ArgumentParser", "whole_number", "real_number"]


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

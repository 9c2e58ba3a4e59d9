"""The ``spikerec`` command. Each subcommand lives in its own module and exposes
``main(argv) -> int``; this file only dispatches."""
from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("spikerec.train.commands", "Train a model from a preset (default: quickstart, offline)."),
    "evaluate": ("spikerec.train.evaluate_command", "Evaluate a finished run on its test set."),
    "lsc": ("spikerec.stability.command", "Local Stability Condition pre-training of a configured model."),
    "export": ("spikerec.hardware.export_command", "Quantise a run for a neuromorphic target, write NIR, cross-check simulators."),
    "bench": ("spikerec.bench", "Benchmarks side by side with snnTorch and Norse (lif, scan, data, lsc, online)."),
    "datasets": ("spikerec.data.command", "What data sets are available, what is missing and how to get it."),
}


def _usage() -> str:
    lines = ["usage: spikerec COMMAND [options]   (spikerec COMMAND --help for details)", "", "commands:"]
    lines += [f"  {name:<10} {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "With no command, 'spikerec train' runs the quickstart preset."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv and argv[0] in ("--version",):
        from . import __version__

        print(__version__)
        return 0
    cmd = argv.pop(0) if argv else "train"
    if cmd not in COMMANDS:
        print(f"spikerec: unknown command '{cmd}'\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    return int(module.main(argv) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

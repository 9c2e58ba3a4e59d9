"""The ``spikerec`` command. Each subcommand is a module of this package with
``main(argv) -> int``; this file dispatches and turns errors into one line.

Errors: the package's own error types (:mod:`spikerec.errors`), a data set that is not on
disk, a non-finite loss, the operating system refusing a write (read-only folder, disk
full) and Ctrl-C/SIGTERM are printed as one line ``spikerec COMMAND: message`` on stderr and
returned as the documented exit code (``docs/errors.md``). ``--debug`` (anywhere on the
command line, or ``SPIKEREC_DEBUG=1``) lets the traceback through instead.

Nothing here imports torch: ``--help``, ``--version`` and the commands that need no tensors
(``train --list``, ``datasets``) answer without it.
"""
from __future__ import annotations

import errno
import importlib
import os
import signal
import sys

from .. import __version__
from ..errors import EXIT_CODES, SpikerecError
from .common import Interrupted

__all__ = ["main", "COMMANDS", "EXIT_CODES", "run_command"]

COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("spikerec.cli.train", "Train a model from a preset (default: quickstart, offline)."),
    "evaluate": ("spikerec.cli.evaluate", "Evaluate a finished run on its test set."),
    "lsc": ("spikerec.cli.lsc", "Local Stability Condition pre-training of a configured model."),
    "export": ("spikerec.cli.export", "Quantise a run for a neuromorphic target, write NIR, cross-check simulators."),
    "bench": ("spikerec.cli.bench", "Benchmarks side by side with snnTorch and Norse (lif, scan, data, lsc, online)."),
    "datasets": ("spikerec.cli.datasets", "What data sets are available, what is missing and how to get it."),
}
_FALLBACK: dict[str, str] = {}

EXIT_INTERRUPTED = 130
EXIT_OS = 7


def _usage() -> str:
    lines = ["usage: spikerec [--debug] COMMAND [options]   (spikerec COMMAND --help for details)", "", "commands:"]
    lines += [f"  {name:<10} {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "With no command, 'spikerec train' runs the quickstart preset.",
              "Errors are one line and an exit code (see docs/errors.md); --debug shows the traceback."]
    return "\n".join(lines)


def _command_module(name: str):
    modname = COMMANDS[name][0]
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name != modname or modname not in _FALLBACK:
            raise
        return importlib.import_module(_FALLBACK[modname])


def _os_message(e: OSError) -> str:
    where = f"'{e.filename}'" if getattr(e, "filename", None) else "a file"
    if e.errno == errno.ENOSPC:
        return f"no space left on the device while writing {where}; free some space and run the command again " \
               f"(an interrupted training run continues with 'spikerec train --resume RUN')"
    if e.errno == errno.EDQUOT:
        return f"disk quota exceeded while writing {where}; free some space and run the command again"
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot write {where}: {e.strerror or 'permission denied'} (a read-only or foreign folder?); " \
               f"choose a writable folder, e.g. with --out"
    return f"{e.strerror or e} ({where})"


def _raised_by(e: BaseException, module: str, name: str) -> bool:
    """``e`` is an instance of ``module.name``; a module that was never imported cannot have raised it
    (so that handling an error never imports torch)."""
    mod = sys.modules.get(module)
    return mod is not None and isinstance(e, getattr(mod, name))


def _handle(cmd: str, e: BaseException) -> tuple[int, str]:
    """``(exit code, one-line message)`` for an error that reached the top, or ``(-1, "")`` if unknown."""
    if isinstance(e, (KeyboardInterrupt, Interrupted)):
        hint = getattr(e, "hint", "") or ""
        return EXIT_INTERRUPTED, "interrupted" + (f"; {hint}" if hint else "")
    if isinstance(e, SpikerecError):
        return e.exit_code, str(e)
    if _raised_by(e, "spikerec.data.home", "DatasetMissingError"):
        return 3, " ".join(str(e).split("\n"))
    if _raised_by(e, "spikerec.train.trainer", "NonFiniteLoss"):
        return 4, str(e)
    if isinstance(e, FileNotFoundError):
        return 2, f"'{e.filename}' does not exist" if e.filename else str(e)
    if isinstance(e, OSError) and (e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)
                                   or isinstance(e, PermissionError)):
        return EXIT_OS, _os_message(e)
    if isinstance(e, ValueError):  # the library's convention: a ValueError is bad input and its message says which
        return 2, str(e)
    return -1, ""


def _sigterm(signum, frame):  # pragma: no cover - exercised in a subprocess
    raise Interrupted()


def run_command(cmd: str, argv: list[str], debug: bool = False) -> int:
    """Run one subcommand with the top-level error handler."""
    module = _command_module(cmd)
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _sigterm)
    except ValueError:  # not the main thread
        pass
    try:
        return int(module.main(argv) or 0)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - the one place that turns errors into messages
        if debug:
            raise
        code, msg = _handle(cmd, e)
        if code < 0:
            print(f"spikerec {cmd}: internal error: {type(e).__name__}: {e} "
                  f"(run again with --debug for the traceback, and please report it)", file=sys.stderr)
            return 1
        print(f"spikerec {cmd}: {' '.join(msg.split())}", file=sys.stderr)  # one line, whatever the message
        return code
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("SPIKEREC_DEBUG", "") not in ("", "0")
    if "--debug" in argv:
        debug = True
        argv = [a for a in argv if a != "--debug"]
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv and argv[0] in ("--version",):
        print(__version__)
        return 0
    cmd = argv.pop(0) if argv else "train"
    if cmd not in COMMANDS:
        print(f"spikerec: unknown command '{cmd}'\n\n{_usage()}", file=sys.stderr)
        return 2
    return run_command(cmd, argv, debug)

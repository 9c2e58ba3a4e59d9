"""Run ``spikerec`` commands in forked child processes (torch is imported once, in the test
process), with their exit code, stdout and stderr; and byte snapshots of run folders."""
import os
import sys
import tempfile
from pathlib import Path

from spikerec.cli import main


def fork_cli(argv: list[str], out_dir: str | None = None) -> tuple[int, Path, Path]:
    """Start ``spikerec <argv>`` in a forked child; returns ``(pid, stdout_file, stderr_file)``."""
    d = Path(out_dir or tempfile.mkdtemp(prefix="cli-"))
    so, se = d / f"out-{len(list(d.iterdir()))}.txt", d / f"err-{len(list(d.iterdir()))}.txt"
    pid = os.fork()
    if pid == 0:  # child: run the command and leave without returning into pytest
        code = 1
        try:
            fo, fe = open(so, "w"), open(se, "w")
            os.dup2(fo.fileno(), 1)
            os.dup2(fe.fileno(), 2)
            sys.stdout, sys.stderr = fo, fe
            code = main(list(argv))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - an uncaught error is a traceback on stderr, as in a shell
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(code or 0))
    return pid, so, se


def wait_cli(pid: int, so: Path, se: Path) -> tuple[int, str, str]:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), so.read_text(), se.read_text()


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``spikerec <argv>`` run in a forked child."""
    return wait_cli(*fork_cli(argv))


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

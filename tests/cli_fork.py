"""Run ``spikerec`` commands in forked child processes (torch is imported once, in the test
process), with their exit code, stdout and stderr; and byte snapshots of run folders.

A forked child runs torch on one intra-op thread, as torch's own DataLoader workers do: GNU
OpenMP (torch's CPU thread pool on Linux) is not fork-safe, and a child that starts a parallel
region on the pool its parent created waits forever for threads that were not forked. The
child's later ``torch.set_num_threads`` calls (``train.threads``) are ignored for that reason.
Every wait has a deadline: a child still running after it is killed and the test fails with
what the child printed, instead of hanging the suite.
"""
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401  (torch's optimizers import it on first use, about 2 s: once here, not in every child)

from spikerec.cli import main

DEADLINE_S = float(os.environ.get("SPIKEREC_TEST_CHILD_DEADLINE_S", "900"))


def single_threaded_child() -> None:
    """Call first thing in a forked child: one torch thread for the rest of its life."""
    torch.set_num_threads(1)
    torch.set_num_threads = lambda n: None  # the child's own settings cannot leave this state


def wait_child(pid: int, deadline_s: float = DEADLINE_S, what: str = "") -> int:
    """Exit code of child ``pid``; kills it and raises ``AssertionError`` after ``deadline_s``."""
    t_end = time.monotonic() + deadline_s
    delay = 0.01
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > t_end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"forked child {what or pid} still ran after {deadline_s:.0f} s; killed")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def fork_cli(argv: list[str], out_dir: str | None = None) -> tuple[int, Path, Path]:
    """Start ``spikerec <argv>`` in a forked child; returns ``(pid, stdout_file, stderr_file)``."""
    d = Path(out_dir or tempfile.mkdtemp(prefix="cli-"))
    so, se = d / f"out-{len(list(d.iterdir()))}.txt", d / f"err-{len(list(d.iterdir()))}.txt"
    pid = os.fork()
    if pid == 0:  # child: run the command and leave without returning into pytest
        code = 1
        try:
            single_threaded_child()
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
    try:
        code = wait_child(pid, what=str(so.parent))
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- stdout ---\n{so.read_text()[-3000:]}\n--- stderr ---\n"
                             f"{se.read_text()[-3000:]}") from None
    return code, so.read_text(), se.read_text()


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``spikerec <argv>`` run in a forked child."""
    return wait_cli(*fork_cli(argv))


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

"""Every benchmark refuses a number option out of its range with one line and exit code 2
(docs/errors.md), before it starts any work."""
import pytest

from spikerec.cli import main


@pytest.mark.parametrize("argv,option", [
    (["bench", "lif", "--T", "0"], "--T"),
    (["bench", "lif", "--reps", "-1"], "--reps"),
    (["bench", "online", "--repeat", "0"], "--repeat"),
    (["bench", "online", "--chunk", "x"], "--chunk"),
    (["bench", "scan", "--channels", "0"], "--channels"),
    (["bench", "data", "--mean-spikes", "inf"], "--mean-spikes"),
    (["bench", "lsc", "--rate", "nan"], "--rate"),
    (["bench", "lsc", "--width", "-4"], "--width"),
])
def test_bench_number_options_are_checked(argv, option, capsys):
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"argument {option}" in err[0], err

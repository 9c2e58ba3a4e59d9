"""``spikerec bench online --processes N``: each method keeps its best time over the processes."""
from spikerec.bench.online import _best_over_processes


def _row(method, s, peak=1.0, T=100):
    return {"net": "lru", "method": method, "T": T, "seq_s": s, "peak_mib": peak, "memory": "x", "step_ms": 0.0,
            "x_bptt": None}


def test_best_over_processes_takes_each_methods_best_and_range():
    runs = [[_row("stream", 0.9, 1.0), _row("bptt", 0.3, 5.0)],
            [_row("stream", 1.1, 1.2), _row("bptt", 0.2, 4.0)]]
    stream, bptt = _best_over_processes(runs)
    assert (stream["seq_s"], stream["seq_s_min"], stream["seq_s_max"], stream["peak_mib"]) == (0.9, 0.9, 1.1, 1.2)
    assert bptt["seq_s"] == 0.2 and abs(stream["x_bptt"] - 4.5) < 1e-12 and bptt["x_bptt"] == 1.0
    assert abs(stream["step_ms"] - 9.0) < 1e-12
    (alone,) = _best_over_processes([[_row("chunked", 0.5)]])
    assert alone["x_bptt"] is None


def test_processes_must_be_positive(capsys):
    from spikerec.cli import main as cli_main

    assert cli_main(["bench", "online", "--processes", "0", "--quick"]) == 2
    assert "argument --processes: must be >= 1, got 0" in capsys.readouterr().err


def test_readout_option_is_checked(capsys):
    from spikerec.cli import main as cli_main

    assert cli_main(["bench", "online", "--readout", "leaky,round", "--quick"]) == 2
    assert "--readout must be a comma list of linear, leaky, got 'leaky,round'" in capsys.readouterr().err
    assert cli_main(["bench", "online", "--methods", "stream_biased", "--quick"]) == 2
    assert "need --readout leaky" in capsys.readouterr().err


def test_leaky_readout_rows_in_one_process():
    """One (net, T) with the leaky readout: the filtered and the cheaper methods run side by side."""
    from spikerec.bench.online import run_one

    rows = run_one("lif", ["stream", "stream_biased", "bptt"], T=8, B=2, H=4, N=4, chunk=4, repeat=1,
                   readout="leaky")
    assert [r["method"] for r in rows] == ["stream", "stream_biased", "bptt"]
    assert all(r["readout"] == "leaky" and r["seq_s"] > 0 for r in rows)

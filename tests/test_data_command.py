"""`spikerec datasets` and the checksum manifest."""
import json
from pathlib import Path

import numpy as np

from spikerec.cli.datasets import KNOWN_SUMS, main, read_manifest
from spikerec.data.fileio import write_idx
from spikerec.data.shd_synth import write_shd_like


def test_manifest_agrees_with_built_in_sums():
    manifest = read_manifest(Path(__file__).resolve().parents[1] / "datasets" / "manifest")
    assert manifest == KNOWN_SUMS


def test_datasets_command_reports_missing_and_available(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    assert main([]) == 0
    out = capsys.readouterr().out
    assert f"data home: {tmp_path}" in out and "zenkelab.org/datasets" in out and "ossci-datasets" in out
    write_shd_like(tmp_path / "shd" / "shd_train.h5", 3, mean_spikes=20)
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "mnist" / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (2, 28, 28), dtype=np.uint8))
    for name in ("train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"):
        write_idx(tmp_path / "mnist" / name, np.zeros(2, np.uint8))
    write_idx(tmp_path / "mnist" / "t10k-images-idx3-ubyte", np.zeros((2, 28, 28), np.uint8))
    assert main(["--json", "--verify"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["datasets"]}
    assert rows["digits"]["state"] == "available"
    assert rows["shd (train)"]["state"] == "available" and "sha256:" in rows["shd (train)"]["detail"]
    assert rows["shd (test)"]["state"] == "missing"
    mn = rows["slmnist / smnist / psmnist"]
    assert mn["state"] == "available" and "CHECKSUM MISMATCH" in mn["detail"]   # fake .gz != published md5

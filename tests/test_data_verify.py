"""`spikerec datasets --verify` opens every file it finds and checks its layout."""
import gzip

import numpy as np

from spikerec.cli.datasets import main
from spikerec.data.fileio import write_idx
from spikerec.data.shd_synth import write_shd_like
from spikerec.data.verify import verify_layout


def test_a_text_file_named_like_shd_is_reported_broken(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    (tmp_path / "shd").mkdir()
    (tmp_path / "shd" / "shd_train.h5").write_text("not hdf5 at all\n")
    write_shd_like(tmp_path / "shd" / "shd_test.h5", 3, mean_spikes=20)
    assert main([]) == 0  # without --verify: only names are looked at
    capsys.readouterr()
    assert main(["--verify"]) == 1
    out = capsys.readouterr().out
    assert "shd (train)                  broken" in out
    assert f"{tmp_path / 'shd' / 'shd_train.h5'}: not a readable HDF5 file" in out
    assert "shd (test)                   available" in out and "SHD layout ok, 3 samples" in out


def test_layout_checks_of_each_kind(tmp_path):
    empty = tmp_path / "shd_test.h5"
    write_shd_like(empty, 0, mean_spikes=20)
    ok, words = verify_layout("shd", empty)
    assert not ok and "holds no samples" in words and str(empty) in words
    good = tmp_path / "good.h5"
    write_shd_like(good, 2, mean_spikes=20)
    gz = tmp_path / "shd_train.h5.gz"
    gz.write_bytes(gzip.compress(good.read_bytes())[:-20])  # truncated download
    ok, words = verify_layout("shd", gz)
    assert not ok and str(gz) in words
    lab = tmp_path / "train-labels-idx1-ubyte"
    write_idx(lab, np.zeros((2, 3), np.uint8))  # labels must be 1-d
    ok, words = verify_layout("mnist", lab)
    assert not ok and "expected labels [N]" in words
    img = tmp_path / "train-images-idx3-ubyte"
    write_idx(img, np.zeros((2, 28, 28), np.uint8))
    assert verify_layout("mnist", img) == (True, "train-images-idx3-ubyte: IDX layout ok, shape (2, 28, 28)")

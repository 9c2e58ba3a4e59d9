"""SSC (Spiking Speech Commands): synthetic files in its layout (no network), the official
train/valid/test files as the splits, every binning preset, the cache, compressed forms, missing
files and `spikerec datasets --verify` (the bad-file battery is shared with SHD in test_data_shd.py)."""
import gzip
import json
import shutil
import zipfile

import numpy as np
import pytest
import torch

from spikerec.cli.datasets import main as datasets_main
from spikerec.data import dataset_info, dataset_options, get_dataset
from spikerec.data.binning import BIN_PRESETS, bin_reference, get_recipe
from spikerec.data.home import DataError, DatasetMissingError
from spikerec.data.shd import arrays_to_dataset
from spikerec.data.shd_file import SSC, read_shd
from spikerec.data.shd_synth import SSC_KEYS, write_shd_like

SIZES = {"train": 30, "valid": 8, "test": 10}


@pytest.fixture(scope="module")
def ssc_home(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    for k, (part, n) in enumerate(SIZES.items()):
        write_shd_like(root / "ssc" / f"ssc_{part}.h5", n, n_classes=35, mean_spikes=100, seed=20 + k,
                       speakers=range(5 * k, 5 * k + 5))
    return root


def test_splits_are_the_official_files_in_every_preset(ssc_home, monkeypatch):
    monkeypatch.setenv("SPIKEREC_DATA", str(ssc_home))
    assert len(SSC_KEYS) == len(set(SSC_KEYS)) == 35
    for preset, r in BIN_PRESETS.items():
        assert dataset_info("ssc", preset=preset) == dict(input_size=r.channels, num_classes=35, steps=r.bins,
                                                          task="classification", dt=r.dt, value=r.value)
        for part, n in SIZES.items():
            arr = read_shd(ssc_home / "ssc" / f"ssc_{part}.h5", hs=SSC)
            ds = get_dataset("ssc", part, preset=preset)
            x, y = ds.tensors()
            assert x.shape == (n, r.bins, r.channels) and torch.equal(y, torch.from_numpy(arr.labels))
            np.testing.assert_array_equal(x.numpy(), bin_reference([arr.sample(i)[0] for i in range(n)],
                                                                   [arr.sample(i)[1] for i in range(n)], r))
    assert int(get_dataset("ssc", "train").labels.max()) > 19  # labels beyond SHD's 20 classes
    over = get_dataset("ssc", "valid", preset="yin250", pool=7, dt=0.005, bins=200)
    assert over.tensors()[0].shape == (8, 200, 100) and over.tensors()[0].max() == 1
    assert sorted(dataset_options("ssc")) == sorted(["preset", "dt", "bins", "pool", "value", "t_start", "root", "file",
                                                     "download", "verify", "cache"])
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['valid_fraction'\].*official validation file"):
        get_dataset("ssc", "train", valid_fraction=0.2)


def test_cache_is_under_ssc_and_hits_equal_misses(ssc_home, monkeypatch):
    monkeypatch.setenv("SPIKEREC_DATA", str(ssc_home))
    first = get_dataset("ssc", "test", preset="dcls10ms")
    assert list((ssc_home / "ssc" / "cache").glob("ssc_test-*.safetensors"))
    again = get_dataset("ssc", "test", preset="dcls10ms")
    assert torch.equal(first.tensors()[0], again.tensors()[0]) and first.info["num_classes"] == 35


def test_gz_and_zip_forms_and_missing_files(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    with pytest.raises(DatasetMissingError) as e:
        get_dataset("ssc", "valid")
    msg = str(e.value)
    assert "ssc_valid.h5.gz" in msg and "zenkelab.org/datasets" in msg and str(tmp_path / "ssc") in msg
    src = write_shd_like(tmp_path / "src.h5", 6, n_classes=35, mean_spikes=80, seed=3)
    d = tmp_path / "ssc"
    d.mkdir()
    with open(src, "rb") as fi, gzip.open(d / "ssc_valid.h5.gz", "wb") as fo:
        shutil.copyfileobj(fi, fo)
    want = arrays_to_dataset(read_shd(src, hs=SSC), get_recipe("zenke100")).tensors()[0]
    assert torch.equal(get_dataset("ssc", "valid").tensors()[0], want)
    with zipfile.ZipFile(d / "ssc_test.h5.zip", "w") as z:
        z.write(src, "ssc_test.h5")
    with pytest.raises(DataError, match=r"ssc_test\.h5\.zip: md5 .* differs from the published a35ff1e9"):
        get_dataset("ssc", "test")
    assert not (d / "ssc_test.h5").exists()
    assert torch.equal(get_dataset("ssc", "test", verify=False).tensors()[0], want)


def test_an_shd_file_in_place_of_ssc_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    write_shd_like(tmp_path / "ssc" / "ssc_train.h5", 4, mean_spikes=30)  # SHD's 20 keys
    with pytest.raises(DataError, match=r"ssc_train\.h5: /extra/keys lists 20 classes, SSC has 35 \(this looks like "
                                        r"the Spiking Heidelberg Digits"):
        get_dataset("ssc", "train")


def test_datasets_command_lists_and_verifies_ssc(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    write_shd_like(tmp_path / "ssc" / "ssc_train.h5", 3, n_classes=35, mean_spikes=20)
    (tmp_path / "ssc" / "ssc_valid.h5").write_text("not hdf5\n")
    assert datasets_main(["--json", "--verify"]) == 1
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["datasets"]}
    assert rows["ssc (train)"]["state"] == "available" and "SSC layout ok, 3 samples" in rows["ssc (train)"]["detail"]
    assert rows["ssc (valid)"]["state"] == "broken" and "not a readable HDF5 file" in rows["ssc (valid)"]["detail"]
    assert rows["ssc (test)"]["state"] == "missing" and "ssc_test.h5.gz" in rows["ssc (test)"]["detail"]

"""SHD: synthetic SHD-format files, binning vs the per-spike reference, cache, splits, bad input, tonic."""
import gzip
import shutil
import zipfile

import h5py
import numpy as np
import pytest
import torch

from spikerec.data import get_dataset, make_loader
from spikerec.data.binning import BIN_PRESETS, BinRecipe, bin_ragged, bin_reference, get_recipe
from spikerec.data.home import DataError, DatasetMissingError
from spikerec.data.shd import arrays_to_dataset, bin_shd_file, speaker_split
from spikerec.data.shd_file import SHD, SSC, read_shd
from spikerec.data.shd_synth import write_shd_like
from spikerec.data.tonic_interop import ToBinnedFrame, events_to_frame, from_tonic, tonic_frame_transform


def _rows(path):
    with h5py.File(path, "r") as f:
        return list(f["spikes/times"][()]), list(f["spikes/units"][()])


@pytest.fixture(scope="module")
def shd_home(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    d = root / "shd"
    write_shd_like(d / "shd_train.h5", 120, mean_spikes=300, seed=1, speakers=range(6), empty=2)
    write_shd_like(d / "shd_test.h5", 40, mean_spikes=300, seed=2, speakers=range(8))
    return root


@pytest.mark.parametrize("times_dtype", ["float16", "float32", "float64"])
def test_binning_equals_per_spike_reference(tmp_path, times_dtype):
    p = write_shd_like(tmp_path / "f.h5", 30, mean_spikes=400, seed=3, empty=3, late_fraction=0.05,
                       unsorted=True, times_dtype=times_dtype)
    t_rows, u_rows = _rows(p)
    assert any(len(t) == 0 for t in t_rows) and max(t.max() for t in t_rows if len(t)) > 1.4
    assert any(np.any(np.diff(t.astype(float)) < 0) for t in t_rows if len(t) > 1)
    arr = read_shd(p)
    recipes = list(BIN_PRESETS.values()) + [BinRecipe(dt=0.0073, bins=90, pool=3, value="binary", t_start=0.05),
                                             BinRecipe(dt=0.02, bins=60, pool=7, value="count")]
    for r in recipes:
        ref = bin_reference(t_rows, u_rows, r)
        x, y = arrays_to_dataset(arr, r).tensors()
        assert x.shape == (30, r.bins, r.channels)
        np.testing.assert_array_equal(x.numpy(), ref, err_msg=str(r))
        # small chunks give the same result as one chunk
        a = bin_ragged(arr.times, arr.units, arr.lengths, r, chunk_spikes=50)
        b = bin_ragged(arr.times, arr.units, arr.lengths, r)
        assert all(np.array_equal(u, v) for u, v in zip(a, b))


def test_synthetic_file_has_shd_layout(tmp_path):
    p = write_shd_like(tmp_path / "s.h5", 10, mean_spikes=100)
    with h5py.File(p) as f:
        assert f["spikes/times"].dtype.metadata["vlen"] == np.float16
        assert f["spikes/units"].dtype.metadata["vlen"] == np.uint16
        assert f["labels"].shape == (10,) and f["extra/speaker"].shape == (10,) and len(f["extra/keys"]) == 20
        for k in ("gender", "age", "body_height"):
            assert f"extra/meta_info/{k}" in f
    arr = read_shd(p)
    assert arr.units.max() < 700 and arr.times.min() >= 0 and arr.labels.max() < 20


def test_cache_hit_equals_miss_and_is_keyed_by_recipe(tmp_path):
    p = write_shd_like(tmp_path / "shd_train.h5", 25, mean_spikes=200, seed=4)
    r = get_recipe("zenke100")
    miss, hit0 = bin_shd_file(p, r)
    hit, hit1 = bin_shd_file(p, r)
    assert (hit0, hit1) == (False, True)
    for name in ("offsets", "index", "values", "labels"):
        assert torch.equal(getattr(miss, name), getattr(hit, name))
    assert torch.equal(miss.extra["speaker"], hit.extra["speaker"])
    assert torch.equal(miss.tensors()[0], hit.tensors()[0])
    other, h = bin_shd_file(p, get_recipe("zenke100", value="binary"))
    assert not h and other.values.max() == 1
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 2
    for f in (tmp_path / "cache").glob("*.safetensors"):  # a corrupt entry is rebuilt
        f.write_bytes(b"garbage")
    again, h = bin_shd_file(p, r)
    assert not h and torch.equal(again.index, miss.index)


def test_failed_cache_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import safetensors.torch

    p = write_shd_like(tmp_path / "shd_train.h5", 10, mean_spikes=100)

    def broken(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.warns(RuntimeWarning, match="disk full"):
        ds, hit = bin_shd_file(p, get_recipe("zenke100"))
    assert len(ds) == 10 and not hit
    assert list((tmp_path / "cache").iterdir()) == []


def test_speaker_split_and_get_dataset(shd_home, monkeypatch):
    monkeypatch.setenv("SPIKEREC_DATA", str(shd_home))
    tr, va, te = (get_dataset("shd", s, preset="dcls10ms") for s in ("train", "valid", "test"))
    assert len(tr) + len(va) == 120 and len(te) == 40 and len(va) > 0
    s_tr, s_va = set(tr.extra["speaker"].tolist()), set(va.extra["speaker"].tolist())
    assert not s_tr & s_va and s_va == set(va.info["valid_speakers"])
    assert 0.03 < len(va) / 120 < 0.35
    full = get_dataset("shd", "train", preset="dcls10ms", valid="none")
    assert len(full) == 120
    v2 = get_dataset("shd", "valid", preset="dcls10ms", valid_speakers=[0, 3])
    assert set(v2.extra["speaker"].tolist()) == {0, 3}
    # the split datasets hold exactly the rows of the full file
    X, Y = full.tensors()
    idx_tr, idx_va, _ = speaker_split(full.extra["speaker"].numpy(), valid_fraction=0.1)
    assert torch.equal(tr.tensors()[0], X[idx_tr]) and torch.equal(va.tensors()[1], Y[idx_va])
    xb, yb = next(iter(make_loader(va, 4, shuffle=False, seed=0)))
    assert xb.shape == (140, 4, 140) and torch.equal(xb, X[idx_va[:4]].transpose(0, 1))
    with pytest.raises(ValueError, match="not in the train file"):
        get_dataset("shd", "valid", valid_speakers=[99])
    with pytest.raises(ValueError, match="valid='none' has no 'valid'"):
        get_dataset("shd", "valid", valid="none")


def test_gz_and_zip_forms(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    src = write_shd_like(tmp_path / "src.h5", 12, mean_spikes=100, seed=5)
    d = tmp_path / "shd"
    d.mkdir()
    with open(src, "rb") as fi, gzip.open(d / "shd_train.h5.gz", "wb") as fo:
        shutil.copyfileobj(fi, fo)
    a = get_dataset("shd", "train", valid="none").tensors()[0]
    assert torch.equal(a, arrays_to_dataset(read_shd(src), get_recipe("zenke100")).tensors()[0])
    with zipfile.ZipFile(d / "shd_test.h5.zip", "w") as z:
        z.write(src, "shd_test.h5")
    with pytest.raises(DataError, match="md5 .* differs from the published"):
        get_dataset("shd", "test")
    assert not (d / "shd_test.h5").exists()
    assert torch.equal(get_dataset("shd", "test", verify=False).tensors()[0], a)


def test_missing_file_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    with pytest.raises(DatasetMissingError) as e:
        get_dataset("shd", "test")
    msg = str(e.value)
    assert "shd_test.h5.gz" in msg and "zenkelab.org/datasets" in msg and str(tmp_path / "shd") in msg
    assert "download=True" in msg


def _h5(path, **arrays):
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            if isinstance(v, list):
                rows = np.empty(len(v), dtype=object)
                for i, r in enumerate(v):
                    rows[i] = r
                f.create_dataset(k, data=rows, dtype=h5py.vlen_dtype(v[0].dtype))
            else:
                f.create_dataset(k, data=v)
    return path


@pytest.mark.parametrize("hs", [SHD, SSC], ids=lambda h: h.name)
def test_bad_files_give_clear_errors(tmp_path, hs):
    """The same battery for SHD and SSC files (same layout; 20 or 35 classes)."""
    read = lambda p: read_shd(p, hs=hs)  # noqa: E731
    good = write_shd_like(tmp_path / "good.h5", 8, mean_spikes=50, n_classes=hs.n_classes)
    assert read(good).labels.max() < hs.n_classes
    raw = good.read_bytes()
    (tmp_path / "trunc.h5").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match=r"trunc\.h5.*(truncated|corrupt)"):
        read(tmp_path / "trunc.h5")
    (tmp_path / "junk.h5").write_bytes(np.random.default_rng(0).bytes(5000))
    with pytest.raises(DataError, match=r"junk\.h5: not a readable HDF5"):
        read(tmp_path / "junk.h5")
    _h5(tmp_path / "other.h5", data=np.zeros(3))
    with pytest.raises(DataError, match=rf"other\.h5: not in the {hs.title} layout.*found top-level keys \['data'\]"):
        read(tmp_path / "other.h5")
    t = [np.array([0.1, 0.2], np.float32)] * 3
    u = [np.array([1, 2], np.uint16)] * 3
    other = SSC if hs is SHD else SHD
    keys = np.array([f"k{i}".encode() for i in range(other.n_classes)])
    _h5(tmp_path / "other_set.h5", **{"spikes/times": t, "spikes/units": u, "labels": np.array([0, 3, 4]),
                                      "extra/keys": keys})
    with pytest.raises(DataError, match=rf"lists {other.n_classes} classes, {hs.title} has {hs.n_classes}.*{other.long_name}"):
        read(tmp_path / "other_set.h5")
    _h5(tmp_path / "lab.h5", **{"spikes/times": t, "spikes/units": u, "labels": np.array([0, hs.n_classes, 3])})
    with pytest.raises(DataError, match=rf"lab\.h5: 1 labels outside 0..{hs.n_classes - 1}, first at sample 1"):
        read(tmp_path / "lab.h5")
    u_bad = [np.array([1, 2], np.uint16), np.array([700, 2], np.uint16), np.array([3, 4], np.uint16)]
    _h5(tmp_path / "unit.h5", **{"spikes/times": t, "spikes/units": u_bad, "labels": np.array([0, 1, 2])})
    with pytest.raises(DataError, match=r"unit\.h5: unit index 700 in sample 1 is outside 0..699"):
        read(tmp_path / "unit.h5")
    u_len = [np.array([1, 2], np.uint16), np.array([1], np.uint16), np.array([3, 4], np.uint16)]
    _h5(tmp_path / "len.h5", **{"spikes/times": t, "spikes/units": u_len, "labels": np.array([0, 1, 2])})
    with pytest.raises(DataError, match="sample 1 has 2 spike times but 1 units"):
        read(tmp_path / "len.h5")
    t_nan = [np.array([0.1, np.nan], np.float32)] * 3
    _h5(tmp_path / "nan.h5", **{"spikes/times": t_nan, "spikes/units": u, "labels": np.array([0, 1, 2])})
    with pytest.raises(DataError, match="not a finite"):
        read(tmp_path / "nan.h5")
    empty = write_shd_like(tmp_path / "empty.h5", 0, n_classes=hs.n_classes)
    with pytest.raises(DataError, match=rf"empty\.h5: the file holds no samples.*an {hs.title} file has"):
        bin_shd_file(empty, get_recipe("zenke100"), cache_dir=tmp_path / "cache", hs=hs)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_tonic_interop(tmp_path):
    from tonic.io import make_structured_array

    p = write_shd_like(tmp_path / "t.h5", 6, mean_spikes=300, seed=6, late_fraction=0.05)
    t_rows, u_rows = _rows(p)
    dtype = np.dtype([("t", int), ("x", int), ("p", int)])
    items = []
    for t, u in zip(t_rows, u_rows):   # tonic's SHD reader: microseconds, polarity 1
        items.append((make_structured_array(t.astype(np.float64) * 1e6, u, 1, dtype=dtype), 3))
    r = get_recipe("zenke100")
    for ev, _ in items:
        ours = events_to_frame(ev, r)
        theirs = tonic_frame_transform(r)(ev.copy())
        assert theirs.shape == (100, 1, 700)
        np.testing.assert_array_equal(ours, theirs[:, 0].astype(np.float32))
        ref = bin_reference([ev["t"] / 1e6], [ev["x"]], BinRecipe(dt=0.014, bins=100))[0]  # µs are whole numbers here
        assert np.abs(ours - ref).sum() <= 2 * np.sum(ev["t"] % 14000 == 0)
    ds = from_tonic(items, "yin250", pool=5)
    x, y = ds.tensors()
    assert x.shape == (6, 250, 140) and x.max() == 1 and torch.all(y == 3)
    np.testing.assert_array_equal(x[2].numpy(), ToBinnedFrame("yin250", pool=5)(items[2][0]))
    with pytest.raises(DataError, match="fields 't'"):
        events_to_frame(np.zeros(3), r)

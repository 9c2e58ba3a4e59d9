"""Exact SHD binning: integer-microsecond bins, stored bin edges in float16/32/64, half-open
window, spikes far past the window, zero-sample files."""
import h5py
import numpy as np
import pytest

from spikerec.data.binning import BIN_PRESETS, BinRecipe, bin_indices, window_report
from spikerec.data.home import DataError
from spikerec.data.shd import arrays_to_dataset, bin_shd_file
from spikerec.data.shd_file import read_shd

DTYPES = ("float16", "float32", "float64")


def _write(path, t_rows, u_rows, labels, times_dtype="float64"):
    """An SHD-layout file from explicit rows (times in seconds, stored in ``times_dtype``)."""
    tdt = np.dtype(times_dtype)
    n = len(labels)
    tr, ur = np.empty(n, dtype=object), np.empty(n, dtype=object)
    for i in range(n):
        tr[i] = np.asarray(t_rows[i], dtype=np.float64).astype(tdt)
        ur[i] = np.asarray(u_rows[i], dtype=np.uint16)
    with h5py.File(path, "w") as f:
        f.create_dataset("spikes/times", data=tr, dtype=h5py.vlen_dtype(tdt))
        f.create_dataset("spikes/units", data=ur, dtype=h5py.vlen_dtype(np.dtype(np.uint16)))
        f.create_dataset("labels", data=np.asarray(labels, dtype=np.uint16))
        f.create_dataset("extra/speaker", data=np.zeros(n, dtype=np.uint16))
    return path


def _edge_rows(recipe: BinRecipe, n: int, seed: int):
    """Spikes exactly on bin edges ``t_start + K dt`` (integer microseconds), K in [-2, bins + 3):
    includes the window end ``K = bins`` and spikes before the window."""
    rng = np.random.default_rng(seed)
    K_rows, u_rows, t_rows = [], [], []
    for _ in range(n):
        m = int(rng.integers(1, 60))
        K = rng.integers(-2, recipe.bins + 3, m)
        K[0] = recipe.bins  # a spike exactly at the window end, which a half-open window drops
        K = K[recipe.t_start_us + K * recipe.dt_us >= 0]  # times are non-negative
        u = rng.integers(0, recipe.n_units, len(K))
        K_rows.append(K), u_rows.append(u)
        t_rows.append((recipe.t_start_us + K * recipe.dt_us) / 1e6)  # the edge, as float64 seconds
    return K_rows, t_rows, u_rows


def _integer_reference(K_rows, u_rows, recipe: BinRecipe) -> np.ndarray:
    """Per spike, integer arithmetic only: the spike on edge K lies in bin K; kept when 0 <= K < bins."""
    out = np.zeros((len(K_rows), recipe.bins, recipe.channels), np.int64)
    for n, (Ks, us) in enumerate(zip(K_rows, u_rows)):
        for K, u in zip(Ks.tolist(), us.tolist()):
            if 0 <= K < recipe.bins:
                out[n, K, u // recipe.pool] += 1
    return np.minimum(out, 1) if recipe.value == "binary" else out


RECIPES = list(BIN_PRESETS.values()) + [BinRecipe(dt=0.0073, bins=90, pool=3, value="binary", t_start=0.05)]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"dt{r.dt_us}us-{r.bins}")
def test_spikes_on_bin_edges_bin_exactly_in_every_dtype(tmp_path, recipe):
    K_rows, t_rows, u_rows = _edge_rows(recipe, 12, seed=recipe.bins)
    ref = _integer_reference(K_rows, u_rows, recipe)
    labels = np.arange(len(K_rows)) % 20
    for dt in DTYPES:
        p = _write(tmp_path / f"edges-{dt}.h5", t_rows, u_rows, labels, dt)
        arr = read_shd(p)
        assert arr.times.dtype == np.dtype(dt)
        x, _ = arrays_to_dataset(arr, recipe).tensors()
        np.testing.assert_array_equal(x.numpy().astype(np.int64), ref, err_msg=f"{dt} {recipe}")


def test_window_end_is_excluded_and_start_included():
    r = BinRecipe(dt=0.014, bins=100)
    for dt in DTYPES:
        t = np.array([0.0, 0.014, 1.386, 1.4], dtype=np.float64).astype(dt)
        k = bin_indices(t, r)
        assert k.tolist() == [0, 1, 99, 100], dt
    # the float64 quotient 1.4 / 0.014 is 99.99999999999999: a float division would keep this spike
    assert np.floor(1.4 / 0.014) == 99


def test_whole_microsecond_times_equal_integer_reference():
    rng = np.random.default_rng(0)
    r = BinRecipe(dt=0.001, bins=1400)
    us = rng.integers(0, 1_500_000, 5000)
    for dt in ("float32", "float64"):  # float32 holds every microsecond below 1.5 s to within 0.5 us
        t = (us / 1e6).astype(dt)
        np.testing.assert_array_equal(bin_indices(t, r), us // 1000)


def test_spikes_far_past_the_window_are_reported_and_dropped(tmp_path):
    r = BIN_PRESETS["zenke100"]
    t_rows = [[0.1, 0.2, 1.5, 3.0, 45.0], [0.5]]  # 1.5 s: just after the window; 3.0 s and 45 s: far past it
    u_rows = [[1, 2, 3, 4, 5], [6]]
    p = _write(tmp_path / "late.h5", t_rows, u_rows, [0, 1])
    with pytest.warns(RuntimeWarning, match=r"late\.h5: 2 spike\(s\) lie at or past 2\.8 s.*dropped"):
        ds, hit = bin_shd_file(p, r, cache_dir=tmp_path / "cache")
    assert not hit and ds.info["dropped_spikes"] == dict(before=0, after=3, far_after=2)
    assert window_report(np.array([1.5, 3.0, 45.0]), r) == dict(before=0, after=3, far_after=2)
    x, _ = ds.tensors()
    assert x.sum().item() == 3  # only the spikes inside the window
    with pytest.warns(RuntimeWarning, match="late.h5"):  # a cache hit reports them again
        ds2, hit = bin_shd_file(p, r, cache_dir=tmp_path / "cache")
    assert hit and ds2.info["dropped_spikes"] == ds.info["dropped_spikes"]


def test_zero_sample_file_is_a_clear_error_and_never_cached(tmp_path):
    p = _write(tmp_path / "shd_test.h5", [], [], [])
    cache = tmp_path / "cache"
    for _ in range(2):
        with pytest.raises(DataError, match=r"shd_test\.h5: the file holds no samples"):
            bin_shd_file(p, BIN_PRESETS["zenke100"], cache_dir=cache)
    assert not cache.exists() or not any(cache.iterdir())


def test_recipe_must_be_whole_microseconds():
    with pytest.raises(ValueError, match="dt must be a whole number of microseconds"):
        BinRecipe(dt=1e-7)
    with pytest.raises(ValueError, match="t_start must be a whole number of microseconds"):
        BinRecipe(t_start=0.0000005)

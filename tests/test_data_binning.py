"""Exact SHD binning: the stored value is the time (to the nearest microsecond, then integers),
stored bin edges in float32/64, float16 near edges, equality with tonic's own ``ToFrame`` as tonic's
users run it, half-open window, spikes far past the window, zero-sample files."""
import h5py
import numpy as np
import pytest

from spikerec.data.binning import BIN_PRESETS, BinRecipe, bin_indices, bin_reference, microseconds, window_report
from spikerec.data.home import DataError
from spikerec.data.shd import arrays_to_dataset, bin_shd_file
from spikerec.data.shd_file import read_shd
from spikerec.data.shd_synth import SHD_KEYS, write_shd_like

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
        f.create_dataset("extra/keys", data=np.array([k.encode() for k in SHD_KEYS]))
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
def test_spikes_on_bin_edges_bin_exactly_in_float32_and_float64(tmp_path, recipe):
    """Exact edges written as float32/float64 land in the bin that starts there; float16 (which cannot
    hold most edges) bins its stored values, which for some of these spikes lie below the edge."""
    K_rows, t_rows, u_rows = _edge_rows(recipe, 12, seed=recipe.bins)
    ref = _integer_reference(K_rows, u_rows, recipe)
    labels = np.arange(len(K_rows)) % 20
    for dt in DTYPES:
        p = _write(tmp_path / f"edges-{dt}.h5", t_rows, u_rows, labels, dt)
        arr = read_shd(p)
        assert arr.times.dtype == np.dtype(dt)
        x, _ = arrays_to_dataset(arr, recipe).tensors()
        x = x.numpy().astype(np.int64)
        if dt == "float16":
            stored = [np.asarray(t, np.float64).astype(np.float16) for t in t_rows]
            np.testing.assert_array_equal(x, bin_reference(stored, u_rows, recipe), err_msg=str(recipe))
            assert not np.array_equal(x, ref)  # float16 moves some edges below themselves
        else:
            np.testing.assert_array_equal(x, ref, err_msg=f"{dt} {recipe}")


def test_window_end_is_excluded_and_start_included():
    r = BinRecipe(dt=0.014, bins=100)
    for dt in ("float32", "float64"):
        t = np.array([0.0, 0.014, 1.386, 1.4], dtype=np.float64).astype(dt)
        k = bin_indices(t, r)
        assert k.tolist() == [0, 1, 99, 100], dt
    # float16 stores 1.386 as 1.3857421875 (1,385,742 µs: bin 98) and 1.4 as 1.400390625 (dropped)
    assert bin_indices(np.array([1.386, 1.4], np.float16), r).tolist() == [98, 100]
    # the float64 quotient 1.4 / 0.014 is 99.99999999999999: a float division would keep this spike
    assert np.floor(1.4 / 0.014) == 99


def test_microseconds_round_the_stored_value_to_nearest_ties_to_even():
    from fractions import Fraction

    # 2^-7 s = 7812.5 µs exactly (a tie, even: 7812); 3 * 2^-7 = 23437.5 (even: 23438)
    for dt in DTYPES:
        assert microseconds(np.array([2**-7, 3 * 2**-7], dt)).tolist() == [7812, 23438], dt
    # float64 values whose exact microseconds lie a hair off a half: the float64 product may round onto the half
    rng = np.random.default_rng(1)
    halves = (rng.integers(0, 1_400_000, 2000) + 0.5) / 1e6
    t = np.concatenate([np.nextafter(halves, 0), halves, np.nextafter(halves, 2), rng.random(2000) * 1.4])
    exact = [round(Fraction(float(v)) * 1_000_000) for v in t]
    assert microseconds(t).tolist() == exact


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


def _clear_of_edges(t_rows, u_rows, grid_us: int):
    """Drop spikes whose stored value lies within 1 µs of a multiple of ``grid_us`` (where tonic's
    truncation and the rounding may part); the stored values are kept bit for bit."""
    keep_t, keep_u = [], []
    for t, u in zip(t_rows, u_rows):
        x = np.mod(t.astype(np.float64) * 1e6, grid_us)
        ok = (x >= 1) & (x <= grid_us - 1)
        keep_t.append(t[ok]), keep_u.append(u[ok])
    return keep_t, keep_u


TONIC_RECIPES = list(BIN_PRESETS.values()) + [BinRecipe(dt=0.0073, bins=90, pool=3, value="binary", t_start=0.05),
                                              BinRecipe(dt=0.0025, bins=400, pool=2, value="count", t_start=0.0001),
                                              BinRecipe(dt=0.02, bins=60, pool=7, value="binary")]


@pytest.mark.filterwarnings("ignore:.*more than a window.*:RuntimeWarning")
@pytest.mark.parametrize("times_dtype", DTYPES)
def test_equal_to_tonic_toframe_as_tonic_users_run_it(tmp_path, times_dtype):
    """SHD-layout files read by ``tonic.datasets.SHD`` with ``transform=tonic.transforms.ToFrame`` of the
    same window give spikerec's frames (tonic's per-unit counts summed over ``pool`` units, clipped for
    ``binary``), every preset and some overrides; every spike lies at least 1 µs from every edge (all
    edges here are multiples of 100 µs). spikerec also equals the stored-value reference on the file."""
    tonic = pytest.importorskip("tonic")
    src = write_shd_like(tmp_path / "src.h5", 12, mean_spikes=300, seed=11, empty=1, late_fraction=0.03,
                         times_dtype=times_dtype)
    with h5py.File(src) as f:
        t_rows, u_rows = list(f["spikes/times"][()]), list(f["spikes/units"][()])
        labels = f["labels"][()]
    t_rows, u_rows = _clear_of_edges(t_rows, u_rows, 100)
    home = tmp_path / "tonic" / "SHD"
    home.mkdir(parents=True)
    p = _write(home / "shd_train.h5", t_rows, u_rows, labels, times_dtype)
    (home / "shd_train.h5.zip").write_bytes(b"")  # tonic looks for its download before reading the .h5
    arr = read_shd(p)
    assert arr.times.dtype == np.dtype(times_dtype) and sum(len(t) for t in t_rows) > 2000
    if times_dtype == "float16":  # spikes stored as the float16 nearest a 1 ms edge but not on it: a rule that took
        us = arr.times.astype(np.float64) * 1e6                    # them for the edge would bin them apart from tonic
        edges = np.rint(us / 1000) * 1000
        assert int(((edges / 1e6).astype(np.float16) == arr.times).sum() - (us == edges).sum()) > 0
    for r in TONIC_RECIPES:
        ours, _ = arrays_to_dataset(arr, r).tensors()
        ours = ours.numpy()
        np.testing.assert_array_equal(ours, bin_reference(t_rows, u_rows, r), err_msg=str(r))
        t0 = r.t_start_us
        frame = tonic.transforms.ToFrame(sensor_size=(700, 1, 1), time_window=r.dt_us, start_time=t0,
                                         end_time=t0 + r.bins * r.dt_us)
        ds = tonic.datasets.SHD(save_to=str(tmp_path / "tonic"), train=True, transform=frame)
        assert len(ds) == len(labels)
        for n in range(len(ds)):
            theirs = np.asarray(ds[n][0]).astype(np.int64)
            if len(t_rows[n]) == 0:  # tonic gives one empty frame for a sample without events
                assert theirs.sum() == 0 and ours[n].sum() == 0
                continue
            theirs = theirs.reshape(r.bins, 700)
            theirs = np.pad(theirs, ((0, 0), (0, r.channels * r.pool - 700))).reshape(r.bins, r.channels, r.pool).sum(2)
            if r.value == "binary":
                theirs = np.minimum(theirs, 1)
            np.testing.assert_array_equal(ours[n], theirs, err_msg=f"sample {n} {r}")

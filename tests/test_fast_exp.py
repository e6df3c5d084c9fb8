"""The vectorised float32 exp against numpy's float64 exp."""

import numba
import numpy as np

from dslide_dask.kernels.fast_exp import exp32


@numba.njit(fastmath={"reassoc", "contract"})
def _exp_all(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = exp32(x[i])
    return out


def test_exp32_is_within_a_float32_rounding_of_exact_over_the_normal_range():
    x = np.linspace(-87.3, 88.0, 2_000_001, dtype=np.float32)
    exact = np.exp(x.astype(np.float64))
    got = _exp_all(x).astype(np.float64)
    assert np.max(np.abs(got / exact - 1)) < 1e-6


def test_exp32_underflows_to_zero_keeps_nan_and_stays_finite_at_the_clamp():
    x = np.array([-np.inf, -1e4, -87.4, 0.0, 88.0, 1e4, np.nan], np.float32)
    got = _exp_all(x)
    assert got[:3].tolist() == [0.0, 0.0, 0.0]
    assert got[3] == 1.0
    assert np.isfinite(got[4:6]).all() and got[5] == got[4]
    assert np.isnan(got[6])

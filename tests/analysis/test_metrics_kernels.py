"""The one-pass kernels of tensor_metrics: the widening is exact, the maxima and counts are numpy's, the sums
follow their documented order."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ascend_emu.kernels import stats as ks


def test_widen16_f64_every_pattern():
    bits = np.arange(65536, dtype=np.uint16)
    for dt, bf16 in ((np.float16, False), (ml_dtypes.bfloat16, True)):
        out = np.empty(65536)
        ks.widen16_f64(bits, out, bf16)
        with np.errstate(invalid="ignore"):
            want = bits.view(dt).astype(np.float64)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(out), nan)
        assert np.array_equal(out[~nan].view(np.uint64), want[~nan].view(np.uint64))


def _numpy_way(d, b, eps, t1, t5):
    """What tensor_metrics computed with numpy before the kernel (d = |n - b|)."""
    b = np.abs(b)
    np.copyto(b, eps, where=b == 0)
    r = d / b
    return float(d.max()), float(r.max()), int(np.count_nonzero(r < t1)), int(np.count_nonzero(r < t5))


def test_pair_stats_maxima_and_counts_match_numpy():
    rng = np.random.default_rng(5)
    for k in (1, 7, 1000, 65536):
        b = rng.standard_normal(k) * 10.0 ** rng.integers(-30, 30, k)
        b[rng.random(k) < 0.1] = 0.0
        b[rng.random(k) < 0.05] *= -0.0
        d = np.abs(b * rng.standard_normal(k) * 1e-3)
        d[rng.random(k) < 0.1] = 0.0
        cases = [(d, b)]
        if k > 3:
            dn = d.copy()
            dn[2] = np.inf
            cases.append((dn, b))
            dn = d.copy()
            dn[1] = np.nan
            cases.append((dn, b))
        for dd, bb in cases:
            for eps in (2.0 ** -23, 2.0 ** -10, 1.0):
                n = bb + dd   # the kernel forms d = |n - b| itself; numpy gets the same d
                with np.errstate(all="ignore"):
                    dk = np.abs(n - bb)
                    want = _numpy_way(dk, bb.copy(), eps, 0.001, 0.005)
                got = ks.pair_stats(n, bb, eps, 0.001, 0.005)[5:]
                for g, w in zip(got, want):
                    assert (g == w and math.copysign(1, g) == math.copysign(1, w)) or (math.isnan(g) and math.isnan(w))


def test_pair_stats_sums_fixed_order():
    """The five sums against exact sums (math.fsum of the float64 products) within float64 accumulation
    error, and the same bits whatever else runs: the order is fixed by the kernel, not by BLAS."""
    rng = np.random.default_rng(9)
    for k in (1, 7, 8, 9, 1000, 65536):
        n = rng.standard_normal(k) * 10.0 ** rng.integers(-3, 3, k)
        b = n + rng.standard_normal(k) * 1e-2
        got = ks.pair_stats(n, b, 2.0 ** -23, 0.001, 0.005)
        d = np.abs(n - b)
        for g, terms in zip(got[:5], (n * n, b * b, n * b, d * d, d)):
            exact = math.fsum(terms)
            assert abs(g - exact) <= k * 2.0 ** -52 * math.fsum(np.abs(terms)) + 1e-300
        lanes = [0.0] * ks.LANES
        for i in range(k):   # the documented order: lane i % LANES, then the lanes in order
            lanes[i % ks.LANES] += float(n[i] * n[i])
        want = 0.0
        for v in lanes:
            want += v
        assert got[0] == want
        assert ks.pair_stats(n.copy(), b.copy(), 2.0 ** -23, 0.001, 0.005) == got

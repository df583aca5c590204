"""Tensor statistics for dumps: one pass, float64 accumulators, non-finite values counted apart."""
import numpy as np
from numba import njit

from .cast import bits16_to_f32


@njit(cache=True)
def finite_stats(x, bits16):
    """(max, min, sum, sum of squares, finite count, nan count, inf count) of a flat array, in float64.

    bits16 = -1: x holds float values; 0: fp16 bit patterns; 1: bf16 bit patterns.
    """
    vmax = -np.inf
    vmin = np.inf
    s = 0.0
    sq = 0.0
    n = 0
    nnan = 0
    ninf = 0
    for i in range(x.size):
        if bits16 < 0:
            v = np.float64(x[i])
        else:
            v = np.float64(bits16_to_f32(np.uint16(x[i]), bits16, 0))
        if v != v:
            nnan += 1
        elif v == np.inf or v == -np.inf:
            ninf += 1
        else:
            if v > vmax:
                vmax = v
            if v < vmin:
                vmin = v
            s += v
            sq += v * v
            n += 1
    return vmax, vmin, s, sq, n, nnan, ninf


@njit(cache=True)
def widen16_f64(x, out, bf16):
    """out[i] = float64 value of the fp16 (bf16 if bf16) bit pattern x[i] (exact)."""
    for i in range(x.size):
        out[i] = np.float64(bits16_to_f32(x[i], bf16, 0))


@njit(cache=True)
def relerr_stats(d, b, eps, t1, t5):
    """(max d, max d/b', count(d/b' < t1), count(d/b' < t5)), b' = |b| or eps where b == 0; d >= 0.

    What numpy's max (NaN propagates), abs, divide and count_nonzero give on the same arrays."""
    maxabs = -np.inf
    maxrel = -np.inf
    nan_abs = False
    nan_rel = False
    c1 = 0
    c5 = 0
    for i in range(d.size):
        v = d[i]
        a = abs(b[i])
        r = v / (eps if a == 0 else a)
        nan_abs |= v != v
        nan_rel |= r != r
        maxabs = max(maxabs, v)
        maxrel = max(maxrel, r)
        c1 += r < t1
        c5 += r < t5
    return (np.nan if nan_abs else maxabs), (np.nan if nan_rel else maxrel), c1, c5

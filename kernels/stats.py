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


@njit(cache=True, nogil=True)
def widen16_f64(x, out, bf16):
    """out[i] = float64 value of the fp16 (bf16 if bf16) bit pattern x[i] (exact)."""
    for i in range(x.size):
        out[i] = np.float64(bits16_to_f32(x[i], bf16, 0))


#: interleaved partial sums of :func:`pair_stats` (element i goes to lane i % LANES)
LANES = 8


@njit(cache=True, nogil=True)
def pair_stats(n, b, eps, t1, t5):
    """One pass over two float64 chunks, d = |n - b|: the sums behind Cosine, EucDist, MeanAbsErr and RMSE,
    and the maxima and counts behind MaxAbsErr, MaxRelativeErr and the two ratios.

    Returns ``(n.n, b.b, n.b, d.d, sum d, max d, max d/b', count(d/b' < t1), count(d/b' < t5))``, b' = |b| or
    ``eps`` where b == 0; the maxima and counts are what numpy's max (NaN propagates), abs, divide and
    count_nonzero give on the same arrays. Each sum is kept in :data:`LANES` interleaved float64 partial sums, added in lane
    order at the end: a fixed order, so the result does not depend on the CPU's vector width, the BLAS
    library or its thread count (the sums are not numpy's pairwise ones; they differ in the last bits).
    """
    snn = np.zeros(LANES)
    sbb = np.zeros(LANES)
    snb = np.zeros(LANES)
    sdd = np.zeros(LANES)
    sd = np.zeros(LANES)
    maxabs = -np.inf
    maxrel = -np.inf
    nan_abs = False
    nan_rel = False
    c1 = 0
    c5 = 0
    m = n.size
    for i0 in range(0, m, LANES):
        for j in range(min(LANES, m - i0)):
            i = i0 + j
            x = n[i]
            y = b[i]
            v = abs(x - y)
            snn[j] += x * x
            sbb[j] += y * y
            snb[j] += x * y
            sdd[j] += v * v
            sd[j] += v
            a = abs(y)
            r = v / (eps if a == 0 else a)
            nan_abs |= v != v
            nan_rel |= r != r
            maxabs = max(maxabs, v)
            maxrel = max(maxrel, r)
            c1 += r < t1
            c5 += r < t5
    tnn = tbb = tnb = tdd = td = 0.0
    for j in range(LANES):
        tnn += snn[j]
        tbb += sbb[j]
        tnb += snb[j]
        tdd += sdd[j]
        td += sd[j]
    return (tnn, tbb, tnb, tdd, td, (np.nan if nan_abs else maxabs), (np.nan if nan_rel else maxrel), c1, c5)

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

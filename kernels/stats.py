"""Tensor statistics for dumps: one pass, float64 accumulators, non-finite values counted apart."""
import numpy as np
from numba import njit

from .cast import bits16_to_f32


@njit(cache=True)
def finite_stats(x):
    """(max, min, sum, sum of squares, finite count, nan count, inf count) of a flat float array, in float64."""
    vmax = -np.inf
    vmin = np.inf
    s = 0.0
    sq = 0.0
    n = 0
    nnan = 0
    ninf = 0
    for i in range(x.size):
        v = np.float64(x[i])
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
def finite_stats_bits16(b, bf16):
    """finite_stats of a flat array of fp16 (bf16=False) or bf16 bit patterns."""
    vmax = -np.inf
    vmin = np.inf
    s = 0.0
    sq = 0.0
    n = 0
    nnan = 0
    ninf = 0
    for i in range(b.size):
        v = np.float64(bits16_to_f32(b[i], bf16, 0))
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

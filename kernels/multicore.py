"""Accumulations split over several AI Cores, combined in a given order (NUMERICS.md section 11).

A reduction split over C cores: core c reduces its chunk ``x[bounds[c]:bounds[c+1]]`` of a row
sequentially from its first element (as :mod:`.reduce` does for a whole row), giving a partial
``p_c``; the partials reach the output, which starts at +0, by atomic adds in the order
``perm`` (one permutation per row): ``acc = ((+0 + p_perm[0]) + p_perm[1]) + ...``, every add
rounded to the accumulator's format. The identity order is not the unsplit sum: each core starts
its chunk from its first element, not from the previous chunk's total. Those kernels
(``reduce_split16``, ``reduce_split_f32``) live in :mod:`.reduce`, whose chunk loop and row driver
they share, and are re-exported here.

Atomic accumulation into rows (UnsortedSegmentSum): ``out[ids[i]] += rows[i]`` for i in
``order``, each add rounded to float32.

16-bit data travels as ``uint16`` patterns. The reductions return the OR of the rounding statuses
(non-zero: a result or a step was Inf or NaN).
"""
from __future__ import annotations

import numpy as np
from numba import njit

# the split reductions share the whole row's chunk loop and driver, so they live there
from .reduce import reduce_split16, reduce_split_f32  # noqa: F401


@njit(cache=True, error_model="numpy")
def combine_f32(partials, perm, out):
    """out = ((+0 + partials[perm[0]]) + partials[perm[1]]) + ..., elementwise in float32."""
    n = out.size
    for i in range(n):
        out[i] = np.float32(0.0)
    for j in range(perm.size):
        p = partials[perm[j]]
        for i in range(n):
            out[i] = out[i] + p[i]


@njit(cache=True, error_model="numpy")
def segment_add_f32(rows, ids, order, out):
    """out[ids[i]] += rows[i] in float32 for i in ``order`` (rows with a negative id dropped)."""
    d = rows.shape[1]
    for t in range(order.size):
        i = order[t]
        s = ids[i]
        if s < 0:
            continue
        for j in range(d):
            out[s, j] = out[s, j] + rows[i, j]

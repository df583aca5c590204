"""Batch norm's float32 passes over (N, H, W, C) arrays of any strides (an NCHW tensor's NHWC view is one):
BNTrainingReduce's and BNTrainingUpdateGrad's per-channel sums, and the per-element chains of BNTrainingUpdate
and BNTrainingReduceGrad, each one pass without the temporaries the numpy formulation makes.

The sums are :mod:`.reduce`'s float32 sums of the element values in row-major order over (n, h, w): a row
starts from its first element, one float32 add per further element; split over cores (``bounds``: chunk
boundaries of the flattened (n, h, w) index; ``perm``: one arrival order per channel), every chunk runs so and
the partials are added to +0 in ``perm`` order; then ``finish32``. A subnormal operand reads as a signed zero
under ``flush``, as :func:`.reduce._elem32` reads it. Every operation is one IEEE float32 operation in the order
the numpy chain writes it, so the bits are the chain's wherever no value is Inf or NaN; the kernels say whether
one was (the caller then takes the numpy path, whose NaN payloads they do not model).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .vector import finish32

_TINY = np.float32(1.1754943508222875e-38)
_MAX = np.float32(3.4028234663852886e38)
FORWARD, BACKWARD, SUM = 0, 1, 2


@njit(cache=True, error_model="numpy")
def _flushed(v, flush):
    """v, a float32 subnormal read as a signed zero if flush."""
    if flush and abs(v) < _TINY:
        return v * np.float32(0.0)
    return v


@njit(cache=True, parallel=True, error_model="numpy")
def bn_sums_f32(mode, x, g, mu, rstd, bounds, perm1, perm2, flush, overflow, subnormal, out1, out2):
    """Per channel c, over (n, h, w) in row-major order: FORWARD out1 = sum x, out2 = sum (x * x); BACKWARD
    out1 = sum g * ((x - mu[c]) * rstd[c]), out2 = sum g; SUM out1 = sum x (BiasAddGrad), out2 = 0 (x, g read
    with subnormals flushed if flush; g unused but BACKWARD). perm1/perm2 (C, chunks): the arrival orders of the two sums' partials (0 columns: unsplit).
    Returns True when every sum is finite."""
    N, H, W, C = x.shape
    nch = bounds.size - 1
    bad = np.zeros(C, dtype=np.int64)
    for c in prange(C):
        p1 = np.empty(nch, dtype=np.float32)
        p2 = np.empty(nch, dtype=np.float32)
        k = 0
        end = bounds[1]
        i = 0
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        m = mu[c]
        r = rstd[c]
        for n in range(N):
            for h in range(H):
                for w in range(W):
                    xv = _flushed(x[n, h, w, c], flush)
                    if mode == FORWARD:
                        v1 = xv
                        v2 = _flushed(xv * xv, flush)
                    elif mode == SUM:
                        v1 = xv
                        v2 = np.float32(0.0)
                    else:
                        gv = _flushed(g[n, h, w, c], flush)
                        v1 = _flushed(gv * ((xv - m) * r), flush)
                        v2 = gv
                    if i == end:            # the next core's chunk
                        p1[k] = a1
                        p2[k] = a2
                        k += 1
                        end = bounds[k + 1]
                    if i == bounds[k]:
                        a1 = v1
                        a2 = v2
                    else:
                        a1 = a1 + v1
                        a2 = a2 + v2
                    i += 1
        p1[k] = a1
        p2[k] = a2
        if perm1.shape[1] == 0:
            t1 = p1[0]
            t2 = p2[0]
        else:
            t1 = np.float32(0.0)
            t2 = np.float32(0.0)
            for j in range(nch):
                t1 = t1 + p1[perm1[c, j]]
                t2 = t2 + p2[perm2[c, j]]
        bad[c] = _finish_pair(t1, t2, overflow, subnormal, out1, out2, c)
    return bad.sum() == 0


@njit(cache=True, error_model="numpy")
def _finish_pair(t1, t2, overflow, subnormal, out1, out2, c):
    """out1[c], out2[c] = the two sums t1, t2 finished as float32 results; their statuses ORed."""
    y1, s1 = finish32(t1, overflow, subnormal)
    y2, s2 = finish32(t2, overflow, subnormal)
    out1[c] = y1
    out2[c] = y2
    return s1 | s2


_CB = 16   # channels side by side in bn_sums_f32_rows: one work item each


@njit(cache=True, parallel=True, error_model="numpy")
def bn_sums_f32_rows(mode, x, g, mu, rstd, bounds, perm1, perm2, flush, overflow, subnormal, out1, out2):
    """:func:`bn_sums_f32`'s sums, the same additions in the same order per channel, with up to 16 channels side by
    side (each element row (n, h, w) adds its channels' values to their running sums at once): for x and g whose
    channels are adjacent in memory (NHWC), where the channel-by-channel loop is one latency-bound add after
    another. Returns True when every sum is finite."""
    N, H, W, C = x.shape
    nch = bounds.size - 1
    bad = np.zeros(C, dtype=np.int64)
    nitem = (C + _CB - 1) // _CB
    for it in prange(nitem):
        c0 = it * _CB
        cw = min(_CB, C - c0)
        p1 = np.empty((nch, _CB), dtype=np.float32)
        p2 = np.empty((nch, _CB), dtype=np.float32)
        a1 = np.zeros(_CB, dtype=np.float32)
        a2 = np.zeros(_CB, dtype=np.float32)
        v1 = np.zeros(_CB, dtype=np.float32)
        v2 = np.zeros(_CB, dtype=np.float32)
        m = mu[c0:c0 + cw]
        r = rstd[c0:c0 + cw]
        k = 0
        end = bounds[1]
        i = 0
        for n in range(N):
            for h in range(H):
                for w in range(W):
                    xs = x[n, h, w, c0:c0 + cw]
                    if mode == FORWARD:
                        for j in range(cw):
                            xv = _flushed(xs[j], flush)
                            v1[j] = xv
                            v2[j] = _flushed(xv * xv, flush)
                    elif mode == SUM:
                        for j in range(cw):
                            v1[j] = _flushed(xs[j], flush)
                            v2[j] = np.float32(0.0)
                    else:
                        gs = g[n, h, w, c0:c0 + cw]
                        for j in range(cw):
                            xv = _flushed(xs[j], flush)
                            gv = _flushed(gs[j], flush)
                            v1[j] = _flushed(gv * ((xv - m[j]) * r[j]), flush)
                            v2[j] = gv
                    if i == end:            # the next core's chunk
                        for j in range(cw):
                            p1[k, j] = a1[j]
                            p2[k, j] = a2[j]
                        k += 1
                        end = bounds[k + 1]
                    if i == bounds[k]:
                        for j in range(cw):
                            a1[j] = v1[j]
                            a2[j] = v2[j]
                    else:
                        for j in range(cw):
                            a1[j] = a1[j] + v1[j]
                            a2[j] = a2[j] + v2[j]
                    i += 1
        for j in range(cw):
            p1[k, j] = a1[j]
            p2[k, j] = a2[j]
        for j in range(cw):
            c = c0 + j
            if perm1.shape[1] == 0:
                t1 = p1[0, j]
                t2 = p2[0, j]
            else:
                t1 = np.float32(0.0)
                t2 = np.float32(0.0)
                for q in range(nch):
                    t1 = t1 + p1[perm1[c, q], j]
                    t2 = t2 + p2[perm2[c, q], j]
            bad[c] = _finish_pair(t1, t2, overflow, subnormal, out1, out2, c)
    return bad.sum() == 0


@njit(cache=True, parallel=True, error_model="numpy")
def bn_apply_f32(mode, x, g, a, b, s, flush, flush_out, out):
    """Per element, c its channel: FORWARD out = a[c] * x + b[c] (BNTrainingUpdate's y); BACKWARD out =
    ((g + a[c] * x) + b[c]) * s[c] (BNTrainingReduceGrad's dx); x, g read with subnormals flushed if flush, the
    result's subnormals flushed if flush_out. Returns True when every result is finite."""
    N, H, W, C = x.shape
    bad = np.zeros(N, dtype=np.int64)
    for n in prange(N):
        nb = 0
        for c in range(C):
            ac = a[c]
            bc = b[c]
            sc = s[c]
            for h in range(H):
                for w in range(W):
                    xv = _flushed(x[n, h, w, c], flush)
                    if mode == FORWARD:
                        y = ac * xv + bc
                    else:
                        y = ((_flushed(g[n, h, w, c], flush) + ac * xv) + bc) * sc
                    nb += not (abs(y) <= _MAX)
                    out[n, h, w, c] = _flushed(y, flush_out)
        bad[n] = nb
    return bad.sum() == 0


@njit(cache=True, parallel=True, error_model="numpy")
def bn_apply_f32_rows(mode, x, g, a, b, s, flush, flush_out, out):
    """:func:`bn_apply_f32`'s chains, the same float32 operations per element, an element row (n, h, w) at a time
    with its channels innermost: for x, g and out whose channels are adjacent in memory (NHWC), where the
    channel-outer loop strides through the tensor once per channel. Returns True when every result is finite."""
    N, H, W, C = x.shape
    bad = np.zeros(N, dtype=np.int64)
    for n in prange(N):
        good = True
        for h in range(H):
            for w in range(W):
                xs = x[n, h, w]
                o = out[n, h, w]
                if mode == FORWARD:
                    for c in range(C):
                        y = a[c] * _flushed(xs[c], flush) + b[c]
                        good &= abs(y) <= _MAX
                        o[c] = _flushed(y, flush_out)
                else:
                    gs = g[n, h, w]
                    for c in range(C):
                        y = ((_flushed(gs[c], flush) + a[c] * _flushed(xs[c], flush)) + b[c]) * s[c]
                        good &= abs(y) <= _MAX
                        o[c] = _flushed(y, flush_out)
        bad[n] = not good
    return bad.sum() == 0

"""Pooling windows over NHWC arrays: the max of each window, padding never selected; MaxPoolGrad's
scatter of each window's gradient to its first maximum (``max_pool_grad_f32``, any strides).

The max of a window is defined here only where it is unique as a bit pattern: when no input is NaN
and no input is -0.0, equal values have equal bits, so the order in which a window is scanned
cannot show. :func:`max_pool_safe` says whether an input qualifies; the wrapper takes another path
for the others (a NaN's payload and the sign of a zero tie then follow that path's order).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_CHUNK = 1 << 15


@njit(cache=True, parallel=True)
def max_pool_safe(bits):
    """True when no float32 bit pattern in bits is a NaN or -0.0 (every window max is then unique)."""
    n = bits.size
    nch = (n + _CHUNK - 1) // _CHUNK
    bad = np.zeros(nch, dtype=np.int32)
    for c in prange(nch):
        k = np.int32(0)
        for i in range(np.uintp(c * _CHUNK), np.uintp(min(n, (c + 1) * _CHUNK))):
            u = bits[i]
            k += 1 if (u == np.uint32(0x80000000) or (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)) else 0
        bad[c] = k
    return bad.sum() == 0


@njit(cache=True, parallel=True)
def max_pool_f32(x, out, kh, kw, sh, sw, pt, pl):
    """out[n, oh, ow, c] = max of x[n, oh*sh - pt + i, ow*sw - pl + j, c] over the i < kh, j < kw inside x."""
    N, H, W, C = x.shape
    _, OH, OW, _ = out.shape
    for w in prange(N * OH):
        n = w // OH
        oh = w % OH
        y0 = max(0, oh * sh - pt)
        y1 = min(H, oh * sh - pt + kh)
        for ow in range(OW):
            x0 = max(0, ow * sw - pl)
            x1 = min(W, ow * sw - pl + kw)
            o = out[n, oh, ow]
            for c in range(np.uintp(C)):
                o[c] = -np.inf
            for y in range(y0, y1):
                for xx in range(x0, x1):
                    r = x[n, y, xx]
                    for c in range(np.uintp(C)):
                        v = r[c]
                        o[c] = v if v > o[c] else o[c]


@njit(cache=True, error_model="numpy")
def _max_pool_grad_plane(x, dy, acc, kh, kw, sh, sw, pt, pl):
    """One (H, W) plane of :func:`max_pool_grad_f32`: each window's winning tap, then the gradients added tap by
    tap (a counting sort of the windows by their winning tap; one tap maps the windows to distinct pixels)."""
    H, W = x.shape
    OH, OW = dy.shape
    win = np.empty(OH * OW, dtype=np.int64)        # the winning tap i * kw + j of window oh * OW + ow
    count = np.zeros(kh * kw + 1, dtype=np.int64)
    for oh in range(OH):
        r0 = oh * sh - pt
        for ow in range(OW):
            c0 = ow * sw - pl
            best = -np.inf
            bt = 0
            first = True
            nan = False
            for i in range(kh):
                r = r0 + i
                for j in range(kw):
                    c = c0 + j
                    v = x[r, c] if (r >= 0 and r < H and c >= 0 and c < W) else -np.inf
                    if v != v:          # the first NaN is the maximum
                        bt = i * kw + j
                        nan = True
                        break
                    if first or v > best:
                        best = v
                        bt = i * kw + j
                        first = False
                if nan:
                    break
            win[oh * OW + ow] = bt
            count[bt + 1] += 1
    for t in range(kh * kw):
        count[t + 1] += count[t]
    order = np.empty(OH * OW, dtype=np.int64)
    for k in range(OH * OW):
        t = win[k]
        order[count[t]] = k
        count[t] += 1
    for m in range(OH * OW):
        k = order[m]
        oh = k // OW
        ow = k % OW
        t = win[k]
        br = oh * sh - pt + t // kw
        bc = ow * sw - pl + t % kw
        if br >= 0 and br < H and bc >= 0 and bc < W:
            acc[br, bc] = acc[br, bc] + dy[oh, ow]


@njit(cache=True, parallel=True, error_model="numpy")
def max_pool_grad_f32(x, dy, acc, kh, kw, sh, sw, pt, pl):
    """acc[n, r, c, ch] += dy[n, oh, ow, ch] at (r, c) the first maximum of window (oh, ow) (taps row-major,
    padding -inf, a NaN the maximum: numpy's argmax), per (n, ch) tap by tap as TBE's MaxPoolGrad adds them (in
    (oh, ow) order within a tap); padding dropped.

    x, dy, acc are (N, H, W, C) float32 views of any strides (an NCHW array transposed is one: no copy);
    acc starts as +0. Each (n, ch) plane is independent, so the plane loop is parallel and the bits do not
    depend on the thread count."""
    N, C = x.shape[0], x.shape[3]
    for p in prange(N * C):
        n = p // C
        ch = p % C
        _max_pool_grad_plane(x[n, :, :, ch], dy[n, :, :, ch], acc[n, :, :, ch], kh, kw, sh, sw, pt, pl)

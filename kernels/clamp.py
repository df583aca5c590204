"""float32 relu and relu6 in one pass, for the vector unit's float32 fast path.

For finite inputs both are exact selections (x > 0 ? x : +0, then capped at 6); a -0 input gives
+0, as the vector unit's kernel does. The kernel also reports whether every input was finite: the
wrapper sends any other input through the full kernel (its overflow and NaN handling).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_CHUNK = 1 << 15


@njit(cache=True, parallel=True)
def relu_f32(x, out, six):
    """out[i] = min(x[i] > 0 ? x[i] : +0, 6 if six); True when every x[i] is finite."""
    n = x.size
    nch = (n + _CHUNK - 1) // _CHUNK
    bad = np.zeros(nch, dtype=np.int32)
    xb = x.view(np.uint32)
    for c in prange(nch):
        k = np.int32(0)
        for i in range(np.uintp(c * _CHUNK), np.uintp(min(n, (c + 1) * _CHUNK))):
            v = x[i]
            k += 1 if (xb[i] & np.uint32(0x7F800000)) == np.uint32(0x7F800000) else 0
            v = v if v > np.float32(0.0) else np.float32(0.0)
            if six:
                v = np.float32(6.0) if v > np.float32(6.0) else v
            out[i] = v
        bad[c] = k
    return bad.sum() == 0

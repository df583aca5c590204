"""What the parallel kernels share: each work item (a chunk of elements) writes its status to
``st[chunk]``, and the kernel returns the OR of them (statuses are bits, so the order of the
work items does not matter)."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def or_all(st):
    """r = st[0] | st[1] | ... as an int64 (0 for an empty array)."""
    r = np.int64(0)
    for c in range(st.size):
        r |= np.int64(st[c])
    return r


@njit(cache=True)
def or_all_or_fail(st):
    """or_all(st), or -1 if a work item gave up (wrote a negative status: a one-pass kernel handing the
    whole op back to its exact path)."""
    r = np.int64(0)
    for c in range(st.size):
        if st[c] < 0:
            return np.int64(-1)
        r |= np.int64(st[c])
    return r

"""What the parallel kernels share: each work item (a chunk of elements) writes its status to
``st[chunk]``, and the kernel returns the OR of them (statuses are bits, so the order of the
work items does not matter)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types


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


# glibc's gettid() (2.30+), called by name: the linker resolves it in the running process, so the compiled
# kernel caches like any other
_gettid = types.ExternalFunction("gettid", types.int32())


@njit(cache=True, parallel=True)
def thread_ids(out):
    """out[i] = the Linux thread id of the Numba thread running iteration i, for out.size == the current
    thread count: with Numba's static split every thread runs exactly one iteration, the calling thread the
    first (the ids of the OpenMP team that runs this thread's parallel kernels)."""
    for i in prange(out.size):
        out[i] = _gettid()

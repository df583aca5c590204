"""The Numba thread count of a replay: one thread for small ops, all of them for the others (results do not depend
on it: fixed chunks and work items, statuses ORed)."""
from __future__ import annotations

import numba

#: an op (or inserted cast) whose largest input has at most this many elements runs its kernels on one
#: thread: the vector kernels split their work into chunks of 32768 elements, so a second thread gets
#: nothing to do, yet the parallel region still waits for it; on cores shared with other processes that
#: wait was a scheduler time slice (a scalar Pow took 5 ms instead of 0.07 ms). Results do not depend
#: on the thread count (fixed chunks and work items, statuses ORed).
SMALL_OP_ELEMENTS = 1 << 15
#: the same limit for the ops of the vector unit and the inserted casts (every op but the cube's): their
#: kernels stream memory at a few ns per element or less, so below a million elements a second thread saved
#: less than its parallel region cost. Measured on the CNN training step (2 vCPUs, medians of 20 steps, runs
#: alternated): 47.8-50.7 ms against 48.2-68.7 ms with the 2^15 limit on a quiet machine; 40.6-44.6 against
#: 50.8-60.8 ms beside another busy process; ResNet50, MobileNetV2 and Transformer replays unchanged.
SMALL_VECTOR_ELEMENTS = 1 << 20


class Threads:
    """The Numba thread count of the replaying thread: one for small ops, all for the others."""

    def __init__(self):
        self.full = self.current = numba.get_num_threads()

    def fit(self, elements: int, limit: int = SMALL_OP_ELEMENTS) -> None:
        want = 1 if elements <= limit else self.full
        if want != self.current:
            numba.set_num_threads(want)
            self.current = want

    def restore(self) -> None:
        self.fit(SMALL_OP_ELEMENTS + 1)

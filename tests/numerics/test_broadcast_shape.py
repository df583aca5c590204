"""numerics.chain.broadcast_shape, the shortcut of np.broadcast_shapes the small ops take: the same shape or
the same ValueError for every combination of up to three shapes of rank 0-3 with dims 0, 1, 2, 3."""
import itertools

import numpy as np
import pytest

from ascend_emu.numerics.chain import broadcast_shape

DIMS = (0, 1, 2, 3)
SHAPES = [s for r in range(4) for s in itertools.product(DIMS, repeat=r)]


def _numpy(shapes):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        return ValueError


def _ours(shapes):
    try:
        return broadcast_shape(shapes)
    except ValueError:
        return ValueError


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_same_as_numpy(n):
    rng = np.random.default_rng(n)
    pairs = list(itertools.product(SHAPES, repeat=min(n, 2)))
    if n == 3:   # every pair with a third shape drawn at random, plus the all-equal triples
        pairs = [p + (SHAPES[rng.integers(len(SHAPES))],) for p in pairs] + [(s, s, s) for s in SHAPES]
    for shapes in pairs:
        shapes = [tuple(s) for s in shapes]
        assert _ours(shapes) == _numpy(shapes), shapes
        got = _ours(shapes)
        assert got is ValueError or type(got) is tuple

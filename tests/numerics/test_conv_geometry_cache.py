"""numerics/conv._conv_geometry is worked out once per hashable (op, shapes, strides, padding, dilations): every key
gives what the uncached computation gives, in any order of calls; lists take the uncached path; errors are raised
every time (never cached); and a convolution's bits do not depend on what was called before."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.errors import AscendEmuError
from ascend_emu.numerics import conv as nconv

SHAPES = [((2, 9, 11, 3), (3, 3, 3, 4)), ((1, 8, 8, 16), (1, 1, 16, 8)), ((2, 9, 11, 3), (2, 3, 3, 4)),
          ((3, 9, 11, 3), (3, 3, 3, 4))]
GEOMS = [((1, 1), "SAME", (1, 1)), ((1, 1), "SAME", (2, 2)), ((2, 2), "SAME", (1, 1)), ((2, 2), "VALID", (1, 1)), ((2, 1), "same", (2, 1)),
         (2, ((1, 0), (0, 2)), 1), ((1, 2, 2, 1), "VALID", [1, 1, 1, 1]), ([2, 2], "SAME", (1, 1)),
         ((np.int64(2), 2), "SAME", (1.0, True)), ((2.0, 2), "SAME", (1, 1)), ((1, 1), [[0, 0], [1, 1], [2, 0], [0, 0]], 1)]


def test_conv_geometry_cache_is_the_computation():
    rng = np.random.default_rng(5)
    cases = [(xs, ws, g) for xs, ws in SHAPES for g in GEOMS]
    for rnd in range(2):
        for i in rng.permutation(len(cases)):
            xs, ws, (s, p, d) = cases[i]
            x, w = np.zeros(xs, np.float16), np.zeros(ws, np.float16)
            try:
                want = nconv._geometry_of("conv2d", xs, ws, s, p, d)
            except AscendEmuError as e:
                with pytest.raises(AscendEmuError, match=str(e)[:20]):
                    nconv._conv_geometry("conv2d", x, w, s, p, d)
                continue
            got = nconv._conv_geometry("conv2d", x, w, s, p, d)
            assert got == want and all(type(v) is int for t in got for u in t for v in (u if isinstance(u, tuple)
                                                                                       else (u,))), (xs, ws, s, p, d)
    assert nconv._geometry_cached.cache_info().hits > 0


def test_conv_geometry_errors_are_not_cached():
    x, w = np.zeros((1, 4, 4, 3), np.float16), np.zeros((5, 5, 3, 2), np.float16)
    for _ in range(2):
        with pytest.raises(AscendEmuError, match="does not fit"):
            nconv._conv_geometry("conv2d", x, w, (1, 1), "VALID", (1, 1))
        with pytest.raises(AscendEmuError, match="must be positive"):
            nconv._conv_geometry("conv2d", x, w, (0, 1), "SAME", (1, 1))
        with pytest.raises(AscendEmuError, match="in-channels"):
            nconv._conv_geometry("conv2d", x, np.zeros((3, 3, 2, 2)), (1, 1), "SAME", (1, 1))
    assert nconv._conv_geometry("conv2d", x, w, (1, 1), "SAME", (1, 1)) == ((1, 1), (1, 1), ((2, 2), (2, 2)), (4, 4))


def test_conv2d_bits_after_other_geometries():
    """The same convolution's bits and status before and after calls with other geometries and Fixpipe modes."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2, 9, 11, 3)) * 3).astype(np.float16)
    x.reshape(-1)[:6] = [np.inf, -np.inf, -0.0, 6e-8, 65504, -65504]
    w = (rng.standard_normal((3, 3, 3, 4))).astype(np.float16)
    first = [nconv.conv2d(x, w, s, p, d, overflow_mode=m) for (s, p, d) in GEOMS[:5] for m in ("saturation", "inf_nan")]
    nconv.conv2d(x[:1], w, (1, 1), "VALID", (1, 1))
    nconv.conv2d(x, w[:2], (2, 2), "SAME", (1, 1), subnormals="flush")
    again = [nconv.conv2d(x, w, s, p, d, overflow_mode=m) for (s, p, d) in GEOMS[:5] for m in ("saturation", "inf_nan")]
    for (a, sa), (b, sb) in zip(first, again):
        assert sa == sb and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))

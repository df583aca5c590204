"""The format API on odd and bad input (issue 45: W5, A1, A2): shapes kept, broadcast views never copied in full,
every bad argument a one-line AscendEmuError. Small arrays: runs in about a second."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import ascend_emu as ae
from ascend_emu import AscendEmuError
from ascend_emu.numerics import lowfloat as lf
from ascend_emu.numerics.hf32 import to_hf32


@pytest.mark.parametrize("x", [np.float32(1.5), np.array(1.5, np.float32), 1.5, np.array(-3.0)])
def test_to_hf32_of_a_0d_array_keeps_its_shape(x):
    """W5: a 0-d input came back with shape (1,)."""
    y, st = to_hf32(x)
    assert y.shape == () and y.dtype == np.float32 and float(y) == float(x) and st == 0


@pytest.mark.parametrize("axis", [2, -3, 5, 1.0, "1", True, None])
def test_mx_values_refuses_an_axis_it_would_wrap(axis):
    """W5: axis 5 of a 2-d array wrapped to axis 1."""
    with pytest.raises(AscendEmuError, match="is not an axis of a 2-d array") as e:
        lf.mx_values(np.ones((2, 32), np.float32), "float8_e4m3fn", axis=axis)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("call,msg", [
    (lambda c: ae.cast(c, "float32", source="hifloat8", rounding="bogus"), "unknown rounding 'bogus'"),
    (lambda c: ae.cast(c, "float32", source="hifloat8", overflow_mode="bogus"), "unknown overflow_mode 'bogus'"),
    (lambda c: ae.cast(c, "float32", source="float8_e4m3fn", keep_nan=True), "not to widening float8_e4m3fn"),
    (lambda c: ae.cast(c, "float32", source="hifloat8", keep_nan="yes"), "keep_nan must be True or False"),
    (lambda c: ae.cast(c.astype(np.float32), "float8_e4m3fn", keep_nan="yes"), "keep_nan must be True or False"),
    (lambda c: ae.cast(c.astype(np.float32), "float8_e4m3fn", keep_nan=[1]), "keep_nan must be True or False"),
])
def test_bogus_arguments_are_refused_when_decoding_too(call, msg):
    """A2: decoding ignored a bogus rounding, overflow_mode or keep_nan."""
    with pytest.raises(AscendEmuError, match=msg) as e:
        call(np.array([1, 2, 3], np.uint8))
    assert "\n" not in str(e.value)


def test_decoding_is_unchanged_by_the_valid_arguments():
    c = np.arange(256, dtype=np.uint8)
    want = ae.cast(c, "float32", source="hifloat8")[0]
    got = ae.cast(c, "float32", source="hifloat8", rounding="round", overflow_mode="saturation")[0]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", ["hifloat8", "float8_e4m3fn", "float4_e2m1fn"])
def test_broadcast_views_are_cast_on_their_distinct_values(fmt):
    """A1: a broadcast view (np.broadcast_to) was copied in full (16 GiB temporaries for a 4 G-element view);
    its distinct values are cast and the result broadcast again, bit for bit the cast of the full array."""
    row = np.linspace(-500, 500, 64, dtype=np.float32)
    view = np.broadcast_to(row, (1 << 16, 64))          # 4 M elements, 256 bytes of data
    # compile (or load) the kernels first: a first compilation's own allocations are not what is measured
    ae.cast(ae.cast(row[:2], fmt)[0], "float32", source=fmt)
    tracemalloc.start()
    codes, st = ae.cast(view, fmt)
    back, _ = ae.cast(codes, "float32", source=fmt)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak                         # a full copy of the view alone is 16 MB
    want, want_st = ae.cast(np.ascontiguousarray(view[:2]), fmt)
    assert codes.shape == view.shape and st == want_st
    np.testing.assert_array_equal(np.asarray(codes[:2]), want)
    np.testing.assert_array_equal(np.asarray(back[-1]), ae.cast(want[0], "float32", source=fmt)[0])


def test_decoding_allocates_no_index_per_code():
    """A1: decoding made an intp copy of the codes (8 bytes a code) before the table lookup."""
    codes = np.random.default_rng(0).integers(0, 256, 1 << 22).astype(np.uint8)    # 4 MB of codes
    tracemalloc.start()
    out = lf.decode(codes, "hifloat8")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < out.nbytes + (12 << 20), peak          # the float32 result and one chunk's index, not 32 MB more
    want = np.concatenate([lf.decode(codes[i:i + 4096], "hifloat8") for i in range(0, codes.size, 4096)])
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))

"""A replay's store of shared operand values (numerics/shared.py): a layer's forward Conv2D, its Conv2DBackpropFilter
and Conv2DBackpropInput on the same x / dy give, with the store open, the bits and status they give without it,
and the store is really used (the padded / planar x and the NaN tests made once). The layers of the benchmark CNN
(3 channels at stride 1: planar x; 16 channels at stride 2: the padded x the gather reads), NaN and Inf in x or dy,
float32 x (rounded on the way in, with status), flushed subnormals."""
from __future__ import annotations

import numpy as np
import pytest

from ascend_emu.numerics import shared
from ascend_emu.numerics.conv import _pads, conv2d
from ascend_emu.numerics.conv_grad import conv2d_backprop_filter, conv2d_backprop_input

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")


def _layer(x, w, dy, stride, subnormals):
    kw = dict(operand_dtype="float16", out_dtype="float16", subnormals=subnormals)
    KH, KW = w.shape[:2]
    pads = _pads("SAME", x.shape[1], x.shape[2], KH, KW, stride, stride, 1, 1)
    return [conv2d(x, w, (stride, stride), "SAME", **kw),
            conv2d_backprop_filter(x, dy, (KH, KW), (stride, stride), pads, **kw),
            conv2d_backprop_input(dy, w, (stride, stride), pads, **kw)]


def _same(a, b):
    for (ya, sa), (yb, sb) in zip(a, b):
        assert ya.dtype == yb.dtype and ya.shape == yb.shape and sa == sb
        assert np.array_equal(np.asarray(ya).view(np.uint16), np.asarray(yb).view(np.uint16))


@pytest.mark.parametrize("C, CO, stride", [(3, 16, 1), (16, 32, 2)])
@pytest.mark.parametrize("case", ["plain", "nan_x", "inf_dy", "nan_dy", "float32_x", "flush"])
def test_shared_operands_same_bits(C, CO, stride, case):
    rng = np.random.default_rng(C * 10 + stride)
    N, H = 2, 32
    x = rng.standard_normal((N, H, H, C)).astype(np.float16)
    w = (rng.standard_normal((3, 3, C, CO)) * 0.2).astype(np.float16)
    OH = -(-H // stride)
    dy = rng.standard_normal((N, OH, OH, CO)).astype(np.float16)
    subnormals = "keep"
    if case == "nan_x":
        x[1, 5, 7, 0] = np.nan
    elif case == "inf_dy":
        dy[0, 3, 2, 1] = np.inf
    elif case == "nan_dy":
        dy[1, 0, 0, 0] = -np.nan
    elif case == "float32_x":
        x = (rng.standard_normal((N, H, H, C)) * 3e4).astype(np.float32)   # some round to Inf in fp16
    elif case == "flush":
        x[0, :4] = np.float16(3e-6)   # fp16 subnormals
        subnormals = "flush"
    plain = _layer(x, w, dy, stride, subnormals)
    store = shared.Store()
    token = shared.begin(store)
    try:
        kept = _layer(x, w, dy, stride, subnormals)
        again = _layer(x, w, dy, stride, subnormals)   # every value from the store now
    finally:
        shared.end(token)
    _same(plain, kept)
    _same(plain, again)
    assert not shared.active()
    kinds = {k[0] for _, values in store.entries.values() for k in values}
    assert "any nan" in kinds
    if case in ("plain", "flush") and x.dtype == np.float16:
        # the forward convolution's x operand made once for the layer's filter gradient too
        assert ("planar" if C < 16 else "padded") in kinds


def test_no_store_builds_every_time():
    calls = []
    a = np.zeros(3)
    for _ in range(2):
        shared.shared(a, ("k",), lambda: calls.append(1))
    assert len(calls) == 2


def test_store_keys_by_array_and_key():
    a, b = np.zeros(3), np.zeros(3)
    store = shared.Store()
    token = shared.begin(store)
    try:
        assert shared.shared(a, ("k",), lambda: 1) == 1
        assert shared.shared(a, ("k",), lambda: 2) == 1
        assert shared.shared(b, ("k",), lambda: 3) == 3      # equal bits, another array: its own entry
        assert shared.shared(a, ("j",), lambda: 4) == 4
        assert shared.shared(a, ("k",), lambda: 5, usable=lambda v: v > 1) == 5   # refused: rebuilt, replaced
        assert shared.shared(a, ("k",), lambda: 6) == 5
    finally:
        shared.end(token)


def test_entries_die_with_their_array_and_bytes_are_bounded(monkeypatch):
    store = shared.Store()
    token = shared.begin(store)
    try:
        a = np.zeros(10)
        buf = shared.shared(a, ("buf",), lambda: (np.ones(100, np.float32), 0))
        assert store.nbytes == 400 and shared.shared(a, ("buf",), lambda: None) is buf
        del a, buf      # the tensor released: its derived buffer goes with it
        assert store.entries == {} and store.nbytes == 0
        monkeypatch.setattr(shared, "LIMIT_BYTES", 1000)
        b = np.zeros(10)
        big = shared.shared(b, ("big",), lambda: np.ones(300, np.float32))   # 1200 bytes: built, not kept
        assert store.nbytes == 0 and shared.shared(b, ("big",), lambda: "again") == "again"
        assert big.size == 300
    finally:
        shared.end(token)

"""MaxPool's window kernel (kernels/pool.py) against numpy's max over the sliding windows, bit for bit.

The kernel runs only on inputs without NaN and -0.0 (where a window's max is one bit pattern);
inputs with them take numpy's path. Both must give the bits of the numpy formulation the op had
before the kernel, status included, for every compute dtype and overflow mode; and the chain
operands of fused ops widen 16-bit floats with numpy's bits (NaN payloads included).
"""
import numpy as np
import pytest

from ascend_emu.numerics.policy import bfloat16
from ascend_emu.ops import OPS, OpContext
from ascend_emu.ops._util import finish
from ascend_emu.ops.fused_ops import _f32
from ascend_emu.ops.nn_ops import _windows
from ascend_emu.kernels import pool as kpool

VALUES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan, 65504.0, -65504.0, 7e4], np.float32)


def _numpy_max_pool(x, ctx, ksize, strides, padding):
    """The op as it was: numpy's max over -inf padded windows, rounded once by ``finish``."""
    v, _ = _windows(x.astype(np.float32), ksize, strides, padding, -np.inf)
    return finish(ctx, v.max(axis=(-1, -2)))


def _inputs():
    rng = np.random.default_rng(7)
    for trial in range(120):
        dt = (np.float16, np.float32, bfloat16)[trial % 3]
        shape = tuple(int(v) for v in (rng.integers(1, 3), rng.integers(1, 10), rng.integers(1, 10),
                                       rng.integers(1, 18)))
        kind = trial % 4
        if kind == 0:
            x = rng.standard_normal(shape)
        elif kind == 1:     # many ties
            x = rng.integers(-2, 3, shape).astype(np.float64)
        elif kind == 2:     # NaN, signed zeros, infinities
            x = rng.choice(VALUES, shape)
        else:               # infinities and overflow of fp16 without NaN or -0
            x = rng.choice(VALUES[[0, 2, 3, 5, 6, 8, 9, 10]], shape)
        k = tuple(int(v) for v in rng.integers(1, 4, 2))
        s = tuple(int(v) for v in rng.integers(1, 3, 2))
        with np.errstate(over="ignore"):
            yield trial, x.astype(np.float32).astype(dt), k, s


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_max_pool_matches_numpy_windows(padding):
    fast = 0
    for trial, x, k, s in _inputs():
        if padding == "VALID" and (x.shape[1] < k[0] or x.shape[2] < k[1]):
            continue
        attrs = dict(ksize=[1, *k, 1], strides=[1, *s, 1], padding=padding)
        fast += bool(kpool.max_pool_safe(np.asarray(x, np.float32).reshape(-1).view(np.uint32)))
        for dtype in ("float16", "float32", "bfloat16"):
            for mode in ("inf_nan", "saturation"):
                got_ctx, want_ctx = OpContext(dtype=dtype, overflow_mode=mode), OpContext(dtype=dtype, overflow_mode=mode)
                got = OPS["MaxPool"](x, ctx=got_ctx, **attrs)[0]
                want = _numpy_max_pool(x, want_ctx, **attrs)
                assert got.dtype == want.dtype and got.shape == want.shape, (trial, dtype)
                assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (trial, padding, dtype, mode)
                assert got_ctx.status == want_ctx.status, (trial, padding, dtype, mode)
    assert fast > 40    # the kernel really ran on most inputs


def test_max_pool_safe_flags_nan_and_negative_zero():
    bits = lambda *v: np.array(v, np.float32).view(np.uint32)  # noqa: E731
    assert kpool.max_pool_safe(bits(0.0, 1.0, -1.0, np.inf, -np.inf))
    assert not kpool.max_pool_safe(bits(0.0, -0.0))
    assert not kpool.max_pool_safe(bits(1.0, np.nan))
    assert not kpool.max_pool_safe(np.array([1, 0x7F800001], np.uint32))    # a signalling NaN


def test_max_pool_kernel_skips_padding():
    x = np.full((1, 2, 2, 1), -np.inf, np.float32)
    out = np.empty((1, 2, 2, 1), np.float32)
    kpool.max_pool_f32(x, out, 3, 3, 1, 1, 1, 1)
    assert (out == -np.inf).all()
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1) - 20
    kpool.max_pool_f32(x, out, 3, 3, 2, 2, 1, 1)
    assert out.reshape(-1).tolist() == [-15.0, -13.0, -7.0, -5.0]


@pytest.mark.parametrize("dtype", [np.float16, bfloat16])
def test_chain_operands_widen_with_numpy_bits(dtype):
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype).reshape(256, 256)
    got = _f32(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert np.array_equal(got.view(np.uint32), np.asarray(x, dtype=np.float32).view(np.uint32))
    y = np.ones(3, np.float32)
    assert _f32(y) is y or np.array_equal(_f32(y), y)

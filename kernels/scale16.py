"""The float32 products of an fp16 tensor's widening and one float32 value, in one pass.

Under a mixed-precision policy the loss scale's unscaling ``Mul(gradient, 1 / scale)`` computes in float32 on an fp16
weight gradient: the device inserts a Cast fp16 -> float32 (exact) in front of it, and the Mul is one IEEE float32
product per element. Run as two ops, that is a pass writing a float32 copy, a pass multiplying it and a third testing
the products for Inf / NaN (the fast path's check; a non-finite product takes the vector op, which applies the
overflow mode). Here each element is widened (``cast.f16_bits_to_f32``, the cast kernels' exact widening), multiplied
and tested in one pass (by the CPU's conversion where LLVM has one, ``cast.HW_HALF``: exact on every finite
pattern, and a non-finite one makes a non-finite product, which the caller discards); the product is the same IEEE float32 multiplication numpy's float32 ``multiply`` performs.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .cast import HW_HALF, f16_bits_to_f32, f16_to_f32_hw


@njit(cache=True, error_model="numpy")
def widen_mul_f32(b, s, out):
    """out[i] = float32(fp16 bits b[i]) * s for the flat uint16 array b, float32 s, flat float32 out; returns
    True when every product is finite (else out holds them all, to be discarded by the caller)."""
    bad = np.uint32(0)
    for i in range(b.size):
        r = f16_bits_to_f32(b[i]) * s
        out[i] = r
        # r - r is 0 for a finite r, NaN for Inf or NaN
        bad |= np.uint32((r - r) != np.float32(0.0))
    return bad == 0


@njit(cache=True, error_model="numpy")
def _widen_mul_f32_hw(b, s, out):
    """widen_mul_f32 by the CPU's fp16 -> float32 conversion (HW_HALF hosts only)."""
    bad = np.uint32(0)
    for i in range(b.size):
        r = f16_to_f32_hw(np.uint16(b[i])) * s
        out[i] = r
        bad |= np.uint32((r - r) != np.float32(0.0))
    return bad == 0


def widen_mul(b, s, out) -> bool:
    """:func:`widen_mul_f32` (b: flat uint16 fp16 bits, s: float32, out: flat float32), by the CPU's conversion on a
    HW_HALF host; whether every product is finite."""
    return bool((_widen_mul_f32_hw if HW_HALF else widen_mul_f32)(b, s, out))

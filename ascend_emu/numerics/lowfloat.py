"""The Ascend 950's 8- and 4-bit formats: HiFloat8, FP8 E4M3FN / E5M2, FP4 E2M1 / E1M2 and the E8M0 MX scale.

Values travel as integer codes in uint8 arrays (FP4: one code per byte, in the low 4 bits). :func:`encode` rounds
float32, float16 or bfloat16 values as the 950's vector Cast does; :func:`decode` widens codes exactly to float32
(both from :mod:`.lowcodes`); :func:`matmul_lowfloat` and :func:`mx_matmul` run the cube on them,
:func:`mx_quantize` makes MX blocks (NUMERICS.md section 14 for every rule and its source; the kernels are
``kernels/lowfloat.py``).
"""
from __future__ import annotations

import numpy as np

from . import policy as config
from .cube import matmul as _cube_matmul
from .lowcodes import LOW_FORMATS, decode, encode, low_format  # noqa: F401
from ..errors import AscendEmuError
from ..kernels import lowfloat as _kl


def _codes_2d(c, fmt, what: str) -> np.ndarray:
    v = decode(c, fmt)
    if v.ndim != 2:
        raise AscendEmuError(f"{what} must be 2-D, got shape {v.shape}")
    return v


def matmul_lowfloat(a_codes, b_codes, a_fmt, b_fmt, model=None, overflow_mode="inf_nan") -> np.ndarray:
    """C = A @ B on the 950's cube for HiF8 x HiF8 or any pair of E4M3FN / E5M2: every code widened exactly to
    float16 (each of these values is a float16), then the fp16 cube model (exact products, float32 accumulation
    as ``model`` says); the float32 accumulator is returned."""
    if (a_fmt, b_fmt) not in config.CUBE_LOW_PAIRS:
        raise AscendEmuError(f"the 950's cube multiplies hifloat8 x hifloat8 or float8_e4m3fn/float8_e5m2 pairs, "
                             f"not {a_fmt!r} x {b_fmt!r} (FP4 goes through mx_matmul)")
    a = _codes_2d(a_codes, a_fmt, "a_codes").astype(np.float16)
    b = _codes_2d(b_codes, b_fmt, "b_codes").astype(np.float16)
    out, _ = _cube_matmul(a, b, operand_dtype="float16", out_dtype="float32", overflow_mode=overflow_mode,
                          model=model)
    return out


def _block_exponents(amax: np.ndarray) -> np.ndarray:
    """floor(log2(amax)) per block (float32 amax > 0 finite), from its E8M0 truncation (clamped at -127)."""
    codes = np.empty(amax.size, dtype=np.uint8)
    _kl.encode_f32(np.ascontiguousarray(amax, dtype=np.float32).reshape(-1).view(np.uint32), codes, _kl.E8M0,
                   _kl.TRUNC, config.OVERFLOW_MODES["saturation"], False, False)
    return codes.astype(np.int64).reshape(amax.shape) - 127


def mx_quantize(x_f32, elem_fmt, axis=-1, rounding=None):
    """OCP MX v1.0 block quantization along ``axis``: per block of 32 elements, the E8M0 scale
    X = 2^(floor(log2(amax)) - emax_elem) (clamped to 2^-127..2^127; a block holding Inf or NaN gets the NaN scale
    0xFF, an all-zero block 2^-127), and the elements x / X cast to ``elem_fmt`` by :func:`encode` (saturation,
    the format's default rounding unless ``rounding``). Returns (codes like x, scales with axis length / 32)."""
    f = low_format(elem_fmt)
    if not f.mx_element:
        mx = [n for n, g in config.LOW_FORMATS.items() if g.mx_element]
        raise AscendEmuError(f"MX elements are {', '.join(mx)}; got {elem_fmt!r}")
    x = np.asarray(x_f32)
    if x.dtype != np.float32:
        raise AscendEmuError(f"mx_quantize takes float32 values, got dtype {x.dtype}")
    if x.ndim == 0:
        raise AscendEmuError("mx_quantize needs an array with the blocked axis")
    ax = axis % x.ndim if -x.ndim <= axis < x.ndim else None
    if ax is None:
        raise AscendEmuError(f"axis {axis} is out of range for shape {x.shape}")
    K = x.shape[ax]
    if K % config.MX_BLOCK:
        raise AscendEmuError(f"the blocked axis has length {K}, not a multiple of {config.MX_BLOCK}")
    xm = np.moveaxis(x, ax, -1)
    blocks = xm.reshape(xm.shape[:-1] + (K // config.MX_BLOCK, config.MX_BLOCK)).astype(np.float64)
    finite = np.isfinite(blocks).all(axis=-1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(blocks), blocks, 0.0)).max(axis=-1), 0.0)
    shared = np.where(amax > 0, _block_exponents(amax.astype(np.float32)) - f.emax, -127)
    shared = np.clip(shared, -127, 127)
    scales = np.where(finite, shared + 127, 0xFF).astype(np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):   # exact: a power-of-two scaling (Inf/NaN blocks unscaled)
        scaled = np.ldexp(blocks, -np.where(finite, shared, 0)[..., None]).astype(np.float32)
    codes, _ = encode(scaled.reshape(xm.shape), elem_fmt, rounding=rounding, overflow_mode="saturation")
    return np.moveaxis(codes, -1, ax), np.moveaxis(scales, -1, ax)


def mx_values(x, elem_fmt, axis=-1, rounding=None) -> np.ndarray:
    """float32 values of ``x`` after MX block quantization along ``axis`` (:func:`mx_quantize`): each element times
    its block's scale, as the cube forms its operands (exact unless it leaves float32's range: then +-Inf or a
    float32 subnormal's rounding). An axis whose length is not a multiple of 32 gets a zero-padded last block
    (zeros change no block maximum). The replay's ``cube_mx`` what-if rounds a matmul's operands with this."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise AscendEmuError("mx_values needs an array with the blocked axis")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
        raise AscendEmuError(f"mx_values: axis {axis!r} is not an axis of a {x.ndim}-d array; give one in "
                             f"{-x.ndim}..{x.ndim - 1}")
    ax = int(axis) % x.ndim
    k = x.shape[ax]
    pad = (-k) % config.MX_BLOCK
    if pad:
        x = np.pad(x, [(0, pad if d == ax else 0) for d in range(x.ndim)])
    codes, scales = mx_quantize(x, elem_fmt, ax, rounding)
    scale = np.repeat(decode(scales, "float8_e8m0").astype(np.float64), config.MX_BLOCK, axis=ax)
    with np.errstate(over="ignore", invalid="ignore"):
        out = (decode(codes, elem_fmt).astype(np.float64) * scale).astype(np.float32)
    return np.take(out, np.arange(k), axis=ax) if pad else out


def mx_matmul(a_codes, a_scales, b_codes, b_scales, a_fmt, b_fmt, model=None, overflow_mode="inf_nan") -> np.ndarray:
    """C = (scaleA x A)(scaleB x B) as CANN's MmadMx: A (M, K) codes with scaleA (M, K/32) E8M0 codes, B (K, N)
    with scaleB (K/32, N); every element times its block's scale as a float32 operand (exact: at most 4
    significant bits times a power of two), then the float32 cube model (products exact, float32 accumulation)."""
    for fmt in (a_fmt, b_fmt):
        if not low_format(fmt).mx_element:
            mx = [n for n, g in config.LOW_FORMATS.items() if g.mx_element]
            raise AscendEmuError(f"MX elements are {', '.join(mx)}; got {fmt!r}")
    a = _codes_2d(a_codes, a_fmt, "a_codes").astype(np.float64)
    b = _codes_2d(b_codes, b_fmt, "b_codes").astype(np.float64)
    sa = _codes_2d(a_scales, "float8_e8m0", "a_scales").astype(np.float64)
    sb = _codes_2d(b_scales, "float8_e8m0", "b_scales").astype(np.float64)
    M, K = a.shape
    if b.shape[0] != K or K % config.MX_BLOCK:
        raise AscendEmuError(f"mx_matmul: a is {a.shape} and b is {b.shape}; K must agree and be a multiple of "
                             f"{config.MX_BLOCK}")
    nb = K // config.MX_BLOCK
    if sa.shape != (M, nb) or sb.shape != (nb, b.shape[1]):
        raise AscendEmuError(f"mx_matmul: scales must be ({M}, {nb}) and ({nb}, {b.shape[1]}), got {sa.shape} "
                             f"and {sb.shape}")
    with np.errstate(invalid="ignore"):
        av = a * np.repeat(sa, config.MX_BLOCK, axis=1)
        bv = b * np.repeat(sb, config.MX_BLOCK, axis=0)
    a32, b32 = av.astype(np.float32), bv.astype(np.float32)
    for v, v32, what in ((av, a32, "a"), (bv, b32, "b")):
        fin = np.isfinite(v)
        if not np.array_equal(v32[fin].astype(np.float64), v[fin]):
            raise AscendEmuError(f"mx_matmul: a scaled element of {what} lies outside float32's exact range "
                                 "(scale too large or too small for its elements)")
    out, _ = _cube_matmul(a32, b32, operand_dtype="float32", out_dtype="float32", overflow_mode=overflow_mode,
                          model=model)
    return out


__all__ = ["LOW_FORMATS", "decode", "encode", "matmul_lowfloat", "mx_matmul", "mx_quantize", "mx_values"]

"""Slow, obvious oracle of the cube unit: one Python loop per output element.

Written from the model's description in NUMERICS.md section 3, not from the kernels:
fp32 additions are done in float64 and rounded once to float32 (correct for + because
53 >= 2*24 + 2, so the double rounding is innocuous), products of two operands are exact
in float64 and rounded once to float32, and the aligned block FMA is done with
``fractions.Fraction``. Nothing here imports ascend_emu's kernels.
"""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np

FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)


def f32(x: float) -> float:
    """x rounded to the nearest float32 (ties to even), as a Python float."""
    with np.errstate(all="ignore"):
        return float(np.float32(x))


def add32(x: float, y: float) -> float:
    """IEEE fp32 addition x + y (round to nearest even)."""
    return f32(float(x) + float(y))


def mul32(x: float, y: float) -> float:
    """fp32 product: exact in float64 for 16-bit (and 24-bit) operands, then one rounding."""
    return f32(float(x) * float(y))


def tree_total(products, block_size):
    """Sum a block by a balanced binary tree: pad with +0 to a power of two, add adjacent pairs per level."""
    leaves = 1
    while leaves < block_size:
        leaves *= 2
    level = list(products) + [0.0] * (leaves - len(products))
    while len(level) > 1:
        level = [add32(level[2 * i], level[2 * i + 1]) for i in range(len(level) // 2)]
    return level[0]


def floor_log2(v: Fraction) -> int:
    """The integer e with 2**e <= v < 2**(e + 1), for a positive rational v."""
    e = v.numerator.bit_length() - v.denominator.bit_length()
    while Fraction(2) ** e > v:
        e -= 1
    while Fraction(2) ** (e + 1) <= v:
        e += 1
    return e


def round_fraction_to_f32(v: Fraction, mode: str) -> float:
    """Round the exact rational v to float32 by 'rne' or 'truncate'; a result of 2**128 or more is Inf."""
    if v == 0:
        return 0.0
    sign = -1.0 if v < 0 else 1.0
    mag = abs(v)
    quantum = Fraction(2) ** max(floor_log2(mag) - 23, -149)
    n = math.floor(mag / quantum)
    rest = mag / quantum - n
    if mode == "rne" and (rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1)):
        n += 1
    r = n * quantum
    if r >= Fraction(2) ** 128:
        return sign * math.inf
    return sign * float(r)


def aligned_sum(acc: float, products, extra_bits: int, normalize: str) -> float:
    """Khattak-Mikaitis block FMA: align {acc, products} to the largest exponent, truncate, add exactly, round."""
    terms = [acc] + list(products)
    if any(math.isnan(t) for t in terms):
        return math.nan
    infs = {t for t in terms if math.isinf(t)}
    if len(infs) == 2:
        return math.nan
    if infs:
        return infs.pop()
    nonzero = [Fraction(t) for t in terms if t != 0]
    if not nonzero:
        return 0.0
    emax = floor_log2(max(abs(t) for t in nonzero))
    unit = Fraction(2) ** (emax - 23 - extra_bits)
    total = sum(int(t / unit) for t in nonzero)  # int() truncates toward zero: magnitude truncation
    if total == 0:
        return 0.0
    return round_fraction_to_f32(total * unit, normalize)


def dot(avals, bvals, bias: float, block_size=16, block_sum="tree", extra_bits=3, normalize="truncate") -> float:
    """fp32 accumulator after the K accumulation of sum_k a_k b_k starting from bias, under the block model."""
    prods = [mul32(a, b) for a, b in zip(avals, bvals)]
    acc = f32(bias)
    if block_sum == "sequential":
        for p in prods:
            acc = add32(acc, p)
        return acc
    for start in range(0, len(prods), block_size):
        block = prods[start:start + block_size]
        if block_sum == "tree":
            acc = add32(acc, tree_total(block, block_size))
        else:
            acc = aligned_sum(acc, block, extra_bits, normalize)
    return acc


def model_kwargs(model) -> dict:
    if model is None:
        return {}
    return dict(block_size=model.block_size, block_sum=model.block_sum, extra_bits=model.extra_bits,
                normalize=model.normalize)


# ---------------------------------------------------------------- operand and output conversions

DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


def operand(x, dtype: str, overflow_mode="inf_nan", subnormals="keep"):
    """(values as float64, status): x rounded to the operand dtype (nearest even) unless already of it."""
    x = np.asarray(x)
    t = DTYPES[dtype]
    status = 0
    if x.dtype == np.dtype(t):
        v = x.astype(np.float64)
    elif dtype == "float32":
        v = x.astype(np.float64).astype(np.float32).astype(np.float64)
    else:
        x64 = x.astype(np.float64)
        with np.errstate(all="ignore"):
            v = x64.astype(t).astype(np.float64)  # one rounding from float64 (float32 inputs are exact in it)
        big = float(ml_dtypes.finfo(t).max)
        if (~np.isfinite(x64)).any():
            status |= 0x20
        overflowed = np.isfinite(x64) & np.isinf(v)
        if overflowed.any():
            status |= 0x100
        if overflow_mode == "saturation":
            v = np.where(np.isnan(v), 0.0, v)
            v = np.where(np.isinf(v), np.sign(v) * big, v)
    if subnormals == "flush":
        tiny = FLT_MIN if dtype == "float32" else float(ml_dtypes.finfo(t).smallest_normal)
        v = np.where(np.abs(v) < tiny, np.copysign(0.0, v), v)
    return v, status


def fixpipe(acc: float, out_dtype: str, overflow_mode="inf_nan", subnormals="keep"):
    """(output value as float, status) for one fp32 accumulator value."""
    status = 0
    if not math.isfinite(acc):
        status |= 0x400
        if overflow_mode == "saturation":  # the accumulator saturates before the conversion
            acc = 0.0 if math.isnan(acc) else math.copysign(FLT_MAX, acc)
    if out_dtype == "float32":
        if subnormals == "flush" and 0 < abs(acc) < FLT_MIN:
            acc = math.copysign(0.0, acc)
        return acc, status
    t = DTYPES[out_dtype]
    with np.errstate(all="ignore"):
        r = float(np.asarray(np.float32(acc)).astype(t).astype(np.float64))
    if not math.isfinite(acc):  # Inf/NaN reaching the conversion (inf_nan mode only)
        status |= 0x20
    elif math.isinf(r):
        status |= 0x100
        if overflow_mode == "saturation":
            r = math.copysign(float(ml_dtypes.finfo(t).max), acc)
    if subnormals == "flush" and 0 < abs(r) < float(ml_dtypes.finfo(t).smallest_normal):
        r = math.copysign(0.0, r)
    return r, status


def finish(acc: np.ndarray, out_dtype, overflow_mode="inf_nan", subnormals="keep"):
    out = np.empty(acc.shape, dtype=np.float64)
    status = 0
    for idx in np.ndindex(acc.shape):
        out[idx], s = fixpipe(float(acc[idx]), out_dtype, overflow_mode, subnormals)
        status |= s
    return out.astype(DTYPES[out_dtype]), status


# ---------------------------------------------------------------- whole ops

def matmul(a, b, bias=None, operand_dtype="float16", out_dtype="float16", overflow_mode="inf_nan",
           subnormals="keep", model=None):
    """(result, status) of a @ b on the modelled cube unit (a, b 2-D, already transposed)."""
    av, sa = operand(a, operand_dtype, overflow_mode, subnormals)
    bv, sb = operand(b, operand_dtype, overflow_mode, subnormals)
    M, K = av.shape
    N = bv.shape[1]
    biasv = np.zeros(N) if bias is None else np.asarray(bias, dtype=np.float32).astype(np.float64)
    acc = np.empty((M, N))
    kw = model_kwargs(model)
    for i in range(M):
        for j in range(N):
            acc[i, j] = dot(av[i, :], bv[:, j], biasv[j], **kw)
    out, sf = finish(acc, out_dtype, overflow_mode, subnormals)
    return out, sa | sb | sf


def conv_pads(padding, H, W, KH, KW, strides, dilations):
    """TF padding rule, written out: SAME gives ceil(n / s) outputs, extra pixel at the end."""
    if padding == "VALID":
        return (0, 0), (0, 0)
    if padding == "SAME":
        res = []
        for n, k, s, d in ((H, KH, strides[0], dilations[0]), (W, KW, strides[1], dilations[1])):
            out = math.ceil(n / s)
            need = max(0, (out - 1) * s + d * (k - 1) + 1 - n)
            res.append((need // 2, need - need // 2))
        return tuple(res)
    return tuple(map(tuple, padding))


def conv2d(x, w, strides, padding, dilations, bias=None, operand_dtype="float16", out_dtype="float16",
           overflow_mode="inf_nan", subnormals="keep", model=None, depthwise=False):
    """(result, status) of TF Conv2D (or DepthwiseConv2dNative): each output one dot over (kh, kw[, cin])."""
    xv, sx = operand(x, operand_dtype, overflow_mode, subnormals)
    wv, sw = operand(w, operand_dtype, overflow_mode, subnormals)
    N, H, W, C = xv.shape
    KH, KW, _, CO = wv.shape
    (pt, pb), (pl, pr) = conv_pads(padding, H, W, KH, KW, strides, dilations)
    OH = (H + pt + pb - dilations[0] * (KH - 1) - 1) // strides[0] + 1
    OW = (W + pl + pr - dilations[1] * (KW - 1) - 1) // strides[1] + 1
    nout = C * CO if depthwise else CO
    biasv = np.zeros(nout) if bias is None else np.asarray(bias, dtype=np.float32).astype(np.float64)
    kw = model_kwargs(model)
    c1hwc0 = model is not None and model.conv_k_order == "c1hwc0"

    def pixel(n, y, x_, c):
        if 0 <= y < H and 0 <= x_ < W:
            return xv[n, y, x_, c]
        return 0.0

    acc = np.empty((N, OH, OW, nout))
    for n in range(N):
        for oy in range(OH):
            for ox in range(OW):
                for o in range(nout):
                    avals, bvals = [], []
                    for kh in range(KH):
                        for kw_ in range(KW):
                            y = oy * strides[0] + kh * dilations[0] - pt
                            x_ = ox * strides[1] + kw_ * dilations[1] - pl
                            if depthwise:
                                c, m = divmod(o, CO)
                                avals.append(pixel(n, y, x_, c))
                                bvals.append(wv[kh, kw_, c, m])
                            else:
                                for c in range(C):
                                    avals.append(pixel(n, y, x_, c))
                                    bvals.append(wv[kh, kw_, c, o])
                    if c1hwc0 and not depthwise:  # (cin // 16, kh, kw, cin % 16), +0 for the padded channels
                        taps = len(avals) // C
                        avals = [avals[t * C + c] if c < C else 0.0 for c1 in range(-(-C // 16)) for t in range(taps)
                                 for c in range(16 * c1, 16 * c1 + 16)]
                        bvals = [bvals[t * C + c] if c < C else 0.0 for c1 in range(-(-C // 16)) for t in range(taps)
                                 for c in range(16 * c1, 16 * c1 + 16)]
                    acc[n, oy, ox, o] = dot(avals, bvals, biasv[o], **kw)
    out, sf = finish(acc, out_dtype, overflow_mode, subnormals)
    return out, sx | sw | sf


def hf32(x, bits: int = 11, rounding: str = "rint") -> np.ndarray:
    """float32 values rounded to HF32 from the format's definition: ``bits`` + 1 significant bits in the value's
    binade (quantum 2^(e - bits), the subnormal binades sharing 2^-(126 + bits)), float64 arithmetic, rounded
    nearest even (``rint``), nearest with ties away from zero (``round``) or toward zero (``trunc``); +-inf past
    the largest HF32 value (2 - 2^-bits) 2^127. Finite inputs only."""
    v = np.asarray(x, dtype=np.float32).astype(np.float64)
    _, e = np.frexp(v)
    q = np.ldexp(1.0, np.maximum(e - 1, -126) - bits)
    k = v / q
    if rounding == "rint":
        k = np.rint(k)
    elif rounding == "round":
        k = np.sign(k) * np.floor(np.abs(k) + 0.5)
    else:
        k = np.trunc(k)
    r = k * q
    r[np.abs(r) > (2.0 - 2.0 ** -bits) * 2.0 ** 127] *= np.inf
    return r.astype(np.float32)


def assert_same_bits(ours, ref, what):
    """Equal bit patterns; NaN matches NaN (payloads are not modelled)."""
    u = np.uint16 if ours.dtype.itemsize == 2 else np.uint32
    with np.errstate(invalid="ignore"):
        nan_o, nan_r = np.isnan(ours.astype(np.float64)), np.isnan(ref.astype(np.float64))
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, what
    assert (nan_o == nan_r).all(), what
    assert np.array_equal(ours.view(u)[~nan_o], ref.view(u)[~nan_r]), what

"""The ops of training graphs: backprop convolutions on the cube, batch-norm training and its gradient, losses,
pooling gradients and gradient bookkeeping (the elementwise gradients are :mod:`.activation_grad_ops`'s).

Backprop convolutions are rewritten into the forward cube kernels (:mod:`ascend_emu.numerics.cube`),
so fp16 operands, fp32 accumulation in K-blocks and the Fixpipe rounding follow the CubeModel
exactly as for Conv2D and MatMul. The losses and pooling gradients follow their TBE kernels' steps where
NUMERICS.md section 8 says so, op by op.
"""
from __future__ import annotations

import numpy as np

from ..errors import AscendEmuError
from ._util import as_int_list, finish, is_float, sum_f32, to64, widen
from .activation_grad_ops import _NEG_ONE, _ONE, _TBE   # noqa: F401  (and registers the elementwise gradients)
from .nn_ops import CONV_SOURCE, _channels, _cube_kw, _finish_as_stored, _hw, _nhwc, _padding, _record
from .registry import CUBE, HOST, MOVE, VECTOR, Source, register


# ------------------------------------------------------------------------------ helpers

def _conv_pads(padding, explicit_paddings, H, W, KH, KW, sh, sw, dh, dw):
    from ..numerics.cube import _pads

    return _pads(_padding(padding, explicit_paddings), H, W, KH, KW, sh, sw, dh, dw)


def _dz_pads(input_sizes, w, dy, strides, padding, dilations, explicit_paddings):
    """The pads of the zero-inserted dy (negative: crops) that make the input gradient the stride-1 VALID
    convolution of it with the rotated filter."""
    n, h, wd, _ = as_int_list(input_sizes)
    kh, kw = int(w.shape[0]), int(w.shape[1])
    sh, sw = _hw(strides)
    dh, dw = _hw(dilations)
    (pt, _), (pl, _) = _conv_pads(padding, explicit_paddings, h, wd, kh, kw, sh, sw, dh, dw)
    oh, ow = dy.shape[1:3]
    khe, kwe = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    pads_h = (khe - 1 - pt, h - 1 + pt - (oh - 1) * sh)
    pads_w = (kwe - 1 - pl, wd - 1 + pl - (ow - 1) * sw)
    return (pads_h, pads_w), (sh, sw), (dh, dw), (n, h, wd)


def _backprop_input_geometry(input_sizes, w, dy, strides, padding, dilations, explicit_paddings):
    """Zero-inserted, padded ``dy`` and the dilation of the equivalent stride-1 VALID convolution."""
    from ..numerics.cube import zero_inserted

    (pads_h, pads_w), (sh, sw), (dh, dw), (n, h, wd) = _dz_pads(input_sizes, w, dy, strides, padding, dilations,
                                                                explicit_paddings)
    return zero_inserted(dy, sh, sw, pads_h, pads_w), (dh, dw), (n, h, wd)


def _windows(x, kh, kw, sh, sw, dh, dw, oh, ow):
    """(KH*KW, N, OH, OW, C) views of the padded input under each filter tap."""
    return [x[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw, :]
            for i in range(kh) for j in range(kw)]


def _padded_input(x, filter_sizes, dy, strides, padding, dilations, explicit_paddings):
    kh, kw = as_int_list(filter_sizes)[:2]
    sh, sw = _hw(strides)
    dh, dw = _hw(dilations)
    _, h, wd, _ = x.shape
    pads = _conv_pads(padding, explicit_paddings, h, wd, kh, kw, sh, sw, dh, dw)
    xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    return _windows(xp, kh, kw, sh, sw, dh, dw, dy.shape[1], dy.shape[2])


# ------------------------------------------------------------------------------ cube: backprop convolutions

@register("Conv2DBackpropInput", kind=CUBE, source=CONV_SOURCE)
def conv2d_backprop_input(input_sizes, w, dy, *, ctx, strides, padding, dilations=(1, 1, 1, 1),
                          explicit_paddings=(), data_format="NHWC"):
    """dx = VALID stride-1 convolution of the zero-inserted, padded dy with the filter rotated by
    180 degrees (in/out channels swapped); K = KH*KW*Cout in the CubeModel's conv order."""
    from ..numerics.cube import conv2d_backprop_input as backprop_input

    _nhwc(data_format)
    pads, strides, dil, _ = _dz_pads(input_sizes, w, dy, strides, padding, dilations, explicit_paddings)
    return _record(ctx, backprop_input(dy, w, strides, pads, dil, **_cube_kw(ctx)))


@register("Conv2DTranspose", kind=CUBE, source=Source(
    CONV_SOURCE.files + ("hicann/ops-nn conv/convolution_forward/op_host/op_api/convolution.cpp (ConvTranspose2d: "
                         "Conv2DTranspose with the bias as an input)",), CONV_SOURCE.assumed,
    "Conv2DBackpropInput's model (the transposed convolution of x is the input gradient of the convolution it "
    "transposes); the bias into the float32 accumulator, as Conv2D's (assumed: the kernel takes it as an input)"))
def conv2d_transpose(input_size, x, w, *, ctx, strides, pads, dilations=(1, 1, 1, 1), data_format="NHWC",
                     bias=None):
    """CANN's Conv2DTranspose (aclnnConvolution with ``transposed``): the input gradient of the convolution whose
    input has ``input_size`` (the output here, CANN's ``output_padding`` rows and columns included) and whose filter
    is ``w`` (KH, KW, out channels, x's channels); ``pads`` (top, bottom, left, right) are that convolution's."""
    from ..numerics.cube import conv2d_backprop_input as backprop_input

    _nhwc(data_format)
    p, size = as_int_list(pads), as_int_list(input_size)
    if len(p) != 4 or min(p) < 0:
        raise AscendEmuError(f"Conv2DTranspose pads {p}: four sizes >= 0 (top, bottom, left, right)")
    if x.ndim != 4 or w.ndim != 4 or len(size) != 4:
        raise AscendEmuError(f"Conv2DTranspose needs a 4-D x, a 4-D filter and four input_size entries, got x "
                             f"{x.shape}, filter {w.shape}, input_size {size}")
    explicit = [0, 0, p[0], p[1], p[2], p[3], 0, 0]
    geometry, st, dil, (_, h, wd) = _dz_pads(size, w, x, strides, "EXPLICIT", dilations, explicit)
    khe, kwe = (w.shape[0] - 1) * dil[0] + 1, (w.shape[1] - 1) * dil[1] + 1
    fwd = ((h + p[0] + p[1] - khe) // st[0] + 1, (wd + p[2] + p[3] - kwe) // st[1] + 1)
    if fwd != tuple(x.shape[1:3]):
        raise AscendEmuError(f"Conv2DTranspose: an output of size {size} convolved back (strides {st}, pads {p}, "
                             f"filter {tuple(w.shape[:2])}) gives {fwd}, not x's {tuple(x.shape[1:3])}; check "
                             "input_size against x")
    return _record(ctx, backprop_input(x, w, st, geometry, dil, **_cube_kw(ctx, bias)))


@register("Conv2DBackpropFilter", kind=CUBE, source=CONV_SOURCE)
def conv2d_backprop_filter(x, filter_sizes, dy, *, ctx, strides, padding, dilations=(1, 1, 1, 1),
                           explicit_paddings=(), data_format="NHWC"):
    """dw = im2col(x)^T @ dy as one matmul: K = N*OH*OW in (n, oh, ow) order."""
    from ..numerics.cube import conv2d_backprop_filter as backprop_filter

    _nhwc(data_format)
    kh, kw, c, co = as_int_list(filter_sizes)
    sh, sw = _hw(strides)
    dh, dw = _hw(dilations)
    _, h, wd, _ = x.shape
    pads = _conv_pads(padding, explicit_paddings, h, wd, kh, kw, sh, sw, dh, dw)
    kw_ = _cube_kw(ctx)
    del kw_["bias"]
    return _record(ctx, backprop_filter(x, dy, (kh, kw), (sh, sw), pads, (dh, dw), multicore=ctx.multicore, **kw_))


@register("DepthwiseConv2dNativeBackpropInput", kind=CUBE, source=CONV_SOURCE)
def depthwise_backprop_input(input_sizes, w, dy, *, ctx, strides, padding, dilations=(1, 1, 1, 1),
                             explicit_paddings=(), data_format="NHWC"):
    """dx[c] = sum over (kh, kw, m) of the zero-inserted, padded dy[c*M+m] times the rotated filter:
    the depthwise cube kernel for M = 1, else one (pixels x KH*KW*M) @ (KH*KW*M x 1) product per channel."""
    from ..numerics.cube import batch_matmul, depthwise_conv2d

    _nhwc(data_format)
    kh, kw, c, m = w.shape
    dz, (dh, dw), (n, h, wd) = _backprop_input_geometry(input_sizes, w, dy, strides, padding, dilations,
                                                        explicit_paddings)
    w_rot = np.ascontiguousarray(w[::-1, ::-1])
    if m == 1:
        return _record(ctx, depthwise_conv2d(dz, w_rot, strides=(1, 1), padding="VALID", dilations=(dh, dw),
                                             **_cube_kw(ctx)))
    taps = _windows(dz, kh, kw, 1, 1, dh, dw, h, wd)               # each (N, H, W, C*M)
    a = np.stack([t.reshape(n * h * wd, c, m) for t in taps], axis=2)   # (R, C, taps, M)
    a = np.ascontiguousarray(a.transpose(1, 0, 2, 3)).reshape(c, n * h * wd, kh * kw * m)
    b = np.ascontiguousarray(w_rot.transpose(2, 0, 1, 3)).reshape(c, kh * kw * m, 1)
    out = _record(ctx, batch_matmul(a, b, **_cube_kw(ctx)))         # (C, R, 1)
    return np.ascontiguousarray(out[:, :, 0].T).reshape(n, h, wd, c)


@register("DepthwiseConv2dNativeBackpropFilter", kind=CUBE, source=CONV_SOURCE)
def depthwise_backprop_filter(x, filter_sizes, dy, *, ctx, strides, padding, dilations=(1, 1, 1, 1),
                              explicit_paddings=(), data_format="NHWC"):
    """dw[:, :, c, :] = im2col(x[..., c])^T @ dy[..., c*M:(c+1)*M], one product per channel, K = N*OH*OW."""
    from ..numerics.cube import batch_matmul

    _nhwc(data_format)
    kh, kw, c, m = as_int_list(filter_sizes)
    taps = _padded_input(x, filter_sizes, dy, strides, padding, dilations, explicit_paddings)
    r = int(np.prod(dy.shape[:3]))
    # computed as dw^T = dy^T @ im2col: the same dot products over K = R in the same order (the same
    # bits), with the taps as the kernel's columns instead of a single column
    a = np.ascontiguousarray(dy.reshape(r, c, m).transpose(1, 2, 0))                                # (C, M, R)
    b = np.empty((c, r, kh * kw), dtype=x.dtype)                                                    # (C, R, taps)
    for k, t in enumerate(taps):
        b[:, :, k] = t.reshape(r, c).T
    out = _record(ctx, batch_matmul(a, b, **_cube_kw(ctx)))                                         # (C, M, taps)
    return np.ascontiguousarray(out.transpose(2, 0, 1)).reshape(kh, kw, c, m)


# ------------------------------------------------------------------------------ vector: reductions

@register("BiasAddGrad", kind=VECTOR, reads_half=True, source=Source(
    (_TBE + "bias_add_grad.py (bias_add_grad_compute: fp16 cast to float32, reduce_sum, cast back)",
     "NUMERICS.md section 8 (reductions)"), ("reduce_accumulate", "multicore_reduce_min_chunk"),
    "a float32 sum, one rounding, as the kernel; the summation order assumed"))
def bias_add_grad(dy, *, ctx, data_format="NHWC"):
    """Sum of dy over every axis but the channel axis, accumulated as the other reductions."""
    from ..numerics.reduction import reduce

    if data_format not in ("NHWC", "N..C", None):
        raise NotImplementedError(f"BiasAddGrad data_format {data_format}")
    half = ctx.dtype_name in ("float16", "bfloat16")
    if type(dy) is np.ndarray and dy.ndim == 4 and dy.size and dy.dtype == ctx.dtype and (
            ctx.dtype == np.float32 or (half and ctx.subnormals == "keep" and
                                        (ctx.dtype_name == "bfloat16" or ctx.reduce_accumulate == "float32"))):
        # the same float32 sum in one pass on dy's own strides (numerics/batchnorm.py; 16-bit dy widened
        # exactly, the float32 total rounded once to it), no transposed copy when it splits over the cores; an
        # Inf or NaN, or a total past the 16-bit range, goes the reduction's way, the order generator put back
        from ..numerics import batchnorm as _bn
        from ..numerics.vector import cast

        restore = _bn.snapshot(ctx.multicore)
        zeros = np.zeros(dy.shape[3], np.float32)
        sums = _bn.sums(_bn.SUM, _bn.as_f32(dy), None, zeros, zeros, overflow_mode=ctx.overflow_mode,
                        subnormals=ctx.subnormals, multicore=ctx.multicore)
        if sums is not None:
            if not half:
                return sums[0]
            y, st = cast(sums[0], ctx.dtype_name, "rint", overflow_mode=ctx.overflow_mode, subnormals="keep")
            if not st:
                return y
        restore()
    y, st = reduce("sum", dy, axis=tuple(range(dy.ndim - 1)), dtype=ctx.dtype_name,
                   accumulate=ctx.reduce_accumulate if ctx.dtype_name == "float16" else "float32",
                   overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals, multicore=ctx.multicore)
    ctx.record(st)
    return y


@register("UnsortedSegmentSum", kind=VECTOR, source=Source(
    (_TBE + "unsorted_segment_sum.py (op_select_format: float inputs only; set_atomic_add)",
     "NUMERICS.md section 8 (reductions), section 11"), (),
    "float32 atomic adds in row order (arrival order with determinism off), one rounding; the order assumed, no "
    "parameter"))
def unsorted_segment_sum(data, segment_ids, num_segments, *, ctx):
    """out[s] = sum of the rows with id s, accumulated in float32 in row order (atomic adds in
    arrival order), rounded once; rows with a negative id are dropped, as in TF."""
    ids = np.asarray(segment_ids).astype(np.int64).reshape(-1)
    ns = int(np.asarray(num_segments).reshape(()))
    if ids.size and ids.max() >= ns:
        raise AscendEmuError(f"UnsortedSegmentSum: segment id {int(ids.max())} is not below num_segments {ns}; "
                             "fix the segment ids")
    rows = np.asarray(data).reshape((ids.size,) + np.shape(data)[np.ndim(segment_ids):])
    keep = ids >= 0
    if not is_float(data):
        out = np.zeros((ns,) + rows.shape[1:], dtype=rows.dtype)
        np.add.at(out, ids[keep], rows[keep])
        return out
    acc = np.zeros((ns,) + rows.shape[1:], dtype=np.float32)
    order = ctx.multicore.arrival(ids.size) if ctx.multicore is not None else None
    if order is None:
        with np.errstate(all="ignore"):
            np.add.at(acc, ids[keep], widen(ctx, rows[keep]))
    else:
        # the vector cores' atomic adds into one row interleave in arrival order (NUMERICS.md section 11)
        from ..numerics.multicore import segment_add

        with np.errstate(all="ignore"):
            segment_add(acc, widen(ctx, rows), ids, order)
    return finish(ctx, acc)


# ------------------------------------------------------------------------------ batch norm gradient

@register("FusedBatchNormGradV3", "FusedBatchNormGradV2", "FusedBatchNormGrad", kind=VECTOR,
          fp32_inputs=(2, 3, 4), source=Source(
              (_TBE + "bn_training_update_grad.py, bn_training_reduce_grad.py (their _compute: float32 steps)",
               "hicann/ops-nn norm/bn_training_update_grad/tests/assets/golden.py, "
               "norm/bn_training_reduce_grad/tests/assets/golden.py"), ("multicore_reduce_min_chunk",),
              "BNTrainingUpdateGrad's float32 sums, BNTrainingReduceGrad's dx = ((dy + mult x) + addend) "
              "(scale / sqrt(var + eps)), one rounding; the sum order assumed (split over cores: V3, determinism off)"))
def fused_batch_norm_grad(dy, x, scale, mean, variance, *rest, ctx, epsilon=1e-3, is_training=True,
                          data_format="NHWC"):
    """Batch-norm gradient as CANN splits it: BNTrainingUpdateGrad (float32 sums of dy * x_norm and
    of dy) and BNTrainingReduceGrad (the float32 chain for dx, rounded once); in inference mode
    dx = dy * scale / sqrt(var + eps). ``mean``/``variance`` are reserve spaces 1 and 2 (batch mean
    and biased batch variance) when training, else the population statistics."""
    _nhwc(data_format)
    axes, n = _channels(dy)
    if is_training and dy.ndim == 4 and dy.size and _half_or_f32(dy, x):
        fast = _batch_norm_grad_pass(dy, x, scale, mean, variance, ctx, epsilon, n)
        if fast is not None:
            return fast
    g, xw = widen(ctx, dy), widen(ctx, x)
    sc = np.asarray(scale, np.float32)
    mu = np.asarray(mean, np.float32)
    var = np.asarray(variance, np.float32)
    eps = np.float32(epsilon)
    with np.errstate(all="ignore"):
        rstd = _ONE / np.sqrt(var + eps)
        d_scale = sum_f32(ctx, g * ((xw - mu) * rstd), axes)
        d_offset = sum_f32(ctx, g, axes)
        sqrt_var = np.sqrt(var + eps)
        if is_training:
            rn = np.float32(1.0 / n)
            mult = (d_scale * -rn) / sqrt_var
            addend = (mu / sqrt_var) * (d_scale * rn) + d_offset * -rn
            dx = ((g + mult * xw) + addend) * (sc / sqrt_var)
        else:
            dx = g * (sc / sqrt_var)
    empty = np.zeros(0, np.float32)
    return finish(ctx, dx), d_scale.astype(np.float32), d_offset.astype(np.float32), empty, empty


def _half_or_f32(*arrays) -> bool:
    return all(type(a) is np.ndarray and (a.dtype == np.float32 or (a.dtype.itemsize == 2 and a.dtype.kind in "fV"))
               for a in arrays)


def _batch_norm_grad_pass(dy, x, scale, mean, variance, ctx, epsilon, n):
    """The training gradient above in two Numba passes (``numerics/batchnorm.py``), the same float32 steps in the
    same order on the arrays' own strides; None (the order generator put back) where a value is Inf or NaN."""
    from ..numerics import batchnorm as _bn

    restore = _bn.snapshot(ctx.multicore)
    g, xw = _bn.as_f32(dy), _bn.as_f32(x)
    sc = np.asarray(scale, np.float32)
    mu = np.asarray(mean, np.float32)
    var = np.asarray(variance, np.float32)
    eps = np.float32(epsilon)
    with np.errstate(all="ignore"):
        rstd = _ONE / np.sqrt(var + eps)
    sums = _bn.sums(_bn.BACKWARD, xw, g, mu, rstd, overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals,
                    multicore=ctx.multicore)
    if sums is None:
        restore()
        return None
    d_scale, d_offset = sums
    with np.errstate(all="ignore"):
        sqrt_var = np.sqrt(var + eps)
        rn = np.float32(1.0 / n)
        mult = (d_scale * -rn) / sqrt_var
        addend = (mu / sqrt_var) * (d_scale * rn) + d_offset * -rn
        k = sc / sqrt_var
    dx = _bn.apply(_bn.BACKWARD, xw, g, mult, addend, k, subnormals=ctx.subnormals,
                   flush_out=ctx.dtype == np.float32 and ctx.subnormals == "flush")
    if dx is None:
        restore()
        return None
    empty = np.zeros(0, np.float32)
    return (dx if ctx.dtype == np.float32 else _finish_as_stored(ctx, dx)), d_scale.astype(np.float32), \
        d_offset.astype(np.float32), empty, empty


# ------------------------------------------------------------------------------ losses

_SCE_KERNEL = _TBE + "softmax_cross_entropy_with_logits.py (softmax_cross_entropy_with_logits_compute)"


@register("SoftmaxCrossEntropyWithLogits", kind=VECTOR, source=Source(
    (_SCE_KERNEL, "NUMERICS.md section 8 (losses)"), ("op_model", "impl_mode"),
    "the kernel's float32 steps: s = x - max, e = exp(s), S = sum(e), backprop = e / S - labels, loss = "
    "sum((labels (s - log S)) (-1)); each output rounded once; the sums' order is the registry's float32 ReduceSum "
    "(assumed); op_model exact: float64 inside"))
def softmax_cross_entropy(logits, labels, *, ctx):
    """TBE softmax_cross_entropy_with_logits_compute over the last axis: fp16 widened; m = max(x); s = x - m;
    e = exp(s) (the vector unit's float32 exp); S = sum(e); backprop = e / S - labels; loss =
    sum((labels * (s - log(S))) * -1); every step float32, each output rounded once. Under
    ``op_model="exact"``: float64 inside (the composite rule of NUMERICS.md section 2)."""
    if ctx.op_model == "exact":
        z, lab = np.broadcast_arrays(to64(logits), to64(labels))
        with np.errstate(all="ignore"):
            zs = z - z.max(axis=-1, keepdims=True)
            lse = np.log(np.exp(zs).sum(axis=-1, keepdims=True))
            loss = (lab * (lse - zs)).sum(axis=-1)
            back = np.exp(zs - lse) - lab
        return finish(ctx, loss), finish(ctx, back)
    from ._util import step32
    from ..numerics.vector import vector

    x, lab = np.broadcast_arrays(widen(ctx, logits), widen(ctx, labels))
    axis = (x.ndim - 1,)
    f32 = dict(dtype="float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals, op_model=ctx.op_model,
               impl_mode=ctx.impl_mode)
    fast = _sce_unstepped(ctx, x, lab, axis, f32)
    if fast is not None:
        return fast
    with np.errstate(all="ignore"):
        s = step32(ctx, x - x.max(axis=-1, keepdims=True))
        e, st = vector("exp", s, **f32)
        ctx.record(st)
        total = step32(ctx, sum_f32(ctx, np.ascontiguousarray(e), axis))[..., None]
        back = step32(ctx, step32(ctx, e / total) - lab)
        lg, st = vector("log", total, **f32)
        ctx.record(st)
        t = step32(ctx, step32(ctx, lab * step32(ctx, s - lg)) * _NEG_ONE)
        loss = step32(ctx, sum_f32(ctx, np.ascontiguousarray(t), axis))
    return finish(ctx, loss), finish(ctx, back)


def _sce_unstepped(ctx, x, lab, axis, f32):
    """softmax_cross_entropy's float32 steps without step32 after each, or None. Where every value step32 would see
    is finite, step32 returns each as it is and records nothing, in either overflow mode: the same steps in the same
    order without it (np.asarray(v, float32) is the conversion step32 makes) give the same bits and status. Under
    ``inf_nan`` step32 never changes a value, so an Inf or NaN only adds 0x20 at the end; under ``saturation`` it
    would change one, so then None (nothing recorded: the statuses wait in ``status``) and the caller runs the
    stepped path from the start (only without a multi-core launch, whose sums draw from the launch's generator).
    A (32, 10) loss: ten step32 calls were ~23 of its ~127 us. tests/ops/test_small_vector_paths.py compares both
    on hostile data."""
    from ..numerics.policy import STATUS_FP_OVERFLOW
    from ..numerics.reduction import reduce
    from ..numerics.vector import vector

    sat = ctx.overflow_mode != "inf_nan"
    if sat and ctx.multicore is not None:
        return None
    f = np.float32
    rkw = dict(axis=axis, dtype="float32", accumulate="float32", overflow_mode=ctx.overflow_mode,
               subnormals=ctx.subnormals, multicore=ctx.multicore)   # sum_f32's call, its status kept here
    with np.errstate(all="ignore"):
        s = np.asarray(x - x.max(axis=-1, keepdims=True), dtype=f)
        e, status = vector("exp", s, **f32)
        total, st = reduce("sum", np.ascontiguousarray(e), **rkw)
        status |= st
        total = np.asarray(total, dtype=f)[..., None]
        q = np.asarray(e / total, dtype=f)
        back = np.asarray(q - lab, dtype=f)
        lg, st = vector("log", total, **f32)
        status |= st
        d = np.asarray(s - lg, dtype=f)
        p = np.asarray(lab * d, dtype=f)
        t = np.asarray(p * _NEG_ONE, dtype=f)
        loss, st = reduce("sum", np.ascontiguousarray(t), **rkw)
        status |= st
        loss = np.asarray(loss, dtype=f)
    # the values step32 sees: s q back d p t total loss. A non-finite s, d or p makes the next one non-finite (x - y
    # and x * y of an Inf or NaN x are Inf or NaN for every float32 y, 0 included), so t stands for them, back for
    # q; total and loss are the sums' results (which saturate on their own under saturation) and stand alone
    if not (np.isfinite(t).all() and np.isfinite(back).all() and np.isfinite(total).all()
            and np.isfinite(loss).all()):
        if sat:
            return None
        status |= STATUS_FP_OVERFLOW
    ctx.record(status)
    return finish(ctx, loss), finish(ctx, back)


@register("SparseSoftmaxCrossEntropyWithLogits", kind=VECTOR, source=Source(
    ("canndev ops/built-in/fusion_pass/graph_fusion/ai_core/sparse_softmax_cross_entropy_with_logits_fusion_pass.cc "
     "(OneHotD + SoftmaxCrossEntropyWithLogits)",
     _SCE_KERNEL, "NUMERICS.md section 8 (losses)"), ("op_model", "impl_mode"),
    "GE runs it as OneHotD + SoftmaxCrossEntropyWithLogits: that kernel's float32 steps (the row sums' order "
    "assumed)"))
def sparse_softmax_cross_entropy(logits, labels, *, ctx):
    """As SoftmaxCrossEntropyWithLogits with one-hot labels given as class indices."""
    lab = np.asarray(labels).astype(np.int64)
    nclass = logits.shape[-1]
    lo, hi = (int(lab.min()), int(lab.max())) if lab.size else (0, 0)
    if lab.size and (lo < 0 or hi >= nclass):
        bad = lo if lo < 0 else hi
        raise AscendEmuError(f"SparseSoftmaxCrossEntropyWithLogits: label {bad} is outside the valid range "
                             f"[0, {nclass}); fix the labels")
    # float32 (0 and 1 are exact: what widen makes of them); a (batch, classes) one by an index pair, ~4 us less than
    # put_along_axis's index arrays
    onehot = np.zeros(np.shape(logits), np.float32)
    if onehot.ndim == 2 and lab.shape == onehot.shape[:1]:
        onehot[np.arange(lab.shape[0]), lab] = 1.0
    else:
        np.put_along_axis(onehot, lab[..., None], 1.0, axis=-1)
    return softmax_cross_entropy(logits, onehot, ctx=ctx)


# ------------------------------------------------------------------------------ pooling gradients

def _pool_geometry(shape, ksize, strides, padding):
    kh, kw = _hw(ksize)
    sh, sw = _hw(strides)
    _, h, w, _ = shape
    if padding == "SAME":
        oh, ow = -(-h // sh), -(-w // sw)
        pt = max((oh - 1) * sh + kh - h, 0) // 2
        pl = max((ow - 1) * sw + kw - w, 0) // 2
    elif padding == "VALID":
        oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
        pt = pl = 0
    else:
        raise NotImplementedError(f"pooling padding {padding!r}")
    return kh, kw, sh, sw, oh, ow, pt, pl


def _taps(kh, kw, sh, sw, oh, ow, pt, pl):
    """Input row and column of every (output row, output column, tap), taps in (kh, kw) order."""
    r = (np.arange(oh) * sh - pt)[:, None, None] + np.repeat(np.arange(kh), kw)[None, None, :]
    c = (np.arange(ow) * sw - pl)[None, :, None] + np.tile(np.arange(kw), kh)[None, None, :]
    return np.broadcast_to(r, (oh, ow, kh * kw)), np.broadcast_to(c, (oh, ow, kh * kw))


def _scatter_add(shape, rows, cols, vals) -> np.ndarray:
    """float32 accumulator of ``shape`` (N, H, W, C) with ``vals[n, oh, ow, t, c]`` added at
    (n, rows[n, oh, ow, t, c], cols[...], c), one addition at a time in row-major order of
    (n, oh, ow, t, c): every input pixel receives its terms output by output, tap by tap.
    Positions outside the input (padding) are dropped."""
    n, h, w, c = shape
    rows, cols, vals = np.broadcast_arrays(rows, cols, vals)
    nn = np.arange(n).reshape(-1, 1, 1, 1, 1)
    cc = np.arange(c).reshape(1, 1, 1, 1, -1)
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
    flat = ((nn * h + rows) * w + cols) * c + cc
    acc = np.zeros(n * h * w * c, np.float32)
    with np.errstate(all="ignore"):
        np.add.at(acc, flat[inside], vals[inside])
    return acc.reshape(shape)


@register("MaxPoolGrad", kind=VECTOR, source=Source(
    (_TBE + "max_pool_grad.py (_calc_mask_dy: vcmpv_eq with the max, vand with the vnot of the earlier taps' vor; "
     "vsel of dy; float32 vadd tap by tap)", "NUMERICS.md section 8 (pooling gradients)"), (),
    "dy to the window's first maximum in tap order (the kernel's mask bookkeeping), float32 adds tap by tap over the "
    "plane, one rounding"))
def max_pool_grad(x, y, dy, *, ctx, ksize, strides, padding, data_format="NHWC"):
    """Each output's gradient goes to the first maximum of its window (taps in row-major order, a NaN
    the maximum), accumulated in float32 tap by tap, rounded once (``kernels/pool.py``'s
    ``max_pool_grad_f32``, on the arrays' own strides: an NCHW array's NHWC view is not copied)."""
    from ..kernels import pool as _kp

    _nhwc(data_format)
    kh, kw, sh, sw, oh, ow, pt, pl = _pool_geometry(x.shape, ksize, strides, padding)
    from ..numerics.batchnorm import as_f32
    from ..numerics.vector import flush_f32_subnormals

    xf, g = as_f32(x), as_f32(dy)
    if ctx.subnormals == "flush":      # (widen's reading of dy, on a copy in dy's memory order)
        g = flush_f32_subnormals(np.array(g, np.float32))
    if g.shape != (x.shape[0], oh, ow, x.shape[3]):
        raise AscendEmuError(f"MaxPoolGrad: grad of shape {g.shape} does not match the pooled shape "
                             f"{(x.shape[0], oh, ow, x.shape[3])}; pass the gradient of MaxPool's output")
    acc = np.zeros_like(xf)        # (the input's memory order: an NCHW input's gradient comes back NCHW)
    _kp.max_pool_grad_f32(xf, g, acc, kh, kw, sh, sw, pt, pl)
    return _finish_as_stored(ctx, acc)


@register("AvgPoolGrad", kind=VECTOR, source=Source(
    (_TBE + "avg_pool_grad.py (a Conv2DBackpropInput by kernel_matrix on the cube)",
     "NUMERICS.md section 8 (pooling gradients)"), (),
    "dy / count in float32 added in output order, one rounding (the order assumed, no parameter); the kernel's cube "
    "transposed convolution is not modelled"))
def avg_pool_grad(orig_input_shape, dy, *, ctx, ksize, strides, padding, data_format="NHWC"):
    """Each output's gradient divided (float32) by its window's count of real pixels is added to
    every pixel of the window, in float32, output by output; rounded once."""
    _nhwc(data_format)
    shape = tuple(as_int_list(orig_input_shape))
    kh, kw, sh, sw, oh, ow, pt, pl = _pool_geometry(shape, ksize, strides, padding)
    rows, cols = _taps(kh, kw, sh, sw, oh, ow, pt, pl)
    inside = (rows >= 0) & (rows < shape[1]) & (cols >= 0) & (cols < shape[2])
    cnt = inside.sum(axis=2).astype(np.float32)                                          # (OH, OW)
    with np.errstate(all="ignore"):
        share = widen(ctx, dy) / cnt[None, :, :, None]                                  # (N, OH, OW, C)
    return finish(ctx, _scatter_add(shape, rows[None, :, :, :, None], cols[None, :, :, :, None],
                                    share[:, :, :, None, :]))


# ------------------------------------------------------------------------------ data movement

@register("StridedSliceGrad", kind=MOVE)
def strided_slice_grad(shape, begin, end, strides, dy, *, ctx, begin_mask=0, end_mask=0, ellipsis_mask=0,
                       new_axis_mask=0, shrink_axis_mask=0):
    """Zeros of ``shape`` with ``dy`` written where StridedSlice read: exact (data movement)."""
    from .array_ops import strided_index

    out = np.zeros(as_int_list(shape), dtype=dy.dtype)
    index = strided_index(begin, end, strides, begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_axis_mask)
    out[index] = dy
    return out


@register("DynamicStitch", "ParallelDynamicStitch", kind=MOVE)
def dynamic_stitch(*args, ctx):
    """merged[indices[m][i]] = data[m][i]; for repeated indices the later input wins (as TF's
    DynamicStitch; reductions' gradients use it on shapes): exact."""
    n = len(args) // 2
    idx, data = [np.asarray(a).astype(np.int64) for a in args[:n]], [np.asarray(a) for a in args[n:]]
    tail = data[0].shape[idx[0].ndim:]
    size = max((int(i.max()) + 1 for i in idx if i.size), default=0)
    out = np.zeros((size,) + tail, dtype=data[0].dtype)
    for i, d in zip(idx, data):
        out[i.reshape(-1)] = d.reshape((-1,) + tail)
    return out


# ------------------------------------------------------------------------------ host: gradient shape bookkeeping

@register("BroadcastGradientArgs", kind=HOST)
def broadcast_gradient_args(s0, s1, *, ctx):
    """The axes each operand's gradient is summed over, as TF's BCast gives them."""
    a, b = as_int_list(s0), as_int_list(s1)
    dt = np.asarray(s0).dtype
    if a == b:
        return np.zeros(0, dt), np.zeros(0, dt)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    r0, r1 = [], []
    for i, (p, q) in enumerate(zip(a, b)):
        if p == q == 1:
            r0.append(i)
            r1.append(i)
        elif p == 1:
            r0.append(i)
        elif q == 1:
            r1.append(i)
        elif p != q:
            raise AscendEmuError(f"BroadcastGradientArgs: shapes {as_int_list(s0)} and {as_int_list(s1)} "
                                 "do not broadcast; fix the model's shapes")
    return np.asarray(r0, dt), np.asarray(r1, dt)


@register("InvertPermutation", kind=HOST)
def invert_permutation(perm, *, ctx):
    """y[perm[i]] = i (Transpose's gradient inverts its permutation): exact."""
    p = np.asarray(perm)
    out = np.empty_like(p)
    out[p.astype(np.int64)] = np.arange(p.size, dtype=p.dtype)
    return out


@register("ShapeN", kind=HOST)
def shape_n(*xs, ctx, out_type="int32"):
    return tuple(np.asarray(x.shape, dtype=np.dtype(out_type)) for x in xs)


@register("NoOp", kind=HOST)
def no_op(*xs, ctx):
    return ()

"""Matrix ops on the cube unit, and the composite NN ops of the vector unit."""
from __future__ import annotations

import string

import numpy as np

from ..errors import AscendEmuError
from ..graph.core import dtype_name as _dtype_name
from . import log_kernels, sourced
from ._util import as_int_list, contiguous, finish, is_float, sum_f32, to64, widen
from .math_ops import vec
from .registry import CUBE, VECTOR, Source, register

#: the cube's sources (NUMERICS.md sections 3 and 13): Mmad with a float32 L0C; the order and rounding inside the
#: K blocks assumed; float32 operands through HF32 with the family's transMode
_CUBE_FILES = ("ASCEND-FACTS.md section 2 (asc-devkit Mmad: 16-bit products exact, float32 L0C)",)
_CUBE_ASSUMED = ("cube_block_sum", "cube_extra_bits", "cube_normalize", "hf32_bits")
MATMUL_SOURCE = Source(_CUBE_FILES + ("hicann/ops-nn matmul/mat_mul_v3/op_kernel/mat_mul_base_kernel.h, "
                                      "matmul/batch_mat_mul_v3/op_kernel/batch_mat_mul_v3.h (SetHF32(true, 1))",),
                       _CUBE_ASSUMED + ("hf32_matmul_rounding",),
                       "the K-block accumulation assumed (tensor-core block-FMA models); HF32 ties away")
CONV_SOURCE = Source(_CUBE_FILES + ("hicann/ops-nn conv/conv3d_v2/op_kernel/conv3d/conv3d_common_init_func.h "
                                    "(SetHF32TransMode(false))",),
                     _CUBE_ASSUMED + ("hf32_conv_rounding",), "the K-block accumulation assumed; HF32 nearest even")
#: Conv2D and Conv3D: also the order of their K = taps x channels terms
CONV_K_SOURCE = Source(CONV_SOURCE.files, CONV_SOURCE.assumed + ("cube_conv_k_order",),
                       "the K-block accumulation and the K order assumed; HF32 nearest even")


def _cube_kw(ctx, bias=None, epilogue=None):
    operand = ctx.dtype_name
    # (graph.core.dtype_name: ``.name`` memoized; numpy computes ``ctx.cube_out.name`` in Python, ~1.7 us a call)
    kw = dict(operand_dtype=operand, out_dtype=_dtype_name(ctx.cube_out), overflow_mode=ctx.overflow_mode,
              subnormals=ctx.subnormals, model=ctx.cube_model, bias=bias)
    if epilogue is not None:   # a fused op's chain (numerics.cube.Epilogue)
        kw["epilogue"] = epilogue
    return kw


def _record(ctx, res):
    y, st = res
    ctx.record(st)
    return y


@register("MatMul", kind=CUBE, source=MATMUL_SOURCE)
def mat_mul(a, b, *, ctx, transpose_a=False, transpose_b=False, bias=None, epilogue=None):
    from ..numerics.cube import matmul

    return _record(ctx, matmul(a, b, transpose_a=bool(transpose_a), transpose_b=bool(transpose_b),
                               multicore=ctx.multicore, **_cube_kw(ctx, bias, epilogue)))


@register("BatchMatMulV2", "BatchMatMul", "BatchMatMulV3", kind=CUBE, source=MATMUL_SOURCE)
def batch_mat_mul(a, b, *, ctx, adj_x=False, adj_y=False, bias=None, epilogue=None):
    from ..numerics.cube import batch_matmul

    return _record(ctx, batch_matmul(a, b, adj_x=bool(adj_x), adj_y=bool(adj_y), multicore=ctx.multicore,
                                     **_cube_kw(ctx, bias, epilogue)))


def _nhwc(data_format):
    if data_format not in ("NHWC", None):
        raise AscendEmuError(f"data_format {data_format!r} is not supported; export the model with NHWC (channels_last)")


def _hw(v, default=(1, 1)):
    v = as_int_list(v) if v is not None else list(default)
    return (v[1], v[2]) if len(v) == 4 else tuple(v)


def _padding(padding, explicit_paddings):
    if padding == "EXPLICIT":
        p = as_int_list(explicit_paddings)
        return [[p[2], p[3]], [p[4], p[5]]]
    return padding


@register("Conv2D", kind=CUBE, source=CONV_K_SOURCE)
def conv2d_op(x, w, *, ctx, strides=(1, 1, 1, 1), padding="VALID", dilations=(1, 1, 1, 1),
              explicit_paddings=(), data_format="NHWC", bias=None, epilogue=None):
    from ..numerics.cube import conv2d, depthwise_conv2d

    _nhwc(data_format)
    geometry = dict(strides=_hw(strides), padding=_padding(padding, explicit_paddings), dilations=_hw(dilations))
    cin, cin_g, cout = np.shape(x)[-1], np.shape(w)[2], np.shape(w)[3]
    if cin == cin_g:
        return _record(ctx, conv2d(x, w, **geometry, **_cube_kw(ctx, bias, epilogue)))
    if cin_g == 0 or cin % cin_g or cout % (cin // cin_g):
        raise AscendEmuError(f"Conv2D: the input's {cin} channels are not a whole number of groups of the "
                             f"filter's {cin_g}, or its {cout} output channels do not split over the groups")
    # grouped convolution (Keras Conv2D(groups=G)): output channel o reads input group o // (cout // G)
    groups = cin // cin_g
    per = cout // groups
    if cin_g == 1:
        # one input channel per group: a depthwise convolution with channel multiplier cout // cin
        kh, kw = np.shape(w)[:2]
        return _record(ctx, depthwise_conv2d(x, np.reshape(w, (kh, kw, cin, per)), **geometry,
                                             **_cube_kw(ctx, bias, epilogue)))
    outs = []
    for g in range(groups):
        b = None if bias is None else np.asarray(bias)[g * per:(g + 1) * per]
        outs.append(_record(ctx, conv2d(x[..., g * cin_g:(g + 1) * cin_g], w[..., g * per:(g + 1) * per],
                                        **geometry, **_cube_kw(ctx, b))))
    return np.concatenate(outs, axis=-1)


@register("DepthwiseConv2dNative", kind=CUBE, source=CONV_SOURCE)
def depthwise_op(x, w, *, ctx, strides=(1, 1, 1, 1), padding="VALID", dilations=(1, 1, 1, 1),
                 explicit_paddings=(), data_format="NHWC", bias=None, epilogue=None):
    from ..numerics.cube import depthwise_conv2d

    _nhwc(data_format)
    return _record(ctx, depthwise_conv2d(x, w, strides=_hw(strides), padding=_padding(padding, explicit_paddings),
                                         dilations=_hw(dilations), **_cube_kw(ctx, bias, epilogue)))


def _einsum_plan(equation, ndims):
    """Split a two-operand einsum into (batch, free_a, free_b, contracted) label groups."""
    lhs, _, out = equation.replace(" ", "").partition("->")
    ins = lhs.split(",")
    if len(ins) != 2 or not _:
        raise NotImplementedError(f"Einsum {equation!r}: only explicit two-operand equations run on the cube")
    spare = [c for c in string.ascii_letters if c not in equation]
    if "..." in equation:
        n = max(nd - len(s.replace("...", "")) for s, nd in zip(ins, ndims))
        ell = "".join(spare[:n])
        ins = [s.replace("...", ell[len(ell) - (nd - len(s.replace("...", ""))):]) for s, nd in zip(ins, ndims)]
        out = out.replace("...", ell)
    a, b = ins
    for s in (a, b):
        if any(c not in out and c not in (b if s is a else a) for c in s):
            raise NotImplementedError(f"Einsum {equation!r}: a label summed within one operand")
    batch = [c for c in out if c in a and c in b]
    free_a = [c for c in a if c not in b]
    free_b = [c for c in b if c not in a]
    contract = [c for c in a if c in b and c not in out]
    return a, b, out, batch, free_a, free_b, contract


@register("Einsum", kind=CUBE, source=MATMUL_SOURCE)
def einsum(*xs, ctx, equation, bias=None, epilogue=None):
    """Two-operand einsum lowered to one batch matmul: (batch, M, K) x (batch, K, N).

    ``bias`` (fused by MatMulBiasAddFusionPass) indexes the output's last label, which must
    come from the second operand; it is added in the fp32 accumulator (L0C). ``epilogue``
    (numerics.cube.Epilogue): a fused chain applied to the product before the output's transpose,
    so only one of single values (elementwise, it commutes with the transpose).
    """
    from ..numerics.cube import batch_matmul, reshaped_view

    if len(xs) != 2:
        raise NotImplementedError(f"Einsum with {len(xs)} operands")
    x, y = xs
    a, b, out, batch, free_a, free_b, contract = _einsum_plan(equation, (x.ndim, y.ndim))
    if any(x.shape[a.index(c)] != y.shape[b.index(c)] for c in batch + contract):
        raise NotImplementedError(f"Einsum {equation!r} with broadcast dimensions")   # runs on the AI CPU
    size = {**dict(zip(a, x.shape)), **dict(zip(b, y.shape))}
    xt = np.transpose(x, [a.index(c) for c in batch + free_a + contract])
    yt = np.transpose(y, [b.index(c) for c in batch + contract + free_b])
    nb = int(np.prod([size[c] for c in batch])) if batch else 1
    m = int(np.prod([size[c] for c in free_a])) if free_a else 1
    n = int(np.prod([size[c] for c in free_b])) if free_b else 1
    k = int(np.prod([size[c] for c in contract])) if contract else 1
    bvec = None
    if bias is not None:
        if not out or out[-1] not in free_b:
            raise AscendEmuError(f"Einsum {equation!r}: a fused bias needs the output's last label from the "
                                 "second operand; switch MatMulBiasAddFusionPass off for this model")
        b1 = np.asarray(bias, dtype=np.float32).reshape(-1)
        if b1.size != size[out[-1]]:
            raise AscendEmuError(f"fused bias of {b1.size} values does not match the {size[out[-1]]} output "
                                 "columns; switch MatMulBiasAddFusionPass off for this model")
        # spread the bias over the flattened free labels of the second operand
        bvec = b1[np.indices([size[c] for c in free_b])[free_b.index(out[-1])].reshape(-1)]
    # the second operand as (batch..., k, n) where that is a view: the cube packs a transposed 16-bit one from its
    # strides (the attention scores' keys, BSNH read as BNHS: numpy's copy of it cost more than the packing)
    bshape = [size[c] for c in batch] + [k, n]
    yb = reshaped_view(yt, bshape) if len(batch) == 2 else None
    if yb is None:
        yb = contiguous(yt).reshape(nb, k, n)
    z = _record(ctx, batch_matmul(contiguous(xt).reshape([size[c] for c in batch] + [m, k]) if yb.ndim == 4
                                  else contiguous(xt).reshape(nb, m, k), yb, **_cube_kw(ctx, bvec, epilogue)))
    labels = batch + free_a + free_b
    z = z.reshape([size[c] for c in labels])
    return contiguous(np.transpose(z, [labels.index(c) for c in out]))


def _windows(x, ksize, strides, padding, pad_value):
    """Sliding NHWC windows -> (N, OH, OW, C, kh, kw) view and the count of real elements."""
    kh, kw = _hw(ksize)
    sh, sw = _hw(strides)
    n, h, w, c = x.shape
    if padding == "SAME":
        oh, ow = -(-h // sh), -(-w // sw)
        ph = max((oh - 1) * sh + kh - h, 0)
        pw = max((ow - 1) * sw + kw - w, 0)
        pads = ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0))
    elif padding == "VALID":
        pads = ((0, 0),) * 4
    else:
        raise NotImplementedError(f"pooling padding {padding!r}")
    xp = np.pad(x, pads, constant_values=pad_value)
    ones = np.pad(np.ones((1, h, w, 1), np.float64), pads)
    v = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::sh, ::sw]
    cnt = np.lib.stride_tricks.sliding_window_view(ones, (kh, kw), axis=(1, 2))[:, ::sh, ::sw].sum(axis=(-1, -2))
    return v, cnt


def _max_windows(x32, ksize, strides, padding):
    """The float32 max of every pooling window of float32 ``x32`` (NHWC), padding never selected.

    The kernel when every window's max is one bit pattern (no NaN, no -0.0 in the input: see
    ``kernels/pool.py``); else numpy's max over the windows, whose order decides a NaN's payload
    and which of +0/-0 a tie keeps."""
    from ..kernels import pool as _kp

    x32 = np.ascontiguousarray(x32) if x32.ndim == 4 else x32    # (once: the scan and the kernel read it)
    if x32.ndim == 4 and padding in ("SAME", "VALID") and x32.size and \
            _kp.max_pool_safe(x32.reshape(-1).view(np.uint32)):
        kh, kw = _hw(ksize)
        sh, sw = _hw(strides)
        n, h, w, c = x32.shape
        if padding == "SAME":
            oh, ow = -(-h // sh), -(-w // sw)
            pt, pl = max((oh - 1) * sh + kh - h, 0) // 2, max((ow - 1) * sw + kw - w, 0) // 2
        else:
            oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
            pt = pl = 0
        if oh > 0 and ow > 0:
            out = np.empty((n, oh, ow, c), np.float32)
            _kp.max_pool_f32(x32, out, kh, kw, sh, sw, pt, pl)
            return out
    v, _ = _windows(x32, ksize, strides, padding, -np.inf)
    return v.max(axis=(-1, -2))


def _as_f32(x) -> np.ndarray:
    """x as float32 (16-bit floats widen exactly through the cast kernel: numpy's bits, faster)."""
    from ..numerics.vector import cast

    return cast(x, "float32")[0] if x.dtype.itemsize == 2 and x.dtype.kind in "fV" else np.asarray(x, np.float32)


@register("MaxPool", kind=VECTOR, source=Source(exact="the window's largest value: a selection"))
def max_pool(x, *, ctx, ksize, strides, padding, data_format="NHWC"):
    _nhwc(data_format)
    return finish(ctx, _max_windows(_as_f32(x), ksize, strides, padding))  # a max of representable values is exact


#: the TBE kernels (canndev, read in the public mirror dengguojie/vue-element-admin)
_TBE = "canndev ops/built-in/tbe/impl/dynamic/"


@register("AvgPool", kind=VECTOR, source=Source(
    ("canndev ops/built-in/fusion_pass/graph_fusion/ai_core/avg_pool_pass.cc (AvgPoolFusionPass: a depthwise filter "
     "of fp16(1/(kh kw)) for VALID, of ones and a Mul node <name>_mul_layer by fp16(1/area) for SAME; output width 1 "
     "or a stride over 63 left alone)",
     _TBE + "avg_pool.py (with a filter: conv2d, groups = C, on the cube)", "NUMERICS.md section 2 (composite ops)"),
    ("op_model", "cube_block_sum", "cube_extra_bits", "cube_normalize"),
    "fp16, static shape, output width > 1, strides <= 63: the depthwise convolution on the cube (fp16 products exact, "
    "float32 accumulation, the fixpipe's rounding), SAME then an fp16 Mul by fp16(1/area), recorded as a real dump "
    "holds it: its own op <name>_mul_layer after the AvgPool, whose own output is the window sum; otherwise "
    "(float32, bf16, output width 1, larger strides, op_model exact) the window's mean in float64, one rounding (the "
    "composite rule: assumed; the vector kernel's reduce_avg adds in the input dtype are not modelled)"))
def avg_pool(x, *, ctx, ksize, strides, padding, data_format="NHWC"):
    """AvgPool as GE runs an fp16 one (AvgPoolFusionPass + the TBE AvgPool with a filter): a depthwise convolution
    on the cube by fp16(1/(kh*kw)) (VALID), or by ones followed by an fp16 multiply by fp16(1/area) per output
    position (SAME); other cases the window's mean in float64, rounded once."""
    _nhwc(data_format)
    x = np.asarray(x)
    v, cnt = _windows(to64(x), ksize, strides, padding, 0.0)
    # AvgPoolFusionPass leaves the node to the vector kernel for a stride over 63 (its check) or an output width of 1
    if (x.dtype == np.float16 and ctx.dtype_name == "float16" and ctx.op_model != "exact" and v.shape[2] != 1
            and max(_hw(strides)) <= 63):
        from ..numerics.cube import depthwise_conv2d
        from .math_ops import vec

        kh, kw = _hw(ksize)
        # the pass's float arithmetic: 1.0 / area stored as float, then converted to fp16
        area16 = (lambda a: np.float16(np.float32(1.0 / a)))
        w = np.full((kh, kw, x.shape[3], 1), area16(kh * kw) if padding == "VALID" else np.float16(1), np.float16)
        kwargs = _cube_kw(ctx)
        kwargs["out_dtype"] = "float16"
        y = _record(ctx, depthwise_conv2d(x, w, strides=_hw(strides), padding=padding, **kwargs))
        if padding == "SAME":
            # the pass's Mul node <name>_mul_layer: its own op on the NPU (and in a dump), so its own status
            coffe = np.vectorize(area16, otypes=[np.float16])(np.maximum(cnt[:1, :, :, :1], 1))
            own = ctx.status
            ctx.status = 0
            mean = vec(ctx, "mul", y, coffe)
            ctx.split = ((y,), own, [("_mul_layer", "Mul", (mean,), ctx.status,
                                      "added by AvgPoolFusionPass: the window sum times fp16(1/area) per output "
                                      "position")])
            ctx.status |= own       # a caller that records the op as one (not the replay) sees both nodes' bits
            return mean
        return y
    return finish(ctx, v.sum(axis=(-1, -2)) / cnt)


@register("AvgPoolV2", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/avg_pool_v2.py (explicit pads, ceil_mode, exclusive)",
     "NUMERICS.md section 2 (composite ops)"), (),
    "the window's mean in float64, one rounding (the composite rule: assumed, no parameter); exclusive=False counts "
    "the explicit pads but not the ceil mode's extra end rows, as onnxruntime and torch (assumed, no parameter)"))
def avg_pool_v2(x, *, ctx, ksize, strides, pads, ceil_mode=False, exclusive=True, padding_mode="CALCULATED",
                data_format="NHWC", global_pooling=False):
    """CANN's AvgPoolV2 (ONNX AveragePool's explicit pads, ceil_mode and count_include_pad): the mean of each
    window over its input elements (``exclusive``) or over its input and explicit-pad elements, never over the
    rows and columns the ceil mode adds at the end (a last window starting in the end padding dropped); computed
    exactly (float64) and rounded once, as AvgPool."""
    _nhwc(data_format)
    if padding_mode != "CALCULATED" or global_pooling:
        raise AscendEmuError(f"AvgPoolV2: padding_mode {padding_mode!r}, global_pooling {global_pooling!r}: only "
                             "CALCULATED pads are emulated")
    kh, kw = _hw(ksize)
    sh, sw = _hw(strides)
    pt, pb, pl, pr = as_int_list(pads)
    x = to64(x)
    n, h, w, c = x.shape
    ext = []
    for size, k, st, p0, p1 in ((h, kh, sh, pt, pb), (w, kw, sw, pl, pr)):
        span = size + p0 + p1 - k
        out = (-(-span // st) if ceil_mode else span // st) + 1
        if ceil_mode and (out - 1) * st >= size + p0:
            out -= 1
        if out < 1:
            raise AscendEmuError(f"AvgPoolV2: window {k} over {size} with pads ({p0}, {p1}) leaves no output")
        ext.append((out, max((out - 1) * st + k - (size + p0 + p1), 0)))
    (oh, eh), (ow, ew) = ext
    xp = np.pad(x, ((0, 0), (pt, pb + eh), (pl, pr + ew), (0, 0)))
    real = np.pad(np.ones((h, w)), ((pt, pb + eh), (pl, pr + ew)))
    counted = real if exclusive else np.pad(np.ones((h + pt + pb, w + pl + pr)), ((0, eh), (0, ew)))
    v = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::sh, ::sw][:, :oh, :ow]
    cnt = np.lib.stride_tricks.sliding_window_view(counted, (kh, kw))[::sh, ::sw][:oh, :ow].sum(axis=(-1, -2))
    return finish(ctx, v.sum(axis=(-1, -2)) / cnt[None, :, :, None])


@register("Softmax", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/softmax_v2.py", "hicann/ops-nn activation/softmax_v2/op_kernel/arch35/"
     "softmax_v2_ar_full_load.h"), ("op_model", "impl_mode"),
    "TBE: max and x - max in the input dtype, then float32 exp, sum, div; Ascend C: all float32; sum order assumed"))
def softmax(x, *, ctx):
    """exp(x - max) / sum(exp(x - max)) over the last axis: CANN's kernel step by step, or exact (float64)."""
    if ctx.op_model != "exact":
        return sourced.softmax(ctx, x)
    z = to64(x)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return finish(ctx, z / z.sum(axis=-1, keepdims=True))


@register("LogSoftmax", kind=VECTOR, source=Source(
    (_TBE + "log_softmax_v2.py (log_softmax_v2_compute)",
     "hicann/ops-nn activation/log_softmax_v2/op_kernel/arch35/log_softmax_v2_ar_full_load.h"),
    ("op_model", "impl_mode"),
    "TBE: max and x - max in the input dtype, then float32 exp, sum, log and difference; Ascend C: all float32; one "
    "rounding; sum order assumed; bf16, which the TBE kernel does not list (fp16/float32), is assumed to take the "
    "fp16 steps in bf16 (no parameter)"))
def log_softmax(x, *, ctx):
    """x - max - log(sum(exp(x - max))) over the last axis: CANN's kernel step by step, or exact (float64)."""
    if ctx.op_model != "exact":
        return log_kernels.log_softmax(ctx, x)
    z = to64(x)
    z = z - z.max(axis=-1, keepdims=True)
    return finish(ctx, z - np.log(np.exp(z).sum(axis=-1, keepdims=True)))


@register("Softplus", kind=VECTOR, eltwise="softplus", source=Source(
    (_TBE + "softplus.py (softplus_compute)", "hicann/ops-nn activation/softplus/op_kernel/arch35/softplus_dag.h"),
    ("op_model", "impl_mode"),
    "both kernels' float32 steps: (log(exp(-max(x, 0)) + 1) + max(x, 0)) + log(exp(min(x, 0)) + 1) - ln 2, one "
    "rounding; op_model exact: the vector unit's softplus in float64"))
def softplus(x, *, ctx):
    """CANN's softplus kernel step by step (:func:`ascend_emu.ops.log_kernels.softplus`); under
    ``op_model="exact"`` the vector unit's softplus, max(x, 0) + log1p(e^-|x|) in float64 rounded once."""
    if ctx.op_model != "exact" and is_float(x):
        return log_kernels.softplus(ctx, x)
    return vec(ctx, "softplus", x, impl_mode="high_precision")


def _channels(x):
    if x.ndim < 2:
        raise AscendEmuError(f"batch norm needs an input of rank >= 2 with channels last, got shape {x.shape}")
    return tuple(range(x.ndim - 1)), x.size // x.shape[-1]


def batch_norm_training(x, scale, offset, mean, variance, *, ctx, epsilon=1e-3, exponential_avg_factor=1.0):
    """FusedBatchNormV3 with is_training=True as CANN splits it: BNTrainingReduce (per-channel sum
    and sum of squares in float32) and BNTrainingUpdate (float32 chain, y rounded once).

    Returns TF's five outputs: y, the running mean and variance (the variance with Bessel's
    correction n/(n-1), blended by ``exponential_avg_factor``), the batch mean and the biased
    batch variance (reserve spaces 1 and 2), and an empty reserve space 3.
    """
    axes, n = _channels(x)
    if x.ndim == 4 and x.size and type(x) is np.ndarray and \
            (x.dtype == np.float32 or (x.dtype.itemsize == 2 and x.dtype.kind in "fV")):
        fast = _batch_norm_training_pass(x, scale, offset, mean, variance, ctx, epsilon, exponential_avg_factor, n)
        if fast is not None:
            return fast
    xw = widen(ctx, x)
    with np.errstate(all="ignore"):
        s = sum_f32(ctx, xw, axes)
        sq = sum_f32(ctx, xw * xw, axes)
        bmean = s / np.float32(n)
        bvar = sq / np.float32(n) - bmean * bmean
        mult = np.asarray(scale, np.float32) / np.sqrt(np.abs(bvar + np.float32(epsilon)))
        addend = np.asarray(offset, np.float32) - mult * bmean
        y = mult * xw + addend
        run_mean, run_var = _running_stats(bmean, bvar, mean, variance, n, exponential_avg_factor)
    return (finish(ctx, y), run_mean.astype(np.float32), run_var.astype(np.float32), bmean.astype(np.float32),
            bvar.astype(np.float32), np.zeros(0, np.float32))


def _running_stats(bmean, bvar, mean, variance, n, exponential_avg_factor):
    """FusedBatchNormV3's running mean and variance in float32: the batch's (variance made unbiased) averaged
    into the old ones by the factor (1: the batch's alone)."""
    bessel = np.float32(0.0 if n == 1 else n / (n - 1))
    f = np.float32(exponential_avg_factor)
    unbiased = bvar * bessel
    if f == 1:
        return bmean, unbiased
    return (bmean * f + np.asarray(mean, np.float32) * (np.float32(1.0) - f),
            unbiased * f + np.asarray(variance, np.float32) * (np.float32(1.0) - f))


def _finish_as_stored(ctx, y):
    """``finish(ctx, y)`` run in ``y``'s memory order (an elementwise rounding: the same bits and status), so that
    an NCHW array's NHWC view is not copied twice to be rounded to a 16-bit dtype."""
    if ctx.dtype == np.float32 or y.ndim < 2 or y.flags.c_contiguous:
        return finish(ctx, y)
    order = sorted(range(y.ndim), key=lambda d: -y.strides[d])
    inverse = sorted(range(y.ndim), key=lambda d: order[d])
    return np.transpose(finish(ctx, np.transpose(y, order)), inverse)


def _batch_norm_training_pass(x, scale, offset, mean, variance, ctx, epsilon, exponential_avg_factor, n):
    """:func:`batch_norm_training` in two Numba passes (``numerics/batchnorm.py``), the same float32 steps in the
    same order on the array's own strides; None (the order generator put back) where a value is Inf or NaN."""
    from ..numerics import batchnorm as _bn

    restore = _bn.snapshot(ctx.multicore)
    xw = _bn.as_f32(x)
    zeros = np.zeros(x.shape[3], np.float32)
    sums = _bn.sums(_bn.FORWARD, xw, None, zeros, zeros, overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals,
                    multicore=ctx.multicore)
    if sums is None:
        restore()
        return None
    s, sq = sums
    with np.errstate(all="ignore"):
        bmean = s / np.float32(n)
        bvar = sq / np.float32(n) - bmean * bmean
        mult = np.asarray(scale, np.float32) / np.sqrt(np.abs(bvar + np.float32(epsilon)))
        addend = np.asarray(offset, np.float32) - mult * bmean
    y = _bn.apply(_bn.FORWARD, xw, None, mult, addend, addend, subnormals=ctx.subnormals,
                  flush_out=ctx.dtype == np.float32 and ctx.subnormals == "flush")
    if y is None:
        restore()
        return None
    with np.errstate(all="ignore"):
        run_mean, run_var = _running_stats(bmean, bvar, mean, variance, n, exponential_avg_factor)
    return ((y if ctx.dtype == np.float32 else _finish_as_stored(ctx, y)), run_mean.astype(np.float32),
            run_var.astype(np.float32), bmean.astype(np.float32), bvar.astype(np.float32), np.zeros(0, np.float32))


@register("FusedBatchNormV3", "FusedBatchNorm", "FusedBatchNormV2", kind=VECTOR, fp32_inputs=(1, 2, 3, 4),
          source=Source(("canndev ops/built-in/tbe/impl/dynamic/bn_infer.py", "hicann/ops-nn norm/batch_norm/op_kernel/"
                         "arch35/batch_norm_infer.h"), ("op_model",),
                        "inference sourced; is_training's batch statistics are the float32 model, not sourced"))
def fused_batch_norm(x, scale, offset, mean, variance, *, ctx, epsilon=1e-3, is_training=False, data_format="NHWC",
                     exponential_avg_factor=1.0):
    """Inference batch norm: y = (x - mean) * scale / sqrt(var + eps) + offset, CANN's kernel step by step,
    or exact (float64) and rounded once. In training mode, :func:`batch_norm_training`."""
    _nhwc(data_format)
    if is_training:
        return batch_norm_training(x, scale, offset, mean, variance, ctx=ctx, epsilon=epsilon,
                                   exponential_avg_factor=exponential_avg_factor)
    if ctx.op_model != "exact":
        y = sourced.batch_norm_inference(ctx, x, scale, offset, mean, variance, float(epsilon))
    else:
        inv = to64(scale) / np.sqrt(to64(variance) + float(epsilon))
        y = finish(ctx, (to64(x) - to64(mean)) * inv + to64(offset))
    m = np.asarray(mean, dtype=np.float32)
    v = np.asarray(variance, dtype=np.float32)
    return y, m, v, m, v, np.zeros(0, np.float32)

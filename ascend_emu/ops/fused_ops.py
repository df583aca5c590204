"""Fused ops: what the fusion rules (:mod:`ascend_emu.npu.fusion.rules`) put in place of a pattern.

Registered under private op types (a leading underscore: they never occur in a TF graph).
Their numerics are those of the fused CANN operator (NUMERICS.md section 6): the
intermediates of the pattern are not rounded to the compute dtype.

- ``_FusedConv2D`` / ``_FusedMatMul`` / ``_FusedBatchMatMul``: a cube op whose ``bias``
  (a float32 vector, an attribute so it is not cast to the operand dtype) initialises
  the float32 accumulator (L0C), and whose optional ``chain`` of elementwise steps
  (UB fusion) is applied to the float32 accumulator in the vector unit in float32
  before one rounding to the cube output dtype.
- ``_EltwiseChain``: elementwise steps in float32, one rounding at the end.
- ``_LayerNorm`` / ``_Gelu``: CANN's LayerNorm and Gelu kernels instruction by instruction
  (float32 steps, :mod:`ascend_emu.ops.sourced`, the vector unit's sourced gelu), or under
  ``op_model="exact"`` the whole formula without intermediate rounding (float64), one rounding.

A chain step is ``{"op": TF type, "args": [...], "attrs": {...}, "name": original op}``;
an argument is ``-1`` for the running value or ``k`` for the fused op's input ``k``.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import AscendEmuError
from . import nn_ops, sourced
from ._util import contiguous, finish, is_float, sum_f32, to64, to_f32, widen
from .math_ops import vec
from ..graph.core import dtype_name as _dtype_name
from ..numerics.chain import chain_to_f16
from .registry import CUBE, OPS, VECTOR, OpContext, Source, register


def _sub(ctx: OpContext, dtype=None, cube_out=None) -> OpContext:
    """A context with ``ctx``'s policy, another dtype, and its own status."""
    return OpContext(dtype=dtype if dtype is not None else ctx.dtype_name,
                     cube_out=cube_out if cube_out is not None else _dtype_name(ctx.cube_out),
                     overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals, cube_model=ctx.cube_model,
                     impl_mode=ctx.impl_mode, reduce_accumulate=ctx.reduce_accumulate,
                     op_model=ctx.op_model, multicore=ctx.multicore, ftz=ctx.ftz)


def _flushes(ctx: OpContext, chain) -> bool:
    """Whether a step of ``chain`` is a division the SoC's cce_ftz flushes (the fast paths then decline)."""
    return ctx.ftz and any(step["op"] in ("RealDiv", "Div") for step in chain)


def _f32(x):
    """A float operand of a float32 chain as float32: fp16/bf16 widen exactly (by the cast kernel, which
    gives numpy's bits, NaN payloads included, at memory speed; numpy converts fp16 in software)."""
    return to_f32(x) if is_float(x) else x


def _relu_f32(x, out=None):
    # maximum keeps -0 (x >= 0 for x = -0); adding +0 turns it into +0, as the kernel's x > 0 ? x : 0
    out = np.maximum(x, np.float32(0), out=out)
    return np.add(out, np.float32(0), out=out)


def _relu6_f32(x, out=None):
    return _relu_f32(np.minimum(x, np.float32(6), out=out), out=out)


# chain steps that are one IEEE float32 operation per element (numpy's own, broadcasting as TF does) or an
# exact selection: on float32 data with subnormals kept and every result finite, numerics.vector.vector
# computes them with these very numpy functions (its float32 fast paths)
_NUMPY_STEPS = {"AddV2": np.add, "Add": np.add, "BiasAdd": np.add, "Sub": np.subtract, "Mul": np.multiply,
                "RealDiv": np.divide, "Div": np.divide, "Relu": _relu_f32, "Relu6": _relu6_f32}


def _chain_numpy(ctx: OpContext, value, inputs, chain):
    """The chain's float32 result computed step by step with numpy (no flat copies of broadcast
    operands, no per-step op dispatch), or None where that might differ from the ops themselves: a
    step of another kind, flushed subnormals, non-float data, a result that is Inf or NaN anywhere
    (the ops' overflow handling and status then apply: the caller runs them)."""
    if ctx.subnormals != "keep" or _flushes(ctx, chain):
        return None
    own = None  # the float32 array this function made, overwritten by later steps of its shape
    for i, step in enumerate(chain):
        fn = _NUMPY_STEPS.get(step["op"])
        attrs = step.get("attrs") or {}
        if fn is None or attrs.get("data_format", "NHWC") not in ("NHWC", "N..C"):
            return None
        args = [value if a == -1 else inputs[a] for a in step["args"]]
        if not all(is_float(x) for x in args):
            return None
        args = [x if x is own else _f32(x) for x in args]
        out = own if own is not None and np.broadcast_shapes(*(np.shape(x) for x in args)) == own.shape else None
        with np.errstate(all="ignore"):
            value = own = np.asarray(fn(*args, out=out), dtype=np.float32)
        # an Inf or NaN stays one through adds, subs, muls and a division's numerator, so the running
        # value is checked where that ends: the last step, before a relu, before it divides
        nxt = chain[i + 1] if i + 1 < len(chain) else None
        if (nxt is None or nxt["op"] in ("Relu", "Relu6") or (nxt["op"] in ("RealDiv", "Div") and nxt["args"][1] == -1)
                or -1 not in nxt["args"]) and not np.isfinite(value).all():
            return None
    return value


def _rsqrt_f32(x):
    # the sourced kernels' two float32 instructions (kernels/sourced.py RSQRT_F32: vsqrt, then vdiv(1, .)), each
    # one correctly rounded IEEE operation, as numpy computes them (into an array: a 0-d input gives a scalar)
    s = np.sqrt(x, out=np.empty(np.shape(x), np.float32))
    return np.divide(np.float32(1), s, out=s)


#: the steps of a small float32 chain computed in one go (_chain_small_f32): _NUMPY_STEPS and the sourced Rsqrt;
#: the selections write into a new array (their in-place second ufunc needs one where a 0-d value gives a scalar)
_SMALL_STEPS = {**_NUMPY_STEPS, "Rsqrt": _rsqrt_f32,
                "Relu": lambda x: _relu_f32(x, out=np.empty(np.shape(x), np.float32)),
                "Relu6": lambda x: _relu6_f32(x, out=np.empty(np.shape(x), np.float32))}
#: operands of at most this many elements: BN's per-channel Rsqrt and shift chains (16-32 floats), where the
#: step-by-step path's ~50-110 us a chain were Python calls (vec -> vector per step, a context per step)
SMALL_CHAIN = 4096
_F32 = np.dtype(np.float32)


def _chain_small_f32(ctx: OpContext, xs, chain):
    """The float32 result of a float32 chain on small float32 operands in one go, or None (then the other paths
    run). Taken only where every operand and every step's result is finite: each step is then one IEEE float32
    operation (or an exact selection) with no status and no saturation, which is numpy's own result; anything
    else (an Inf/NaN anywhere, flushed subnormals, the exact op model's float64 Rsqrt) declines."""
    if ctx.dtype != _F32 or ctx.subnormals != "keep" or ctx.ftz:
        return None
    for x in xs:
        if type(x) is not np.ndarray or x.dtype != _F32 or x.size > SMALL_CHAIN:
            return None
    value = None
    with np.errstate(all="ignore"):
        for x in xs:
            if not np.isfinite(x).all():
                return None
        for step in chain:
            op = step["op"]
            fn = _SMALL_STEPS.get(op)
            attrs = step.get("attrs")
            if fn is None or (op == "Rsqrt" and ctx.op_model == "exact") or (
                    attrs and attrs.get("data_format", "NHWC") not in ("NHWC", "N..C")):
                return None
            value = np.asarray(fn(*[value if a == -1 else xs[a] for a in step["args"]]))
            if not np.isfinite(value).all():
                return None
    return value if value is not None and value.dtype == _F32 else None


def _chain(ctx: OpContext, value, inputs, chain) -> np.ndarray:
    """Apply the elementwise ``chain`` in float32 (the Unified Buffer); the float32 result."""
    fast = _chain_numpy(ctx, value, inputs, chain)
    if fast is not None:
        return fast
    c32 = _sub(ctx, "float32", "float32")
    for step in chain:
        args = [value if a == -1 else _f32(inputs[a]) for a in step["args"]]
        value = OPS[step["op"]](*args, ctx=c32, **dict(step.get("attrs") or {}))[0]
    ctx.record(c32.status)
    return value


def _round_to(ctx: OpContext, y, dtype: str) -> np.ndarray:
    """The single rounding at the end of a fused op, its status bits into ``ctx``."""
    out_ctx = _sub(ctx, dtype, dtype)
    out = finish(out_ctx, y)
    ctx.record(out_ctx.status)
    return out


def _bias(bias, n: int):
    if bias is None:
        return None
    b = np.asarray(bias, dtype=np.float32).reshape(-1)
    if b.size == 1 and n != 1:
        b = np.full(n, b[0], dtype=np.float32)
    if b.size != n:
        raise AscendEmuError(f"fused bias of {b.size} values does not match the {n} output columns; "
                             "switch MatMulBiasAddFusionPass/BiasaddConvFusionPass off for this model")
    return b


# the chain steps the one-pass kernels run (numerics.cube.Epilogue after a cube op, numerics/chain.py on
# their own), by TF type, named as numerics.vector names them: the float32 ops of _NUMPY_STEPS
_ONE_PASS_STEPS = {"AddV2": "add", "Add": "add", "BiasAdd": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "realdiv",
                   "Div": "realdiv", "Relu": "relu", "Relu6": "relu6"}


def _epilogue(ctx: OpContext, inputs, chain):
    """The chain as the cube's one-pass epilogue, or None where only the step-by-step path stands for it
    (the cases _chain_numpy declines before computing anything). The epilogue itself declines the rest
    (operand shapes, a running value that is Inf or NaN): the caller then runs _chain."""
    from ..numerics.cube import Epilogue

    if ctx.subnormals != "keep" or _flushes(ctx, chain):
        return None
    steps = []
    for step in chain:
        name = _ONE_PASS_STEPS.get(step["op"])
        attrs = step.get("attrs") or {}
        if name is None or attrs.get("data_format", "NHWC") not in ("NHWC", "N..C"):
            return None
        args = [int(a) for a in step["args"]]
        if len(args) != (1 if name in ("relu", "relu6") else 2) or not all(a == -1 or is_float(inputs[a])
                                                                           for a in args):
            return None
        steps.append((name, args))
    return Epilogue(steps, inputs, _dtype_name(ctx.cube_out))


def _cube(ctx: OpContext, inputs, chain, run) -> np.ndarray:
    """``run(ctx, epilogue)`` computes the cube op (bias in L0C). Without a chain the cube's own Fixpipe
    rounds to the output dtype; with one, the float32 accumulator goes through the chain first: in the
    Fixpipe's pass where the epilogue applies (the same bits and status), else step by step."""
    if not chain:
        return run(ctx, None)
    sub = _sub(ctx, cube_out="float32")
    ep = _epilogue(ctx, inputs, chain)
    acc = run(sub, ep)
    ctx.record(sub.status)
    if ep is not None and ep.applied:
        return acc
    return _round_to(ctx, _chain(ctx, acc, inputs, chain), _dtype_name(ctx.cube_out))


@register("_FusedConv2D", kind=CUBE, source=nn_ops.CONV_K_SOURCE)
def fused_conv2d(x, w, *extra, ctx, base="Conv2D", bias=None, chain=(), strides=(1, 1, 1, 1), padding="VALID",
                 dilations=(1, 1, 1, 1), explicit_paddings=(), data_format="NHWC", transpose=None,
                 transpose_out=True):
    """Conv2D / DepthwiseConv2dNative with bias in L0C and an optional elementwise chain. ``transpose``: the index of
    the input holding the permutation (0, 3, 1, 2) to NCHW that the chain's ops followed in the graph
    (TbeEltwiseFusionPass through an ONNX model's Transpose back to NCHW): the chain runs in NHWC with its other
    operands (NCHW, or broadcasting against NCHW as numpy aligns them) transposed alike, the same values, and the
    result is transposed to NCHW (``transpose_out``; False: left in NHWC, for the replay's layout plan)."""
    depthwise = base == "DepthwiseConv2dNative"
    fn = nn_ops.depthwise_op if depthwise else nn_ops.conv2d_op
    b = _bias(bias, int(w.shape[2] * w.shape[3]) if depthwise else int(w.shape[3]))

    def run(c, ep):
        return fn(x, w, ctx=c, strides=strides, padding=padding, dilations=dilations,
                  explicit_paddings=explicit_paddings, data_format=data_format, bias=b, epilogue=ep)
    inputs = (x, w) + extra
    if transpose is None:
        return _cube(ctx, inputs, chain, run)
    perm = tuple(int(p) for p in np.asarray(inputs[transpose]).reshape(-1))
    used = {a for step in chain for a in step["args"] if a >= 0}
    wide = any(np.ndim(inputs[a]) > 4 for a in used)
    if perm != (0, 3, 1, 2) or (wide and not transpose_out):
        raise AscendEmuError(f"a convolution fused with a Transpose by {list(perm)}"
                             + (" and a chain operand of more than 4 dimensions" if wide else "")
                             + " cannot run (TbeEltwiseFusionPass through an ONNX model's Transpose to NCHW, and the "
                               "replay's layout plan, make neither); switch TbeEltwiseFusionPass off for this model")
    if wide:
        # an operand that broadcasts the result past 4 dimensions: the chain on the accumulator transposed to NCHW,
        # step by step (numpy's broadcasting as the graph's), then the one rounding
        sub = _sub(ctx, cube_out="float32")
        acc = run(sub, None)
        ctx.record(sub.status)
        return _round_to(ctx, _chain(ctx, contiguous(acc.transpose(perm)), inputs, chain), _dtype_name(ctx.cube_out))
    inputs = list(inputs)
    for a in used:
        v = inputs[a]
        if np.ndim(v) and np.size(v) != 1:   # (NCHW broadcasting: missing leading axes are 1s)
            inputs[a] = np.reshape(v, (1,) * (4 - np.ndim(v)) + np.shape(v)).transpose(0, 2, 3, 1)
    out = _cube(ctx, tuple(inputs), chain, run)
    return contiguous(out.transpose(perm)) if transpose_out else out


@register("_FusedMatMul", kind=CUBE, source=nn_ops.MATMUL_SOURCE)
def fused_matmul(a, b, *extra, ctx, base="MatMul", bias=None, chain=(), transpose_a=False, transpose_b=False,
                 reshape=None):
    """MatMul with bias in L0C and an optional elementwise chain; ``reshape``: the index of the input holding the
    shape the product is reshaped to (MatMulReshapeBiasAddFusionPass: the Reshape between the MatMul and its bias
    add, which keeps the last dimension; no chain then)."""
    n = int(b.shape[0] if transpose_b else b.shape[1])
    bb = _bias(bias, n)

    def run(c, ep):
        return nn_ops.mat_mul(a, b, ctx=c, transpose_a=transpose_a, transpose_b=transpose_b, bias=bb, epilogue=ep)
    if reshape is None:
        return _cube(ctx, (a, b) + extra, chain, run)
    if chain:   # (the pass never makes one: no UB chain is assumed to reach across the Reshape)
        raise AscendEmuError("a _FusedMatMul with both a fused Reshape and an elementwise chain cannot run; switch "
                             "MatMulReshapeBiasAddFusionPass off for this model")
    shape = [int(d) for d in np.asarray(((a, b) + extra)[reshape]).reshape(-1)]
    out = _cube(ctx, (a, b), (), run)
    try:
        out = out.reshape(shape)    # (a -1 resolved by numpy, as the Reshape resolves it)
    except ValueError:
        out = None
    if out is None or not out.shape or out.shape[-1] != n:
        raise AscendEmuError(f"the Reshape fused between a MatMul of {n} output columns and its bias add gives shape "
                             f"{shape}, whose last dimension is not the columns; switch MatMulReshapeBiasAddFusionPass "
                             "off for this model")
    return out


@register("_FusedBatchMatMul", kind=CUBE, source=nn_ops.MATMUL_SOURCE)
def fused_batch_matmul(a, b, *extra, ctx, base="BatchMatMulV2", bias=None, chain=(), adj_x=False, adj_y=False,
                       equation=None):
    """BatchMatMul(V2) or a two-operand Einsum with bias in L0C and an optional elementwise chain."""
    if base == "Einsum":
        def run(c, ep):
            # the output is a transpose of the product's: a chain whose operands are all single values (an
            # attention's scale) commutes with it and runs in the Fixpipe's pass; any other, step by step
            one = ep is not None and all(np.size(ep.operands[k]) == 1 for _, args in ep.steps for k in args if k >= 0)
            return nn_ops.einsum(a, b, ctx=c, equation=equation, bias=bias, epilogue=ep if one else None)
    else:
        bb = _bias(bias, int(b.shape[-2] if adj_y else b.shape[-1]))

        def run(c, ep):
            return nn_ops.batch_mat_mul(a, b, ctx=c, adj_x=adj_x, adj_y=adj_y, bias=bb, epilogue=ep)
    return _cube(ctx, (a, b) + extra, chain, run)




def _chain_one_pass(ctx: OpContext, xs, chain):
    """The fp16 result of a standalone chain in one pass (numerics/chain.py: the float32 steps of
    _chain_numpy and the rounding of _round_to, bit for bit), or None where the full path must run."""
    if ctx.dtype_name != "float16" or ctx.subnormals != "keep" or _flushes(ctx, chain):
        return None
    steps = []
    for step in chain:
        name = _ONE_PASS_STEPS.get(step["op"])
        attrs = step.get("attrs") or {}
        args = step["args"]
        if name is None or attrs.get("data_format", "NHWC") not in ("NHWC", "N..C"):
            return None
        if len(args) != (1 if name in ("relu", "relu6") else 2):
            return None
        steps.append((name, args[0], args[1] if len(args) > 1 else -2))
    return chain_to_f16(xs, steps)


@register("_EltwiseChain", kind=VECTOR, source=Source(
    ("NUMERICS.md section 6 (AutomaticUbFusion), section 2 (UB-fused chains run on float32 data: inferred)",), (),
    "each step's op as sourced, in float32, one rounding at the end: assumed, no parameter (the fused kernel the "
    "UB fusion builds is not public)"))
def eltwise_chain(*xs, ctx, chain):
    """AutomaticUbFusion: the chain's steps in float32, one rounding to the compute dtype."""
    small = _chain_small_f32(ctx, xs, chain)
    if small is not None:   # float32 data: the final rounding to float32 is exact, its status 0 (all finite)
        return small
    fast = _chain_one_pass(ctx, xs, chain)
    if fast is not None:
        return fast
    return _round_to(ctx, _chain(ctx, None, xs, chain), ctx.dtype_name)


@register("_BnDxChain", kind=VECTOR, source=Source(
    ("NUMERICS.md section 6 (batch norm's fp16 input gradient in one pass: npu/bn_chain.py)",
     "ops/math_ops.py Mul, Sub, AddN and _EltwiseChain (each op's own source)"), (),
    "the four ops' own arithmetic and roundings in their order: their bits and status"))
def bn_dx_chain(g, s, x, m, b, n, k, t, *, ctx):
    """Batch norm's fp16 input gradient ``AddN(Mul(g, s), t, _EltwiseChain(b, n, k, Sub(x, m)))``
    (:mod:`ascend_emu.npu.bn_chain`); the replay runs it itself (``rewritten_runs._bn_dx``: the ops' decisions, casts
    and records). Here: the four ops in ``ctx``'s dtype one by one on operands already in it."""
    a = OPS["Mul"](g, s, ctx=ctx)[0]
    d = OPS["Sub"](x, m, ctx=ctx)[0]
    chain = [{"op": "RealDiv", "args": [0, 1]}, {"op": "Mul", "args": [2, -1]}, {"op": "Mul", "args": [-1, 3]}]
    c = OPS["_EltwiseChain"](b, n, k, d, ctx=ctx, chain=chain)[0]
    return OPS["AddN"](a, t, c, ctx=ctx)


@register("_LayerNorm", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/layer_norm.py (layer_norm_compute)", "hicann/ops-nn norm/layer_norm_v4/"
     "op_kernel/layer_norm_v4_align.h"), ("op_model", "impl_mode"),
    "float32 mean and variance scaled by fl32(1/n) before the sum; rstd by exp/log (910) or 1/sqrt; sum order assumed"))
def layer_norm(x, *params, ctx, epsilon, axis=(-1,), has_gamma=True, has_beta=True):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over ``axis``: CANN's kernel, or exact and rounded once."""
    ax = tuple(int(a) % np.ndim(x) for a in axis)
    if ctx.op_model != "exact":
        gamma = params[0] if has_gamma else None
        beta = params[int(has_gamma)] if has_beta else None
        return sourced.layer_norm(ctx, x, gamma, beta, float(epsilon), ax)
    x64 = to64(x)
    with np.errstate(all="ignore"):   # an Inf/NaN input gives NaN, reported by the final rounding
        mean = x64.mean(axis=ax, keepdims=True)
        d = x64 - mean
        var = (d * d).mean(axis=ax, keepdims=True)
        y = d / np.sqrt(var + float(epsilon))
        i = 0
        if has_gamma:
            y = y * to64(params[i])
            i += 1
        if has_beta:
            y = y + to64(params[i])
    return finish(ctx, y)


@register("_SoftmaxGrad", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/softmax_grad.py (softmax_grad_compute)",
     "NUMERICS.md section 6 (SoftmaxGradFusionPass)"), (),
    "the kernel's high_precision path: fp16 widened, y dy, float32 sum, dy - sum, times y, one rounding; its "
    "high_performance fp16 path (sum cast to fp16, difference and product in fp16) is not modelled; sum order "
    "assumed"))
def softmax_grad(y, dy, *, ctx):
    """SoftmaxGradFusionPass: (dy - sum(dy * y, -1)) * y with float32 steps (widened inputs, the product,
    the sequential float32 sum, the difference, the product), rounded once to the compute dtype."""
    yw, dw = widen(ctx, y), widen(ctx, dy)
    with np.errstate(all="ignore"):
        p = yw * dw
    s = sum_f32(ctx, p, (p.ndim - 1,)) if p.ndim else p
    with np.errstate(all="ignore"):
        r = (dw - np.expand_dims(np.asarray(s, np.float32), -1)) * yw if p.ndim else (dw - s) * yw
    return finish(ctx, np.asarray(r, np.float32))


_erfc = np.frompyfunc(math.erfc, 1, 1)


def gelu_f64(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """Gelu in float64: 0.5 x erfc(-x / sqrt 2), or the tanh approximation."""
    x = np.asarray(x, dtype=np.float64)
    if approximate == "tanh":
        # 0.5 x (1 + tanh u) as x / (1 + e^(-2u)), the vector unit's form: no cancellation for negative x
        with np.errstate(over="ignore"):
            return x / (1.0 + np.exp(-2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    # the erfc form stays accurate for large negative x, where 1 + erf cancels
    return 0.5 * x * _erfc(-x / math.sqrt(2.0)).astype(np.float64)


@register("_Gelu", kind=VECTOR, eltwise="gelu", source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/gelu.py (gelu_compute, gelu_compute_v2)", "hicann/ops-nn activation/gelu/"
     "op_kernel/arch35/gelu_dag.h"), ("op_model", "impl_mode"), "the tanh form, instruction by instruction"))
def gelu(x, *, ctx, approximate="none"):
    """CANN's Gelu kernel (the tanh form, whichever form the graph had), or under ``op_model="exact"``
    y = 0.5 x (1 + erf(x / sqrt 2)) (or the tanh approximation) exact inside, one rounding."""
    if approximate not in ("none", "tanh"):
        raise AscendEmuError(f"_Gelu approximate={approximate!r}; use 'none' or 'tanh'")
    if ctx.op_model != "exact":
        return vec(ctx, "gelu", x)
    with np.errstate(all="ignore"):
        return finish(ctx, gelu_f64(x, approximate))


#: FlashAttentionScore's key/value block along S2: the online softmax rescales its running max and sum once per
#: block. ops-transformer tiles S2 by the UB size (128 and 256 appear in its tilings); an assumption, the
#: registered parameter fa_kv_block (NUMERICS.md section 16), whose default this is
FA_KV_BLOCK = 128


@register("_FlashAttentionScore", kind=CUBE, source=Source(
    ("hicann/ops-transformer attention/flash_attention_score/op_kernel/flash_attention_score_s1s2_bn2gs1.h",
     "hicann/ops-transformer attention/flash_attention_score/op_kernel/flash_attention_score_common.h"),
    ("cube_block_sum", "cube_extra_bits", "cube_normalize", "fa_kv_block"),
    "BMM1 in float32, scale after it, online softmax in float32, P rounded CAST_ROUND, O divided at the end "
    "(ASCEND-FACTS 13.5); the key block (128) is assumed: fa_kv_block (NUMERICS section 16)"))
def flash_attention_score(q, k, v, *mask, ctx, scale_value=1.0, has_mask=False, kv_block=FA_KV_BLOCK,
                          with_stats=False):
    """FlashAttentionScore (ASCEND-FACTS.md 13.5, [TF] flash_attention_score kernels), BNSD layout:
    S = Q K^T on the cube with float32 output; S * scale in float32 (after the product); masked positions
    (``mask`` True = dropped, npu_fusion_attention's convention) set to -FLT_MAX; per S2 block of ``kv_block``
    an online softmax in float32 (running max m, sum l, the block's P = exp(S - m) unnormalised); P cast to the
    input dtype with CAST_ROUND (ties away); O += P V on the cube (float32 accumulation, the running O rescaled
    by exp(m_old - m_new)); finally O / l in float32, cast to the input dtype with CAST_ROUND.

    Returns (O, logsumexp m + ln l in float32, shape q.shape[:-1]) - the second output torch's backward reads; with
    ``with_stats`` also the kernel's softmax_max m and softmax_sum l (float32, q.shape[:-1]), which its grad reads.
    """
    from ..numerics.cube import batch_matmul
    from ..numerics.vector import cast, vector

    dt = ctx.dtype_name
    f32 = dict(dtype="float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals, op_model=ctx.op_model)
    cube = dict(operand_dtype=dt, out_dtype="float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals,
                model=ctx.cube_model)
    s2 = k.shape[-2]
    lead = q.shape[:-1]
    m = np.full(lead + (1,), -np.inf, np.float32)
    l_sum = np.zeros(lead + (1,), np.float32)
    o = np.zeros(lead + (v.shape[-1],), np.float32)
    neg = np.float32(-np.finfo(np.float32).max)
    status = 0
    with np.errstate(all="ignore"):
        for j in range(0, s2, int(kv_block)):
            kb, vb = k[..., j:j + kv_block, :], v[..., j:j + kv_block, :]
            s, st = batch_matmul(q, kb, adj_y=True, **cube)
            status |= st
            s = (s * np.float32(scale_value)).astype(np.float32)
            if has_mask:
                s = np.where(np.asarray(mask[0])[..., j:j + kv_block], neg, s).astype(np.float32)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            p, st = vector("exp", (s - m_new).astype(np.float32), **f32)
            status |= st
            alpha, st = vector("exp", (m - m_new).astype(np.float32), **f32)
            status |= st
            l_sum = (l_sum * alpha + p.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float32)
            if dt != "float32":
                p, st = cast(p, dt, rounding="round", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals)
                status |= st
            pv, st = batch_matmul(p, vb, **cube)
            status |= st
            o = (o * alpha + pv).astype(np.float32)
            m = m_new
        out = (o / l_sum).astype(np.float32)
        lse = (m + np.log(l_sum)).astype(np.float32)[..., 0]
    if dt != "float32":
        out, st = cast(out, dt, rounding="round", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals)
        status |= st
    ctx.record(status)
    if with_stats:
        return out, lse, m[..., 0], l_sum[..., 0]
    return out, lse


# ---------------------------------------------------------------- torch_npu's fused aclnn kernels (13.4, 13.5)
def _half_interval_sum(x: np.ndarray) -> np.ndarray:
    """ReduceSumHalfInterval over the last axis in float32 ([NN] norm/rms_norm/op_kernel/reduce_common.h): the
    tail past the largest power of two is folded onto the head, the halves are added down to 64 elements, then
    WholeReduceSum (its order inside 64 is not public: pairwise halving, an assumption, NUMERICS.md section 16)."""
    x = np.asarray(x, np.float32)
    n = x.shape[-1]
    if n == 0:
        return np.zeros(x.shape[:-1], np.float32)
    p = 1 << (n.bit_length() - 1)
    s = np.array(x[..., :p], np.float32)
    if p < n:
        s[..., :n - p] += x[..., p:]
    while s.shape[-1] > 1:
        h = s.shape[-1] // 2
        s = s[..., :h] + s[..., h:]
    return s[..., 0]


@register("_RmsNorm", kind=VECTOR, source=Source(
    ("hicann/ops-nn norm/rms_norm/op_kernel/rms_norm.h (Compute, ComputeMulGammaCast)",
     "hicann/ops-nn norm/rms_norm/op_kernel/reduce_common.h (ReduceSumHalfInterval)"),
    note="float32 throughout, half-interval sum, one cast out (RINT for bf16, NONE for fp16)"))
def rms_norm(x, gamma, *, ctx, epsilon=1e-6):
    """aclnnRmsNorm (ASCEND-FACTS.md 13.4 item 1): x in float32, sum of x^2 by ReduceSumHalfInterval, rstd =
    1 / sqrt(sum * (1/N) + eps) as a float32 scalar, y = x * rstd * gamma in float32, one rounding (RINT) to the
    compute dtype; rstd (float32, the last axis kept as 1) is the second output."""
    xw = widen(ctx, x)
    g = to_f32(gamma)
    n = xw.shape[-1]
    with np.errstate(all="ignore"):
        ss = _half_interval_sum(xw * xw)[..., None]
        rstd = (np.float32(1.0) / np.sqrt(ss * np.float32(1.0 / n) + np.float32(epsilon))).astype(np.float32)
        y = (xw * rstd) * g
    return finish(ctx, np.asarray(y, np.float32)), rstd


@register("_SwiGlu", kind=VECTOR, source=Source(
    ("hicann/ops-nn activation/swi_glu/op_kernel/swi_glu_bf16.hpp", "hicann/ops-nn activation/swi_glu/op_kernel/swi_glu.cpp"),
    note="both halves in float32, a/(1+exp(-a))*b, one RINT cast"))
def swiglu(x, *, ctx, dim=-1):
    """aclnnSwiGlu (13.4 item 3): the two halves of ``x`` along ``dim`` in float32, a / (1 + exp(-a)) * b in
    float32 (the vector unit's float32 Exp), one RINT rounding."""
    from ..numerics.vector import vector

    xw = widen(ctx, x)
    a, b = np.split(xw, 2, axis=int(dim))
    with np.errstate(all="ignore"):
        e, st = vector("exp", np.negative(a), dtype="float32", overflow_mode="inf_nan", subnormals=ctx.subnormals,
                       op_model=ctx.op_model)
        y = a / (np.float32(1.0) + e) * b
    return finish(ctx, np.asarray(y, np.float32))


@register("_RotaryMul", kind=VECTOR, source=Source(
    ("hicann/ops-transformer posembedding/rotary_position_embedding/op_kernel/rotate_half_bf16.h",
     "hicann/ops-transformer posembedding/rotary_position_embedding/op_kernel/rotate_half_base.h"),
    note="x, cos, sin in float32, x*cos + rotate(x)*sin, one RINT cast"))
def rotary_mul(x, cos, sin, *, ctx):
    """aclnnRotaryPositionEmbedding, rotate-half (13.5 npu_rotary_mul): x, cos, sin in float32, the first half of
    sin negated, y = x * cos + rotate(x) * sin in float32 (rotate(x) = [x2, x1]), one RINT rounding."""
    xw, c, s = widen(ctx, x), to_f32(cos), to_f32(sin)
    h = xw.shape[-1] // 2
    rot = np.concatenate([xw[..., h:], xw[..., :h]], axis=-1)
    s = np.concatenate([-s[..., :h], s[..., h:]], axis=-1)
    with np.errstate(all="ignore"):
        y = xw * c + rot * s
    return finish(ctx, np.asarray(y, np.float32))

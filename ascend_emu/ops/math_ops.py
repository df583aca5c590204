"""Elementwise and reduction ops on the vector unit.

Float tensors go through :func:`ascend_emu.numerics.vector` / ``reduce`` in the op's
compute dtype; integer and boolean tensors (shape arithmetic, masks) are exact and
computed with numpy.
"""
from __future__ import annotations

import math

import numpy as np

from ..numerics.chain import distinct_view
from ..numerics.policy import FTZ_OPS, IMPL_MODES, OP_MODELS, OVERFLOW_MODES
from ..numerics.vector import vector
from ._util import as_int_list, is_float
from .registry import VECTOR, Source, register

#: the float32 exp/log accuracy and the 16-bit second rounding of the transcendentals (NUMERICS.md section 2)
_TRANSCENDENTAL = Source(assumed=("impl_mode",), note="the function in float64 rounded once (high_precision) or "
                                                      "float32 libm then the compute dtype (high_performance)")
#: ops whose result needs no rounding: a selection among the inputs, a sign change, a comparison
EXACT_SELECT = Source(exact="the result is one of its inputs (or +0, 6): a selection, no arithmetic")
_EXACT_SIGN = Source(exact="the input with its sign bit cleared or flipped")
_EXACT_COMPARE = Source(exact="a comparison (or logic) of values already in the compute dtype: a boolean")
#: the ops whose CANN kernels are public, instruction by instruction (NUMERICS.md section 2, "Sourced kernels")
SOURCED = {
    "tanh": Source(("canndev ops/built-in/tbe/impl/dynamic/tanh.py", "hicann/ops-math math/tanh/op_kernel/arch35/"
                    "tanh_dag.h"), ("op_model", "impl_mode"), "TBE: exp(-2|x|) form; Ascend C: odd polynomial "
                                                               "below 0.6, then 1 - 2/(exp(2|x|) + 1)"),
    "sigmoid": Source(("canndev ops/built-in/tbe/impl/dynamic/sigmoid.py", "hicann/ops-nn activation/sigmoid/"
                       "op_kernel/arch35/sigmoid_f16.h"), ("op_model", "impl_mode"),
                      "TBE: fp16 steps in fp16; Ascend C: float32 steps, CAST_RINT"),
    "exp": Source(("canndev ops/built-in/tbe/impl/dynamic/exp.py", "hicann/ops-math math/exp/op_kernel/arch35/"
                   "exp_dag.h"), ("op_model", "impl_mode"), "fp16 -> fp32 exp -> CAST_RINT; exp accuracy assumed"),
    "rsqrt": Source(("canndev ops/built-in/tbe/impl/dynamic/rsqrt.py", "hicann/ops-math math/rsqrt/op_kernel/"
                     "arch35/rsqrt.h"), ("op_model",), "vsqrt then vdiv(1, .) in float32, then RINT"),
}

#: the TBE kernels (canndev, read in the public mirror dengguojie/vue-element-admin) of the arithmetic ops: one
#: vector instruction each, in the compute dtype or in float32 with a RINT cast back; either way the exact result
#: rounded once (NUMERICS.md section 2: the double rounding through float32 is innocuous)
_TBE = "canndev ops/built-in/tbe/impl/dynamic/"
_ONCE = "NUMERICS.md section 2 (+ - * / sqrt: the exact result rounded once)"
ARITH = {
    "add": Source((_TBE + "add.py (add_compute: tbe.vadd)", _ONCE), (),
                  "one vadd in the compute dtype, rounded once (nearest even)"),
    "sub": Source((_TBE + "sub.py (sub_compute: tbe.vsub)", _ONCE), (),
                  "one vsub in the compute dtype, rounded once (nearest even)"),
    "mul": Source((_TBE + "mul.py (mul_compute: tbe.vmul)", _ONCE), (),
                  "one vmul in the compute dtype, rounded once (nearest even)"),
    "realdiv": Source((_TBE + "real_div.py (real_div_compute), div.py (div_compute)", _ONCE), (),
                      "fp16 widened, one float32 vdiv, cast back (RINT); Div.md's 1-ulp INTRINSIC divide not "
                      "modelled (correctly rounded)"),
    "square": Source((_TBE + "square.py (square_compute: tbe.vmul(x, x))", _ONCE), (),
                     "one vmul of x by itself, rounded once"),
    "sqrt": Source((_TBE + "sqrt.py (sqrt_compute: float32 vsqrt)", _ONCE), (),
                   "fp16 widened, one float32 vsqrt, cast back (RINT); correctly rounded vsqrt modelled"),
    "reciprocal": Source((_TBE + "reciprocal.py (reciprocal_compute: vdiv(1, x)), inv.py (inv_compute)", _ONCE), (),
                         "fp16 widened, one float32 vdiv of 1 by x, cast back (RINT)"),
    "squared_difference": Source((_TBE + "squared_difference.py (squared_difference_compute: vsub, then vmul)",
                                  "NUMERICS.md section 2 (squared_difference)"), (),
                                 "two instructions in the compute dtype, each rounded: the difference can "
                                 "overflow"),
}

_INT_FUNCS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "neg": np.negative, "abs": np.abs, "square": np.square, "floordiv": np.floor_divide,
}


#: the binary ops whose float32 result on float32 data is one IEEE operation per element, numpy's own: the first
#: fast path of numerics.vector.vector, which :func:`vec` takes before vector's argument checks and dispatch
_F32_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "realdiv": np.divide}
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
#: fp16 binary ops on at most this many distinct values take :func:`_f16_small` (more: the chain kernel, vector's)
_SMALL16 = 4096


def vec(ctx, op, *xs, impl_mode=None, **attrs):
    """Run vector op ``op`` on ``xs`` in ``ctx``'s compute dtype (or exactly, for integers);
    ``impl_mode`` overrides ``ctx.impl_mode``."""
    if len(xs) == 2 and not attrs and op in _F32_BINARY and _modes_known(ctx):
        # a float32 add / sub / mul / div of two float32 arrays, subnormals kept: vector's own fast path (the same
        # numpy call, the same finite check; a broadcast view computed on its distinct values as vector does); fp16
        # ones on at most _SMALL16 values (_f16_small); anything else, or an Inf / NaN result, takes vector below.
        # The optimizer's and BN's small float32 ops paid ~10 us of checks for ~1 us of numpy
        x, y = xs
        if (type(x) is np.ndarray and type(y) is np.ndarray and x.dtype == _F32 and y.dtype == _F32
                and ctx.dtype == _F32 and ctx.subnormals == "keep" and not ctx.ftz):
            if 0 not in x.strides and 0 not in y.strides:
                with np.errstate(all="ignore"):
                    out = np.asarray(_F32_BINARY[op](x, y, order="C"))
                if np.isfinite(out).all():
                    return out
            else:
                out = _f32_on_distinct(op, x, y)
                if out is not None:
                    return out
        elif (type(x) is np.ndarray and type(y) is np.ndarray and x.dtype == _F16 and y.dtype == _F16
                and ctx.dtype == _F16 and ctx.subnormals == "keep" and not ctx.ftz):
            out = _f16_small(op, x, y)
            if out is not None:
                return out
    if len(xs) == 1 and op in _F32_UNARY and not attrs and impl_mode is None and _modes_known(ctx):
        out = _f32_unary(ctx, op, xs[0])
        if out is not None:
            return out
    if all(is_float(x) for x in xs if not (op == "select" and x is xs[0])):
        # the 950's cce_ftz: these ops' INTRINSIC algorithm reads subnormals as zero and flushes them
        sub = "flush" if ctx.ftz and op in FTZ_OPS else ctx.subnormals
        y, st = vector(op, *xs, dtype=ctx.dtype_name, overflow_mode=ctx.overflow_mode,
                       subnormals=sub, impl_mode=impl_mode or ctx.impl_mode, op_model=ctx.op_model,
                       **attrs)
        ctx.record(st)
        return y
    if op == "select":
        return np.where(xs[0], xs[1], xs[2])
    if op == "realdiv":
        # TF's integer Div truncates toward zero
        a, b = np.asarray(xs[0]), np.asarray(xs[1])
        return (np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))).astype(np.result_type(a, b))
    if op not in _INT_FUNCS:
        raise NotImplementedError(f"integer {op}")
    return _INT_FUNCS[op](*xs)


def _distinct(x, y):
    """(x's and y's distinct values as views, their broadcast shape, the count of the distinct values' broadcast),
    or None where they do not broadcast (``vector`` then raises its own error)."""
    cx, cy = distinct_view(x), distinct_view(y)
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
        small = np.broadcast_shapes(cx.shape, cy.shape)
    except ValueError:
        return None
    return cx, cy, shape, math.prod(small)


def _f32_on_distinct(op, x, y):
    """``vector``'s own path for a float32 add / sub / mul / div with a broadcast view (zero strides) among its
    operands, without its dispatch: the numpy operation on the views' distinct values, broadcast again (read-only),
    when that is fewer values than the output and all are finite; else None (``vector`` runs). BN's gradient
    ``mean_grad / n`` on a BroadcastTo of 16-32 values cost 130-190 us a node for 16-32 divisions."""
    d = _distinct(x, y)
    if d is None or d[3] >= math.prod(d[2]):
        return None
    cx, cy, shape, _ = d
    with np.errstate(all="ignore"):
        out = np.asarray(_F32_BINARY[op](cx, cy, order="C"))
    if not np.isfinite(out).all():
        return None
    return np.broadcast_to(out, shape)


#: the float32 unary ops whose result is one correctly rounded IEEE operation (exact for neg and abs), numpy's own:
#: numerics.vector's _NUMPY_F32_UNARY, its fast path for them, which :func:`_f32_unary` takes without the dispatch
_F32_UNARY = {"neg": np.negative, "abs": np.absolute, "square": np.square, "sqrt": np.sqrt,
              "reciprocal": np.reciprocal}


def _f32_unary(ctx, op, x):
    """``vector``'s float32 neg / abs / square / sqrt / reciprocal (subnormals kept, no cce_ftz) of a float32 array
    that is not a broadcast view nor empty, without its dispatch: the same numpy ufunc, returned where every result
    is finite (the kernel then gives the same bits and no status); else None (``vector`` runs: an Inf or NaN result, a
    NaN's sign and payload, the overflow mode, are the kernel's; and an empty one, whose numpy result has strides
    (0, 0) where vector's has C strides). BN's gradient Neg of 16-32 floats cost ~15 us a node."""
    if not (type(x) is np.ndarray and x.dtype == _F32 and ctx.dtype == _F32 and ctx.subnormals == "keep"
            and not ctx.ftz and 0 not in x.strides and x.size):
        return None
    with np.errstate(all="ignore"):
        out = np.asarray(_F32_UNARY[op](x, order="C"))
    return out if np.isfinite(out).all() else None


def _modes_known(ctx) -> bool:
    """Whether ``ctx``'s overflow mode, impl_mode and op_model are ones :func:`vector` takes (it refuses others with
    an AscendEmuError: a hand-built context's unknown mode must not pass through a fast path unnoticed)."""
    return ctx.overflow_mode in OVERFLOW_MODES and ctx.impl_mode in IMPL_MODES and ctx.op_model in OP_MODELS


def _f16_small(op, x, y):
    """``vector``'s fp16 add / sub / mul / div (subnormals kept) on at most ``_SMALL16`` values (a broadcast view's
    distinct ones), without its dispatch: each operand widened exactly, one float32 operation, rounded to nearest
    even fp16 (the vector kernel's model: float32 holds 2p + 2 bits, so the double rounding is the correct
    rounding, NUMERICS.md section 2), by numpy's own conversions; a broadcast view's result broadcast again, as
    ``vector`` gives it. None when a result is Inf or NaN (the overflow mode and status are the kernel's) or there are
    more values. The loss scale's unscaling of small fp16 weight gradients and the global average pool's gradient
    (a BroadcastTo divided by a scalar) cost 45-120 us in ``vector`` for a few hundred values."""
    d = _distinct(x, y)
    if d is None or d[3] > _SMALL16:
        return None
    cx, cy, shape, n = d
    with np.errstate(all="ignore"):
        out = np.asarray(_F32_BINARY[op](cx.astype(_F32), cy.astype(_F32), order="C")).astype(_F16)
    if not np.isfinite(out).all():
        return None
    return np.broadcast_to(out, shape) if n < math.prod(shape) else out


def _binary(name, tf_types):
    if name == "mul":
        return _mul(tf_types)

    @register(*tf_types, kind=VECTOR, eltwise=name, source=_SOURCE.get(name))
    def op(x, y, *, ctx):
        return vec(ctx, name, x, y)
    op.__name__ = name
    return op


def _mul(tf_types):
    # reads_half: a float32 Mul handed an fp16 input (the device's widening cast deferred) widens it as the cast
    # would (numerics.vector.cast, the op's own modes), or, for an fp16 tensor times one float32 value, widens,
    # multiplies and tests in one pass (kernels/scale16.py; the loss scale's unscaling of fp16 weight gradients)
    @register(*tf_types, kind=VECTOR, eltwise="mul", reads_half=True, source=_SOURCE.get("mul"))
    def mul(x, y, *, ctx):
        if ctx.dtype == _F32 and ((type(x) is np.ndarray and x.dtype == _F16)
                                  or (type(y) is np.ndarray and y.dtype == _F16)):
            out = _widen_mul(ctx, x, y)
            if out is not None:
                return out
            x, y = (_widen(ctx, a) for a in (x, y))
        return vec(ctx, "mul", x, y)
    return mul


def _widen(ctx, a):
    """``a``'s float32 cast as the device inserts it (exact; ``ctx``'s subnormal mode), for an fp16 ``a``."""
    if not (type(a) is np.ndarray and a.dtype == _F16):
        return a
    from ..numerics.vector import cast

    return cast(a, "float32", overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals)[0]


def _widen_mul(ctx, x, y):
    """fp16 ``x`` (C-contiguous) times a float32 0-d ``y`` in a float32 context, subnormals kept: ``vec``'s float32
    fast path on ``x``'s cast (one IEEE float32 product each) in one pass, or None (an Inf or NaN product, or other
    operands: the cast and ``vec``)."""
    if not (type(x) is np.ndarray and x.dtype == _F16 and type(y) is np.ndarray and y.dtype == _F32
            and y.ndim == 0 and x.flags.c_contiguous and x.size and ctx.subnormals == "keep" and not ctx.ftz
            and _modes_known(ctx)):
        return None
    from ..kernels import alloc
    from ..kernels.scale16 import widen_mul

    out = alloc.empty(x.shape, _F32)
    return out if widen_mul(x.view(np.uint16).reshape(-1), y[()], out.reshape(-1)) else None


def _unary(name, tf_types):
    @register(*tf_types, kind=VECTOR, eltwise=name, source=_SOURCE.get(name))
    def op(x, *, ctx):
        return vec(ctx, name, x)
    op.__name__ = name
    return op


_SOURCE = {**dict.fromkeys(("expm1", "log", "log1p", "erf", "erfc", "softsign", "pow"), _TRANSCENDENTAL), **SOURCED,
           **ARITH,
           **dict.fromkeys(("maximum", "minimum", "relu", "relu6"), EXACT_SELECT),
           **dict.fromkeys(("neg", "abs"), _EXACT_SIGN)}

for _name, _types in {
    "add": ("AddV2", "Add"), "sub": ("Sub",), "mul": ("Mul",), "realdiv": ("RealDiv", "Div"),
    "maximum": ("Maximum",), "minimum": ("Minimum",), "squared_difference": ("SquaredDifference",),
    "pow": ("Pow",),
}.items():
    _binary(_name, _types)

for _name, _types in {
    "neg": ("Neg",), "abs": ("Abs",), "square": ("Square",), "sqrt": ("Sqrt",), "rsqrt": ("Rsqrt",),
    "reciprocal": ("Reciprocal", "Inv"), "exp": ("Exp",), "log": ("Log",), "tanh": ("Tanh",),
    "sigmoid": ("Sigmoid",), "relu": ("Relu",), "relu6": ("Relu6",), "erf": ("Erf",), "erfc": ("Erfc",),
    "log1p": ("Log1p",), "expm1": ("Expm1",), "softsign": ("Softsign",),
}.items():
    _unary(_name, _types)


def _trig(op, x, ctx):
    from ..numerics.trig import trig

    y, st = trig(op, x, dtype=ctx.dtype_name, overflow_mode=ctx.overflow_mode, subnormals=ctx.subnormals,
                 op_model=ctx.op_model)
    ctx.record(st)
    return y


@register("Sin", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/sin.py (sin_compute, _sin)",
     "hicann/ops-math math/sin/op_kernel/arch35/sin_dag.h"), ("op_model",),
    "TBE: float32 range reduction by round(x/pi), Taylor to x^11, RINT back; the 950's Simt::Sin unpublished "
    "(correctly rounded float32 assumed)"))
def sin(x, *, ctx):
    """sin(x) as the TBE kernel computes it (canndev ``ops/built-in/tbe/impl/dynamic/sin.py``: 16-bit input cast
    to float32, k = round(x/pi), x - k pi, the Taylor series to x^11, the sign of k's parity, CAST_RINT back;
    NUMERICS.md section 2, "Sourced kernels: Sin and Cos"); the Ascend950's kernel (hicann/ops-math
    ``math/sin/op_kernel/arch35/sin_dag.h``) under ``op_model="ascendc"``."""
    return _trig("sin", x, ctx)


@register("Cos", kind=VECTOR, source=Source(
    ("canndev ops/built-in/tbe/impl/dynamic/cos.py (cos_compute)",
     "hicann/ops-math math/cos/op_kernel/arch35/cos_dag.h"), ("op_model",),
    "TBE: float32 range reduction by round(x/2pi), Taylor to x^14, RINT back; the 950's Simt::Cos unpublished "
    "(correctly rounded float32 assumed)"))
def cos(x, *, ctx):
    """cos(x) as the TBE kernel computes it (canndev ``ops/built-in/tbe/impl/dynamic/cos.py``: float32,
    k = round(x/(2 pi)), x - k 2pi, the Taylor series to x^14, CAST_RINT back; NUMERICS.md section 2)."""
    return _trig("cos", x, ctx)


@register("LeakyRelu", kind=VECTOR, eltwise="leaky_relu", source=Source(
    (_TBE + "leaky_relu.py (leaky_relu_compute: tbe.vlrelu(x, negative_slope))", "NUMERICS.md section 2 (leaky_relu)"),
    (), "x times alpha rounded to the compute dtype (the scalar operand's dtype: an assumption with no parameter), "
        "rounded once"))
def leaky_relu(x, *, ctx, alpha=0.2):
    return vec(ctx, "leaky_relu", x, alpha=float(alpha))


@register("FloorDiv", kind=VECTOR, source=Source(exact="integer division (a float FloorDiv runs on the AI CPU)"))
def floor_div(x, y, *, ctx):
    if is_float(x):
        raise NotImplementedError("float FloorDiv")
    return np.floor_divide(x, y)


@register("SelectV2", "Select", kind=VECTOR, eltwise="select", source=EXACT_SELECT)
def select(cond, x, y, *, ctx):
    return vec(ctx, "select", np.asarray(cond, dtype=bool), x, y)


@register("BiasAdd", kind=VECTOR, eltwise="add", source=Source(
    (_TBE + "bias_add.py (bias_add_compute: tbe.vadd of the broadcast bias)", _ONCE), (),
    "one vadd in the compute dtype, rounded once"))
def bias_add(x, bias, *, ctx, data_format="NHWC"):
    if data_format not in ("NHWC", "N..C"):
        raise NotImplementedError(f"BiasAdd data_format {data_format}")
    return vec(ctx, "add", x, bias)


@register("AddN", kind=VECTOR, eltwise="add", source=Source(
    (_TBE + "add_n.py (add_n_compute: fp16 cast to float32 where vadd takes float32, vadd in input order, one cast "
     "back; its dtype list is fp16/float32/int32)", _ONCE), (),
    "16-bit inputs widened, a float32 running sum in input order, one rounding (RINT); a bf16 AddN, which the kernel "
    "does not list, is assumed to run the same way (no parameter); add_n_fusion_compute's adds in the input dtype "
    "apply only inside a UB fusion, which no fusion rule here forms"))
def add_n(*xs, ctx):
    """TBE add_n_compute: float32 inputs added in input order; fp16 / bf16 inputs widened to float32 (the 910 and
    910B have a float32 vadd), the float32 running sum rounded once to the compute dtype."""
    if ctx.dtype == np.float32 or not all(is_float(x) for x in xs):
        acc = xs[0]
        for x in xs[1:]:
            acc = vec(ctx, "add", acc, x)
        return acc
    if ctx.dtype_name == "float16" and ctx.subnormals == "keep" and all(
            type(x) is np.ndarray and x.dtype == np.float16 and x.shape == xs[0].shape for x in xs):
        # the float32 adds in one pass, rounded once to fp16 (the chain kernel; None if any sum is Inf or NaN,
        # whose status and overflow mode the steps below handle)
        from ..numerics.chain import chain_to_f16

        y = chain_to_f16(xs, [("add", 0, 1)] + [("add", -1, k) for k in range(2, len(xs))])
        if y is not None:
            return y
    from ._util import f32_steps

    def steps(st, *vs):
        acc = vs[0]
        for v in vs[1:]:
            acc = st(acc + v)
        return acc
    return f32_steps(ctx, steps, *xs)


_CMP = {"Equal": np.equal, "NotEqual": np.not_equal, "Less": np.less, "LessEqual": np.less_equal,
        "Greater": np.greater, "GreaterEqual": np.greater_equal, "LogicalAnd": np.logical_and,
        "LogicalOr": np.logical_or}


def _cmp(tf_type, fn):
    @register(tf_type, kind=VECTOR, source=_EXACT_COMPARE)
    def op(x, y, *, ctx):
        # comparisons of values already in the compute dtype are exact
        return fn(np.asarray(x, dtype=np.float32) if is_float(x) else x,
                  np.asarray(y, dtype=np.float32) if is_float(y) else y)
    op.__name__ = tf_type


for _t, _f in _CMP.items():
    _cmp(_t, _f)


@register("LogicalNot", kind=VECTOR, source=_EXACT_COMPARE)
def logical_not(x, *, ctx):
    return np.logical_not(x)


def _reduce(name, tf_type):
    # numerics.reduce widens an fp16 input itself (in its kernel, over leading axes), as the cast would
    @register(tf_type, kind=VECTOR, reads_half=True, source=_REDUCE_SOURCE.get(name))
    def op(x, axis, *, ctx, keep_dims=False):
        axes = tuple(a % max(x.ndim, 1) for a in as_int_list(axis))
        if not is_float(x):
            fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[name]
            return np.asarray(fn(x, axis=axes, keepdims=bool(keep_dims))).astype(x.dtype)
        from ..numerics.reduction import reduce

        y, st = reduce(name, x, axis=axes, keepdims=bool(keep_dims), dtype=ctx.dtype_name,
                       # the fp16-accumulator option concerns fp16 reductions only
                       accumulate=ctx.reduce_accumulate if ctx.dtype_name == "float16" else "float32",
                       overflow_mode=ctx.overflow_mode,
                       subnormals=ctx.subnormals, op_model=ctx.op_model, multicore=ctx.multicore)
        ctx.record(st)
        return y
    op.__name__ = name


_REDUCE_SOURCE = dict.fromkeys(("max", "min"), EXACT_SELECT)
_REDUCE_SOURCE.update(dict.fromkeys(("sum", "mean"), Source(
    ("canndev ops/built-in/tbe/impl/dynamic/reduce_mean_d.py, reduce_mean.py (get_calc_dtype)",
     "hicann/ops-math math/reduce_sum/op_kernel/arch35/reduce_sum_dag.h, math/reduce_mean/op_kernel/arch35/"
     "reduce_mean_dag.h"), ("reduce_accumulate", "op_model", "multicore_reduce_min_chunk"),
    "fp16 summed in float32; the mean's 1/n before (TBE) or after (Ascend C) the sum; the summation order assumed")))

_REDUCE_SOURCE["prod"] = Source(
    (_TBE + "reduce_prod.py (reduce_prod_compute: tbe.reduce_prod in the input dtype)",
     "NUMERICS.md section 2 (reductions)"), ("reduce_accumulate",),
    "fp16 multiplied in float32 and rounded once by default; reduce_accumulate='float16' rounds every step, as the "
    "TBE kernel's fp16 reduce_prod does; the order sequential (assumed)")

for _name, _t in {"sum": "Sum", "mean": "Mean", "max": "Max", "min": "Min", "prod": "Prod"}.items():
    _reduce(_name, _t)


def _bool_reduce(name, tf_type, fn):
    @register(tf_type, kind=VECTOR, source=Source(("hicann/ops-math math/reduce_all, math/reduce_any",),
                                                  exact="a logical reduction of booleans"))
    def op(x, axis, *, ctx, keep_dims=False):
        """TF's All / Any: a logical reduction of booleans (CANN's ReduceAll / ReduceAny, hicann/ops-math
        math/reduce_all, math/reduce_any): exact."""
        axes = tuple(a % max(np.ndim(x), 1) for a in as_int_list(axis))
        return np.asarray(fn(np.asarray(x, bool), axis=axes, keepdims=bool(keep_dims)))
    op.__name__ = name


_bool_reduce("reduce_all", "All", np.all)
_bool_reduce("reduce_any", "Any", np.any)


@register("IsFinite", kind=VECTOR, source=Source(("hicann/ops-math math/is_finite/op_host/is_finite_def.cpp",),
                                                 exact="a classification of the input's bits"))
def is_finite(x, *, ctx):
    """TF's IsFinite: true where x is neither Inf nor NaN, of the value as the op receives it (so of its fp16 cast
    when the device hands it fp16: 65520 and above are Inf there). CANN runs it on the AI Core (hicann/ops-math
    ``math/is_finite/op_host/is_finite_def.cpp``: AICore config ascend910b, ascend910_93; TBE
    ``ops/built-in/tbe/impl/dynamic/is_finite.py``); a classification of the bits, exact."""
    return np.isfinite(np.asarray(x, np.float32) if is_float(x) else x)

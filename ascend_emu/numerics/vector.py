"""Casts and vector-unit ops with Ascend rounding, overflow and status.

Thin wrappers: validate arguments, translate policy strings through
:mod:`ascend_emu.numerics.policy`, allocate outputs and call the Numba kernels in
``ascend_emu.kernels``. Every function returns ``(array, status)`` where ``status``
is the OR of the AI Core status bits the call raised (``config.STATUS_BITS``); pass
it to a :class:`ascend_emu.numerics.status.FloatStatus` to keep a sticky register. The
behaviours and their sources are in NUMERICS.md sections 1 and 2; the reductions are in
:mod:`ascend_emu.numerics.reduction` (section 4).
"""
from __future__ import annotations

import math

import numba
import numpy as np

from . import policy as config
from ..errors import AscendEmuError
from ..kernels import alloc as _alloc
from ..kernels import cast as _kc
from ..kernels import clamp as _kclamp
from ..kernels import vector as _kv
from . import chain as _chain
from . import lowcodes as _low
from . import unary_tables as _tables

_CAST_TARGETS = ("float16", "bfloat16", "float32", "float64")


def flush_f32_subnormals(a: np.ndarray) -> np.ndarray:
    """Replace float32 subnormals in ``a`` (float32, or float64 holding float32 values) by zeros of the
    same sign, in place; returns ``a``."""
    a[np.abs(a) < np.finfo(np.float32).tiny] *= 0.0  # x * 0 keeps the sign; NaN and zeros are not selected
    return a


def _as_real_array(x, what: str) -> np.ndarray:
    """``x`` as a numpy array of a real numeric dtype (bool and integers allowed)."""
    try:
        a = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise AscendEmuError(f"{what} must be a real numeric array ({exc})") from None
    if a.dtype == config.bfloat16:
        return a
    if a.dtype.kind not in "biuf":
        raise AscendEmuError(f"{what} must be a real numeric array, got dtype {a.dtype}; "
                             "convert it to float16, bfloat16, float32 or float64 first")
    if a.dtype.kind == "f" and a.dtype not in (config.float16, config.float32, config.float64):
        raise AscendEmuError(f"{what} has unsupported float dtype {a.dtype}; use float16, bfloat16, float32 or float64")
    return a


def _ints_to_f64(a: np.ndarray, what: str) -> np.ndarray:
    """Booleans and integers as float64, refusing values float64 cannot hold exactly."""
    f = a.astype(np.float64)
    if a.dtype.itemsize >= 8 and a.dtype.kind in "iu":
        if not np.array_equal(f.astype(a.dtype), a) or (np.abs(f) > 2.0 ** 53).any():
            raise AscendEmuError(f"{what} holds 64-bit integers beyond 2**53, which a float cast would round "
                                 "twice; convert them to float64 yourself if that is acceptable")
    return f


_NAMES: dict = {}   # dtype -> its name (numpy works a dtype's name out in Python, a microsecond a call)


def _name(a: np.ndarray) -> str:
    dt = a.dtype
    name = _NAMES.get(dt)
    if name is None:
        name = _NAMES[dt] = "bfloat16" if dt == config.bfloat16 else dt.name
    return name


def _on_compact(inputs):
    """(shape, inputs) for an elementwise op some of whose inputs are broadcast views (np.broadcast_to,
    the BroadcastTo op): the broadcast shape and the inputs with their repeated axes cut to length 1 (the
    cut ones as fresh contiguous copies), or None when that leaves as many elements to compute (or the
    shapes do not broadcast: the op's own error). The op on them, broadcast to ``shape``, is the op on the
    inputs: every output element is the op of the same values, and a status is the OR over elements."""
    cut = [_chain.distinct_view(x) for x in inputs]
    if all(c is x for c, x in zip(cut, inputs)):
        return None
    try:
        shape = np.broadcast_shapes(*(np.shape(x) for x in inputs))
    except ValueError:
        return None
    small = np.broadcast_shapes(*(np.shape(c) for c in cut))
    if int(math.prod(small)) >= int(math.prod(shape)):
        return None
    return shape, [x if c is x else np.array(c, order="C") for c, x in zip(cut, inputs)]


#: at most this many elements on a broadcast view's distinct values: one thread (results do not depend on it;
#: waking the others for a few values costs more than the work)
_SMALL = 1 << 15


def small_run(n: int, fn, limit: int = _SMALL):
    """``fn()`` with one Numba thread if ``n`` (elements; the cube: multiply-adds) is at most ``limit``, the thread
    count restored after."""
    threads = numba.get_num_threads()
    if n > limit or threads == 1:
        return fn()
    numba.set_num_threads(1)
    try:
        return fn()
    finally:
        numba.set_num_threads(threads)


#: at most this many values: the casts that have one (kernels/cast.py ``span_*``) run on one span, no parallel
#: region (a region's start costs more than converting a few thousand values)
_SERIAL_CAST = 4096
#: (dtype, rounding, overflow mode, subnormals) -> what ``_check_cast`` made of them, once per combination
_CAST_CHECKED: dict = {}


def _check_cast(dtype, rounding, overflow_mode, subnormals) -> tuple:
    """``cast``'s arguments checked: (target dtype name, rounding code, overflow code, subnormal code)."""
    rc = config.rounding_code(rounding)
    oc = config.overflow_code(overflow_mode)
    sc = config.subnormal_code(subnormals)
    try:
        dst = config.dtype_name(dtype)
    except AscendEmuError:
        dst = None
    if dst not in _CAST_TARGETS:
        raise AscendEmuError(f"unsupported cast target dtype {dtype!r}; choose one of: {', '.join(_CAST_TARGETS)}")
    return dst, rc, oc, sc


def _is_low(dtype) -> bool:
    try:
        return dtype in _low.CAST_KEYS
    except TypeError:   # an unhashable dtype-like
        return False


def cast(x, dtype, rounding: str | None = None, overflow_mode: str = "inf_nan", subnormals: str = "keep",
         source: str | None = None, keep_nan: bool = False):
    """Convert ``x`` to ``dtype`` as the Ascend vector unit's Cast does.

    Parameters
    ----------
    x : array_like
        float16, bfloat16 (``ml_dtypes.bfloat16``), float32 or float64 values; booleans
        and integers are taken exactly through float64.
    dtype : str or dtype
        ``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"float64"``; or one of the 950's
        low-precision formats (``ascend_emu.numerics.lowfloat.LOW_FORMATS``: ``"hifloat8"``,
        ``"float8_e4m3fn"``, ``"float8_e5m2"``, ``"float4_e2m1fn"``, ``"float4_e1m2"``,
        ``"float8_e8m0"``) from float32, float16 or bfloat16 input: by name the result is the
        uint8 codes, by an ml_dtypes dtype (float8_e4m3fn, float8_e5m2, float4_e2m1fn) an array of
        that dtype (NUMERICS.md section 14 for the roundings and saturation).
    rounding : {"rint", "round", "floor", "ceil", "trunc", "odd", "hybrid"} or None
        Ascend C ``CAST_*`` rounding of narrowing casts: nearest with ties to even,
        nearest with ties away from zero, toward -inf, toward +inf, toward zero, and
        round to odd (truncate, then set the last bit if anything was dropped). None:
        ``rint``, or a low format's default (hifloat8 ``round``; ``hybrid`` is hifloat8's other mode).
    overflow_mode : {"inf_nan", "saturation"}
        ``inf_nan``: IEEE 754 (overflow to Inf in the nearest modes and in the
        direction of a directed mode, else to the largest finite value; Inf and NaN
        stay). ``saturation``: out-of-range values and Inf become the format's largest
        finite value with their sign, NaN becomes +0.
    subnormals : {"keep", "flush"}
        ``flush`` turns subnormal results (and, for widening casts, subnormal inputs)
        into zeros of the same sign.
    source : str or None
        The low-precision format of integer codes ``x`` (e.g. ``"hifloat8"``, ``"float4_e1m2"``), to widen
        exactly to ``dtype`` (float32, float64, and float16 / bfloat16 where exact); arrays of an ml_dtypes
        format widen by their dtype without it.
    keep_nan : bool
        FP8 targets under saturation: NaN stays NaN (CTRL[50]).

    Returns
    -------
    (numpy.ndarray, int)
        The converted array (same shape) and the status bits: 0x100 if a finite
        value overflowed the target format, 0x20 if the input held Inf or NaN (for
        narrowing casts), else 0. Widening casts are exact and raise no status; a
        cast to the input's own dtype returns an unchanged copy with status 0. A broadcast
        view (zero strides, e.g. ``np.broadcast_to``) gives a read-only broadcast view of
        its distinct values' cast.
    """
    if source is not None or getattr(x, "dtype", None) in _low.LOW_DTYPES or _is_low(dtype):
        if type(x) is np.ndarray and 0 in x.strides:
            cut = _on_compact([x])
            if cut is not None:
                # a broadcast view: its distinct values cast, broadcast again (same status), never a full copy
                y, st = small_run(cut[1][0].size, lambda: _low.cast_low(cut[1][0], dtype, rounding, overflow_mode,
                                                                        subnormals, source, keep_nan))
                return np.broadcast_to(y, cut[0]), st
        return _low.cast_low(x, dtype, rounding, overflow_mode, subnormals, source, keep_nan)
    if keep_nan:
        raise AscendEmuError("keep_nan applies to casts to the FP8 formats only")
    if rounding is None:
        rounding = "rint"
    try:
        checked = _CAST_CHECKED.get((dtype, rounding, overflow_mode, subnormals))
    except TypeError:   # an unhashable dtype-like
        checked = None
    if checked is None:
        checked = _check_cast(dtype, rounding, overflow_mode, subnormals)
        try:
            if len(_CAST_CHECKED) < 1024:
                _CAST_CHECKED[(dtype, rounding, overflow_mode, subnormals)] = checked
        except TypeError:
            pass
    dst, rc, oc, sc = checked
    a = _as_real_array(x, "cast input")
    if type(a) is np.ndarray and 0 in a.strides:
        cut = _on_compact([a])
        if cut is not None and _name(a) != dst:
            # a broadcast view (zero strides): its distinct values cast, broadcast again (same status)
            y, st = small_run(cut[1][0].size, lambda: cast(cut[1][0], dtype, rounding, overflow_mode, subnormals))
            return np.broadcast_to(y, cut[0]), st
    if a.dtype.kind in "biu":
        a = _ints_to_f64(a, "cast input")
    src = _name(a)
    if src == dst:
        return a.copy(), 0
    shape = a.shape
    flat = np.ascontiguousarray(a).reshape(-1)
    if src in ("float16", "bfloat16"):
        wide = _alloc.empty(flat.size, np.uint32)
        if src == "float16" and _kc.HW_HALF:   # the CPU's conversion: the same bits (kernels/cast.py)
            widen = _kc.span_f16_to_f32_hw if flat.size <= _SERIAL_CAST else _kc.cast_f16_to_f32_hw
            widen(flat.view(np.uint16), wide, sc)
        else:
            widen = _kc.span_16_to_f32 if flat.size <= _SERIAL_CAST else _kc.cast_16_to_f32
            widen(flat.view(np.uint16), wide, src == "bfloat16", sc)
        wide = wide.view(np.float32)
        if dst == "float32":
            return wide.reshape(shape), 0
        if dst == "float64":
            with np.errstate(invalid="ignore"):  # signalling NaN payloads
                return wide.astype(np.float64).reshape(shape), 0
        flat, src = wide, "float32"  # fp16 <-> bf16: the float32 step is exact, so one rounding
    if src == "float32" and dst == "float64":
        with np.errstate(invalid="ignore"):
            out = flat.astype(np.float64)
        if sc:
            flush_f32_subnormals(out)
        return out.reshape(shape), 0
    if dst == "float32":  # from float64
        out = _alloc.empty(flat.size, np.uint32)
        st = _kc.cast_f64_to_f32(flat.view(np.uint64), out, rc, oc, sc)
        return out.view(np.float32).reshape(shape), int(st)
    out = _alloc.empty(flat.size, np.uint16)
    if src == "float32" and dst == "float16" and rc == 0 and _kc.HW_HALF:
        # the CPU's own IEEE conversion gives the same bits (checked exhaustively), faster
        kernel = _kc.span_f32_to_f16_rint_hw if flat.size <= _SERIAL_CAST else _kc.cast_f32_to_f16_rint_hw
        st = kernel(flat.view(np.uint32), out, oc, sc)
    else:
        kernel = _kc.cast_f32_to_16 if src == "float32" else _kc.cast_f64_to_16
        src_bits = flat.view(np.uint32 if src == "float32" else np.uint64)
        st = kernel(src_bits, out, dst == "bfloat16", rc, oc, sc)
    return out.view(config.COMPUTE_DTYPES[dst]).reshape(shape), int(st)


# ------------------------------------------------------------------------------ vector unit

_UNARY = {
    "neg": _kv.NEG, "abs": _kv.ABS, "square": _kv.SQUARE, "sqrt": _kv.SQRT, "reciprocal": _kv.RECIPROCAL,
    "relu": _kv.RELU, "relu6": _kv.RELU6, "leaky_relu": _kv.LEAKY_RELU, "rsqrt": _kv.RSQRT, "exp": _kv.EXP,
    "expm1": _kv.EXPM1, "log": _kv.LOG, "log1p": _kv.LOG1P, "tanh": _kv.TANH, "sigmoid": _kv.SIGMOID,
    "erf": _kv.ERF, "erfc": _kv.ERFC, "softplus": _kv.SOFTPLUS, "softsign": _kv.SOFTSIGN, "gelu": _kv.GELU,
}
_BINARY = {
    "add": _kv.ADD, "sub": _kv.SUB, "mul": _kv.MUL, "realdiv": _kv.REALDIV, "maximum": _kv.MAXIMUM,
    "minimum": _kv.MINIMUM, "squared_difference": _kv.SQUARED_DIFFERENCE, "pow": _kv.POW,
}
#: the sourced CANN kernels, by (op, op_model); ops and models not listed use the exact model
_STEPPED = {
    ("gelu", "tbe_v100"): _kv.GELU_TBE_V100, ("gelu", "tbe_v220"): _kv.GELU_TBE_V220,
    ("gelu", "ascendc"): _kv.GELU_ASCENDC,
    **{("tanh", m): _kv.TANH_TBE for m in ("tbe_v100", "tbe_v220")}, ("tanh", "ascendc"): _kv.TANH_ASCENDC,
    **{("sigmoid", m): _kv.SIGMOID_TBE for m in ("tbe_v100", "tbe_v220")},
    ("sigmoid", "ascendc"): _kv.SIGMOID_ASCENDC,
    **{(op, m): code for op, code in (("exp", _kv.EXP_F32), ("rsqrt", _kv.RSQRT_F32))
       for m in ("tbe_v100", "tbe_v220", "ascendc")},
}
#: attributes each op accepts, with their defaults
_ATTRS = {"leaky_relu": {"alpha": 0.2}, "gelu": {"approximate": False}}
#: names of the elementwise ops :func:`vector` runs
VECTOR_OPS = tuple(sorted([*_UNARY, *_BINARY, "select"]))


def _choice(kind, value, choices):
    if value not in choices:
        raise AscendEmuError(f"unknown {kind} {value!r}; choose one of: {', '.join(choices)}")
    return value


def _to_compute(x, cdt: np.dtype, what: str, overflow_mode: str, subnormals: str):
    """``x`` in the compute dtype: other float dtypes are cast (rint) and their status returned."""
    a = _as_real_array(x, what)
    if a.dtype == cdt:
        return a, 0
    return cast(a, cdt, "rint", overflow_mode, subnormals)


def _broadcast_flat(arrays, what: str):
    """The broadcast shape and each array as a contiguous flat array of that shape."""
    try:
        shape = _chain.broadcast_shape([a.shape for a in arrays])
    except ValueError:
        shapes = " and ".join(str(a.shape) for a in arrays)
        raise AscendEmuError(f"{what}: input shapes {shapes} do not broadcast together") from None
    flat = [np.ascontiguousarray(a if a.shape == shape else np.broadcast_to(a, shape)).reshape(-1) for a in arrays]
    return shape, flat


#: float32 ops whose result is one IEEE operation, as numpy computes it (the fast path of :func:`vector`)
_NUMPY_F32 = {_kv.ADD: np.add, _kv.SUB: np.subtract, _kv.MUL: np.multiply, _kv.REALDIV: np.divide}
_KEEP = config.subnormal_code("keep")


#: fp16 binary ops as steps of the chain kernel (numerics/chain.py): one float32 op rounded once; the
#: squared difference rounds its difference to fp16 before squaring it, as the vector unit's two instructions;
#: maximum and minimum select one widened operand (exact back in fp16; a NaN: the kernels below). A hardswish's
#: fp16 Maximum / Minimum with a scalar took the 16-bit kernel on the scalar copied out to full size
_ONE_PASS_F16 = {"add": [("add", 0, 1)], "sub": [("sub", 0, 1)], "mul": [("mul", 0, 1)],
                 "realdiv": [("realdiv", 0, 1)], "maximum": [("maximum", 0, 1)], "minimum": [("minimum", 0, 1)],
                 "squared_difference": [("sub", 0, 1), ("round16", -1, -2), ("mul", -1, -1)]}


#: float32 unary ops computed in one pass when every input is finite (kernels/clamp.py; the fast path)
_F32_CLAMPS = (_kv.RELU, _kv.RELU6)
#: float32 unary ops whose result is one correctly rounded IEEE operation (exact for neg and abs), as numpy
#: computes it; the kernel's float64 evaluation rounded once gives the same bits (a double rounding through
#: float64 is innocuous for x*x, sqrt and 1/x), so it runs only for its overflow handling, on an Inf/NaN result
_NUMPY_F32_UNARY = {_kv.NEG: np.negative, _kv.ABS: np.absolute, _kv.SQUARE: np.square, _kv.SQRT: np.sqrt,
                    _kv.RECIPROCAL: np.reciprocal}


#: (op, input count, dtype, overflow mode, subnormals, impl mode, op model) -> what ``_check_vector`` made of
#: them: ``vector`` checks its arguments once per combination (small ops paid several microseconds a call)
_CHECKED: dict = {}


def _check_vector(op, n_inputs, dtype, overflow_mode, subnormals, impl_mode, op_model, attrs) -> tuple:
    """``vector``'s arguments checked: (params, compute dtype, overflow code, subnormal code, use float64)."""
    if op not in VECTOR_OPS:
        raise AscendEmuError(f"unknown vector op {op!r}; choose one of: {', '.join(VECTOR_OPS)}")
    arity = 3 if op == "select" else (1 if op in _UNARY else 2)
    if n_inputs != arity:
        raise AscendEmuError(f"vector op {op!r} takes {arity} input{'s' if arity > 1 else ''}, got {n_inputs}")
    allowed = _ATTRS.get(op, {})
    unknown = sorted(set(attrs) - set(allowed))
    if unknown:
        raise AscendEmuError(f"vector op {op!r} has no attribute {unknown[0]!r}; "
                             f"it takes: {', '.join(allowed) if allowed else 'no attributes'}")
    params = {**allowed, **attrs}
    cdt = config.compute_dtype(dtype)
    oc = config.overflow_code(overflow_mode)
    sc = config.subnormal_code(subnormals)
    use64 = _choice("impl_mode", impl_mode, config.IMPL_MODES) == "high_precision"
    _choice("op_model", op_model, config.OP_MODELS)
    return params, cdt, oc, sc, use64


def _squares(inputs) -> bool:
    """Whether pow's exponent (inputs[1]) is one value, 2 in fp16 (as the kernel casts it: rint), that broadcasts
    to no larger shape than the base's."""
    x, y = inputs
    if not isinstance(y, (np.ndarray, np.generic, float, int)) or np.size(y) != 1 or np.ndim(y) > np.ndim(x):
        return False
    y = np.asarray(y)
    if y.dtype.kind not in "fiu" and y.dtype != config.bfloat16:
        return False
    with np.errstate(all="ignore"):
        return bool(np.float16(y.reshape(()).astype(np.float64)) == 2)


def vector(op: str, *inputs, dtype="float16", overflow_mode: str = "inf_nan", subnormals: str = "keep",
           impl_mode: str = "high_precision", op_model: str = "tbe_v220", **attrs):
    """Run one elementwise op of the vector unit in a compute dtype.

    Parameters
    ----------
    op : str
        One of :data:`VECTOR_OPS`. ``select`` takes ``(cond, a, b)`` with a boolean
        ``cond``; the unary ops take one input, the others two.
    *inputs : array_like
        Broadcast together as numpy does. Float inputs of another dtype are first
        cast to the compute dtype (``rint``), and that cast's status is included.
    dtype : {"float16", "bfloat16", "float32"}
        The compute dtype; also the output dtype.
    overflow_mode : {"inf_nan", "saturation"}
        ``saturation`` turns Inf results into the largest finite value of the
        compute dtype (sign kept) and NaN results into +0.
    subnormals : {"keep", "flush"}
        ``flush`` treats subnormal inputs as zero and flushes subnormal results.
    impl_mode : {"high_precision", "high_performance"}
        Transcendental ops (rsqrt, exp, expm1, log, log1p, tanh, sigmoid, erf, erfc,
        softplus, softsign, gelu, pow): ``high_precision`` evaluates in float64 and
        rounds once; ``high_performance`` evaluates in float32 (libm) and then rounds
        to a 16-bit compute dtype, a second rounding. Other ops are unaffected. In the
        sourced kernels (``op_model``) it selects the model of the float32 exp: correctly
        rounded (``high_precision``) or the C library's ``expf`` (``high_performance``).
    op_model : {"tbe_v100", "tbe_v220", "ascendc", "exact"}
        gelu, tanh, sigmoid, exp and rsqrt follow CANN's published kernel, instruction by
        instruction (NUMERICS.md section 2, "Sourced kernels"): the TBE kernels of Ascend910
        (``tbe_v100``) or Ascend910B (``tbe_v220``), or the Ascend C kernels of ops-nn /
        ops-math (``ascendc``). ``exact``: the float64 model rounded once, as every other
        transcendental (gelu's ``approximate`` only matters there: CANN's Gelu is the tanh form).
    **attrs
        ``alpha`` for leaky_relu (default 0.2, rounded to the compute dtype first);
        ``approximate`` for gelu (default False: the erf form; True: the tanh form).

    Returns
    -------
    (numpy.ndarray, int)
        The result in the compute dtype and the status bits: 0x20 if any result
        (or intermediate rounding) was Inf or NaN before saturation, ORed with the
        status of the input casts. Inputs that are broadcast views (zero strides, e.g.
        ``np.broadcast_to``) are computed on their distinct values: when that is fewer
        elements, the result is a read-only broadcast view of that computation.
    """
    key = (op, len(inputs), dtype, overflow_mode, subnormals, impl_mode, op_model)
    try:
        checked = None if attrs else _CHECKED.get(key)
    except TypeError:   # an unhashable dtype-like: checked below
        checked = None
    if checked is None:
        checked = _check_vector(op, len(inputs), dtype, overflow_mode, subnormals, impl_mode, op_model, attrs)
        if not attrs and len(_CHECKED) < 4096:
            try:
                _CHECKED[key] = checked
            except TypeError:
                pass
    params, cdt, oc, sc, use64 = checked
    if op == "pow" and cdt == config.float16 and use64 and _squares(inputs):
        # fp16 x ** 2 (RMSNorm's): the float64 model's pow(x, 2) is exact (22 significant bits), rounded once,
        # as square's exact float32 product rounded once: the same bits and status for all 65,536 x in every
        # mode (tested), without the transcendental path's float64 pow per element (0.76 -> 0.03 ms on 64 x 256)
        return vector("square", inputs[0], dtype=dtype, overflow_mode=overflow_mode, subnormals=subnormals,
                      impl_mode=impl_mode, op_model=op_model)
    if any(type(x) is np.ndarray and 0 in x.strides for x in inputs):
        cut = _on_compact(inputs)
        if cut is not None:
            # broadcast views (zero strides): the op on their distinct values, broadcast again (read-only)
            n = max(int(np.size(x)) for x in cut[1])
            y, st = small_run(n, lambda: vector(op, *cut[1], dtype=dtype, overflow_mode=overflow_mode,
                                                subnormals=subnormals, impl_mode=impl_mode, op_model=op_model,
                                                **attrs))
            return np.broadcast_to(y, cut[0]), st
    code = _BINARY.get(op)
    if (cdt == config.float32 and sc == _KEEP and code in _NUMPY_F32 and type(inputs[0]) is np.ndarray
            and type(inputs[1]) is np.ndarray and inputs[0].dtype == np.float32 and inputs[1].dtype == np.float32):
        # the float32 fast path below without its flat copies of broadcast operands: numpy broadcasts
        with np.errstate(all="ignore"):
            y = np.asarray(_NUMPY_F32[code](inputs[0], inputs[1], order="C"))
        if np.isfinite(y).all():
            return y, 0
    status = 0
    data = inputs[1:] if op == "select" else inputs
    arrays = []
    for k, x in enumerate(data):
        a, st = _to_compute(x, cdt, f"vector op {op!r} input {k}", overflow_mode, subnormals)
        arrays.append(a)
        status |= st
    if (cdt == config.float16 and sc == _KEEP and op in _ONE_PASS_F16
            and _chain.MIN_ELEMENTS <= max(arrays[0].size, arrays[1].size)):
        # the chain kernel (vectorised float32 steps): a broadcast operand (one value per channel, or one
        # value) read in place instead of copied out to full size; any Inf/NaN result: the kernels below
        y = _chain.chain_to_f16(arrays, _ONE_PASS_F16[op])
        if y is not None:
            return y, status
    if op == "select":
        cond = np.asarray(inputs[0])
        if cond.dtype != np.bool_:
            raise AscendEmuError(f"vector op 'select' needs a boolean condition, got dtype {cond.dtype}; "
                                 "compare first (e.g. x > 0)")
        arrays.insert(0, cond)
    shape, flat = _broadcast_flat(arrays, f"vector op {op!r}")
    size = int(math.prod(shape))
    wide = cdt == config.float32
    bf16 = cdt == config.bfloat16
    out = _alloc.empty(size, np.float32 if wide else np.uint16)
    bits = [f if wide or f.dtype == np.bool_ else f.view(np.uint16) for f in flat]
    if op == "select":
        if wide:
            np.copyto(out, np.where(bits[0], bits[1], bits[2]))
            st = int(not np.isfinite(out).all())
        else:
            st = _kv.select16(bits[0], bits[1], bits[2], out, bf16)
    elif op in _UNARY:
        code = _kv.GELU_TANH if (op == "gelu" and params["approximate"]) else _UNARY[op]
        code = _STEPPED.get((op, op_model), code)
        alpha = 0.0
        if code == _kv.TANH_TBE:
            # TBE tanh's MIN_FP_DATA, which keeps |x| + MIN off zero: 2**-14 for fp16 data, else 2**-126
            alpha = 2.0 ** -14 if cdt == config.float16 else 2.0 ** -126
        if op == "leaky_relu":
            # the vector unit multiplies by a scalar held in the compute dtype
            alpha = float(cast(np.float64(params["alpha"]), cdt)[0].astype(np.float64))
        if wide and sc == _KEEP and code in _F32_CLAMPS and _kclamp.relu_f32(bits[0], out, code == _kv.RELU6):
            # relu / relu6 of finite float32 values are exact selections (x > 0 ? x : +0, capped at 6):
            # one pass gives the kernel's bits (as numpy's maximum/minimum do) and nothing overflows
            st = 0
        elif wide and sc == _KEEP and code in _NUMPY_F32_UNARY:
            with np.errstate(all="ignore"):
                _NUMPY_F32_UNARY[code](bits[0], out=out)
            st = 0 if np.isfinite(out).all() else _kv.unary_f32(code, bits[0], out, oc, sc, use64, alpha)
        elif wide:
            st = _kv.unary_f32(code, bits[0], out, oc, sc, use64, alpha)
        else:
            st = _tables.unary16(code, bits[0], out, bf16, oc, sc, use64, alpha)
    else:
        code = _BINARY[op]
        fast = _NUMPY_F32.get(code) if wide and sc == _KEEP else None
        if code == _kv.SQUARED_DIFFERENCE and wide and sc == _KEEP:
            # the kernel's two float32 instructions (sub, then mul), each rounded; the kernel only for overflow
            with np.errstate(all="ignore"):
                np.subtract(bits[0], bits[1], out=out)
                np.multiply(out, out, out=out)
            st = 0 if np.isfinite(out).all() else _kv.binary_f32(code, bits[0], bits[1], out, oc, sc, use64)
        elif fast is not None:
            # one IEEE float32 operation per element is numpy's own; the kernel (same arithmetic) is
            # only needed for its overflow handling, so it reruns the op when a result is Inf/NaN
            with np.errstate(all="ignore"):
                fast(bits[0], bits[1], out=out)
            st = 0 if np.isfinite(out).all() else _kv.binary_f32(code, bits[0], bits[1], out, oc, sc, use64)
        elif wide:
            st = _kv.binary_f32(code, bits[0], bits[1], out, oc, sc, use64)
        elif _kc.HW_HALF and not bf16 and (code <= _kv.REALDIV or code == _kv.SQUARED_DIFFERENCE):
            # same model, with the exact conversions done by the CPU's fp16 instructions
            st = _kv.arith_f16_hw(code, bits[0], bits[1], out, oc, sc)
        else:
            st = _kv.binary16(code, bits[0], bits[1], out, bf16, oc, sc, use64)
    if st:
        status |= config.STATUS_FP_OVERFLOW
    return out.view(cdt).reshape(shape), status

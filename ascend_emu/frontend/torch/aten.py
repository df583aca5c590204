"""The one table from aten ops onto the registry's ops: how torch_npu's eager kernels run on the emulated units.

Each entry of :data:`ATEN` (keyed by the aten overload packet, ``aten.addmm``, or by one overload,
``aten.add.Tensor``) is a function ``fn(k, *args, **kwargs)`` taking the aten call's own arguments and returning
what the aten op returns; it converts the tensors to arrays (NCHW to the registry's NHWC where an op wants it),
runs registry ops through ``k`` (the kernel launcher the run gives: ``k.op(tf_type, *arrays, family=..,
**attrs)`` decides the compute dtype and the cube math type, and records what ran) and converts back.
:data:`HOST` lists the aten ops that only move data or make tensors: torch runs them itself, on the host.
An aten op in neither runs on the AI CPU (torch, in float32), or is refused. A lowering that meets a case its
registry op does not cover raises :class:`Fallback` and the call goes to the AI CPU too.

The numerics behind each choice are in NUMERICS.md section 16 (the torch path; ASCEND-FACTS.md section 13).
The attention and torch_npu fused-kernel lowerings are entries of the same table in :mod:`.aten_fused`, the
backward kernels' in :mod:`.aten_grad`: whoever looks a lowering up imports them (they register on import).
"""
from __future__ import annotations

import numpy as np
import torch

from .convert import EMULATED, from_numpy, to_numpy

ATEN: dict = {}


class Fallback(Exception):
    """This call is outside what the lowering emulates: run it on the AI CPU (the message says why)."""


class Host(Exception):
    """This call only moves or converts data exactly (a device move, an integer conversion): the host runs it."""


def aten(*names):
    def deco(fn):
        for n in names:
            ATEN[n] = fn
        return fn
    return deco


def lookup(func):
    """The lowering of aten overload ``func`` (an ``OpOverload``), or None. A lowering keyed by the packet takes
    the functional overloads; the ``out=`` ones (another signature) have none."""
    low = ATEN.get(str(func))
    if low is None and "out" not in func._overloadname:
        low = ATEN.get(str(func.overloadpacket))
    return low


#: aten ops that only make, view, copy or move tensors (exact, no arithmetic): torch runs them as the host
#: does; ``_to_copy`` / ``copy_`` between float dtypes are casts and have lowerings instead
HOST = frozenset(f"aten.{n}" for n in (
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze", "slice",
    "select", "split", "split_with_sizes", "chunk", "unbind", "narrow", "as_strided", "alias", "detach", "clone",
    "contiguous", "cat", "stack", "flatten", "unflatten", "repeat", "expand_as", "view_as", "lift_fresh",
    "lift_fresh_copy", "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "fill_", "zero_",
    "arange", "scalar_tensor", "_local_scalar_dense", "set_", "resize_", "index_select", "gather", "index",
    "masked_fill", "masked_fill_", "where", "flip", "roll", "tril", "triu", "diagonal", "_reshape_alias",
    "is_same_size", "equal", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
    "randn", "rand", "randint", "normal_", "uniform_", "bernoulli_", "random_", "randperm", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "_has_compatible_shallow_copy_type", "copy_",
    "_to_copy", "to", "split_with_sizes_copy", "t_copy", "unsqueeze_copy", "view_copy", "squeeze_copy",
    "clamp_min", "isinf", "isnan", "isfinite", "any", "all", "argmax", "argmin", "embedding",
    # the gradients of a view: the incoming gradient placed into zeros, no arithmetic
    "select_backward", "slice_backward"))


def _np(t):
    return to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t)


def _float(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype.is_floating_point


def _emulated(*ts) -> bool:
    """Whether the float tensors among ``ts`` have a dtype the AI Core computes in (no float64, no complex)."""
    fl = [t for t in ts if isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.dtype.is_complex)]
    return bool(fl) and all(t.dtype in EMULATED for t in fl)


def _arg(x, dtype: torch.dtype) -> np.ndarray:
    """An operand of an op computing in ``dtype``: a tensor of another float dtype converted as torch's type
    promotion does (a widening, exact: promotion never narrows a tensor), a Python number or wrapped number
    rounded to ``dtype``."""
    if isinstance(x, torch.Tensor):
        if x.dtype != dtype:
            x = x.to(dtype)
        return to_numpy(x)
    return to_numpy(torch.tensor(x, dtype=dtype))


def _out(y, dtype=None):
    return from_numpy(y, dtype)


# -- elementwise ---------------------------------------------------------------------------------------
_BINARY = {"add": "AddV2", "sub": "Sub", "mul": "Mul", "div": "RealDiv", "maximum": "Maximum",
           "minimum": "Minimum"}
_UNARY = {"neg": "Neg", "abs": "Abs", "sqrt": "Sqrt", "rsqrt": "Rsqrt", "reciprocal": "Reciprocal", "exp": "Exp",
          "log": "Log", "tanh": "Tanh", "sigmoid": "Sigmoid", "relu": "Relu", "erf": "Erf", "log1p": "Log1p",
          "expm1": "Expm1", "square": "Square"}


def _binary(k, tf_type, a, b, alpha=1):
    dt = torch.result_type(a, b)
    if not dt.is_floating_point and not dt.is_complex:
        k.note(f"{dt} arithmetic is exact: computed by torch")
        k.exact()
    if dt not in EMULATED:
        raise Fallback(f"{dt} arithmetic")
    x, y = _arg(a, dt), _arg(b, dt)
    if alpha != 1:
        # torch_npu: add/sub with alpha != 1 is Mul(other, alpha in the tensor's dtype) then Add (ASCEND-FACTS
        # 13.4 item 4): two roundings
        (y,) = k.op("Mul", y, _arg(alpha, dt))
    (z,) = k.op(tf_type, x, y)
    return _out(z)


def _make_binary(name, tf_type):
    def fn(k, a, b, alpha=1, **kw):
        if kw.get("rounding_mode") is not None:
            raise Fallback(f"div rounding_mode={kw['rounding_mode']}")
        return _binary(k, tf_type, a, b, alpha)
    aten(f"aten.{name}.Tensor", f"aten.{name}.Scalar", f"aten.{name}.default", f"aten.{name}.Tensor_mode")(fn)


for _n, _t in _BINARY.items():
    _make_binary(_n, _t)


@aten("aten.rsub.Tensor", "aten.rsub.Scalar")
def rsub(k, a, b, alpha=1):
    return _binary(k, "Sub", b, a, 1) if alpha == 1 else _binary(k, "AddV2", b, _binary(k, "Mul", a, -1), alpha)


def _unary(k, tf_type, x):
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    (y,) = k.op(tf_type, to_numpy(x))
    return _out(y)


def _make_unary(name, tf_type):
    aten(f"aten.{name}.default", f"aten.{name}")(lambda k, x: _unary(k, tf_type, x))


for _n, _t in _UNARY.items():
    _make_unary(_n, _t)


@aten("aten.pow.Tensor_Scalar")
def pow_scalar(k, x, e):
    if e == 2:
        return _unary(k, "Square", x)
    if e == 0.5:
        return _unary(k, "Sqrt", x)
    if e == 1:
        return x.clone()
    return _binary(k, "Pow", x, e)


@aten("aten.pow.Tensor_Tensor")
def pow_tensor(k, x, e):
    return _binary(k, "Pow", x, e)


def _compound_dtype(k, dt: torch.dtype) -> torch.dtype:
    """The dtype silu / addcmul / addcdiv / lerp compute their steps in: the tensors' own (``compound_ops=
    "sequence"``, one rounding per step) or float32 for 16-bit tensors (``"float32"``: one rounding at the end);
    the aclnn kernels' internal precision is not public (an assumption: NUMERICS.md section 16)."""
    if dt in (torch.float16, torch.bfloat16) and k.numerics.compound_ops == "float32":
        return torch.float32
    return dt


def _compound_out(k, y: np.ndarray, dt: torch.dtype):
    """A compound op's result in its dtype ``dt``: one Cast (rint) when its steps ran in float32."""
    if y.dtype == np.float32 and dt in (torch.float16, torch.bfloat16):
        y = k.cast(y, str(dt)[6:])
    return _out(y)


@aten("aten.silu")
def silu(k, x):
    # aclnnSilu (l0op::Swish) as x * sigmoid(x): the vector unit's Sigmoid and Mul (compound_ops: an assumption)
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    a = _arg(x, _compound_dtype(k, x.dtype))
    (s,) = k.op("Sigmoid", a)
    (y,) = k.op("Mul", a, s)
    return _compound_out(k, y, x.dtype)


@aten("aten.gelu")
def gelu(k, x, approximate="none"):
    """torch_npu's aclnnGelu is the tanh approximation whatever ``approximate`` says; the erf form only with
    the compatible-implementation switch (ASCEND-FACTS 13.8 item 5), computed exactly and rounded once."""
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    if k.options.compatible_impl:
        k.note(f"compatible impl: approximate={approximate!r} as asked")
        (y,) = k.op("_Gelu", to_numpy(x), approximate=approximate, op_model="exact")
    else:
        k.note(f"aclnnGelu: the tanh approximation (approximate={approximate!r} is not read)")
        (y,) = k.op("_Gelu", to_numpy(x), approximate="tanh")
    return _out(y)


@aten("aten.threshold_backward")
def threshold_backward(k, dy, x, threshold):
    if threshold != 0 or not _emulated(dy, x):
        raise Fallback("threshold != 0")
    dt = torch.result_type(dy, x)
    (g,) = k.op("ReluGrad", _arg(dy, dt), _arg(x, dt))
    return _out(g)


# -- casts ------------------------------------------------------------------------------------------------
def _cast_to(k, x, dtype):
    if not (x.dtype in EMULATED and dtype in EMULATED) or x.dtype == dtype:
        return None
    return _out(k.cast(to_numpy(x), str(dtype).replace("torch.", "")))


@aten("aten._to_copy")
def to_copy(k, x, dtype=None, **kw):
    if dtype is not None and x.dtype.is_floating_point and dtype.is_floating_point:
        y = _cast_to(k, x, dtype)
        if y is not None:
            return y
    raise Host


@aten("aten.copy_")
def copy_(k, dst, src, non_blocking=False):
    if src.dtype != dst.dtype and src.dtype.is_floating_point and dst.dtype.is_floating_point:
        y = _cast_to(k, src, dst.dtype)
        if y is not None:
            k.host_copy(dst, y)
            return dst
    raise Host


# -- reductions -------------------------------------------------------------------------------------------
def _reduce(k, tf_type, x, dim=None, keepdim=False, dtype=None):
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    if dtype is not None and dtype != x.dtype:
        # aclnnReduceSum / aclnnMean cast the input to the requested dtype first, then reduce in it (ASCEND-FACTS
        # 13.4 item 7): an autocast sum accumulates float32
        if not (x.dtype.is_floating_point and dtype in EMULATED):
            raise Fallback(f"reduction with dtype={dtype}")
        x = _out(k.cast(to_numpy(x), str(dtype)[6:]))
    axes = list(range(x.dim())) if dim is None or (isinstance(dim, (list, tuple)) and not len(dim)) else \
        ([dim] if isinstance(dim, int) else list(dim))
    (y,) = k.op(tf_type, to_numpy(x), np.asarray(axes, np.int32), keep_dims=bool(keepdim))
    return _out(y)


@aten("aten.sum.dim_IntList")
def sum_dim(k, x, dim, keepdim=False, dtype=None):
    return _reduce(k, "Sum", x, dim, keepdim, dtype)


@aten("aten.sum.default")
def sum_all(k, x, dtype=None):
    return _reduce(k, "Sum", x, None, False, dtype)


@aten("aten.mean.dim")
def mean_dim(k, x, dim, keepdim=False, dtype=None):
    return _reduce(k, "Mean", x, dim, keepdim, dtype)


@aten("aten.mean.default")
def mean_all(k, x, dtype=None):
    return _reduce(k, "Mean", x, None, False, dtype)


@aten("aten.amax")
def amax(k, x, dim=(), keepdim=False):
    return _reduce(k, "Max", x, dim, keepdim)


@aten("aten.amin")
def amin(k, x, dim=(), keepdim=False):
    return _reduce(k, "Min", x, dim, keepdim)


# -- softmax ------------------------------------------------------------------------------------------------
def _last(x, dim):
    """(array with ``dim`` moved last, the permutation back) for the registry's last-axis ops."""
    a = to_numpy(x)
    dim = dim % max(x.dim(), 1)
    if dim == x.dim() - 1 or x.dim() == 0:
        return a, None
    return np.ascontiguousarray(np.moveaxis(a, dim, -1)), dim


def _back(y, dim):
    return y if dim is None else np.ascontiguousarray(np.moveaxis(y, -1, dim))


@aten("aten._softmax")
def softmax(k, x, dim, half_to_float):
    """aclnnSoftmax computes in its input dtype; ``half_to_float`` only casts the result (ASCEND-FACTS 13.4
    item 5)."""
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    a, d = _last(x, dim)
    (y,) = k.op("Softmax", a)
    y = _back(y, d)
    return _out(k.cast(y, "float32")) if half_to_float else _out(y)


@aten("aten._log_softmax")
def log_softmax(k, x, dim, half_to_float):
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    a, d = _last(x, dim)
    (y,) = k.op("LogSoftmax", a)
    y = _back(y, d)
    return _out(k.cast(y, "float32")) if half_to_float else _out(y)


@aten("aten._softmax_backward_data")
def softmax_backward(k, dy, y, dim, input_dtype):
    if not _emulated(dy, y) or dy.dtype != y.dtype:
        raise Fallback("mixed dtypes")
    g, d = _last(dy, dim)
    yy, _ = _last(y, dim)
    (dx,) = k.op("_SoftmaxGrad", yy, g)
    dx = _out(_back(dx, d))
    return dx if dx.dtype == input_dtype else _out(k.cast(to_numpy(dx), str(input_dtype)[6:]))


# -- cube: matmul family ---------------------------------------------------------------------------------
def _cube_dtype(*ts):
    """The compute dtype of a cube op: its operands' dtype; mixed 16-bit and float32 operands are promoted to
    float32 (ASCEND-FACTS 13.3, matmul_util.cpp SetMmSupportDType)."""
    if not _emulated(*ts):
        raise Fallback("float64 operands")
    dts = {t.dtype for t in ts if isinstance(t, torch.Tensor)}
    return dts.pop() if len(dts) == 1 else torch.float32


@aten("aten.mm")
def mm(k, a, b):
    dt = _cube_dtype(a, b)
    (y,) = k.op("MatMul", _arg(a, dt), _arg(b, dt), family="matmul")
    return _out(y, dt)


@aten("aten.bmm")
def bmm(k, a, b):
    dt = _cube_dtype(a, b)
    (y,) = k.op("BatchMatMulV2", _arg(a, dt), _arg(b, dt), family="matmul")
    return _out(y, dt)


@aten("aten.addmm")
def addmm(k, bias, a, b, beta=1, alpha=1):
    """aclnnAddmm: a 1-D bias (or one row) is fused into the matmul (added to the float32 accumulator); any other
    bias, beta or alpha goes through mm, Muls and Add (ASCEND-FACTS 13.3, aclnn_addmm.cpp)."""
    dt = _cube_dtype(bias, a, b)
    x, w = _arg(a, dt), _arg(b, dt)
    if beta == 1 and alpha == 1 and (bias.dim() == 1 or (bias.dim() == 2 and bias.shape[0] == 1)):
        (y,) = k.op("MatMul", x, w, family="matmul", bias=_arg(bias.reshape(-1), dt))
        return _out(y, dt)
    (y,) = k.op("MatMul", x, w, family="matmul")
    y = _arg(_out(y), dt)       # the cube's output (fp16 under USE_FP16) back in the call's dtype
    if alpha != 1:
        (y,) = k.op("Mul", y, _arg(alpha, dt))
    c = _arg(bias, dt)
    if beta != 1:
        (c,) = k.op("Mul", c, _arg(beta, dt))
    (y,) = k.op("AddV2", y, c)
    return _out(y)


@aten("aten.baddbmm")
def baddbmm(k, c, a, b, beta=1, alpha=1):
    dt = _cube_dtype(c, a, b)
    (y,) = k.op("BatchMatMulV2", _arg(a, dt), _arg(b, dt), family="matmul")
    y = _arg(_out(y), dt)
    if alpha != 1:
        (y,) = k.op("Mul", y, _arg(alpha, dt))
    if beta == 0:
        return _out(y, dt)
    cc = _arg(c, dt)
    if beta != 1:
        (cc,) = k.op("Mul", cc, _arg(beta, dt))
    (y,) = k.op("AddV2", y, cc)
    return _out(y)


# -- layouts (NCHW in torch, NHWC in the registry); the convolutions are in :mod:`.aten_conv` ---------------
def _nhwc(t):
    return np.ascontiguousarray(np.transpose(to_numpy(t), (0, 2, 3, 1)))


def _nhwc_view(t):
    """NCHW tensor ``t`` as an NHWC array without a copy, for the ops whose kernels read any strides."""
    return np.transpose(to_numpy(t), (0, 2, 3, 1))


def _nchw(a, dtype=None):
    return from_numpy(np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2))), dtype)


# -- normalisation and pooling ---------------------------------------------------------------------------------
@aten("aten.native_batch_norm")
def native_batch_norm(k, x, weight, bias, running_mean, running_var, training=False, momentum=0.1, eps=1e-5):
    """BNTrainingReduce + BNTrainingUpdate (training) or BNInfer on NHWC, float32 statistics; the running
    statistics are blended with ``momentum`` and the unbiased batch variance, as torch does."""
    if x.dim() != 4 or not _emulated(x):
        raise Fallback("batch norm of a non-4-D or float64 input")
    c = x.shape[1]
    scale = to_numpy(weight.float()) if weight is not None else np.ones(c, np.float32)
    offset = to_numpy(bias.float()) if bias is not None else np.zeros(c, np.float32)
    rm = to_numpy(running_mean.float()) if running_mean is not None else np.zeros(c, np.float32)
    rv = to_numpy(running_var.float()) if running_var is not None else np.ones(c, np.float32)
    outs = k.op("FusedBatchNormV3", _nhwc_view(x), scale, offset, rm, rv, epsilon=float(eps),
                is_training=bool(training), exponential_avg_factor=float(momentum))
    y = _nchw(outs[0])
    if training:
        bmean, bvar = outs[3], outs[4]
        if running_mean is not None:
            k.host_copy(running_mean, from_numpy(outs[1]))
            k.host_copy(running_var, from_numpy(outs[2]))
        with np.errstate(all="ignore"):
            invstd = (np.float32(1.0) / np.sqrt(bvar + np.float32(eps))).astype(np.float32)
        save_mean, save_invstd = from_numpy(bmean), from_numpy(invstd)
        _bn_variance(k)[save_invstd] = bvar   # the backward reads the variance, not 1/sqrt(var+eps)
        return y, save_mean, save_invstd
    return y, torch.empty(0), torch.empty(0)


def _bn_variance(k):
    """The batch variance per save_invstd tensor, weakly keyed: the entry goes with the tensor (autograd frees it
    once the backward consumed it, or with a graph never backpropagated), so a long run holds none of the past
    steps' and a recycled id cannot find a dead tensor's variance."""
    from torch.utils.weak import WeakIdKeyDictionary

    table = k.stash.get("batch_norm_variance")
    if table is None:
        table = k.stash["batch_norm_variance"] = WeakIdKeyDictionary()
    return table


@aten("aten._native_batch_norm_legit_no_training")
def native_batch_norm_no_training(k, x, weight, bias, running_mean, running_var, momentum, eps):
    """The inference overload (an exported program's batch norm): no ``training`` argument, so ``momentum`` is not
    read as one."""
    return native_batch_norm(k, x, weight, bias, running_mean, running_var, False, momentum, eps)


@aten("aten.native_batch_norm_backward")
def native_batch_norm_backward(k, dy, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask):
    """BNTrainingUpdateGrad + BNTrainingReduceGrad on NHWC (the registry's FusedBatchNormGradV3)."""
    if x.dim() != 4 or not _emulated(dy, x) or not train:
        raise Fallback("batch norm backward outside training on 4-D inputs")
    bvar = _bn_variance(k).get(save_invstd)
    if bvar is None:
        raise Fallback("the forward's batch variance is not known")
    c = x.shape[1]
    scale = to_numpy(weight.float()) if weight is not None else np.ones(c, np.float32)
    dt = torch.result_type(dy, x)
    dx, dscale, doffset, _, _ = k.op("FusedBatchNormGradV3", np.transpose(_arg(dy, dt), (0, 2, 3, 1)),
                                     np.transpose(_arg(x, dt), (0, 2, 3, 1)), scale, to_numpy(save_mean), bvar,
                                     epsilon=float(eps), is_training=True)
    return (_nchw(dx) if output_mask[0] else None,
            from_numpy(dscale).to(weight.dtype) if output_mask[1] and weight is not None else None,
            from_numpy(doffset).to(weight.dtype) if output_mask[2] and weight is not None else None)


@aten("aten.native_layer_norm")
def native_layer_norm(k, x, shape, weight, bias, eps):
    """aclnnLayerNorm: float32 statistics, one rounding of y (the registry's _LayerNorm as LayerNormV4 computes it
    on the 910B and later: a bf16 y rounded ties-away, ASCEND-FACTS 13.4 item 2)."""
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    n = len(shape)
    axes = tuple(range(x.dim() - n, x.dim()))
    params = [to_numpy(p.to(x.dtype)) for p in (weight, bias) if p is not None]
    (y,) = k.op("_LayerNorm", to_numpy(x), *params, epsilon=float(eps), axis=axes, has_gamma=weight is not None,
                has_beta=bias is not None, op_model=k.aclnn_model())
    # the saved statistics (float32, for the backward, which runs on the AI CPU)
    x64 = to_numpy(x.detach().double())
    mean = x64.mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(((x64 - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    return _out(y), from_numpy(mean.astype(np.float32)), from_numpy(rstd.astype(np.float32))


@aten("aten.max_pool2d_with_indices")
def max_pool2d_with_indices(k, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """MaxPoolWithArgmax: a window's maximum is one of its values, so exact in any dtype; the values and indices
    are torch's own (recorded as the AI Core's vector op)."""
    if not _emulated(x):
        raise Fallback(f"{x.dtype} input")
    k.note("a maximum is exact: values and argmax indices as torch computes them")
    return k.exact()


# -- the optimizers' compound elementwise ops (aclnnAddcmul, aclnnAddcdiv, aclnnLerp) --------------------------
# Each runs as the vector unit's ops in the tensors' dtype, one rounding per step (an assumption: the aclnn
# kernels' internal order is not in a public source; NUMERICS.md section 16).
def _scaled(k, y, value, dt):
    if value == 1:
        return y
    (y,) = k.op("Mul", y, _arg(value, dt))
    return y


@aten("aten.addcmul.default")
def addcmul(k, x, t1, t2, value=1):
    dt = torch.promote_types(torch.result_type(t1, t2), x.dtype)
    if dt not in EMULATED:
        raise Fallback(f"{dt} arithmetic")
    ct = _compound_dtype(k, dt)
    (p,) = k.op("Mul", _arg(t1, ct), _arg(t2, ct))
    (y,) = k.op("AddV2", _arg(x, ct), _scaled(k, p, value, ct))
    return _compound_out(k, y, dt)


@aten("aten.addcdiv.default")
def addcdiv(k, x, t1, t2, value=1):
    dt = torch.promote_types(torch.result_type(t1, t2), x.dtype)
    if dt not in EMULATED:
        raise Fallback(f"{dt} arithmetic")
    ct = _compound_dtype(k, dt)
    (q,) = k.op("RealDiv", _arg(t1, ct), _arg(t2, ct))
    (y,) = k.op("AddV2", _arg(x, ct), _scaled(k, q, value, ct))
    return _compound_out(k, y, dt)


@aten("aten.lerp.Scalar", "aten.lerp.Tensor")
def lerp(k, x, end, weight):
    """x + weight * (end - x)."""
    dt = torch.result_type(x, end)
    if dt not in EMULATED:
        raise Fallback(f"{dt} arithmetic")
    ct = _compound_dtype(k, dt)
    (d,) = k.op("Sub", _arg(end, ct), _arg(x, ct))
    (d,) = k.op("Mul", d, _arg(weight, ct))
    (y,) = k.op("AddV2", _arg(x, ct), d)
    return _compound_out(k, y, dt)


# -- more backward ops of autograd ----------------------------------------------------------------------------------
def grad_kernel(k, tf_type: str, *tensors):
    """One elementwise gradient kernel on tensors of one emulated dtype (in the kernel's argument order), its
    one output; mixed dtypes go to the AI CPU."""
    if not _emulated(*tensors) or len({t.dtype for t in tensors}) > 1:
        raise Fallback("mixed dtypes")
    (g,) = k.op(tf_type, *(to_numpy(t) for t in tensors))
    return _out(g)


@aten("aten.sigmoid_backward")
def sigmoid_backward(k, dy, y):
    """SigmoidGrad as the registry models it: TBE's float32 steps (y - y*y) * dy on the 910/910B, the 950's
    (dy * (1 - y)) * y under op_model ascendc, one rounding (section 8)."""
    return grad_kernel(k, "SigmoidGrad", y, dy)


@aten("aten.tanh_backward")
def tanh_backward(k, dy, y):
    """TanhGrad: dy * (1 - y^2) in float32, one rounding."""
    return grad_kernel(k, "TanhGrad", y, dy)


@aten("aten.max_pool2d_with_indices_backward")
def max_pool2d_backward(k, dy, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """MaxPoolGrad on NHWC (each window's gradient to its first maximum, float32 sums rounded once; section 8) for
    unpadded, undilated windows that tile the input without a ceil-mode edge; else the AI CPU."""
    kh, kw = (list(kernel_size) * 2)[:2]
    sh, sw = (list(stride or kernel_size) * 2)[:2]
    pads, dil = (list(padding) * 2)[:2], (list(dilation) * 2)[:2]
    h, w = x.shape[-2:]
    if (x.dim() != 4 or any(pads) or dil != [1, 1] or (ceil_mode and ((h - kh) % sh or (w - kw) % sw))
            or not _emulated(dy, x) or dy.dtype != x.dtype):
        raise Fallback("a padded, dilated or ceil-mode max pool")
    attrs = dict(ksize=[1, kh, kw, 1], strides=[1, sh, sw, 1], padding="VALID")
    xn = _nhwc_view(x)
    (y,) = k.op("MaxPool", xn, **attrs)
    (g,) = k.op("MaxPoolGrad", xn, y, _nhwc_view(dy), **attrs)
    return _nchw(g)

"""Running one aten lowering of :mod:`..aten` to record the registry ops it launches, as nodes of the plain graph.

The eager door runs a lowering on the script's tensors with a launcher ``k`` that computes each registry op on the
device. An exported program is a graph, so its aten calls become registry-op nodes instead: the loader calls the
same lowering on concrete example tensors with :class:`Tracer` as ``k``. Each array the lowering hands to
``k.op`` is known by where it came from: an input tensor of the aten call (the graph tensor it holds), the output
of an earlier ``k.op``, or a layout change of one of those (``np.transpose``, ``np.moveaxis``,
``np.ascontiguousarray``: a ``Transpose`` node); any other array is a constant of the call (``Const``). So the
lowering's own code decides the registry ops, their attributes and their order; nothing here knows an aten op.

A lowering may compute something from its input values in a way this does not follow (a torch op on the tensor,
a numpy function other than those): that value would be frozen into the graph as a constant of the example's
values. The loader traces every call twice, on two example inputs, and keeps the graph only when both traces
give the same nodes and constants (:func:`same_trace`); else the call runs as itself on the AI CPU.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import torch

from ....numerics.policy import NumericsPolicy
from ....ops import OPS
from ....ops.registry import OpContext
from .. import aten as _aten
from .. import aten_conv as _aten_conv
from .. import aten_fused as _aten_fused
from .. import convert as _convert
from ..options import NpuOptions


class Untraceable(Exception):
    """The lowering computed a value from its inputs in a way the graph cannot carry."""


class ExactCall(Exception):
    """The lowering lets torch compute the call itself (an exact op: a window maximum)."""


#: the ref of a value derived from a graph tensor by an untraced computation
TAINT = "<derived>"
_LOCK = threading.Lock()
#: the modules whose lowerings a trace runs: each one's conversions are swapped for the tracer's
_LOWERING_MODULES = (_aten, _aten_conv, _aten_fused)
_FLOATS = ("float16", "bfloat16", "float32")


class Sym(np.ndarray):
    """A concrete array that knows the graph tensor it holds (``ref``; None: a constant of the call)."""

    ref = None

    def __array_finalize__(self, obj):
        # a view or copy made by anything but the functions of _Numpy is derived, untraced
        self.ref = TAINT if getattr(obj, "ref", None) is not None else None


def sym(a, ref) -> Sym:
    s = np.asarray(a).view(Sym)
    s.ref = ref
    return s


class Tracer:
    """The ``k`` of a lowering while the loader traces it (the eager door's launcher, recording instead)."""

    def __init__(self, fx_name: str, transposes: dict, consts: frozenset | set = frozenset()):
        self.fx = fx_name
        self.options = NpuOptions()        # torch_npu's defaults: compatible_impl off (GELU as aclnnGelu)
        self.stash: dict = {}
        self.notes: list = []
        self.entries: list = []            # ("node", name, op, inputs, attrs, n) / ("const", name, value)
        self.tracked: dict = {}            # id(tensor) -> (tensor, ref)
        self.transposes = transposes       # graph tensor of a Transpose -> (its input, perm): global, read only
        self.local_t: dict = {}            # the same for this call's own Transposes
        self.consts = consts               # the graph tensors that are Const nodes (parameters, buffers)
        self.needs_fp32_cube = False       # the lowering asked for a kernel of the 910B and later
        self._n = 0

    # -- names and nodes -----------------------------------------------------------------------------
    def _name(self, op: str) -> str:
        self._n += 1
        return f"{self.fx}/{op}_{self._n}"

    def const(self, value) -> str:
        v = np.array(np.asarray(value))
        name = self._name("const")
        self.entries.append(("const", name, v))
        return f"{name}:0"

    def ref(self, a) -> str:
        r = getattr(a, "ref", None)
        if r == TAINT:
            raise Untraceable("an operand derived from an input by an untraced computation")
        return r if r is not None else self.const(a)

    def track(self, t: torch.Tensor, ref) -> None:
        self.tracked[id(t)] = (t, ref)

    def ref_of(self, t):
        hit = self.tracked.get(id(t))
        return hit[1] if hit is not None and hit[0] is t else None

    # -- the launcher's interface --------------------------------------------------------------------
    #: an exported inference program has no backward: its kernels keep no statistics for one
    keeps_backward_stats = False

    @property
    def numerics(self):
        """An exported program is traced without a device: the torch path's assumed parameters the lowerings read
        (fa_kv_block, compound_ops) take their defaults in the graph (NUMERICS.md section 18)."""
        return NumericsPolicy()

    def note(self, text: str) -> None:
        self.notes.append(text)

    def exact(self):
        raise ExactCall

    def host_copy(self, dst, src) -> None:
        raise Untraceable("an in-place update")

    def aclnn_model(self):
        return None     # the graph's kernels are the device's (the replay's op model)

    def bias_after_transposed_conv(self) -> bool:
        return False    # traced without a device: the graph's Conv2DTranspose takes the bias (all SoCs but the 950)

    def fa_available(self) -> bool:
        # FlashAttentionScore exists from the 910B on: the graph holds it, and the call itself for the replay to run
        # on the AI CPU of an earlier SoC, as the eager door does (NUMERICS.md section 18)
        self.needs_fp32_cube = True
        return True

    def cast(self, a, dtype: str):
        ref = self.ref(a)
        name = self._name("Cast")
        self.entries.append(("node", name, "Cast", [ref], {"DstT": dtype, "SrcT": np.asarray(a).dtype.name}, 1))
        (y,) = OPS["Cast"](np.asarray(a), ctx=OpContext(dtype="float32"), DstT=dtype)
        return sym(np.array(y), f"{name}:0")

    def op(self, tf_type: str, *arrays, family=None, op_model=None, **attrs) -> tuple:
        refs = [self.ref(a) for a in arrays]
        clean = {}
        for key, v in attrs.items():
            if isinstance(v, np.ndarray):
                if getattr(v, "ref", None) is not None:
                    raise Untraceable(f"attribute {key} computed from an input")
                v = np.array(np.asarray(v))
            clean[key] = v
        plain = [np.asarray(a) for a in arrays]
        dtype = next((a.dtype.name for a in plain if a.dtype.name in _FLOATS and a.ndim),
                     next((a.dtype.name for a in plain if a.dtype.name in _FLOATS), "float32"))
        clean.setdefault("T", dtype)        # (the fusion passes read a node's dtype from T, as TensorFlow's)
        try:
            with np.errstate(all="ignore"):
                outs = OPS[tf_type](*plain, ctx=OpContext(dtype=dtype), **clean)
        except NotImplementedError as e:
            raise _aten.Fallback(str(e)) from None
        name = self._name(tf_type)
        self.entries.append(("node", name, tf_type, refs, clean, len(outs)))
        return tuple(sym(np.array(o), f"{name}:{i}") for i, o in enumerate(outs))

    # -- the layout changes a lowering makes -----------------------------------------------------------
    def transpose(self, a, perm):
        perm = [int(p) for p in (perm if perm is not None else range(np.ndim(a))[::-1])]
        r = getattr(a, "ref", None)
        if r is None or r in self.consts:
            # a parameter's layout change is folded, as the graph engine folds it (an HWIO filter constant)
            return np.transpose(np.asarray(a), perm)
        if r == TAINT:
            raise Untraceable("a transpose of an untraced value")
        value = np.transpose(np.asarray(a), perm)
        src = self.local_t.get(r) or self.transposes.get(r)
        if src is not None and [src[1][p] for p in perm] == list(range(len(perm))):
            return sym(value, src[0])   # a transpose back: the tensor it came from (NHWC chains stay NHWC)
        if perm == list(range(len(perm))):
            return sym(value, r)
        p = self.const(np.asarray(perm, np.int32))
        name = self._name("Transpose")
        self.entries.append(("node", name, "Transpose", [r, p], {}, 1))
        self.local_t[f"{name}:0"] = (r, perm)
        return sym(value, f"{name}:0")


class _Numpy:
    """numpy for a lowering being traced: the layout functions become Transpose nodes of the tracer (in the
    tracing thread only: an eager run in another thread meanwhile sees numpy itself)."""

    def __init__(self, tracer: Tracer, owner: int):
        self._t = tracer
        self._owner = owner

    def __getattr__(self, name):
        return getattr(np, name)

    def _mine(self) -> bool:
        return threading.get_ident() == self._owner

    def transpose(self, a, axes=None):
        return self._t.transpose(a, axes) if self._mine() else np.transpose(a, axes)

    def moveaxis(self, a, source, destination):
        if not self._mine():
            return np.moveaxis(a, source, destination)
        n = np.ndim(a)
        s, d = int(source) % n, int(destination) % n
        order = [i for i in range(n) if i != s]
        order.insert(d, s)
        return self._t.transpose(a, order)

    def ascontiguousarray(self, a, dtype=None):
        if self._mine() and getattr(a, "ref", None) is not None and dtype is None:
            return sym(np.ascontiguousarray(np.asarray(a)), a.ref)
        return np.ascontiguousarray(a, dtype=dtype)

    def asarray(self, a, dtype=None):
        if self._mine() and getattr(a, "ref", None) is not None and (dtype is None or np.dtype(dtype) == a.dtype):
            return a
        return np.asarray(a, dtype=dtype)


@contextlib.contextmanager
def tracing(tracer: Tracer):
    """Run aten's lowerings against ``tracer``: its numpy and tensor conversions see the graph tensors. The lowering
    modules' functions are swapped for the duration (one trace at a time); calls from other threads go to the real
    ones."""
    real_to, real_from, real_np = _aten.to_numpy, _aten.from_numpy, _aten.np
    owner = threading.get_ident()

    def to_numpy(t):
        if threading.get_ident() != owner:
            return real_to(t)
        return sym(real_to(t), tracer.ref_of(t))

    def from_numpy(a, dtype=None):
        if threading.get_ident() != owner:
            return real_from(a, dtype)
        r = getattr(a, "ref", None)
        t = real_from(np.asarray(a))
        if r is not None and r != TAINT and dtype is not None and t.dtype != dtype:
            y = tracer.cast(sym(np.asarray(a), r), _convert.dtype_name(dtype))
            r, t = y.ref, t.to(dtype)
        elif dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        if r is not None:
            tracer.track(t, r)
        return t

    with _LOCK:
        fake = _Numpy(tracer, owner)
        for m in _LOWERING_MODULES:
            m.to_numpy, m.from_numpy, m.np = to_numpy, from_numpy, fake
        try:
            yield tracer
        finally:
            for m in _LOWERING_MODULES:
                m.to_numpy, m.from_numpy, m.np = real_to, real_from, real_np


def same_trace(a: list, b: list) -> bool:
    """Whether two traces of one call emitted the same nodes and constants (arrays compared bit for bit)."""
    if len(a) != len(b):
        return False
    return all(_same(x, y) for x, y in zip(a, b))


def _same(x, y) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
            return False
        return x.dtype == y.dtype and x.shape == y.shape and np.asarray(x).tobytes() == np.asarray(y).tobytes()
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    return type(x) is type(y) and x == y

"""The op registry: a plain dict from TF op type to an implementation, filled by a decorator.

Every implementation has one signature: inputs positional (numpy arrays), TF attributes
as keyword arguments, and a keyword ``ctx`` (:class:`OpContext`) carrying the compute
dtype and the numerics policy; it returns a tuple of arrays. Each op is callable alone,
without a graph::

    from ascend_emu.ops import run_op
    (y,) = run_op("Relu", x, ctx=OpContext(dtype="float16"))
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..numerics.policy import DEFAULT_CUBE_MODEL, CubeModel, compute_dtype
from ..errors import AscendEmuError
from ..graph.core import dtype_name as _dtype_name

#: op kinds, which decide the engine and the precision rule
CUBE, VECTOR, MOVE, HOST = "cube", "vector", "move", "host"


@dataclass(frozen=True)
class Source:
    """Where an AI Core op's numerics come from, stated where the op is registered (``@register(..., source=)``)
    and listed in NUMERICS.md's generated source table (``ascend_emu.ops.sources``).

    ``files``: the public sources it follows (``"repo path (symbol)"``: a CANN kernel, an asc-devkit page, a
    NUMERICS.md / ASCEND-FACTS.md section); ``assumed``: the registered parameters
    (:data:`ascend_emu.numerics.assumptions.ASSUMED` names) that vary what no source fixes; ``exact``: why the
    result needs no rounding at all (a selection among the inputs, a comparison), which leaves no kernel
    choice to source; ``note``: one line on what is sourced and what is not. An op needs files, an assumed
    parameter or an exactness reason (tested).
    """

    files: tuple = ()
    assumed: tuple = ()
    note: str = ""
    exact: str = ""

    def __post_init__(self):
        for name in ("files", "assumed"):
            v = getattr(self, name)
            object.__setattr__(self, name, (v,) if isinstance(v, str) else tuple(v))


@dataclass
class OpContext:
    """Compute dtype and numerics policy for one op invocation; collects its status bits.

    ``dtype`` is the compute dtype for float tensors (float16, bfloat16 or float32);
    ``cube_out`` the output dtype of cube ops (default: ``dtype``; float32 for
    ``force_fp32``/``cube_fp16in_fp32out``).
    """

    dtype: object = "float32"
    cube_out: object = None
    overflow_mode: str = "inf_nan"
    subnormals: str = "keep"
    cube_model: CubeModel = DEFAULT_CUBE_MODEL
    impl_mode: str = "high_precision"
    reduce_accumulate: str = "float32"
    op_model: str = "tbe_v220"
    status: int = 0
    #: a non-deterministic launch (:class:`ascend_emu.numerics.multicore.Launch`) for the op types of
    #: :data:`ascend_emu.ops.multicore.MULTICORE_OPS` when determinism is off; None: canonical order
    multicore: object = None
    #: the SoC flushes subnormals in the vector ops of ``numerics.policy.FTZ_OPS`` (``cce_ftz``)
    ftz: bool = False
    #: set by an op that a graph fusion pass of GE splits into nodes a real dump records one by one (AvgPoolFusionPass's
    #: Mul ``<name>_mul_layer``): ``(its own outputs, its own status, [(name suffix, TF type, outputs, status, why),
    #: ...])``; the op returns what the last added node gives (what the graph's consumers read) and ``status`` holds
    #: the bits of all of them (the replay records each node with its own)
    split: tuple | None = None

    def __post_init__(self):
        self.dtype = compute_dtype(self.dtype)
        self.cube_out = compute_dtype(self.cube_out) if self.cube_out is not None else self.dtype

    @classmethod
    def from_policy(cls, policy, dtype="float32", cube_out=None, multicore=None) -> "OpContext":
        """The context of one op on a device with :class:`~ascend_emu.numerics.policy.NumericsPolicy` ``policy``."""
        return cls(dtype=dtype, cube_out=cube_out, overflow_mode=policy.overflow_mode,
                   subnormals=policy.subnormals, cube_model=policy.cube_model, impl_mode=policy.impl_mode,
                   reduce_accumulate=policy.reduce_accumulate, op_model=policy.op_model, multicore=multicore,
                   ftz=policy.cce_ftz)

    @property
    def dtype_name(self) -> str:
        return _dtype_name(self.dtype)

    def record(self, status: int) -> None:
        self.status |= int(status)


@dataclass
class OpDef:
    tf_types: tuple
    fn: Callable
    kind: str
    params: frozenset = field(default_factory=frozenset)
    takes_all_attrs: bool = False
    #: the vector unit's elementwise op (:data:`ascend_emu.numerics.vector.VECTOR_OPS`) it runs, if any
    eltwise: str | None = None
    #: indices of the float inputs the CANN operator takes in float32 whatever its compute dtype (batch
    #: norm's scale, offset, mean and variance: the op protos declare them float32)
    fp32_inputs: frozenset = frozenset()
    #: computing in float32, it gives the same bits and status when handed an fp16 input as when handed
    #: that input's widening cast (it widens as it reads, or casts first itself), so the device may defer
    #: the cast it inserts in front of it
    reads_half: bool = False
    #: where its numerics come from (:class:`Source`); None: not stated (the source table's test lists these)
    source: Source | None = None

    def __call__(self, *inputs, ctx: OpContext, **attrs):
        if not self.takes_all_attrs:
            attrs = {k: v for k, v in attrs.items() if k in self.params}
        out = self.fn(*inputs, ctx=ctx, **attrs)
        return out if isinstance(out, tuple) else (out,)


OPS: dict[str, OpDef] = {}


def register(*tf_types: str, kind: str = VECTOR, eltwise: str | None = None, fp32_inputs=(), reads_half=False,
             source: Source | None = None):
    """Register ``fn`` as the implementation of the TF op types ``tf_types``.

    ``eltwise`` names the vector unit's elementwise op (``numerics.vector.vector``) the
    implementation runs on float tensors; tests check that every such op is registered.
    ``fp32_inputs``: the input indices the device hands over in float32 even when the op computes
    in a 16-bit dtype (they are never cast down). ``reads_half``: see :attr:`OpDef.reads_half`. ``source``:
    where the op's numerics come from (:class:`Source`: files, or the assumed parameters that vary them); a data
    movement op (``kind=MOVE``) needs none (it copies bits).
    """

    def deco(fn):
        sig = inspect.signature(fn)
        params = frozenset(p.name for p in sig.parameters.values()
                           if p.kind == p.KEYWORD_ONLY and p.name != "ctx")
        var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
        if source is not None and not isinstance(source, Source):
            raise TypeError(f"{tf_types}: source must be an ops.registry.Source")
        opdef = OpDef(tuple(tf_types), fn, kind, params, var_kw, eltwise, frozenset(fp32_inputs), bool(reads_half),
                      source)
        for t in tf_types:
            if t in OPS:
                raise RuntimeError(f"op {t} registered twice")
            OPS[t] = opdef
        return fn

    return deco


def get_op(tf_type: str) -> OpDef:
    try:
        return OPS[tf_type]
    except KeyError:
        raise AscendEmuError(f"op type {tf_type!r} has no emulated kernel; supported: {', '.join(sorted(OPS))}") from None


def run_op(tf_type: str, *inputs, ctx: OpContext | None = None, **attrs) -> tuple:
    """Run one registered op on numpy inputs (ctx defaults to float32 compute)."""
    ctx = ctx if ctx is not None else OpContext()
    return get_op(tf_type)(*[np.asarray(x) if not isinstance(x, np.ndarray) else x for x in inputs], ctx=ctx, **attrs)

"""The assumed parameters: every numerics choice no public source fixes, in one registry.

Each :class:`Assumed` names one parameter as the CLI spells it (in snake case: ``--cube-block-sum`` is
``cube_block_sum``), the values it takes, its default, the ops it acts on, and where it lives in
:class:`~ascend_emu.numerics.policy.NumericsPolicy` (so the ``Device`` keyword that sets it). ``fit`` and
``sensitivity`` (``ascend_emu.tools``) vary exactly these; NUMERICS.md's table of them is
:func:`markdown_table`'s output (``python -m ascend_emu.tools.assumptions_table`` rewrites it; a test checks
the two agree).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import AscendEmuError
from .multicore import MultiCoreModel
from .policy import (BLOCK_SUMS, COMPOUND_OPS, CONV_K_ORDERS, FA_KV_BLOCKS, FLOAT_STATUS_CLEARS, HF32_BITS,
                     HF32_FAMILY_ROUNDING, HF32_ROUNDINGS, HIF8_CAST_ROUNDINGS, IMPL_MODES, NORMALIZE, OP_MODELS,
                     REDUCE_ACCUMULATE, USE_FP16_OUTS)

#: the op families a parameter acts on (``fit`` reruns only the dumped ops of its family)
CUBE, CONV, HF32, HIF8, VECTOR, MULTICORE = "cube", "conv", "hf32", "hif8", "vector", "multicore"
#: the HF32 casts of one allow_hf32 family's operands
HF32_CONV, HF32_MATMUL = "hf32_conv", "hf32_matmul"
#: the torch eager path's kernels (``ae.torch.emulate``, ``torch-run``): a graph replay never reads these, so
#: ``fit`` and ``sensitivity`` of a graph model leave them as they are (NUMERICS.md section 16)
TORCH = "torch"


@dataclass(frozen=True)
class Assumed:
    """One assumed parameter.

    ``field``: its path in NumericsPolicy (``("cube_model", "block_sum")``); ``values``: every value it
    takes; ``candidates``: the values ``fit`` and ``sensitivity`` try (all of ``values`` unless the range is
    large); ``default``: None means the SoC's; ``family``: the ops it acts on (:data:`CUBE`, ...);
    ``group``: parameters that act together on the same ops and are fitted jointly; ``active``:
    ``(other parameter, value)`` when the parameter has an effect only under that value; ``section``:
    where NUMERICS.md describes the behaviour; ``soc_cell``: with ``default`` None, the SoC row's field that
    holds the default.
    """

    name: str
    field: tuple
    values: tuple
    default: object
    family: str
    acts_on: str
    section: str
    group: str
    candidates: tuple = ()
    active: tuple = ()
    soc_cell: str = ""

    @property
    def keyword(self) -> str:
        """The Device keyword that sets it (``cube_model=CubeModel(block_sum=...)``)."""
        if len(self.field) == 1:
            return f"{self.field[0]}="
        cls = {"cube_model": "CubeModel", "multicore": "MultiCoreModel"}[self.field[0]]
        return f"{self.field[0]}={cls}({self.field[1]}=...)"

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def tried(self) -> tuple:
        return self.candidates or self.values


ASSUMED = (
    Assumed("cube_block_sum", ("cube_model", "block_sum"), tuple(BLOCK_SUMS), "tree", CUBE,
            "cube ops (MatMul, BatchMatMul, Conv2D and their gradients, fused cube ops) on fp16/bf16/HF32 operands",
            "3", "cube"),
    Assumed("cube_extra_bits", ("cube_model", "extra_bits"), tuple(range(31)), 3, CUBE,
            "the cube ops", "3", "cube", candidates=(0, 1, 2, 3, 4, 6, 8),
            active=("cube_block_sum", "aligned")),
    Assumed("cube_normalize", ("cube_model", "normalize"), tuple(NORMALIZE), "truncate", CUBE,
            "the cube ops", "3", "cube", active=("cube_block_sum", "aligned")),
    Assumed("cube_conv_k_order", ("cube_model", "conv_k_order"), CONV_K_ORDERS, "hwc", CONV,
            "Conv2D (and fused Conv2D), but not a 1x1 or 16-channel filter over whole 16-channel blocks", "3",
            "cube"),
    Assumed("hf32_bits", ("hf32_bits",), HF32_BITS, None, HF32,
            "the HF32 casts of float32 cube operands (where allow_hf32 covers the op)", "13", "hf32",
            soc_cell="hf32_bits"),
    Assumed("hf32_conv_rounding", ("hf32_conv_rounding",), HF32_ROUNDINGS, HF32_FAMILY_ROUNDING["conv"], HF32_CONV,
            "the HF32 casts of float32 convolution operands (allow_hf32 conv; no --hf32-rounding override)", "13",
            "hf32"),
    Assumed("hf32_matmul_rounding", ("hf32_matmul_rounding",), HF32_ROUNDINGS, HF32_FAMILY_ROUNDING["matmul"],
            HF32_MATMUL, "the HF32 casts of float32 MatMul / BatchMatMul / Einsum operands (allow_hf32 matmul; no "
            "--hf32-rounding override)", "13", "hf32"),
    Assumed("hif8_rounding", ("hif8_rounding",), HIF8_CAST_ROUNDINGS, "round", HIF8,
            "the Casts to HiFloat8 of cube operands under cube_hif8 / mixed_hif8 (Ascend950)", "13", "cube"),
    Assumed("impl_mode", ("impl_mode",), IMPL_MODES, "high_precision", VECTOR,
            "the vector unit's transcendental ops (Exp, Log, Tanh, Gelu, Rsqrt, LayerNorm's rstd, ...)", "2",
            "vector"),
    Assumed("op_model", ("op_model",), OP_MODELS, None, VECTOR,
            "the ops with a published CANN kernel (Gelu, Tanh, Sigmoid, Exp, Rsqrt, Sin, Cos, Softmax, LogSoftmax, "
            "Softplus, Elu, Selu, SigmoidGrad, SoftplusGrad, SoftmaxCrossEntropyWithLogits, DivNoNan, MulNoNan, "
            "Cumsum, LayerNorm, ReduceMean, BatchNorm)", "2", "vector"),
    Assumed("reduce_accumulate", ("reduce_accumulate",), REDUCE_ACCUMULATE, "float32", VECTOR,
            "fp16 reductions (Sum, Mean, ...)", "2", "vector"),
    Assumed("multicore_reduce_min_chunk", ("multicore", "reduce_min_chunk"), (64, 128, 256, 512, 1024), 256,
            MULTICORE, "reductions split over cores, with determinism off (deterministic_level=0)", "11",
            "multicore"),
    Assumed("fa_kv_block", ("fa_kv_block",), FA_KV_BLOCKS, 128, TORCH,
            "torch: FlashAttentionScore (scaled_dot_product_attention on the 910B and later, npu_fusion_attention): "
            "the key block of its online softmax", "16", "torch"),
    Assumed("use_fp16_out", ("use_fp16_out",), USE_FP16_OUTS, "float16", TORCH,
            "torch: float32 mm / addmm / bmm / convolution whose operands cubeMathType casts to fp16 (USE_FP16; "
            "ALLOW_FP32_DOWN_PRECISION on the 910)", "16", "torch"),
    Assumed("compound_ops", ("compound_ops",), COMPOUND_OPS, "sequence", TORCH,
            "torch: silu, addcmul, addcdiv, lerp on fp16/bf16 tensors", "16", "torch"),
    Assumed("float_status_clear", ("float_status_clear",), FLOAT_STATUS_CLEARS, "update", TORCH,
            "torch, saturation SoCs (the 910): the float status register GradScaler's unscale reads, under "
            "upstream's torch.amp.GradScaler", "16", "torch"),
)
BY_NAME = {a.name: a for a in ASSUMED}


def assumed(name: str) -> Assumed:
    if name not in BY_NAME:
        raise AscendEmuError(f"unknown assumed parameter {name!r}; choose one of: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def value_of(policy, name: str):
    """Parameter ``name``'s value in NumericsPolicy ``policy``."""
    v = policy
    for part in assumed(name).field:
        v = getattr(v, part)
    return v


def current(policy) -> dict:
    """Every assumed parameter's value in ``policy``, by name."""
    return {a.name: value_of(policy, a.name) for a in ASSUMED}


def defaults(policy) -> dict:
    """Every assumed parameter's default on ``policy``'s SoC (``op_model``, ``hf32_bits``: the SoC's)."""
    return {a.name: (getattr(policy.chip, a.soc_cell or a.name) or None if a.default is None else a.default)
            for a in ASSUMED}


def with_params(policy, params: dict):
    """``policy`` with the assumed parameters ``params`` (name -> value) set; the others kept (a value equal to
    ``policy``'s own is kept as it is: ``hf32_bits`` None on a SoC without HF32)."""
    top: dict = {}
    sub: dict = {}
    for name, value in params.items():
        a = assumed(name)
        if value == value_of(policy, name):
            continue
        if value not in a.values:
            raise AscendEmuError(f"{name}: {value!r} is not one of {', '.join(map(str, a.values))}")
        if len(a.field) == 1:
            top[a.field[0]] = value
        else:
            sub.setdefault(a.field[0], {})[a.field[1]] = value
    for obj, fields in sub.items():
        top[obj] = replace(getattr(policy, obj), **fields)
    if "multicore" in top and not isinstance(top["multicore"], MultiCoreModel):
        raise AscendEmuError("multicore must be a MultiCoreModel")
    return replace(policy, **top)


def is_active(name: str, params: dict) -> bool:
    """Whether parameter ``name`` has any effect under the other values of ``params``."""
    a = assumed(name)
    return not a.active or params.get(a.active[0]) == a.active[1]


def markdown_table() -> str:
    """NUMERICS.md's table of the assumed parameters (generated: never edit the table by hand)."""
    rows = ["| parameter (CLI option) | values | default | acts on | Device keyword | section |",
            "|---|---|---|---|---|---|"]
    for a in ASSUMED:
        vals = (f"{a.values[0]}..{a.values[-1]}" if len(a.values) > 8 else ", ".join(map(str, a.values)))
        if a.candidates:
            vals += f" (fit and sensitivity try {', '.join(map(str, a.candidates))})"
        default = "the SoC's (section 13)" if a.default is None else str(a.default)
        acts = a.acts_on + (f"; only under {a.active[0]}={a.active[1]}" if a.active else "")
        rows.append(f"| `{a.name}` (`{a.option}`) | {vals} | {default} | {acts} | `{a.keyword}` | {a.section} |")
    return "\n".join(rows)

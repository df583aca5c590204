"""All numerics policy in one place.

Rounding modes, overflow modes, subnormal policy, status bits, the float formats, the
SoC table and the cube (matrix unit) accumulation model; :class:`NumericsPolicy` bundles
the choices one device makes. Kernels receive these as small integers from
``kernels/codes.py`` (the one place each code and limit is written); wrappers translate
and validate the user's strings here. See NUMERICS.md for the source of every behaviour.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np

from ..errors import AscendEmuError
from ..kernels import codes as _codes
from .multicore import DEFAULT_MULTICORE_MODEL, MultiCoreModel, check_run_seed, resolve_level

# Ascend C RoundMode: CAST_RINT, CAST_ROUND, CAST_FLOOR, CAST_CEIL, CAST_TRUNC, CAST_ODD.
ROUNDING_MODES = dict(_codes.ROUNDING)
# aclrtFloatOverflowMode: ACL_RT_OVERFLOW_MODE_SATURATION / ACL_RT_OVERFLOW_MODE_INFNAN.
OVERFLOW_MODES = dict(_codes.OVERFLOW)
SUBNORMAL_MODES = dict(_codes.SUBNORMALS)
# transcendental models of the vector unit (op_select_implmode; NUMERICS.md section 2)
IMPL_MODES = ("high_precision", "high_performance")
# accumulator of fp16 reductions (NUMERICS.md section 2)
REDUCE_ACCUMULATE = ("float32", "float16")
# whose kernels the ops with a published CANN implementation follow (NUMERICS.md section 2, "Sourced
# kernels"): the TBE kernels of a v100 SoC (Ascend910) or of a v200+ SoC (Ascend910B), the Ascend C
# kernels of ops-nn/ops-math (arch35), or the exact model (float64 inside, one rounding)
OP_MODELS = ("tbe_v100", "tbe_v220", "ascendc", "exact")

# AI Core overflow status bits, as precision_tool decodes them (ASCEND-FACTS.md section 4).
STATUS_BITS = {
    _codes.ST_NEG_MIN_INT: "negation of the most negative integer",
    _codes.ST_INT_OVERFLOW: "integer overflow",
    _codes.ST_FP_OVERFLOW: "floating-point compute overflow (Inf/NaN produced or propagated)",
    _codes.ST_NEG_TO_UNSIGNED: "negative float converted to unsigned",
    _codes.ST_CONVERSION_OVERFLOW: "FP32->FP16 (or int32->FP16) conversion overflow",
    _codes.ST_CUBE_OVERFLOW: "cube accumulation overflow",
}
STATUS_FP_OVERFLOW = _codes.ST_FP_OVERFLOW
STATUS_CONVERSION_OVERFLOW = _codes.ST_CONVERSION_OVERFLOW
STATUS_CUBE_OVERFLOW = _codes.ST_CUBE_OVERFLOW

float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)

#: compute dtypes of the emulated units, by name
COMPUTE_DTYPES = {"float16": float16, "bfloat16": bfloat16, "float32": float32}
#: 16-bit formats: (mantissa bits, exponent bias, largest finite value)
LOW_PRECISION = {
    "float16": (_codes.F16_MT, _codes.F16_BIAS, _codes.F16_MAX),
    "bfloat16": (_codes.BF16_MT, _codes.BF16_BIAS, _codes.BF16_MAX),
}
#: largest finite value of every float format a dump can hold
FORMAT_MAX = {
    "float16": _codes.F16_MAX,

    "bfloat16": _codes.BF16_MAX,
    "float32": float(_codes.FLT_MAX),
    "float64": float(np.finfo(np.float64).max),
}



@dataclass(frozen=True)
class LowFormat:
    """One of the 950's 8- and 4-bit formats (NUMERICS.md section 14; ASCEND-FACTS.md section 12): ``code``
    its index in ``kernels/codes.py``; ``max`` its largest finite value; ``emax`` the exponent of its largest
    binade (OCP MX's emax_elem); ``roundings`` the Ascend C RoundModes its conversions admit, ``rounding`` the
    default; ``keep_nan`` whether CTRL[50] (keep NaN under saturation) applies; ``dtype`` ml_dtypes' type of
    the same format, or None (codes only)."""

    name: str
    code: int
    bits: int
    max: float
    emax: int
    roundings: tuple
    rounding: str
    keep_nan: bool = False
    dtype: object = None
    mx_element: bool = False


_FP4_ROUNDINGS = ("rint", "round", "floor", "ceil", "trunc")
LOW_FORMATS = {f.name: f for f in (
    LowFormat("hifloat8", _codes.HIF8, 8, 2.0 ** 15, 15, ("round", "hybrid"), "round"),
    LowFormat("float8_e4m3fn", _codes.E4M3FN, 8, 448.0, 8, ("rint",), "rint", True, ml_dtypes.float8_e4m3fn, True),
    LowFormat("float8_e5m2", _codes.E5M2, 8, 57344.0, 15, ("rint",), "rint", True, ml_dtypes.float8_e5m2, True),
    LowFormat("float4_e2m1fn", _codes.E2M1, 4, 6.0, 2, _FP4_ROUNDINGS, "rint", dtype=ml_dtypes.float4_e2m1fn,
              mx_element=True),
    LowFormat("float4_e1m2", _codes.E1M2, 4, 1.75, 0, _FP4_ROUNDINGS, "rint", mx_element=True),
    LowFormat("float8_e8m0", _codes.E8M0, 8, 2.0 ** 127, 127, ("trunc", "ceil"), "trunc"),
)}
assert tuple(LOW_FORMATS) == _codes.LOW_FORMATS
#: the roundings of the low formats, by name: Ascend C's CAST_* codes and RoundMode::HYBRID
LOW_ROUNDING_MODES = {**{k: v for k, v in ROUNDING_MODES.items() if k != "odd"}, "hybrid": _codes.HYBRID}
#: cube operand pairs of the 950 (ASCEND-FACTS.md section 12): HiF8 x HiF8, and any pair of E4M3FN / E5M2
CUBE_LOW_PAIRS = (("hifloat8", "hifloat8"),) + tuple((a, b) for a in ("float8_e4m3fn", "float8_e5m2")
                                                     for b in ("float8_e4m3fn", "float8_e5m2"))
#: elements per E8M0 scale along K in MX block scaling (OCP MX v1.0; asc-devkit MmadMx)
MX_BLOCK = 32
FORMAT_MAX.update({n: f.max for n, f in LOW_FORMATS.items() if n != "float8_e8m0"})


@dataclass(frozen=True)
class SoC:
    """What the emulator knows of one Ascend SoC: one row of :data:`SOCS` (ASCEND-FACTS.md sections 4, 10 and 12;
    NUMERICS.md section 13 gives every cell's source).

    ``overflow_mode`` is the SoC's default and ``overflow_modes`` the ones it has (the 910 and the 310P
    saturate only); ``ai_cores`` is CANN platform_config's ``ai_core_cnt`` and ``vector_cores`` its
    ``vector_core_cnt`` (0: the vector units are inside the AI Cores, as on the 910), over which vector work
    splits (section 11); ``op_model`` the family of CANN kernels it runs (its TBE generation: the 910 is v100,
    the 910B v220, which TBE's ``after_v200()`` selects; NUMERICS.md section 2); ``cube_dtypes`` the operand
    types of its cube (``float32`` means fp32 operands through HF32, which the 910B, 910_93 and 950 have);
    ``supports_bf16`` whether its vector unit converts float32 to bf16 (GE refuses the bf16 modes otherwise);
    ``hf32`` the op families (``conv``, ``matmul``) whose float32 operands it rounds to HF32 by default;
    ``hf32_bits`` the stored significand bits of its HF32 (0: no HF32);
    ``assumed`` the cells no public source gives (each documented with the parameter that changes it).
    """

    name: str
    overflow_mode: str
    ai_cores: int
    supports_inf_nan: bool
    supports_bf16: bool
    op_model: str
    vector_cores: int = 0
    product: str = ""
    cube_dtypes: tuple = ("float16", "int8")
    hf32: tuple = ()
    hf32_bits: int = 0
    subnormals: str = "kept"
    aliases: tuple = ()
    assumed: tuple = ()
    #: HCCL's intra-server all-reduce algorithm (NUMERICS.md section 12)
    allreduce: str = "ring"
    #: whether the vector unit's Exp, Ln, Reciprocal, Sqrt, Rsqrt and Div flush subnormal inputs and results
    #: by default (the 950's ``--cce-ftz`` default; NUMERICS.md section 13)
    ftz: bool = False

    @property
    def overflow_modes(self) -> tuple:
        return ("saturation", "inf_nan") if self.supports_inf_nan else ("saturation",)

    @property
    def fp32_cube(self) -> bool:
        """Whether the cube takes float32 operands (as HF32); without it GE runs a float32 cube op elsewhere."""
        return "float32" in self.cube_dtypes

    @property
    def supports_hf32(self) -> bool:
        return self.fp32_cube

    @property
    def train_precision_default(self) -> str:
        """The TF adapter's training default: must_keep_origin_dtype where the platform reports a
        high-precision (float32) cube, else allow_fp32_to_fp16 (ASCEND-FACTS.md section 12)."""
        return "must_keep_origin_dtype" if self.fp32_cube else "allow_fp32_to_fp16"

    def row(self) -> dict:
        """The row as ``ascend-emu socs`` prints it (and its JSON)."""
        return {"soc": self.name, "aliases": list(self.aliases), "product": self.product,
                "cube_dtypes": list(self.cube_dtypes), "vector_bf16": self.supports_bf16,
                "overflow_modes": list(self.overflow_modes), "overflow_default": self.overflow_mode,
                "ai_cores": self.ai_cores, "vector_cores": self.vector_cores or None, "op_model": self.op_model,
                "subnormals": self.subnormals, "hf32": self.supports_hf32,
                "allow_hf32_default": ",".join(self.hf32) or "none", "hf32_bits": self.hf32_bits or None,
                "train_precision_default": self.train_precision_default, "allreduce": self.allreduce,
                "cce_ftz_default": self.ftz, "assumed": list(self.assumed)}


_A2_CUBE = ("float16", "bfloat16", "float32", "int8")
SOCS = {
    "Ascend910": SoC("Ascend910", "saturation", 32, False, False, "tbe_v100", product="Atlas 800 training (910, v100)"),
    "Ascend910B": SoC("Ascend910B", "inf_nan", 24, True, True, "tbe_v220", 48, product="Atlas A2 (910B, v220)",
                      cube_dtypes=_A2_CUBE, hf32=("conv",), hf32_bits=11, allreduce="mesh"),
    # A3's core counts are in no official public file: the A2's, which third-party listings also give
    "Ascend910_93": SoC("Ascend910_93", "inf_nan", 24, True, True, "tbe_v220", 48, product="Atlas A3 (910_93, v220)",
                        cube_dtypes=_A2_CUBE, hf32=("conv",), hf32_bits=11, allreduce="mesh",
                        assumed=("ai_cores", "vector_cores", "op_model", "allreduce")),
    "Ascend310P3": SoC("Ascend310P3", "saturation", 8, False, False, "tbe_v220", 7,
                       product="Atlas 300I/V Pro inference (310P, v200)", aliases=("Ascend310P",),
                       assumed=("op_model",)),
    # the 950's core counts are not published: the A2's; its default overflow mode is assumed inf_nan (the A2's);
    # its HF32 width 10 follows the ops-nn conv goldens, which its matmul golden contradicts (11): assumed
    "Ascend950": SoC("Ascend950", "inf_nan", 24, True, True, "ascendc", 48, product="Ascend 950 (arch 3510)",
                     cube_dtypes=("float32", "float16", "bfloat16", "hifloat8", "float8_e4m3fn", "float8_e5m2", "int8"),
                     hf32=("conv",), hf32_bits=10,
                     subnormals="no hardware subnormals: Exp, Ln, Reciprocal, Sqrt, Rsqrt, Div "
                                                "flush them (cce_ftz, default on)",
                     aliases=("Ascend950PR", "Ascend950DT"), allreduce="mesh", ftz=True,
                     assumed=("ai_cores", "vector_cores", "overflow_default", "allreduce", "hf32_bits")),
}
#: another name of a SoC -> its row's name
SOC_ALIASES = {a: s.name for s in SOCS.values() for a in s.aliases}


def soc_name(name) -> str:
    """The canonical name of SoC ``name`` (an alias such as ``Ascend310P`` gives its row's name)."""
    if isinstance(name, str):
        if name in SOCS:
            return name
        if name in SOC_ALIASES:
            return SOC_ALIASES[name]
    raise AscendEmuError(f"unknown soc {name!r}; choose one of: {', '.join(list(SOCS) + list(SOC_ALIASES))}")


def soc(name: str) -> SoC:
    """The :class:`SoC` called ``name`` (or one of its aliases); a clear error naming the known ones otherwise."""
    return SOCS[soc_name(name)]


#: the op families HF32 applies to (``allow_hf32``), by the TF types of their cube ops
HF32_FAMILIES = ("conv", "matmul")
#: HF32 rounding of float32 operands: SetHF32 transMode 0 is nearest even (rint), 1 nearest with ties away (round);
#: trunc (toward zero) is an older page's reading of mode 1, kept as a what-if (NUMERICS.md section 13)
HF32_ROUNDINGS = ("rint", "trunc", "round")
#: the stored significand bits HF32 may have: 11 (Ascend910B, Ascend910_93), 10 (the Ascend950's, assumed)
HF32_BITS = (10, 11)
#: the tie rule of each allow_hf32 family's kernels: MatMulV3 calls SetHF32(true, 1) (ties away); the Conv3D
#: kernel SetHF32TransMode(false) and the 950's Conv2DV2 / Conv3DV2 tilings transMode 0 (nearest even)
HF32_FAMILY_ROUNDING = {"conv": "rint", "matmul": "round"}
#: the vector unit's ops (numerics.vector names) whose INTRINSIC algorithm follows ``--cce-ftz`` on the
#: Ascend950: subnormal inputs read as zero and subnormal results flush to zero (ASCEND-FACTS.md section 12)
#: the roundings of the graph's Casts to HiFloat8 under cube_hif8 / mixed_hif8 (the 950's Cast admits these two)
HIF8_CAST_ROUNDINGS = ("round", "hybrid")
#: the torch eager path's assumed parameters (NUMERICS.md section 16; ``numerics/assumptions.py``):
#: FlashAttentionScore's key/value block along S2 (ops-transformer tiles S2 by the UB size: 128 and 256 appear)
FA_KV_BLOCKS = (64, 128, 256, 512)
#: the output of a float32 cube op whose operands cubeMathType casts to fp16 (USE_FP16; the 910's
#: ALLOW_FP32_DOWN_PRECISION): the cast operands' fp16 (then widened exactly), or the L0C's float32 directly
USE_FP16_OUTS = ("float16", "float32")
#: silu / addcmul / addcdiv / lerp on 16-bit tensors: the vector unit's ops in sequence in the tensors' dtype, one
#: rounding each, or widened to float32, the steps in float32 and one rounding to the dtype (as the Ascend C
#: kernels of SwiGlu and RmsNorm do)
COMPOUND_OPS = ("sequence", "float32")
#: where the 910's float status register is cleared under upstream's torch.amp.GradScaler: at its update (the next
#: forward's overflows count) or at the iteration's first scale() (after the forward, as torch_npu's scaler does)
FLOAT_STATUS_CLEARS = ("update", "scale")
FTZ_OPS = frozenset(("exp", "log", "reciprocal", "sqrt", "rsqrt", "realdiv"))


def hf32_families(value, chip: SoC) -> tuple:
    """``allow_hf32`` as a sorted tuple of families: None gives the SoC's default; ``"none"``, ``""`` or an empty
    collection none; else ``"conv"``, ``"matmul"`` or both (``"conv,matmul"`` or a collection)."""
    if value is None:
        return tuple(chip.hf32)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if parts == ["none"]:
            parts = []
    elif isinstance(value, (list, tuple, set, frozenset)):
        parts = list(value)
    else:
        raise AscendEmuError(f"allow_hf32 must be 'conv', 'matmul', 'conv,matmul' or 'none', got {value!r}")
    bad = [p for p in parts if p not in HF32_FAMILIES]
    if bad:
        raise AscendEmuError(f"allow_hf32: unknown op family {bad[0]!r}; use conv, matmul, conv,matmul or none")
    fams = tuple(f for f in HF32_FAMILIES if f in parts)
    if fams and not chip.supports_hf32:
        raise AscendEmuError(f"{chip.name} has no HF32 (its cube takes no float32 operands); drop allow_hf32 "
                             f"or choose a SoC with it ({', '.join(s.name for s in SOCS.values() if s.supports_hf32)})")
    return fams


def _choose(kind: str, value, table) -> int:
    try:
        return table[value]
    except (KeyError, TypeError):
        raise AscendEmuError(f"unknown {kind} {value!r}; choose one of: {', '.join(table)}") from None


def rounding_code(rounding: str) -> int:
    return _choose("rounding mode", rounding, ROUNDING_MODES)


def overflow_code(overflow_mode: str) -> int:
    return _choose("overflow_mode", overflow_mode, OVERFLOW_MODES)


def subnormal_code(subnormals: str) -> int:
    return _choose("subnormals mode", subnormals, SUBNORMAL_MODES)


def dtype_name(dtype) -> str:
    """Canonical name of a float dtype given as a string, numpy dtype or type."""
    if isinstance(dtype, str):
        if dtype in COMPUTE_DTYPES or dtype == "float64":
            return dtype
        aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
                   "float": "float32", "fp64": "float64", "double": "float64"}
        if dtype in aliases:
            return aliases[dtype]
        raise AscendEmuError(f"unknown dtype {dtype!r}; choose one of: float16, bfloat16, float32")
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):   # not seen yet, or unhashable
        pass
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise AscendEmuError(f"unknown dtype {dtype!r}; choose one of: float16, bfloat16, float32") from None
    try:
        _DTYPE_NAMES[dtype] = name
    except TypeError:
        pass
    return name


#: dtype (numpy dtype or type) -> its name: numpy computes a dtype's name in Python (~3 us a call; reductions and
#: cube ops ask for it on every call)
_DTYPE_NAMES: dict = {}


def compute_dtype(dtype) -> np.dtype:
    """Validate a compute dtype of the emulated units (float16, bfloat16, float32)."""
    name = dtype_name(dtype)
    if name not in COMPUTE_DTYPES:
        raise AscendEmuError(f"unsupported compute dtype {name!r}; choose one of: float16, bfloat16, float32")
    return COMPUTE_DTYPES[name]


BLOCK_SUMS = _codes.BLOCK_SUMS
NORMALIZE = _codes.NORMALIZE
CONV_K_ORDERS = ("hwc", "c1hwc0")


@dataclass(frozen=True)
class CubeModel:
    """How the cube unit accumulates a dot product of fp16/bf16 operands in fp32.

    The order and rounding inside the hardware's 16-term blocks are not published
    (ASCEND-FACTS.md section 2); this follows the block-FMA models fitted to NVIDIA
    tensor cores (Fasi et al. 2021; Khattak & Mikaitis). Products ``p_k = fl32(a_k b_k)``
    are exact for fp16 operands. The accumulator starts at the bias (or +0) and K is
    split into blocks of ``block_size`` terms, k = 0..K-1 in order; a partial last block
    is padded with +0 products. NUMERICS.md section 3 has the details.

    block_sum:
      ``"tree"``       (default) the block's products, padded with +0 to the next power
                       of two, are summed by a balanced binary tree of fp32 round-to-
                       nearest-even adders (adjacent pairs, level by level:
                       ((p0+p1)+(p2+p3)) + ((p4+p5)+(p6+p7)) ...), then the block total
                       is added to the fp32 accumulator (one more RNE rounding).
      ``"sequential"`` every product is added to the accumulator in k order, each
                       addition rounded to fp32 (block_size has no effect).
      ``"aligned"``    Khattak-Mikaitis block FMA: the accumulator and the block's
                       products are aligned to the largest exponent ``emax`` among them,
                       each magnitude is truncated to a multiple of
                       ``2**(emax - 23 - extra_bits)``, the terms are summed exactly, and the
                       sum is normalised to fp32 by ``normalize`` (``"truncate"``: toward
                       zero, or ``"rne"``); an exponent overflow gives Inf under both.

    conv_k_order (Conv2D, and Conv3D with its depth tap kd first; how a convolution's K = KH*KW*Cin terms are ordered):
      ``"hwc"``        (default) TensorFlow's im2col order (kh, kw, cin), blocks running across
                       taps when Cin is not a multiple of 16.
      ``"c1hwc0"``     the NC1HWC0 layout's order (cin // 16, kh, kw, cin % 16), input channels
                       zero-padded to a multiple of 16 (+0 products): every block is 16 channels
                       of one tap.
    """

    block_size: int = 16
    block_sum: str = "tree"
    extra_bits: int = 3
    normalize: str = "truncate"
    conv_k_order: str = "hwc"

    def __post_init__(self):
        if not isinstance(self.block_size, (int, np.integer)) or not 1 <= self.block_size <= 1024:
            raise AscendEmuError(f"CubeModel.block_size must be an integer in 1..1024, got {self.block_size!r}")
        if self.block_sum not in BLOCK_SUMS:
            raise AscendEmuError(f"unknown CubeModel.block_sum {self.block_sum!r}; choose one of: {', '.join(BLOCK_SUMS)}")
        if not isinstance(self.extra_bits, (int, np.integer)) or not 0 <= self.extra_bits <= 30:
            raise AscendEmuError(f"CubeModel.extra_bits must be an integer in 0..30, got {self.extra_bits!r}")
        if self.normalize not in NORMALIZE:
            raise AscendEmuError(f"unknown CubeModel.normalize {self.normalize!r}; choose one of: {', '.join(NORMALIZE)}")
        if self.conv_k_order not in CONV_K_ORDERS:
            raise AscendEmuError(f"unknown CubeModel.conv_k_order {self.conv_k_order!r}; "
                                 f"choose one of: {', '.join(CONV_K_ORDERS)}")

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT_CUBE_MODEL = CubeModel()


@dataclass(frozen=True)
class NumericsPolicy:
    """Every numerics choice of one emulated device, validated once.

    Parameters
    ----------
    soc : {"Ascend910", "Ascend910B", "Ascend910_93", "Ascend310P3", "Ascend950"}
        A row of :data:`SOCS` (or an alias: Ascend310P, Ascend950PR, Ascend950DT); kept by its row's name.
    overflow_mode : {"saturation", "inf_nan"} or None
        None takes the SoC's default (Ascend910, Ascend310P3: saturation; the others: inf_nan). The other
        mode is accepted on every SoC as a what-if, also where the hardware has only saturation.
    subnormals : {"keep", "flush"}
    impl_mode : {"high_precision", "high_performance"}
        Transcendental implementation model of the vector unit (NUMERICS.md section 2).
    reduce_accumulate : {"float32", "float16"}
        Accumulator of fp16 reductions.
    op_model : {"tbe_v100", "tbe_v220", "ascendc", "exact"} or None
        Whose kernels the ops with a published CANN source follow (Gelu, Tanh, Sigmoid, Exp, Rsqrt,
        Softmax, LayerNorm, ReduceMean, BatchNorm); None takes the SoC's TBE generation
        (Ascend910: tbe_v100; Ascend910B: tbe_v220); "exact" is the float64 model.
    cube_model : CubeModel
        Accumulation model of the cube unit (NUMERICS.md section 3).
    deterministic : bool or None
        CANN's ``deterministic``; None follows ``deterministic_level`` (both None: on, level 1: unlike
        CANN, whose default is off, so that the same inputs and configuration always give the same bits).
    deterministic_level : {0, 1, 2} or None
        0: the ops of ``ascend_emu.ops.multicore.MULTICORE_OPS`` combine their per-core partial
        results in an order drawn from ``run_seed`` (NUMERICS.md section 11); 1: one fixed order;
        2: also independent of the batch composition. Resolved to an int here.
    run_seed : int
        Seeds the arrival orders of level 0 (default 0: the same run twice gives the same bits).
    multicore : MultiCoreModel
        When ops split over cores (thresholds, ``aicore_num``).
    allow_hf32 : str, collection or None
        The op families whose float32 cube operands are rounded to HF32 (``"conv"``, ``"matmul"``,
        ``"conv,matmul"``, ``"none"``); None takes the SoC's default (conv on Ascend910B, Ascend910_93 and
        Ascend950; none elsewhere). Resolved to a tuple here; HF32 on a SoC without it is an error.
    hf32_bits : {10, 11} or None
        The stored significand bits of HF32; None takes the SoC's (11 on Ascend910B and Ascend910_93, 10 on
        Ascend950, an assumption); None on a SoC without HF32.
    hf32_conv_rounding, hf32_matmul_rounding : {"rint", "trunc", "round"}
        The HF32 tie rule of each family's kernels: convolutions ``rint`` (transMode 0, nearest even), matmul
        ``round`` (transMode 1, ties away from zero); ``trunc`` (toward zero) is a what-if.
    hf32_rounding : {"rint", "trunc", "round"} or None
        An override of both families' tie rules (None: each family's own).
    cce_ftz : bool or None
        Whether the vector unit's Exp, Ln, Reciprocal, Sqrt, Rsqrt and Div (:data:`FTZ_OPS`) read subnormal
        inputs as zero and flush subnormal results (the 950's ``--cce-ftz``; False: its ``*_FTZ_FALSE``
        kernels). None takes the SoC's default (on for Ascend950, off elsewhere; on elsewhere is a what-if).
    hif8_rounding : {"round", "hybrid"}
        The rounding of the Casts to HiFloat8 that cube_hif8 / mixed_hif8 insert: half away from zero (the
        default, an assumption) or the 950's hybrid rounding.
    fa_kv_block, use_fp16_out, compound_ops, float_status_clear
        The torch eager path's assumptions (``ae.torch.emulate``; NUMERICS.md section 16): FlashAttentionScore's
        key block (128), a USE_FP16 cube op's output dtype (``float16``), how silu / addcmul / addcdiv / lerp
        round (``sequence``), and where the 910's float status register is cleared under upstream's GradScaler
        (``update``).
    """

    soc: str = "Ascend910"
    overflow_mode: str | None = None
    subnormals: str = "keep"
    impl_mode: str = "high_precision"
    reduce_accumulate: str = "float32"
    cube_model: CubeModel = field(default_factory=CubeModel)
    op_model: str | None = None
    deterministic: bool | None = None
    deterministic_level: int | None = None
    run_seed: int = 0
    multicore: MultiCoreModel = field(default_factory=MultiCoreModel)
    allow_hf32: object = None
    hf32_rounding: str | None = None
    cce_ftz: bool | None = None
    hif8_rounding: str = "round"
    cube_mx: str | None = None
    hf32_bits: int | None = None
    hf32_conv_rounding: str = HF32_FAMILY_ROUNDING["conv"]
    hf32_matmul_rounding: str = HF32_FAMILY_ROUNDING["matmul"]
    fa_kv_block: int = 128
    use_fp16_out: str = "float16"
    compound_ops: str = "sequence"
    float_status_clear: str = "update"

    def __post_init__(self):
        chip = soc(self.soc)
        for name, values in (("fa_kv_block", FA_KV_BLOCKS), ("use_fp16_out", USE_FP16_OUTS),
                             ("compound_ops", COMPOUND_OPS), ("float_status_clear", FLOAT_STATUS_CLEARS)):
            value = getattr(self, name)
            if value not in values or isinstance(value, bool):
                raise AscendEmuError(f"unknown {name} {value!r}; choose one of: {', '.join(map(str, values))}")
        object.__setattr__(self, "soc", chip.name)
        if self.cce_ftz is None:
            object.__setattr__(self, "cce_ftz", chip.ftz)
        if not isinstance(self.cce_ftz, bool):
            raise AscendEmuError(f"cce_ftz must be True, False or None (the SoC's default), not {self.cce_ftz!r}")
        if self.cube_mx is not None and not (self.cube_mx in LOW_FORMATS and LOW_FORMATS[self.cube_mx].mx_element):
            raise AscendEmuError(f"unknown cube_mx {self.cube_mx!r}; choose an MX element format: "
                                 f"{', '.join(n for n, f in LOW_FORMATS.items() if f.mx_element)}")
        if self.cube_mx is not None and "float8_e4m3fn" not in chip.cube_dtypes:
            raise AscendEmuError(f"cube_mx {self.cube_mx} needs a cube with MX block scaling, which {chip.name} lacks; "
                                 f"choose --soc {', '.join(n for n, c in SOCS.items() if 'float8_e4m3fn' in c.cube_dtypes)}")
        if self.hif8_rounding not in HIF8_CAST_ROUNDINGS:
            raise AscendEmuError(f"unknown hif8_rounding {self.hif8_rounding!r}; choose one of: "
                                 f"{', '.join(HIF8_CAST_ROUNDINGS)}")
        object.__setattr__(self, "allow_hf32", hf32_families(self.allow_hf32, chip))
        for name in ("hf32_rounding", "hf32_conv_rounding", "hf32_matmul_rounding"):
            value = getattr(self, name)
            if value not in HF32_ROUNDINGS and not (value is None and name == "hf32_rounding"):
                raise AscendEmuError(f"unknown {name} {value!r}; choose one of: {', '.join(HF32_ROUNDINGS)}")
        if self.hf32_bits is None:
            object.__setattr__(self, "hf32_bits", chip.hf32_bits or None)
        elif not chip.supports_hf32:
            raise AscendEmuError(f"hf32_bits: {chip.name} has no HF32; drop hf32_bits or choose a SoC with it "
                                 f"({', '.join(s.name for s in SOCS.values() if s.supports_hf32)})")
        elif self.hf32_bits not in HF32_BITS or isinstance(self.hf32_bits, bool):
            raise AscendEmuError(f"unknown hf32_bits {self.hf32_bits!r}; choose the stored significand bits "
                                 f"{' or '.join(map(str, HF32_BITS))}")
        object.__setattr__(self, "deterministic_level", resolve_level(self.deterministic, self.deterministic_level))
        object.__setattr__(self, "deterministic", self.deterministic_level > 0)
        object.__setattr__(self, "run_seed", check_run_seed(self.run_seed))
        if self.multicore is None:
            object.__setattr__(self, "multicore", DEFAULT_MULTICORE_MODEL)
        if not isinstance(self.multicore, MultiCoreModel):
            raise AscendEmuError("multicore must be an ascend_emu.MultiCoreModel")
        if self.overflow_mode is None:
            object.__setattr__(self, "overflow_mode", chip.overflow_mode)
        if self.op_model is None:
            object.__setattr__(self, "op_model", chip.op_model)
        if self.op_model not in OP_MODELS:
            raise AscendEmuError(f"unknown op_model {self.op_model!r}; choose one of: {', '.join(OP_MODELS)}")
        overflow_code(self.overflow_mode)
        subnormal_code(self.subnormals)
        if self.impl_mode not in IMPL_MODES:
            raise AscendEmuError(f"unknown impl_mode {self.impl_mode!r}; choose one of: {', '.join(IMPL_MODES)}")
        if self.reduce_accumulate not in REDUCE_ACCUMULATE:
            raise AscendEmuError(f"unknown reduce_accumulate {self.reduce_accumulate!r}; "
                                 f"choose one of: {', '.join(REDUCE_ACCUMULATE)}")
        if self.cube_model is None:
            object.__setattr__(self, "cube_model", DEFAULT_CUBE_MODEL)
        if not isinstance(self.cube_model, CubeModel):
            raise AscendEmuError("cube_model must be an ascend_emu.CubeModel")

    @property
    def chip(self) -> SoC:
        return SOCS[self.soc]

    def hf32_rounding_of(self, family: str) -> str:
        """The HF32 tie rule of op family ``family`` (``conv``, ``matmul``): the ``hf32_rounding`` override, else
        the family's own."""
        if self.hf32_rounding is not None:
            return self.hf32_rounding
        return self.hf32_matmul_rounding if family == "matmul" else self.hf32_conv_rounding

    @property
    def cores(self) -> tuple[int, int]:
        """(cube cores, vector cores) a split op uses: ``multicore.aicore_num`` or the SoC's counts."""
        chip = self.chip
        cube = chip.ai_cores
        vec = chip.vector_cores or chip.ai_cores
        n = self.multicore.aicore_num
        if n is not None:
            # ATC --aicore_num limits the AI Cores; a SoC with split cores keeps its vector:cube ratio
            vec = max(1, n * vec // cube)
            cube = n
        return cube, vec

    def to_dict(self) -> dict:
        return {"overflow_mode": self.overflow_mode, "soc": self.soc, "cube_model": self.cube_model.to_dict(),
                "subnormals": self.subnormals, "impl_mode": self.impl_mode,
                "reduce_accumulate": self.reduce_accumulate, "op_model": self.op_model,
                "deterministic": self.deterministic, "deterministic_level": self.deterministic_level,
                "run_seed": self.run_seed, "multicore": self.multicore.to_dict(),
                "allow_hf32": ",".join(self.allow_hf32) or "none", "hf32_rounding": self.hf32_rounding,
                "hf32_bits": self.hf32_bits, "hf32_conv_rounding": self.hf32_conv_rounding,
                "hf32_matmul_rounding": self.hf32_matmul_rounding,
                "cce_ftz": self.cce_ftz, "hif8_rounding": self.hif8_rounding,
                "cube_mx": self.cube_mx, "fa_kv_block": self.fa_kv_block, "use_fp16_out": self.use_fp16_out,
                "compound_ops": self.compound_ops, "float_status_clear": self.float_status_clear}

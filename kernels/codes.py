"""Integer codes and format constants shared by the kernels and :mod:`ascend_emu.numerics.policy`.

Kernels take small integers, never policy objects; this is the one place each code and
limit is written. ``ascend_emu.numerics.policy`` builds its user-facing tables from it.
"""
from __future__ import annotations

import numpy as np

# Ascend C RoundMode: CAST_RINT, CAST_ROUND, CAST_FLOOR, CAST_CEIL, CAST_TRUNC, CAST_ODD
RINT, ROUND, FLOOR, CEIL, TRUNC, ODD = 0, 1, 2, 3, 4, 5
ROUNDING = {"rint": RINT, "round": ROUND, "floor": FLOOR, "ceil": CEIL, "trunc": TRUNC, "odd": ODD}
# aclrtFloatOverflowMode: ACL_RT_OVERFLOW_MODE_INFNAN / ACL_RT_OVERFLOW_MODE_SATURATION
INF_NAN, SATURATION = 0, 1
OVERFLOW = {"inf_nan": INF_NAN, "saturation": SATURATION}
# subnormal results (and inputs) kept or flushed to signed zero
KEEP, FLUSH = 0, 1
SUBNORMALS = {"keep": KEEP, "flush": FLUSH}

# AI Core overflow status bits, as precision_tool decodes them (ASCEND-FACTS.md section 4)
ST_NEG_MIN_INT = 0x8
ST_INT_OVERFLOW = 0x10
ST_FP_OVERFLOW = 0x20
ST_NEG_TO_UNSIGNED = 0x80
ST_CONVERSION_OVERFLOW = 0x100
ST_CUBE_OVERFLOW = 0x400

# (mantissa bits, exponent bias, exponent bits) of the float formats
F16_MT, F16_BIAS, F16_EB = 10, 15, 5
BF16_MT, BF16_BIAS, BF16_EB = 7, 127, 8
F32_MT, F32_BIAS, F32_EB = 23, 127, 8
#: largest finite values
F16_MAX = 65504.0
BF16_MAX = 3.3895313892515355e38
FLT_MAX = np.float32(3.4028234663852886e38)

# cube accumulation model (CubeModel.block_sum / .normalize, by index)
TREE, SEQUENTIAL, ALIGNED = 0, 1, 2
BLOCK_SUMS = ("tree", "sequential", "aligned")
NORM_RNE, NORM_TRUNCATE = 0, 1
NORMALIZE = ("rne", "truncate")

# vector unit op codes (kernels/vector.py, kernels/sourced.py; ascend_emu.numerics.vector maps names to them)
# Unary op codes. Codes below RSQRT are computed in float32 (exact, or one IEEE
# float32 operation); RSQRT and above are transcendental: float64 (high_precision)
# or float32 libm (high_performance), then one rounding.
NEG, ABS, SQUARE, SQRT, RECIPROCAL, RELU, RELU6, LEAKY_RELU = 0, 1, 2, 3, 4, 5, 6, 7
RSQRT, EXP, EXPM1, LOG, LOG1P, TANH, SIGMOID, ERF, ERFC, SOFTPLUS, SOFTSIGN, GELU, GELU_TANH = range(8, 21)
FIRST_TRANSCENDENTAL = RSQRT
# The sourced CANN kernels (NUMERICS.md section 2, "Sourced kernels"): every instruction of the
# kernel is one float32 step (16-bit inputs widened exactly, the result cast back with CAST_RINT);
# SIGMOID_TBE on 16-bit data runs its steps in the 16-bit format itself.
(GELU_TBE_V100, GELU_TBE_V220, GELU_ASCENDC, TANH_TBE, TANH_ASCENDC, SIGMOID_TBE, SIGMOID_ASCENDC, EXP_F32,
 RSQRT_F32) = range(21, 30)
FIRST_STEPPED = GELU_TBE_V100
# Binary op codes; POW is transcendental, SQUARED_DIFFERENCE two roundings (sub, then square).
ADD, SUB, MUL, REALDIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE, POW = range(8)
# Steps of a fused float32 chain (kernels/chain.py): the binary codes above (ADD, SUB, MUL, REALDIV), then
# the two exact selections, the rounding of the running value to fp16 (and back, exactly)
CHAIN_RELU, CHAIN_RELU6, CHAIN_ROUND16 = 8, 9, 10
# Unary steps of a float32 chain with several outputs (kernels/chain32.py: optimizer updates), one IEEE float32
# operation each, after the binary codes above
CHAIN_NEG, CHAIN_SQUARE, CHAIN_SQRT = 11, 12, 13

# The 950's 8- and 4-bit formats (kernels/lowfloat.py; NUMERICS.md section 14), by index into LOW_FORMATS
HIF8, E4M3FN, E5M2, E2M1, E1M2, E8M0 = range(6)
LOW_FORMATS = ("hifloat8", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "float4_e1m2", "float8_e8m0")
# Ascend C RoundMode::HYBRID (float/half -> hifloat8 only); the other low-format roundings are ROUNDING's codes
HYBRID = 6
# IEEE-like low formats: (mantissa bits, exponent bias, largest finite code's magnitude, code of Inf or -1,
# code of NaN or -1), by format index (HIF8 and E8M0 are not IEEE-like: their rows are unused)
LOW_IEEE = ((0, 0, 0, -1, -1), (3, 7, 0x7E, -1, 0x7F), (2, 15, 0x7B, 0x7C, 0x7F), (1, 1, 0x7, -1, -1),
            (2, 1, 0x7, -1, -1), (0, 127, 0xFE, -1, 0xFF))
# HiFloat8 special codes (asc-devkit kernel_type_conversion_utils.h): +-Inf, +-max (2^15), NaN
HIF8_INF, HIF8_MAX_CODE, HIF8_NAN = 0x6F, 0x6E, 0x80

# Sin / Cos (kernels/trig.py; NUMERICS.md section 2, "Sourced kernels"): the TBE kernels step by step
# (Ascend910 / Ascend910B), or the float64 sin/cos rounded once to float32 (the exact model, and the
# Ascend C kernel's Simt::Sin / Simt::Cos, whose algorithm is not published)
SIN_TBE, COS_TBE, SIN_F64, COS_F64 = range(4)

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

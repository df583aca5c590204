"""Cube unit (matrix engine) kernels: fp32 accumulation of dot products in K-blocks.

An output element is ``acc = bias[j]`` (L0C initialised with the bias, +0 without one)
followed by one accumulation step per K-block of ``block_size`` products
``p_k = fl32(a[i, k] * b[k, j])`` (exact for fp16 operands), in k order. The step is
chosen by the block model (codes mirror ``ascend_emu.numerics.policy.BLOCK_SUMS`` / ``NORMALIZE``):

- TREE: the block's products, padded with +0 to the next power of two, are summed by a
  balanced binary tree of fp32 RNE adders (level by level, adjacent pairs), then
  ``acc = fl32(acc + total)``.
- SEQUENTIAL: ``acc = fl32(acc + p_k)`` for every real k (no padding terms).
- ALIGNED: Khattak-Mikaitis block FMA over {acc, p_k}: align to the largest exponent,
  truncate each magnitude below ``2**(emax - 23 - extra_bits)``, add exactly, normalise to
  fp32 by truncation or RNE (see :func:`aligned_block`).

All operands reach the kernels as float32 arrays holding the (exactly converted) operand
values; A is (batch, M, Kp) and B is (batch, Kp, N) with K padded by zeros to a multiple of
16, so padded products are +0 (the default kernel takes B packed by :func:`pack_b`).
Vectorising across output columns j is legal: the order of additions is fixed per output
element, never across elements. Loops over j use unsigned indices: Numba's wraparound test
for negative signed indices otherwise stops LLVM from vectorising them.

The kernels, by idea:

- :mod:`.tree16`: the default model (block 16, tree): B packed into slabs, an explicit
  LLVM micro-kernel over 2 rows x 32 columns, work items of MC x NC;
- :mod:`.implicit`: the same product with the operands read in place at offsets from tables (the
  convolutions' implicit GEMMs);
- :mod:`.blocked`: every model (block size, TREE / SEQUENTIAL / ALIGNED step), one generic
  block step per K block;
- :mod:`.conv`: convolution lowered to the matmul (im2col in three layouts) and the direct
  depthwise tree16 kernel;
- :mod:`.operands`: operands rounded to (or widened from) the operand dtype;
- :mod:`.fixpipe`: the float32 accumulator to the output dtype (Fixpipe, status 0x400).
"""
from __future__ import annotations

from ..codes import (ALIGNED, FLT_MAX, INF_NAN, NORM_RNE, NORM_TRUNCATE, RINT, SATURATION,  # noqa: F401
                     SEQUENTIAL, ST_CUBE_OVERFLOW, TREE)
from .tree16 import (LANES, MC, NC, SLABS, TILE, empty_slabs, matmul_tree16, matmul_tree16_small,  # noqa: F401
                     pack_b, row_block, slab_shape, slab_width, tree16)
from .implicit import GATHER_WIDTHS, matmul_tree16_gather, matmul_tree16_tab  # noqa: F401
from .blocked import NCG, aligned_block, matmul_blocked, tree_leaves  # noqa: F401
from .conv import (depthwise_tree16, dw_im2col_t, has_nan, im2col, im2col_packed, im2col_t, pixel_offsets,  # noqa: F401
                   widen_padded)
from .conv import dx_class_packed, patch_rows_packed, planar_padded, planar_widened, rows_transposed  # noqa: F401
from .operands import (pack_b16, pack_bt, round_f32_operands, round_f64_operands, widen_operands,  # noqa: F401
                       widen_pack_f16)
from .fixpipe import finish_f32, finish_grid, finish_grid_rows, finish_to_16, to16  # noqa: F401

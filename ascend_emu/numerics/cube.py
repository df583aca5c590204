"""The cube unit: matmul, batch matmul, conv2d and depthwise conv2d with Ascend numerics.

Operands are rounded to the operand dtype (fp16 by default, round-to-nearest-even as a
Cast would), multiplied exactly, accumulated in fp32 in K-blocks as ``CubeModel`` says,
starting from the bias (L0C initialised with it) or +0, and the fp32 accumulator is
converted to the output dtype by the Fixpipe stage. Every function returns
``(array, status)`` where ``status`` holds the AI Core status bits raised (0x100
conversion overflow, 0x20 Inf/NaN met by a conversion, 0x400 accumulator not finite).
See NUMERICS.md section 3 for the model and what is known versus assumed.

The pipeline the ops share is :mod:`.cube_core`; the convolutions live in :mod:`.conv` (forward) and
:mod:`.conv_grad` (the two gradients of conv2d) and are importable from here too.
"""
from __future__ import annotations

import numpy as np

from .cube_core import (_KW_DOC, Epilogue, _Policy, _acc, _batched, _numeric, _operand_values, _padded_input,  # noqa: F401
                        _policy, _split_acc)
from .conv import _conv_geometry, _hw, _pads, conv2d, depthwise_conv2d  # noqa: F401
from .conv_grad import conv2d_backprop_filter, conv2d_backprop_input, zero_inserted  # noqa: F401
from ..errors import AscendEmuError
from . import memo as _memo


def _contiguous_t(b: np.ndarray, transposed):
    """``transposed()`` (a transposed view of ``b``); for a frozen ``b`` (a loaded weight) its contiguous copy,
    made once (numerics/memo.py): the operands' rounding reads it contiguous, and numpy's copy of a transposed
    16-bit (1000, 1024) weight took 9 ms of a 10 ms M = 1 product each call (a classifier's Gemm with transB)."""
    if not _memo.frozen(b):
        return transposed()
    return _memo.memo(b, ("transposed last two axes",), lambda: np.ascontiguousarray(transposed()))


def _stacks(b: np.ndarray, K: int, N: int) -> np.ndarray:
    """b (..., K, N) as (stacks, K, N) where that is a view; else b itself (a transposed view, e.g. an Einsum's
    operand: the cube packs a 16-bit one from its strides instead of copying it first, cube_core._batched)."""
    v = reshaped_view(b, (-1, K, N))
    return b if v is None else v


def reshaped_view(a: np.ndarray, shape):
    """``a`` reshaped to ``shape`` when that is a view of it, else None (numpy's ``reshape(copy=False)`` is 2.1's;
    the project supports numpy from 1.26)."""
    v = a.reshape(shape)
    return v if v.size == 0 or np.may_share_memory(v, a) else None


def matmul(a, b, transpose_a=False, transpose_b=False, bias=None, operand_dtype="float16", out_dtype="float16",
           overflow_mode="inf_nan", subnormals="keep", model=None, multicore=None, samples=None, epilogue=None):
    """Matrix product on the emulated cube unit (TF MatMul).

    Parameters
    ----------
    a, b : array_like, 2-D
        ``op(a)`` is (M, K) and ``op(b)`` is (K, N), where op transposes when asked.
    transpose_a, transpose_b : bool
        Use the transpose of ``a`` / ``b``.
    """
    pol = _policy(operand_dtype, out_dtype, overflow_mode, subnormals, model)
    a = _numeric(a, "a")
    b = _numeric(b, "b")
    if a.ndim != 2 or b.ndim != 2:
        raise AscendEmuError(f"matmul needs 2-D operands, got a of shape {a.shape} and b of shape {b.shape}; "
                             "use batch_matmul for stacks of matrices")
    at = a.T if transpose_a else a
    bt = _contiguous_t(b, lambda: b.T) if transpose_b else b
    if at.shape[1] != bt.shape[0]:
        raise AscendEmuError(f"matmul: inner dimensions differ: a of shape {a.shape} (transpose_a={bool(transpose_a)}) "
                             f"and b of shape {b.shape} (transpose_b={bool(transpose_b)})")
    zero = np.zeros(1, dtype=np.int64)
    return _batched(at[None], bt[None], zero, zero, bias, pol, (at.shape[0], bt.shape[1]), multicore, samples,
                    epilogue, b_const=bt)


def batch_matmul(a, b, adj_x=False, adj_y=False, bias=None, operand_dtype="float16", out_dtype="float16",
                 overflow_mode="inf_nan", subnormals="keep", model=None, multicore=None, epilogue=None):
    """Batched matrix product on the emulated cube unit (TF BatchMatMulV2, broadcasting batch dims).

    Parameters
    ----------
    a, b : array_like of rank >= 2
        ``(..., M, K)`` and ``(..., K, N)`` after the optional adjoints; the leading batch
        dimensions broadcast against each other as in NumPy.
    adj_x, adj_y : bool
        Transpose the last two dimensions of ``a`` / ``b`` (real data: adjoint = transpose).
    """
    pol = _policy(operand_dtype, out_dtype, overflow_mode, subnormals, model)
    a = _numeric(a, "a")
    b = _numeric(b, "b")
    if a.ndim < 2 or b.ndim < 2:
        raise AscendEmuError(f"batch_matmul needs operands of rank >= 2, got a of shape {a.shape} "
                             f"and b of shape {b.shape}")
    at = np.swapaxes(a, -1, -2) if adj_x else a
    bt = _contiguous_t(b, lambda: np.swapaxes(b, -1, -2)) if adj_y else b
    M, K = at.shape[-2:]
    K2, N = bt.shape[-2:]
    if K != K2:
        raise AscendEmuError(f"batch_matmul: inner dimensions differ: a of shape {a.shape} (adj_x={bool(adj_x)}) "
                             f"and b of shape {b.shape} (adj_y={bool(adj_y)})")
    ba, bb = at.shape[:-2], bt.shape[:-2]
    try:
        batch = np.broadcast_shapes(ba, bb)
    except ValueError:
        raise AscendEmuError(f"batch_matmul: batch dimensions do not broadcast: a of shape {a.shape} "
                             f"and b of shape {b.shape}") from None
    ia = np.broadcast_to(np.arange(int(np.prod(ba)), dtype=np.int64).reshape(ba), batch).ravel()
    ib = np.broadcast_to(np.arange(int(np.prod(bb)), dtype=np.int64).reshape(bb), batch).ravel()
    return _batched(at.reshape((-1, M, K)), _stacks(bt, K, N), ia, ib, bias, pol, tuple(batch) + (M, N),
                    multicore, epilogue=epilogue, b_const=bt)


for _f in (matmul, batch_matmul, conv2d, depthwise_conv2d):
    _f.__doc__ = _f.__doc__.rstrip() + "\n" + _KW_DOC
del _f

"""The cube unit's pipeline, shared by its four geometries (:mod:`.cube`: matmul and batch matmul;
:mod:`.conv`: the convolutions and their gradients).

Operands rounded to the operand dtype, multiplied exactly, accumulated in fp32 in K-blocks as ``CubeModel``
says from the bias (L0C initialised with it) or +0, the multi-core split of NUMERICS.md section 11, and one
conversion of the fp32 accumulator to the output dtype by the Fixpipe stage (NUMERICS.md section 3).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numba
import numpy as np

from . import policy as config
from .policy import (BLOCK_SUMS, DEFAULT_CUBE_MODEL, NORMALIZE, STATUS_CONVERSION_OVERFLOW, STATUS_FP_OVERFLOW,
                     CubeModel)
from ..errors import AscendEmuError
from ..kernels import alloc as _alloc
from ..kernels import cube as _k
from ..kernels.cube import epilogue as _ke
from ..kernels import multicore as _km
from . import memo as _memo
from .vector import small_run, flush_f32_subnormals

# The kernels vectorise over output columns; with fewer columns than this and more rows the first kernel
# computed C^T = B^T A^T instead (the same products summed in the same k order). Below _FEW_COLS columns the
# transposition of A costs more than the short column loops. The fast kernel keeps C = A B (_nan_free), except for
# a transposed 16-bit B with few rows of A (_flip_ok: a Dense layer's input gradient dY W^T); the blocked models and
# the convolutions still follow this rule.
_MIN_COLS = 256
_FEW_COLS = 8
# a product of at most this many terms (K padded to 16) runs matmul_tree16_small: the packing, the
# padded copies and the parallel launch cost more there than the arithmetic (a Dense layer's 32 x 32 x 10)
_SMALL_TERMS = 1 << 15


def _transposed(M: int, N: int) -> bool:
    return _FEW_COLS <= N < _MIN_COLS and M > N


def _nan_free(v: np.ndarray) -> bool:
    """Whether float32 operand values ``v`` hold no NaN (numpy's min propagates one: ~0.1 ms a million floats).

    The fast kernel (matmul_tree16) computes C = A B faster than C^T = B^T A^T at every shape _transposed
    names (its 2x32 micro-kernel, measured after it replaced the first kernel the rule was made for: 1024 x
    256 x 16..48 0.53-0.66x the time, 32 x 128x128x64 0.70x, 1024 x 1024 x 128 0.46x, one thread). The sums
    are the same in the same order; only which of two NaN operands meeting in a product or FMA comes out
    (its sign, its payload) depends on which side is the broadcast one, so operands with a NaN keep the
    orientation they always had (as conv2d's _pixels_as_rows does)."""
    return v.size == 0 or not np.isnan(v.min())


@dataclass(frozen=True)
class _Policy:
    operand: str
    out: str
    overflow: int
    subnormal: int
    model: CubeModel

    @property
    def fast(self) -> bool:
        return self.model.block_sum == "tree" and self.model.block_size == 16

    @property
    def exact_products(self) -> bool:
        # fp16 x fp16 has 22 significant bits and |ab| in [2**-48, 2**32): exact and finite in fp32,
        # so the fast kernel may fuse the tree's first level into FMAs (same bits); bf16 products
        # can overflow or underflow fp32 and fp32 products round, so those keep the plain tree
        return self.operand == "float16"


def _policy(operand_dtype, out_dtype, overflow_mode, subnormals, model) -> _Policy:
    operand = config.dtype_name(config.compute_dtype(operand_dtype))
    out = config.dtype_name(config.compute_dtype(out_dtype))
    if model is None:
        model = DEFAULT_CUBE_MODEL
    if not isinstance(model, CubeModel):
        raise AscendEmuError(f"model must be an ascend_emu.CubeModel or None, got {type(model).__name__}")
    if model.block_sum == "aligned":
        # the exact block sum lives in an int64: (block_size + 1) terms of 24 + extra_bits bits
        need = 24 + model.extra_bits + int(model.block_size + 1).bit_length()
        if need > 62:
            raise AscendEmuError(
                f"CubeModel(block_sum='aligned', block_size={model.block_size}, extra_bits={model.extra_bits}) "
                f"needs a {need}-bit exact sum; lower block_size or extra_bits so that "
                f"24 + extra_bits + bit_length(block_size + 1) <= 62")
    return _Policy(operand, out, config.overflow_code(overflow_mode), config.subnormal_code(subnormals), model)


def _numeric(x, what: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as e:
        raise AscendEmuError(f"{what} is not a numeric array ({e}); pass a float array") from None
    if arr.dtype.kind not in "fiub" and arr.dtype != config.bfloat16:
        raise AscendEmuError(f"{what} has dtype {arr.dtype}, not a real number type; pass a float array")
    return arr


def _operand_values(x: np.ndarray, pol: _Policy):
    """(float32 array of x rounded to the operand dtype, status) -- the values the cube multiplies."""
    if pol.operand == "float32":
        v = np.array(x, dtype=np.float32, order="C")  # float64 rounds to nearest even
        if pol.subnormal == config.SUBNORMAL_MODES["flush"]:
            flush_f32_subnormals(v)
        return v, 0
    target = config.COMPUTE_DTYPES[pol.operand]
    bf16 = pol.operand == "bfloat16"
    out = _alloc.empty(x.shape, np.float32)
    status = 0
    if x.dtype == target:  # no conversion on the way in (widening is exact); subnormals may still be flushed
        bits = np.ascontiguousarray(x).view(np.uint16)
        _k.widen_operands(bits.reshape(-1), out.reshape(-1).view(np.uint32), bf16,
                          pol.subnormal == config.SUBNORMAL_MODES["flush"], _ke.HW_HALF)
    elif x.dtype == np.float32:
        status = _k.round_f32_operands(np.ascontiguousarray(x).reshape(-1), out.reshape(-1), bf16, pol.overflow,
                                       pol.subnormal)
    else:  # float64, the other 16-bit float, integers: exact in float64, then one rounding
        status = _k.round_f64_operands(np.ascontiguousarray(x, dtype=np.float64).reshape(-1), out.reshape(-1), bf16,
                                       pol.overflow, pol.subnormal)
    return out, int(status)


def _padded_input(x: np.ndarray, pol: _Policy, pads):
    """(x's operand values zero-padded by ``pads``, one (before, after) pair per NHWC axis, status).
    A 16-bit x already in the operand dtype is widened straight into the padded buffer."""
    if not any(map(any, pads)):
        return _operand_values(x, pol)   # xv is the operands' own buffer
    flat, shape, st = _padded_input_flat(x, pol, pads, 0)
    return flat.reshape(shape), st


def _padded_input_flat(x: np.ndarray, pol: _Policy, pads, slack: int):
    """(_padded_input's array flattened and followed by ``slack`` +0 floats, its shape, status): for kernels
    that read a little past the input's end."""
    shape = tuple(d + a + b for d, (a, b) in zip(x.shape, pads))
    n = int(np.prod(shape, dtype=np.int64))
    if pol.operand != "float32" and x.dtype == config.COMPUTE_DTYPES[pol.operand]:
        buf = _alloc.empty(n + slack, np.uint32)
        buf[n:] = 0
        _k.widen_padded(np.ascontiguousarray(x).view(np.uint16), buf[:n].reshape(shape), pads[1][0], pads[2][0],
                        pol.operand == "bfloat16", pol.subnormal)
        return buf.view(np.float32), shape, 0
    xv, st = _operand_values(x, pol)
    buf = np.zeros(n + slack, dtype=np.float32)
    buf[:n].reshape(shape)[tuple(slice(a, a + d) for d, (a, _) in zip(x.shape, pads))] = xv
    return buf, shape, st


def _padded(v: np.ndarray, axis: int, kp: int) -> np.ndarray:
    """v with zeros appended along axis up to length kp (the partial last block's +0 products)."""
    k = v.shape[axis]
    if k == kp:
        return np.ascontiguousarray(v)
    shape = list(v.shape)
    shape[axis] = kp
    out = np.zeros(shape, dtype=np.float32)
    idx = [slice(None)] * v.ndim
    idx[axis] = slice(0, k)
    out[tuple(idx)] = v
    return out


def _bias_vector(bias, n: int, out_shape) -> np.ndarray:
    """The bias as a (1, n) float32 row (the kernels take one row, or one row per batch)."""
    if bias is None:
        return np.zeros((1, n), dtype=np.float32)  # L0C starts from +0
    b = _numeric(bias, "bias")
    if b.shape != (n,):
        raise AscendEmuError(f"bias has shape {b.shape}, expected ({n},) for an output of shape {tuple(out_shape)}")
    return np.array(b, dtype=np.float32, order="C").reshape(1, n)


def _kp(k: int) -> int:
    return -(-k // 16) * 16


_scratch = threading.local()


def _tiles() -> np.ndarray:
    """The fast kernel's accumulator tiles, one per Numba thread (allocated by the caller: a tile
    malloc'ed per work item inside the parallel loop ran up to 2x slower, depending on malloc's state).
    Scratch that no result refers to (each work item initialises its tile from the bias and stores it before
    the call returns), so one set per Python thread is kept: made per call, the 256 KiB took 13-28 us, a
    tenth of a Dense layer's 32-row product."""
    t = getattr(_scratch, "tiles", None)
    if t is None:
        t = _scratch.tiles = _k.empty_slabs((numba.config.NUMBA_NUM_THREADS, _k.TILE))
    return t


def _packed(B: np.ndarray) -> np.ndarray:
    """B (nb, Kp, N) packed into the fast kernel's slabs."""
    Bp = _k.empty_slabs(_k.slab_shape(B.shape[0], B.shape[2], B.shape[1]))
    _k.pack_b(B, Bp)
    return Bp


def _accumulate(A, B, ia, ib, bias, bias_rows, out, K, pol: _Policy, Bp=None) -> None:
    """out[t] = fp32 accumulation of A[ia[t]] @ B[ib[t]] (K real terms, padded to A.shape[2]) from the bias.
    ``Bp``: B already packed (the fast kernel's slabs of a constant's operand values, kept with it)."""
    m = pol.model
    if pol.fast:
        if Bp is None:
            Bp = _packed(B)
        mc = _k.row_block(out.shape[1], out.shape[0] * Bp.shape[1], numba.get_num_threads())
        _k.matmul_tree16(A, Bp, bias, bias_rows, ia, ib, out, _tiles(), pol.exact_products, mc)
    else:
        _k.matmul_blocked(A, B, bias, bias_rows, ia, ib, out, K, m.block_size, BLOCK_SUMS.index(m.block_sum),
                          m.extra_bits, NORMALIZE.index(m.normalize))


class Epilogue:
    """A fused cube op's UB chain, run by the Fixpipe in one pass (:mod:`ascend_emu.kernels.cube.epilogue`).

    ``steps`` are ``(name, args)``: ``name`` one of ``add sub mul div relu relu6`` (one IEEE float32
    operation per element, or relu's exact selection), ``args`` the operands, ``-1`` for the running
    value (first the float32 accumulator) or ``k`` for ``operands[k]`` (float arrays broadcasting as
    numpy does into the result, fp16/bf16 widened exactly, float64 rounded to float32). The result is
    rounded once to ``out_dtype`` (float16, bfloat16 or float32) under the cube's overflow mode.

    A cube function given one, with float32 output and subnormals kept, returns the rounded result
    and sets :attr:`applied`; where the one pass cannot stand for the step-by-step chain (an operand
    that is not a per-last-axis vector, a scalar or of the result's shape; a running value that is
    Inf or NaN anywhere) it returns the float32 accumulator as without one, :attr:`applied` False.
    With ``fused=False`` (no steps) it is the cube's own Fixpipe to ``out_dtype``, the function's own
    output dtype (status 0x100 where the rounding overflows, as ``finish_to_16``'s).
    """

    _CODES = {"add": _ke.ADD, "sub": _ke.SUB, "mul": _ke.MUL, "realdiv": _ke.DIV, "relu": _ke.RELU,
              "relu6": _ke.RELU6}
    _UNARY = ("relu", "relu6")
    #: elements per block of rows (a few of the block's float32 buffers stay in L1/L2)
    BLOCK = 2048

    def __init__(self, steps, operands, out_dtype: str, fused: bool = True):
        for name, args in steps:
            if name not in self._CODES or len(args) != (1 if name in self._UNARY else 2):
                raise ValueError(f"epilogue step {name!r} with {len(args)} operands")
        self.steps = [(name, tuple(int(a) for a in args)) for name, args in steps]
        self.operands = list(operands)
        self.out = config.dtype_name(config.compute_dtype(out_dtype))
        self.fused = bool(fused)
        self.applied = False

    #: (steps, the read operands' (index, shape, dtype), out_shape, rb) -> _plan's result: what depends only on
    #: the shapes, made once (a training step's forward layers meet the same shapes every step: 42-68 us of
    #: Python a call alone, ~110 in the replay, rebuilt the same program for new bias values). Bounded: cleared
    #: when full.
    _PLANS: dict = {}
    _PLANS_MAX = 256

    def _plan(self, shapes, out_shape, C: int, rb: int):
        """(prog, [(operand index, kind, slot)], tile count, float32 operand count, 16-bit operand count, f16bf,
        the float32 and the uint16 placeholder) for the operands' shapes and dtypes ``shapes`` ((index, shape,
        dtype) per operand the steps read), or None if one does not fit."""
        R = int(np.prod(out_shape[:-1], dtype=np.int64)) if len(out_shape) else 1
        kinds, fills, n_tiles, n_f32, n_f16, f16bf = {}, [], 0, 0, 0, []
        for k, shape, dtype in shapes:
            size = int(np.prod(shape, dtype=np.int64))
            if dtype not in (np.float16, np.float32, np.float64, config.bfloat16) or len(shape) > len(out_shape):
                return None
            try:
                if np.broadcast_shapes(shape, out_shape) != tuple(out_shape):
                    return None
            except ValueError:
                return None
            if size == 1 or (shape[-1] == C and size == C):   # a scalar or a per-last-axis vector
                kinds[k] = (_ke.TILE, n_tiles)
                fills.append((k, _ke.TILE, n_tiles))
                n_tiles += 1
            elif size == R * C:                                 # the result's shape (leading 1s aside)
                if dtype in (np.float16, config.bfloat16):
                    kinds[k] = (_ke.F16, n_f16)
                    fills.append((k, _ke.F16, n_f16))
                    f16bf.append(int(dtype == config.bfloat16))
                    n_f16 += 1
                else:
                    kinds[k] = (_ke.F32, n_f32)
                    fills.append((k, _ke.F32, n_f32))
                    n_f32 += 1
            else:
                return None
        prog = np.zeros((len(self.steps), 5), dtype=np.int64)
        for i, (name, args) in enumerate(self.steps):
            prog[i, 0] = self._CODES[name]
            for j, a in enumerate(args):
                prog[i, 1 + 2 * j:3 + 2 * j] = (_ke.RUN, 0) if a < 0 else kinds[a]
        return (prog, fills, n_tiles, n_f32, n_f16, np.array(f16bf or [0], dtype=np.int64),
                np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.uint16))

    def _program(self, out_shape, C: int, rb: int):
        """(prog, tiles, f32s, f16s, f16bf) for the kernel, or None if an operand does not fit.
        The kernel reads them (never writes): the plan's arrays are shared by every call of the same shapes."""
        xs = {k: np.asarray(self.operands[k]) for k in sorted({a for _, args in self.steps for a in args if a >= 0})}
        shapes = tuple((k, x.shape, x.dtype) for k, x in xs.items())
        key = (tuple(self.steps), shapes, tuple(out_shape), rb)
        plan = self._PLANS.get(key)
        if plan is None:
            plan = self._plan(shapes, out_shape, C, rb)
            if len(self._PLANS) >= self._PLANS_MAX:
                self._PLANS.clear()
            self._PLANS[key] = plan
        if plan is None:
            return None
        prog, fills, n_tiles, n_f32, n_f16, f16bf, zero32, zero16 = plan
        tiles = np.empty((max(n_tiles, 1), rb * C), dtype=np.float32)
        if not n_tiles:
            tiles[:] = 0
        f32s, f16s = [None] * n_f32, [None] * n_f16
        for k, kind, slot in fills:
            x = xs[k]
            if kind == _ke.TILE:
                # the C values (or the scalar) repeated for each of the block's rb rows; exact for fp16/bf16,
                # RNE from float64
                tiles[slot].reshape(rb, C)[...] = np.asarray(x, dtype=np.float32).reshape(-1)
            elif kind == _ke.F16:
                f16s[slot] = _alloc.readonly(np.ascontiguousarray(x).reshape(-1).view(np.uint16))  # one tuple type
            else:
                f32s[slot] = _alloc.readonly(np.asarray(np.ascontiguousarray(x).reshape(-1), dtype=np.float32))
        return (prog, tiles, tuple(f32s) if f32s else (zero32,), tuple(f16s) if f16s else (zero16,), f16bf)

    def apply(self, acc: np.ndarray, pol: _Policy, out_shape, transposed: bool = False):
        """(the rounded result of shape ``out_shape``, status) from the float32 accumulator ``acc``
        (``out_shape`` flattened to (R, C), or (C, R) if ``transposed``), or None (nothing done)."""

        if pol.out != ("float32" if self.fused else self.out) or pol.subnormal != config.SUBNORMAL_MODES["keep"]:
            return None
        out_shape = tuple(int(d) for d in out_shape)
        C = out_shape[-1] if out_shape else 1
        R = acc.size // max(C, 1)
        if acc.size == 0 or C == 0:
            return None
        rb = max(1, self.BLOCK // C)
        prog = self._program(out_shape, C, rb)
        if prog is None:
            return None
        kind = {"float32": _ke.OUT_F32, "float16": _ke.OUT_F16, "bfloat16": _ke.OUT_BF16}[self.out]
        if kind == _ke.OUT_F32:
            out32 = np.empty(R * C, dtype=np.float32)
            out16 = np.zeros(1, dtype=np.uint16)
        else:
            out16 = _alloc.empty(R * C, np.uint16)
            out32 = np.zeros(1, dtype=np.float32)
        st = _ke.epilogue(np.ascontiguousarray(acc).reshape(-1), bool(transposed), R, C, rb, *prog, out16, out32, kind,
                         pol.overflow, _ke.HW_HALF, STATUS_FP_OVERFLOW if self.fused else STATUS_CONVERSION_OVERFLOW)
        if st < 0:
            return None
        self.applied = True
        out = out32 if kind == _ke.OUT_F32 else out16.view(config.COMPUTE_DTYPES[self.out])
        return out.reshape(out_shape), int(st)


def _finish(acc: np.ndarray, pol: _Policy, epilogue: Epilogue | None = None, out_shape=None):
    """Fixpipe: fp32 accumulator -> output dtype; returns (array, status). With an ``epilogue``
    (float32 output): its chain and rounding in the same pass where it applies (see :class:`Epilogue`)."""
    if epilogue is not None:
        done = epilogue.apply(acc, pol, acc.shape if out_shape is None else out_shape)
        if done is not None:
            return done
    sat = pol.overflow == config.OVERFLOW_MODES["saturation"]
    if pol.out == "float32":
        st = _k.finish_f32(acc.reshape(-1), sat, pol.subnormal == config.SUBNORMAL_MODES["flush"])
        return acc, int(st)
    bits = _alloc.empty(acc.shape, np.uint16)
    st = _k.finish_to_16(acc.reshape(-1), bits.reshape(-1), pol.out == "bfloat16", pol.overflow, pol.subnormal,
                         _ke.HW_HALF)
    return bits.view(config.COMPUTE_DTYPES[pol.out]), int(st)


def _acc(av, bv, ia, ib, biasv, pol: _Policy, M: int, N: int, K: int, const_b: bool = False,
         Bp=None, flip: bool = False) -> np.ndarray:
    """The fp32 accumulators (len(ia), M, N) of av[ia] @ bv[ib] from the bias, K in order. ``const_b``: bv is a
    constant's memoized operand values (frozen): its padded, packed slabs are computed once and kept with it.
    ``Bp``: B's slabs packed already (bv None; the fast kernel in the C = A B orientation: _batched decided it).
    ``flip``: computed as C^T = B^T A^T (_batched decided it: :func:`_flip_ok`)."""
    kp = _kp(K)
    if Bp is not None:
        acc = _alloc.empty((len(ia), M, N), np.float32)
        _accumulate(_padded(av, 2, kp), None, ia, ib, biasv, False, acc, K, pol, Bp)
        return acc
    if pol.fast and len(ia) * M * N * kp <= _SMALL_TERMS:
        # a small product: the same sums on one thread, no padding, packing or transposition (a NaN
        # result: the packed kernel itself, whose vector code decides which NaN)
        acc = np.empty((len(ia), M, N), dtype=np.float32)
        if not _k.matmul_tree16_small(np.ascontiguousarray(av), np.ascontiguousarray(bv), biasv, ia, ib, acc, K,
                                      pol.exact_products):
            return acc
    if flip or (_transposed(M, N) and not (pol.fast and _nan_free(av) and _nan_free(bv))):
        accT = _alloc.empty((len(ia), N, M), np.float32)
        _accumulate(_padded(np.swapaxes(bv, 1, 2), 2, kp), _padded(np.swapaxes(av, 1, 2), 1, kp), ib, ia, biasv,
                    True, accT, K, pol)
        acc = _alloc.empty((len(ia), M, N), np.float32)   # (64-byte aligned: TensorFlow adopts it without a copy)
        acc[...] = accT.transpose(0, 2, 1)
        return acc
    acc = _alloc.empty((len(ia), M, N), np.float32)
    if const_b and pol.fast:
        Bp = _memo.memo(bv, ("packed slabs", kp), lambda: _packed(_padded(bv, 1, kp)))
        _accumulate(_padded(av, 2, kp), None, ia, ib, biasv, False, acc, K, pol, Bp)
    else:
        _accumulate(_padded(av, 2, kp), _padded(bv, 1, kp), ia, ib, biasv, False, acc, K, pol)
    return acc


def _split_acc(av, bv, ia, ib, biasv, pol: _Policy, M: int, N: int, bounds, perm) -> np.ndarray:
    """Split-K over cores (NUMERICS.md section 11): core c accumulates K range bounds[c]:bounds[c+1] from
    +0 (the bias goes to the first range's core), and the fp32 partials are added to the cleared output
    in the order ``perm``."""
    parts = np.empty((len(bounds) - 1, len(ia) * M * N), dtype=np.float32)
    zero = np.zeros_like(biasv)
    for c in range(len(bounds) - 1):
        k0, k1 = int(bounds[c]), int(bounds[c + 1])
        a_c = np.ascontiguousarray(av[:, :, k0:k1])
        b_c = np.ascontiguousarray(bv[:, k0:k1, :])
        parts[c] = _acc(a_c, b_c, ia, ib, biasv if c == 0 else zero, pol, M, N, k1 - k0).reshape(-1)
    acc = np.empty(len(ia) * M * N, dtype=np.float32)
    _km.combine_f32(parts, np.ascontiguousarray(perm, dtype=np.int64), acc)
    return acc.reshape(len(ia), M, N)


def _strided_pack_ok(b, pol: _Policy, items: int, M: int, N: int, K: int) -> bool:
    """Whether the cube packs the 16-bit view ``b`` (stacks that merge only by a copy) from its strides
    (:func:`_pack_strided`): the fast model, a product larger than the small kernel's, at most two stack axes, and
    columns that are not contiguous (numpy's copy of those is the slow one: the attention keys' (8, 4, 64, 128) view
    0.31 ms; with contiguous columns, the values' (8, 4, 128, 64), copy, widening and pack_b took 0.33 ms, the
    strided packing 0.40), nor broadcast along the columns (a zero stride: a BroadcastTo's view; copied)."""
    return (pol.fast and pol.operand != "float32" and b.dtype == config.COMPUTE_DTYPES[pol.operand]
            and b.ndim <= 4 and b.strides[-1] not in (b.itemsize, 0) and min(M, N, K) > 0
            and items * M * N * _kp(K) > _SMALL_TERMS)


# a product with a transposed B (_flip_ok) runs as C^T = B^T A^T for _FEW_COLS <= M <= _FLIP_ROWS rows of A,
# N >= 8 M columns and K >= _MIN_COLS terms: in-process A/B, one thread, fp16 (M x K x N, medians of 25 paired
# rounds): 32 x 512 x 512 861 -> 722 us, 64 x 512 x 512 -179 us, 8 x 1024 x 1024 -291, 16 x 512 x 1024 -149, 32 x 256
# x 512 -47; outside: 128 x 512 x 256 +58, 100 x 300 x 200 +48, 32 x 512 x 64 +13, 1 x 512 x 512 +19, 32 x 64 x 512 +12
_FLIP_ROWS = 64


def _flip_ok(b, pol: _Policy, items: int, M: int, N: int, K: int) -> bool:
    """Whether the cube computes A B as C^T = B^T A^T for the 16-bit B ``b`` that is a transposed view of a
    C-contiguous (stack, N, K) array (MatMul's transpose_b of a weight: a Dense layer's input gradient dY W^T, M the
    batch): B^T's values are then widened in their own layout and read by the kernel as its rows, and only the small
    A^T is packed, where C = A B packed all of B from across its rows (_pack_strided's pack_bt). The same products
    summed in the same k order (the _transposed rule's other orientation); _batched takes it only for NaN-free
    operands (see :func:`_nan_free`)."""
    return (pol.fast and pol.operand != "float32" and b.dtype == config.COMPUTE_DTYPES[pol.operand]
            and b.ndim == 3 and not b.flags.c_contiguous and b.transpose(0, 2, 1).flags.c_contiguous
            and _FEW_COLS <= M <= _FLIP_ROWS and N >= 8 * M and K >= _MIN_COLS
            and items * M * N * _kp(K) > _SMALL_TERMS)


def _widen_pack_ok(b, pol: _Policy, items: int, M: int, N: int, K: int) -> bool:
    """Whether the cube widens the C-contiguous fp16 B ``b`` straight into the fast kernel's slabs
    (kernels/cube/operands.widen_pack_f16: widen_operands' values, pack_b's layout, one pass instead of two; a Dense
    layer's 512 x 512 weight in a training step, thread CPU: see benchmarks/RESULTS.md session 21): the fast model, an
    fp16 host conversion (HW_HALF), a product larger than the small kernel's in the C = A B orientation."""
    return (pol.fast and pol.operand == "float16" and b.dtype == np.float16 and _ke.HW_HALF and b.ndim == 3
            and b.flags.c_contiguous and min(M, N, K) > 0 and not _transposed(M, N)
            and items * M * N * _kp(K) > _SMALL_TERMS)


def _pack_strided(b, pol: _Policy, K: int, N: int):
    """(the fast kernel's slabs of the 16-bit (stack, [stack,] K, N) view ``b`` widened and packed in one pass
    (kernels/cube/operands.pack_b16), a function saying whether b holds a NaN): the same floats as
    _packed(_padded(_operand_values(b)[0], 1, Kp)) of its contiguous copy (the widening of a value already in the
    operand dtype raises no status). A transposed view of a C-contiguous (stack, N, K) array (MatMul's transpose_b
    of a weight, BatchMatMul's adj_y) is widened in its own layout and packed by pack_bt in 16 x 16 blocks: a
    512 x 512 fp16 weight 659 -> 302 us (thread CPU, best of 9 x 50; pack_b16's row-by-row reads of it are 1 KiB
    apart); the NaN test, only the orientation needs it, then costs 27 us more."""
    if b.ndim == 3 and b.transpose(0, 2, 1).flags.c_contiguous:
        wv, _ = _operand_values(b.transpose(0, 2, 1), pol)
        Bp = _k.empty_slabs(_k.slab_shape(b.shape[0], N, _kp(K)))
        _k.pack_bt(wv, K, Bp)
        return Bp, lambda: not _nan_free(wv)
    y = b.view(np.uint16)
    if y.ndim == 3:
        y = y[None]
    if any(s < 0 or s % 2 for s in y.strides):
        y = np.ascontiguousarray(y)
    st = [s // 2 for s in y.strides]
    run = np.lib.stride_tricks.as_strided(y, shape=(1 + sum((d - 1) * s for d, s in zip(y.shape, st)),),
                                          strides=(2,))
    Bp = _k.empty_slabs(_k.slab_shape(y.shape[0] * y.shape[1], N, _kp(K)))
    nan = bool(_k.pack_b16(run, np.array(st, dtype=np.int64), y.shape[1], K, N, Bp, pol.operand == "bfloat16",
                           pol.subnormal == config.SUBNORMAL_MODES["flush"]))
    return Bp, lambda: nan


#: a product of at most this many multiply-adds (stacks x M x N x K) runs all its kernels (operand widening and
#: packing, the products, the Fixpipe) on one Numba thread: on the 2-vCPU VM this project is measured on, waking the
#: second thread for each of those parallel regions cost more than it saved up to about this size (whole fp16
#: products, one thread against two, medians of ~100 in one process, RESULTS.md session 22: 32 x 256 x 512 219 vs
#: 612 us, 32 x 512 x 512 431 vs 700, 128 x 512 x 512 (2^25) 1016-1393 vs 1119-1133, 512 x 512 x 512 3544-4973 vs
#: 2618-3052), and a Dense layer's products in a training step are far smaller (the Keras MLP's step: 10.7 -> 8.5
#: ms). Results never depend on the thread count (fixed work items, statuses ORed).
SERIAL_MACS = 1 << 25


def _batched(a3, b3, ia, ib, bias, pol: _Policy, out_shape, multicore=None, samples=None, epilogue=None,
             b_const=None):
    """Cube product of stacks a3 (BA, M, K) and b3 (BB, K, N) paired by ia, ib; returns (array, status):
    :func:`_product` on one Numba thread when it has at most :data:`SERIAL_MACS` multiply-adds."""
    macs = len(ia) * a3.shape[1] * a3.shape[2] * b3.shape[-1]
    return small_run(macs, lambda: _product(a3, b3, ia, ib, bias, pol, out_shape, multicore, samples, epilogue,
                                             b_const), SERIAL_MACS)


def _product(a3, b3, ia, ib, bias, pol: _Policy, out_shape, multicore=None, samples=None, epilogue=None,
             b_const=None):
    """Cube product of stacks a3 (BA, M, K) and b3 (BB, K, N) paired by ia, ib; returns (array, status).

    ``multicore`` (a non-deterministic :class:`~ascend_emu.numerics.multicore.Launch`) may split K over
    cores: by whole samples when ``samples`` says K holds that many samples' terms, else split-K.
    ``b_const``: the frozen array b3 is a view of (a loaded weight; numerics/memo.py): b3's operand values
    and packed slabs are computed once per weight and policy, not once per call. b3 may also be
    (BB1, BB2, K, N), stacks that do not merge without a copy (an Einsum's transposed operand): stack t is
    [t // BB2, t % BB2]."""
    _, M, K = a3.shape
    N = b3.shape[-1]
    ia = np.ascontiguousarray(ia, dtype=np.int64)
    ib = np.ascontiguousarray(ib, dtype=np.int64)
    bounds = None
    if multicore is not None:
        bounds = (multicore.batch_bounds(samples, K // samples) if samples
                  else multicore.splitk_bounds(len(ia), M, N, K))
    const_b = b_const is not None and _memo.frozen(b_const)
    av, sa = _operand_values(a3, pol)
    Bp = None
    flip = False
    if not const_b and bounds is None and _flip_ok(b3, pol, len(ia), M, N, K):
        wv, sb = _operand_values(b3.transpose(0, 2, 1), pol)
        flip = _nan_free(wv) and _nan_free(av)   # a NaN operand keeps the orientation C = A B (see _nan_free)
        if flip:
            bv = wv.transpose(0, 2, 1)
        else:   # _pack_strided's route for this B (M < N: not _transposed), from the values widened already
            Bp = _k.empty_slabs(_k.slab_shape(b3.shape[0], N, _kp(K)))
            _k.pack_bt(wv, K, Bp)
    if not flip and Bp is None and (b3.ndim != 3 or not b3.flags.c_contiguous):
        # (a 3-D b3 too: MatMul's transpose_b outside _flip_ok's rows, the weight of an input gradient: its transposed
        # 512 x 512 fp16 copied, widened and packed 640 us, packed from its strides 410 us, widened in its own
        # layout and packed by pack_bt ~300 us: _pack_strided)
        if not const_b and bounds is None and _strided_pack_ok(b3, pol, len(ia), M, N, K):
            Bp, nan = _pack_strided(b3, pol, K, N)   # no contiguous copy, widening and packing one after another
            if _transposed(M, N) and (nan() or not _nan_free(av)):
                Bp = None   # a NaN operand keeps the orientation C^T = B^T A^T it always had (see _nan_free)
        if Bp is None and b3.ndim != 3:
            b3 = np.ascontiguousarray(b3).reshape((-1, K, N))
    if Bp is None and not flip and not const_b and bounds is None and _widen_pack_ok(b3, pol, len(ia), M, N, K):
        Bp = _k.empty_slabs(_k.slab_shape(b3.shape[0], N, _kp(K)))
        _k.widen_pack_f16(b3.view(np.uint16), Bp, pol.subnormal == config.SUBNORMAL_MODES["flush"])
    if flip:
        pass   # bv, sb: B^T's values viewed as B's
    elif Bp is not None:
        bv, sb = None, 0
    elif const_b:
        # the operand rounding is a function of b3's bits (b3: b_const reshaped, the key holds its shape)
        bv, sb = _memo.memo(b_const, ("cube operand values", pol.operand, pol.overflow, pol.subnormal, b3.shape),
                            lambda: _operand_values(b3, pol))
    else:
        bv, sb = _operand_values(b3, pol)
    biasv = _bias_vector(bias, N, out_shape)
    if bounds is not None:
        acc = _split_acc(av, bv, ia, ib, biasv, pol, M, N, bounds, multicore.order(len(bounds) - 1))
    else:
        acc = _acc(av, bv, ia, ib, biasv, pol, M, N, K, const_b, Bp, flip)
    out, sf = _finish(acc, pol, epilogue, out_shape)
    return out.reshape(out_shape), sa | sb | sf


_KW_DOC = """
    bias : array_like of shape (N,), optional
        fp32 bias; L0C is initialised with it before the K accumulation (+0 without one).
    operand_dtype : {"float16", "bfloat16", "float32"}
        Operands not already of this dtype are rounded to it (nearest even) and that
        conversion's status is ORed in. "float32" is the plain fp32 cube path (fp32
        products rounded to fp32, same block order).
    out_dtype : {"float16", "bfloat16", "float32"}
        The Fixpipe output dtype; 16-bit outputs are rounded to nearest even.
    overflow_mode : {"inf_nan", "saturation"}
        IEEE Inf/NaN, or saturation: a non-finite accumulator becomes +-FLT_MAX (NaN -> 0)
        and conversions clamp to the largest finite value.
    subnormals : {"keep", "flush"}
        "flush" turns subnormal operands and subnormal outputs into signed zeros.
    model : CubeModel, optional
        The block accumulation model (default ``CubeModel()``: blocks of 16, adder tree).
    multicore : :class:`ascend_emu.numerics.multicore.Launch`, optional (matmul, batch_matmul)
        A non-deterministic launch: a small output with a long K is split over cores (split-K),
        the fp32 partials added in a drawn order (NUMERICS.md section 11). None: K in order.
    epilogue : :class:`Epilogue`, optional
        With ``out_dtype="float32"`` and subnormals kept: the fused UB chain and the rounding to its
        output dtype in the Fixpipe's pass, where it applies (``epilogue.applied``).

    Returns
    -------
    (numpy.ndarray, int)
        The result in ``out_dtype`` and the status bits raised (0 when nothing overflowed).
"""

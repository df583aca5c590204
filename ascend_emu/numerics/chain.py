"""A chain of float32 elementwise steps rounded once to fp16, in one pass (``kernels/chain.py``).

The fast path of the vector unit's fused chains (``_EltwiseChain``): the same float32 IEEE steps numpy
computes, on fp16 or float32 inputs that are full-size, one per channel (broadcast along the last
axis) or one value; the result rounded to nearest-even fp16. :func:`chain_to_f16` returns None
wherever that might differ from the full path (another layout, another dtype, a host without
hardware fp16 conversions, or an Inf or NaN in any step or in the result: overflow and its status
are the full path's business), so a caller that gets None runs the chain as before.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..kernels import alloc as _alloc
from ..kernels import cast as _kc
from ..kernels import chain as _kch
from ..kernels.codes import ADD, CHAIN_RELU, CHAIN_RELU6, CHAIN_ROUND16, MUL, REALDIV, SUB

#: chain step names and their kernel codes (binary steps, then the unary selections)
STEP_CODES = {"add": ADD, "sub": SUB, "mul": MUL, "realdiv": REALDIV, "relu": CHAIN_RELU, "relu6": CHAIN_RELU6,
              "round16": CHAIN_ROUND16}
_UNARY = (CHAIN_RELU, CHAIN_RELU6, CHAIN_ROUND16)
#: below this many output elements the numpy steps cost less than the kernel's call
MIN_ELEMENTS = 1 << 12
_BLOCK = 2048   # elements per block: the rows a step reads and writes stay in a 48 KiB L1
_MAX_CHANNELS = 1 << 13
_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
_EMPTY16 = _alloc.readonly(np.zeros(1, np.uint16))
_EMPTY32 = _alloc.readonly(np.zeros(1, np.float32))


def _slots(arrays, filler):
    """``arrays`` as a tuple of 4 (or 8, or more if need be), padded with ``filler``: the kernel is compiled
    once per tuple length, so every chain of up to four inputs of each dtype shares one compiled kernel."""
    k = 4 if len(arrays) <= 4 else max(8, len(arrays))
    return tuple(arrays) + (filler,) * (k - len(arrays))


def broadcast_shape(shapes) -> tuple:
    """``np.broadcast_shapes(*shapes)`` without its cost (several microseconds a call, which small ops pay
    several times) when every shape is the same or a scalar's; the numpy function otherwise (its
    ValueError for shapes that do not broadcast)."""
    out = ()
    for s in shapes:
        if not s or s == out:
            continue
        if out:
            return np.broadcast_shapes(*shapes)
        out = s
    return tuple(out)


def distinct_view(a):
    """The distinct values of a zero-stride (broadcast) view ``a``: ``a`` with every repeated axis cut to
    length 1 (a view of the same rank); ``a`` itself when nothing is repeated or it is not an ndarray."""
    if type(a) is not np.ndarray or 0 not in a.strides or not a.size:
        return a
    if not any(s == 0 and n > 1 for s, n in zip(a.strides, a.shape)):
        return a
    return a[tuple(slice(0, 1) if s == 0 and n > 1 else slice(None) for s, n in zip(a.strides, a.shape))]


@functools.lru_cache(maxsize=1024)
def _program(steps: tuple, n_inputs: int):
    """The chain kernel's program of ``steps`` (rows of step code, a, b) for ``n_inputs`` inputs, read-only, or
    None if the kernel cannot run them (an unknown step, a running value read before one exists, an input no
    step reads: it would still shape the result)."""
    used = set()
    prog = []
    have = False
    for name, a, b in steps:
        code = STEP_CODES.get(name)
        if code is None or (a < 0 and not have):
            return None
        if code in _UNARY:
            b = -2
        elif b < 0 and not have:
            return None
        used.update(k for k in (a, b) if k >= 0)
        prog.append((code, a, b))
        have = True
    if used != set(range(n_inputs)):
        return None
    return np.array(prog, np.int64)   # (writeable, as the kernel was compiled for; nothing writes it)


def chain_to_f16(inputs, steps):
    """The fp16 result of ``steps`` on ``inputs``, or None.

    Parameters
    ----------
    inputs : sequence of numpy.ndarray
        float16 or float32 arrays that broadcast together.
    steps : sequence of (str, int, int)
        ``(name, a, b)`` with ``name`` a key of :data:`STEP_CODES` and arguments ``k >= 0`` (input k)
        or ``-1`` (the running value); ``b`` is ignored for relu, relu6 and round16 (the running value
        rounded to fp16 and widened back).

    Returns
    -------
    numpy.ndarray or None
        float16 of the broadcast shape, with the bits of the float32 steps rounded once (no status:
        every value was finite), or None (run the chain on its full path).
    """
    if not _kc.HW_HALF or not steps or not inputs:
        return None
    try:
        shape = broadcast_shape([np.shape(x) for x in inputs])
    except ValueError:
        return None
    n = int(math.prod(shape))
    if n < MIN_ELEMENTS:
        return None
    c = shape[-1] if shape else 1
    prog = _program(tuple(steps), len(inputs))
    if prog is None:
        return None
    h16, f32, src = [], [], []
    channel = False
    for x in inputs:
        x = np.asarray(x)
        if 0 in x.strides and x.size:
            # a broadcast view (zero strides): its distinct values, read per channel or once, not copied out
            cut = distinct_view(x)
            if cut.size == 1 or (cut.ndim >= 1 and cut.shape[-1] == c and cut.size == c):
                x = cut
        if x.dtype == _F16:
            which, bucket, bits = 0, h16, x.view(np.uint16)
        elif x.dtype == _F32:
            which, bucket, bits = 1, f32, x
        else:
            return None
        if x.shape == shape:
            layout, flat = 0, np.ascontiguousarray(bits).reshape(-1)
        elif x.size == 1:
            layout, flat = 2, bits.reshape(-1)
        elif x.ndim >= 1 and x.shape[-1] == c and x.size == c:
            layout, flat, channel = 1, np.ascontiguousarray(bits).reshape(-1), True
        else:
            return None
        src.append((which, len(bucket), layout))
        bucket.append(_alloc.readonly(flat))   # one tuple type whatever the inputs' writeability
    if channel and c > _MAX_CHANNELS:
        return None
    blk = c * max(1, _BLOCK // c) if channel else _BLOCK
    out = _alloc.empty(n, np.uint16)
    bad = _kch.chain_to_f16(_slots(h16, _EMPTY16), _slots(f32, _EMPTY32), np.array(src, np.int64), prog, c, blk,
                            out)
    if bad:
        return None
    return out.view(np.float16).reshape(shape)

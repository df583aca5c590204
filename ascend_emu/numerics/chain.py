"""A chain of float32 elementwise steps rounded once to fp16, in one pass (``kernels/chain.py``).

The fast path of the vector unit's fused chains (``_EltwiseChain``): the same float32 IEEE steps numpy
computes, on fp16 or float32 inputs that are full-size, one per channel (broadcast along the last
axis, or along a block of trailing axes: an EinsumDense bias) or one value; the result rounded to
nearest-even fp16. :func:`chain_to_f16` returns None wherever that might differ from the full path
(another layout, another dtype, a host without hardware fp16 conversions, or an Inf or NaN in any step
or in the result: overflow and its status are the full path's business), so a caller that gets None
runs the chain as before.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..kernels import alloc as _alloc
from ..kernels import cast as _kc
from ..kernels import chain as _kch
from ..kernels import chain32 as _kch32
from ..kernels import chain16 as _kch16
from ..kernels.codes import (ADD, CHAIN_NEG, CHAIN_RELU, CHAIN_RELU6, CHAIN_ROUND16, CHAIN_SQRT, CHAIN_SQUARE, MAXIMUM,
                             MINIMUM, MUL, REALDIV, SUB)

#: chain step names and their kernel codes (binary steps, then the unary selections)
STEP_CODES = {"add": ADD, "sub": SUB, "mul": MUL, "realdiv": REALDIV, "maximum": MAXIMUM, "minimum": MINIMUM,
              "relu": CHAIN_RELU, "relu6": CHAIN_RELU6, "round16": CHAIN_ROUND16}
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
    """``np.broadcast_shapes(*shapes)`` without its cost (2.6 us a call for BN's (32, 32, 32, 16) and two (16,),
    which the chain nodes pay once or twice each): at once when every shape is the same or a scalar's, else numpy's
    rule in Python (each axis, aligned from the right, of length 1 or the same; a ValueError where they do not
    broadcast, as numpy raises)."""
    out = ()
    for s in shapes:
        if not s or s == out:
            continue
        if out:
            return _broadcast_rule(shapes)
        out = s
    return tuple(out)


def _broadcast_rule(shapes) -> tuple:
    """numpy's broadcasting of ``shapes`` (0.6-1 us for a few short shapes; ``np.broadcast_shapes`` 2.6)."""
    nd = max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        at = nd - len(s)
        for i, n in enumerate(s):
            r = out[at + i]
            if n == r or n == 1:
                continue
            if r != 1:
                raise ValueError(f"shape mismatch: objects cannot be broadcast to a single shape: {tuple(shapes)}")
            out[at + i] = int(n)
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


def _squeezed(shape) -> tuple:
    """``shape`` without its leading 1s."""
    k = 0
    while k < len(shape) and shape[k] == 1:
        k += 1
    return tuple(shape[k:])


def _trailing_block(inputs, shape) -> tuple:
    """The trailing axes (two or more) that every input which is neither full-size nor one value spans exactly
    (an EinsumDense bias of (heads, dim) over (batch, time, heads, dim)), or () when there is no such input or
    they differ: such an input is one value per position of that block, the flattened block the channels."""
    block = None
    for x in inputs:
        s = np.shape(x)
        if s == shape or math.prod(s) == 1:
            continue
        b = _squeezed(s)
        if len(b) < 2 or b != tuple(shape[len(shape) - len(b):]) or (block is not None and b != block):
            return ()
        block = b
    return block or ()


#: the steps a chain's leading run on small operands can be worked out on once (:func:`_fold_prefix`): one IEEE
#: float32 operation each, numpy's own (the kernel's _step loops compute the same operation per element)
_FOLD = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "realdiv": np.divide}


def _whole(x, shape) -> bool:
    """Whether ``x`` holds a value per element of ``shape`` (of that shape, no zero strides): no folding reads it."""
    return type(x) is np.ndarray and x.shape == shape and 0 not in x.strides


def _fold_prefix(inputs, steps, shape, c, block):
    """(inputs, steps) with the chain's leading steps that read only one-value or per-channel inputs (BN's
    gradient ``mean_grad / n * 2`` before it meets the full-size tensor) computed once on their distinct values,
    in float32 as the kernel computes them at every element, and put in as one input; the same (inputs, steps)
    when there is no such prefix or folding it would change the result's shape; None when any step of the prefix
    gives an Inf or NaN (the kernel's check of that step fails at every element that reads it: the full path runs,
    with its status)."""
    name, a, b = steps[0]
    if name not in _FOLD or a < 0 or b < 0 or _whole(inputs[a], shape) or _whole(inputs[b], shape):
        return inputs, steps      # no prefix (most chains start on the full-size tensor): nothing to look at
    n = int(math.prod(shape))
    small = {}
    for k, x in enumerate(inputs):
        cut = distinct_view(np.asarray(x))
        if cut.size < n and cut.dtype in (_F16, _F32):
            small[k] = cut
    # the prefix and what folding it gives are worked out from the shapes first: nothing is computed for a chain
    # that will not be folded (an outer broadcast of two small inputs is the whole output)
    p, shapes = 0, []
    for name, a, b in steps:
        if _FOLD.get(name) is None or not all((k == -1 and p > 0) or k in small for k in (a, b)):
            break
        shapes += [small[k].shape for k in (a, b) if k != -1]
        p += 1
    if p == 0:
        return inputs, steps
    rest = steps[p:]
    used = {k for _, a, b in rest for k in (a, b) if k >= 0}
    if not rest or not any(np.shape(inputs[k]) == shape for k in used):
        return inputs, steps          # the folded prefix would be all there is, or would shape the result
    try:
        folded = np.broadcast_shapes(*shapes)
    except ValueError:
        return inputs, steps
    size = int(math.prod(folded))
    if not (size == 1 or (size == c and ((folded and folded[-1] == c) or _squeezed(folded) == block))):
        return inputs, steps
    value = None
    for name, a, b in steps[:p]:
        with np.errstate(all="ignore"):
            x, y = (value if k == -1 else small[k].astype(_F32) for k in (a, b))
            value = np.asarray(_FOLD[name](x, y), dtype=_F32)
        if not np.isfinite(value).all():
            # the kernel checks every step's result: an Inf or NaN at any step (a later division can make it
            # finite again) fails that check at every element reading it, and the full path runs (its status)
            return None
    keep = sorted(used)
    index = {k: i for i, k in enumerate(keep)}
    new = len(keep)
    remap = lambda k: new if k == -1 else (k if k == -2 else index[k])  # noqa: E731
    first = rest[0]
    out = [(first[0], remap(first[1]), remap(first[2]) if first[0] not in ("relu", "relu6", "round16") else first[2])]
    out += [(name, a if a < 0 else index[a], b if b < 0 else index[b]) for name, a, b in rest[1:]]
    return [inputs[k] for k in keep] + [value], out


_ONE_F32, _NEG_ZERO, _INF = np.float32(1.0), np.float32(-0.0), np.float32(np.inf)


def _row(src, h16, f32, k, blk, c, negate=False):
    """Input ``k`` (per channel or one value) as the float32 row of a block: element j reads channel ``j % c``."""
    which, idx, layout = src[k]
    vals = h16[idx].view(np.float16).astype(_F32) if which == 0 else np.asarray(f32[idx], _F32)
    if negate:
        vals = np.negative(vals)   # exact: a - b is a + (-b) in IEEE arithmetic
    if layout == 2:
        return np.full(blk, vals[0], _F32)
    row = np.empty(blk, _F32)   # vals repeated blk // c times (np.tile's values; 1 us against its 4.8)
    row.reshape(-1, c)[...] = vals
    return row


@functools.lru_cache(maxsize=1024)
def _affine_plan(steps: tuple, src: tuple):
    """Which inputs ``kernels/chain.affine_to_f16`` takes and how (x, p, q, negate q, mode, z, lo, hi; None for a
    missing step) when the chain ``steps`` on inputs laid out as ``src`` (see :func:`chain_to_f16`) is, in this
    order, an optional ``Mul`` of the full-size fp16 input by a per-channel or one-value one, an optional ``Add``
    (either order) or ``Sub`` (the running value first) of one, then either nothing, or a rounding to fp16 and the
    running value's square (SquaredDifference), or an ``Add`` of a full-size fp16 input (an AddN), then an optional
    ``Relu`` / ``Relu6``: at least one step and no other, the chain in one pass per element, each step the same
    float32 operation (a multiplication and an addition are commutative in IEEE arithmetic, bit for bit); None
    otherwise (the step-by-step kernel runs). Worked out once per chain and layout."""
    ns = len(steps)
    # (one step too: a per-channel Mul, Sub or Add alone, BN's gradient x * scale and x - mean, is x * p + q with
    # q = -0 or p = 1, each exact, in one loop: 113 us against the step kernel's 140 for 512K values; not by one
    # value, where the step kernel is the faster)
    if ns < 1 or ns > 5:
        return None
    prog = _program(steps, len(src))
    if prog is None:
        return None
    steps = prog.tolist()

    def full16(k):
        return k >= 0 and src[k][0] == 0 and src[k][2] == 0

    def small(k):
        return k >= 0 and src[k][2] != 0

    x = p = q = z = None
    neg = False
    s = 0
    code, a, b = steps[0]
    if code == MUL:
        if full16(a) and small(b):
            x, p = a, b
        elif full16(b) and small(a):
            x, p = b, a
        else:
            return None
        s = 1
    if s < ns and steps[s][0] in (ADD, SUB):
        code, a, b = steps[s]
        run = (lambda k: k == -1) if x is not None else full16
        if run(a) and small(b):
            xk, q, neg = a, b, code == SUB
        elif code == ADD and run(b) and small(a):
            xk, q = b, a
        else:
            xk = None
        if xk is not None:
            x = x if x is not None else xk
            s += 1
    if x is None:
        return None
    mode = _kch.PLAIN
    if s + 1 < ns and steps[s][0] == CHAIN_ROUND16 and steps[s][1] == -1 and steps[s + 1] == [MUL, -1, -1]:
        mode, s = _kch.SQUARE, s + 2
    elif s < ns and steps[s][0] == ADD and -1 in steps[s][1:]:
        _, a, b = steps[s]
        other = b if a == -1 else a
        if full16(other):
            mode, z, s = _kch.PLUS, other, s + 1
    lo, hi = -_INF, _INF
    if s < ns and steps[s][0] in (CHAIN_RELU, CHAIN_RELU6) and steps[s][1] == -1:
        lo = np.float32(0.0)
        hi = np.float32(6.0) if steps[s][0] == CHAIN_RELU6 else _INF
        s += 1
    if s != ns:
        return None
    if ns == 1 and src[p if p is not None else q][2] != 1:
        return None   # a lone step by one value: the step kernel's loop is the faster (137 against 182 us for 512K)
    return x, p, q, neg, mode, z, lo, hi


def _affine_form(steps, src, h16, f32, blk, c):
    """The arguments of ``kernels/chain.affine_to_f16`` (x, p row, q row, mode, z, lo, hi) for the chain ``steps``
    on the inputs ``h16`` / ``f32`` laid out as ``src`` when :func:`_affine_plan` finds its form, else None."""
    plan = _affine_plan(tuple(steps), tuple(src))
    if plan is None:
        return None
    x, p, q, neg, mode, z, lo, hi = plan
    prow = _row(src, h16, f32, p, blk, c) if p is not None else np.full(blk, _ONE_F32)
    qrow = _row(src, h16, f32, q, blk, c, neg) if q is not None else np.full(blk, _NEG_ZERO)
    xb = h16[src[x][1]]
    return xb, prow, qrow, mode, (h16[src[z][1]] if z is not None else xb), lo, hi


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
    block = _trailing_block(inputs, shape)
    if block:
        c = math.prod(block)
    folded = _fold_prefix(inputs, steps, shape, c, block)
    if folded is None:
        return None
    if folded[1] is not steps:
        inputs, steps = folded
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
        elif x.ndim >= 1 and x.size == c and (x.shape[-1] == c or _squeezed(x.shape) == block):
            layout, flat, channel = 1, np.ascontiguousarray(bits).reshape(-1), True
        else:
            return None
        src.append((which, len(bucket), layout))
        bucket.append(_alloc.readonly(flat))   # one tuple type whatever the inputs' writeability
    if channel and c > _MAX_CHANNELS:
        return None
    blk = c * max(1, _BLOCK // c) if channel else _BLOCK
    out = _alloc.empty(n, np.uint16)
    affine = _affine_form(steps, src, h16, f32, blk, c)
    if affine is not None:
        # one pass per element (BN's Mul, AddV2, Relu; SquaredDifference; an AddN): the step-by-step kernel's
        # loops read and write a block once a step
        if _kch.affine_to_f16(*affine, out):
            return None
        return out.view(np.float16).reshape(shape)
    bad = _kch.chain_to_f16(_slots(h16, _EMPTY16), _slots(f32, _EMPTY32), np.array(src, np.int64), prog, c, blk,
                            out)
    if bad:
        return None
    return out.view(np.float16).reshape(shape)


# ------------------------------------------------------------------------------ float32, several outputs

#: steps of :func:`chain_f32` and their kernel codes (kernels/chain32.py): one IEEE float32 operation each
F32_STEP_CODES = {"add": ADD, "sub": SUB, "mul": MUL, "realdiv": REALDIV, "neg": CHAIN_NEG, "square": CHAIN_SQUARE,
                  "sqrt": CHAIN_SQRT}
F32_UNARY = frozenset(("neg", "square", "sqrt"))


@functools.lru_cache(maxsize=1024)
def _program32(steps: tuple, outputs: tuple, kinds: tuple):
    """The kernel's arrays for ``steps`` (see :func:`chain_f32`) whose inputs are of ``kinds`` (0 a single
    value, 1 full-size): (prog, fill, out_rows, rows, single values, each input's slot, each output's kind and
    slot), or None when a step is unknown
    or refers to a value not made yet. Rows are reused once their value is read for the last time (not the
    outputs'), and a step never writes a row it reads."""
    k_in = len(kinds)
    kind = list(kinds)
    last = {}
    for s, (name, a, b) in enumerate(steps):
        if name not in F32_STEP_CODES or not 0 <= a < k_in + s or (name not in F32_UNARY and not 0 <= b < k_in + s):
            return None
        last[a] = s
        if name not in F32_UNARY:
            last[b] = s
        kind.append(kind[a] | (0 if name in F32_UNARY else kind[b]))
    for o in outputs:
        if not 0 <= o < len(kind):
            return None
    keep = set(outputs)
    slot, free, nrows, nscal = {}, [], 0, 0
    fill = []
    for k in range(k_in):
        if kind[k]:
            slot[k] = nrows
            fill.append(nrows)
            nrows += 1
        else:
            slot[k] = nscal
            nscal += 1
    prog = []
    for s, (name, a, b) in enumerate(steps):
        v = k_in + s
        b = a if name in F32_UNARY else b
        if kind[v]:
            slot[v] = free.pop() if free else nrows
            nrows += slot[v] == nrows
        else:
            slot[v] = nscal
            nscal += 1
        prog.append((F32_STEP_CODES[name], kind[a], slot[a], kind[b], slot[b], kind[v], slot[v]))
        for u in {a, b}:
            if kind[u] and last.get(u) == s and u not in keep:
                free.append(slot[u])
    out_rows = [slot[o] for o in outputs if kind[o] and o >= k_in]
    return (np.array(prog, np.int64).reshape(-1, 7), np.array(fill, np.int64), np.array(out_rows, np.int64),
            max(nrows, 1), nscal, tuple(slot[k] for k in range(k_in)), tuple(kind[o] for o in outputs),
            tuple(slot[o] for o in outputs))


_EMPTY32W = np.zeros(0, np.float32)


def chain_f32(inputs, steps, outputs):
    """The values ``outputs`` of float32 ``steps`` on ``inputs`` in one pass, or None.

    Parameters
    ----------
    inputs : sequence of numpy.ndarray
        float32 arrays, each of shape () (one value) or of one common shape (full-size).
    steps : sequence of (str, int, int)
        ``(name, a, b)``: value ``len(inputs) + s`` is ``name(value a, value b)`` with ``name`` a key of
        :data:`F32_STEP_CODES`; values ``0 .. len(inputs) - 1`` are the inputs; ``b`` is ignored for the unary
        steps (neg, square, sqrt).
    outputs : sequence of int
        The values to return.

    Returns
    -------
    list of numpy.ndarray or None
        float32 arrays (an output that is an input is that input), the bits of numpy's float32 ufuncs applied
        step by step, every value finite (no status); None where that might differ from the ops one by one (an
        input of another dtype or shape, an Inf or NaN anywhere: overflow and its status are theirs).
    """
    shape = None
    kinds = []
    for x in inputs:
        if type(x) is not np.ndarray or x.dtype != _F32:
            return None
        if x.shape == ():
            kinds.append(0)
            continue
        if shape is None:
            shape = x.shape
        elif x.shape != shape:
            return None
        kinds.append(1)
    made = _program32(tuple(steps), tuple(outputs), tuple(kinds))
    if made is None:
        return None
    prog, fill, out_rows, nrows, nscal, in_slots, out_kinds, out_slots = made
    n = int(math.prod(shape)) if shape is not None else 0
    scal = np.zeros(max(nscal, 1), np.float32)
    full = []
    for x, k, at in zip(inputs, kinds, in_slots):
        if k:
            full.append(_alloc.readonly(np.ascontiguousarray(x).reshape(-1)))
        else:
            scal[at] = x[()]
    k_in = len(inputs)
    made_out = [_alloc.empty(n, np.float32) if k and o >= k_in else None
                for o, k in zip(outputs, out_kinds)]
    outs = [m for m in made_out if m is not None]
    if prog.shape[0]:
        bad = _kch32.chain_f32(_slots(full, _EMPTY32), fill, scal, prog, _slots(outs, _EMPTY32W), out_rows, n,
                               nrows, _kch32.BLOCK)
        if bad:
            return None
    result = []
    for o, m, k, at in zip(outputs, made_out, out_kinds, out_slots):
        if o < k_in:
            result.append(inputs[o])
        elif k:
            result.append(m.reshape(shape))
        else:
            result.append(np.array(scal[at], np.float32))
    return result


# ------------------------------------------------------------------------------ batch norm's input gradient, fp16

def _channel_values(v, c: int):
    """The distinct values of ``v`` (a per-channel operand: shape ending in ``c`` and ``c`` values, possibly a
    zero-stride view, or one value) as a flat fp16 or float32 array of ``c`` values or one; None if it is of another
    form or dtype."""
    if type(v) is not np.ndarray:
        if not isinstance(v, np.generic):
            return None
        v = np.asarray(v)
    if v.dtype != _F16 and v.dtype != _F32:
        return None
    cut = distinct_view(v)
    if cut.size == 1 or (cut.size == c and cut.ndim >= 1 and cut.shape[-1] == c):
        return cut.reshape(-1)
    return None


def bn_dx_f16(g, s, x, m, b, k_n, k, t):
    """Batch norm's fp16 input gradient ``AddN(Mul(g, s), t, _EltwiseChain(b, k_n, k, Sub(x, m)))`` (the chain
    ``RealDiv(b, k_n), Mul(k, .), Mul(., sub)``) as the four ops compute it one by one, in one pass
    (``kernels/chain16.bn_dx_to_f16``), or None.

    ``g`` and ``x`` are full-size fp16 arrays of one shape; ``s, m, b, t`` per-channel operands along the last axis
    (of ``c`` values, zero-stride views included) or single values, ``k_n`` and ``k`` single values, each float32 or
    fp16. Each op computes in fp16 (its float32 operands cast to fp16 on the way in, as the device inserts the casts):
    ``A = rn16(g * s16)``, ``S = rn16(x - m16)``, ``C = rn16(((b16 / n16) * k16) * S)`` (the chain's float32 steps,
    its per-channel prefix once per channel, one rounding), ``D = rn16((A + t16) + C)`` (AddN's float32 running sum
    in input order, one rounding). Returns ``D`` (fp16, the shape of ``g``) with the ops' bits and no status (every
    cast, step and rounding finite), or None wherever that might not hold (another form or dtype, a host without
    hardware fp16 conversions, an Inf or NaN anywhere, an fp16 overflow): the caller runs the ops one by one."""
    if not _kc.HW_HALF:
        return None
    if type(g) is not np.ndarray or type(x) is not np.ndarray or g.dtype != _F16 or x.dtype != _F16:
        return None
    shape = g.shape
    if x.shape != shape or not shape or 0 in g.strides or 0 in x.strides:
        return None
    c = shape[-1]
    n = int(math.prod(shape))
    if c < 1 or c > _MAX_CHANNELS or n == 0:
        return None
    vals = np.empty((6, c), _F32)
    for i, v in enumerate((s, m, b, t, k_n, k)):
        cut = _channel_values(v, c)
        if cut is None or (i >= 4 and cut.size != 1):
            return None
        vals[i] = cut       # (an fp16 operand widened: exact)
    with np.errstate(all="ignore"):
        # the device's inserted casts of the float32 operands to fp16 (nearest-even; an fp16 operand unchanged),
        # then the chain's per-channel prefix, each step one float32 operation (an Inf or NaN anywhere: the ops')
        h = vals.astype(_F16).astype(_F32)
        p = h[5] * (h[2] / h[4])
        if not (np.isfinite(h).all() and np.isfinite(p).all()):
            return None
    h[2] = p
    rows = np.tile(h[:4], (1, max(1, _BLOCK // c)))      # s, m, p, t as float32 rows of a block
    out = _alloc.empty(n, np.uint16)
    bad = _kch16.bn_dx_to_f16(np.ascontiguousarray(g).reshape(-1).view(np.uint16),
                              np.ascontiguousarray(x).reshape(-1).view(np.uint16), rows[0], rows[1], rows[2], rows[3],
                              out)
    if bad:
        return None
    return out.view(np.float16).reshape(shape)

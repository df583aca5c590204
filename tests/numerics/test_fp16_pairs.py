"""Every pair of fp16 operands (2**32) through the vector unit's add, mul and SquaredDifference kernels, in
both overflow modes, bit for bit against float64 oracles (an fp16 sum, difference or product is exact in
float64; numpy's float64 -> float16 cast rounds it once, correctly).

One walk over the pairs checks the three ops: per slice of pairs the float64 sums and products are computed
and rounded once; the differences fp16(a - b) are the sums fp16(a + (-b)) of the same slice (IEEE defines
a - b as a + (-b), and -b is the pattern b ^ 0x8000, so they are the sums' columns permuted); and
SquaredDifference, fp16(d * d) after d = fp16(a - b), depends on the pair only through d, whose 65,536
patterns are squared once in float64 (exact, then one rounding) into a table. The kernels' outputs are
compared with these oracles through the tables below (the saturation of naive.py; any NaN equals any NaN).
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import naive
from ascend_emu.kernels import vector as kv
from ascend_emu.kernels.cast import HW_HALF

N_CHUNKS = 64
A_PER_SLICE = 256
ALL16 = np.arange(65536, dtype=np.uint16)


def _tables():
    """Per fp16 pattern p: SAT[p] its saturation (naive.saturate_bits: Inf -> max, NaN -> +0), SQ[p] =
    fp16(p * p) and SQ_SAT[p] = SAT[fp16(SAT[p] * SAT[p])] (the saturation mode's vmul of the saturated
    d), both squared in float64; NONFINITE_SQ[p] = p or SQ[p] is Inf/NaN (the kernel's status)."""
    val = naive.TABLES["float16"]["val64"]
    sat = naive.saturate_bits(ALL16, "float16")
    with np.errstate(all="ignore"):
        sq = (val * val).astype(np.float16).view(np.uint16)
        sq_sat = naive.saturate_bits((val[sat] * val[sat]).astype(np.float16).view(np.uint16), "float16")
    nonfinite = ((ALL16 & 0x7FFF) >= 0x7C00) | ((sq & 0x7FFF) >= 0x7C00)
    return sat, sq, sq_sat, nonfinite.astype(np.uint8)


SAT, SQ, SQ_SAT, NONFINITE_SQ = _tables()
IDENTITY = ALL16.copy()
NONFINITE = ((ALL16 & 0x7FFF) >= 0x7C00).astype(np.uint8)


@njit(cache=True)
def _source(i, negate_b):
    """Index into a slice's row-major (a, b) oracle of pair i, or of the pair (a, -b) when negate_b."""
    return i ^ 0x8000 if negate_b else i


@njit(cache=True)
def _mismatches(out, want, negate_b, table):
    """(count, first i) of out[i] != table[want[_source(i)]], NaN equal to NaN."""
    count = 0
    for i in range(out.size):     # no branch: LLVM vectorises the count
        g = np.int32(out[i])
        w = np.int32(table[want[_source(i, negate_b)]])
        count += np.int64((g != w) & (((g & 0x7FFF) <= 0x7C00) | ((w & 0x7FFF) <= 0x7C00)))
    for i in range(out.size if count else 0):
        g = np.int32(out[i])
        w = np.int32(table[want[_source(i, negate_b)]])
        if (g != w) & (((g & 0x7FFF) <= 0x7C00) | ((w & 0x7FFF) <= 0x7C00)):
            return count, i
    return count, -1


@njit(cache=True)
def _any_flagged(want, flag):
    """Whether flag[want[i]] != 0 for some i (a permutation of the columns changes nothing)."""
    acc = np.uint8(0)
    for i in range(want.size):
        acc |= flag[want[i]]
    return acc != 0


def _slices(chunk):
    """Chunk ``chunk`` of all fp16 pairs, a slice at a time: ``(start, a, b, add, mul)`` with ``a`` the
    patterns from ``start`` each repeated 65,536 times, ``b`` every pattern as often, and the oracles
    fp16(a + b), fp16(a * b) of the pairs in that order."""
    b = np.tile(ALL16, A_PER_SLICE)
    val = naive.TABLES["float16"]["val64"]
    per_chunk = 65536 // N_CHUNKS
    for start in range(chunk * per_chunk, (chunk + 1) * per_chunk, A_PER_SLICE):
        av = np.arange(start, start + A_PER_SLICE, dtype=np.uint16)
        with np.errstate(all="ignore"):
            add = (val[av][:, None] + val[None, :]).astype(np.float16).view(np.uint16).ravel()
            mul = (val[av][:, None] * val[None, :]).astype(np.float16).view(np.uint16).ravel()
        yield start, np.repeat(av, 65536), b, add, mul


def _kernels(code, a, b, out, overflow):
    """The software kernel, and the hardware-conversion one vector() takes on HW_HALF hosts."""
    yield "binary16", lambda: kv.binary16(code, a, b, out, False, overflow, 0, True)
    if HW_HALF:
        yield "arith_f16_hw", lambda: kv.arith_f16_hw(code, a, b, out, overflow, 0)


@pytest.mark.exhaustive
@pytest.mark.parametrize("chunk", range(N_CHUNKS))
def test_fp16_every_pair(chunk):
    """add, mul and squared_difference (fp16(d * d), d = fp16(a - b), d saturated first in saturation
    mode: two rounded instructions) on every pair, both overflow modes, both kernels; status too."""
    out = np.empty(A_PER_SLICE * 65536, dtype=np.uint16)
    for start, a, b, add, mul in _slices(chunk):
        ops = [("add", kv.ADD, add, False, (IDENTITY, SAT), NONFINITE),
               ("mul", kv.MUL, mul, False, (IDENTITY, SAT), NONFINITE),
               ("squared_difference", kv.SQUARED_DIFFERENCE, add, True, (SQ, SQ_SAT), NONFINITE_SQ)]
        for op, code, want, negate_b, tables, flag in ops:
            status = _any_flagged(want, flag)
            for overflow, table in enumerate(tables):
                for name, kernel in _kernels(code, a, b, out, overflow):
                    st = kernel()
                    count, first = _mismatches(out, want, negate_b, table)
                    where = f"{op} overflow={overflow} {name}"
                    assert count == 0, (f"{where}: {count} mismatches, the first at a={a[first]:#06x} "
                                        f"b={b[first]:#06x}: got {out[first]:#06x} want "
                                        f"{table[want[_source(first, negate_b)]]:#06x}")
                    assert bool(st) == status, f"{where} a={start}..: status {st}"

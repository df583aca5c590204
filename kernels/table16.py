"""16-bit unary ops as a table lookup: a unary op of a 16-bit format has only 65,536 inputs.

``unary16_table`` runs the vector kernel (:func:`.vector.unary16`'s span, the same code and
parameters) once on every bit pattern and packs each input's result and status into one
``uint32`` entry, ``status << 16 | bits`` (statuses are at most 0x121). ``gather16`` then
applies it: out[i] = entry & 0xFFFF, and the OR of the entries' statuses, at memory speed.
Because every entry is the span's own result for that input, and the span's status is the OR
of its per-element statuses, the gather returns what the span returns, bit for bit
(tests/numerics/test_table16.py checks every pattern of every variant).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .parallel import or_all
from .vector import _unary16_span

_CHUNK = 1 << 16


@njit(cache=True)
def unary16_table(op, bf16, overflow, subnormal, use64, alpha):
    """t[b] = status(op(b)) << 16 | round16(op(b)) for every 16-bit pattern b, by the span kernel."""
    x = np.arange(65536).astype(np.uint16)
    out = np.empty(65536, dtype=np.uint16)
    t = np.empty(65536, dtype=np.uint32)
    for b in range(65536):
        s = _unary16_span(op, x[b:b + 1], out[b:b + 1], bf16, overflow, subnormal, use64, alpha)
        t[b] = np.uint32((np.int64(s) << 16) | np.int64(out[b]))
    return t


@njit(cache=True)
def _gather16_span(table, x, out):
    """out[i] = table[x[i]] & 0xFFFF; returns the OR of table[x[i]] >> 16."""
    acc = np.uint32(0)
    for i in range(out.size):
        e = table[x[i]]
        out[i] = np.uint16(e & np.uint32(0xFFFF))
        acc |= e
    return np.int64(acc >> np.uint32(16))


@njit(cache=True, parallel=True)
def gather16(table, x, out):
    """out = table[x] & 0xFFFF over flat uint16 arrays; returns the OR of the entries' statuses (>> 16)."""
    n = out.size
    nch = (n + _CHUNK - 1) // _CHUNK
    st = np.zeros(nch, dtype=np.int64)
    for c in prange(nch):
        lo = c * _CHUNK
        hi = min(n, lo + _CHUNK)
        st[c] = _gather16_span(table, x[lo:hi], out[lo:hi])
    return or_all(st)

"""16-bit unary vector ops through a lookup table of all 65,536 inputs.

A unary op on fp16 or bf16 data has only 65,536 possible inputs. The first time a variant (op
code, format, overflow and subnormal codes, float64 or float32 evaluation, its constant) has
seen that many elements, its table is built by the vector kernel itself on every bit pattern
(``kernels/table16.py``), and from then on the op is a gather of memory speed. The results and
the status are the kernel's own, bit for bit (tests/numerics/test_table16.py compares every
pattern of every variant). Tables live in this process only (256 KiB each, the most recently
used ``MAX_TABLES`` kept); nothing is written to disk.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ..kernels import table16 as _kt
from ..kernels import vector as _kv

#: tables kept at once (256 KiB each)
MAX_TABLES = 64
_tables: OrderedDict = OrderedDict()
_seen: dict = {}
_lock = threading.Lock()


def _key(code, bf16, overflow, subnormal, use64, alpha):
    # alpha by its bits: -0.0 and 0.0 are different constants (x * alpha keeps the sign)
    return (int(code), bool(bf16), int(overflow), int(subnormal), bool(use64),
            int(np.float64(alpha).view(np.int64)))


def table(code, bf16, overflow, subnormal, use64, alpha) -> np.ndarray:
    """The variant's table (``status << 16 | bits`` per input pattern), built now if not cached."""
    key = _key(code, bf16, overflow, subnormal, use64, alpha)
    with _lock:
        t = _tables.get(key)
        if t is not None:
            _tables.move_to_end(key)
            return t
    t = _kt.unary16_table(key[0], key[1], key[2], key[3], key[4], float(alpha))
    with _lock:
        _tables[key] = t
        _seen.pop(key, None)
        while len(_tables) > MAX_TABLES:
            _tables.popitem(last=False)
    return t


def unary16(code, x, out, bf16, overflow, subnormal, use64, alpha) -> int:
    """``out = op(x)`` over flat uint16 arrays, as ``kernels.vector.unary16`` computes it; returns the
    OR of the statuses. Direct kernel until the variant has seen 65,536 elements, then the table."""
    key = _key(code, bf16, overflow, subnormal, use64, alpha)
    with _lock:
        cached = key in _tables
        if not cached:
            seen = _seen.get(key, 0) + x.size
            _seen[key] = seen
    if cached or seen >= 65536:
        return int(_kt.gather16(table(code, bf16, overflow, subnormal, use64, alpha), x, out))
    return int(_kv.unary16(code, x, out, bf16, overflow, subnormal, use64, alpha))


def clear() -> None:
    """Forget every table and count (tests; a table is rebuilt on demand)."""
    with _lock:
        _tables.clear()
        _seen.clear()

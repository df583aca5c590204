"""The AI Core float status register, as NPUAllocFloatStatus / NPUGetFloatStatus /
NPUClearFloatStatus expose it: sticky bits that every kernel ORs its status into."""
from __future__ import annotations

import numpy as np

from .policy import STATUS_BITS


def decode_status(bits: int) -> list[str]:
    """Names of the status bits set in ``bits`` (unknown bits are shown in hex)."""
    bits = int(bits)
    out = [f"0x{b:x} {name}" for b, name in STATUS_BITS.items() if bits & b]
    rest = bits & ~sum(STATUS_BITS)
    if rest:
        out.append(f"0x{rest:x} unknown")
    return out


class FloatStatus:
    """A sticky float status register.

    ``record(bits)`` ORs a kernel's status in; ``get()`` reads it without clearing
    (like NPUGetFloatStatus); ``clear()`` resets it (NPUClearFloatStatus);
    ``tensor()`` gives the (8,) float32 tensor NPUGetFloatStatus fills, where any
    non-zero element means an overflow happened since the last clear.
    """

    def __init__(self, bits: int = 0):
        self._bits = int(bits)

    def record(self, bits: int) -> int:
        self._bits |= int(bits)
        return self._bits

    def get(self) -> int:
        return self._bits

    def clear(self) -> None:
        self._bits = 0

    def tensor(self) -> np.ndarray:
        t = np.zeros(8, dtype=np.float32)
        t[0] = float(self._bits)
        return t

    def decode(self) -> list[str]:
        return decode_status(self._bits)

    @property
    def overflow(self) -> bool:
        return self._bits != 0

    def __bool__(self) -> bool:
        return self.overflow

    def __int__(self) -> int:
        return self._bits

    def __repr__(self) -> str:
        return f"FloatStatus(0x{self._bits:x}{': ' + '; '.join(self.decode()) if self._bits else ''})"

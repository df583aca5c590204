"""Codes of the Ascend 950's 8- and 4-bit formats: :func:`encode` rounds float32, float16 or bfloat16 values as
the 950's vector Cast does, :func:`decode` widens codes exactly to float32, :func:`cast_low` is ``ascend_emu.cast``
to and from them (NUMERICS.md section 14; kernels in ``kernels/lowfloat.py``). The public face, with the cube
and MX functions, is :mod:`ascend_emu.numerics.lowfloat`; this module stays below the cube so that the vector
unit's cast can import it.
"""
from __future__ import annotations

import numpy as np

from . import policy as config
from ..errors import AscendEmuError
from ..kernels import cast as _kc
from ..kernels import lowfloat as _kl

LOW_FORMATS = tuple(config.LOW_FORMATS)
_TABLES: dict = {}
_HYBRID_COMPARE = (">=", ">")
#: codes decoded at a time (bounds decode's intp index temporary to 8 MB)
_DECODE_CHUNK = 1 << 20


def low_format(fmt) -> config.LowFormat:
    """The row of ``config.LOW_FORMATS`` named ``fmt`` (one-line error otherwise)."""
    try:
        return config.LOW_FORMATS[fmt]
    except (KeyError, TypeError):
        raise AscendEmuError(f"unknown low-precision format {fmt!r}; choose one of: {', '.join(LOW_FORMATS)}") from None


def _table(f: config.LowFormat) -> np.ndarray:
    t = _TABLES.get(f.name)
    if t is None:
        t = _TABLES[f.name] = _kl.decode_table(f.code)
    return t


def _source(x, what: str):
    """(array, name) of a float32 / float16 / bfloat16 input."""
    a = np.asarray(x)
    if a.dtype == config.bfloat16:
        return a, "bfloat16"
    if a.dtype in (config.float32, config.float16):
        return a, a.dtype.name
    raise AscendEmuError(f"{what} must be float32, float16 or bfloat16 (ml_dtypes), got dtype {a.dtype}; "
                         "cast it to float32 with ascend_emu.cast first")


def _f32_bits(a: np.ndarray, src: str) -> np.ndarray:
    """float32 bits of a float32 / float16 / bfloat16 array, exactly (flat, contiguous)."""
    if src == "float32":
        return np.ascontiguousarray(a).reshape(-1).view(np.uint32)
    if src == "bfloat16":
        return np.ascontiguousarray(a).reshape(-1).view(np.uint16).astype(np.uint32) << np.uint32(16)
    return np.ascontiguousarray(a).reshape(-1).astype(np.float32).view(np.uint32)


def _via_bf16(bits: np.ndarray, rc: int) -> tuple:
    """(float32 bits of the bfloat16 values, status) of float32 bits rounded to bfloat16 with rounding ``rc``:
    the first of the 950's two conversions to FP4 (only bfloat16 converts to FP4). A finite value past bfloat16's
    range becomes +-bfloat16 max, so that the FP4 step clamps it as a finite overflow (status 0x100)."""
    out = np.empty(bits.size, dtype=np.uint16)
    st = _kc.cast_f32_to_16(bits, out, True, rc, config.OVERFLOW_MODES["inf_nan"], config.SUBNORMAL_MODES["keep"])
    over = ((out & 0x7FFF) == 0x7F80) & ((bits & 0x7F800000) != 0x7F800000)
    out[over] = (out[over] & 0x8000) | 0x7F7F
    return out.astype(np.uint32) << np.uint32(16), int(st) & ~config.STATUS_FP_OVERFLOW


def encode(x, fmt, rounding=None, overflow_mode="saturation", keep_nan=False, hybrid_compare=">="):
    """Round ``x`` to the low-precision format ``fmt`` as the 950's Cast does.

    Parameters
    ----------
    x : array_like of float32, float16 or bfloat16 (ml_dtypes)
    fmt : one of :data:`LOW_FORMATS`
    rounding : str or None
        None: the format's default (hifloat8 ``round``, FP8 and FP4 ``rint``, E8M0 ``trunc``). hifloat8 takes
        ``round`` (half away from zero) or ``hybrid``; FP8 ``rint``; FP4 ``rint``, ``round``, ``floor``,
        ``ceil``, ``trunc``; E8M0 ``trunc`` (floor of log2|x|) or ``ceil``.
    overflow_mode : {"saturation", "inf_nan"}
        saturation: Inf and overflow -> +-max, NaN -> 0; inf_nan: Inf / NaN kept, E4M3FN overflow -> NaN.
        FP4 always clamps (NaN -> 0); E8M0 always gives 0xFE for Inf and overflow, 0xFF for NaN.
    keep_nan : bool
        FP8 only: CTRL[50], a NaN stays NaN under saturation.
    hybrid_compare : {">=", ">"}
        hifloat8 ``hybrid``: the published pseudocode rounds up when frac >= thr; ``">"`` is the alternative
        reading (NUMERICS.md section 14).

    Returns
    -------
    (numpy.ndarray of uint8, int)
        The codes (same shape) and the status bits: 0x100 a finite value overflowed, 0x20 an input was Inf/NaN.
    """
    f = low_format(fmt)
    a, src = _source(x, "encode input")
    rounding = f.rounding if rounding is None else rounding
    if rounding not in f.roundings:
        raise AscendEmuError(f"{f.name} takes rounding {', '.join(f.roundings)}; got {rounding!r}")
    rc = config.LOW_ROUNDING_MODES[rounding]
    oc = config.overflow_code(overflow_mode)
    if keep_nan and not f.keep_nan:
        raise AscendEmuError(f"keep_nan applies to the FP8 formats only (CTRL[50]), not to {f.name}")
    if hybrid_compare not in _HYBRID_COMPARE:
        raise AscendEmuError(f"unknown hybrid_compare {hybrid_compare!r}; choose one of: {', '.join(_HYBRID_COMPARE)}")
    strict = hybrid_compare == ">"
    out = np.empty(a.size, dtype=np.uint8)
    if f.code == _kl.HIF8 and src == "float16":
        st = _kl.encode_hif8_f16(np.ascontiguousarray(a).reshape(-1).view(np.uint16), out, rc, oc, strict)
        return out.reshape(a.shape), int(st)
    bits = _f32_bits(a, src)
    st0 = 0
    if f.bits == 4 and src != "bfloat16":
        bits, st0 = _via_bf16(bits, rc)
    st = _kl.encode_f32(bits, out, f.code, rc, oc, bool(keep_nan), strict)
    return out.reshape(a.shape), int(st) | st0


def decode(codes, fmt) -> np.ndarray:
    """The float32 values of ``codes`` (uint8 codes of ``fmt``; FP4 codes 0..15), exactly."""
    f = low_format(fmt)
    c = np.asarray(codes)
    if c.dtype.kind not in "iu":
        raise AscendEmuError(f"{f.name} codes must be an integer array (uint8 codes), got dtype {c.dtype}")
    limit = 1 << f.bits
    if c.size and (c.min() < 0 or c.max() >= limit):
        raise AscendEmuError(f"{f.name} codes must lie in 0..{limit - 1}, got {int(c.min())}..{int(c.max())}")
    table = _table(f)
    if c.size <= _DECODE_CHUNK:
        return table[c]
    # in chunks: indexing converts the index array to intp (8 bytes a code); a chunk's worth at a time only
    out = np.empty(c.shape, dtype=table.dtype)
    flat_in = c.reshape(-1)             # (a view of a contiguous array; a strided one is copied once, 1 byte a code)
    flat_out = out.reshape(-1)
    for i in range(0, c.size, _DECODE_CHUNK):
        flat_out[i:i + _DECODE_CHUNK] = table[flat_in[i:i + _DECODE_CHUNK]]
    return out


#: what ``ascend_emu.cast`` hands to :func:`cast_low`: the format names, and ml_dtypes' dtypes and types
LOW_DTYPES = {np.dtype(f.dtype): f.name for f in config.LOW_FORMATS.values() if f.dtype is not None}
CAST_KEYS = frozenset(LOW_FORMATS) | frozenset(LOW_DTYPES) | frozenset(
    f.dtype for f in config.LOW_FORMATS.values() if f.dtype is not None)
_WIDE = ("float32", "float64", "float16", "bfloat16")


def _is_same(dtype, f: config.LowFormat) -> bool:
    try:
        return dtype == f.name or (not isinstance(dtype, str) and LOW_DTYPES.get(np.dtype(dtype)) == f.name)
    except TypeError:
        return False


def cast_low(x, dtype, rounding, overflow_mode, subnormals, source, keep_nan):
    """``ascend_emu.cast`` to or from a low-precision format (its docstring says how)."""
    if subnormals != "keep":
        raise AscendEmuError("subnormals='flush' applies to float16/bfloat16/float32 casts, not to "
                             f"{source or dtype!r}")
    if not isinstance(keep_nan, (bool, int, np.bool_, np.integer)) or keep_nan not in (True, False):
        raise AscendEmuError(f"keep_nan must be True or False, got {keep_nan!r}")
    a = np.asarray(x)
    src_name = source if source is not None else LOW_DTYPES.get(a.dtype)
    if src_name is not None:
        f = low_format(src_name)
        # widening is exact: a rounding, an overflow mode or keep_nan changes nothing, and a bogus one is refused
        config.overflow_code(overflow_mode)
        if rounding is not None and rounding not in config.LOW_ROUNDING_MODES:
            raise AscendEmuError(f"unknown rounding {rounding!r}; choose one of: "
                                 f"{', '.join(config.LOW_ROUNDING_MODES)} (widening {f.name} is exact: it takes none)")
        if keep_nan:
            raise AscendEmuError(f"keep_nan applies to casts to the FP8 formats (CTRL[50]), not to widening {f.name}")
        try:
            dst = config.dtype_name(dtype)
        except AscendEmuError:
            dst = None
        if source is None and _is_same(dtype, f):
            return a.copy(), 0                         # to its own dtype: an unchanged copy, as the other casts
        wide = [w for w in _WIDE if not (w == "float16" and f.name == "float8_e8m0")]   # 2^-127 is no float16
        if dst not in wide:
            raise AscendEmuError(f"{f.name} widens exactly to {', '.join(wide)}; got {dtype!r}")
        if a.dtype in LOW_DTYPES:
            if LOW_DTYPES[a.dtype] != f.name:
                raise AscendEmuError(f"source={f.name!r} but the input's dtype is {a.dtype}")
            a = a.view(np.uint8)
        v = decode(a, f.name)
        return (v if dst == "float32" else v.astype(config.bfloat16 if dst == "bfloat16" else dst)), 0
    name = dtype if isinstance(dtype, str) else LOW_DTYPES[np.dtype(dtype)]
    f = low_format(name)
    if a.dtype not in (config.float32, config.float16, config.bfloat16):
        raise AscendEmuError(f"a cast to {f.name} takes float32, float16 or bfloat16 values, got dtype {a.dtype}; "
                             "cast to float32 first")
    codes, st = encode(a, f.name, rounding, overflow_mode, keep_nan)
    if isinstance(dtype, str):
        return codes, st
    return codes.view(f.dtype), st


__all__ = ["CAST_KEYS", "LOW_DTYPES", "LOW_FORMATS", "cast_low", "decode", "encode", "low_format"]

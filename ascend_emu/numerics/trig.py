"""Sin and Cos on the vector unit, as CANN's kernels compute them (NUMERICS.md section 2, "Sourced kernels:
Sin and Cos"; the kernels and their sources: ``kernels/trig.py``).

``op_model`` picks the kernel: ``tbe_v100`` / ``tbe_v220`` the TBE kernels the Ascend910 / Ascend910B run
(range reduction by a rounded multiple of pi or 2 pi, a Taylor polynomial, every step a float32 operation);
``ascendc`` the Ascend950's Ascend C kernels (hicann/ops-math math/sin/op_kernel/arch35/sin_dag.h,
math/cos/op_kernel/arch35/cos_dag.h: CAST_NONE to float32, ``Simt::Sin`` / ``Simt::Cos``, CAST_RINT back; the
SIMT functions' algorithms are not published, so they are modelled as the correctly rounded float32 sin / cos); ``exact`` the float64 sin/cos rounded once to the compute dtype.
A 16-bit input's 65,536 results are computed once per variant and gathered (``trig16_table``).
"""
from __future__ import annotations

import threading

import numpy as np

from . import policy as config
from ..errors import AscendEmuError
from ..kernels import codes as _codes
from ..kernels import trig as _kt

_CODES = {("sin", True): _codes.SIN_TBE, ("cos", True): _codes.COS_TBE,
          ("sin", False): _codes.SIN_F64, ("cos", False): _codes.COS_F64}
_tables: dict = {}
_lock = threading.Lock()


def _table(code, bf16, oc, sc) -> np.ndarray:
    key = (code, bf16, oc, sc)
    with _lock:
        t = _tables.get(key)
    if t is None:
        t = _kt.trig16_table(code, bf16, oc, sc)
        with _lock:
            _tables[key] = t
    return t


def trig(op: str, x, dtype="float16", overflow_mode: str = "inf_nan", subnormals: str = "keep",
         op_model: str = "tbe_v220"):
    """``op`` ("sin" or "cos") of ``x`` in the compute dtype ``dtype``, as ``op_model``'s kernel computes it.

    Returns ``(y, status)``: the result in ``dtype`` and status 0x20 if a step or the result was Inf/NaN
    (a NaN or infinite input gives NaN). Inputs of another float dtype are cast to ``dtype`` first (rint).
    """
    from .vector import cast

    if op not in ("sin", "cos"):
        raise AscendEmuError(f"unknown trig op {op!r}; choose sin or cos")
    if op_model not in config.OP_MODELS:
        raise AscendEmuError(f"unknown op_model {op_model!r}; choose one of: {', '.join(config.OP_MODELS)}")
    cdt = config.compute_dtype(dtype)
    name = "bfloat16" if cdt == config.bfloat16 else cdt.name
    oc, sc = config.overflow_code(overflow_mode), config.subnormal_code(subnormals)
    x = np.asarray(x)
    status = 0
    if x.dtype != cdt:
        if x.dtype.kind not in "fiub" and x.dtype != config.bfloat16:
            raise AscendEmuError(f"{op}: input dtype {x.dtype} is not a real number type")
        x, status = cast(x.astype(np.float64) if x.dtype.kind in "iub" else x, name, "rint", overflow_mode,
                         subnormals)
    if op_model == "exact":
        x64 = cast(x, "float64", subnormals=subnormals)[0]
        with np.errstate(invalid="ignore"):
            y64 = (np.sin if op == "sin" else np.cos)(x64)
        y, st = cast(y64, name, "rint", overflow_mode, subnormals)
        bad = config.STATUS_FP_OVERFLOW if not np.isfinite(y64).all() else 0
        return y, status | (st & config.STATUS_FP_OVERFLOW) | bad
    code = _CODES[(op, op_model.startswith("tbe"))]
    flat = np.ascontiguousarray(x).reshape(-1)
    if cdt == config.float32:
        out = np.empty(flat.size, dtype=np.float32)
        st = _kt.trig_f32(code, flat, out, oc, sc)
        y = out.reshape(x.shape)
    else:
        t = _table(code, cdt == config.bfloat16, oc, sc)
        e = t[flat.view(np.uint16)]
        st = int(np.bitwise_or.reduce(e >> np.uint32(16))) if e.size else 0
        y = (e & np.uint32(0xFFFF)).astype(np.uint16).view(cdt).reshape(x.shape)
    return y, status | (config.STATUS_FP_OVERFLOW if st else 0)

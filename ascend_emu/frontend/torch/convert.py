"""torch tensors <-> numpy arrays for the emulated kernels, bit for bit (bfloat16 through ml_dtypes)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

from ...errors import AscendEmuError

#: torch float dtype -> the numpy dtype the kernels take
_TO_NP = {torch.float16: np.dtype(np.float16), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
          torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_FROM_NP = {v.name: k for k, v in _TO_NP.items()}
#: the float dtypes the emulated units compute in (float64 has no AI Core kernel: it runs on the AI CPU)
EMULATED = (torch.float16, torch.bfloat16, torch.float32)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"`` (the registry's names)."""
    return str(dtype).replace("torch.", "")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _FROM_NP[name] if name in _FROM_NP else getattr(torch, name)
    except AttributeError:
        raise AscendEmuError(f"unknown dtype {name!r}") from None


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """The values of CPU tensor ``t`` as a numpy array of the same dtype (bfloat16 as ml_dtypes')."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t.numpy()


def from_numpy(a, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new CPU tensor holding array ``a`` (bit for bit); ``dtype`` the torch dtype to convert to exactly
    (a widening, or the same dtype)."""
    a = np.asarray(a)
    if not (a.flags.c_contiguous and a.flags.writeable) or a.dtype.byteorder == ">":
        a = np.array(a, copy=True, order="C")
    # the kernels' outputs are fresh arrays (the launcher copies one that shares an input's memory), so the tensor
    # takes the array as it is; the tensor keeps it alive, which keeps the kernels' buffer pool off it
    if a.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a)
    return t if dtype is None or t.dtype == dtype else t.to(dtype)

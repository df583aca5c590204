"""Run one ``Aten<Op>`` node of an exported program with torch: the AI CPU (and host) of ``.pt2`` models.

The node keeps its aten overload and its arguments with each tensor replaced by its place among the node's
inputs (:class:`.loader._Arg`). On the AI CPU (``aten_engine`` ``AICPU``) the replay hands it float32 inputs
(it widens 16-bit ones), torch computes in float32 and the float outputs are rounded to the dtypes the program
gives them, as the eager door's AI CPU does; the host's data movement and an exact AI Core op run in the dtypes
they are given.
"""
from __future__ import annotations

import numpy as np
import torch

from ....errors import AscendEmuError
from ..convert import from_numpy, to_numpy, torch_dtype


def resolve(name: str):
    """``"aten.cos.default"`` -> ``torch.ops.aten.cos.default`` (aten names only)."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten" or not all(p.isidentifier() for p in parts):
        raise AscendEmuError(f"{name!r} is not an aten op")
    try:
        return getattr(getattr(torch.ops.aten, parts[1]), parts[2])
    except AttributeError:
        raise AscendEmuError(f"this torch ({torch.__version__}) has no op {name}; export the model with it") \
            from None


def _fill(x, tensors):
    from .loader import _Arg

    if isinstance(x, _Arg):
        return tensors[x.i]
    if isinstance(x, (list, tuple)):
        return type(x)(_fill(v, tensors) for v in x)
    if isinstance(x, dict):
        return {k: _fill(v, tensors) for k, v in x.items()}
    return x


def run_aten_node(node, input_arrays) -> list:
    """Execute ``Aten<Op>`` node ``node`` on ``input_arrays``; returns its ``num_outputs`` arrays."""
    func = resolve(node.meta["aten"])
    tensors = [from_numpy(np.asarray(a)) for a in input_arrays]
    args, kwargs = node.meta["aten_args"]
    try:
        with torch.no_grad():
            out = func(*_fill(args, tensors), **_fill(kwargs, tensors))
    except Exception as e:
        line = str(e).strip().splitlines()
        raise AscendEmuError(f"torch failed on op {node.name} ({node.meta['aten']}): "
                             f"{(line[0] if line else type(e).__name__)[:300]}") from None
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if node.meta.get("aten_outputs") is not None:
        outs = [outs[i] for i in node.meta["aten_outputs"]]
    if node.meta.get("aten_engine") == "AICPU":
        outs = [o.to(torch_dtype(d)) if o.dtype.is_floating_point and torch_dtype(d).is_floating_point else o
                for o, d in zip(outs, node.meta["aten_dtypes"])]
    return [np.array(to_numpy(o.contiguous())) for o in outs]

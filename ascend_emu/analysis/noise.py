"""Rounding noise: a compared tensor whose exact value is 0 and whose two sides hold only float32 rounding.

A sum can be zero in exact arithmetic and not in float32: a convolution's bias gradient in front of a batch norm
(the normalisation cancels the bias, so every channel of the gradient reaching it sums to 0), the sum of a centred
tensor, ``a - a`` computed two ways. Each side then holds its own rounding of the cancelled terms, values near
``eps x the terms``, and their cosine is a number between -1 and 1 that says nothing about either: the pair fails
the accuracy rule and, its inputs passing, would be named the first divergent op.

:func:`rounding_noise` recognises it, for ops whose output is an **additive** reduction of an input (a sum of n of
its elements, or of n inputs), never for products: a product's absolute error scales with both operands, so a tiny
product (``x * 1e-10``) is small and exact, not noise. The rule is a bound, not a guess at the summation order:
a float32 sum of n terms of magnitude at most m rounds partial sums no larger than n m, so an order of summation
adds at most about n eps (n m) of error in the worst case and its first rounding alone can be n m eps / 2. When both
sides' largest magnitude is at most ``n x eps x m`` (eps of the bench dtype, m the input's largest magnitude from the
NPU dump's statistics of the producer), both are within one such rounding of 0, the exact value is 0 to within what
float32 can resolve, and no comparison of the two is informative. What is reported: the row keeps its Result (the
metric rule's), its message says why, and :meth:`Comparison.first_divergent` passes the op over (its consumers read
a failing tensor, so they are passed over too). NUMERICS.md section 7.

No TensorFlow here.
"""
from __future__ import annotations

import math

import numpy as np

from ..graph.core import split_tensor_name
from .dump import Dump

#: op types whose every output is a sum of all their inputs' elements at one position (elementwise): the number of
#: terms is the number of inputs
ELEMENTWISE_SUMS = frozenset({"Add", "AddV2", "Sub", "BiasAdd", "AddN"})
#: op types (and output index) whose output is a sum over axes of input 0: the number of terms is the input's
#: size over the output's; a mean divides that sum by the same number, and so its rounding
REDUCTIONS = {"BiasAddGrad": (0, "sum"), "Sum": (0, "sum"), "ReduceSum": (0, "sum"), "ReduceSumD": (0, "sum"),
              "Mean": (0, "mean"), "ReduceMean": (0, "mean"), "ReduceMeanD": (0, "mean"),
              # the batch norm's offset gradient is sum(dy) per channel (its scale gradient is a product: not here)
              "FusedBatchNormGrad": (2, "sum"), "FusedBatchNormGradV2": (2, "sum"),
              "FusedBatchNormGradV3": (2, "sum")}
#: torch's convolution_backward is one record (its main op's type, Conv2DBackpropFilter ...): its 1-D output is the
#: bias gradient, dy summed over every axis but the channels
CONV_BACKWARD_ATEN = "aten.convolution_backward.default"


def _size(shape) -> int:
    return int(np.prod([int(s) for s in shape], dtype=np.int64)) if shape is not None else 0


def _producer(npu: Dump, ref: str) -> dict | None:
    """The NPU dump's output record of tensor ``ref`` (``name:index``), or None."""
    name, k = split_tensor_name(ref)
    if name not in npu:
        return None
    outs = npu.op(name)["outputs"]
    return outs[k] if k < len(outs) else None


def _max_abs(out: dict) -> float | None:
    """The largest magnitude of a dumped tensor, from its statistics (finite, or None)."""
    vals = [out.get("max"), out.get("min")]
    if any(v is None or not isinstance(v, (int, float)) or not math.isfinite(v) for v in vals):
        return None
    return max(abs(float(v)) for v in vals)


def additive_terms(npu: Dump, op: dict, k: int) -> tuple[int, str, list[str]] | None:
    """How output ``k`` of ``op`` (an NPU dump record) adds: ``(n terms, "sum" | "mean", the input tensors the terms
    come from)``, or None when it is not an additive reduction (products, moves, anything else)."""
    t = op.get("tf_type")
    ins = list(op.get("inputs") or [])
    outs = op.get("outputs") or []
    if k >= len(outs) or not ins:
        return None
    out_size = _size(outs[k].get("shape"))
    if t in ELEMENTWISE_SUMS:
        n = len(ins) if t == "AddN" else 2
        return (n, "sum", ins) if out_size else None
    src = None
    if t in REDUCTIONS and REDUCTIONS[t][0] == k:
        src, kind = ins[0], REDUCTIONS[t][1]
    elif (op.get("precision") or {}).get("aten") == CONV_BACKWARD_ATEN and len(outs[k].get("shape") or ()) == 1:
        src, kind = ins[0], "sum"
    if src is None:
        return None
    p = _producer(npu, src)
    if p is None or not out_size:
        return None
    in_size = _size(p.get("shape"))
    if in_size < out_size or in_size % out_size:
        return None
    return in_size // out_size, kind, [src]


def rounding_noise(npu: Dump, op: dict, k: int, row: dict, eps: float) -> str | None:
    """A message when output ``k`` of ``op`` is float32 rounding noise on both sides (module docstring), else None.

    ``row`` is the compared row (its NPU and Bench max/min statistics), ``eps`` the bench dtype's machine epsilon."""
    how = additive_terms(npu, op, k)
    if how is None:
        return None
    n, kind, srcs = how
    scales = []
    for s in srcs:
        p = _producer(npu, s)
        m = _max_abs(p) if p is not None else None
        if m is None:
            return None       # an input not dumped or not finite: nothing to bound the rounding with
        scales.append(m)
    scale = max(scales)
    bound = (n if kind == "sum" else 1) * eps * scale
    sides = [row.get(f"{side} {s}") for side in ("NPU", "Bench") for s in ("max", "min")]
    if any(not isinstance(v, float) or not math.isfinite(v) for v in sides):
        return None
    largest = max(abs(v) for v in sides)
    if scale == 0 or largest > bound:
        return None
    return (f"rounding noise: both sides are within {bound:.3g} of 0 ({'n x ' if kind == 'sum' else ''}eps x the "
            f"inputs' largest magnitude; a {kind} of {n} terms of magnitude <= {scale:.3g}): the exact value is 0 to "
            "within float32 rounding, so these metrics compare two roundings of 0; not where an error enters.")

"""Rounding noise: a compared tensor whose exact value is 0 and whose two sides hold only float32 rounding.

A sum can be zero in exact arithmetic and not in float32: a convolution's bias gradient in front of a batch norm
(the normalisation cancels the bias, so every channel of the gradient reaching it sums to 0), the sum of a centred
tensor, ``a - a`` computed two ways. Each side then holds its own rounding of the cancelled terms, values near
``eps x the terms``, and their cosine is a number between -1 and 1 that says nothing about either: the pair fails
the accuracy rule and, its inputs passing, would be named the first divergent op.

:func:`rounding_noise` recognises it, for ops whose output is an **additive** reduction of an input (a sum of n of
its elements, or of n inputs), never for products: a product's absolute error scales with both operands, so a tiny
product (``x * 1e-10``) is small and exact, not noise. The rule is a bound, not a guess at the summation order:
a float32 sum of n terms of magnitude at most m rounds partial sums no larger than n m, so one rounding alone can
leave n m eps / 2 of an exact 0. The test is element by element: each output element of both sides at most
``n x eps x m`` of its own terms (eps = 2^-23, float32's: both sides sum in float32, a 16-bit result being a float32
sum rounded; m the largest magnitude among the terms of that element, read from the NPU dump's input tensors: the
reduced slice of input 0, or the inputs' elements at that position). Then both are within one such rounding of 0,
the exact value is 0 to within what float32 can resolve, and no comparison of the two is informative; one element
beyond its own bound and the rule does not apply. What is reported: the row keeps its Result (the
metric rule's), its message says why, and :meth:`Comparison.first_divergent` passes the op over (its consumers read
a failing tensor, so they are passed over too). NUMERICS.md section 7.

No TensorFlow here.
"""
from __future__ import annotations

import numpy as np

from ..graph.core import split_tensor_name
from .dump import Dump

#: op types whose output is, element by element, a sum of their inputs' elements at that position (broadcast): the
#: number of terms is the number of inputs
ELEMENTWISE_SUMS = frozenset({"Add", "AddV2", "Sub", "BiasAdd", "AddN"})
#: op types whose output ``k`` sums input 0 over every axis but its channel axis (``data_format``)
CHANNEL_SUMS = {"BiasAddGrad": 0, "FusedBatchNormGrad": 2, "FusedBatchNormGradV2": 2, "FusedBatchNormGradV3": 2}
#: op types that sum (or average) input 0 over axes their second input names; the axes are read from the shapes
REDUCTIONS = {"Sum": "sum", "ReduceSum": "sum", "ReduceSumD": "sum", "Mean": "mean", "ReduceMean": "mean",
              "ReduceMeanD": "mean"}
#: torch's convolution_backward is one record (its main op's type, Conv2DBackpropFilter ...): its 1-D output is the
#: bias gradient, dy (NCHW) summed over every axis but axis 1
CONV_BACKWARD_ATEN = "aten.convolution_backward.default"
#: the accumulator's machine epsilon: the sums are float32 on both sides (a 16-bit result is a float32 sum rounded)
EPS32 = 2.0 ** -23


def _producer(npu: Dump, ref: str) -> tuple | None:
    """(op name, output record) of tensor ``ref`` (``name:index``) in the NPU dump, or None."""
    name, k = split_tensor_name(ref)
    if name not in npu:
        return None
    outs = npu.op(name)["outputs"]
    return (name, outs[k]) if k < len(outs) else None


def additive_terms(npu: Dump, op: dict, k: int) -> tuple | None:
    """How output ``k`` of ``op`` (an NPU dump record) adds: ``("elementwise", n, input tensors)`` or
    ``("sum" | "mean", reduced axes of input 0, [input 0])``, or None when it is not an additive result (products,
    moves, a reduction whose axes the shapes do not tell)."""
    t = op.get("tf_type")
    ins = list(op.get("inputs") or [])
    outs = op.get("outputs") or []
    if k >= len(outs) or not ins or outs[k].get("shape") is None:
        return None
    out_shape = [int(d) for d in outs[k]["shape"]]
    if t in ELEMENTWISE_SUMS:
        return ("elementwise", len(ins) if t == "AddN" else 2, ins)
    aten = (op.get("precision") or {}).get("aten")
    channel = t in CHANNEL_SUMS and CHANNEL_SUMS[t] == k
    if not (channel or t in REDUCTIONS and k == 0 or aten == CONV_BACKWARD_ATEN and len(out_shape) == 1):
        return None
    p = _producer(npu, ins[0])
    if p is None or p[1].get("shape") is None:
        return None
    in_shape = [int(d) for d in p[1]["shape"]]
    nd = len(in_shape)
    if channel or aten == CONV_BACKWARD_ATEN:
        if nd < 2 or len(out_shape) != 1:
            return None
        fmt = str((op.get("attrs") or {}).get("data_format", "NHWC"))
        c = 1 if aten == CONV_BACKWARD_ATEN or fmt.startswith("NC") else nd - 1
        if in_shape[c] != out_shape[0]:
            return None
        return ("sum", tuple(a for a in range(nd) if a != c), [ins[0]])
    kind = REDUCTIONS[t]
    if len(out_shape) == nd:           # keep_dims: the reduced axes are the 1s facing more than 1
        if any(o != i and o != 1 for o, i in zip(out_shape, in_shape)):
            return None
        axes = tuple(a for a in range(nd) if out_shape[a] == 1 and in_shape[a] != 1)
    elif int(np.prod(out_shape, dtype=np.int64)) == 1:
        axes = tuple(range(nd))        # to a scalar: every axis
    else:
        return None                    # which axes went is not in the shapes
    return (kind, axes, [ins[0]])


def rounding_noise(npu: Dump, op: dict, k: int, npu_value, bench_value) -> str | None:
    """A message when output ``k`` of ``op`` is float32 rounding noise of an exact 0 on both sides, element by
    element (module docstring), else None. ``npu_value`` / ``bench_value``: the two compared tensors."""
    how = additive_terms(npu, op, k)
    if how is None:
        return None
    kind, arg, srcs = how
    try:
        n_val = np.abs(np.asarray(npu_value, dtype=np.float64))
        b_val = np.abs(np.asarray(bench_value, dtype=np.float64))
        ins = []
        for s in srcs:
            p = _producer(npu, s)
            if p is None:
                return None    # an input not in the dump: nothing to bound its rounding with
            ins.append(np.abs(np.asarray(npu.tensor(p[0], int(p[1]["index"])), dtype=np.float64)))
    except Exception:          # statistics only, a tensor file not there: no judgement
        return None
    if n_val.shape != b_val.shape or not n_val.size:
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        if kind == "elementwise":
            n = arg
            try:
                m = np.broadcast_to(ins[0], n_val.shape)
                for x in ins[1:]:
                    m = np.maximum(m, np.broadcast_to(x, n_val.shape))
            except ValueError:
                return None
        else:
            x = ins[0]
            n = int(np.prod([x.shape[a] for a in arg], dtype=np.int64)) if arg else 1
            if not n:
                return None
            m = np.max(x, axis=arg) if arg else x
            if m.size != n_val.size:
                return None
            m = m.reshape(n_val.shape)
        bound = (1 if kind == "mean" else n) * EPS32 * m
        if not np.all(np.isfinite(bound)) or not (np.all(n_val <= bound) and np.all(b_val <= bound)):
            return None
    what = (f"a sum of {n} inputs" if kind == "elementwise" else f"a {kind} of {n} terms")
    return (f"rounding noise: each element of both sides is within {'n x ' if kind != 'mean' else ''}eps x the "
            f"largest magnitude of its terms of 0 ({what}; the largest such bound {float(bound.max()):.3g}): the "
            "exact value is 0 to within float32 rounding, so these metrics compare two roundings of 0; not where an "
            "error enters.")

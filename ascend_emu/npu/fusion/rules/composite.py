"""Graph passes that recognise one CANN operator in a decomposed TF subgraph: LayerNorm, Gelu and, in
training graphs, SoftmaxGrad.

Keras and ``tf.nn`` emit LayerNormalization and Gelu as a dozen elementwise ops; CANN's
LayerNormFusionPass and GeluFusionPass replace them by one kernel that does not round
its intermediates (NUMERICS.md section 6). Gelu is recognised by reading its argument
as a polynomial in x (:func:`_poly`), so the Pow and the Mul forms of x^3 both match.
"""
from __future__ import annotations

import math

import numpy as np

from ....graph.core import Node, tensor_name
from ..registry import GRAPH, fusion_rule
from ..rewriter import Rewriter
from .common import _close, _fused_attrs, _fused_node

# --------------------------------------------------------------------------- LayerNorm

def _mean_axes(rw: Rewriter, node: Node):
    if node.op != "Mean" or not node.attrs.get("keep_dims") or not rw.is_const(node.inputs[1]):
        return None
    return tuple(int(a) for a in np.asarray(rw.value(node.inputs[1])).reshape(-1))


def _layer_norm(rw: Rewriter, rs: Node):
    """Match the LayerNorm around Rsqrt node ``rs``; (internal nodes, x, gamma, beta, eps, axes, out)."""
    add = rw.node(rs.inputs[0])
    if add.op not in ("Add", "AddV2"):
        return None
    var = eps = None
    for ref in add.inputs:
        if rw.scalar(ref) is not None:
            eps = rw.scalar(ref)
        else:
            var = rw.node(ref)
    if var is None or eps is None or _mean_axes(rw, var) is None:
        return None
    axes = _mean_axes(rw, var)
    sqd = rw.node(var.inputs[0])
    if sqd.op != "SquaredDifference":
        return None
    internal = [var, add, rs, sqd]
    mean = x = None
    for i, ref in enumerate(sqd.inputs):
        m = rw.node(ref)
        chain = []
        while m.op in ("StopGradient", "Identity"):
            chain.append(m)
            m = rw.node(m.inputs[0])
        if m.op == "Mean" and _mean_axes(rw, m) == axes and tensor_name(m.inputs[0]) == tensor_name(sqd.inputs[1 - i]):
            mean, x = m, tensor_name(m.inputs[0])
            internal += chain + [mean]
            break
    if mean is None:
        return None
    # inv = rsqrt(var + eps) [* gamma]
    inv, gamma = rs, None
    r = rw.sole_reader(rs)
    if r is not None and r.op == "Mul":
        g = rw.other(r, rs.name + ":0")
        if g is not None and rw.is_const(g):
            inv, gamma = r, g
            internal.append(r)
    inv_readers = rw.readers(inv)
    if len(inv_readers) != 2 or rw.is_output(inv):
        return None
    mul_x = mul_m = None
    neg_mean = False
    for m in inv_readers:
        if m.op != "Mul":
            return None
        o = rw.other(m, inv.name + ":0")
        if o == x:
            mul_x = m
        elif o == mean.name + ":0":
            mul_m = m
        elif o is not None and rw.node(o).op == "Neg" and tensor_name(rw.node(o).inputs[0]) == mean.name + ":0":
            mul_m, neg_mean = m, True
            internal.append(rw.node(o))
    if mul_x is None or mul_m is None:
        return None
    internal += [mul_x, mul_m]
    # the shift term: -mean*inv [+ beta]
    beta = None
    term = mul_m
    nxt = rw.sole_reader(mul_m)
    if nxt is None:
        return None
    if neg_mean and nxt.op in ("Add", "AddV2") and rw.other(nxt, mul_m.name + ":0") is not None \
            and rw.is_const(rw.other(nxt, mul_m.name + ":0")):
        beta, term = rw.other(nxt, mul_m.name + ":0"), nxt
    elif not neg_mean and nxt.op == "Sub" and tensor_name(nxt.inputs[1]) == mul_m.name + ":0" \
            and rw.is_const(nxt.inputs[0]):
        beta, term = tensor_name(nxt.inputs[0]), nxt
    elif not neg_mean and nxt.op == "Neg":
        term = nxt
    elif not neg_mean:
        return None
    if term is not mul_m:
        internal.append(term)
    out = rw.sole_reader(mul_x)
    if out is None or out.op not in ("Add", "AddV2") or rw.other(out, mul_x.name + ":0") != term.name + ":0":
        return None
    internal.append(out)
    if not rw.closed(internal, out) or not all(rw.is_float(n) for n in (out, mul_x, mean)):
        return None
    return internal, x, gamma, beta, eps, axes, out


@fusion_rule(
    "LayerNormFusionPass", GRAPH,
    pattern="Mean(x) -> [StopGradient] -> SquaredDifference(x, .) -> Mean -> Add(eps) -> Rsqrt [-> Mul(gamma)] "
            "-> Mul(x, .) and Mul(Neg(mean), .) [-> Add(beta)] -> Add (Keras 3 LayerNormalization; also the "
            "Sub(beta, mean * inv) form of tf.nn.batch_normalization over moments)",
    numerics="one LayerNorm: mean, variance, normalisation, gamma and beta computed without intermediate "
             "rounding (modelled exactly, in float64) and rounded once to the output dtype; unfused, each of "
             "the ~12 ops rounds (and the means run in ReduceMeanD's dtype)")
def layer_norm(rw: Rewriter) -> int:
    n = 0
    for rs, (internal, x, gamma, beta, eps, axes, out) in rw.matches("Rsqrt", _layer_norm):
        inputs = [x] + ([gamma] if gamma else []) + ([beta] if beta else [])
        fused = _fused_node(out.name, "_LayerNorm", inputs, _fused_attrs(out, epsilon=float(eps), axis=list(axes),
                                  has_gamma=gamma is not None, has_beta=beta is not None),
                            "LayerNorm")
        rw.fuse("LayerNormFusionPass", internal, fused)
        n += 1
    return n


# --------------------------------------------------------------------------- Gelu

_POLY_OPS = ("Mul", "Add", "AddV2", "Sub", "Neg", "RealDiv", "Div", "Pow", "Square")


def _poly(rw: Rewriter, ref: str, x: str, g: str | None, seen: list):
    """``ref`` as a polynomial in tensors ``x`` and ``g``: {(power of x, power of g): coefficient}.

    Walks Mul/Add/Sub/Neg/RealDiv(by a constant)/Pow(integer)/Square nodes, recording them
    in ``seen``; None if ``ref`` is not such a polynomial.
    """
    ref = tensor_name(ref)
    if ref == x:
        return {(1, 0): 1.0}
    if g is not None and ref == g:
        return {(0, 1): 1.0}
    c = rw.scalar(ref)
    if c is not None:
        return {(0, 0): c}
    node = rw.node(ref)
    if node.op not in _POLY_OPS or not rw.is_float(node) or node.op.startswith("_"):
        return None
    args = [_poly(rw, r, x, g, seen) for r in node.inputs[:2]]
    if any(a is None for a in args):
        return None
    seen.append(node)

    def mul(p, q):
        out: dict = {}
        for (a1, b1), c1 in p.items():
            for (a2, b2), c2 in q.items():
                k = (a1 + a2, b1 + b2)
                out[k] = out.get(k, 0.0) + c1 * c2
        return out

    def add(p, q, sign=1.0):
        out = dict(p)
        for k, v in q.items():
            out[k] = out.get(k, 0.0) + sign * v
        return out

    if node.op == "Mul":
        return mul(*args)
    if node.op in ("Add", "AddV2"):
        return add(*args)
    if node.op == "Sub":
        return add(args[0], args[1], -1.0)
    if node.op == "Neg":
        return {k: -v for k, v in args[0].items()}
    if node.op == "Square":
        return mul(args[0], args[0])
    if node.op in ("RealDiv", "Div"):
        if set(args[1]) != {(0, 0)} or args[1][(0, 0)] == 0:
            return None
        return {k: v / args[1][(0, 0)] for k, v in args[0].items()}
    # Pow with a small integer exponent
    if set(args[1]) != {(0, 0)}:
        return None
    e = args[1][(0, 0)]
    if e != int(e) or not 1 <= e <= 4:
        return None
    out = {(0, 0): 1.0}
    for _ in range(int(e)):
        out = mul(out, args[0])
    return out


def _poly_is(p, want: dict) -> bool:
    keys = {k for k, v in p.items() if v != 0.0}
    return keys == set(want) and all(_close(p[k], v) for k, v in want.items())


def _leaf_candidates(rw: Rewriter, ref: str) -> list[str]:
    """Tensors an argument may be a polynomial of: every non-constant tensor met walking its polynomial ops."""
    out, stack = [], [tensor_name(ref)]
    while stack:
        r = stack.pop(0)
        if r in out or rw.is_const(r):
            continue
        out.append(r)
        node = rw.node(r)
        if node.op in _POLY_OPS:
            stack.extend(tensor_name(i) for i in node.inputs)
    return out


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT2_PI = math.sqrt(2.0 / math.pi)
_GELU_ARGS = {"Erfc": ({(1, 0): -_SQRT1_2}, "none"), "Erf": ({(1, 0): _SQRT1_2}, "none"),
              "Tanh": ({(1, 0): _SQRT2_PI, (3, 0): _SQRT2_PI * 0.044715}, "tanh")}


def _gelu(rw: Rewriter, t: Node):
    """Match a Gelu around its Erfc/Erf/Tanh node ``t``: (internal nodes, x, approximate, out)."""
    want, approx = _GELU_ARGS[t.op]
    arg = tensor_name(t.inputs[0])
    for x in _leaf_candidates(rw, arg):
        seen: list = []
        p = _poly(rw, arg, x, None, seen)
        if p is None or not _poly_is(p, want):
            continue
        internal = [*seen, t]
        g = t
        if t.op != "Erfc":  # 1 + erf(.) or 1 + tanh(.)
            g = rw.sole_reader(t)
            one = rw.other(g, t.name + ":0") if g is not None and g.op in ("Add", "AddV2") else None
            if one is None or rw.scalar(one) is None or not _close(rw.scalar(one), 1.0):
                continue
            internal.append(g)
        # climb the products around g until they make 0.5 * x * g
        top = g
        for _ in range(3):
            top = rw.sole_reader(top)
            if top is None or top.op != "Mul":
                break
            seen2: list = []
            q = _poly(rw, top.name + ":0", x, g.name + ":0", seen2)
            if q is not None and _poly_is(q, {(1, 1): 0.5}):
                nodes = {n.name: n for n in internal + seen2}
                if rw.node(x).name in nodes:
                    break
                allnodes = list(nodes.values())
                if rw.closed(allnodes, top):
                    return allnodes, x, approx, top
                break
    return None


@fusion_rule(
    "GeluFusionPass", GRAPH,
    pattern="0.5 * x * erfc(-x / sqrt(2)) (Keras 3 / tf.nn.gelu exact: Mul, Neg, Mul, Erfc, Mul), "
            "0.5 * x * (1 + erf(x / sqrt(2))), and 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) "
            "(Pow or Mul for x^3); recognised as polynomials in x, constants to 1e-5",
    numerics="one Gelu computed without intermediate rounding (modelled exactly in float64, erfc form for "
             "the exact Gelu) and rounded once; unfused, each of the 5-8 ops rounds and Pow runs in its "
             "black-list dtype")
def gelu(rw: Rewriter) -> int:
    n = 0
    for t, (internal, x, approx, out) in rw.matches(_GELU_ARGS, _gelu):
        fused = _fused_node(out.name, "_Gelu", [x], _fused_attrs(out, approximate=approx), "Gelu")
        rw.fuse("GeluFusionPass", internal, fused)
        n += 1
    return n


# --------------------------------------------------------------------------- SoftmaxGrad (training graphs)

def _last_axis(rw: Rewriter, node: Node) -> bool:
    """A Sum over axis -1 with keep_dims (TensorFlow's softmax gradient writes it so)."""
    if node.op != "Sum" or not node.attrs.get("keep_dims") or not rw.is_const(node.inputs[1]):
        return False
    return [int(a) for a in np.asarray(rw.value(node.inputs[1])).reshape(-1)] == [-1]


def _softmax_grad(rw: Rewriter, s: Node):
    """Match TensorFlow's softmax gradient around its Sum ``s``: (internal nodes, y, dy, out).

    ``(dy - reduce_sum(dy * y, -1, keepdims=True)) * y`` with ``y`` the output of a Softmax op.
    """
    m = rw.node(s.inputs[0])
    if m.op != "Mul" or len(m.inputs) != 2:
        return None
    y = next((tensor_name(r) for r in m.inputs if rw.node(r).op == "Softmax"), None)
    if y is None:
        return None
    dy = rw.other(m, y)
    if dy is None or not _last_axis(rw, s):
        return None
    sub = rw.sole_reader(s)
    if sub is None or sub.op != "Sub" or [tensor_name(r) for r in sub.inputs] != [dy, s.name + ":0"]:
        return None
    out = rw.sole_reader(sub)
    if out is None or out.op != "Mul" or rw.other(out, sub.name + ":0") != y:
        return None
    internal = [m, s, sub, out]
    if rw.sole_reader(m) is not s or not rw.closed(internal, out):
        return None
    return internal, y, dy, out


@fusion_rule(
    "SoftmaxGradFusionPass", GRAPH,
    pattern="TensorFlow's softmax gradient (dy - Sum(dy * y, -1, keep_dims)) * y, y the output of a Softmax "
            "(Mul, Sum, Sub, Mul): training graphs",
    numerics="one SoftmaxGrad (black list: float32 under the mixed modes): inputs widened to float32, the "
             "product, the sequential float32 sum, the difference and the product in float32, one rounding; "
             "unfused, the Muls and the Sub are gray (fp16 after an fp16 softmax) and only the Sum is float32")
def softmax_grad(rw: Rewriter) -> int:
    n = 0
    for s, (internal, y, dy, out) in rw.matches("Sum", _softmax_grad):
        fused = _fused_node(out.name, "_SoftmaxGrad", [y, dy], _fused_attrs(out), "SoftmaxGrad")
        rw.fuse("SoftmaxGradFusionPass", internal, fused)
        n += 1
    return n

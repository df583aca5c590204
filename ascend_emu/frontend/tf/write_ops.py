"""The tensor ops that compute a variable write's new values: the emitter behind :func:`functionalize`.

A stateful step's writes (``Assign*``, the optimizers' ``Apply*``) become plain elementwise NodeDefs
here, in the order of TensorFlow's update functors (and of :mod:`ascend_emu.ops.apply_ops`), each tagged
with the CANN operator it runs as so the precision lists decide its dtype. Nothing here runs TensorFlow:
it builds GraphDef protobufs.
"""
from __future__ import annotations

import numpy as np

from .tf import import_tf

#: writes: op -> (indices of the variable inputs, in the order of the new values the rewrite computes)
WRITE_OPS = {
    "Assign": (0,), "AssignVariableOp": (0,),
    "AssignAdd": (0,), "AssignAddVariableOp": (0,),
    "AssignSub": (0,), "AssignSubVariableOp": (0,),
    "ApplyGradientDescent": (0,), "ResourceApplyGradientDescent": (0,),
    "ApplyMomentum": (0, 1), "ResourceApplyMomentum": (0, 1),
    "ResourceApplyKerasMomentum": (0, 1),
    "ApplyAdam": (0, 1, 2), "ResourceApplyAdam": (0, 1, 2),
    "ApplyRMSProp": (0, 1, 2), "ResourceApplyRMSProp": (0, 1, 2),
}
#: the CANN operator each write runs as (its precision list decides the update's dtype)
WRITE_ASCEND_TYPES = {
    "AssignAdd": "AssignAdd", "AssignAddVariableOp": "AssignAdd",
    "AssignSub": "AssignSub", "AssignSubVariableOp": "AssignSub",
    "ApplyGradientDescent": "ApplyGradientDescent", "ResourceApplyGradientDescent": "ApplyGradientDescent",
    "ApplyMomentum": "ApplyMomentum", "ResourceApplyMomentum": "ApplyMomentum",
    "ResourceApplyKerasMomentum": "ApplyKerasMomentum",
    "ApplyAdam": "ApplyAdam", "ResourceApplyAdam": "ApplyAdam",
    "ApplyRMSProp": "ApplyRMSProp", "ResourceApplyRMSProp": "ApplyRMSProp",
}
#: ops that only say whether a variable exists (always true inside a step)


class Emitter:
    """Collects the rewritten NodeDefs; names new nodes uniquely."""

    def __init__(self, taken: set):
        self.tf = import_tf()
        self.nodes = []
        self.taken = set(taken)
        self.ascend = {}

    def unique(self, name: str) -> str:
        if name not in self.taken:
            self.taken.add(name)
            return name
        k = 1
        while f"{name}_{k}" in self.taken:
            k += 1
        self.taken.add(f"{name}_{k}")
        return f"{name}_{k}"

    def add(self, nd) -> None:
        self.nodes.append(nd)

    def op(self, op: str, name: str, *inputs, dtype, ascend: str | None = None, exact_name=False) -> str:
        """An elementwise op (attribute ``T`` = ``dtype``) named ``name`` (made unique unless ``exact_name``)."""
        tf = self.tf
        nd = tf.compat.v1.NodeDef(name=name if exact_name else self.unique(name), op=op)
        nd.input.extend(inputs)
        nd.attr["T"].type = tf.as_dtype(dtype).as_datatype_enum
        self.add(nd)
        if ascend:
            self.ascend[nd.name] = ascend
        return f"{nd.name}:0"

    def cast(self, name: str, x: str, src, dst) -> str:
        tf = self.tf
        nd = tf.compat.v1.NodeDef(name=self.unique(name), op="Cast")
        nd.input.append(x)
        nd.attr["SrcT"].type = tf.as_dtype(src).as_datatype_enum
        nd.attr["DstT"].type = tf.as_dtype(dst).as_datatype_enum
        self.add(nd)
        return f"{nd.name}:0"

    def const(self, name: str, value, dtype) -> str:
        tf = self.tf
        nd = tf.compat.v1.NodeDef(name=self.unique(name), op="Const")
        nd.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
        nd.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(value, dtype=np.dtype(dtype))))
        self.add(nd)
        return f"{nd.name}:0"

    def constant(self, name: str, value) -> None:
        """A Const named exactly ``name`` holding ``value`` (a captured tensor, or True)."""
        tf = self.tf
        arr = np.asarray(value)
        nd = tf.compat.v1.NodeDef(name=name, op="Const")
        nd.attr["dtype"].type = tf.as_dtype(arr.dtype).as_datatype_enum
        nd.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(arr))
        self.taken.add(name)
        self.add(nd)

    def placeholder(self, name: str, dtype, shape) -> str:
        """A Placeholder named ``name`` (made unique); its node name."""
        tf = self.tf
        nd = tf.compat.v1.NodeDef(name=self.unique(name), op="Placeholder")
        nd.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
        nd.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
        self.add(nd)
        return nd.name


def update_chain(em: Emitter, op: str, name: str, old: list, ins: list, nesterov: bool, dtype) -> list:
    """New values (variable first, then its slots) of write ``op`` named ``name``; ``old`` are the values
    of its variable inputs before it, ``ins`` all its (rewired) inputs. The Apply* chains follow
    TensorFlow's update functors in the order of :mod:`ascend_emu.ops.grad_ops`."""
    at = WRITE_ASCEND_TYPES.get(op)

    def f(kind, suffix, *xs, final=False):
        return em.op(kind, name if final else f"{name}/{suffix}", *xs, dtype=dtype, ascend=at, exact_name=final)

    if op in ("Assign", "AssignVariableOp"):
        return [ins[1]]
    if op in ("AssignAdd", "AssignAddVariableOp"):
        return [f("AddV2", "", old[0], ins[1], final=True)]
    if op in ("AssignSub", "AssignSubVariableOp"):
        return [f("Sub", "", old[0], ins[1], final=True)]
    if op.endswith("ApplyGradientDescent"):          # var - alpha * delta
        return [f("Sub", "", old[0], f("Mul", "mul", ins[1], ins[2]), final=True)]
    if op.endswith("ApplyKerasMomentum"):            # accum = accum*m - g*lr; var += accum (nesterov: accum*m - g*lr)
        var, accum = old
        lr, g, mom = ins[2], ins[3], ins[4]
        a = f("Sub", "accum", f("Mul", "accum_momentum", accum, mom), f("Mul", "grad_lr", g, lr))
        if nesterov:
            step = f("Sub", "nesterov", f("Mul", "nesterov_momentum", a, mom), f("Mul", "nesterov_grad_lr", g, lr))
            return [f("AddV2", "", var, step, final=True), a]
        return [f("AddV2", "", var, a, final=True), a]
    if op.endswith("ApplyMomentum"):     # accum = accum*m + g; var -= lr*accum (nesterov: g*lr + accum*m*lr)
        var, accum = old
        lr, g, mom = ins[2], ins[3], ins[4]
        a = f("AddV2", "accum", f("Mul", "accum_momentum", accum, mom), g)
        if nesterov:
            step = f("AddV2", "nesterov", f("Mul", "grad_lr", g, lr),
                     f("Mul", "nesterov_lr", f("Mul", "nesterov_momentum", a, mom), lr))
            return [f("Sub", "", var, step, final=True), a]
        return [f("Sub", "", var, f("Mul", "lr_accum", lr, a), final=True), a]
    if op.endswith("ApplyAdam"):
        w, m, v = old
        b1p, b2p, lr, b1, b2, eps, g = ins[3:10]
        one = em.const(f"{name}/one", 1.0, dtype)
        alpha = f("RealDiv", "alpha", f("Mul", "lr_sqrt", lr, f("Sqrt", "sqrt_b2", f("Sub", "one_b2p", one, b2p))),
                  f("Sub", "one_b1p", one, b1p))
        one_b1 = f("Sub", "one_b1", one, b1)
        m2 = f("AddV2", "m", m, f("Mul", "m_delta", f("Sub", "g_m", g, m), one_b1))
        v2 = f("AddV2", "v", v, f("Mul", "v_delta", f("Sub", "gg_v", f("Mul", "gg", g, g), v),
                                  f("Sub", "one_b2", one, b2)))
        mm = m2
        if nesterov:
            mm = f("AddV2", "nesterov", f("Mul", "m_b1", m2, b1), f("Mul", "b1_g", one_b1, g))
        upd = f("RealDiv", "update", f("Mul", "m_alpha", mm, alpha),
                f("AddV2", "sqrt_v_eps", f("Sqrt", "sqrt_v", v2), eps))
        return [f("Sub", "", w, upd, final=True), m2, v2]
    if op.endswith("ApplyRMSProp"):
        w, ms, mom = old
        lr, rho, momentum, eps, g = ins[3:8]
        one = em.const(f"{name}/one", 1.0, dtype)
        ms2 = f("AddV2", "ms", ms, f("Mul", "ms_delta", f("Sub", "gg_ms", f("Mul", "gg", g, g), ms),
                                     f("Sub", "one_rho", one, rho)))
        mom2 = f("AddV2", "mom", f("Mul", "mom_momentum", mom, momentum),
                 f("RealDiv", "step", f("Mul", "lr_g", lr, g), f("Sqrt", "sqrt_ms", f("AddV2", "ms_eps", ms2, eps))))
        return [f("Sub", "", w, mom2, final=True), ms2, mom2]
    raise AssertionError(op)  # pragma: no cover

"""What a replay records per op: :class:`OpRecord` (also what goes into the dump), and the record-keeping of
:class:`ascend_emu.npu.replay._Run` (:class:`Records`: a record's phase, the status register, the dump writer, the
records of an inserted cast, of an op GE splits, of a TF1 routing op, and the replay's summary)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.core import Node, dtype_name, tensor_name
from ..numerics.status import decode_status
from .precision import ascend_type


@dataclass
class OpRecord:
    """What the device did for one op (also what goes into the dump)."""

    name: str
    tf_type: str
    ascend_type: str
    engine: str
    compute_dtype: str
    inputs: list
    status: int = 0
    precision: dict | None = None
    fusion: dict | None = None
    fp32_check: dict | None = None
    inserted: bool = False
    phase: str | None = None


#: the inserted casts between the float formats: the short name of the dtype cast to
_PLAIN = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
#: (tensor, dtype cast to, its dtype, constant-folded) -> (the Cast's name, its reason): the same every replay of a
#: graph (2.8 us of a 16.8 us cast of 16 floats were these strings); cleared when full
_CAST_TEXT: dict = {}
_CAST_TEXT_MAX = 65536


def _cast_check(value) -> dict:
    """The fp32 check of an inserted cast that raised a status: the float32 view of the same cast is the value itself
    (it is the cast that overflows)."""
    v = np.asarray(value, dtype=np.float64)
    fin = np.isfinite(v)
    return {"overflow": not bool(fin.all()), "max_abs": float(np.abs(v[fin]).max()) if fin.any() else 0.0,
            "status": 0}


class Records:
    """The record-keeping half of a replay's run (mixed into ``_Run``, whose state it reads: ``records``,
    ``status``, ``writer``, ``phases``, ``keep``, ``casts``, ``added_outputs``, ``dev``, ``graph``)."""

    def _record(self, rec: OpRecord, outs, attrs=None):
        if self.phases is not None:
            rec.phase = self.phases(rec.name)
        self.records.append(rec)
        if rec.status:
            self.status.record(rec.status)
        if self.writer is not None:
            self.writer.add_op(rec.name, rec.tf_type, rec.ascend_type, rec.engine, rec.compute_dtype, rec.inputs,
                               list(outs), rec.status, attrs=attrs, precision=rec.precision, fusion=rec.fusion,
                               fp32_check=rec.fp32_check, phase=rec.phase)

    def _cast_record(self, ref: str, value: np.ndarray, dtype: str, folded: bool, ctx_status) -> OpRecord:
        """The record of the Cast op inserted in front of tensor ``ref``."""
        if dtype in _PLAIN:
            # a name and reason that depend on the tensor and the two dtypes only: made once (``_CAST_TEXT``)
            key = (ref, dtype, value.dtype, folded)
            text = _CAST_TEXT.get(key)
            if text is None:
                if len(_CAST_TEXT) >= _CAST_TEXT_MAX:
                    _CAST_TEXT.clear()
                node, idx = ref.rsplit(":", 1)
                text = _CAST_TEXT[key] = (
                    f"{node}/ascend_cast_{idx}_to_{_PLAIN[dtype]}",
                    f"inserted at a precision boundary ({dtype_name(value.dtype)} -> {dtype})"
                    + ("; constant-folded by the graph engine" if folded else ""))
            rec = OpRecord(text[0], "Cast", "Cast", "HOST" if folded else "AICORE", dtype, [ref], int(ctx_status),
                           precision={"list": None, "reason": text[1]}, inserted=True)
            if ctx_status:
                rec.fp32_check = _cast_check(value)
            return rec
        node, idx = ref.rsplit(":", 1)
        if dtype.startswith("mx:"):
            fmt, axis = dtype.split(":")[1:]
            # the K axis is part of the name: one weight meets forward (K = 0) and backward (K = 1) matmuls
            short = "mx" + fmt.replace("float", "fp").replace("_", "") + f"_k{axis.replace('-', 'm')}"
        elif dtype.startswith("hfloat32:"):
            # one name per tensor; a second tie rule of the same tensor (it feeds a conv and a matmul) its own
            other = any(k[0] == ref and k[1].startswith("hfloat32:") and k[1] != dtype for k in self.casts)
            short = "hf32" + (f"_{dtype.split(':')[1]}" if other else "")
        else:
            short = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "hifloat8": "hif8"}[dtype]
        name = f"{node}/ascend_cast_{idx}_to_{short}"
        if dtype.startswith("mx:"):
            why = (f"cube_mx what-if: MX block quantization ({dtype.split(':')[1]} elements, one E8M0 scale per 32 "
                   f"along K = axis {dtype.split(':')[2]}) before the cube's products")
            dtype = "mx_" + dtype.split(":")[1]
        elif dtype.startswith("hfloat32:"):
            n = self.dev.numerics
            why = (f"HF32: a float32 cube operand rounded to {n.hf32_bits} stored significand bits "
                   f"({dtype.split(':')[1]}) before the cube's products "
                   f"(allow_hf32={','.join(n.allow_hf32)} on {n.soc})")
            dtype = "hfloat32"
        elif dtype == "hifloat8":
            n = self.dev.numerics
            why = (f"HiFloat8: a cube operand rounded to HiFloat8 ({n.hif8_rounding}) under "
                   f"{self.dev.precision.mode} on {n.soc}")
        else:
            why = f"inserted at a precision boundary ({dtype_name(value.dtype)} -> {dtype})"
        rec = OpRecord(name, "Cast", "Cast", "HOST" if folded else "AICORE", dtype, [ref], int(ctx_status),
                       precision={"list": None, "reason": why + ("; constant-folded by the graph engine" if folded
                                                                else "")},
                       inserted=True)
        if ctx_status:
            rec.fp32_check = _cast_check(value)
        return rec

    def _record_split(self, rec: OpRecord, split: tuple, attrs) -> None:
        """An op GE splits into nodes a real dump records one by one (``OpContext.split``: AvgPoolFusionPass's
        ``<name>_mul_layer``): the op with its own outputs, then each added node, named ``<name><suffix>``, reading
        the one before it. The graph's consumers read what the last one gives (the tensor ``<name>:0``)."""
        own, rec.status, added = split
        self._record(rec, own, attrs)
        prev = rec.name
        for suffix, tf_type, outs, status, why in added:
            name = rec.name + suffix
            self._record(OpRecord(name, tf_type, ascend_type(tf_type), "AICORE", rec.compute_dtype, [f"{prev}:0"],
                                  int(status), precision={"list": None, "reason": why}, inserted=True), outs)
            if self.keep:
                self.added_outputs.update({f"{name}:{i}": o for i, o in enumerate(outs)})
            prev = name

    def record_control(self, node: Node, outs) -> None:
        """A TF1 routing op that ran (a cond's Merge, a loop's Exit or LoopCond): it only forwards a tensor."""
        dt = outs[0].dtype.name if hasattr(outs[0], "dtype") else ""
        self._record(OpRecord(node.name, node.op, ascend_type(node.op), "HOST", dt,
                              [tensor_name(r) for r in node.inputs],
                              precision={"list": None, "reason": "TF1 control flow: forwards a tensor"}),
                     outs, node.attrs)

    def summary(self, seconds: float, fused) -> dict:
        counts: dict = {}   # (engine, compute dtype) -> ops: counted here, not per record
        overflowing = inserted = 0
        first = None
        for r in self.records:      # (one pass: a training step's summary is made every step)
            key = (r.engine, r.compute_dtype)
            counts[key] = counts.get(key, 0) + 1
            if r.status:
                if first is None:
                    first = r.name
                overflowing += 1
            if r.inserted and r.tf_type == "Cast":
                inserted += 1
        per_engine: dict = {}
        for (engine, dt), n in sorted(counts.items()):
            per_engine.setdefault(engine, {})[dt or "-"] = n
        return {
            "ops": len(self.records),
            "inserted_casts": inserted,
            "per_engine_dtype": per_engine,
            "overflowing_ops": overflowing,
            "first_overflow": first,
            "float_status": self.status.get(),
            "float_status_names": decode_status(self.status.get()),
            "fusion_counts": dict(fused.counts),
            "fused_away": len(fused.fused_away),
            "outputs": list(self.graph.outputs),
            "seconds": round(seconds, 3),
        }

"""One replay's execution: for every node, the precision decision, inserted casts, the op on its unit
(AI Core kernel, host, AI CPU fallback), status bits and the dump record.

:class:`ascend_emu.npu.device.Device` builds a :class:`_Run` per replay and hands its node evaluator to
the interpreter; ``OpRecord`` (npu/records.py, with the record-keeping) is what the run records per op.
"""
from __future__ import annotations

import numpy as np

from ..analysis.dump.format import Coded
from ..errors import AscendEmuError, UnsupportedOpError
from ..graph.control_flow import CONTROL_FLOW
from ..graph.core import Graph, Node, check_outputs, dtype_name, split_tensor_name, tensor_name
from ..graph.interpreter import interpret
from ..numerics import cube_core as _cube_core
from ..numerics import memo as _memo
from ..numerics import shared as _shared
from ..numerics.status import FloatStatus
from ..numerics.vector import cast
from ..ops import CUBE, HOST, MOVE, OPS, OpContext
from ..ops._util import is_float
from .fusion import apply_fusion
from .node_plan import PURE_MOVES, Light, Prepared, fold_key, signature
from .precision import ascend_type
from .records import OpRecord, Records  # noqa: F401  (OpRecord: device.py's API imports it from here)
from .rewritten_runs import RUNNERS, RewrittenRuns
from .threads import SMALL_OP_ELEMENTS, SMALL_VECTOR_ELEMENTS, Threads, product_macs

_FLOAT = {"float16", "bfloat16", "float32", "float64"}

_AICPU_REASON = "no AI Core kernel: runs on the AI CPU in its original dtype"


def _float32_op(node: Node, args) -> list:
    """Registry op ``node`` computed in float32 (its inputs widened already): the AI CPU of a registry op that has no
    framework node to run (an exported PyTorch program's lowered ops)."""
    with np.errstate(all="ignore"):
        return list(OPS[node.op](*args, ctx=OpContext(dtype="float32"), **node.attrs))


class _Deferred:
    """An inserted widening cast recorded but not yet computed (``_Run._cast``'s ``defer``)."""

    __slots__ = ("value", "convert")

    def __init__(self, value, convert):
        self.value, self.convert = value, convert

    def compute(self) -> np.ndarray:
        return self.convert()[0]


class _Run(Records, RewrittenRuns):
    """State of one replay: dtype bookkeeping, inserted casts, records, status."""

    def __init__(self, device, graph: Graph, feeds: dict, writer, keep: bool = True, phases=None, launch: int = 0):
        self.dev = device
        self.launch = launch
        self.phases = phases
        self.keep = keep
        self.graph = graph
        self.feeds = feeds
        self.writer = writer
        self.status = FloatStatus()
        self.records: list[OpRecord] = []
        self.const: set[str] = set()        # tensors that are constants (folded by the graph engine)
        self.producer: dict[str, str] = {}  # tensor -> producing op kind
        self.casts: dict = {}               # (tensor, dtype) -> cast output
        self.cast_dtypes: dict = {}         # tensor -> the dtypes it has casts to (what forget drops)
        self.cast_outputs: dict = {}        # inserted Cast op's tensor name -> output
        self.added_outputs: dict = {}       # outputs of the nodes a fusion pass adds after an op (OpContext.split)
        self.scoped_outputs: dict = {}      # tensors of control-flow bodies, by scoped name
        self.functions: dict = {}           # function name -> (its fused Graph, the ops fused away)
        self.graph_inputs = {f"{name}:0" for name in feeds}
        self.threads = Threads()
        #: the cube ops on one Numba thread whatever their size (``Device.replay``'s ``threads.Trial``)
        self.serial_cube = False
        self.decisions: dict = {}           # (kind, ascend op, orig dtype, producer dtypes) -> (Decision, dict)
        self.contexts: dict = {}            # (dtype, cube_out) -> an OpContext to copy (no multicore launch)
        self.operands = _shared.Store()     # what the cube ops derive from the tensors they share (numerics/shared.py)
        self.deterministic = device.numerics.deterministic_level != 0
        #: id(node) -> Prepared, for the nodes of the top-level walk (Device._plan: shared by every replay
        #: of the same fused graph on this device); None: nothing kept (a run of its own)
        self.prepared: dict | None = None
        #: nobody sees a tensor but the graph's ops (no dump, no kept tensors): a shape computation's outputs may be
        #: handed on from the last replay (``Light.fold``)
        self.fold_ok = writer is None and not keep
        self.graph_outputs = frozenset(graph.outputs)

    # -- helpers -----------------------------------------------------------------------------
    def _orig_dtype(self, node: Node, args) -> str:
        for key in ("T", "dtype"):
            v = node.attrs.get(key)
            if isinstance(v, str) and v in _FLOAT:
                return v
        for a in args:
            if is_float(a):
                name = dtype_name(a.dtype)
                return "float32" if name in ("float16", "bfloat16") else name
        return "float32"

    def forget(self, ref: str) -> None:
        # (called for every tensor at its last use: only the casts it has, not every dtype a cast can have)
        for dtype in self.cast_dtypes.pop(ref, ()):
            self.casts.pop((ref, dtype), None)

    def _cast(self, ref: str, value: np.ndarray, dtype: str, defer: bool = False) -> np.ndarray:
        """Insert (once per tensor and dtype) a Cast op, dumped as an op of its own.

        ``defer``: the consumer reads fp16 as its widening (``OpDef.reads_half``), so a widening of fp16
        to float32 that nothing else sees (no dump, no kept tensors) is recorded now but computed only if
        another consumer needs it; the consumer gets ``value`` itself."""
        key = (ref, dtype)
        if key in self.casts:
            out = self.casts[key]
            if type(out) is _Deferred:
                if defer:
                    return out.value
                out = self.casts[key] = out.compute()
            return out
        # widening casts are exact (but honour subnormal flushing); narrowing ones round with rint
        self.threads.fit(value.size, SMALL_VECTOR_ELEMENTS)
        mode, subnormals = self.dev.overflow_mode, self.dev.subnormals
        folded = ref in self.const
        rounding = None
        made: dict = {}     # what a conversion made besides its output (a HiFloat8 cast's codes)
        if dtype.startswith("hfloat32:"):     # a float32 cube operand on its way into L0A/L0B (NUMERICS.md section 13)
            from ..numerics.hf32 import to_hf32

            if dtype_name(value.dtype) != "float32":
                # a 16-bit operand of a float32 op: HF32 of its (recorded) float32 cast, subnormals as it leaves them
                value = self._cast(ref, value, "float32")
            rounding = dtype.split(":")[1]
            bits = self.dev.numerics.hf32_bits
            rounding = (rounding, bits)     # the memo key of a folded constant's cast holds both

            def convert():
                return to_hf32(value, rounding[0], overflow_mode=mode, subnormals=subnormals, bits=bits)
        elif dtype.startswith("mx:"):   # the cube_mx what-if: a matmul operand MX-quantized along its K axis
            from ..numerics.lowfloat import mx_values

            fmt, axis = dtype.split(":")[1], int(dtype.split(":")[2])
            if dtype_name(value.dtype) != "float32":
                value = self._cast(ref, value, "float32")
            rounding = fmt

            def convert():
                return mx_values(value, fmt, axis), 0
        elif dtype == "hifloat8":   # a cube operand under cube_hif8 / mixed_hif8 (NUMERICS.md section 13)
            from ..numerics.lowfloat import decode, encode

            rounding = self.dev.numerics.hif8_rounding

            def convert():
                # every HiFloat8 value is exact in float16 (at most 4 significant bits, 2^-23 .. 2^15), so the
                # rounded operand travels as float16 and the dump stores its codes (kept for the writer)
                codes, st = encode(value, "hifloat8", rounding=rounding, overflow_mode=mode)
                made["codes"] = codes
                return decode(codes, "hifloat8").astype(np.float16).reshape(np.shape(value)), st
        else:
            def convert():
                return cast(value, dtype, overflow_mode=mode, subnormals=subnormals)
        if (defer and dtype == "float32" and value.dtype == np.float16 and self.writer is None and not self.keep
                and not folded):
            # a widening raises no status (numerics.vector.cast): the record is the one it would make
            self._record(self._cast_record(ref, value, dtype, folded, 0), [])
            self.casts[key] = _Deferred(value, convert)
            self.cast_dtypes.setdefault(ref, []).append(dtype)
            return value
        # a constant's cast is the same every replay: computed once while the constant is frozen (the
        # weights the fusion passes fold; numerics/memo.py), then its cube operand layout too
        out, ctx_status = (_memo.memo(value, ("cast", dtype, mode, subnormals, rounding), convert) if folded
                           else convert())
        rec = self._cast_record(ref, value, dtype, folded, ctx_status)
        self._record(rec, [Coded(out, "hifloat8", made.get("codes")) if dtype == "hifloat8" else out])
        self.casts[key] = out
        self.cast_dtypes.setdefault(ref, []).append(dtype)
        if self.keep:
            self.cast_outputs[rec.name + ":0"] = out
        if folded:
            self.const.add(rec.name + ":0")
        return out

    def _context(self, key: tuple = ("float32", None)) -> OpContext:
        """``Device.context`` of one op for (dtype, cube_out): a copy of the run's prototype (the same fields: the
        device's policy, frozen for the run); no key: a host or integer op's context."""
        proto = self.contexts.get(key)
        if proto is None:
            proto = self.contexts[key] = self.dev.context(*key)
        ctx = object.__new__(OpContext)
        ctx.__dict__.update(proto.__dict__)
        return ctx

    # -- one node ----------------------------------------------------------------------------
    def eval_node(self, node: Node, args: list) -> tuple:
        # a node kept in the plan for inputs of these dtypes: its kept work (here, one call less a node)
        prepared = self.prepared
        prep = prepared.get(id(node)) if prepared is not None else None
        # (a node of no inputs, a Const or a Placeholder, has the empty signature: not worked out)
        if prep is not None and prep.node is node and prep.sig == (signature(args) if args else ()):
            outs = (self._eval_light(prep, node, args) if type(prep) is Light
                    else self._eval_prepared(prep, node, args))
        else:
            outs = self._eval_node(node, args)
        # a wrong shape or dtype is caught at the op that made it; the check is a function of the node
        # and the outputs' shapes and dtypes, so a node remembers the last ones it passed with
        if len(outs) == 1:      # (most nodes: the same tuple, without a list made and turned into one)
            o = outs[0]
            sig = ((o.shape, o.dtype),) if type(o) is np.ndarray else (None,)
        else:
            sig = tuple([(o.shape, o.dtype) if type(o) is np.ndarray else None for o in outs])
        if node.__dict__.get("_outputs_checked") != sig or None in sig:
            check_outputs(node, outs)
            node.__dict__["_outputs_checked"] = sig
        return outs

    def _keep(self, node: Node, prep) -> None:
        """Keep ``prep`` (:class:`Prepared`, :class:`Light`) for the next replays when ``node`` is of the walk."""
        if self.prepared is not None and id(node) in self.prepared:
            self.prepared[id(node)] = prep

    def _eval_node(self, node: Node, args: list) -> tuple:
        """A node met for the first time in this plan (or with inputs of other dtypes): worked out, kept
        (``_keep``), run."""
        if node.op == "Const" and not args and "aten_elsewhere" not in node.meta:
            if type(node.attrs["value"]) is np.ndarray:
                self._keep(node, Light(node, (), "const",
                                        ascend_op=node.meta.get("ascend_type") or ascend_type("Const")))
            return self._const(node)
        if node.op in CONTROL_FLOW:
            return self._control_flow(node, args)
        if node.op == "Placeholder":
            self._keep(node, Light(node, (), "placeholder"))
            out = self.feeds[node.name]
            self._record(OpRecord(node.name, "Placeholder", "Data", "HOST", dtype_name(out.dtype), []), [out])
            return (out,)
        rewritten = RUNNERS.get(node.op)
        if rewritten is not None:    # a rewrite's node (npu/rewritten_runs.py)
            return rewritten(self, node, args)
        opdef = OPS.get(node.op)
        if opdef is None:
            if "aten_engine" in node.meta and node.meta["aten_engine"] != "AICPU":
                return self._aten_exact(node, args)
            return self._aicpu(node, args, reason=node.meta.get("aten_reason", _AICPU_REASON))
        meta = node.meta
        if "aten_elsewhere" in meta and not self.dev.numerics.chip.fp32_cube:
            return self._elsewhere(node, args)
        fusion = meta.get("fusion")
        refs = list(node.input_names())
        ascend_op = meta.get("ascend_type") or ascend_type(node.op)
        if opdef.kind == HOST:
            self._keep(node, Light(node, signature(args), "host", opdef=opdef, refs=refs, ascend_op=ascend_op))
            ctx = self._context()
            outs = opdef(*args, ctx=ctx, **node.attrs)
            dt = dtype_name(outs[0].dtype) if outs else ""
            self.const.update(node.output_names())
            self._record(OpRecord(node.name, node.op, ascend_op, "HOST", dt, refs), outs, node.attrs)
            return outs
        float_idx = [i for i, a in enumerate(args) if is_float(a)]
        if opdef.kind == MOVE and float_idx and all(refs[i] in self.const for i in range(len(args))):
            # data movement of constants is folded by the graph engine: keep dtype, no cast
            ctx = self._context()
            outs = opdef(*args, ctx=ctx, **node.attrs)
            self.const.update(node.output_names())
            self._record(OpRecord(node.name, node.op, ascend_op, "HOST", dtype_name(outs[0].dtype), refs,
                                  precision={"list": None, "reason": "constant folded"}), outs, node.attrs)
            return outs
        if not float_idx and node.op != "Cast":
            # integer/bool op (shape arithmetic): exact in numpy; on constants the graph engine folds it
            self._keep(node, Light(node, signature(args), "int", opdef=opdef, refs=refs, ascend_op=ascend_op))
            folded = all(r in self.const for r in refs)
            outs = self._run(opdef, node, args, self._context())
            if folded:
                self.const.update(node.output_names())
            self._record(OpRecord(node.name, node.op, ascend_op, "HOST" if folded else "AICORE",
                                  dtype_name(outs[0].dtype) if outs else "", refs), outs, node.attrs)
            return outs
        orig = self._orig_dtype(node, args)
        if orig == "float64":
            return self._aicpu(node, args)   # no float64 on the AI Core
        const, inputs = self.const, self.graph_inputs
        producers = tuple([dtype_name(args[i].dtype) for i in float_idx
                           if refs[i] not in const and refs[i] not in inputs])
        key = (opdef.kind, ascend_op, orig, producers)
        made = self.decisions.get(key)
        if made is None:   # a decision depends on these only; its record form is made once too
            dec = self.dev.precision.decide(opdef.kind, ascend_op, orig, list(producers))
            made = self.decisions[key] = (dec, dec.to_dict())
        dec = made[0]
        precision = self.dev.precision
        if (precision.keep_names or precision.keep_types) and precision.keeps(
                node.name, ascend_op, fusion, meta.get("onnx_name")):
            dec = precision.keep_decision(opdef.kind, orig)
            made = (dec, dec.to_dict())
        casts = []      # (input index, the dtype it is cast to)
        if node.op != "Cast":   # an explicit TF Cast converts its input as it comes
            for i in float_idx:
                # a fused cube op's operands past (x, w) feed its elementwise chain, which runs on the
                # accumulator and meets them in the cube's output dtype (a backprop convolution's
                # out_backprop, its input 2, is a plain cube operand; an integer input past them, the shape of
                # MatMulReshapeBiasAddFusionPass's Reshape, is not in float_idx: never cast)
                chain_operand = opdef.kind == CUBE and i >= 2 and node.op.startswith("_Fused")
                target = dec.cube_out if chain_operand and dec.cube_out else dec.dtype
                if i in opdef.fp32_inputs and dtype_name(args[i].dtype) == "float32":
                    continue        # a parameter the CANN operator takes in float32
                if dtype_name(args[i].dtype) != target:
                    casts.append((i, target))
        if opdef.kind == CUBE and dec.dtype not in self.dev.numerics.chip.cube_dtypes:
            return self._cube_elsewhere(node, args, fusion, dec.dtype)
        if opdef.kind == CUBE and dec.dtype == "float32":
            family = self.dev.hf32_family(node)
            if family is not None:
                # the float32 operands (not a fused op's chain operands) are rounded to HF32 on their way in,
                # with the tie rule of the family's kernels
                hf32 = "hfloat32:" + self.dev.numerics.hf32_rounding_of(family)
                casts.extend((i, hf32) for i in float_idx
                             if not (i >= 2 and node.op.startswith("_Fused")) and i not in opdef.fp32_inputs)
        mx = self.dev.mx_axes(node) if opdef.kind == CUBE else None
        if mx:
            # the what-if replaces the operands' own casts (and HF32): MX values, multiplied in float32
            fmt = self.dev.numerics.cube_mx
            casts = [c for c in casts if c[0] not in mx] + [(i, f"mx:{fmt}:{ax}") for i, ax in mx.items()
                                                             if i in float_idx]
            compute = f"mx_{fmt}"
        elif opdef.kind == CUBE and dec.dtype == "hifloat8":
            compute = "hifloat8"    # its operands: HiFloat8 (as float16 values), the products accumulated in float32
        elif opdef.kind == CUBE:
            compute = None      # the cube's output dtype, from the op's context
        elif node.op == "Cast":
            compute = False     # a Cast computes in the dtype it converts to
        else:
            compute = dec.dtype
        prep = Prepared(node, signature(args), opdef, refs, ascend_op, fusion, float_idx, tuple(casts), dec,
                         made[1], compute)
        if node.op in PURE_MOVES and not casts and opdef.kind == MOVE and type(compute) is str:
            self._keep(node, Light(node, prep.sig, "move", opdef=opdef, refs=refs, ascend_op=ascend_op,
                                    compute=compute, precision=made[1], fusion=fusion))
        else:
            self._keep(node, prep)
        return self._eval_prepared(prep, node, args)

    def _eval_light(self, prep: Light, node: Node, args: list) -> tuple:
        """A :class:`Light` node: the records and outputs of the branches of ``_eval_node`` that made it."""
        kind = prep.kind
        if kind == "const":
            # read again each replay: the graph's constant may be a new array since (an edited graph, a test's
            # swap); the value kept in the Light would be served stale
            out = node.attrs["value"]
            if type(out) is not np.ndarray:
                return self._const(node)
            self.const.update(prep.outs)
            self._record(OpRecord(node.name, "Const", prep.ascend_op, "HOST", dtype_name(out.dtype), []), (out,),
                         node.attrs)
            return (out,)
        if kind == "placeholder":
            out = self.feeds[node.name]
            self._record(OpRecord(node.name, "Placeholder", "Data", "HOST", dtype_name(out.dtype), []), [out])
            return (out,)
        if kind == "move":
            try:
                out = prep.fn(*args, ctx=None, **prep.attrs)
            except Exception:   # inputs it cannot take (a Reshape to another batch): the full path's message
                out = self._run(prep.opdef, node, args, self._context())
            outs = out if type(out) is tuple else (out,)
            self._record(OpRecord(node.name, node.op, prep.ascend_op, "AICORE", prep.compute, list(prep.refs), 0,
                                  precision=dict(prep.precision), fusion=prep.fusion), outs, node.attrs)
            return outs
        refs = prep.refs
        # shape arithmetic met with the inputs of the last replay: its outputs again (nobody but the graph's ops sees
        # them: no dump, no kept tensors; the graph's outputs are never kept)
        key = fold_key(node.op, args) if self.fold_ok else None
        fold = prep.fold
        # (an "int" node reads node.attrs each replay: an attribute edited in place is met as the computation would)
        kept = (key is not None and fold is not None and fold[0] == key
                and (kind == "host" or _same_attrs(node.attrs, fold[2])))
        if kind == "host":
            if kept:
                outs = tuple([o.copy() for o in fold[1]])
            else:
                outs = prep.fn(*args, ctx=self._context(), **prep.attrs)
                outs = outs if isinstance(outs, tuple) else (outs,)
                if key is not None:
                    self._fold(prep, key, outs, None)
            self.const.update(prep.outs)
            self._record(OpRecord(node.name, node.op, prep.ascend_op, "HOST", dtype_name(outs[0].dtype) if outs
                                  else "", list(refs)), outs, node.attrs)
            return outs
        # "int": integer/bool shape arithmetic, folded on constants
        const = self.const
        folded = all(r in const for r in refs)
        if kept:
            outs = tuple([o.copy() for o in fold[1]])
        else:
            outs = self._run(prep.opdef, node, args, self._context())
            if key is not None:
                self._fold(prep, key, outs, node.attrs)
        if folded:
            const.update(prep.outs)
        self._record(OpRecord(node.name, node.op, prep.ascend_op, "HOST" if folded else "AICORE",
                              dtype_name(outs[0].dtype) if outs else "", list(refs)), outs, node.attrs)
        return outs

    def _fold(self, prep: Light, key: tuple, outs: tuple, attrs) -> None:
        """Keep ``outs`` of a "host" or "int" node for the next replay that meets inputs of key ``key``
        (:func:`~ascend_emu.npu.node_plan.fold_key`) and, for an "int" node, attributes equal to ``attrs``: copies
        of arrays of at most ``FOLD_ELEMENTS`` each (shape vectors), handed on as copies again, so that no consumer,
        caller or later replay shares memory with another replay's outputs or inputs; never a graph output."""
        if fold_key("", outs) is None or not self.graph_outputs.isdisjoint(prep.outs):
            return
        if attrs is not None:
            import copy

            snap = copy.deepcopy(attrs)
            if not _same_attrs(attrs, snap):
                return   # attributes that do not compare (arrays): computed each replay
            attrs = snap
        prep.fold = (key, tuple([o.copy() for o in outs]), attrs)

    def _const(self, node: Node) -> tuple:
        """A Const node: the host hands its value over (the registry's Const, without building an op context
        for it: ~12 us a node was the device's own work, 116 of them in a MobileNetV3 replay)."""
        value = node.attrs["value"]
        out = value if type(value) is np.ndarray else np.asarray(value)
        self.const.update(node.output_names())
        self._record(OpRecord(node.name, "Const", node.meta.get("ascend_type") or ascend_type("Const"), "HOST",
                              dtype_name(out.dtype), []), (out,), node.attrs)
        return (out,)

    def _eval_prepared(self, prep: Prepared, node: Node, args: list) -> tuple:
        """The rest of ``_eval_node`` for a node that computes on the AI Core: its casts, the op, its record."""
        opdef, refs, dec, float_idx = prep.opdef, prep.refs, prep.dec, prep.float_idx
        if prep.casts:
            cargs = list(args)
            for i, target in prep.casts:
                cargs[i] = self._cast(refs[i], args[i], target, opdef.reads_half)
        else:
            cargs = args
        # the run's context for the node's dtypes, unless the op gets a non-deterministic launch of its own
        if prep.multicore and not self.deterministic:
            ctx = self.dev.context(prep.cdt, dec.cube_out, op=node.name, tf_type=node.op, launch=self.launch)
        else:
            ctx = self._context(prep.ctx_key)
        fusion = prep.fusion
        try:
            outs = self._run(opdef, node, cargs, ctx, prep.attrs)
        except NotImplementedError as e:
            if fusion is not None:
                # a fused op has no TensorFlow node to hand to the AI CPU: name the pass that made it
                raise AscendEmuError(f"op {node.name} ({node.op}, made by {fusion.get('rule')}) cannot run on the "
                                     f"AI Core ({e}); switch {fusion.get('rule')} off in --fusion-switch") from None
            return self._aicpu(node, args)
        if ctx.status and opdef.reads_half:
            # the float32 rerun of an overflowing op sees the casts themselves (computed if deferred)
            cargs = [self._cast(refs[i], args[i], dec.dtype) if c is args[i] and i in float_idx
                     and dtype_name(c.dtype) != dec.dtype and i not in opdef.fp32_inputs else c
                     for i, c in enumerate(cargs)]
        fp32_check = self._fp32_check(opdef, node, cargs) if ctx.status else None
        compute = prep.compute
        if compute is None:
            compute = dtype_name(ctx.cube_out)
        elif compute is False:
            compute = dtype_name(outs[0].dtype)
        rec = OpRecord(node.name, node.op, prep.ascend_op, "AICORE", compute, list(refs), ctx.status,
                       precision=dict(prep.precision), fusion=fusion, fp32_check=fp32_check)
        if ctx.split is not None:
            self._record_split(rec, ctx.split, node.attrs)
            return outs
        self._record(rec, outs, node.attrs)
        return outs

    def _control_flow(self, node: Node, args: list) -> tuple:
        """A While/If/Case: its bodies run op by op on this device, each op recorded under its scope."""
        first = len(self.records)
        outs = CONTROL_FLOW[node.op](node, args, self._call)
        ran = len(self.records) - first
        dt = next((dtype_name(o.dtype) for o in outs if is_float(o)), "")
        self._record(OpRecord(node.name, node.op, ascend_type(node.op), "HOST", dt,
                              [tensor_name(r) for r in node.inputs],
                              precision={"list": None, "reason": f"control flow: its bodies ran {ran} ops, "
                                         f"recorded under {node.name}/..."}), outs, node.attrs)
        return outs

    def _call(self, fname: str, args: tuple, scope: str) -> tuple:
        """Run function ``fname`` of the graph on ``args``, its nodes named ``scope/<node>``."""
        sub = self.graph.functions.get(fname)
        if sub is None:
            raise AscendEmuError(f"the graph has no function {fname!r}; load the model with load_graph")
        if fname not in self.functions:
            # the graph engine compiles a body like any graph: the same fusion passes apply
            skip = None if self.dev.numerics.chip.fp32_cube else self.dev.cube_elsewhere
            fused = apply_fusion(sub, self.dev.fusion, self.dev.precision.lists, skip=skip)
            self.functions[fname] = (Graph(nodes=fused.nodes, inputs=sub.inputs, outputs=sub.outputs,
                                           name=sub.name, functions=self.graph.functions), fused.fused_away)
        fg, fused_away = self.functions[fname]
        # names from the unfused body: a fused op has the name the reference gives the op it ends
        nodes = fg.scoped(scope, names_from=sub)
        names = dict(zip((n.name for n in fg.nodes), (n.name for n in nodes)))
        if self.writer is not None and fused_away:
            # the ops a fusion swallowed in this execution of the body, under this execution's names
            full = dict(zip((n.name for n in sub.nodes), (n.name for n in sub.scoped(scope))))
            for f in fused_away:
                self.writer.add_fused(full[f["name"]], f["tf_type"], f["rule"], full.get(f["into"], f["into"]))
        env = {f"{names[spec.name]}:0": a for spec, a in zip(fg.inputs, args)}
        interpret([n for n in nodes if n.op != "Placeholder"], env, self.eval_node)
        if self.keep:
            self.scoped_outputs.update(env)
        return tuple(env[f"{names[node]}:{idx}"] for node, idx in map(split_tensor_name, fg.outputs))

    def _run(self, opdef, node, args, ctx, attrs: dict | None = None) -> tuple:
        """Run one op; a failure of an emulated kernel names the op instead of showing a traceback. ``attrs``: the
        node's attributes the op's function takes, picked out already (``Prepared.attrs``)."""
        cube = opdef.kind == CUBE
        threads = self.threads
        if threads.full != 1:      # (one Numba thread: every op runs on one, nothing to fit)
            size = 0
            for a in args:
                n = a.size if type(a) is np.ndarray else np.size(a)
                if n > size:
                    size = n
            if cube and (self.serial_cube or (size > SMALL_OP_ELEMENTS and _serial_product(node, args))):
                size = 0
            threads.fit(size, SMALL_OP_ELEMENTS if cube else SMALL_VECTOR_ELEMENTS)
        # a layer's convolutions read the same x / dy: its widened, padded copy and NaN test made once a replay
        token = _shared.begin(self.operands) if cube else None
        try:
            if attrs is None:
                return opdef(*args, ctx=ctx, **node.attrs)
            out = opdef.fn(*args, ctx=ctx, **attrs)
            return out if isinstance(out, tuple) else (out,)
        except (NotImplementedError, AscendEmuError):
            raise
        except Exception as e:   # a kernel that cannot handle this node's inputs
            shapes = ", ".join(str(tuple(np.shape(a))) for a in args)
            raise AscendEmuError(f"op {node.name} ({node.op}) failed in the emulator on inputs {shapes}: "
                                 f"{type(e).__name__}: {e} (inputs this op cannot take: check the model, e.g. "
                                 "with onnx.checker or TensorFlow; if the model is valid, a limitation of "
                                 "ascend-emu's kernel for this op: please report it with the model)") from e
        finally:
            if token is not None:
                _shared.end(token)

    def _fp32_check(self, opdef, node, args) -> dict:
        """msprobe-style verdict input: rerun the op in float32 on the same inputs."""
        ctx = OpContext(dtype="float32", overflow_mode="inf_nan", cube_model=self.dev.cube_model,
                        impl_mode=self.dev.impl_mode, op_model=self.dev.op_model)
        up = [a.astype(np.float32) if is_float(a) else a for a in args]
        with np.errstate(all="ignore"):
            outs = opdef(*up, ctx=ctx, **node.attrs)
        finite = True
        max_abs = 0.0
        for o in outs:
            if is_float(o) and o.size:
                o64 = np.asarray(o, dtype=np.float64)
                fin = np.isfinite(o64)
                finite &= bool(fin.all())
                if fin.any():
                    max_abs = max(max_abs, float(np.abs(o64[fin]).max()))
        return {"overflow": not finite, "max_abs": max_abs, "status": int(ctx.status)}

    def _cube_elsewhere(self, node: Node, args, fusion, dtype: str) -> tuple:
        """A cube op whose dtype (float32, bf16) stays under the precision mode on a SoC whose cube lacks it: GE
        selects the AI CPU kernel (NUMERICS.md section 13); with the fallback off, or for a fused op (which has no
        AI CPU kernel), an error."""
        from ..numerics.policy import SOCS

        soc = self.dev.soc
        if fusion is not None or not self.dev.aicpu_fallback:
            raise AscendEmuError(f"op {node.name} ({node.op}) computes in {dtype} under "
                                 f"{self.dev.precision.mode}, and {soc}'s cube has no {dtype}"
                                 + ("" if fusion is None else f" (fused by {fusion.get('rule')})")
                                 + "; turn the AI CPU fallback on, choose a mode that drops cube ops to fp16 "
                                   f"(allow_fp32_to_fp16, allow_mix_precision) or a SoC whose cube has {dtype} ("
                                 + ", ".join(n for n, c in SOCS.items() if dtype in c.cube_dtypes) + ")")
        return self._aicpu(node, args, reason=f"{soc}'s cube has no {dtype} and {self.dev.precision.mode} keeps "
                                              f"{dtype}: GE places the op on the AI CPU")

    def _elsewhere(self, node: Node, args) -> tuple:
        """An exported program's op of the 910B and later (FlashAttentionScore) on an earlier SoC: its aten call on the
        AI CPU, as the eager door runs it there."""
        alt = node.meta["aten_elsewhere"]
        meta = {k: v for k, v in alt.items() if k not in ("inputs", "op")}
        call = Node(name=node.name, op=alt["op"], inputs=[node.inputs[i] for i in alt["inputs"]],
                    num_outputs=node.num_outputs, meta={**meta, "aten_engine": "AICPU"})
        return self._aicpu(call, [args[i] for i in alt["inputs"]], reason=alt["aten_reason"])

    def _aten_exact(self, node: Node, args) -> tuple:
        """An ``Aten<Op>`` node of an exported PyTorch program that only moves data (the host) or that torch computes
        exactly as the AI Core does (a window maximum): run by torch in the dtypes it is given."""
        from .torch_run.aicpu import run_aten_node

        outs = tuple(run_aten_node(node, args))
        refs = [tensor_name(r) for r in node.inputs]
        engine = node.meta["aten_engine"]
        if engine == "HOST" and all(r in self.const for r in refs):
            self.const.update(node.output_names())
        dt = next((dtype_name(o.dtype) for o in outs if is_float(o)), dtype_name(outs[0].dtype) if outs else "")
        # (exact: no precision list changes it, so mixlist-search does not try one)
        self._record(OpRecord(node.name, node.op, ascend_type(node.op), engine, dt, refs,
                              precision={"list": None, "reason": node.meta.get("aten_reason", ""), "exact": True}),
                     outs, node.attrs)
        return outs

    def _aicpu(self, node: Node, args, reason: str = "no AI Core kernel: runs on the AI CPU in its original "
                                                     "dtype") -> tuple:
        if not self.dev.aicpu_fallback:
            raise UnsupportedOpError([node.op])
        if "aten" in node.meta and "aten_engine" in node.meta:
            # an exported PyTorch program's aten call without an AI Core lowering: torch in float32
            from .torch_run.aicpu import run_aten_node as run_node
        elif self.graph.pt2 is not None:
            # a registry op an exported program's lowering launched: the AI CPU computes its math in float32
            run_node = _float32_op
        elif "onnx_node" in node.meta or self.graph.onnx is not None:
            # an ONNX model's AI CPU is onnxruntime, for its fallback nodes and the registry ops they map to
            from .aicpu_onnx import run_onnx_node as run_node
        else:
            from .aicpu import run_tf_node as run_node
        orig = []
        for a, ref in zip(args, node.inputs):
            if is_float(a) and dtype_name(a.dtype) in ("float16", "bfloat16"):
                a = self._cast(tensor_name(ref), a, "float32")
            orig.append(a)
        outs = tuple(run_node(node, orig))
        status = 0
        max_abs = 0.0
        for o in outs:
            if is_float(o) and o.size:
                o64 = np.asarray(o, dtype=np.float64)
                fin = np.isfinite(o64)
                if not fin.all():
                    status |= 0x20
                if fin.any():
                    max_abs = max(max_abs, float(np.abs(o64[fin]).max()))
        dt = dtype_name(outs[0].dtype) if outs else ""
        # the AI CPU already runs the op in its original dtype: an overflow there is the model's own
        fp32_check = {"overflow": True, "max_abs": max_abs, "status": status} if status else None
        self._record(OpRecord(node.name, node.op, ascend_type(node.op), "AICPU", dt,
                              [tensor_name(r) for r in node.inputs], status,
                              precision={"list": None, "reason": reason},
                              fp32_check=fp32_check),
                     outs, node.attrs)
        return outs


def _serial_product(node: Node, args) -> bool:
    """Whether ``node`` is a product that its kernels run on one thread (``threads.product_macs``)."""
    macs = product_macs(node.op, args, node.attrs)
    return macs is not None and macs <= _cube_core.SERIAL_MACS


def _same_attrs(a: dict, b: dict) -> bool:
    """Whether two nodes' attributes are equal (False where they do not compare: an array among them)."""
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False

"""Load a ``torch.export`` program (a ``.pt2`` file) as a plain :class:`~ascend_emu.graph.Graph`.

The file is read as a hostile input (:mod:`.archive`). Its graph is decomposed to the aten ops torch's CPU
dispatcher calls in eager mode, so the eager door's lowerings meet the same calls: torch's core-aten
decompositions, except for every op :mod:`..aten` lowers (kept whole, as eager mode sees it), and
``scaled_dot_product_attention`` as the CPU dispatcher runs it (``_scaled_dot_product_flash_attention_for_cpu``,
whose lowering is FlashAttentionScore). Then every FX node becomes nodes of the plain graph:

- a user input a ``Placeholder``, a parameter, buffer or constant a ``Const`` (under the FX names);
- an aten call with a lowering: the registry ops the lowering launches, traced (:mod:`.trace`); the node making
  the call's first output carries the FX node's name (so the dump's op names are the FX names);
- an aten call without one, or one its lowering sends to the AI CPU (``Fallback``): one node of op type
  ``Aten<Op>`` run by torch (:mod:`.node`): on the AI CPU in float32 as the eager door does, on the host for
  the data-movement ops of :data:`..aten.HOST`, on the AI Core for an exact op the lowering leaves to torch.

Nodes nothing reads are dropped (a layout transpose back to NCHW that the next NHWC op skips), as the ONNX door does.
"""
from __future__ import annotations

import hashlib
import operator
import os

import numpy as np
import torch

from ....errors import AscendEmuError
from ....graph.core import Graph, InputSpec, Node, feeding
from .. import aten as _aten
from .. import aten_conv  # noqa: F401  (registers the convolution lowerings into aten.ATEN)
from .. import aten_fused  # noqa: F401  (registers the attention and fused kernels' lowerings into aten.ATEN)
from ..convert import dtype_name, to_numpy
from .archive import load_exported_program
from .trace import TAINT, ExactCall, Tracer, Untraceable, same_trace, tracing


class Pt2Source:
    """What the reference and the AI CPU need of the exported program a graph came from."""

    def __init__(self, program, fx_outputs: dict, user_inputs: list, output_nodes: list):
        self.program = program              # the decomposed ExportedProgram
        #: graph node name -> [(FX node name, index or None)] per output: the FX values it stands for
        self.nodes = fx_outputs
        self.user_inputs = user_inputs      # the FX placeholder names of the user inputs, in order
        self.output_nodes = output_nodes    # the graph tensors of the program's outputs


class _Arg:
    """A tensor argument's place in an ``Aten<Op>`` node's argument template: its ``i``-th graph input."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __reduce__(self):
        return _Arg, (self.i,)


def _decomposed(ep):
    """The program at the level of the eager dispatcher (module docstring)."""
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if isinstance(op, torch._ops.OpOverload) and _aten.lookup(op) is not None:
            del table[op]
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    math = table.get(sdpa)

    def sdpa_as_cpu(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if (dropout_p == 0.0 and not enable_gqa and q.dim() == 4 and q.dtype == k.dtype == v.dtype
                and (attn_mask is None or attn_mask.dtype == torch.bool)):
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]
        return math(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    if math is not None:
        table[sdpa] = sdpa_as_cpu
    return ep.run_decompositions(table)


def _camel(packet: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in packet.split("_") if p)


def _val(node):
    return node.meta.get("val")


def _example(value, gen: torch.Generator):
    """A concrete example of FX value ``value`` (a FakeTensor's shape and dtype): random floats, zeros else."""
    if isinstance(value, torch.Tensor):
        shape = tuple(int(s) for s in value.shape)
        if value.dtype.is_floating_point:
            return torch.randn(shape, generator=gen, dtype=torch.float32).to(value.dtype)
        return torch.zeros(shape, dtype=value.dtype)
    return value


class _Build:
    def __init__(self, ep):
        self.ep = ep
        self.nodes: list[Node] = []
        self.refs: dict = {}            # FX node name -> graph tensor, or a list of them (a tuple value)
        self.envs = ({}, {})            # FX node name -> concrete value, two examples
        self.transposes: dict = {}      # graph tensor made by a Transpose -> (its input, perm)
        self.fx_outputs: dict = {}
        self.gens = (torch.Generator().manual_seed(1), torch.Generator().manual_seed(2))
        self.const_refs: set = set()    # graph tensors of the parameters, buffers and constants

    # -- values ---------------------------------------------------------------------------------------
    def _map(self, x, env):
        if isinstance(x, torch.fx.Node):
            return env[x.name]
        if isinstance(x, (list, tuple)):
            return type(x)(self._map(v, env) for v in x)
        if isinstance(x, dict):
            return {k: self._map(v, env) for k, v in x.items()}
        return x

    def _ref_of(self, x: torch.fx.Node):
        r = self.refs.get(x.name)
        if r is None:
            raise AscendEmuError(f"FX node {x.name!r} reads {x.name!r}, which makes no tensor")
        return r

    # -- inputs ---------------------------------------------------------------------------------------
    def placeholders(self, user_specs: list) -> list:
        sig = self.ep.graph_signature
        kinds = {s.arg.name: s for s in sig.input_specs if hasattr(s.arg, "name")}
        consts = {**self.ep.state_dict, **self.ep.constants}
        specs = []
        for n in self.ep.graph.nodes:
            if n.op != "placeholder":
                continue
            spec = kinds.get(n.name)
            kind = spec.kind.name if spec is not None else "USER_INPUT"
            if kind == "USER_INPUT":
                v = _val(n)
                if not isinstance(v, torch.Tensor):
                    raise AscendEmuError(f"exported input {n.name!r} is not a tensor ({type(v).__name__}); "
                                         "export a model whose inputs are tensors")
                if not all(type(d) is int for d in v.shape):
                    raise AscendEmuError(f"exported input {n.name!r} has dynamic dimensions {tuple(v.shape)}; "
                                         "ascend-emu replays static shapes: export without dynamic_shapes, for the "
                                         "shape to run")
                dt = dtype_name(v.dtype)
                shape = [int(s) for s in v.shape]
                self.nodes.append(Node(name=n.name, op="Placeholder", attrs={"dtype": dt, "shape": shape}))
                specs.append(InputSpec(n.name, dt, shape))
                user_specs.append(n.name)
                for env, g in zip(self.envs, self.gens):
                    env[n.name] = _example(v, g)
            else:
                t = consts.get(spec.target)
                if not isinstance(t, torch.Tensor):
                    raise AscendEmuError(f"exported {kind.lower()} {spec.target!r} is not a tensor; export a model "
                                         "whose parameters and buffers are tensors")
                value = np.array(to_numpy(t.detach().contiguous()))
                self.nodes.append(Node(name=n.name, op="Const", attrs={"value": value, "dtype": value.dtype.name},
                                       meta={"torch_target": spec.target}))
                for env in self.envs:
                    env[n.name] = t.detach()
                self.const_refs.add(f"{n.name}:0")
            self.refs[n.name] = f"{n.name}:0"
            self.fx_outputs[n.name] = [(n.name, None)]
        return specs

    # -- calls ----------------------------------------------------------------------------------------
    def call(self, n: torch.fx.Node) -> None:
        if n.target is operator.getitem:
            src, idx = n.args
            r = self._ref_of(src)
            self.refs[n.name] = r[idx] if isinstance(r, list) else r
            for env in self.envs:
                env[n.name] = env[src.name][idx]
            return
        func = n.target
        if not isinstance(func, torch._ops.OpOverload):
            raise AscendEmuError(f"exported node {n.name!r} calls {getattr(func, '__name__', func)!r}, not an aten "
                                 "op; export with torch.export.export (strict or not) and no custom Python calls")
        outs = []
        for env in self.envs:
            args, kwargs = self._map(n.args, env), self._map(n.kwargs, env)
            with torch.no_grad():
                outs.append(func(*args, **kwargs))
        for env, o in zip(self.envs, outs):
            env[n.name] = o
        if _val(n) is None and not n.users:
            return      # an assertion (_assert_tensor_metadata, _assert_async): checked by torch above, no value
        packet = func.overloadpacket.__name__
        host = f"aten.{packet}" in _aten.HOST
        low = _aten.lookup(func)
        engine, reason = "AICPU", f"no lowering of {func}: runs on the AI CPU in float32"
        if low is not None:
            try:
                if self._lowered(n, func, low):
                    return
            except _aten.Fallback as e:
                reason = f"the lowering sends it to the AI CPU: {e}"
            except _aten.Host:
                engine, reason = "HOST", "exact data movement: the host"
            except ExactCall:
                engine, reason = "AICORE", "exact: torch computes it as the AI Core does"
            except Untraceable as e:
                reason = f"the lowering's graph cannot be traced ({e}): the AI CPU"
            except AscendEmuError:
                raise
            except Exception as e:      # a lowering that cannot take this call's arguments: torch runs it
                reason = f"the lowering fails on this call ({type(e).__name__}): the AI CPU"
        elif host:
            engine, reason = "HOST", "exact data movement: the host"
        self._aten_node(n, func, engine, reason)

    def _lowered(self, n, func, low) -> bool:
        traces = []
        for env in self.envs:
            tr = Tracer(n.name, self.transposes, self.const_refs)
            args, kwargs = self._map(n.args, env), self._map(n.kwargs, env)
            for a, x in zip(_flat(args) + _flat(list(kwargs.values())),
                            _flat(n.args) + _flat(list(n.kwargs.values()))):
                if isinstance(a, torch.Tensor) and isinstance(x, torch.fx.Node):
                    tr.track(a, self._ref_of(x))
            with tracing(tr), torch.no_grad():
                out = low(tr, *args, **kwargs)
            res = [(tr.ref_of(t) if isinstance(t, torch.Tensor) else None, t) for t in _flat_out(out)]
            traces.append((tr, res))
        (ta, ra), (tb, rb) = traces
        users = _used_outputs(n)
        outs_a = [r if r is not None else ("const", t) for r, t in ra]
        outs_b = [r if r is not None else ("const", t) for r, t in rb]
        if not same_trace(ta.entries, tb.entries) or len(outs_a) != len(outs_b):
            raise Untraceable("it reads its inputs' values")
        for i in users:
            if i >= len(outs_a):
                raise Untraceable("fewer outputs than the program reads")
            a, b = outs_a[i], outs_b[i]
            if isinstance(a, tuple) or isinstance(b, tuple):
                if not (isinstance(a, tuple) and isinstance(b, tuple) and isinstance(a[1], torch.Tensor)
                        and torch.equal(a[1], b[1])) or a[1].dtype != b[1].dtype:
                    raise Untraceable("an output computed outside the registry ops")
            elif a != b or a == TAINT:
                raise Untraceable("an output derived by an untraced computation")
        self._commit(n, ta, outs_a, users)
        return True

    def _commit(self, n, tr: Tracer, outs: list, users) -> None:
        """Add a traced call's nodes; the node of its first output takes the FX node's name."""
        rename = {}
        first = outs[0] if outs else None
        if isinstance(first, str) and first.endswith(":0") and first.startswith(f"{n.name}/"):
            rename[first[:-2]] = n.name

        def fix(r):
            if not isinstance(r, str):
                return r
            node, _, idx = r.rpartition(":")
            return f"{rename.get(node, node)}:{idx}"
        const_outs = {}
        for e in tr.entries:
            if e[0] == "const":
                _, name, value = e
                # (internal: a step of the FX node's lowering, not a tensor of the program; compare leaves it out)
                self.nodes.append(Node(name=name, op="Const", attrs={"value": value, "dtype": value.dtype.name},
                                       meta={"internal": n.name}))
            else:
                _, name, op, inputs, attrs, k = e
                name = rename.get(name, name)
                # (onnx_name: the source node an op is part of, which --keep-dtype and the fusion owners read)
                meta = {"torch_name": n.name, "aten": str(n.target), "onnx_name": n.name}
                if name == n.name:
                    meta["source_type"] = str(n.target)
                    if tr.notes:
                        meta["notes"] = list(tr.notes)
                else:
                    meta["internal"] = n.name
                self.nodes.append(Node(name=name, op=op, inputs=[fix(r) for r in inputs], attrs=attrs,
                                       num_outputs=k, meta=meta))
        for r, (src, perm) in tr.local_t.items():
            self.transposes[fix(r)] = (fix(src), perm)
        refs = []
        for i, o in enumerate(outs):
            if isinstance(o, tuple):
                if i in users:
                    t = o[1]
                    name = f"{n.name}/output_{i}"
                    v = np.array(to_numpy(t))
                    self.nodes.append(Node(name=name, op="Const", attrs={"value": v, "dtype": v.dtype.name}))
                    const_outs[i] = f"{name}:0"
                refs.append(const_outs.get(i))
            else:
                refs.append(fix(o))
        self.refs[n.name] = refs if isinstance(_val(n), (list, tuple)) else refs[0]
        if refs and isinstance(refs[0], str) and refs[0] == f"{n.name}:0":
            self.fx_outputs[n.name] = [(n.name, 0 if isinstance(_val(n), (list, tuple)) else None)]
            if tr.needs_fp32_cube:
                self._elsewhere(n, next(x for x in self.nodes if x.name == n.name))

    def _elsewhere(self, n, node: Node) -> None:
        """Keep the call itself on ``node`` (its op of the 910B and later) for a SoC without that kernel: the
        replay runs it on the AI CPU there, when the call's tensors are among the node's inputs and its outputs
        are the node's."""
        inputs, args, kwargs = self._template(n)
        val = _val(n)
        vals = list(val) if isinstance(val, (list, tuple)) else [val]
        if any(r not in node.inputs for r in inputs) or len(vals) != node.num_outputs or \
                not all(isinstance(v, torch.Tensor) for v in vals):
            return
        node.meta["aten_elsewhere"] = {
            "op": "Aten" + _camel(n.target.overloadpacket.__name__), "inputs": [node.inputs.index(r) for r in inputs],
            "aten": str(n.target), "aten_args": (args, kwargs),
            "aten_dtypes": [dtype_name(v.dtype) for v in vals], "aten_outputs": None,
            "aten_reason": "no FlashAttentionScore before the 910B: the call runs on the AI CPU in float32"}

    def _template(self, n):
        """The graph tensors of call ``n``'s tensor arguments and its arguments with each replaced by its place."""
        inputs: list = []

        def template(x):
            if isinstance(x, torch.fx.Node):
                r = self._ref_of(x)
                if isinstance(r, list):
                    raise AscendEmuError(f"exported node {n.name!r} takes the tuple {x.name!r} whole")
                if r is None:
                    raise AscendEmuError(f"exported node {n.name!r} reads an output of {x.name!r} that is not kept")
                inputs.append(r)
                return _Arg(len(inputs) - 1)
            if isinstance(x, (list, tuple)):
                return type(x)(template(v) for v in x)
            if isinstance(x, dict):
                return {k: template(v) for k, v in x.items()}
            return x

        args, kwargs = template(tuple(n.args)), template(dict(n.kwargs))
        return inputs, args, kwargs

    def _aten_node(self, n, func, engine: str, reason: str) -> None:
        """The call as itself: an ``Aten<Op>`` node (module docstring)."""
        inputs, args, kwargs = self._template(n)
        val = _val(n)
        tuple_out = isinstance(val, (list, tuple))
        # the outputs the program reads (a max pool's indices, which nothing reads, are not the op's outputs)
        kept = sorted(_used_outputs(n)) if tuple_out else [0]
        vals = [(list(val) if tuple_out else [val])[i] for i in kept]
        if not all(isinstance(v, torch.Tensor) for v in vals):
            raise AscendEmuError(f"exported node {n.name!r} ({func}) gives a value that is not a tensor; export with "
                                 "static shapes")
        dtypes = [dtype_name(v.dtype) for v in vals]
        self.nodes.append(Node(name=n.name, op="Aten" + _camel(func.overloadpacket.__name__), inputs=inputs,
                               num_outputs=len(vals), output_dtypes=dtypes,
                               output_shapes=[[int(s) for s in v.shape] for v in vals],
                               meta={"aten": str(func), "aten_args": (args, kwargs), "aten_engine": engine,
                                     "aten_reason": reason, "aten_dtypes": dtypes, "torch_name": n.name,
                                     "aten_outputs": kept if tuple_out else None, "source_type": str(func)}))
        if tuple_out:
            self.refs[n.name] = [f"{n.name}:{kept.index(i)}" if i in kept else None for i in range(len(val))]
        else:
            self.refs[n.name] = f"{n.name}:0"
        self.fx_outputs[n.name] = [(n.name, i if tuple_out else None) for i in kept]


def _flat(x) -> list:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flat(v)]
    return [x]


def _flat_out(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _used_outputs(n) -> set:
    """The output indices of FX node ``n`` that the program reads (all of a plain tensor: {0})."""
    if not isinstance(_val(n), (list, tuple)):
        return {0}
    used = set()
    for u in n.users:
        if u.target is operator.getitem:
            used.add(int(u.args[1]))
        else:
            used.update(range(len(_val(n))))
    return used



def load_pt2(model, *, input_shapes=None) -> Graph:
    """Load a ``torch.export`` program (a ``.pt2`` path or an ``ExportedProgram``) as a :class:`Graph`.

    ``input_shapes`` (``--shape``) must match the shapes the program was exported with (an exported program
    has static shapes here). Raises :class:`AscendEmuError` (one line) for a missing, damaged or unsafe file.
    """
    import warnings

    with warnings.catch_warnings():
        # (torch's own deprecation warnings while it deserialises and decomposes are not the user's business)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return _load_pt2(model, input_shapes)


def _load_pt2(model, input_shapes) -> Graph:
    if isinstance(model, (str, os.PathLike)):
        ep = load_exported_program(model)
        name = os.path.splitext(os.path.basename(os.fspath(model)))[0]
        with open(model, "rb") as f:
            fingerprint = hashlib.sha256(f.read()).hexdigest()
    else:
        ep, name, fingerprint = model, "model", ""
    sig = ep.graph_signature
    bad = [s for s in sig.output_specs if s.kind.name != "USER_OUTPUT"]
    if bad:
        raise AscendEmuError(f"the exported program updates {bad[0].kind.name.lower().replace('_', ' ')} "
                             f"{bad[0].target!r}: replay takes an inference graph; export model.eval()")
    try:
        ep = _decomposed(ep)
    except AscendEmuError:
        raise
    except Exception as e:
        raise AscendEmuError(f"torch cannot decompose the exported program {name!r} to aten ops: "
                             f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__}"
                             ) from None
    b = _Build(ep)
    users: list = []
    specs = b.placeholders(users)
    _check_shapes(specs, input_shapes)
    outputs: list = []
    for n in ep.graph.nodes:
        if n.op == "call_function":
            try:
                b.call(n)
            except AscendEmuError:
                raise
            except (RuntimeError, ValueError, TypeError, IndexError) as e:
                raise AscendEmuError(f"exported node {n.name!r} ({n.target}) fails on its exported shapes: "
                                     f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__}"
                                     ) from None
        elif n.op == "output":
            for x in _flat(n.args[0]):
                if not isinstance(x, torch.fx.Node):
                    raise AscendEmuError("the exported program returns a value that is not a tensor")
                r = b._ref_of(x)
                if not isinstance(r, str):
                    raise AscendEmuError(f"the exported program returns {x.name!r}, which is not one tensor")
                outputs.append(r)
        elif n.op not in ("placeholder",):
            raise AscendEmuError(f"exported node {n.name!r} is a {n.op!r} node; export with torch.export.export")
    _scopes(ep, b.nodes)
    nodes = feeding(b.nodes, outputs)
    keep = {x.name for x in nodes}
    src = Pt2Source(ep, {k: v for k, v in b.fx_outputs.items() if k in keep}, users, outputs)
    out_names = [s.arg.name for s in sig.output_specs]
    return Graph(nodes=nodes, inputs=specs, outputs=outputs, name=str(name), fingerprint=fingerprint,
                 output_names=out_names, pt2=src)


def _scopes(ep, nodes) -> None:
    """The module path each op comes from (``layer1/layer1.0/layer1.0.conv1``, as the ONNX door's scope)."""
    stacks = {n.name: n.meta.get("nn_module_stack") for n in ep.graph.nodes}
    for node in nodes:
        st = stacks.get(node.meta.get("torch_name"))
        if st:
            node.meta["scope"] = "/".join(str(v[0]) for v in st.values() if v and v[0])


def _check_shapes(specs, input_shapes) -> None:
    if not input_shapes:
        return
    from ...shapes import shape_items

    have = {s.name: s for s in specs}
    for key, shape in shape_items(input_shapes):
        s = have.get(key)
        if s is None:
            raise AscendEmuError(f"--shape names unknown input {key!r}; the program's inputs are: " + ", ".join(have))
        if [int(d) for d in shape] != list(s.shape):
            raise AscendEmuError(f"--shape {key}={','.join(map(str, shape))}: the program was exported with shape "
                                 f"{tuple(s.shape)}; export it again for that shape (or with dynamic_shapes)")

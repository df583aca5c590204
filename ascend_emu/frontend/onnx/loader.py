"""Load an ONNX model (the input of Ascend's ATC) as a plain :class:`~ascend_emu.graph.Graph`.

The sibling of :mod:`.loader` for ``.onnx`` files (opsets 7 and up; ATC takes 11 to 18, exporters write
13 to 21): the file is parsed (its external data files read from beside it), checked with
``onnx.checker``, given the input shapes of ``--shape`` for its dynamic dims, and run through ONNX's
shape inference. Every ONNX node then becomes registry ops (:mod:`.ops`, :mod:`.array`), the
last of which carries the node's own name, so the dump's op names are the ONNX node names and its
outputs ``name:index`` (a node without a name is ``<OpType>_<position>``). A node the registry cannot
express runs as itself on the emulated AI CPU (op type ``Onnx<OpType>``, onnxruntime in float32,
:mod:`.node`). Graph inputs become ``Placeholder`` nodes, initializers and ``Constant`` nodes ``Const``
nodes, under their ONNX names; nodes that feed no output are dropped.

Values known when the model loads (initializers, constants, the shapes inference makes static, integer
arithmetic on them) are folded with ONNX's reference evaluator, so the shape arithmetic PyTorch exports
(Shape, Gather, Concat, Reshape) resolves; the nodes stay in the graph (and the dump) all the same.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import AscendEmuError
from ...graph.core import Graph, InputSpec, Node, feeding
from ...numerics.memo import freeze as read_only
from .build import FLOATS, ONNX_DTYPES, Builder, Fallback, all_tensors
from .ops import CONVERTERS, Onnx
from . import array  # noqa: F401  (registers the data-movement converters)
from . import rnn  # noqa: F401  (registers the recurrent converters: LSTM)
from ..shapes import check_shape_fits, shape_items

#: largest input (elements) a load-time fold evaluates
FOLD_LIMIT = 1 << 16
#: protobuf's limit on one serialized message: the model is held (and handed to onnxruntime) as one, its
#: external data inlined
PROTO_LIMIT = (1 << 31) - 1
#: ops folded when their inputs are known, whatever their dtype (they compute nothing in float)
_FOLD_ANY = frozenset({"Shape", "Size", "Constant", "ConstantOfShape", "Identity", "Unsqueeze", "Squeeze",
                       "Concat", "Gather", "Slice", "Reshape", "Cast", "Range"})


@dataclass
class OnnxSource:
    """What the reference and the AI CPU need of the ONNX model a graph came from."""

    model: bytes                    # the model, external data included
    opset: int
    #: ONNX tensor name -> graph tensor ("node:index")
    tensors: dict = field(default_factory=dict)
    #: graph node name -> the ONNX node's output tensor names (ONNX nodes, graph inputs, initializers)
    nodes: dict = field(default_factory=dict)
    #: ONNX nodes the graph leaves out (a transpose back to NCHW nothing reads), by name: the reference dumps them
    extra: dict = field(default_factory=dict)


def is_onnx(model) -> bool:
    if isinstance(model, (str, os.PathLike)):
        return str(model).lower().endswith(".onnx")
    return type(model).__name__ == "ModelProto"


def _read(model):
    import onnx
    from google.protobuf.message import DecodeError

    if not isinstance(model, (str, os.PathLike)):
        m = model.__deepcopy__() if hasattr(model, "__deepcopy__") else model
        _check_proto_size(m, 0, "model")
        _inline_external_data(m, None)
        return m, "model"
    path = Path(model)
    if not path.is_file():
        raise AscendEmuError(f"model path {str(path)!r} does not exist or is not a file")
    try:
        m = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise AscendEmuError(f"{str(path)!r} is not a valid ONNX model ({_line(e)}); export it again") from None
    _check_proto_size(m, _external_bytes(m, path), path.name)
    _inline_external_data(m, path)
    return m, path.stem


def _external_bytes(m, path) -> int:
    """The bytes the external data of ``m`` adds when inlined: each tensor's ``length``, else the rest of its
    file from ``offset`` (a file that is not there counts 0: reading it fails with its own message)."""
    from onnx import TensorProto

    total = 0
    for t in all_tensors(m):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        try:
            if "length" in info:
                total += int(info["length"])
            else:
                total += max(os.path.getsize(path.parent / info.get("location", "")) - int(info.get("offset", 0)), 0)
        except (OSError, ValueError):
            pass
    return total


def _check_proto_size(m, external: int, name: str) -> None:
    """Refuse, in one line, a valid model larger than protobuf's 2 GiB message limit with its external data
    inlined (not "malformed": onnx's checker and onnxruntime's in-memory sessions both stop there)."""
    size = m.ByteSize() + external
    if size > PROTO_LIMIT:
        raise AscendEmuError(f"ONNX model {name!r} holds {size / 2 ** 30:.2f} GiB with its external data; ascend-emu "
                             f"reads a model whole as one protobuf message, which protobuf limits to 2 GiB: replay a "
                             f"smaller export of it (fewer layers, or its weights in float16)")


def _inline_external_data(m, path) -> None:
    """Read every tensor's external data into the model, relative to the model's directory ``path.parent``
    with onnx's checks (a relative path that stays inside that directory, a regular file, no symbolic link
    on the way), so nothing later (``numpy_helper.to_array``, an onnxruntime session built from bytes)
    resolves a reference against the current directory. ``path`` None (a ModelProto given in memory, which
    has no directory): a model with external references is refused."""
    from onnx import TensorProto
    from onnx.external_data_helper import load_external_data_for_tensor

    for t in all_tensors(m):
        if t.data_location != TensorProto.EXTERNAL:
            continue
        if path is None:
            raise AscendEmuError(f"ONNX tensor {t.name[:80]!r} keeps its data in an external file, and an "
                                 "in-memory model has no directory to read it from; give the .onnx path, or "
                                 "load the model with onnx.load (which reads its external data)")
        try:
            load_external_data_for_tensor(t, str(path.parent))
        except Exception as e:
            raise AscendEmuError(f"cannot read the external data of {str(path)!r} (tensor {t.name[:80]!r}): "
                                 f"{_line(e)}; keep the data files beside the model") from None


def sparse_to_dense(s) -> np.ndarray:
    """The dense array of a SparseTensorProto (a sparse initializer): its values at its indices (linear
    indices, or one row of coordinates per value), zeros elsewhere."""
    from onnx import numpy_helper

    values = numpy_helper.to_array(s.values)
    indices = numpy_helper.to_array(s.indices).astype(np.int64)
    dims = [int(d) for d in s.dims]
    dense = np.zeros(dims, values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def _line(e) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


def _opset(m) -> int:
    import onnx

    newest = onnx.defs.onnx_opset_version()
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            if not 7 <= o.version <= newest:
                raise AscendEmuError(f"the ONNX model imports opset {o.version} of ai.onnx; ascend-emu takes opsets 7 "
                                     f"to {newest} (ATC takes 11 to 18): export it again with one of those")
            return int(o.version)
    raise AscendEmuError("the ONNX model imports no version of the default opset (ai.onnx)")


def _check(m, name: str) -> None:
    import onnx

    if not m.graph.node:
        raise AscendEmuError(f"ONNX model {name!r} has no nodes; is it a model file?")
    try:
        onnx.checker.check_model(m)
    except Exception as e:
        raise AscendEmuError(f"ONNX model {name!r} is malformed: {_line(e)}") from None
    # (a proto2 string field that is not UTF-8 comes back as bytes, which the checker lets through)
    g = m.graph
    texts = [*(v.name for v in (*g.input, *g.output, *g.initializer, *g.value_info)),
             *(t for nd in g.node for t in (nd.name, nd.op_type, nd.domain, *nd.input, *nd.output))]
    if not all(isinstance(t, str) for t in texts):
        raise AscendEmuError(f"ONNX model {name!r} is malformed: a name that is not UTF-8 text")
    for nd in g.node:       # what onnxruntime accepts at load and refuses only when the node runs
        if nd.op_type in ("Conv", "ConvTranspose") and nd.domain in ("", "ai.onnx"):
            group = next((a.i for a in nd.attribute if a.name == "group"), 1)
            if group < 1:
                raise AscendEmuError(f"ONNX model {name!r} is malformed: {nd.op_type} {nd.name[:80]!r} has group "
                                     f"{group}, which must be at least 1; export the model again")


def _check_runtime(raw: bytes, name: str) -> None:
    """Refuse a model onnxruntime rejects (an opset it has no kernels for, a type an op does not take): the
    reference and the AI CPU are onnxruntime, and ATC rejects such a model too."""
    import onnxruntime as ort

    from .node import session_options

    try:
        ort.InferenceSession(raw, session_options(), providers=["CPUExecutionProvider"])
    except Exception as e:
        raise AscendEmuError(f"ONNX model {name!r} is rejected by onnxruntime ({_line(e)}); ascend-emu runs models "
                             "onnxruntime can load: export it again (opset 7 to the one onnxruntime supports)") from None


def _dims(vi) -> list | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    # a negative dim_value (some tools write -1 for "any") is no size: unknown, as a dim_param is
    return [int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else None for d in t.shape.dim]


def _apply_shapes(m, initializers: set, input_shapes) -> None:
    if not input_shapes:
        return
    inputs = {vi.name: vi for vi in m.graph.input if vi.name not in initializers}
    for key, shape in shape_items(input_shapes):
        vi = inputs.get(key)
        if vi is None:
            raise AscendEmuError(f"--shape names unknown input {key!r}; the model's inputs are: " + ", ".join(inputs))
        dims = _dims(vi)
        spec = InputSpec(key, ONNX_DTYPES.get(vi.type.tensor_type.elem_type, "float32"), dims)
        shape = [None if d is None or int(d) < 0 else int(d) for d in shape]
        check_shape_fits(spec, shape)
        tshape = vi.type.tensor_type.shape
        del tshape.dim[:]
        for i, d in enumerate(shape):
            d = d if d is not None else (dims[i] if dims else None)
            dim = tshape.dim.add()
            if d is not None:
                dim.dim_value = d
            else:
                dim.dim_param = f"{key}_{i}"


def _infer(m):
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:       # inference is a help: the converters fall back where a shape stays unknown
        return m


def load_onnx(model, *, input_shapes=None) -> Graph:
    """Load an ONNX model (a ``.onnx`` path or an ``onnx.ModelProto``) as a :class:`Graph`.

    ``input_shapes``: input name -> shape (``--shape``), fixing the dims the model leaves dynamic.
    Raises :class:`AscendEmuError` (one line) for a missing, truncated or malformed file, an unknown
    ``--shape`` input, or a model without the default opset.
    """
    import onnx
    from onnx import numpy_helper

    m, name = _read(model)
    _check(m, name)
    opset = _opset(m)
    raw = m.SerializeToString()
    _check_runtime(raw, name)
    inits = {t.name: t for t in m.graph.initializer} | {s.values.name: s for s in m.graph.sparse_initializer}
    _apply_shapes(m, set(inits), input_shapes)
    inferred = _infer(m)
    shapes, types = {}, {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if vi.type.HasField("tensor_type"):
            shapes[vi.name] = _dims(vi)
            types[vi.name] = ONNX_DTYPES.get(vi.type.tensor_type.elem_type)
    _check_sizes(shapes, types, name)
    b = Builder(shapes, types, opset)
    src = OnnxSource(model=raw, opset=opset)
    b.reserved = {nd.name.replace(":", "_") for nd in m.graph.node if nd.name}
    specs = []
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        ph = b.unique(vi.name)
        dtype = ONNX_DTYPES.get(vi.type.tensor_type.elem_type)
        if dtype is None:
            raise AscendEmuError(f"ONNX input {vi.name!r} is not a tensor of a supported element type")
        b.emit(ph, "Placeholder", [], {"dtype": dtype, "shape": shapes.get(vi.name)}, exact=True)
        b.tensors[vi.name] = f"{ph}:0"
        src.nodes[ph] = [vi.name]
        specs.append(InputSpec(ph, dtype, shapes.get(vi.name), key=vi.name))
    inits_named = set()
    for t in [*m.graph.initializer, *m.graph.sparse_initializer]:
        sparse = isinstance(t, onnx.SparseTensorProto)     # (named by its values tensor)
        tname = t.values.name if sparse else t.name
        try:
            v = sparse_to_dense(t) if sparse else numpy_helper.to_array(t)
        except Exception as e:
            raise AscendEmuError(f"ONNX initializer {tname!r} cannot be read: {_line(e)}") from None
        cname = b.unique(tname)
        b.emit(cname, "Const", [], {"value": v, "dtype": v.dtype.name}, exact=True)
        b.tensors[tname] = f"{cname}:0"
        b.values[tname] = v
        src.nodes[cname] = [tname]
        inits_named.add(cname)
    for pos, nd in enumerate(m.graph.node):
        _convert(b, nd, pos, opset, src)
    outputs = []
    for vi in m.graph.output:
        if vi.name not in b.tensors:
            raise AscendEmuError(f"ONNX output {vi.name!r} is computed by no node")
        outputs.append(b.tensors[vi.name])
    src.tensors = dict(b.tensors)
    # an ONNX node stays even when nothing reads its result, except the transpose back to NCHW that a chain of
    # NHWC ops skips: it would be a second reader of the NHWC result, and the fusion passes (Conv+BatchNorm)
    # fold only a sole reader. The reference still dumps it (a bench-only row in compare).
    roots = [f"{k}:0" for k in src.nodes if k not in inits_named and f"{k}:0" not in b.nhwc]
    nodes = feeding(b.nodes, outputs + roots)
    keep = {n.name for n in nodes}
    src.extra = {n.name: n for n in b.nodes if n.name in src.nodes and n.name not in keep and n.name not in inits_named}
    src.nodes = {k: v for k, v in src.nodes.items() if k in keep or k in src.extra}
    for n in nodes:
        if n.op == "Const" and isinstance(n.attrs.get("value"), np.ndarray):
            # made here from the model's bytes, held by nothing else: read-only, so a replay casts a weight to
            # fp16 (and lays out a cube filter) once per loaded graph, not once per replay (numerics/memo.py)
            read_only(n.attrs["value"])
    return Graph(nodes=nodes, inputs=specs, outputs=outputs, name=str(name),
                 fingerprint=hashlib.sha256(raw).hexdigest(), output_names=[vi.name for vi in m.graph.output],
                 onnx=src)


def _check_sizes(shapes: dict, types: dict, model: str) -> None:
    """Refuse a model whose inferred tensors would not fit in memory (a corrupt shape, a pad of billions),
    before anything allocates them."""
    try:        # (the physical memory, as frontend.inputs reads it for random inputs; that module imports the loader)
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = 1 << 50
    limit = memory // 4     # (several tensors of a model live at once)
    for tname, dims in shapes.items():
        if not dims or None in dims or any(d < 0 for d in dims):
            continue
        size = 1
        for d in dims:
            size *= d
        size *= {"float64": 8, "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "int16": 2, "uint16": 2,
                 "int8": 1, "uint8": 1, "bool": 1}.get(types.get(tname), 4)
        if size > limit:
            raise AscendEmuError(f"ONNX model {model!r}: tensor {tname!r} of shape {tuple(dims)} needs "
                                 f"{size / 2 ** 30:.3g} GiB, more than a quarter of this machine's memory; check the "
                                 f"model (or --shape)")


def _attrs(nd) -> dict:
    from onnx import helper

    out = {}
    for a in nd.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list):
            v = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def _convert(b: Builder, nd, pos: int, opset: int, src: OnnxSource) -> None:
    from onnx import numpy_helper

    for i in nd.input:
        if i and i not in b.tensors:
            raise AscendEmuError(f"ONNX node {nd.name or nd.op_type!r} reads {i!r}, which nothing before it makes")
    name = b.unique(nd.name or f"{nd.op_type}_{pos}", node=bool(nd.name))
    n = Onnx(name, nd.op_type, list(nd.input), list(nd.output), _attrs(nd), opset)
    if nd.op_type == "Constant":
        a = nd.attribute[0] if nd.attribute else None
        if a is None or a.name not in ("value", "value_float", "value_floats", "value_int", "value_ints"):
            raise AscendEmuError(f"ONNX Constant {name!r} has no value ascend-emu reads (value, value_float(s), "
                                 f"value_int(s))")
        v = numpy_helper.to_array(a.t) if a.name == "value" else np.asarray(
            n.attrs[a.name], np.float32 if "float" in a.name else np.int64)
        b.values[nd.output[0]] = v
    fn = CONVERTERS.get(nd.op_type) if nd.domain in ("", "ai.onnx") else None
    outs = None
    first = len(b.nodes)
    if fn is not None:
        try:
            outs = fn(b, n)
        except Fallback:
            outs = None
        except (ValueError, TypeError, IndexError, KeyError, OverflowError, ZeroDivisionError, AttributeError):
            # attributes or constants the converter cannot read (out of range, of another type): the node runs
            # as itself on the AI CPU, where onnxruntime says what is wrong with it
            outs = None
    if outs is None:
        _fallback(b, n, nd)
    else:
        for o, ref in zip(nd.output, outs):
            if o:
                b.tensors[o] = ref
        last = b.nodes[-1]
        if last.name == name and last.op != nd.op_type:
            last.meta["source_type"] = nd.op_type     # compare shows "Conv", not the Transpose back to NCHW
        if (last.name == name and len(nd.output) == last.num_outputs
                and all(nd.input) and last.inputs == [b.tensors[i] for i in nd.input]):
            # run as itself on the AI CPU if the registry op refuses these inputs
            last.meta["onnx_node"] = _bare(nd, name)
            last.meta["onnx_opset"] = b.opset
    scope = _scope(nd)
    for made in b.nodes[first:]:
        if made.op != "Const":      # (a helper constant may be shared with later nodes)
            # the ONNX node this plain op is part of: --keep-dtype with the node's name keeps all of them
            made.meta["onnx_name"] = name
            if scope:
                made.meta["scope"] = scope
    src.nodes[name] = list(nd.output)
    _fold(b, n, nd)


def _scope(nd) -> str:
    """The module scope the dynamo exporter records on a node (``pkg.torch.onnx.name_scopes``: the cumulative
    module paths, the node's own name last), as ``layer1/layer1.0/layer1.0.conv1``; else the path TorchScript's
    exporter writes in the node's name (``/layer1/layer1.0/conv1/Conv``: ``layer1/layer1.0/conv1``); "" without
    either."""
    import ast

    parts = nd.name.split("/")
    path = "/".join(parts[1:-1]) if nd.name.startswith("/") and len(parts) > 2 and all(parts[1:-1]) else ""
    for p in nd.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes" and len(p.value) < 10000:
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return ""
            if isinstance(scopes, (list, tuple)):
                return "/".join(str(s).replace("/", ".") for s in scopes[:-1] if s)
    return path


def _bare(nd, name) -> bytes:
    import onnx

    c = onnx.NodeProto()
    c.CopyFrom(nd)
    c.name = name
    return c.SerializeToString()


def outer_names(nd) -> list[str]:
    """The tensors of the enclosing graph that ``nd``'s subgraphs (If branches, a Loop or Scan body, at any
    depth) read by name without making them: what the node needs beside its inputs when it runs alone."""
    out: list[str] = []

    def walk(g, visible: set):
        made = set(visible) | {v.name for v in g.input} | {t.name for t in g.initializer} | \
            {s.values.name for s in g.sparse_initializer}
        for node in g.node:
            for i in node.input:
                if i and i not in made and i not in out:
                    out.append(i)
            for a in node.attribute:
                for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    walk(sg, made)
            made.update(o for o in node.output if o)

    for a in nd.attribute:
        for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            walk(sg, set())
    return out


def _fallback(b: Builder, n: Onnx, nd) -> None:
    present = [i for i in nd.input if i]
    # an If/Loop body reads tensors of this graph by name: they come along as extra inputs of the AI CPU node
    outer = [i for i in outer_names(nd) if i not in present]
    for i in outer:
        if i not in b.tensors:
            raise AscendEmuError(f"ONNX node {nd.name or nd.op_type!r}: its subgraph reads {i!r}, which nothing "
                                 "before it makes")
    b.emit(n.name, f"Onnx{nd.op_type}", [b.tensors[i] for i in present + outer], {}, max(len(nd.output), 1),
           meta={"onnx_node": _bare(nd, n.name), "onnx_opset": b.opset, "onnx_outer": outer}, exact=True)
    for k, o in enumerate(nd.output):
        if o:
            b.tensors[o] = f"{n.name}:{k}"


def _fold(b: Builder, n: Onnx, nd) -> None:
    """Record the node's outputs as known values when they follow from known values (shape arithmetic)."""
    if n.op == "Shape" and not n.a("start") and n.a("end") is None:
        s = b.shapes.get(n.inputs[0])
        v = b.value(n.inputs[0])
        if v is not None:
            s = list(np.shape(v))
        if s is not None and None not in s:
            b.values[nd.output[0]] = np.asarray(s, np.int64)
        return
    if n.op == "Constant" or not all(b.value(i) is not None for i in nd.input if i):
        return
    if any(np.size(b.value(i)) > FOLD_LIMIT for i in nd.input if i):
        return
    if n.op not in _FOLD_ANY and any(b.dtype(o) in FLOATS or b.dtype(o) is None for o in nd.output if o):
        return
    if any(b.dtype(i) in FLOATS for i in nd.input if i) and n.op not in ("Shape", "Size", "Cast"):
        return
    from onnx.reference import ReferenceEvaluator

    try:
        got = ReferenceEvaluator(nd).run(None, {i: b.value(i) for i in nd.input if i})
    except Exception:
        return
    for o, v in zip(nd.output, got):
        if o:
            b.values[o] = np.asarray(v)

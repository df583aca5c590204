"""The TensorFlow boundary: a quiet lazy import, and TF protobufs decoded to plain Python values.

With :mod:`.loader`, :mod:`.reference` and :mod:`ascend_emu.npu.aicpu`, the only code that imports
TensorFlow. Attributes become the values :class:`~ascend_emu.graph.Node` documents.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np

from ...errors import AscendEmuError


# --------------------------------------------------------------------------- TensorFlow import

@contextlib.contextmanager
def _quiet_stderr():
    """Silence fd 2: TensorFlow's C++ start-up banner ignores TF_CPP_MIN_LOG_LEVEL."""
    try:
        fd = os.dup(2)
    except OSError:  # no stderr at all
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(fd, 2)
    finally:
        os.close(fd)


def import_tf():
    """Import TensorFlow lazily with its logging quietened; the module."""
    import sys
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with _quiet_stderr():
            import tensorflow
            # device discovery logs a CUDA probe failure on CPU-only machines; do it now, quietly
            tensorflow.config.list_physical_devices()
        import logging
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
    import tensorflow as tf
    return tf


def import_keras():
    import_tf()
    import keras
    return keras


# --------------------------------------------------------------------------- attribute decoding

def dtype_name(enum_or_dtype) -> str:
    """TF DataType (enum or tf.DType) -> numpy dtype name (``"float32"``, ``"bfloat16"``, ...).

    Types numpy cannot hold (string, resource, variant, quantized) keep their TF names.
    """
    tf = import_tf()
    dt = tf.as_dtype(enum_or_dtype)
    if dt in (tf.string, tf.resource, tf.variant) or dt.is_quantized:
        return dt.name
    return np.dtype(dt.as_numpy_dtype).name


def _shape(proto) -> list | None:
    if proto.unknown_rank:
        return None
    return [d.size if d.size >= 0 else None for d in proto.dim]


def _string(b: bytes):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


def _tensor(proto) -> np.ndarray:
    tf = import_tf()
    return tf.make_ndarray(proto)


#: AttrValue field -> its plain Python value (the same fields inside an AttrValue's ``list``)
_ATTR_KINDS = {"s": _string, "i": int, "f": float, "b": bool, "type": dtype_name, "shape": _shape,
               "tensor": _tensor, "func": lambda f: f.name}


def decode_attr(value) -> Any:
    """One AttrValue protobuf -> a plain Python value (see :class:`~ascend_emu.graph.Node`)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "list":
        for kind_name, conv in _ATTR_KINDS.items():
            items = getattr(value.list, kind_name)
            if len(items):
                return [conv(x) for x in items]
        return []
    if kind == "placeholder":
        return value.placeholder
    if kind in _ATTR_KINDS:
        return _ATTR_KINDS[kind](getattr(value, kind))
    raise AscendEmuError(f"unsupported attribute kind {kind!r}")  # pragma: no cover


def lookup_op_def(op: str, where: str):
    from tensorflow.python.framework import op_def_registry
    op_def = op_def_registry.get(op)
    if op_def is None:
        raise AscendEmuError(f"node {where!r} has op type {op!r}, which this TensorFlow does not "
                             f"register; load the library that defines it or remove the op")
    return op_def


def node_attrs(node_def, op_def) -> dict[str, Any]:
    """Decoded attributes of a NodeDef, OpDef defaults filled in, private ``_`` attrs dropped."""
    attrs = {}
    for a in op_def.attr:
        if a.name in node_def.attr:
            attrs[a.name] = decode_attr(node_def.attr[a.name])
        elif a.HasField("default_value"):
            attrs[a.name] = decode_attr(a.default_value)
    for k, v in node_def.attr.items():  # attrs the OpDef does not list (rare; keep them)
        if k not in attrs and not k.startswith("_"):
            attrs[k] = decode_attr(v)
    return attrs


def count_outputs(op_def, attrs: dict) -> int:
    """Number of output tensors of a node, from its OpDef and attributes."""
    n = 0
    for arg in op_def.output_arg:
        if arg.number_attr:
            n += int(attrs[arg.number_attr])
        elif arg.type_list_attr:
            n += len(attrs[arg.type_list_attr])
        else:
            n += 1
    return n


# --------------------------------------------------------------------------- sources -> ConcreteFunction


def first_line(e: BaseException) -> str:
    """The first line of an exception message (TensorFlow errors run to pages), at most 300 chars."""
    s = str(e).strip().splitlines()
    return s[0][:300] if s else type(e).__name__


def traced_error(e: BaseException) -> str | None:
    """One line for an error raised while tracing user code (TensorFlow's "in user code:" report, Keras'
    "Exception encountered when calling ..."): the error and the user's line that raised it; None for any
    other error."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    if "in user code:" not in text and "Exception encountered when calling" not in text:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    where = None
    for i, ln in enumerate(lines):
        m = re.match(r'File "([^"]+)", line (\d+), in (\S+)', ln)
        if m and "site-packages" not in m.group(1):
            code = lines[i + 1] if i + 1 < len(lines) and not re.match(r"(File |\w+:)", lines[i + 1]) else ""
            where = f"{m.group(1).rsplit('/', 1)[-1]}:{m.group(2)} in {m.group(3)}" + (f": {code[:120]}" if code else "")
    err = None
    for i, ln in enumerate(lines):
        m = re.match(r"(?:(\w+): )?Exception encountered when calling (\S+?)\.?$", ln)
        if m and i + 1 < len(lines):
            err = f"{m.group(1) or type(e).__name__} in {m.group(2)}: {lines[i + 1]}"
            break
    if err is None:
        err = next((ln for ln in reversed(lines) if re.match(r"^[A-Za-z_][\w.]*(Error|Exception):", ln)), lines[-1])
    return err[:300] + (f" (at {where})" if where else "")


def session_config():
    """Session options for faithful op-by-op execution: no Grappler rewrites, CPU only."""
    tf = import_tf()
    from tensorflow.core.protobuf import rewriter_config_pb2
    cfg = tf.compat.v1.ConfigProto(device_count={"GPU": 0})
    cfg.graph_options.rewrite_options.disable_meta_optimizer = True
    cfg.graph_options.rewrite_options.constant_folding = rewriter_config_pb2.RewriterConfig.OFF
    cfg.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    cfg.graph_options.optimizer_options.do_constant_folding = False
    cfg.graph_options.optimizer_options.do_function_inlining = False
    cfg.graph_options.optimizer_options.do_common_subexpression_elimination = False
    return cfg

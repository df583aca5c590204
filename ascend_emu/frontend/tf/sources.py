"""Model sources: what :func:`~ascend_emu.frontend.tf.loader.load_graph` accepts, each turned into a
ConcreteFunction to freeze (or a frozen GraphDef) with its input and output names.

A Keras model or ``.keras`` file, a SavedModel directory (one signature), a frozen GraphDef
(``.pb``/``.pbtxt``), a tf.function with an input signature, or a ConcreteFunction.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import AscendEmuError
from .tf import _quiet_stderr, first_line, import_keras, import_tf


SUFFIXES = {".keras": "Keras v3 file", ".pb": "frozen GraphDef (binary)",
            ".pbtxt": "frozen GraphDef (text)", ".onnx": "ONNX model",
            ".pt2": "exported PyTorch program, torch.export.save"}


SUPPORTED = ("a Keras model, a .keras file, a SavedModel directory, a frozen GraphDef (.pb/.pbtxt), "
             "an ONNX model (.onnx), an exported PyTorch program (.pt2, torch.export.save), a tf.function with "
             "input_signature or a ConcreteFunction")


@dataclass
class _Source:
    """What a model source gives: a ConcreteFunction (or a GraphDef) plus naming."""

    name: str
    func: Any = None                     # ConcreteFunction to freeze, or None
    graph_def: Any = None                # already frozen GraphDef (from .pb/.pbtxt)
    input_keys: dict = field(default_factory=dict)  # placeholder name -> user-facing key
    output_names: list | None = None     # parallel to the function's outputs
    keepalive: Any = None                # owner of the function's variables (a loaded SavedModel)


def _is_keras_model(obj) -> bool:
    mods = type(obj).__mro__
    return any(c.__module__.startswith(("keras", "tf_keras")) and c.__name__ in ("Model", "Layer")
               for c in mods)


#: what TensorFlow takes as a name scope (tensorflow/python/framework/ops.py, _VALID_SCOPE_NAME_REGEX): a Keras
#: layer is traced under its name, so a name Keras accepts with ``"``, ``<``, ``&`` or a newline cannot be traced
_SCOPE_NAME = re.compile(r"[A-Za-z0-9_.\\/>-]*")
#: the model's own name opens the root scope, which must also start with a letter, a digit or "."
_ROOT_SCOPE_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*")


def _check_layer_names(model) -> None:
    """Refuse, in one line, a layer (at any depth) whose name TensorFlow cannot trace as a name scope."""
    seen, todo = set(), [model]
    while todo:
        layer = todo.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        name = getattr(layer, "name", "")
        root = layer is model
        if isinstance(name, str) and not (_ROOT_SCOPE_NAME if root else _SCOPE_NAME).fullmatch(name):
            what = "model" if root else "layer"
            first = ", and starts with a letter, a digit or ." if root else ""
            raise AscendEmuError(f"Keras {what} {name!r} has a name TensorFlow cannot trace (a name scope takes only "
                                 f"letters, digits and _ . \\ / > -{first}); rename the {what} and save the model "
                                 "again")
        todo.extend(reversed(getattr(layer, "layers", None) or []))   # popped in model order


def _keras_source(model) -> _Source:
    tf = import_tf()
    _check_layer_names(model)
    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError):
        inputs = []
    if not inputs:
        raise AscendEmuError(
            f"Keras model {model.name!r} has no defined inputs; build it with keras.Input(shape=...) "
            f"(functional/Sequential) or wrap it in a tf.function with an input_signature")
    names = []
    for i, t in enumerate(inputs):
        hist = getattr(t, "_keras_history", None)
        op = getattr(hist, "operation", None) if hist is not None else None
        names.append(getattr(op, "name", None) or f"input_{i}")
    specs = [tf.TensorSpec(tuple(t.shape), tf.as_dtype(t.dtype), name=n)
             for t, n in zip(inputs, names)]
    struct = getattr(model, "_inputs_struct", None)

    def call(*xs):
        x = tf.nest.pack_sequence_as(struct, list(xs)) if struct is not None else (
            list(xs) if len(xs) > 1 else xs[0])
        return model(x, training=False)

    func = tf.function(call).get_concrete_function(*specs)
    out_names = list(getattr(model, "output_names", None) or [])
    return _Source(model.name, func=func, input_keys={n: n for n in names},
                   output_names=out_names or None)


def _saved_model_source(path: Path, signature: str | None) -> _Source:
    tf = import_tf()
    try:
        with _quiet_stderr():
            loaded = tf.saved_model.load(str(path))
    except Exception as e:  # TF raises many kinds for a corrupt SavedModel
        raise AscendEmuError(f"cannot load SavedModel {str(path)!r}: {first_line(e)}; "
                             f"re-export it with model.export() or tf.saved_model.save()") from None
    sigs = dict(getattr(loaded, "signatures", {}) or {})
    want = signature or "serving_default"
    if want not in sigs:
        avail = ", ".join(sorted(sigs)) or "none"
        raise AscendEmuError(f"SavedModel {str(path)!r} has no signature {want!r}; available: {avail}"
                             + ("; pass signature=NAME (--signature NAME)" if sigs else
                                "; re-export it with a serving signature"))
    func = sigs[want]
    _, kwargs = func.structured_input_signature
    keys = {spec.name: key for key, spec in (kwargs or {}).items()}
    outs = func.structured_outputs
    out_names = sorted(outs) if isinstance(outs, dict) else None
    # keep the loaded object alive while the function is frozen (its variables live there)
    return _Source(path.name or str(path), func=func, input_keys=keys, output_names=out_names,
                   keepalive=loaded)


_CONTENT_KEY = 'tensor_content: "'
# escapes whose meaning Python's bytes escapes do not share with protobuf's text format (\\x takes 1-2 hex
# digits there, \\? is a '?', an octal escape is at most \\377); a payload with one goes the slow way.
# It is searched for once the escaped backslashes are gone: pairs of them, taken from the left.
_UNSHARED_ESCAPE = re.compile(r'\\[^0-7nrt"\'\\abfv]|\\[4-7][0-7][0-7]')


def _closing_quote(text: str, start: int) -> int:
    """Index of the first '"' at or after ``start`` that no backslash escapes, or -1."""
    end = text.find('"', start)
    while end >= 0:
        k = end
        while k > start and text[k - 1] == "\\":
            k -= 1
        if (end - k) % 2 == 0:
            return end
        end = text.find('"', end + 1)
    return -1


def _parse_text_graph_def(text: str, gd) -> None:
    """``text_format.Parse(text, gd)``, with the ``tensor_content`` strings decoded in C.

    Protobuf's text tokenizer matches a string literal one character at a time in Python: the
    290 MB .pbtxt of ResNet50 took 77 s to parse, nearly all of it in its weights. Each
    ``tensor_content: "..."`` line whose string has only the escapes both syntaxes share is
    unescaped by ``codecs.escape_decode`` and stands in the text as a short marker, set back after
    the parse. If any marker does not come back exactly (a string continued on the next line, a
    TensorProto out of the usual places), the whole text is parsed the plain way instead.
    """
    import codecs
    from google.protobuf import text_format
    marker = "ascend-emu-tensor-content-"
    blobs, pieces, done = [], [], 0
    pos = text.find(_CONTENT_KEY) if marker not in text else -1
    while pos >= 0:
        start = pos + len(_CONTENT_KEY)
        end = _closing_quote(text, start)
        if end < 0:
            break
        line_end = text.find("\n", end)
        line_end = len(text) if line_end < 0 else line_end
        payload = text[start:end]
        if (not text[text.rfind("\n", 0, pos) + 1:pos].strip() and not text[end + 1:line_end].strip()
                and not text[line_end:line_end + 256].lstrip().startswith('"')     # no continued string
                and "\n" not in payload and payload.isascii()
                and not _UNSHARED_ESCAPE.search(payload.replace("\\\\", ""))):
            blobs.append(codecs.escape_decode(payload.encode("ascii"))[0])
            pieces += [text[done:start], f"{marker}{len(blobs) - 1}"]
            done = end
        pos = text.find(_CONTENT_KEY, end)
    if not blobs:
        text_format.Parse(text, gd)
        return
    text_format.Parse("".join(pieces) + text[done:], gd)
    restored = 0
    tag = marker.encode()
    attrs = [n.attr for n in gd.node] + [n.attr for f in gd.library.function for n in f.node_def]
    for attr in attrs:
        for value in attr.values():
            for t in [value.tensor] + list(value.list.tensor):
                if t.tensor_content.startswith(tag):
                    i = t.tensor_content[len(tag):]
                    if i.isdigit() and int(i) < len(blobs):
                        t.tensor_content = blobs[int(i)]
                        restored += 1
    if restored != len(blobs):
        gd.Clear()
        text_format.Parse(text, gd)


def _graph_def_source(path: Path, text: bool) -> _Source:
    tf = import_tf()
    gd = tf.compat.v1.GraphDef()
    try:
        if text:
            _parse_text_graph_def(path.read_text(), gd)
        else:
            gd.ParseFromString(path.read_bytes())
    except Exception as e:
        kind = "text (.pbtxt)" if text else "binary (.pb)"
        raise AscendEmuError(f"{str(path)!r} is not a valid {kind} GraphDef ({first_line(e)}); "
                             f"write it with tf.io.write_graph(graph_def, dir, name, as_text="
                             f"{text})") from None
    if not gd.node:
        raise AscendEmuError(f"{str(path)!r} holds no GraphDef nodes; is it a frozen GraphDef?")
    return _Source(path.stem, graph_def=gd)


def _path_source(path: Path, signature: str | None) -> _Source:
    if not path.exists():
        raise AscendEmuError(f"model path {str(path)!r} does not exist; pass {SUPPORTED}")
    if path.is_dir():
        if (path / "saved_model.pb").exists() or (path / "saved_model.pbtxt").exists():
            return _saved_model_source(path, signature)
        raise AscendEmuError(f"directory {str(path)!r} is not a SavedModel (no saved_model.pb); "
                             f"pass a SavedModel directory or a model file (.keras, .pb, .pbtxt)")
    if path.name in ("saved_model.pb", "saved_model.pbtxt"):
        return _saved_model_source(path.parent, signature)
    suffix = path.suffix.lower()
    if signature is not None:
        raise AscendEmuError(f"--signature {signature!r} applies to SavedModel directories only, and "
                             f"{str(path)!r} is not one; drop --signature")
    if suffix == ".keras":
        check_keras_archive(path)
        keras = import_keras()
        try:
            # safe_mode (Keras's default, stated here as a promise): no Python lambdas are deserialised
            model = keras.models.load_model(path, compile=False, safe_mode=True)
        except Exception as e:
            raise AscendEmuError(f"cannot load Keras file {str(path)!r}: {first_line(e)}; "
                                 f"save it with model.save('model.keras')") from None
        return _keras_source(model)
    if suffix in (".pb", ".pbtxt"):
        return _graph_def_source(path, text=suffix == ".pbtxt")
    if suffix in (".pt", ".pth"):
        # torch.save's usual names: a PyTorch user's first try; say what to export instead
        raise AscendEmuError(f"{str(path)!r} is not a model ascend-emu reads (a {suffix} file is torch.save's pickle, "
                             "which is never unpickled); export the model with torch.export.save(torch.export.export("
                             "model.eval(), example_inputs), 'model.pt2') and pass model.pt2")
    raise AscendEmuError(f"cannot tell the format of {str(path)!r} from its suffix; use "
                         + ", ".join(f"{k} ({v})" for k, v in SUFFIXES.items())
                         + " or a SavedModel directory")


def check_keras_archive(path) -> None:
    """A ``.keras`` file is a zip archive (what ``model.save`` writes); anything else is named as such (Keras
    itself says "File not found" for a file that is there)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        raise AscendEmuError(f"model file {str(path)!r} is not a .keras archive (a .keras file is the zip that "
                             "model.save('model.keras') writes); save the model again")


def _source(model, signature) -> _Source:
    if isinstance(model, (str, os.PathLike)):
        return _path_source(Path(model), signature)
    if signature is not None:
        raise AscendEmuError(f"signature={signature!r} applies to SavedModel directories only; drop it")
    tf = import_tf()
    if isinstance(model, tf.compat.v1.GraphDef):
        return _Source("graph", graph_def=model)
    if isinstance(model, tf.types.experimental.ConcreteFunction):
        return _Source(_func_name(model), func=model)
    if isinstance(model, tf.types.experimental.PolymorphicFunction):
        if model.input_signature is None:
            raise AscendEmuError(
                f"tf.function {_func_name(model)!r} has no input_signature; declare one "
                f"(@tf.function(input_signature=[tf.TensorSpec(...)])) or pass "
                f"f.get_concrete_function(spec)")
        return _Source(_func_name(model), func=model.get_concrete_function())
    if _is_keras_model(model):
        return _keras_source(model)
    raise AscendEmuError(f"cannot load a {type(model).__module__}.{type(model).__name__}; pass {SUPPORTED}")


def _func_name(f) -> str:
    """A readable, process-independent name for a tf.function or ConcreteFunction."""
    name = getattr(f, "__name__", None)
    if not name:
        graph = getattr(f, "graph", None)
        name = getattr(graph, "name", None) or getattr(f, "name", None) or "function"
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    name = re.sub(r"^__inference_|_\d+$", "", str(name))
    return name.strip("<>") or "function"

"""The dump manifest's schema, one version at a time, and the small validator every reader uses.

A schema is a tree of the node types below. :func:`validate` walks a parsed JSON value
against it and raises :class:`SchemaViolation` at the first field that does not fit,
naming the field by its path (``ops[3].outputs[0].shape[1]``), what it should be and
what it is, in one line. No third-party dependency; no TensorFlow.

Readers get the schema of the manifest's ``version`` from :data:`MANIFEST_SCHEMAS`, so a
new format version adds an entry here rather than a second validator.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

#: most dimensions in a tensor shape (TensorFlow's own limit is 254)
MAX_RANK = 254
#: most elements in one dumped tensor (2^48: far beyond any real tensor, well inside int64 byte counts)
MAX_ELEMENTS = 1 << 48


class SchemaViolation(ValueError):
    """A JSON value that does not fit its schema; ``field`` is the path of the offending value."""

    def __init__(self, field: str, expected: str, value):
        self.field = field or "(top level)"
        self.expected = expected
        super().__init__(f"{self.field}: expected {expected}, got {describe(value)}")


#: stands for a required field that is absent
MISSING = object()


def describe(value, limit: int = 40) -> str:
    """A short one-line description of a JSON value: its JSON type and a clipped repr."""
    if value is MISSING:
        return "nothing (the field is missing)"
    kind = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value))
    if kind is None:
        kind = "a number" if isinstance(value, (int, float)) else type(value).__name__
    if isinstance(value, (dict, list)):
        return f"{kind} of {len(value)} item(s)"
    text = repr(value)  # repr escapes newlines and control characters: the message stays one line
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return f"{kind} {text}" if value is not None else kind


# --------------------------------------------------------------------------- node types

class Spec:
    """A schema node: ``check(value, field)`` raises SchemaViolation or returns None."""

    expected = "a value"

    def check(self, value, field: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class Str(Spec):
    def __init__(self, max_len: int | None = None, choices=None):
        self.max_len = max_len
        self.choices = tuple(choices) if choices else None
        self.expected = ("one of " + ", ".join(map(repr, self.choices))) if self.choices else "a string"

    def check(self, value, field):
        if not isinstance(value, str) or (self.choices and value not in self.choices):
            raise SchemaViolation(field, self.expected, value)
        if self.max_len is not None and len(value) > self.max_len:
            raise SchemaViolation(field, f"a string of at most {self.max_len} characters", value)


class Int(Spec):
    def __init__(self, minimum: int | None = None, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum
        self.expected = ("a non-negative integer" if minimum == 0 else "an integer") + (
            f" up to {maximum}" if maximum is not None else "")

    def check(self, value, field):
        if not isinstance(value, int) or isinstance(value, bool) \
                or (self.minimum is not None and value < self.minimum) \
                or (self.maximum is not None and value > self.maximum):
            raise SchemaViolation(field, self.expected, value)


class Bool(Spec):
    expected = "true or false"

    def check(self, value, field):
        if not isinstance(value, bool):
            raise SchemaViolation(field, self.expected, value)


class Stat(Spec):
    """A statistic as the dump writer stores it: a finite number, null, or "nan" / "inf" / "-inf"."""

    expected = 'a number, null, "nan", "inf" or "-inf"'

    def check(self, value, field):
        if value is None or value in ("nan", "inf", "-inf") and isinstance(value, str):
            return
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return
        raise SchemaViolation(field, self.expected, value)


class Json(Spec):
    """Any JSON value (its depth is capped when the file is parsed)."""

    expected = "a JSON value"

    def check(self, value, field):
        return None


class Opt(Spec):
    """null or ``inner``."""

    def __init__(self, inner: Spec):
        self.inner = inner
        self.expected = inner.expected + " or null"

    def check(self, value, field):
        if value is not None:
            try:
                self.inner.check(value, field)
            except SchemaViolation as e:
                if e.field == (field or "(top level)"):
                    raise SchemaViolation(field, self.expected, value) from None
                raise


class ListOf(Spec):
    def __init__(self, item: Spec, max_len: int | None = None):
        self.item, self.max_len = item, max_len
        self.expected = "an array"

    def check(self, value, field):
        if not isinstance(value, list):
            raise SchemaViolation(field, self.expected, value)
        if self.max_len is not None and len(value) > self.max_len:
            raise SchemaViolation(field, f"an array of at most {self.max_len} items", value)
        for i, v in enumerate(value):
            self.item.check(v, f"{field}[{i}]")


class MapOf(Spec):
    """An object with any keys, every value fitting ``value``."""

    def __init__(self, value: Spec = Json()):
        self.value = value
        self.expected = "an object"

    def check(self, value, field):
        if not isinstance(value, dict):
            raise SchemaViolation(field, self.expected, value)
        for k, v in value.items():
            self.value.check(v, f"{field}.{k}" if field else str(k))


class Obj(Spec):
    """An object with named fields; ``required`` ones must be present, unknown keys are ignored."""

    def __init__(self, fields: dict, required=(), label=None):
        self.fields = fields
        self.required = tuple(required)
        self.label = label          # field whose value names the entry in messages (an op's "name")
        self.expected = "an object"

    def check(self, value, field):
        if not isinstance(value, dict):
            raise SchemaViolation(field, self.expected, value)
        for k in self.required:
            if k not in value:
                raise SchemaViolation(f"{field}.{k}" if field else k, "a value", MISSING)
        for k, spec in self.fields.items():
            if k in value:
                spec.check(value[k], f"{field}.{k}" if field else k)


class Where(Spec):
    """``inner``, then a predicate over the whole value: ``test(value) -> None or (subfield, expected, got)``."""

    def __init__(self, inner: Spec, test):
        self.inner, self.test = inner, test
        self.expected = inner.expected

    def check(self, value, field):
        self.inner.check(value, field)
        bad = self.test(value)
        if bad:
            sub, expected, got = bad
            raise SchemaViolation(f"{field}{sub}", expected, got)


# --------------------------------------------------------------------------- the manifest, version 1

def _indexed(key: str):
    """Entries whose ``index`` field equals their position (the writer numbers them so)."""
    def test(items):
        for i, it in enumerate(items):
            if it.get(key) != i:
                return f"[{i}].{key}", f"{i} (its position in the array)", it.get(key)
        return None
    return test


def _unique_names(ops):
    seen = set()
    for i, op in enumerate(ops):
        if op["name"] in seen:
            return f"[{i}].name", "a name no earlier op has", op["name"]
        seen.add(op["name"])
    return None


def _shape_size(shape):
    n = 1
    for d in shape:
        n *= d
    if n > MAX_ELEMENTS:
        return "", f"a shape of at most {MAX_ELEMENTS} elements", shape
    return None


#: dtype names a dump may hold besides numpy's numeric ones ("string", "variant": recorded, never written)
EXTRA_DTYPES = frozenset({"string", "variant"} | {n for n in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                   "float8_e5m2fnuz", "float8_e4m3b11fnuz") if hasattr(ml_dtypes, n)}
                           # the 950's formats stored as codes (dump/format.py CODED_FORMATS)
                           | {"hifloat8", "float4_e1m2", "float8_e8m0"})


def _dtype_name(name):
    if name in EXTRA_DTYPES:
        return None
    try:
        dt = np.dtype(name)
    except (TypeError, ValueError):
        dt = None
    if dt is None or dt.kind not in "biufc" or dt.name != name:
        return "", "a numeric dtype name (float16, float32, int32, bool, bfloat16, ...)", name
    return None


def _string_not_stored(out):
    """A string tensor is recorded, never written: no file, and it says it was skipped."""
    if out.get("dtype") in ("string", "variant") and (out.get("file") is not None or not out.get("skipped")):
        return ".file", 'null with a "skipped" note (a string or variant tensor is never written)', out.get("file")
    return None


_OUTPUT_V1 = Where(Obj({
    "index": Int(0),
    "file": Opt(Str(max_len=255)),
    "dtype": Where(Str(max_len=64), _dtype_name),
    "shape": Where(ListOf(Int(0), max_len=MAX_RANK), _shape_size),
    "max": Stat(), "min": Stat(), "mean": Stat(), "l2norm": Stat(),
    "nan": Int(0), "inf": Int(0), "status": Int(0),
    "skipped": Opt(Str()),
    "sha256": Opt(Str(max_len=64)),
}, required=("index", "file", "dtype", "shape")), _string_not_stored)

_OP_V1 = Obj({
    "index": Int(0),
    "name": Str(),
    "tf_type": Str(), "ascend_type": Str(), "engine": Str(),
    "compute_dtype": Opt(Str()),
    "inputs": ListOf(Str()),
    "attrs": MapOf(),
    "precision": Opt(Obj({"list": Opt(Str()), "dtype": Opt(Str()), "cube_out": Opt(Str()), "reason": Opt(Str())})),
    "fusion": Opt(Obj({"rule": Str(), "replaces": ListOf(Str()), "rules": ListOf(Str()),
                          "tf_type": Str()}, required=("rule",))),
    "status": Int(0),
    "status_names": ListOf(Str()),
    "fp32_check": Opt(Obj({"overflow": Bool(), "max_abs": Stat()})),
    "outputs": Where(ListOf(_OUTPUT_V1), _indexed("index")),
    "phase": Opt(Str()),
    "scope": Opt(Str()),
    "source_type": Opt(Str()),
    "internal": Opt(Str()),
}, required=("index", "name", "outputs"), label="name")

_FUSED_V1 = Obj({"name": Str(), "tf_type": Str(), "rule": Str(), "into": Str()},
                required=("name", "rule", "into"))

MANIFEST_V1 = Obj({
    "format": Str(),
    "version": Int(),
    "kind": Str(choices=("npu", "bench")),
    "config": MapOf(),
    "model": Obj({"name": Opt(Str()), "fingerprint": Opt(Str()), "state_inputs": Opt(ListOf(Str()))}),
    "inputs_sha256": Opt(Str()),
    "tool_version": Opt(Str()),
    "ops": Where(Where(ListOf(_OP_V1), _indexed("index")), _unique_names),
    "fused_away": ListOf(_FUSED_V1),
    "summary": MapOf(),
}, required=("format", "version", "kind", "ops"))

#: manifest format version -> its schema
MANIFEST_SCHEMAS = {1: MANIFEST_V1}


def validate(value, spec: Spec, field: str = "") -> None:
    """Raise :class:`SchemaViolation` naming the first field of ``value`` that does not fit ``spec``."""
    spec.check(value, field)

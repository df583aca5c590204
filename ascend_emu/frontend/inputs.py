"""Model inputs: user arrays or files, checked against the signature, or seeded random ones.

No TensorFlow here. Random inputs (when none are given) are drawn from one
generator, ``np.random.default_rng(seed)``, input by input in signature order:

- floating inputs: standard normal N(0, 1), drawn in float64
  (``rng.standard_normal(shape)``) and rounded to the input's dtype;
- integer inputs: uniform over {0, ..., 9} (``rng.integers(0, 10, shape)``);
- bool inputs: Bernoulli(0.5) (``rng.random(shape) < 0.5``).

So for a one-input float32 model, ``np.random.default_rng(seed).standard_normal(shape)
.astype(np.float32)`` reproduces the input. A leading (batch) dimension the
signature leaves unknown defaults to 1; any other unknown dimension needs an
explicit shape (``shapes={"name": (...)}``, ``--shape name=1,224,224,3``).
"""
from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np

from ..errors import AscendEmuError
from ..graph.core import Graph, InputSpec
from .shapes import _fmt, check_shape_fits, parse_shape, shape_items  # noqa: F401

#: the batch size used for a leading dimension the signature leaves unknown
DEFAULT_BATCH = 1


def check_seed(seed) -> int:
    """``seed`` (of random inputs or of a shuffle), refused in one line unless a non-negative integer."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise AscendEmuError(f"--seed {seed!r} is not a non-negative integer; give a seed like --seed 0 (seed=0)")
    return int(seed)


def _resolver(graph: Graph):
    """name -> InputSpec for placeholder names, signature keys and ``name:0``."""
    table: dict[str, InputSpec] = {}
    for s in graph.inputs:
        table[s.name] = s
        table[s.name + ":0"] = s
    for s in graph.inputs:
        if s.key:
            table.setdefault(s.key, s)

    def valid() -> str:
        names = []
        for s in graph.inputs:
            names.append(s.name if not s.key or s.key == s.name else f"{s.name} (or {s.key})")
        return ", ".join(names) or "none (the model takes no inputs)"

    def resolve(name: str, what: str) -> InputSpec:
        spec = table.get(name)
        if spec is None:
            raise AscendEmuError(f"{what} names unknown input {name!r}; the model's inputs are: {valid()}")
        return spec

    return resolve


def _parse_shapes(graph: Graph, shapes, resolve) -> dict[str, tuple[int, ...]]:
    out = {}
    for name, dims in shape_items(shapes):
        spec = resolve(name, "--shape")
        check_shape_fits(spec, dims)
        out[spec.name] = dims
    return out


def resolve_shape(spec: InputSpec, override: tuple | None = None) -> tuple[int, ...]:
    """The concrete shape of a random input: the override, else the signature with a batch of 1."""
    if override is not None:
        return tuple(override)
    if spec.shape is None:
        raise AscendEmuError(f"input {spec.name!r} has unknown rank; give its shape with "
                             f"--shape {spec.key or spec.name}=1,224,224,3 (in Python: the shapes argument)")
    dims = list(spec.shape)
    if dims and dims[0] is None:
        dims[0] = DEFAULT_BATCH
    if any(d is None for d in dims):
        example = ",".join("N" if d is None else str(d) for d in dims)
        raise AscendEmuError(f"input {spec.name!r} has unknown dimensions {_fmt(spec.shape)}; "
                             f"give them with --shape {spec.key or spec.name}={example} "
                             "(in Python: the shapes argument)")
    return tuple(dims)


def _memory_bytes() -> int:
    """Physical memory of this machine in bytes (a large number where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 50


def random_input(spec: InputSpec, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """One seeded random input (distribution in the module docstring).

    A shape whose random values (drawn in float64) would not fit in this machine's memory
    is a one-line error instead of an allocation failure or the OOM killer.
    """
    dtype = _np_dtype(spec)
    count = 1
    for d in shape:
        count *= int(d)
    need = count * max(8, dtype.itemsize)
    if need > _memory_bytes() // 2:
        raise AscendEmuError(f"input {spec.name!r} of shape {tuple(shape)} needs {need / 2**30:.3g} GiB of memory "
                             f"for its random values, more than this machine can spare; give a smaller --shape")
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, shape).astype(dtype)
    if dtype.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)     # (a 0-d comparison gives a numpy scalar, not an array)
    raise AscendEmuError(f"cannot make random values for input {spec.name!r} of dtype {spec.dtype}; "
                         f"give it with --input {spec.key or spec.name}=file.npy")


def _np_dtype(spec: InputSpec) -> np.dtype:
    if spec.dtype == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(spec.dtype)
    except TypeError:
        raise AscendEmuError(f"input {spec.name!r} has dtype {spec.dtype}, which numpy cannot hold; "
                             f"ascend-emu needs numeric or bool inputs") from None


def _load_array(path: str, what: str) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise AscendEmuError(f"{what}: file {path!r} does not exist; give a .npy (or .npz) file")
    _check_npy_size(p, path, what)
    try:
        data = np.load(p, allow_pickle=False)
    except Exception as e:   # noqa: BLE001 - numpy raises many kinds for a damaged file
        raise AscendEmuError(f"{what}: cannot read {path!r} as a numpy file ({_load_problem(e)}); save a "
                             f"numeric array with np.save") from None
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            if len(data.files) != 1:
                raise AscendEmuError(f"{what}: {path!r} holds {len(data.files)} arrays "
                                     f"({', '.join(data.files)}); name one input per .npy file, "
                                     f"or pass the .npz alone (its keys naming the inputs)")
            return _npz_member(data, data.files[0], path, what)
    return data


def _check_npy_size(p: Path, path: str, what: str) -> None:
    """A .npy whose header claims more data than the file holds is truncated or corrupt: said so before numpy
    allocates what the header claims (a 144-byte file claiming 256 GiB ran out of memory instead)."""
    try:
        with open(p, "rb") as fh:
            if fh.read(6) != b"\x93NUMPY":
                return
            fh.seek(0)
            version = np.lib.format.read_magic(fh)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(
                version)
            if read is None:
                return
            shape, _, dtype = read(fh)
            have = os.fstat(fh.fileno()).st_size - fh.tell()
    except Exception:   # noqa: BLE001 - np.load below names what is wrong with the header
        return
    if dtype.hasobject:
        return          # refused below: pickled objects
    need = math.prod(shape) * dtype.itemsize
    if need > have:
        raise AscendEmuError(f"{what}: {path!r} is truncated or corrupt: its header says shape {tuple(shape)} of "
                             f"{dtype.name} ({need} bytes) but it holds {have} bytes of data; save the array again")


def load_npz(path, what: str) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path``, by name; anything else (no file, not a regular file, a
    single ``.npy``, a damaged archive, pickled objects) is a one-line error naming ``what``."""
    p = Path(path)
    if not p.exists():
        raise AscendEmuError(f"{what}: file {str(path)!r} does not exist; save the arrays with np.savez")
    if not p.is_file():
        raise AscendEmuError(f"{what}: {str(path)!r} is not a regular file; save the arrays with np.savez")
    try:
        with open(p, "rb") as fh:
            magic = fh.read(6)
    except OSError as e:
        raise AscendEmuError(f"{what}: cannot read {str(path)!r} ({e.strerror})") from None
    if magic.startswith(b"\x93NUMPY"):
        raise AscendEmuError(f"{what}: {str(path)!r} is a single array, not an .npz archive; save the arrays "
                             "with np.savez")
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        raise AscendEmuError(f"{what}: {str(path)!r} is not an .npz archive (not a zip file); save the arrays "
                             "with np.savez")
    with open(p, "rb") as fh:       # numpy leaves its own handle open when the archive is damaged
        try:
            z = np.load(fh, allow_pickle=False)
        except Exception as e:   # noqa: BLE001 - numpy raises many kinds for a damaged file
            raise AscendEmuError(f"{what}: cannot read {str(path)!r} as an .npz file ({_load_problem(e)}); "
                                 "save the arrays with np.savez") from None
        with z:
            return {k: _npz_member(z, k, path, what) for k in z.files}


def _npz_member(z, key: str, path, what: str) -> np.ndarray:
    """One array of an open .npz; an object array (a pickle) or a damaged member is a one-line error."""
    try:
        return z[key]
    except Exception as e:   # noqa: BLE001 - zipfile, zlib and numpy raise many kinds for a damaged member
        raise AscendEmuError(f"{what}: cannot read array {key!r} of {str(path)!r} ({_load_problem(e)}); "
                             "save numeric arrays with np.savez") from None


def _load_problem(e: Exception) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    if "allow_pickle" in text or "Object arrays" in text:
        return "it holds an object array, i.e. pickled Python objects, which ascend-emu never loads"
    return text


def _parse_cli(items, graph: Graph) -> dict[str, np.ndarray]:
    """``["name=file.npy", "all.npz"]`` -> name -> array (names not yet resolved)."""
    out: dict[str, np.ndarray] = {}
    given: dict[str, str] = {}

    def put(name, value, item):
        if name in given:
            raise AscendEmuError(f"input {name!r} is given twice (--input {given[name]} and --input {item}); "
                                 "give each input once")
        given[name] = item
        out[name] = value

    for item in items:
        item = str(item)
        name, eq, path = item.partition("=")
        if eq and name and not os.path.exists(item):
            put(name.strip(), _load_array(path, f"--input {item}"), item)
            continue
        path = item
        if path.lower().endswith(".npz"):
            for k, v in load_npz(path, f"--input {item}").items():
                put(k, v, item)
        elif len(graph.inputs) == 1:
            put(graph.inputs[0].name, _load_array(path, f"--input {item}"), item)
        else:
            raise AscendEmuError(f"--input {item!r} must look like NAME=file.npy or file.npz "
                                 f"(the model has {len(graph.inputs)} inputs)")
    return out


def make_inputs(graph: Graph, inputs=None, *, seed: int = 0, shapes=None) -> dict[str, np.ndarray]:
    """The model's inputs, checked against its signature, keyed by placeholder name.

    Parameters
    ----------
    graph : Graph
        From :func:`ascend_emu.frontend.tf.loader.load_graph` (anything else is loaded with it).
    inputs : None, dict, numpy.ndarray, list
        ``None`` (or empty): seeded random inputs (module docstring). A dict input name ->
        array (placeholder name or signature key). One array for a one-input
        model; a list of arrays in signature order. A list of CLI strings
        ``"name=file.npy"`` / ``"file.npz"`` (the .npz keys name the inputs).
    seed : int
        Seed of the random inputs.
    shapes : dict or list of str, optional
        Input name -> shape (or ``"name=1,224,224,3"`` strings) for random
        inputs whose signature leaves dimensions unknown.

    Returns
    -------
    dict
        Placeholder name -> array, in signature order.

    Raises
    ------
    AscendEmuError
        Unknown input names (the message lists the valid ones), missing or
        unreadable files, inputs left out, a shape or dtype that does not fit
        the signature, unknown dimensions without a shape.
    """
    if not isinstance(graph, Graph):
        from .tf.loader import load_graph
        graph = load_graph(graph)
    check_seed(seed)
    resolve = _resolver(graph)
    overrides = _parse_shapes(graph, shapes, resolve)

    if inputs is None or (isinstance(inputs, (list, tuple, dict)) and len(inputs) == 0):
        # (an empty --input list means "none given")
        rng = np.random.default_rng(seed)
        return {s.name: random_input(s, resolve_shape(s, overrides.get(s.name)), rng)
                for s in graph.inputs}

    if isinstance(inputs, np.ndarray) or np.isscalar(inputs):
        if len(graph.inputs) != 1:
            raise AscendEmuError(f"one array given but the model has {len(graph.inputs)} inputs; "
                                 f"pass a dict name -> array")
        given = {graph.inputs[0].name: inputs}
    elif isinstance(inputs, dict):
        given = dict(inputs)
    elif isinstance(inputs, (list, tuple)):
        if all(isinstance(x, (str, os.PathLike)) for x in inputs):
            given = _parse_cli(inputs, graph)
        else:
            if len(inputs) != len(graph.inputs):
                raise AscendEmuError(f"{len(inputs)} arrays given for {len(graph.inputs)} inputs "
                                     f"({', '.join(s.name for s in graph.inputs)}); give one per input "
                                     f"or a dict name -> array")
            given = {s.name: x for s, x in zip(graph.inputs, inputs)}
    else:
        raise AscendEmuError(f"inputs must be None, an array, a dict name -> array or a list of "
                             f"'name=file.npy' strings, not {type(inputs).__name__}")

    out: dict[str, np.ndarray] = {}
    for name, value in given.items():
        spec = resolve(str(name), "--input")
        if spec.name in out:
            raise AscendEmuError(f"input {spec.name!r} is given twice")
        out[spec.name] = _check(spec, value, overrides.get(spec.name))
    missing = [s.name for s in graph.inputs if s.name not in out]
    if missing:
        raise AscendEmuError(f"no value for input(s) {', '.join(missing)}; give every input "
                             f"(--input NAME=file.npy) or none for seeded random inputs")
    return {s.name: out[s.name] for s in graph.inputs}


def _check(spec: InputSpec, value, override) -> np.ndarray:
    want = _np_dtype(spec)
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    if arr.dtype != want:
        hint = f"; convert it with .astype(np.{want.name})" if arr.dtype.kind in "fiub" else ""
        raise AscendEmuError(f"input {spec.name!r} has dtype {arr.dtype.name}, expected {want.name}{hint}")
    expect = override if override is not None else spec.shape
    if expect is not None and (len(arr.shape) != len(expect) or any(
            e is not None and e != d for e, d in zip(expect, arr.shape))):
        raise AscendEmuError(f"input {spec.name!r} has shape {tuple(arr.shape)}, expected {_fmt(expect)}")
    # (np.ascontiguousarray would turn a scalar into shape (1,))
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr).reshape(arr.shape)


def inputs_sha256(inputs: dict[str, np.ndarray]) -> str:
    """sha256 over the inputs: sorted names, each with its dtype, shape and bytes."""
    h = hashlib.sha256()
    for name in sorted(inputs):
        a = np.ascontiguousarray(inputs[name])
        h.update(f"{name}\0{a.dtype.name}\0{','.join(map(str, a.shape))}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()

"""Reading a dump: :func:`load_dump` checks a complete dump against its schema, :class:`Dump`
reads its tensors (memory-mapped, or streamed in chunks) without following any link."""
from __future__ import annotations

import os
import re
import stat
import threading

import numpy as np

from ...errors import DumpError
from ...fileio import check_path, open_in_dump, os_error_text, parse_json, read_text
from .format import (_STAT_FIELDS, _TENSOR_FILE, CHUNK, CODED_FORMATS, FORMAT, MANIFEST, MARKER, MAX_MANIFEST_BYTES, VERSION,
                     _decode_float, _dtype_from_name, _storage)

_RERUN = "re-run the replay (or reference) that writes it"
#: numpy parses an .npy header with ast.literal_eval, which CPython 3.11 (before 3.11.8) cannot run in two threads
#: at once ("SystemError: AST constructor recursion depth mismatch"): compare reads tensors in threads
_HEADER_LOCK = threading.Lock()


class Dump:
    """A complete dump directory, read-only. Tensors are loaded lazily (memory-mapped)."""

    def __init__(self, path: str, manifest: dict):
        self.path = path
        self.manifest = manifest
        self.ops: list[dict] = manifest["ops"]
        self.fused_away: list[dict] = manifest.get("fused_away", [])
        self._by_name = {op["name"]: op for op in self.ops}

    kind = property(lambda self: self.manifest["kind"])
    config = property(lambda self: self.manifest.get("config", {}))
    model = property(lambda self: self.manifest.get("model", {}))
    summary = property(lambda self: self.manifest.get("summary", {}))
    inputs_sha256 = property(lambda self: self.manifest.get("inputs_sha256"))
    #: a training step's dump: the placeholders holding the run's state (weights, slots, loss scale)
    state_inputs = property(lambda self: [str(n) for n in (self.model.get("state_inputs") if isinstance(
        self.model, dict) else None) or []])
    tool_version = property(lambda self: self.manifest.get("tool_version"))

    @property
    def status_bits(self) -> int:
        """OR of every op's status bits."""
        bits = 0
        for op in self.ops:
            bits |= int(op.get("status", 0))
        return bits

    def __contains__(self, name) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.ops)

    def __repr__(self) -> str:
        return f"Dump({self.path!r}, kind={self.kind!r}, ops={len(self.ops)})"

    def op(self, name: str) -> dict:
        """The manifest entry of op ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"op {name!r} is not in dump {self.path}") from None

    def has_tensor(self, name: str, index: int = 0) -> bool:
        op = self.op(name)
        return 0 <= index < len(op["outputs"]) and op["outputs"][index]["file"] is not None

    def _locate(self, name: str, index: int):
        """Validate output ``index`` of op ``name`` on disk: (file path, stored dtype, dtype, shape, offset, F order)."""
        op = self.op(name)
        if not 0 <= index < len(op["outputs"]):
            raise KeyError(f"op {name!r} has {len(op['outputs'])} output(s), no output {index}")
        out = op["outputs"][index]
        if out.get("skipped"):
            raise DumpError(f"output {index} of op {name!r} in dump {self.path} was not dumped ({out['skipped']})")
        if out["file"] is None:
            raise DumpError(f"output {index} of op {name!r} in dump {self.path} holds statistics only; "
                            "re-run the replay with a full dump (or select this op) to get the tensor")
        try:
            dtype = _dtype_from_name(out["dtype"])
        except TypeError:
            raise DumpError(f"dump {self.path}: unknown dtype {out['dtype']!r} for op {name!r}; {_RERUN}") from None
        shape = tuple(int(d) for d in out["shape"])
        try:
            with self._open(out["file"]) as f, _HEADER_LOCK:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    hshape, fortran, hdtype = np.lib.format.read_array_header_1_0(f)
                else:
                    hshape, fortran, hdtype = np.lib.format.read_array_header_2_0(f)
                offset = f.tell()
                size = os.fstat(f.fileno()).st_size
        except DumpError:
            raise
        except Exception as e:   # noqa: BLE001 - numpy parses the header with ast/tokenize: any error means corrupt
            raise DumpError(f"dump {self.path}: tensor file {out['file']} is corrupt "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                            f"{_RERUN}") from None
        stored = _storage(np.empty(0, dtype))[0].dtype
        if tuple(hshape) != shape or hdtype != stored:
            raise DumpError(f"dump {self.path}: tensor file {out['file']} holds {hdtype} {list(hshape)} but the "
                            f"manifest says {out['dtype']} {list(shape)}; {_RERUN}")
        fpath = os.path.join(self.path, out["file"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * stored.itemsize
        if size < offset + nbytes:
            raise DumpError(f"dump {self.path}: tensor file {out['file']} is truncated ({size} of "
                            f"{offset + nbytes} bytes); {_RERUN}")
        return fpath, stored, dtype, shape, offset, bool(fortran)

    def _open(self, fname: str):
        """Tensor file ``fname`` opened for reading: a plain name of a regular file inside the dump,
        never reached through a symbolic link (the manifest is data, not a path to follow)."""
        if not isinstance(fname, str) or not _TENSOR_FILE.match(fname):
            raise DumpError(f"dump {self.path}: tensor file name {fname!r} is not a file inside the dump "
                            f"directory; the manifest is corrupt; {_RERUN}")
        return open_in_dump(self.path, fname, what=f"dump {self.path}: tensor file", error=DumpError, hint=_RERUN)

    def tensor(self, name: str, index: int = 0, mmap: bool = True) -> np.ndarray:
        """Output ``index`` of op ``name`` in its dumped dtype (memory-mapped read-only by default).

        Raises DumpError if the tensor was not dumped (statistics only) or its file is
        missing, truncated or does not match the manifest.
        """
        fpath, stored, dtype, shape, offset, fortran = self._locate(name, index)
        order = "F" if fortran else "C"
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            arr = np.empty(shape, stored)
        elif mmap:
            with self._open(os.path.basename(fpath)) as f:
                arr = np.memmap(f, dtype=stored, mode="r", offset=offset, shape=shape, order=order)
        else:
            with self._open(os.path.basename(fpath)) as f:
                f.seek(offset)
                arr = np.fromfile(f, dtype=stored, count=count).reshape(shape, order=order)
        if self.op(name)["outputs"][index]["dtype"] in CODED_FORMATS:
            return _widen(arr, self.op(name)["outputs"][index]["dtype"])
        return arr.view(dtype) if stored != dtype else arr

    def chunks(self, name: str, index: int = 0, chunk: int = CHUNK):
        """Yield output ``index`` of op ``name`` flattened in C order, ``chunk`` elements at a time.

        Reads the file sequentially into one reused buffer, so memory stays at one chunk
        whatever the tensor's size. Each yielded array is only valid until the next one
        is requested. (Fortran-ordered files, which DumpWriter never writes, are loaded whole.)
        """
        fpath, stored, dtype, shape, offset, fortran = self._locate(name, index)
        coded = self.op(name)["outputs"][index]["dtype"]
        coded = coded if coded in CODED_FORMATS else None
        count = int(np.prod(shape, dtype=np.int64))
        if fortran:
            flat = np.ascontiguousarray(self.tensor(name, index, mmap=True)).reshape(-1)
            for s in range(0, count, chunk):
                yield flat[s:s + chunk]
            return
        buf = np.empty(min(chunk, count), stored)
        with self._open(os.path.basename(fpath)) as f:
            f.seek(offset)
            done = 0
            while done < count:
                k = min(chunk, count - done)
                view = buf[:k]
                got = f.readinto(memoryview(view).cast("B"))
                if got != k * stored.itemsize:
                    raise DumpError(f"dump {self.path}: tensor file {os.path.basename(fpath)} is truncated; {_RERUN}")
                done += k
                yield (_widen(view, coded) if coded else view.view(dtype) if stored != dtype else view)

    def output_stats(self, name: str, index: int = 0) -> dict:
        return self.op(name)["outputs"][index]


def _widen(codes: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values of the codes of coded format ``fmt`` (exact)."""
    from ...numerics.lowfloat import decode

    return decode(np.asarray(codes), fmt).reshape(np.shape(codes))


def _check_manifest(path: str, m, *, label: str = "manifest.json", fix: str = _RERUN) -> None:
    """Validate a parsed manifest against the schema of its format version; one line naming the field.

    ``label`` names the manifest in messages and ``fix`` says what to do (a manifest kept elsewhere, as in
    an msprobe export's ``ascend_emu.json``, says so).
    """
    from ..schema import MANIFEST_SCHEMAS, SchemaViolation, validate

    if not isinstance(m, dict):
        raise DumpError(f"dump {path}: {label} is malformed: expected a JSON object; {fix}")
    if m.get("format") != FORMAT:
        give = "give the directory written by ascend-emu replay/reference --dump" if fix == _RERUN else fix
        raise DumpError(f"{path} is not an ascend-emu dump (format {str(m.get('format'))[:40]!r}, expected "
                        f"{FORMAT!r}); {give}")
    schema = MANIFEST_SCHEMAS.get(m.get("version")) if _is_int(m.get("version")) else None
    if schema is None:
        v = m.get("version")
        raise DumpError(f"dump {path} has format version {v if _is_int(v) else repr(str(v)[:20])}, this ascend-emu reads "
                        f"version {VERSION}; {fix} with this version")
    try:
        validate(m, schema)
    except SchemaViolation as e:
        where = ""
        mo = re.match(r"ops\[(\d+)\]", e.field)
        if mo and isinstance(m.get("ops"), list):
            op = m["ops"][int(mo.group(1))]
            if isinstance(op, dict) and isinstance(op.get("name"), str):
                where = f" (op {op['name'][:80]!r})"
        raise DumpError(f"dump {path}: {label} is malformed at {e}{where}; {fix}") from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def load_dump(path) -> Dump:
    """Open a complete dump directory.

    Raises
    ------
    DumpError
        The directory is missing, still marked ``INCOMPLETE``, has no or a corrupt
        ``manifest.json`` (unreadable, a symbolic link, not JSON, nested too deep, or any
        field that does not fit the schema of its version), is of another format or
        version, or names a tensor file that is not a regular file inside the directory.
        (Truncated files are detected when read.)
    """
    if isinstance(path, Dump):
        return path
    path = check_path(path, "dump directory")
    if not os.path.isdir(path):
        raise DumpError(f"dump directory {path} does not exist; run ascend-emu replay/reference with --dump {path}")
    if os.path.lexists(os.path.join(path, MARKER)):
        raise DumpError(f"dump {path} is incomplete (the run that wrote it did not finish); {_RERUN}")
    mpath = os.path.join(path, MANIFEST)
    if not os.path.lexists(mpath):
        raise DumpError(f"dump {path} has no manifest.json (incomplete or not a dump); {_RERUN}")
    text = read_text(mpath, f"dump {path}:", max_bytes=MAX_MANIFEST_BYTES, error=DumpError, hint=_RERUN)
    m = parse_json(text, f"dump {path}: manifest.json", error=DumpError, fix=_RERUN)
    _check_manifest(path, m)
    for op in m["ops"]:
        for out in op["outputs"]:
            for k in _STAT_FIELDS:
                out[k] = _decode_float(out.get(k))
            f = out["file"]
            if f is None:
                continue
            if not _TENSOR_FILE.match(f):
                raise DumpError(f"dump {path}: manifest.json names tensor file {f[:80]!r} for op "
                                f"{op['name'][:80]!r}, which is not a plain file name inside the dump directory "
                                f"(a path or a link is never followed); {_RERUN}")
            try:
                st = os.lstat(os.path.join(path, f))
            except FileNotFoundError:
                raise DumpError(f"dump {path}: tensor file {f} (op {op['name'][:80]!r}) is missing; {_RERUN}") from None
            except OSError as e:
                raise DumpError(f"dump {path}: tensor file {f} cannot be read ({os_error_text(e)}); {_RERUN}") from None
            if not stat.S_ISREG(st.st_mode):
                raise DumpError(f"dump {path}: tensor file {f} (op {op['name'][:80]!r}) is "
                                f"{'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'not a regular file'}, "
                                f"which a dump never holds; {_RERUN}")
        fc = op.get("fp32_check")
        if isinstance(fc, dict):
            fc["max_abs"] = _decode_float(fc.get("max_abs"))
    return Dump(path, m)

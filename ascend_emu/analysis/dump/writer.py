"""Writing a dump: :class:`DumpWriter`, the completeness protocol and the directory lock.

While a dump is being written its directory holds the marker ``INCOMPLETE`` (listing
every file created, name first) and no manifest; :meth:`DumpWriter.finish` writes the
manifest atomically and then removes the marker. ``overwrite`` deletes only files a dump
made (:func:`_owned_files`); an exclusive ``flock`` keeps a second writer out.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...errors import AscendEmuError
from ...fileio import O_NOFOLLOW, check_output_dir, os_error_text
from ...graph.core import tensor_name
from ...numerics.status import decode_status
from .format import Coded
from .format import (_MARKER_HEAD, _STAT_FIELDS, _TENSOR_FILE, _TMP_MANIFEST, FORMAT, KINDS, LOCK, MANIFEST,
                     MARKER, MAX_MANIFEST_BYTES, VARIANT, VERSION, _attrs_subset, _dtype_from_name, _is_string,
                     _is_variant, _stem, _storage, json_safe)
from .stats import tensor_stats

def _fs_error(path, e: OSError, doing: str) -> AscendEmuError:
    """One line for a file-system fault on a dump (read-only directory, full disk, file size limit)."""
    where = f" ({os.path.basename(e.filename)})" if getattr(e, "filename", None) else ""
    # numpy reports a short write without an errno: say what causes one
    text = os_error_text(e) if e.errno else f"{e} (a short write: the disk is full or a file size limit was reached)"
    return AscendEmuError(f"cannot {doing} dump {path}: {text}{where}; the dump is left incomplete "
                          "(no reader accepts it); free space, fix the permissions or choose another directory")


def _read_own_file(path: str, limit: int = MAX_MANIFEST_BYTES) -> str | None:
    """The text of a dump's own small regular file, never through a symbolic link; None if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(limit + 1)
    return None if len(data) > limit else data.decode("utf-8", "replace")


def _owned_files(p: str, entries: dict) -> set:
    """The entries of dump directory ``p`` that an ascend-emu dump created.

    A complete dump owns its manifest and the tensor files the manifest names; an
    incomplete one owns the files its ``INCOMPLETE`` marker lists (the writer records a
    name there before creating the file). The lock file and the temporary manifest are
    always the dump's.
    """
    owned = {LOCK, _TMP_MANIFEST}
    if MARKER in entries:
        text = _read_own_file(os.path.join(p, MARKER))
        if text is not None:
            owned.add(MARKER)
            owned.update(ln for ln in text.splitlines()[1:] if _TENSOR_FILE.match(ln))
            if MANIFEST in entries:
                owned.add(MANIFEST)   # a finish() stopped between writing the manifest and removing the marker
    if MANIFEST in entries:
        text = _read_own_file(os.path.join(p, MANIFEST))
        try:
            m = json.loads(text) if text is not None else None
        except (ValueError, RecursionError):
            m = None
        if isinstance(m, dict) and m.get("format") == FORMAT and isinstance(m.get("ops"), list):
            owned.add(MANIFEST)
            for op in m["ops"]:
                outs = op.get("outputs") if isinstance(op, dict) else None
                for out in outs if isinstance(outs, list) else []:
                    f = out.get("file") if isinstance(out, dict) else None
                    if isinstance(f, str) and _TENSOR_FILE.match(f):
                        owned.add(f)
    return owned


@dataclass(frozen=True)
class StatsOnly:
    """An output known by its statistics only, for :meth:`DumpWriter.add_op` (no tensor file).

    For dumps converted from another tool's statistics (msprobe's statistics level) or restored
    from an export. Fields as in the manifest: ``dtype`` (a name :class:`Dump` reads), ``shape``,
    ``max``/``min``/``mean``/``l2norm`` (float, ``None``, or non-finite) and the ``nan``/``inf`` counts.
    """

    dtype: str
    shape: tuple
    max: float | None = None
    min: float | None = None
    mean: float | None = None
    l2norm: float | None = None
    nan: int = 0
    inf: int = 0

    def entry(self) -> dict:
        try:
            _dtype_from_name(self.dtype)
        except TypeError:
            raise AscendEmuError(f"unknown dtype {self.dtype!r} in recorded statistics") from None
        if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in self.shape):
            raise AscendEmuError(f"malformed shape {list(self.shape)!r} in recorded statistics")
        return {"file": None, "dtype": str(self.dtype), "shape": [int(d) for d in self.shape],
                **{k: json_safe(None if getattr(self, k) is None else float(getattr(self, k)))
                   for k in _STAT_FIELDS}, "nan": int(self.nan), "inf": int(self.inf)}


def check_dump_dir(path, overwrite: bool) -> list:
    """Refuse a dump directory that cannot be (over)written; returns its current entries.

    A path that is a symbolic link or not a directory, a non-empty directory without
    ``overwrite``, and (with ``overwrite``) a directory holding anything an ascend-emu
    dump did not create (see :func:`_owned_files`) are one-line errors, raised before
    any work is done. Nothing is followed through a symbolic link.
    """
    p = check_output_dir(path, "dump path")
    if not os.path.isdir(p):
        return []
    try:
        entries = {e: os.lstat(os.path.join(p, e)) for e in os.listdir(p)}
    except OSError as e:
        raise AscendEmuError(f"dump directory {p} cannot be read ({os_error_text(e)}); "
                             "fix its permissions or choose another directory") from None
    if any(e != LOCK for e in entries) and not overwrite:
        raise AscendEmuError(f"dump directory {p} is not empty; pass --overwrite (overwrite=True) "
                             "to replace it, or choose another directory")
    owned = _owned_files(p, entries) if entries else set()
    foreign = sorted(e for e, st in entries.items() if e not in owned or not stat.S_ISREG(st.st_mode))
    if foreign:
        raise AscendEmuError(f"dump directory {p} holds files that are not part of a dump "
                             f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                             "refusing to delete it with --overwrite; choose another directory")
    return list(entries)


def _lock_dir(p: str) -> int:
    """An exclusive flock on ``p``/.ascend-emu.lock, taken at once or a one-line error; the open fd."""
    path = os.path.join(p, LOCK)
    busy = (f"dump directory {p} is being written by another ascend-emu run right now; wait for it to "
            "finish or choose another directory")
    for _ in range(5):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | O_NOFOLLOW, 0o666)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise AscendEmuError(f"dump directory {p}: {LOCK} is a symbolic link; remove it") from None
            raise _fs_error(p, e, "lock") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise AscendEmuError(busy) from None
            raise _fs_error(p, e, "lock") from None
        # a finishing writer removes the lock file: make sure ours is still the one in the directory
        mine = os.fstat(fd)
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)
    raise AscendEmuError(busy)


def _unlock_dir(p: str, fd: int, remove: bool = True) -> None:
    """Drop the lock :func:`_lock_dir` took (removing the lock file first, while still holding it)."""
    if remove:
        try:
            os.unlink(os.path.join(p, LOCK))
        except OSError:
            pass
    os.close(fd)


def _sha256(stored: np.ndarray) -> str:
    """The sha256 of a tensor's bytes as its ``.npy`` file stores them (C order, no header)."""
    return hashlib.sha256(np.ascontiguousarray(stored).view(np.uint8).reshape(-1).data).hexdigest()


class DumpWriter:
    """Write a dump directory op by op.

    Parameters
    ----------
    path : str or os.PathLike
        The dump directory; created if missing.
    kind : {"npu", "bench"}
        ``"npu"`` for the emulated replay, ``"bench"`` for the float32 reference.
    config : dict
        The configuration of the run (precision mode, overflow mode, ...), JSON-able.
    model : dict
        ``{"name": ..., "fingerprint": ...}`` identifying the model.
    inputs_sha256 : str
        Hash of the inputs fed to the model.
    overwrite : bool
        Replace an existing dump in ``path``. A non-empty directory holding anything
        that is not part of a dump is never deleted.
    stats_only : bool
        Record statistics only, no ``.npy`` files.
    select : callable, str or None
        ``select(name, tf_type) -> bool``: which ops get ``.npy`` files (the others
        get statistics only); a string is a regular expression on op names
        (:func:`op_selector`). ``None`` selects every op.
    digest : bool
        Record each output's ``sha256`` (of the bytes its ``.npy`` file holds or would hold), so two
        dumps compare bit for bit without their tensors (random-error detection's statistics dumps).

    Use as a context manager, or call :meth:`finish` yourself. Leaving the ``with``
    block normally finishes the dump (with an empty summary if :meth:`finish` was not
    called); leaving it by an exception leaves the dump marked incomplete.
    """

    def __init__(self, path, *, kind: str, config: dict, model: dict, inputs_sha256: str,
                 overwrite: bool = False, stats_only: bool = False,
                 select: Callable[[str, str], bool] | None = None, digest: bool = False,
                 sources: dict | None = None):
        if kind not in KINDS:
            raise AscendEmuError(f"unknown dump kind {kind!r}; choose one of: {', '.join(KINDS)}")
        self.path = os.fspath(path)
        self.kind = kind
        self.config = json_safe(dict(config or {}))
        self.model = json_safe(dict(model or {}))
        self.inputs_sha256 = str(inputs_sha256)
        self.stats_only = bool(stats_only)
        self.digest = bool(digest)
        self.select = op_selector(select) if isinstance(select, str) else select
        #: op name -> what the model's source says of it: ``scope`` (the exporter's module scope, folded by the
        #: report's graph) and ``source_type`` (the ONNX op type of the op named after an ONNX node)
        self.sources = dict(sources or {})
        self._ops: list[dict] = []
        self._fused: list[dict] = []
        self._names: set[str] = set()
        self._stems: set[str] = set()
        self._finished = False
        self._lock = self._marker = None
        self._prepare_dir(overwrite)

    def _prepare_dir(self, overwrite: bool) -> None:
        p = self.path
        check_dump_dir(p, overwrite)   # refuse before creating anything
        try:
            os.makedirs(p, exist_ok=True)
        except OSError as e:
            raise _fs_error(p, e, "create") from None
        self._lock = _lock_dir(p)
        try:
            # again under the lock: another run may have written the directory meanwhile
            entries = check_dump_dir(p, overwrite)
            # The marker goes first so the directory never looks complete while we clear it; it lists
            # the old files still to delete, so a run stopped half-way leaves them owned by the dump.
            old = [e for e in entries if e not in (MARKER, LOCK)]
            self._marker = os.open(os.path.join(p, MARKER), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_NOFOLLOW,
                                   0o666)
            os.write(self._marker, (_MARKER_HEAD + "".join(e + "\n" for e in old if _TENSOR_FILE.match(e)))
                     .encode())
            for e in ([MANIFEST] if MANIFEST in old else []) + [e for e in old if e != MANIFEST]:
                os.unlink(os.path.join(p, e))   # unlink removes a link itself, never its target
        except BaseException as e:
            self._release(remove_lock=True)
            if isinstance(e, OSError):
                raise _fs_error(p, e, "prepare") from None
            raise

    def _release(self, remove_lock: bool) -> None:
        """Close the marker and drop the lock (removing the lock file first, while still holding it)."""
        if self._marker is not None:
            os.close(self._marker)
            self._marker = None
        if self._lock is not None:
            _unlock_dir(self.path, self._lock, remove_lock)
            self._lock = None

    # ------------------------------------------------------------------ ops

    def _file_stem(self, name: str) -> str:
        base = _stem(name)
        stem = base
        k = 1
        # compare case-insensitively: two names differing only in case collide on macOS/Windows
        while stem.lower() in self._stems:
            k += 1
            stem = f"{base}~{k}"
        self._stems.add(stem.lower())
        return stem

    def _coded(self, t: Coded, stem, i: int, status: int) -> dict:
        """The manifest entry of output ``i`` held as codes of a coded format (its file, if ``stem``)."""
        from ...numerics.lowfloat import decode, encode

        vals = np.asarray(t.values)
        fname = None
        want = stem is not None or self.digest
        if want and t.codes is not None:
            codes = np.asarray(t.codes)         # the maker's own codes, which its values decode
        elif want:
            # exact: the values are the format's own, Inf and NaN included (kept as they are under inf_nan)
            codes, _ = encode(vals, t.fmt, overflow_mode="inf_nan")
            back = decode(codes, t.fmt).reshape(vals.shape)
            v32 = vals.astype(np.float32)
            if not np.array_equal(back, v32, equal_nan=True) or not np.array_equal(np.signbit(back), np.signbit(v32)):
                raise AscendEmuError(f"output {i} of an op holds values that are not {t.fmt} values; it cannot be "
                                     f"stored as {t.fmt} codes")
        if stem is not None:
            fname = f"{stem}.{i}.npy"
            self._write_tensor(fname, np.ascontiguousarray(codes.reshape(vals.shape)))
        st = tensor_stats(vals)
        entry = {"index": i, "file": fname, "dtype": t.fmt, "shape": [int(d) for d in vals.shape],
                 **{k: json_safe(st[k]) for k in _STAT_FIELDS}, "nan": st["nan"], "inf": st["inf"], "status": status}
        if self.digest:
            entry["sha256"] = _sha256(codes.reshape(vals.shape))
        return entry

    def add_op(self, name: str, tf_type: str, ascend_type: str, engine: str, compute_dtype, inputs,
               outputs, status=0, *, attrs: dict | None = None, precision: dict | None = None,
               fusion: dict | None = None, fp32_check: dict | None = None, phase: str | None = None) -> dict:
        """Record one executed op and its outputs (in execution order).

        ``outputs`` is a list of arrays of any dtype (or :class:`StatsOnly` records of outputs
        known by their statistics only). ``status`` is the op's overflow
        status bits, or a list with one entry per output (the op's status is their OR).
        ``precision`` is the device's decision, ``{"list": "white"|"black"|"gray"|None, "dtype",
        "cube_out", "reason": str}`` (every key kept);
        ``fusion`` is ``{"rule": str, "replaces": [names], "tf_type": str}``; ``fp32_check`` is
        ``{"overflow": bool, "max_abs": float}`` from the float32 rerun of an
        overflowing op; ``phase`` (training steps) is ``forward``, ``backward`` or
        ``update``. Returns the op's manifest entry.
        """
        if self._finished:
            raise RuntimeError(f"dump {self.path} is already finished")
        if name in self._names:
            raise AscendEmuError(f"op {name!r} added twice to dump {self.path}; op names must be unique")
        outputs = list(outputs)
        if isinstance(status, (list, tuple)):
            if len(status) != len(outputs):
                raise AscendEmuError(f"op {name!r}: {len(status)} status values for {len(outputs)} outputs")
            out_status = [int(s) for s in status]
        else:
            out_status = [int(status)] * len(outputs)
        op_status = 0
        for s in out_status:
            op_status |= s
        if not outputs:
            op_status = int(status) if not isinstance(status, (list, tuple)) else 0
        keep = not self.stats_only and (self.select is None or bool(self.select(name, tf_type)))
        stem = self._file_stem(name) if keep and any(not isinstance(o, StatsOnly) for o in outputs) else None
        outs = []
        for i, arr in enumerate(outputs):
            if isinstance(arr, StatsOnly):
                outs.append({"index": i, **arr.entry(), "status": out_status[i]})
                continue
            if isinstance(arr, Coded):
                outs.append(self._coded(arr, stem if keep else None, i, out_status[i]))
                continue
            arr = np.asarray(arr)
            if _is_variant(arr):
                # a TF variant (a TensorList of a loop): no bytes to store, nothing to compare
                outs.append({"index": i, "file": None, "dtype": VARIANT, "shape": [],
                             **{k: None for k in _STAT_FIELDS}, "nan": 0, "inf": 0, "status": out_status[i],
                             "skipped": "variant (TensorList): not dumped"})
                continue
            if _is_string(arr):
                # strings have no numerics to compare: recorded (shape, status) but never written
                outs.append({"index": i, "file": None, "dtype": "string", "shape": [int(d) for d in arr.shape],
                             **{k: None for k in _STAT_FIELDS}, "nan": 0, "inf": 0, "status": out_status[i],
                             "skipped": "string tensor: not dumped"})
                continue
            stored, dname = _storage(arr)
            fname = None
            if keep:
                fname = f"{stem}.{i}.npy"
                self._write_tensor(fname, stored)
            st = tensor_stats(arr)
            outs.append({"index": i, "file": fname, "dtype": dname, "shape": [int(d) for d in arr.shape],
                         **{k: json_safe(st[k]) for k in _STAT_FIELDS}, "nan": st["nan"], "inf": st["inf"],
                         "status": out_status[i], **({"sha256": _sha256(stored)} if self.digest else {})})
        if fp32_check is not None:
            fp32_check = {"overflow": bool(fp32_check.get("overflow")),
                          "max_abs": None if fp32_check.get("max_abs") is None
                          else json_safe(float(fp32_check["max_abs"]))}
        if fusion is not None:
            fusion = {"rule": str(fusion.get("rule")), "replaces": [str(r) for r in fusion.get("replaces", [])],
                      **({"rules": [str(r) for r in fusion["rules"]]} if fusion.get("rules") else {}),
                      # the original type of the op whose name the fused op took (the others: fused_away)
                      **({"tf_type": str(fusion["tf_type"])} if fusion.get("tf_type") else {})}
        if precision is not None:
            precision = json_safe({k: (str(v) if k == "reason" else v) for k, v in precision.items()})
        entry = {
            "index": len(self._ops), "name": str(name), "tf_type": str(tf_type), "ascend_type": str(ascend_type),
            "engine": str(engine), "compute_dtype": None if compute_dtype is None else str(
                compute_dtype if isinstance(compute_dtype, str) else np.dtype(compute_dtype).name),
            "inputs": [tensor_name(str(r)) for r in (inputs or [])], "attrs": _attrs_subset(attrs),
            "precision": precision, "fusion": fusion, "status": op_status,
            "status_names": decode_status(op_status), "fp32_check": fp32_check, "outputs": outs,
        }
        if phase is not None:
            entry["phase"] = str(phase)
        src = self.sources.get(name)
        if src:
            entry.update({k: str(v) for k, v in src.items() if k in ("scope", "source_type", "internal") and v})
        self._names.add(name)
        self._ops.append(entry)
        return entry

    def _write_tensor(self, fname: str, stored: np.ndarray) -> None:
        """One .npy file: its name into the marker first, then a new file (never an existing one or a link)."""
        try:
            os.write(self._marker, (fname + "\n").encode())
            fd = os.open(os.path.join(self.path, fname), os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o666)
            with os.fdopen(fd, "wb") as f:
                np.lib.format.write_array(f, stored, allow_pickle=False)
        except OSError as e:
            raise _fs_error(self.path, e, "write") from None

    def add_fused(self, name: str, tf_type: str, rule: str, into: str) -> None:
        """Record an original op swallowed by a fusion ``rule`` into op ``into`` (no output of its own)."""
        if self._finished:
            raise RuntimeError(f"dump {self.path} is already finished")
        self._fused.append({"name": str(name), "tf_type": str(tf_type), "rule": str(rule), "into": str(into)})

    # ------------------------------------------------------------------ completion

    def manifest(self, summary: dict | None = None) -> dict:
        from ...version import __version__
        return {"format": FORMAT, "version": VERSION, "kind": self.kind, "config": self.config,
                "model": self.model, "inputs_sha256": self.inputs_sha256, "tool_version": __version__,
                "ops": self._ops, "fused_away": self._fused, "summary": json_safe(dict(summary or {}))}

    def finish(self, summary: dict | None = None) -> str:
        """Write ``manifest.json`` atomically, then remove the ``INCOMPLETE`` marker. Returns the path."""
        if self._finished:
            raise RuntimeError(f"dump {self.path} is already finished")
        text = json.dumps(self.manifest(summary), indent=1, allow_nan=False)
        tmp = os.path.join(self.path, _TMP_MANIFEST)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | O_NOFOLLOW, 0o666)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(self.path, MANIFEST))
            os.remove(os.path.join(self.path, MARKER))
        except OSError as e:
            if os.path.lexists(tmp):
                os.remove(tmp)
            self._release(remove_lock=True)
            raise _fs_error(self.path, e, "finish") from None
        self._finished = True
        self._release(remove_lock=True)
        return self.path

    @property
    def finished(self) -> bool:
        return self._finished

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None and not self._finished:
            self.finish({})
        if exc_type is not None:
            self.abort()
        return False

    def abort(self) -> None:
        """Stop writing: the dump stays marked incomplete, the lock is released."""
        self._release(remove_lock=True)

    def __del__(self):
        try:
            self._release(remove_lock=False)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


#: fused cube op types and the TF op type each counts as when selecting by type
_FUSED_BASE = {"_FusedConv2D": "Conv2D", "_FusedMatMul": "MatMul", "_FusedBatchMatMul": "BatchMatMul"}


def op_selector(regex: str | None = None, types=()) -> Callable[[str, str], bool] | None:
    """A ``select(name, tf_type)`` for dumps: ops whose name matches ``regex`` or whose TF type is in ``types``.

    A fused cube op (``_FusedConv2D``, ``_FusedMatMul``, ``_FusedBatchMatMul``) counts as the cube
    op it is built on. Returns None (every op) when neither is given.
    """
    types = set(types or ())
    if not regex and not types:
        return None
    try:
        rx = re.compile(regex) if regex else None
    except re.error as e:
        raise AscendEmuError(f"--select {regex!r} is not a valid regular expression ({e})") from None
    return lambda name, tf_type: bool((rx and rx.search(name)) or tf_type in types
                                      or _FUSED_BASE.get(tf_type) in types)

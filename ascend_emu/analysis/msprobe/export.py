"""Writing an ascend-emu dump in msprobe's layout (:func:`export_msprobe`)."""
from __future__ import annotations

import json
import os
import stat

from ...errors import AscendEmuError
from ...fileio import atomic_write_text, check_output_dir, make_output_dir
from ...graph import split_tensor_name
from ..dump import CODED_FORMATS, LOCK, json_safe, load_dump
from ..dump.writer import _lock_dir, _unlock_dir
from .format import (DATA_DIR, SIDECAR, SIDECAR_FORMAT, TENSOR_FORMATS, dump_key, _import_torch, _link_or_copy,
                     msprobe_names, msprobe_stats, torch_dtype, _write_tensor)

_OWN_FILES = ("dump.json", "stack.json", "construct.json", SIDECAR)



def _spelled(dtype: str) -> str:
    """The dtype an output is exported as: a format the dump stores as codes (hifloat8) as the float32 values
    the reader widens it to (msprobe has no spelling for it)."""
    return "float32" if dtype in CODED_FORMATS else dtype

def _prepare_rank_dir(path: str, out: str, overwrite: bool) -> int:
    """Create (or, with ``overwrite``, clear) rank directory ``path`` of msprobe dump root ``out`` and lock
    it as a dump directory is locked (:func:`~ascend_emu.analysis.dump.writer._lock_dir`), so a second
    export into it fails at once instead of mixing its files with ours; returns the lock's fd. Neither
    ``out``, the directories below it nor ``dump_tensor_data`` may be a symbolic link."""
    make_output_dir(path, "msprobe dump directory", root=out)
    data = check_output_dir(os.path.join(path, DATA_DIR), "msprobe dump directory", root=out)
    lock = _lock_dir(path)
    try:
        entries = [e for e in os.listdir(path) if e != LOCK]
        if entries and not overwrite:
            raise AscendEmuError(f"{path} is not empty; pass --overwrite (overwrite=True) to replace the msprobe "
                                 "dump in it, or choose another output directory")
        foreign = [e for e in entries if e not in _OWN_FILES + (DATA_DIR,)]
        if os.path.isdir(data):
            foreign += [os.path.join(DATA_DIR, e) for e in os.listdir(data)
                        if not (e.endswith(".npy") or e.endswith(".pt"))
                        or not stat.S_ISREG(os.lstat(os.path.join(data, e)).st_mode)]
        if foreign:
            raise AscendEmuError(f"{path} holds files that are not part of an msprobe dump "
                                 f"({', '.join(sorted(foreign)[:3])}"
                                 "); refusing to delete them with --overwrite; choose another output directory")
        for e in _OWN_FILES:
            if os.path.lexists(os.path.join(path, e)):
                os.remove(os.path.join(path, e))
        if os.path.isdir(data):
            for e in os.listdir(data):
                os.remove(os.path.join(data, e))
        else:
            os.makedirs(data)
    except BaseException:
        _unlock_dir(path, lock)
        raise
    return lock


def _json_text(obj) -> str:
    # msprobe writes with Python's json (NaN / Infinity as bare tokens) and reads the same way
    return json.dumps(obj, indent=1, allow_nan=True)


def export_msprobe(dump, out, *, step: int = 0, rank: int = 0, tensor_format: str = "npy",
                   overwrite: bool = False) -> str:
    """Write an ascend-emu dump in msprobe's layout; returns the ``step{N}/rank{R}`` directory.

    Parameters
    ----------
    dump : str, os.PathLike or Dump
        An ascend-emu dump directory.
    out : str or os.PathLike
        The msprobe dump root; ``out/step{step}/rank{rank}/`` is written.
    step, rank : int
        The step and rank the directory is named for (default 0, 0).
    tensor_format : {"npy", "pt"}
        ``.npy`` files (default, no PyTorch needed), or ``.pt`` (PyTorch's format, which msprobe's
        PyTorch ``compare`` reads; needs torch).
    overwrite : bool
        Replace an msprobe dump already in that directory (never anything else).

    Every op becomes the key ``Functional.<name>.0.forward``: its outputs under ``output``, the
    dumped producer tensors it reads under ``input_args`` (files hard-linked to the producer's),
    dtypes in torch spelling, statistics in msprobe's semantics (:func:`msprobe_stats`). Names are
    made to match ``^[a-zA-Z0-9_.:/-]+$`` (:func:`msprobe_names`); ``ascend_emu.json`` beside
    ``dump.json`` keeps the original names and the manifest, so :func:`import_msprobe` restores the
    dump exactly. A dump with no tensor files exports as msprobe's ``statistics`` task.
    """
    if tensor_format not in TENSOR_FORMATS:
        raise AscendEmuError(f"unknown tensor format {tensor_format!r}; choose one of: "
                             f"{', '.join(TENSOR_FORMATS)}")
    for what, v in (("step", step), ("rank", rank)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise AscendEmuError(f"{what} must be a non-negative integer, got {v!r}")
    d = load_dump(dump)
    for op in d.ops:   # every dtype must have a spelling before anything is written
        for o in op["outputs"]:
            try:
                torch_dtype(_spelled(o["dtype"]))
            except AscendEmuError as e:
                raise AscendEmuError(f"op {op['name']!r}: {e}") from None
    if tensor_format == "pt":
        _import_torch("exporting .pt tensor files")
    out = os.fspath(out)
    root = os.path.join(out, f"step{step}", f"rank{rank}")
    lock = _prepare_rank_dir(root, out, overwrite)
    try:
        data_dir = os.path.join(root, DATA_DIR)
        task = "tensor" if any(o["file"] for op in d.ops for o in op["outputs"]) else "statistics"
        names = msprobe_names(op["name"] for op in d.ops)
        ext = "." + tensor_format
        data, stack, construct = {}, {}, {}
        files: dict[tuple, str] = {}        # (op name, output index) -> file written for that output
        leaves: dict[tuple, dict] = {}      # (op name, output index) -> its output leaf
        for op in d.ops:
            key = dump_key(names[op["name"]])
            outs = []
            for o in op["outputs"]:
                leaf = {"type": "torch.Tensor", "dtype": torch_dtype(_spelled(o["dtype"])), "shape": list(o["shape"]),
                        **msprobe_stats(o, d, op["name"]), "requires_grad": False}
                if o["file"] is not None:
                    fname = f"{key}.output.{o['index']}{ext}"
                    arr = d.tensor(op["name"], o["index"], mmap=False)
                    _write_tensor(os.path.join(data_dir, fname), arr, tensor_format)
                    leaf["data_name"] = fname
                    files[(op["name"], o["index"])] = fname
                outs.append(leaf)
                leaves[(op["name"], o["index"])] = leaf
            ins = []
            for ref in op.get("inputs", []):
                src, idx = split_tensor_name(ref)
                if (src, idx) not in leaves:
                    continue  # a Placeholder or Const: not in the dump
                leaf = {k: v for k, v in leaves[(src, idx)].items() if k != "data_name"}
                if (src, idx) in files:
                    fname = f"{key}.input.{len(ins)}{ext}"
                    _link_or_copy(os.path.join(data_dir, files[(src, idx)]), os.path.join(data_dir, fname))
                    leaf["data_name"] = fname
                ins.append(leaf)
            data[key] = {"input_args": ins, "input_kwargs": {}, "output": outs}
            stack[str(len(stack))] = [[key], [f"ascend-emu op {op['name']} ({op.get('tf_type')} -> "
                                              f"{op.get('ascend_type')} on {op.get('engine')}, compute "
                                              f"{op.get('compute_dtype')}), execution index {op.get('index')}"]]
            construct[key] = None
        if task == "statistics":
            os.rmdir(data_dir)
        sidecar = {"format": SIDECAR_FORMAT, "version": 1, "task": task, "tensor_format": tensor_format,
                   "keys": {names[op["name"]]: op["name"] for op in d.ops},
                   "manifest": {k: v for k, v in d.manifest.items()}}
        atomic_write_text(os.path.join(root, SIDECAR), json.dumps(json_safe(sidecar), indent=1, allow_nan=False))
        atomic_write_text(os.path.join(root, "stack.json"), _json_text(stack))
        atomic_write_text(os.path.join(root, "construct.json"), _json_text(construct))
        # dump.json last: a directory without it is not a dump to msprobe
        atomic_write_text(os.path.join(root, "dump.json"), _json_text({
            "task": task, "level": "L1", "framework": "pytorch",
            "dump_data_dir": os.path.abspath(data_dir) if task == "tensor" else None, "data": data}))
    finally:
        _unlock_dir(root, lock)
    return root

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
from .format import (DATA_DIR, FRAMEWORKS, SIDECAR, SIDECAR_FORMAT, TENSOR_FORMATS, dump_key, _import_torch,
                     _link_or_copy, msprobe_names, msprobe_stats, pytorch_keys, torch_dtype, _write_tensor)

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


def _requires_grad(op: dict, index: int) -> bool:
    """Whether output ``index`` of ``op`` required grad, as its record says (a torch run's ``attrs``
    ``requires_grad``: one bool, or one per output); False when it does not say (a graph replay's)."""
    rg = (op.get("attrs") or {}).get("requires_grad")
    if isinstance(rg, list):
        rg = rg[index] if index < len(rg) else False
    return rg if isinstance(rg, bool) else False


def _stack_lines(op: dict) -> list:
    """The stack.json lines of one op: the call stack its record holds (a torch run's ``attrs`` ``stack``, msprobe's
    ``File <path>, line <n>, in <func>`` lines), else one line saying what ascend-emu ran."""
    st = (op.get("attrs") or {}).get("stack")
    if isinstance(st, list) and st and all(isinstance(x, str) for x in st):
        return st
    return [f"ascend-emu op {op['name']} ({op.get('tf_type')} -> {op.get('ascend_type')} on {op.get('engine')}, "
            f"compute {op.get('compute_dtype')}), execution index {op.get('index')}"]


def export_msprobe(dump, out, *, step: int = 0, rank: int = 0, tensor_format: str | None = None,
                   framework: str = "graph", overwrite: bool = False) -> str:
    """Write an ascend-emu dump in msprobe's layout; returns the ``step{N}/rank{R}`` directory.

    Parameters
    ----------
    dump : str, os.PathLike or Dump
        An ascend-emu dump directory.
    out : str or os.PathLike
        The msprobe dump root; ``out/step{step}/rank{rank}/`` is written.
    step, rank : int
        The step and rank the directory is named for (default 0, 0).
    tensor_format : {"npy", "pt"}, optional
        ``.npy`` files (no PyTorch needed), or ``.pt`` (PyTorch's format, which msprobe's PyTorch
        ``compare`` reads; needs torch). Default: ``npy`` for ``framework="graph"``, ``pt`` (the only
        one) for ``framework="pytorch"``.
    framework : {"graph", "pytorch"}
        ``graph`` (default): every op the key ``Functional.<name>.0.forward``, as for a graph replay.
        ``pytorch``: msprobe's PyTorch dump as msprobe writes it for a torch script: an op name that
        is an msprobe API key (``Aten.addmm.0.forward``, ``....backward``: a torch run's) is kept as
        its key, any other is ``Functional.<name>.0.forward`` (``.backward`` in a training step's
        backward phase); a ``.backward`` entry lists ``input`` (the gradients it reads) and ``output``
        (the gradients it gives), a forward one ``input_args``, ``input_kwargs`` and ``output``;
        ``requires_grad`` and the stack lines as the op's record gives them; ``construct.json`` empty
        (msprobe's L1); tensors as ``.pt`` in their torch dtype.
    overwrite : bool
        Replace an msprobe dump already in that directory (never anything else).

    Outputs go under ``output``, the dumped producer tensors an op reads under ``input_args``
    (``input`` for a backward entry; files hard-linked to the producer's), dtypes in torch spelling,
    statistics in msprobe's semantics (:func:`msprobe_stats`). Names are made to match
    ``^[a-zA-Z0-9_.:/-]+$`` (:func:`msprobe_names`); ``ascend_emu.json`` beside ``dump.json`` keeps
    the original names and the manifest, so :func:`import_msprobe` restores the dump exactly. A dump
    with no tensor files exports as msprobe's ``statistics`` task (no PyTorch needed then).
    """
    if framework not in FRAMEWORKS:
        raise AscendEmuError(f"unknown framework {framework!r}; choose one of: {', '.join(FRAMEWORKS)}")
    if tensor_format is None:
        tensor_format = "pt" if framework == "pytorch" else "npy"
    if tensor_format not in TENSOR_FORMATS:
        raise AscendEmuError(f"unknown tensor format {tensor_format!r}; choose one of: "
                             f"{', '.join(TENSOR_FORMATS)}")
    if framework == "pytorch" and tensor_format != "pt":
        raise AscendEmuError(f"msprobe's PyTorch dumps hold .pt tensor files, not .{tensor_format}; drop "
                             "--tensor-format (or use --framework graph for .npy files)")
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
    task = "tensor" if any(o["file"] for op in d.ops for o in op["outputs"]) else "statistics"
    if tensor_format == "pt" and task == "tensor":
        _import_torch("exporting .pt tensor files")
    out = os.fspath(out)
    root = os.path.join(out, f"step{step}", f"rank{rank}")
    lock = _prepare_rank_dir(root, out, overwrite)
    try:
        data_dir = os.path.join(root, DATA_DIR)
        if framework == "pytorch":
            keys = pytorch_keys(d.ops)
        else:
            names = msprobe_names(op["name"] for op in d.ops)
            keys = {n: dump_key(s) for n, s in names.items()}
        ext = "." + tensor_format
        data, stack = {}, {}
        files: dict[tuple, str] = {}        # (op name, output index) -> file written for that output
        leaves: dict[tuple, dict] = {}      # (op name, output index) -> its output leaf
        for op in d.ops:
            key = keys[op["name"]]
            backward = framework == "pytorch" and key.endswith(".backward")
            outs = []
            for o in op["outputs"]:
                leaf = {"type": "torch.Tensor", "dtype": torch_dtype(_spelled(o["dtype"])), "shape": list(o["shape"]),
                        **msprobe_stats(o, d, op["name"]), "requires_grad": _requires_grad(op, o["index"])}
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
                    continue  # a Placeholder or Const (a torch run's parameters and inputs): not in the dump
                leaf = {k: v for k, v in leaves[(src, idx)].items() if k != "data_name"}
                if (src, idx) in files:
                    fname = f"{key}.input.{len(ins)}{ext}"
                    _link_or_copy(os.path.join(data_dir, files[(src, idx)]), os.path.join(data_dir, fname))
                    leaf["data_name"] = fname
                ins.append(leaf)
            data[key] = {"input": ins, "output": outs} if backward else {
                "input_args": ins, "input_kwargs": {}, "output": outs}
            stack[str(len(stack))] = [[key], _stack_lines(op)]
        if task == "statistics":
            os.rmdir(data_dir)
        sidecar = {"format": SIDECAR_FORMAT, "version": 1, "task": task, "tensor_format": tensor_format,
                   "framework": framework, "manifest": {k: v for k, v in d.manifest.items()}}
        if framework == "graph":    # the names inside the Functional keys, as every export before the PyTorch layout
            sidecar["keys"] = {names[op["name"]]: op["name"] for op in d.ops}
        else:
            sidecar["dump_keys"] = {keys[op["name"]]: op["name"] for op in d.ops}
        construct = {} if framework == "pytorch" else {k: None for k in data}
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

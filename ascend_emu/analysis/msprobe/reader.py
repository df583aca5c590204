"""Reading an msprobe dump into an ascend-emu dump (:func:`import_msprobe`), with an optional name mapping."""
from __future__ import annotations

import csv
import io
import os
import re

from ...errors import AscendEmuError
from ...fileio import parse_json, read_text
from ..dump import Dump, DumpWriter, StatsOnly, load_dump
from ..dump.reader import _check_manifest
from ..schema import MAX_ELEMENTS
from .format import (SIDECAR, SIDECAR_FORMAT, dump_key, msprobe_names, _num, numpy_dtype_name,
                     _read_tensor, stats_from_msprobe)

_RANK_DIR = re.compile(r"^(rank\d*|proc\d+)$")
_STEP_DIR = re.compile(r"^step\d+$")


def _pick(base: str, pattern, want, what: str, option: str) -> str | None:
    entries = [e for e in os.listdir(base) if pattern.match(e)]
    links = sorted(e for e in entries if os.path.islink(os.path.join(base, e)))
    if links:
        # the layout's directories are read as the dump's own, never through a link (as its files)
        raise AscendEmuError(f"{base}: {links[0]} is a symbolic link, which ascend-emu never follows inside a "
                             "dump; give the directory it points to")
    subs = sorted(e for e in entries if os.path.isdir(os.path.join(base, e)))
    if want is not None:
        name = f"{what}{want}"
        if name not in subs:
            raise AscendEmuError(f"{base} has no {name} directory (it has: {', '.join(subs) or 'none'}); "
                                 f"choose another {option}")
        return name
    if len(subs) == 1:
        return subs[0]
    if subs:
        raise AscendEmuError(f"{base} holds several {what} directories ({', '.join(subs[:6])}"
                             f"{', ...' if len(subs) > 6 else ''}); choose one with {option} N")
    return None


def find_rank_dir(src, *, step: int | None = None, rank: int | None = None) -> str:
    """The ``rank`` directory (the one holding ``dump.json``) of an msprobe dump given as the
    rank directory itself, a ``step{N}`` directory or the dump root."""
    p = os.fspath(src)
    if not os.path.isdir(p):
        raise AscendEmuError(f"msprobe dump directory {p} does not exist")
    if os.path.isfile(os.path.join(p, "dump.json")):
        return p
    if any(_RANK_DIR.match(e) for e in os.listdir(p)):
        r = _pick(p, _RANK_DIR, rank, "rank", "--rank")
        p = os.path.join(p, r)
    else:
        s = _pick(p, _STEP_DIR, step, "step", "--step")
        if s is None:
            raise AscendEmuError(f"{p} is not an msprobe dump (no dump.json, no step*/rank* directories); "
                                 "give the directory msprobe's dump_path points to")
        p = os.path.join(p, s)
        r = _pick(p, _RANK_DIR, rank, "rank", "--rank")
        if r is None:
            raise AscendEmuError(f"{p} has no rank directory; give the directory msprobe's dump_path points to")
        p = os.path.join(p, r)
    if not os.path.isfile(os.path.join(p, "dump.json")):
        raise AscendEmuError(f"{p} has no dump.json (incomplete msprobe dump?); re-run the msprobe dump")
    return p


def _read_json(path: str, what: str):
    # size and nesting capped, never through a symbolic link; json.loads accepts NaN / Infinity,
    # as msprobe writes them
    return parse_json(read_text(path, what, hint="re-run the msprobe dump"), f"{what} {path}",
                      fix="re-run the msprobe dump")


def _tensor_leaves(obj) -> list[dict]:
    """The tensor leaves of an msprobe ``output`` (a list, possibly nested, or one leaf), in order."""
    if isinstance(obj, dict):
        if "dtype" in obj and "shape" in obj and str(obj.get("type", "")).endswith(("Tensor", "ndarray")):
            return [obj]
        return []
    if isinstance(obj, (list, tuple)):
        out = []
        for v in obj:
            out.extend(_tensor_leaves(v))
        return out
    return []


def read_mapping(path) -> dict:
    """``{msprobe name: ascend-emu name}`` from a mapping file.

    YAML (``.yaml``/``.yml``): a flat mapping ``msprobe name: ascend-emu name`` per line, which is
    also the form of msprobe's own ``--data_mapping`` file. CSV (``.csv``): two columns, msprobe
    name then ascend-emu name; lines starting with ``#`` and a first line ``msprobe,ascend-emu``
    are skipped. An msprobe name is a dump key (``Functional.conv2d.0.forward``: all its outputs)
    or one output (``Functional.conv2d.0.forward.output.1``); an ascend-emu name is an op
    (``model/conv/Conv2D``, outputs keep their indices) or one output (``model/conv/Conv2D:1``).
    """
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise AscendEmuError(f"mapping file {p} does not exist")
    text = read_text(p, "mapping file")
    pairs = []
    if p.lower().endswith(".csv"):
        for i, row in enumerate(csv.reader(io.StringIO(text))):
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            if i == 0 and [c.strip().lower() for c in row[:2]] == ["msprobe", "ascend-emu"]:
                continue
            if len(row) != 2:
                raise AscendEmuError(f"mapping file {p} line {i + 1}: expected two columns "
                                     f"(msprobe name, ascend-emu name), got {len(row)}")
            pairs.append((row[0].strip(), row[1].strip(), i + 1))
    elif p.lower().endswith((".yaml", ".yml")):
        for i, line in enumerate(text.splitlines()):
            s = line.strip()
            if not s or s.startswith("#") or s == "---":
                continue
            m = re.match(r"""^("[^"]*"|'[^']*'|[^:#\s][^#]*?)\s*:\s+("[^"]*"|'[^']*'|[^#]*?)\s*(#.*)?$""", s)
            if not m or not m.group(2):
                raise AscendEmuError(f"mapping file {p} line {i + 1}: expected 'msprobe name: ascend-emu name' "
                                     "(a flat YAML mapping)")
            pairs.append((m.group(1).strip("\"'"), m.group(2).strip("\"'"), i + 1))
    else:
        raise AscendEmuError(f"mapping file {p}: use a .yaml/.yml (msprobe name: ascend-emu name) or a "
                             ".csv (two columns) file")
    out = {}
    for a, b, line in pairs:
        if a in out and out[a] != b:
            raise AscendEmuError(f"mapping file {p} line {line}: {a!r} is mapped twice ({out[a]!r} and {b!r})")
        out[a] = b
    return out


def _split_target(name: str, default_index: int) -> tuple[str, int]:
    m = re.match(r"^(.*):(\d+)$", name)
    if m:
        return m.group(1), int(m.group(2))
    return name, default_index


def _api_type(key: str) -> str:
    """``Functional.conv2d.0.forward`` -> ``conv2d``; our own export's keys -> the last scope part."""
    parts = key.split(".")
    if len(parts) >= 4 and parts[-1] in ("forward", "backward") and parts[-2].isdigit():
        parts = parts[1:-2]
    elif len(parts) >= 2:
        parts = parts[1:]
    return parts[-1] if parts else key


def import_msprobe(src, out, *, mapping=None, against=None, kind: str = "npu", step: int | None = None,
                   rank: int | None = None, allow_unmatched: bool = False, overwrite: bool = False) -> Dump:
    """Read an msprobe dump into an ascend-emu dump; returns the loaded dump.

    Parameters
    ----------
    src : str or os.PathLike
        The msprobe dump: its root, a ``step{N}`` directory or a rank directory. With several
        steps or ranks, ``step`` / ``rank`` choose one.
    out : str or os.PathLike
        The ascend-emu dump directory to write.
    mapping : str, os.PathLike or dict, optional
        msprobe name -> ascend-emu name (see :func:`read_mapping` for the file forms).
    against : str, os.PathLike or Dump, optional
        The ascend-emu dump this one will be compared with (an emulator replay or a reference).
        msprobe names are matched to its op names (through ``mapping``, or as the names
        :func:`export_msprobe` gives them); matched ops take its op types and input lists, so the
        first divergent op can be found. Unmatched names are an error listing them, unless
        ``allow_unmatched``.
    kind : {"npu", "bench"}
        The kind of dump written (``npu`` for a hardware dump, the default); a restored export keeps
        the kind it had.

    A dump written by :func:`export_msprobe` (with its ``ascend_emu.json``) is restored exactly:
    names, op metadata and statistics. Other dumps: every key's tensor outputs become the outputs
    of one op named by the mapping, else by the key itself; at the ``tensor`` task the tensors are
    read (``.npy``; ``.pt`` needs PyTorch), at the ``statistics`` task msprobe's statistics are kept
    (:func:`stats_from_msprobe`). Non-tensor outputs (ints, sizes) are skipped.
    """
    rdir = find_rank_dir(src, step=step, rank=rank)
    dj = _read_json(os.path.join(rdir, "dump.json"), "msprobe dump.json")
    if not isinstance(dj, dict) or not isinstance(dj.get("data"), dict):
        raise AscendEmuError(f"{rdir}/dump.json has no 'data' object; it is not an msprobe dump")
    task = dj.get("task")
    if task not in ("tensor", "statistics"):
        raise AscendEmuError(f"{rdir}/dump.json is an msprobe {task!r} dump; ascend-emu reads the 'tensor' and "
                             "'statistics' tasks (md5 dumps hold no values); re-dump with one of those")
    side_path = os.path.join(rdir, SIDECAR)
    if os.path.isfile(side_path) and mapping is None:
        side = _read_json(side_path, "ascend-emu export record")
        if isinstance(side, dict) and side.get("format") == SIDECAR_FORMAT:
            return _restore(rdir, dj, side, out, overwrite, against, allow_unmatched)
    maps = read_mapping(mapping) if isinstance(mapping, (str, os.PathLike)) else dict(mapping or {})
    ref = load_dump(against) if against is not None else None
    # our export's names of the reference's ops, to match dumps we exported without the record
    ref_keys = {}
    if ref is not None:
        ref_keys = {dump_key(s): n for n, s in msprobe_names(op["name"] for op in ref.ops).items()}

    tensor_names = set()
    entries = []   # (key, leaf index, leaf)
    for key, ent in dj["data"].items():
        if not isinstance(ent, dict):
            raise AscendEmuError(f"{rdir}/dump.json: entry {key!r} is not an object; the dump is corrupt")
        for i, leaf in enumerate(_tensor_leaves(ent.get("output", []))):
            entries.append((key, i, leaf))
            tensor_names.add(f"{key}.output.{i}")
    if not entries:
        # a dump of no tensor would import as a dump every reader refuses ("holds no ops"): refused here
        raise AscendEmuError(f"{rdir}/dump.json holds no tensor output ({len(dj['data'])} entries in 'data'); "
                             "there is nothing to import: re-dump with msprobe's tensor or statistics task")
    for key, i, leaf in entries:     # every leaf's shape before anything is written
        _leaf_shape(leaf, rdir, key, i)
    unknown = sorted(k for k in maps if k not in dj["data"] and k not in tensor_names)
    if unknown:
        raise AscendEmuError(f"mapping names {len(unknown)} msprobe name(s) not in {rdir}/dump.json: "
                             f"{', '.join(unknown[:8])}{', ...' if len(unknown) > 8 else ''}; check the mapping file")

    ops: dict[str, dict] = {}      # our op name -> {"outputs": {index: (key, i, leaf)}, "key": first key}
    names_used = {}
    for key, i, leaf in entries:
        tname = f"{key}.output.{i}"
        if tname in maps:
            target, idx = _split_target(maps[tname], 0)
        elif key in maps:
            target, idx = _split_target(maps[key], i)
            if ":" in maps[key] and i:
                raise AscendEmuError(f"mapping sends all outputs of {key} to the one output {maps[key]!r}; map "
                                     f"{key}.output.N to ops separately")
        elif key in ref_keys:
            target, idx = ref_keys[key], i
        else:
            target, idx = key, i
        slot = ops.setdefault(target, {"outputs": {}, "key": key})
        if idx in slot["outputs"]:
            other = slot["outputs"][idx]
            raise AscendEmuError(f"{tname} and {other[0]}.output.{other[1]} both map to {target}:{idx}; "
                                 "fix the mapping file")
        slot["outputs"][idx] = (key, i, leaf)
        names_used[f"{target}:{idx}"] = tname
    for target, slot in ops.items():
        idxs = sorted(slot["outputs"])
        if idxs != list(range(len(idxs))):
            raise AscendEmuError(f"op {target!r} gets outputs {idxs} from the mapping; its outputs must be "
                                 "numbered 0, 1, ... without gaps")
    if ref is not None:
        unmatched = [t for t in ops if t not in ref]
        if unmatched and not allow_unmatched:
            missing = [op["name"] for op in ref.ops if op["name"] not in ops]
            raise AscendEmuError(
                f"{len(unmatched)} of {len(ops)} msprobe op(s) have no counterpart in {ref.path}: "
                f"{', '.join(unmatched[:8])}{', ...' if len(unmatched) > 8 else ''} (ops of {ref.path} not "
                f"matched: {len(missing)}{': ' + ', '.join(missing[:5]) if missing else ''}"
                f"{', ...' if len(missing) > 5 else ''}); map them with --mapping FILE (msprobe name: "
                "ascend-emu name), or pass --allow-unmatched")

    config = {"source": "msprobe", "task": task, "level": dj.get("level"), "framework": dj.get("framework")}
    model = dict(ref.model) if ref is not None else {"name": os.path.basename(os.path.abspath(os.fspath(src))),
                                                      "fingerprint": None}
    summary = {"msprobe": {"dump": os.path.abspath(rdir), "task": task, "names": names_used}}
    if ref is not None and ref.summary.get("outputs"):
        summary["outputs"] = [o for o in ref.summary["outputs"] if str(o).rsplit(":", 1)[0] in ops]
    with DumpWriter(out, kind=kind, config=config, model=model, inputs_sha256="", overwrite=overwrite) as w:
        for target, slot in ops.items():
            outs = []
            for idx in sorted(slot["outputs"]):
                key, i, leaf = slot["outputs"][idx]
                outs.append(_leaf_value(leaf, task, rdir, key, i))
            rop = ref.op(target) if ref is not None and target in ref else None
            first = outs[0]
            first_dtype = first.dtype if isinstance(first, StatsOnly) else first.dtype.name
            w.add_op(target, rop["tf_type"] if rop else _api_type(slot["key"]),
                     rop["ascend_type"] if rop else _api_type(slot["key"]), "msprobe",
                     first_dtype, rop["inputs"] if rop else [], outs)
        w.finish(summary)
    return load_dump(out)


def _leaf_shape(leaf: dict, rdir: str, key: str, i: int) -> list:
    """An output leaf's shape, refused in one line when no dump could hold it (the dump schema's bound:
    a statistics leaf is written by its shape alone, and a dump that every reader refuses is no import)."""
    shape = leaf.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in shape):
        raise AscendEmuError(f"{rdir}/dump.json: {key}.output.{i} has a malformed shape {str(shape)[:80]!r}")
    n = 1
    for d in shape:
        n *= d
    if n > MAX_ELEMENTS:
        raise AscendEmuError(f"{rdir}/dump.json: {key}.output.{i} has the shape {str(shape)[:80]}, {n} elements, "
                             f"more than any tensor holds (at most {MAX_ELEMENTS}); the dump is corrupt")
    return shape


def _leaf_value(leaf: dict, task: str, rdir: str, key: str, i: int):
    """An output leaf as an array (tensor task, file present) or its statistics."""
    try:
        dname = numpy_dtype_name(leaf.get("dtype"))
    except AscendEmuError as e:
        raise AscendEmuError(f"{key}.output.{i}: {e}") from None
    shape = _leaf_shape(leaf, rdir, key, i)
    fname = leaf.get("data_name")
    if task == "tensor" and "data_name" in leaf and (not isinstance(fname, str) or fname == ""):
        # (msprobe writes a file name, or "-1" for a tensor it did not save: anything else is no tensor file)
        raise AscendEmuError(f"{rdir}/dump.json: {key}.output.{i} has data_name {str(fname)[:80]!r}, not a file "
                             "name (nor msprobe's \"-1\" for no file); the dump is corrupt: dump it again")
    if task == "tensor" and isinstance(fname, str) and fname != "-1":
        return _read_tensor(rdir, fname, dname, shape)
    return stats_from_msprobe(leaf)


def _restore(rdir, dj, side, out, overwrite, against, allow_unmatched) -> Dump:
    """Rebuild a dump :func:`export_msprobe` wrote, from its record and the tensor files.

    The record's manifest is validated against the dump schema, as every manifest is read, and its
    ``keys`` must map names to names, so an altered record is a one-line error."""
    m = side.get("manifest")
    _check_manifest(rdir, m, label=SIDECAR, fix="re-export it")
    # "dump_keys" (whole keys, any framework) since the PyTorch layout; "keys" (names inside Functional keys) before
    field = "dump_keys" if "dump_keys" in side else "keys"
    keys = side.get(field)
    if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in keys.items()):
        raise AscendEmuError(f"{rdir}/{SIDECAR}: {field!r} is not an object of names; the export was altered, "
                             "re-export it")
    key_of = {v: k for k, v in keys.items()} if field == "dump_keys" else {v: dump_key(k) for k, v in keys.items()}
    ops = m.get("ops") or []
    data = dj["data"]
    if not ops:
        raise AscendEmuError(f"{rdir}/{SIDECAR} lists no op; there is nothing to import: re-export it")
    missing = [op["name"] for op in ops if key_of.get(op["name"]) not in data]
    if missing:
        raise AscendEmuError(f"{rdir}: dump.json lacks {len(missing)} op(s) its ascend_emu.json lists "
                             f"({', '.join(missing[:5])}); the export was altered, re-export it")
    if against is not None:
        ref = load_dump(against)
        unmatched = [op["name"] for op in ops if op["name"] not in ref]
        if unmatched and not allow_unmatched:
            raise AscendEmuError(f"{len(unmatched)} op(s) have no counterpart in {ref.path}: "
                                 f"{', '.join(unmatched[:8])}{', ...' if len(unmatched) > 8 else ''}; pass "
                                 "--allow-unmatched to import anyway")
    summary = dict(m.get("summary") or {})
    with DumpWriter(out, kind=m.get("kind", "npu"), config=m.get("config") or {}, model=m.get("model") or {},
                    inputs_sha256=m.get("inputs_sha256", ""), overwrite=overwrite) as w:
        for f in m.get("fused_away", []):
            w.add_fused(f["name"], f["tf_type"], f["rule"], f["into"])
        for op in ops:
            key = key_of[op["name"]]
            leaves = _tensor_leaves(data[key].get("output", []) if isinstance(data[key], dict) else [])
            if len(leaves) != len(op["outputs"]):
                raise AscendEmuError(f"{rdir}: {key} has {len(leaves)} outputs in dump.json, "
                                     f"{len(op['outputs'])} in ascend_emu.json; re-export it")
            outs = []
            for o, leaf in zip(op["outputs"], leaves):
                if o.get("file") is not None and not (isinstance(leaf.get("data_name"), str) and leaf["data_name"]):
                    raise AscendEmuError(f"{rdir}: {key} has a tensor file in ascend_emu.json and data_name "
                                         f"{str(leaf.get('data_name'))[:80]!r} in dump.json; the export was altered, "
                                         "re-export it")
                if o.get("file") is not None:
                    outs.append(_read_tensor(rdir, leaf["data_name"], o["dtype"], o["shape"]))
                else:
                    outs.append(StatsOnly(dtype=o["dtype"], shape=tuple(o["shape"]), max=_num(o.get("max")),
                                          min=_num(o.get("min")), mean=_num(o.get("mean")),
                                          l2norm=_num(o.get("l2norm")), nan=int(o.get("nan", 0)),
                                          inf=int(o.get("inf", 0))))
            status = [int(o.get("status", 0)) for o in op["outputs"]] or op.get("status", 0)
            w.add_op(op["name"], op.get("tf_type"), op.get("ascend_type"), op.get("engine"), op.get("compute_dtype"),
                     op.get("inputs", []), outs, status,
                     attrs=op.get("attrs"), precision=op.get("precision"), fusion=op.get("fusion"),
                     fp32_check=op.get("fp32_check"), phase=op.get("phase"))
        w.finish(summary)
    return load_dump(out)

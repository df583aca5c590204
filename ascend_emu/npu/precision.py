"""Precision modes and mixed-precision lists: which dtype CANN runs each op in.

The semantics follow ASCEND-FACTS.md section 1 (ATC ``--precision_mode`` docs and
hicann/ge); NUMERICS.md section 5 states each rule and the assumptions.
"""
from __future__ import annotations

import difflib
import os
import warnings
from dataclasses import dataclass

from ..errors import AscendEmuError
from ..fileio import read_json
from ..ops.ascend_types import ascend_type  # noqa: F401  (re-exported: the precision API speaks it)
from ..ops.ascend_types import data_file as _data
from ..ops.ascend_types import optype_map as _optype_map

#: the TF adapter's training default precision mode per SoC (ASCEND-FACTS section 10)
TRAIN_PRECISION_DEFAULT = {"Ascend910": "allow_fp32_to_fp16", "Ascend910B": "must_keep_origin_dtype"}
PRECISION_MODES = ("force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_fp32_to_fp16",
                   "must_keep_origin_dtype", "allow_mix_precision", "allow_mix_precision_fp16",
                   "allow_mix_precision_bf16", "allow_fp32_to_bf16")
_ALIASES = {"force_fp32": "cube_fp16in_fp32out", "allow_mix_precision": "allow_mix_precision_fp16"}


def canonical_mode(mode: str) -> str:
    if mode not in PRECISION_MODES:
        close = difflib.get_close_matches(str(mode), PRECISION_MODES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise AscendEmuError(f"unknown precision_mode {mode!r}{hint}; choose one of: {', '.join(PRECISION_MODES)}")
    return _ALIASES.get(mode, mode)


def _known_names(lists) -> set:
    names = set(_optype_map()) | set(_optype_map().values())
    for v in lists.values():
        names |= v
    from ..ops import OPS

    return names | set(OPS)


@dataclass
class MixLists:
    """White/black/gray lists by Ascend op type. Absent types count as gray."""

    white: set
    black: set
    gray: set
    source: str = ""

    @classmethod
    def default(cls) -> "MixLists":
        d = _data("mixlist_default.json")
        return cls(set(d["white"]), set(d["black"]), set(d["gray"]), d["source"])

    def classify(self, ascend_op: str) -> str:
        if ascend_op in self.white:
            return "white"
        if ascend_op in self.black:
            return "black"
        return "gray"

    def modify(self, spec) -> "MixLists":
        """Apply a CANN ``modify_mixlist`` (path to JSON, or dict); returns a new MixLists."""
        label = "modify_mixlist"
        if isinstance(spec, (str, os.PathLike)):
            label = str(spec)
            spec = read_json(spec, "modify_mixlist file",
                             hint='pass a JSON file like {"black-list": {"to-add": ["MatMulV2"]}}')
        if not isinstance(spec, dict):
            raise AscendEmuError(f"{label}: expected a JSON object with black-list/white-list/gray-list keys")
        lists = {"white": set(self.white), "black": set(self.black), "gray": set(self.gray)}
        known = _known_names(lists)
        for key, entry in spec.items():
            if key not in ("black-list", "white-list", "gray-list"):
                raise AscendEmuError(f"{label}: unknown key {key!r}; use black-list, white-list or gray-list")
            if not isinstance(entry, dict) or set(entry) - {"to-add", "to-remove"}:
                raise AscendEmuError(f"{label}: {key} must be an object with 'to-add' and/or 'to-remove' lists")
            which = key.split("-")[0]
            for action, names in entry.items():
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise AscendEmuError(f"{label}: {key}.{action} must be a list of op type names")
                for name in names:
                    if name not in known:
                        close = difflib.get_close_matches(name, sorted(known), n=3)
                        warnings.warn(f"{label}: op type {name!r} is not known"
                                      + (f"; closest: {', '.join(close)}" if close else ""), stacklevel=2)
                    op = ascend_type(name)
                    if action == "to-add":
                        for other in lists.values():
                            other.discard(op)
                        lists[which].add(op)
                    else:
                        # "to-remove" from white or black moves the op to gray (ASCEND-FACTS section 1)
                        lists[which].discard(op)
                        if which != "gray":
                            lists["gray"].add(op)
        return MixLists(lists["white"], lists["black"], lists["gray"], self.source + f"; modified by {label}")

    def to_dict(self) -> dict:
        return {"white": sorted(self.white), "black": sorted(self.black), "gray": sorted(self.gray)}


@dataclass
class Decision:
    dtype: str            # compute dtype of the op's float tensors
    cube_out: str | None  # output dtype of a cube op
    list: str | None      # white / black / gray, under the mixed modes
    reason: str

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "cube_out": self.cube_out, "list": self.list, "reason": self.reason}


class PrecisionPolicy:
    """Decides each op's compute dtype under a precision mode and mix lists."""

    def __init__(self, precision_mode: str = "force_fp16", modify_mixlist=None):
        self.mode = canonical_mode(precision_mode)
        self.requested_mode = precision_mode
        self.lists = MixLists.default()
        if modify_mixlist is not None:
            self.lists = self.lists.modify(modify_mixlist)
        self.reduced = "bfloat16" if self.mode in ("allow_mix_precision_bf16", "allow_fp32_to_bf16") else "float16"

    def decide(self, kind: str, ascend_op: str, orig: str, producer_dtypes: list[str]) -> Decision:
        """Compute dtype for an op of ``kind`` (cube/vector/move) with original dtype ``orig``.

        ``producer_dtypes`` are the dtypes produced by the computing ops feeding it
        (constants and graph inputs excluded).
        """
        cube = kind == "cube"
        red = self.reduced
        m = self.mode
        if m == "must_keep_origin_dtype":
            return Decision(orig, orig if cube else None, None, "must_keep_origin_dtype keeps the original dtype")
        if m == "force_fp16":
            return Decision(red, red if cube else None, None, "force_fp16 runs every op with an fp16 kernel in fp16")
        if m == "cube_fp16in_fp32out":
            if cube:
                return Decision(red, "float32", None, "force_fp32/cube_fp16in_fp32out: cube takes fp16 in, gives fp32 out")
            return Decision("float32", None, None, "force_fp32: vector ops run in fp32")
        if m in ("allow_fp32_to_fp16", "allow_fp32_to_bf16"):
            if cube:
                return Decision(red, red, None, f"{m}: matrix ops drop fp32 to {red}")
            return Decision(orig, None, None, f"{m}: vector ops keep their original dtype")
        # allow_mix_precision_fp16 / _bf16
        lst = self.lists.classify(ascend_op)
        if lst == "white":
            return Decision(red, red if cube else None, "white", f"white list: runs in {red}")
        if lst == "black":
            return Decision(orig, orig if cube else None, "black", "black list: keeps the original dtype")
        if any(d == red for d in producer_dtypes):
            return Decision(red, red if cube else None, "gray", f"gray list: an input comes from a {red} producer")
        if producer_dtypes:
            return Decision(orig, orig if cube else None, "gray", "gray list: its producers run in the original dtype")
        if cube:
            return Decision(red, red, "gray", f"gray list, no producer: matrix op follows allow_fp32_to_{'bf16' if red == 'bfloat16' else 'fp16'}")
        return Decision(orig, None, "gray", "gray list, no producer: vector op keeps the original dtype")

    def to_dict(self) -> dict:
        return {"precision_mode": self.requested_mode, "canonical_mode": self.mode, "reduced_dtype": self.reduced,
                "mixlist_source": self.lists.source}

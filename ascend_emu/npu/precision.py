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
from ..fileio import read_json, read_text
from ..numerics.policy import SOC_ALIASES as _SOC_ALIASES
from ..numerics.policy import SOCS as _SOCS
from ..numerics.policy import soc as _soc
from ..ops.ascend_types import ascend_type  # noqa: F401  (re-exported: the precision API speaks it)
from ..ops.ascend_types import data_file as _data
from ..ops.ascend_types import optype_map as _optype_map

PRECISION_MODES = ("force_fp16", "force_fp32", "cube_fp16in_fp32out", "allow_fp32_to_fp16",
                   "must_keep_origin_dtype", "allow_mix_precision", "allow_mix_precision_fp16",
                   "allow_mix_precision_bf16", "allow_fp32_to_bf16")
_ALIASES = {"force_fp32": "cube_fp16in_fp32out", "allow_mix_precision": "allow_mix_precision_fp16"}
#: the Ascend950's HiFloat8 modes: GE's ENUM_CUBE_HIF8 / ENUM_MIXED_HIF8, reachable through precision_mode_v2 only
HIF8_MODES = ("cube_hif8", "mixed_hif8")
#: CANN's precision_mode_v2 values and the mode each is (ASCEND-FACTS section 12; hicann/ge fe_context_utils.cc)
PRECISION_MODES_V2 = {"fp16": "force_fp16", "origin": "must_keep_origin_dtype",
                      "cube_fp16in_fp32out": "cube_fp16in_fp32out", "mixed_float16": "allow_mix_precision",
                      "mixed_bfloat16": "allow_mix_precision_bf16", "mixed_hif8": "mixed_hif8",
                      "cube_hif8": "cube_hif8"}
#: where a HiFloat8 cube op's output goes (hif8_cube_out): "16bit" = float16 (bfloat16 for a bfloat16 op), the
#: type after hifloat8 in GE's preference list; "float32" (NUMERICS.md section 13, an assumption)
HIF8_CUBE_OUTS = ("16bit", "float32")

#: the TF adapter's (and ATC's) inference default on every SoC
INFERENCE_PRECISION_DEFAULT = "force_fp16"
#: the TF adapter's training default per SoC (ASCEND-FACTS sections 10 and 12): origin
#: (must_keep_origin_dtype) where the cube has float32, else allow_fp32_to_fp16; a view of the SoC table
TRAIN_PRECISION_DEFAULT = {name: chip.train_precision_default for name, chip in _SOCS.items()}
TRAIN_PRECISION_DEFAULT.update({alias: TRAIN_PRECISION_DEFAULT[name] for alias, name in _SOC_ALIASES.items()})
#: the cube op types of each allow_hf32 family (TF types; fused ops by their ``base``)
HF32_FAMILY = {**dict.fromkeys(("Conv2D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv2DBackpropFilter",
                                "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
                                "Conv3D", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
                                "Conv2DTranspose"), "conv"),
               **dict.fromkeys(("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"), "matmul")}


def resolve_mode(precision_mode=None, precision_mode_v2=None, soc="Ascend910", training: bool = False):
    """(precision_mode, the option that set it, the v2 value or None) from CANN's two exclusive options; neither:
    the TF adapter's default (inference ``force_fp16``; training the SoC's). Refuses what the SoC cannot run,
    as GE does: a bf16 mode without bf16 on the vector unit, a HiFloat8 mode."""
    chip = _soc(soc)
    if precision_mode is not None and precision_mode_v2 is not None:
        raise AscendEmuError(f"precision_mode {precision_mode!r} and precision_mode_v2 {precision_mode_v2!r} are "
                             "both given; CANN takes one of them: drop one")
    if precision_mode_v2 is not None:
        if precision_mode_v2 not in PRECISION_MODES_V2:
            close = difflib.get_close_matches(str(precision_mode_v2), PRECISION_MODES_V2, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise AscendEmuError(f"unknown precision_mode_v2 {precision_mode_v2!r}{hint}; choose one of: "
                                 f"{', '.join(PRECISION_MODES_V2)}")
        mode = PRECISION_MODES_V2[precision_mode_v2]
        if mode in HIF8_MODES and "hifloat8" not in chip.cube_dtypes:
            with_hif8 = ", ".join(n for n, c in _SOCS.items() if "hifloat8" in c.cube_dtypes)
            raise AscendEmuError(f"precision_mode_v2 {precision_mode_v2} cannot run on {chip.name}: its cube has no "
                                 f"HiFloat8 (GE refuses the mode); choose fp16, origin, cube_fp16in_fp32out, "
                                 f"mixed_float16 or mixed_bfloat16, or --soc {with_hif8}")
        option = "precision_mode_v2"
    elif precision_mode is not None:
        if precision_mode in HIF8_MODES:
            raise AscendEmuError(f"{precision_mode} is a precision_mode_v2 value, not a precision_mode one; pass "
                                 f"--precision-mode-v2 {precision_mode} (precision_mode_v2={precision_mode!r})")
        mode, option = precision_mode, "precision_mode"
    else:
        mode = chip.train_precision_default if training else INFERENCE_PRECISION_DEFAULT
        option = "default"
    canon = canonical_mode(mode)
    if canon in ("allow_mix_precision_bf16", "allow_fp32_to_bf16") and not chip.supports_bf16:
        given = f"precision_mode_v2 {precision_mode_v2}" if option == "precision_mode_v2" else f"precision_mode {mode}"
        raise AscendEmuError(f"{given} needs bf16 on the vector unit, which {chip.name} lacks (no float32 -> bf16 "
                             "conversion: GE refuses the mode); choose an fp16 mode or a SoC with bf16 ("
                             f"{', '.join(n for n, c in _SOCS.items() if c.supports_bf16)})")
    return mode, option, precision_mode_v2


def canonical_mode(mode: str) -> str:
    if mode in HIF8_MODES:
        return mode
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


#: largest --keep-dtype file read (a list of every node of a very large model is a few MB)
KEEP_DTYPE_BYTES = 16 << 20


def load_keep_dtype(spec) -> tuple[frozenset, frozenset]:
    """ATC's ``--keep_dtype`` file: one node name a line, or ``OpType::<type>`` for every op of a type; blank
    lines and ``#`` comments skipped. ``spec`` is a path, an iterable of such lines, or None."""
    if spec is None:
        return frozenset(), frozenset()
    if isinstance(spec, (str, os.PathLike)):
        # a regular file of at most KEEP_DTYPE_BYTES, never read through a link (/dev/zero, a FIFO: refused)
        lines = read_text(spec, "the --keep-dtype file", max_bytes=KEEP_DTYPE_BYTES,
                          hint="give ATC's --keep_dtype file (one node name a line)").splitlines()
    else:
        lines = list(spec)
    names, types = set(), set()
    for line in lines:
        line = str(line).strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("OpType::"):
            types.add(line[len("OpType::"):].strip())
        else:
            names.add(line)
    return frozenset(names), frozenset(types)


#: customize_dtypes spellings of float32; an entry whose float dtypes are all float32 keeps a float32 op float32
_FP32_NAMES = ("float32", "float", "fp32", "dt_float")
_FLOAT_NAMES = _FP32_NAMES + ("float16", "fp16", "half", "dt_float16", "bfloat16", "bf16", "dt_bf16")


def load_customize_dtypes(path) -> tuple[list, list]:
    """CANN's ``customize_dtypes`` file (the TF adapter's session option, ATC's ``--customize_dtypes``): lines
    ``OpName::InputDtype:..,OutputDtype:..`` or ``OpType::TypeName:InputDtype:..,OutputDtype:..`` (ASCEND-FACTS
    section 14.2). Returns (keep_dtype lines, other lines): an entry whose float dtypes are all float32 is ATC's
    keep_dtype of that op or type (a float32 op kept float32); an entry asking for float16 or bfloat16 has no
    equivalent here and is returned apart, to be said."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise AscendEmuError(f"cannot read the customize_dtypes file {str(path)!r}: {e}") from None
    keep, other = [], []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        head, sep, rest = line.partition("::")
        if not sep or "InputDtype:" not in rest and "OutputDtype:" not in rest:
            raise AscendEmuError(f"customize_dtypes {str(path)!r}: {line!r} is not OpName::InputDtype:..,"
                                 "OutputDtype:.. nor OpType::TypeName:InputDtype:..,OutputDtype:..")
        if head == "OpType":
            target, _, rest = rest.partition(":")
            target = f"OpType::{target.strip()}"
        else:
            target = head.strip()
        listed = rest.replace("InputDtype:", ",").replace("OutputDtype:", ",").split(",")
        floats = [d.strip().lower() for d in listed if d.strip().lower() in _FLOAT_NAMES]
        if floats and all(d in _FP32_NAMES for d in floats):
            keep.append(target)
        else:
            other.append(line)
    return keep, other


class PrecisionPolicy:
    """Decides each op's compute dtype under a precision mode and mix lists."""

    def __init__(self, precision_mode: str = "force_fp16", modify_mixlist=None, *, option: str = "precision_mode",
                 precision_mode_v2: str | None = None, hif8_cube_out: str = "16bit",
                 keep_dtype=None):
        self.mode = canonical_mode(precision_mode)
        self.requested_mode = precision_mode
        #: which option set the mode (precision_mode, precision_mode_v2 or default) and the v2 value
        self.option = option
        self.mode_v2 = precision_mode_v2
        self.lists = MixLists.default()
        if modify_mixlist is not None:
            self.lists = self.lists.modify(modify_mixlist)
        self.reduced = "bfloat16" if self.mode in ("allow_mix_precision_bf16", "allow_fp32_to_bf16") else "float16"
        if hif8_cube_out not in HIF8_CUBE_OUTS:
            raise AscendEmuError(f"unknown hif8_cube_out {hif8_cube_out!r}; choose one of: {', '.join(HIF8_CUBE_OUTS)}")
        self.hif8_cube_out = hif8_cube_out
        #: ATC's --keep_dtype: node names (and ``OpType::<type>`` op types) kept in their original dtype
        self.keep_names, self.keep_types = load_keep_dtype(keep_dtype)

    def _hif8(self, orig: str, lst, why: str) -> Decision:
        """A cube op with HiFloat8 operands; its output in hif8_cube_out (16bit: bf16 for a bf16 op, else fp16)."""
        out = ("bfloat16" if orig == "bfloat16" else "float16") if self.hif8_cube_out == "16bit" else "float32"
        return Decision("hifloat8", out, lst, f"{why}: HiFloat8 operands, {out} out")

    def _decide_hif8(self, cube: bool, ascend_op: str, orig: str, producer_dtypes) -> Decision:
        """cube_hif8 / mixed_hif8, after GE's dtype tables (hicann/ge op_dtype_selection_strategy_table_select_map.h):
        white [hif8, 16-bit, fp32], black keeps the original dtype, gray follows its producers (none: as black).
        Only cube ops take HiFloat8 (the vector unit's ops have no HiFloat8 kernels: assumed), so a white vector op
        gets the 16-bit type next in the table."""
        half = "bfloat16" if orig == "bfloat16" else "float16"
        if self.mode == "cube_hif8":
            if cube:
                return self._hif8(orig, None, "cube_hif8: a cube op")
            return Decision(orig, None, None, "cube_hif8: a vector op keeps its original dtype")
        lst = self.lists.classify(ascend_op)
        if lst == "white":
            if cube:
                return self._hif8(orig, "white", "white list")
            return Decision(half, None, "white", f"white list, no HiFloat8 vector kernel: runs in {half}")
        if lst == "black" or not producer_dtypes:
            why = "black list" if lst == "black" else "gray list, no producer"
            return Decision(orig, orig if cube else None, lst, f"{why}: keeps the original dtype")
        low = [d for d in producer_dtypes if d in ("float16", "bfloat16")]
        if low:
            return Decision(low[0], low[0] if cube else None, "gray", f"gray list: an input comes from a {low[0]} producer")
        return Decision(orig, orig if cube else None, "gray", "gray list: its producers run in the original dtype")

    def keeps(self, name: str, ascend_op: str, fusion: dict | None = None, owner: str | None = None) -> bool:
        """Whether ATC's --keep_dtype list names op ``name`` (or an op a fusion folded into it), the ONNX node
        ``owner`` it is part of (an ONNX Conv became transposes, a Conv2D and a BiasAdd), or its type."""
        if name in self.keep_names or ascend_op in self.keep_types or (owner and owner in self.keep_names):
            return True
        return bool(fusion) and any(r in self.keep_names for r in (*fusion.get("replaces", ()),
                                                                      *fusion.get("owners", ())))

    def keep_decision(self, kind: str, orig: str) -> Decision:
        return Decision(orig, orig if kind == "cube" else None, None,
                        "keep_dtype: ATC's --keep_dtype file keeps the op in its original dtype")

    def decide(self, kind: str, ascend_op: str, orig: str, producer_dtypes: list[str]) -> Decision:
        """Compute dtype for an op of ``kind`` (cube/vector/move) with original dtype ``orig``.

        ``producer_dtypes`` are the dtypes produced by the computing ops feeding it
        (constants and graph inputs excluded).
        """
        cube = kind == "cube"
        red = self.reduced
        m = self.mode
        if m in HIF8_MODES:
            return self._decide_hif8(cube, ascend_op, orig, producer_dtypes)
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
                "precision_mode_v2": self.mode_v2, "precision_mode_option": self.option,
                **({"hif8_cube_out": self.hif8_cube_out} if self.mode in HIF8_MODES else {}),
                "mixlist_source": self.lists.source,
                **({"keep_dtype": sorted(self.keep_names) + [f"OpType::{t}" for t in sorted(self.keep_types)]}
                   if self.keep_names or self.keep_types else {})}

"""Overflow analysis of one dump: which ops set status bits, the first one, and why.

Like precision_tool's overflow panel (op type and name, decoded AI Core status,
each input's and output's shape, dtype, max, min, mean) and msprobe's
overflow_check verdict (rerun the op in float32: if it overflows there too, the
overflow belongs to the model, "normal"; if not, to the reduced precision,
"abnormal"). The float32 rerun is done by the replay and recorded in the op's
``fp32_check`` field; this module only reads dumps and never imports TensorFlow.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ..errors import printable
from .dump import Dump, json_safe, load_dump
from ..data import ascend_type
from ..graph.core import split_tensor_name
from ..numerics.policy import FORMAT_MAX
from ..numerics.status import decode_status

#: largest finite value of each float format (the saturation value of SATURATION mode)
_ENGINE = {"AICORE": "AI Core", "AICPU": "AI CPU", "DSA": "DSA", "HOST": "Host"}
_SCAN_CHUNK = 1 << 20


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _finite_stats(out: dict) -> bool:
    return not int(out.get("nan", 0)) and not int(out.get("inf", 0))


def _overflowing(op: dict) -> bool:
    """Status bits set, or a non-finite value in an output (ops on the AI CPU set no status bits)."""
    if int(op.get("status", 0)):
        return True
    return any(not _finite_stats(o) for o in op.get("outputs", []))


def _fill_constant(op: dict) -> bool:
    """A Const without status bits whose every output is one value, +-inf."""
    outs = op.get("outputs", [])
    return (op.get("tf_type") == "Const" and not op.get("inputs") and not int(op.get("status", 0)) and bool(outs)
            and all(math.prod(o.get("shape") or []) == 1 and int(o.get("inf", 0)) == 1 and not int(o.get("nan", 0))
                    for o in outs))


def _largest(out: dict) -> float | None:
    if int(out.get("inf", 0)):
        return math.inf
    vals = [abs(v) for v in (out.get("max"), out.get("min")) if v is not None]
    return max(vals) if vals else None


class OverflowReport:
    """Result of :func:`overflow_report`.

    Attributes
    ----------
    ops : list of dict
        Every op with non-zero status bits, in execution order, with decoded bits and the
        shape, dtype, max, min, mean of each input and output.
    first : dict or None
        The first overflowing op whose inputs are finite and come from ops that did not
        overflow: where the overflow starts. Also carries ``verdict``.
    register : int
        The sticky float status register at the end of the run (what NPUGetFloatStatus
        reads): ``summary["float_status"]`` if the dump records it, else the OR of every op.
    notes : list of str
        Saturation versus inf/nan: how many dumped output values sit at the format's
        maximum (SATURATION mode) and how many are inf or nan (INF_NAN mode).
    """

    def __init__(self, dump: Dump):
        self.dump = dump
        # a torch_npu eager run (torch-run, ae.torch.emulate): its precision is torch.autocast's, and torch_npu's
        # eager mode reads no modify_mixlist (a GE graph option, ASCEND-FACTS.md): no ops_info to suggest
        self.eager_torch = isinstance(dump.config, dict) and "torch_npu_options" in dump.config
        self._producers = {op["name"]: op for op in dump.ops}
        self.ops = [self._entry(op) for op in dump.ops if int(op.get("status", 0))]
        self.first = None
        for op in dump.ops:
            if not _overflowing(op):
                continue
            if _fill_constant(op):
                # a scalar constant of +-inf is a fill value (the -inf MaxPool padding the ONNX loader makes, a
                # mask's -inf): it computes nothing and is no overflow, and what reads it is not "finite inputs".
                # (A weight holding an inf, a graph input holding a NaN stay named: they say where it came from.)
                continue
            if all(self._input_clean(ref) for ref in op.get("inputs", [])):
                self.first = self._entry(op)
                self.first["blame"] = self._blame(op)
                self.first["verdict"] = self._verdict(op, self.first["blame"])
                break
        reg = dump.summary.get("float_status") if isinstance(dump.summary, dict) else None
        self.register = int(reg) if isinstance(reg, (int, float)) and not isinstance(reg, bool) else dump.status_bits
        self.register_source = "summary" if reg is not None else "OR of op status bits"
        self.counts = self._scan_values()
        self.notes = self._notes()

    # ------------------------------------------------------------------ pieces

    def _input_clean(self, ref: str) -> bool:
        node, idx = split_tensor_name(ref)
        op = self._producers.get(node)
        if op is None:
            return True  # a constant or a placeholder that was not dumped
        if int(op.get("status", 0)):
            return False
        outs = op.get("outputs", [])
        return idx >= len(outs) or _finite_stats(outs[idx])

    def _tensor_desc(self, out: dict, name: str) -> dict:
        return {"tensor": name, "shape": list(out.get("shape", [])), "dtype": out.get("dtype"),
                "max": out.get("max"), "min": out.get("min"), "mean": out.get("mean"),
                "nan": int(out.get("nan", 0)), "inf": int(out.get("inf", 0)), "status": int(out.get("status", 0))}

    def _entry(self, op: dict) -> dict:
        inputs = []
        for ref in op.get("inputs", []):
            node, idx = split_tensor_name(ref)
            prod = self._producers.get(node)
            if prod is not None and idx < len(prod.get("outputs", [])):
                inputs.append(self._tensor_desc(prod["outputs"][idx], ref))
            else:
                inputs.append({"tensor": ref, "shape": None, "dtype": None, "max": None, "min": None,
                               "mean": None, "nan": 0, "inf": 0, "status": 0, "not_dumped": True})
        outputs = [self._tensor_desc(o, f"{op['name']}:{o['index']}") for o in op.get("outputs", [])]
        status = int(op.get("status", 0))
        return {"index": op.get("index"), "name": op["name"], "tf_type": op.get("tf_type"),
                "ascend_type": op.get("ascend_type"), "engine": op.get("engine"),
                "compute_dtype": op.get("compute_dtype"), "status": status, "status_names": decode_status(status),
                "precision": op.get("precision"), "fp32_check": op.get("fp32_check"),
                "inputs": inputs, "outputs": outputs}

    def _format_of(self, op: dict) -> str:
        dts = [o.get("dtype") for o in op.get("outputs", [])]
        for cand in [op.get("compute_dtype")] + dts:
            if cand in ("float16", "bfloat16"):
                return cand
        for cand in dts + [op.get("compute_dtype")]:
            if cand in FORMAT_MAX:
                return cand
        return "float32"

    def _original_types(self, op: dict, external: int | None = None) -> list[str]:
        """The TF types of the ops a fused op replaced (its ``fusion.replaces``), in their order; with
        ``external``, of an ``_EltwiseChain`` only the steps that read its input number ``external``."""
        fusion = op.get("fusion") or {}
        away = {f.get("name"): f.get("tf_type") for f in self.dump.fused_away if f.get("into") == op["name"]}
        chain = (op.get("attrs") or {}).get("chain")
        steps = {c.get("name"): c for c in chain if isinstance(c, dict)} if isinstance(chain, list) else {}
        types = []
        for name in fusion.get("replaces") or [op["name"]]:
            step = steps.get(name)
            if external is not None and steps and (step is None or external not in (step.get("args") or [])):
                continue
            t = (away.get(name) or (step or {}).get("op")
                 or (fusion.get("tf_type") if name == op["name"] else None))
            if t is None and name == op["name"] and not str(op.get("tf_type", "_")).startswith("_"):
                t = op["tf_type"]
            if t == "Transpose" and (op.get("attrs") or {}).get("transpose") is not None:
                continue   # the ONNX loader's Transpose to NCHW a fused convolution took in: no op of ATC's graph
            if t and t not in types:
                types.append(t)
        return types if types or external is None else self._original_types(op)

    def _blame(self, op: dict) -> dict:
        """The op type(s) to black-list in modify_mixlist for an overflowing op.

        An inserted Cast (``.../ascend_cast_*``) is no op of the model: it was inserted because its
        consumers compute in the narrow format, so they are named (the ops reading the cast's source
        tensor in the cast's dtype). A fused op is no type of the model either: the original types it
        replaced (``fusion.replaces``; of an ``_EltwiseChain`` the steps reading the cast tensor) are named.
        """
        ref = (op.get("inputs") or [None])[0]
        inserted = op.get("tf_type") == "Cast" and "/ascend_cast_" in op["name"] and ref is not None
        culprits = [op]
        if inserted:
            later = [o for o in self.dump.ops if o.get("index", 0) > op.get("index", 0) and o["name"] != op["name"]
                     and not (o.get("tf_type") == "Cast" and "/ascend_cast_" in o["name"])
                     and ref in (o.get("inputs") or [])]
            same = [o for o in later if o.get("compute_dtype") == op.get("compute_dtype")]
            culprits = same or later
        types, why = [], []
        for o in culprits:
            if o.get("fusion") or str(o.get("tf_type", "")).startswith("_"):
                ext = o["inputs"].index(ref) if inserted else None
                orig = self._original_types(o, ext)
                got = [ascend_type(t) for t in orig]
                why.append(f"{o['name']} ({o.get('tf_type')}, fused from {', '.join(orig) or '?'})")
            else:
                got = [o.get("ascend_type") or ascend_type(str(o.get("tf_type")))]
                why.append(f"{o['name']} ({got[0]})")
            types += [t for t in got if t and t != "Cast" and not t.startswith("_") and t not in types]
        if inserted and not culprits:
            return {"types": [], "inserted_cast": True, "consumers": [],
                    "explanation": "an inserted Cast whose consumer is not in the dump"}
        return {"types": types, "inserted_cast": inserted, "consumers": [o["name"] for o in culprits],
                "explanation": f"an inserted Cast, made for {'; '.join(why)}" if inserted else why[0]}

    def suggestion(self) -> dict | None:
        """CANN's ``modify_mixlist`` (``--ops-info``) for an abnormal first overflow: its op types
        black-listed (to float32); None when there is nothing to suggest."""
        if (self.first is None or self.first["verdict"]["verdict"] != "abnormal" or not self.first["blame"]["types"]
                or self.eager_torch):
            return None
        return {"black-list": {"to-add": list(self.first["blame"]["types"])}}

    def _verdict(self, op: dict, blame: dict | None = None) -> dict:
        fmt = self._format_of(op)
        fmax = FORMAT_MAX[fmt]
        seen = [v for v in (_largest(o) for o in op.get("outputs", [])) if v is not None]
        largest = max(seen) if seen else None
        fc = op.get("fp32_check")
        v = {"format": fmt, "format_max": fmax, "largest_dumped": largest, "fp32_overflow": None,
             "fp32_max_abs": None, "range_ratio": None}
        if not isinstance(fc, dict):
            v["verdict"] = "unknown"
            v["explanation"] = ("no float32 rerun recorded for this op (fp32_check); re-run the replay, "
                                "which reruns the first overflowing op in float32")
            return v
        mabs = fc.get("max_abs")
        v["fp32_overflow"] = bool(fc.get("overflow"))
        v["fp32_max_abs"] = mabs
        if isinstance(mabs, (int, float)) and mabs is not None and fmax:
            # how many times the format's range the float32 result needs (> 1: it cannot fit)
            v["range_ratio"] = float(mabs) / fmax
        if v["fp32_overflow"]:
            v["verdict"] = "normal"
            v["explanation"] = ("the op overflows in float32 too: the overflow is a property of the model "
                                "(its weights or inputs), not of the reduced precision")
        else:
            v["verdict"] = "abnormal"
            need = (f"; its float32 result reaches {float(mabs):.6g}, {v['range_ratio']:.3g}x the {fmt} maximum "
                    f"{fmax:.6g}" if v["range_ratio"] is not None else "")
            types = (blame or {}).get("types") or []
            keep = (f"black-list {', '.join(types)} in modify_mixlist (--ops-info writes it)" if types
                    else "black-list its op type in modify_mixlist")
            if self.eager_torch:
                aten = (op.get("precision") or {}).get("aten") or op["name"]
                phase = f", {op['phase']}" if op.get("phase") else ""
                keep = (f"run the layer of this call ({aten}{phase}) outside torch.autocast('npu') (a nested "
                        "autocast(enabled=False)) on .float() inputs (torch_npu's eager mode reads no modify_mixlist)")
            whose = (f" ({blame['explanation']})" if blame and blame.get("inserted_cast")
                     or blame and op.get("fusion") else "")
            v["explanation"] = (f"the op is finite in float32 but overflows in {fmt}: the overflow comes from the "
                                f"reduced precision{need}; keep it in float32: {keep}{whose}, or scale its inputs")
        return v

    def _scan_values(self) -> dict:
        """Count saturated (|x| == format max) and inf/nan values in the outputs of overflowing ops."""
        c = {"saturated": 0, "inf": 0, "nan": 0, "scanned_tensors": 0, "stats_only_tensors": 0}
        for op in self.dump.ops:
            if not _overflowing(op):
                continue
            for out in op.get("outputs", []):
                c["inf"] += int(out.get("inf", 0))
                c["nan"] += int(out.get("nan", 0))
                fmax = FORMAT_MAX.get(out.get("dtype"))
                if fmax is None:
                    continue
                if out.get("file") is None:
                    c["stats_only_tensors"] += 1
                    continue
                c["scanned_tensors"] += 1
                for chunk in self.dump.chunks(op["name"], out["index"], _SCAN_CHUNK):
                    c["saturated"] += int(np.count_nonzero(np.abs(chunk.astype(np.float64)) == fmax))
        return c

    def _notes(self) -> list[str]:
        mode = self.dump.config.get("overflow_mode") if isinstance(self.dump.config, dict) else None
        c = self.counts
        notes = []
        where = f"in the outputs of {sum(1 for op in self.dump.ops if _overflowing(op))} overflowing op(s)"
        notes.append(f"{c['saturated']} value(s) saturated at the format maximum (e.g. +-65504 for float16), "
                     f"{c['inf']} inf and {c['nan']} nan {where}"
                     + (f" (overflow_mode={mode})" if mode else ""))
        if mode == "saturation":
            notes.append("saturation mode: an overflow gives +-max of the format and NaN becomes 0, so the output "
                         "stays finite and only the status bits tell (the 910's only mode)")
        elif mode == "inf_nan":
            notes.append("inf_nan mode: an overflow gives +-inf and propagates NaN as IEEE arithmetic does "
                         "(the 910B's default)")
        if c["stats_only_tensors"]:
            notes.append(f"{c['stats_only_tensors']} overflowing tensor(s) were dumped as statistics only; "
                         "their saturated values are not counted")
        return notes

    # ------------------------------------------------------------------ output

    def to_json(self) -> dict:
        """Everything as a JSON-serialisable dict (non-finite numbers as "inf"/"nan" strings)."""
        return json_safe({"dump": self.dump.path, "config": self.dump.config,
                "register": {"bits": self.register, "hex": f"0x{self.register:x}",
                             "names": decode_status(self.register), "source": self.register_source},
                "ops": self.ops, "first": self.first, "values": self.counts, "notes": self.notes,
                "ops_info": self.suggestion()})

    @staticmethod
    def format_op(entry: dict) -> str:
        """One op as precision_tool prints it."""
        eng = _ENGINE.get(str(entry.get("engine")), str(entry.get("engine")))
        lines = [f"[{entry['tf_type']}][{entry['index']}] {entry['name']}"]
        names = entry["status_names"] or ["no status bits (non-finite output)"]
        lines.append(f" - [{eng}][Status:{entry['status']}] [{'; '.join(names)}]")
        for k, t in enumerate(entry["inputs"]):
            if t.get("not_dumped"):
                lines.append(f" - Input[{k}] {t['tensor']}: not dumped (constant or placeholder)")
            else:
                lines.append(_tensor_line(f"Input[{k}]", t))
        for k, t in enumerate(entry["outputs"]):
            lines.append(_tensor_line(f"Output[{k}]", t))
        return "\n".join(map(printable, lines))    # a name from the dump never starts a line of its own

    def format_text(self) -> str:
        lines = [f"float status register: 0x{self.register:x}"
                 + (f" [{'; '.join(decode_status(self.register))}]" if self.register else " (no overflow)")
                 + f" ({self.register_source})"]
        lines.append(f"{len(self.ops)} op(s) with overflow status bits")
        if self.first is None:
            lines.append("first overflowing op: none")
        else:
            lines.append("first overflowing op (finite inputs, overflowing output):")
            lines.extend(self.format_op(self.first).split("\n"))
            v = self.first["verdict"]
            lines.append(f" - verdict: {v['verdict']}: {v['explanation']}")
            lines.append(f" - largest magnitude dumped {_fmt(v['largest_dumped'])}; float32 rerun max |x| "
                         f"{_fmt(v['fp32_max_abs'])}; {v['format']} maximum {_fmt(v['format_max'])}")
        later = [e for e in self.ops if self.first is None or e["name"] != self.first["name"]]
        if later:
            lines.append("other ops with status bits:")
            for e in later[:50]:
                lines.append(f"  [{e['tf_type']}][{e['index']}] {e['name']}  Status:{e['status']} "
                             f"[{'; '.join(e['status_names'])}]")
            if len(later) > 50:
                lines.append(f"  ... and {len(later) - 50} more (see --json)")
        lines.extend("note: " + n for n in self.notes)
        return "\n".join(map(printable, lines))


def _tensor_line(label: str, t: dict) -> str:
    extra = ""
    if t.get("inf") or t.get("nan"):
        extra = f" inf {t['inf']} nan {t['nan']}"
    return (f" - {label} {t['tensor']} shape {t['shape']} dtype {t['dtype']} max {_fmt(t['max'])} "
            f"min {_fmt(t['min'])} mean {_fmt(t['mean'])}{extra}")


def overflow_report(dump) -> OverflowReport:
    """Analyse the overflow status recorded in a dump.

    Parameters
    ----------
    dump : str, os.PathLike or Dump
        An NPU dump directory (or a loaded dump).

    Returns
    -------
    OverflowReport
        ``.ops``, ``.first`` (with its verdict), ``.register``, ``.notes``;
        ``.to_json()`` and ``.format_text()``.
    """
    return OverflowReport(load_dump(dump))

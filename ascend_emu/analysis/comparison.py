"""The comparison table: one row per tensor, and what is read from it.

:class:`Comparison` holds the rows :func:`ascend_emu.analysis.compare.compare` builds
(msprobe's CSV columns in its order, then ours) and answers the questions asked of them:
the worst rows, the failing ones, the first divergent op (where the error enters rather
than where it is passed on) and the chain it feeds to the model output; it writes the
CSV, a terminal table and a summary. No TensorFlow here.
"""
from __future__ import annotations

import csv
import io
import math
import os
from collections import deque
from dataclasses import asdict, dataclass, field

from ..errors import printable
from ..fileio import atomic_write_text
from ..graph.core import split_tensor_name
from .dump import Dump
from .metrics import ERROR, NA, NAN, PASS, WARNING, Thresholds

#: msprobe's compare CSV columns, in its order
MSPROBE_COLUMNS = [
    "NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
    "Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio", "Five Thousandths Err Ratio",
    "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm",
    "Result", "Err_message",
]
#: our columns, after msprobe's
EXTRA_COLUMNS = ["MeanAbsErr", "RMSE", "Op Type", "Ascend Op Type", "Engine", "Compute Dtype",
                 "Overflow Status", "Index"]
#: msprobe's columns with our relative Euclidean distance next to its absolute one, then ours
COLUMNS = (MSPROBE_COLUMNS[:MSPROBE_COLUMNS.index("EucDist") + 1] + ["RelEucDist"]
           + MSPROBE_COLUMNS[MSPROBE_COLUMNS.index("EucDist") + 1:] + EXTRA_COLUMNS)
#: the statistics columns (printed as inf, -inf, nan when they are)
STAT_COLUMNS = [f"{side} {k}" for side in ("NPU", "Bench") for k in ("max", "min", "mean", "l2norm")]
#: the name mark of a Cast the replay inserted (``compare.CAST_MARK``; compare imports this module)
_CAST_MARK = "/ascend_cast"
#: the largest finite value of the formats a Cast narrows to
_FORMAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}


@dataclass
class _Info:
    """What a row is, beyond its CSV columns."""
    kind: str                      # "matched", "cast", "npu only", "bench only", "fused", "stats only"
    npu_op: str | None
    bench_op: str | None
    output: int
    npu_index: int | None          # execution index in the NPU dump
    bench_output: int | None = None  # output index on the bench side (differs for inserted casts)
    noise: bool = False            # both sides float32 rounding noise of an exact 0 (analysis.noise)


class Comparison:
    """The result of :func:`~ascend_emu.analysis.compare.compare`: one row per tensor, in the NPU dump's execution order.

    Attributes
    ----------
    rows : list of dict
        Keyed by :data:`COLUMNS` (msprobe's columns in its order, then ours).
    npu, bench : Dump
    thresholds : Thresholds
    rules : {"ascend-emu", "msprobe"}
        How the Result column was decided.
    forced : tuple of str
        Why the two dumps do not belong together (different models, different inputs)
        when they were compared anyway with ``force=True``; empty otherwise.
    internal : tuple of str
        The NPU ops left out of the rows: steps inside a source node's lowering (a .pt2 program's aten calls
        lowered to several registry ops), not tensors of the model; the reference has no counterpart.
    """

    def __init__(self, npu: Dump, bench: Dump, rows: list[dict], info: list[_Info], thresholds: Thresholds,
                 rules: str = "ascend-emu", forced: tuple = (), internal: list | tuple = ()):
        #: why the dumps do not belong together, when compared anyway with ``force=True`` (else empty)
        self.forced = tuple(forced)
        self.npu, self.bench = npu, bench
        self.rows, self._info = rows, info
        self.thresholds, self.rules = thresholds, rules
        self._by_op: dict[str, list[dict]] = {}
        for r, i in zip(rows, info):
            self._by_op.setdefault(i.npu_op or i.bench_op, []).append(r)
        self._first = False
        self._noise_ops: list = []
        #: NPU ops left out of the rows: steps inside a lowering (a .pt2 program's), not tensors of the model
        self.internal = tuple(internal)

    # ------------------------------------------------------------------ queries

    def info(self, row_index: int) -> dict:
        """What row ``row_index`` is: ``kind`` ("matched", "cast", "npu only", "bench only", "fused",
        "stats only"), ``npu_op``, ``bench_op``, ``output`` (NPU output index), ``npu_index``
        (execution index) and ``bench_output``."""
        return asdict(self._info[row_index])

    def rows_of(self, op_name: str) -> list[dict]:
        """The rows of op ``op_name`` (NPU name, or bench name for ops absent from the NPU dump)."""
        return list(self._by_op.get(op_name, []))

    def op_result(self, op_name: str) -> str:
        """"error" if any output of the op fails, else "warning" if any warns (msprobe's rules), "pass"
        if any passes, else "N/A"."""
        res = [r["Result"] for r in self.rows_of(op_name)]
        for level in (ERROR, WARNING, PASS):
            if level in res:
                return level
        return NA

    def worst(self, cosine: float = 0.98, limit: int = 10) -> list[dict]:
        """Rows with cosine <= ``cosine``, worst first (like precision_tool's ``vcs -c 0.98 -l 10``).

        Rows whose cosine is "Nan" (mismatched inf/nan) count as worse than any number.
        """
        def cos_key(r):
            c = r["Cosine"]
            return -math.inf if c == NAN else c
        sel = [r for r in self.rows if r["Cosine"] == NAN or (isinstance(r["Cosine"], float) and r["Cosine"] <= cosine)]
        sel.sort(key=lambda r: (cos_key(r), r["Index"] if isinstance(r["Index"], int) else 1 << 62))
        return sel[:limit] if limit is not None and limit >= 0 else sel

    def format_worst(self, cosine: float = 0.98, limit: int = 10) -> str:
        """The terminal table of :meth:`worst`; when no row is at or below ``cosine``, a line saying so
        and the ``limit`` lowest rows instead (an empty table looked like a failed query)."""
        rows = self.worst(cosine, limit)
        if rows:
            return self.format_table(rows)
        rows = self.worst(math.inf, limit)
        if not rows:
            return f"no tensor with cosine <= {cosine}: no tensor has a cosine (none was compared)"
        return (f"no tensor with cosine <= {cosine}; the {len(rows)} lowest:\n" + self.format_table(rows))

    def failing(self) -> list[dict]:
        return [r for r in self.rows if r["Result"] == ERROR]

    def state_differences(self) -> list[dict]:
        """Dumps of one training step (two runs', or a run's and a reference's from other weights): the rows of
        the step's state inputs (weights, optimizer slots, loss scale) whose values differ, lowest cosine
        first. Empty for other dumps."""
        rows = [r for n in self.npu.state_inputs for r in self.rows_of(n)
                if r["Cosine"] == NAN or isinstance(r["MaxAbsErr"], float) and r["MaxAbsErr"] > 0]
        return sorted(rows, key=lambda r: -math.inf if r["Cosine"] == NAN else
                      r["Cosine"] if isinstance(r["Cosine"], float) else math.inf)

    # ------------------------------------------------------------------ first divergent op

    def _tensor_rows(self) -> dict[str, dict]:
        out = {}
        for r, i in zip(self.rows, self._info):
            if i.npu_op is not None:
                out[f"{i.npu_op}:{i.output}"] = r
        return out

    def final_outputs(self) -> list[str]:
        """Op names of the model's outputs: ``summary["outputs"]`` of the NPU dump (then the
        bench dump) if present, else the NPU ops nobody consumes."""
        for d in (self.npu, self.bench):
            outs = d.summary.get("outputs") if isinstance(d.summary, dict) else None
            if outs:
                names = []
                for o in outs:
                    n = split_tensor_name(str(o))[0]
                    if n in self.npu and n not in names:
                        names.append(n)
                if names:
                    return names
        consumed = {split_tensor_name(ref)[0] for op in self.npu.ops for ref in op.get("inputs", [])}
        return [op["name"] for op in self.npu.ops if op["name"] not in consumed]

    def chain_to_output(self, op_name: str) -> list[str]:
        """Shortest path of NPU ops from ``op_name`` to a model output (both ends included); ``[op_name]`` when
        no consumer in the dump leads to one. An inserted Cast's readers list the Cast's source tensor (the dump
        keeps the graph's edges): they are the later ops reading that tensor."""
        consumers: dict[str, list[str]] = {}
        for op in self.npu.ops:
            for ref in op.get("inputs", []):
                consumers.setdefault(split_tensor_name(ref)[0], []).append(op["name"])
        for cast in self.npu.ops:
            if _inserted_cast(cast):
                src = cast["inputs"][0]
                consumers[cast["name"]] = [o["name"] for o in self.npu.ops if o.get("index", 0) > cast.get("index", 0)
                                           and not _inserted_cast(o) and src in (o.get("inputs") or [])]
        finals = set(self.final_outputs())
        prev = {op_name: None}
        q = deque([op_name])
        while q:
            cur = q.popleft()
            if cur in finals:
                path = []
                while cur is not None:
                    path.append(cur)
                    cur = prev[cur]
                return path[::-1]
            for nxt in consumers.get(cur, []):
                if nxt not in prev:
                    prev[nxt] = cur
                    q.append(nxt)
        return [op_name]

    def first_divergent(self) -> "Divergence | None":
        """The earliest NPU op (execution order) with a failing output whose inputs all pass.

        Inputs are the producer tensors the op lists; a producer with no row, or whose row
        is not judged (Const, Placeholder, an op with no counterpart), counts as passing.
        This is where the error enters rather than where it is passed on. ``None`` if
        every op passes. A training step's state inputs (:meth:`state_differences`) are never
        it: two runs' steps differ by their state, which is where they start, not an op.
        """
        if self._first is not False:
            return self._first
        self._first = self._find_first_divergent()
        return self._first

    def _find_first_divergent(self):
        by_tensor = self._tensor_rows()
        state = set(self.npu.state_inputs)
        carried: list = []       # ops passed over: failing only as their inputs' error, scaled (see _carries)
        carried_tensors: set = set()
        noise = self.noise_tensors()
        self._noise_ops = []     # ops passed over: every failing output is rounding noise of an exact 0
        for op in self.npu.ops:
            outs = [r for r in self.rows_of(op["name"])]
            if op["name"] in state or not any(r["Result"] == ERROR for r in outs):
                continue
            if all(r["NPU Name"] in noise for r in outs if r["Result"] == ERROR):
                # its consumers read a failing tensor, so they are passed over as any op after an error is
                self._noise_ops.append(op["name"])
                continue
            inputs = []
            ok = True
            for ref in op.get("inputs", []):
                r = by_tensor.get(ref)
                inputs.append({"tensor": ref, "row": r})
                if r is not None and r["Result"] == ERROR and ref not in carried_tensors:
                    ok = False
            if ok and _carries(outs, [i["row"] for i in inputs]):
                carried.append((op, outs, inputs))
                carried_tensors.update(r["NPU Name"] for r in outs)
                continue
            if ok:
                chain = self.chain_to_output(op["name"])
                chain_rows = []
                for name in chain:
                    rs = self.rows_of(name)
                    chain_rows.append(rs[0] if rs else None)
                d = Divergence(op=op, outputs=outs, inputs=inputs, chain=chain, chain_rows=chain_rows,
                               is_output=op["name"] in self.final_outputs())
                if op.get("tf_type") == "Cast":
                    d.rounding = self._format_rounding(op)
                    if d.rounding:
                        d.exceeds = self._first_exceeding(op, by_tensor)
                d.carried = [c[0]["name"] for c in carried]
                d.noise = list(self._noise_ops)
                return d
        if carried:
            # no op made the error grow: name the first that failed, as before, and say how it failed
            op, outs, inputs = carried[0]
            chain = self.chain_to_output(op["name"])
            d = Divergence(op=op, outputs=outs, inputs=inputs, chain=chain,
                           chain_rows=[(self.rows_of(n) or [None])[0] for n in chain],
                           is_output=op["name"] in self.final_outputs())
            d.scaled_only = True
            d.noise = list(self._noise_ops)
            return d
        return None

    def noise_tensors(self) -> set:
        """NPU tensor names (``name:index``) of the failing rows that are float32 rounding noise of an exact 0 on both
        sides (:mod:`ascend_emu.analysis.noise`; ascend-emu's rules only)."""
        return {r["NPU Name"] for r, i in zip(self.rows, self._info) if i.noise}

    def noise_ops(self) -> list:
        """The ops :meth:`first_divergent` passed over because every failing output of theirs is rounding noise."""
        self.first_divergent()
        return list(self._noise_ops)

    def _format_rounding(self, op: dict) -> str | None:
        """The format (float16, bfloat16) when Cast ``op``'s output is exactly the value it casts (its bench
        value) rounded to that format, to nearest even (out of range: inf, or the format's maximum under
        saturation): an error that is the format's own, not the op's; else None."""
        import numpy as np

        k = next((i for i, inf in enumerate(self._info) if inf.npu_op == op["name"] and inf.output == 0), None)
        if k is None or self._info[k].bench_op is None:
            return None
        fmt = self.rows[k].get("NPU Dtype")
        if fmt not in _FORMAT_MAX:
            return None
        try:
            got = np.asarray(self.npu.tensor(op["name"], 0), dtype=np.float64)
            want = np.asarray(self.bench.tensor(self._info[k].bench_op, self._info[k].bench_output or 0),
                              dtype=np.float32)
        except Exception:       # statistics only, or no tensor file: nothing to tell
            return None
        if got.shape != want.shape:
            return None
        if fmt == "float16":
            dt = np.float16
        else:
            import ml_dtypes

            dt = ml_dtypes.bfloat16
        with np.errstate(over="ignore", invalid="ignore"):
            fmax = _FORMAT_MAX[fmt]
            for cand in (want, np.clip(want, -fmax, fmax)):
                if np.array_equal(got, cand.astype(dt).astype(np.float64), equal_nan=True):
                    return fmt
        return None

    def _first_exceeding(self, cast: dict, by_tensor: dict) -> str | None:
        """The first op after ``cast`` (not a Cast) with a failing output whose error exceeds its inputs': a
        lower cosine and a larger MaxRelativeErr than every compared input's. None: no op makes the error
        larger; the outputs carry the format's rounding only."""
        def num(v, default):
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else default

        # an op reading through an inserted Cast lists the Cast's source: the Cast's row is (also) its input's
        through: dict[str, list] = {}
        for op in self.npu.ops:
            if _inserted_cast(op):
                through.setdefault(op["inputs"][0], []).append((op.get("index", 0), by_tensor.get(f"{op['name']}:0")))
        for op in self.npu.ops:
            if op.get("index", 0) <= cast.get("index", 0) or op.get("tf_type") == "Cast":
                continue
            outs = [r for r in self.rows_of(op["name"]) if r["Result"] == ERROR]
            if not outs:
                continue
            ins = []
            for ref in op.get("inputs", []):
                ins.append(by_tensor.get(ref))
                ins.extend(r for i, r in through.get(ref, ()) if i < op.get("index", 0))
            ins = [r for r in ins if r is not None and r["Result"] != NA]
            in_cos = min((num(r["Cosine"], 1.0) for r in ins), default=1.0)
            in_rel = max((num(r["MaxRelativeErr"], 0.0) for r in ins), default=0.0)
            if any(num(r["Cosine"], 1.0) < in_cos and num(r["MaxRelativeErr"], 0.0) > in_rel for r in outs):
                return op["name"]
        return None

    # ------------------------------------------------------------------ output

    def forced_note(self) -> str:
        """One sentence saying the comparison was forced and why ("" if it was not)."""
        if not self.forced:
            return ""
        return "compared with --force (force=True) although the dumps are of " + "; ".join(self.forced)

    def to_csv(self, path) -> str:
        """Write every row as CSV (msprobe's columns, then ours), atomically. Returns the path."""
        path = os.fspath(path)
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(COLUMNS)
        note = f"[{self.forced_note()}]" if self.forced else ""
        k = COLUMNS.index("Err_message")
        for r in self.rows:
            vals = [_csv_stat(r[c]) if c in STAT_COLUMNS else _csv_value(r[c]) for c in COLUMNS]
            if note:   # a forced comparison says so on every row
                vals[k] = f"{note} {vals[k]}".strip()
            w.writerow(vals)
        atomic_write_text(path, buf.getvalue())
        return path

    @staticmethod
    def format_table(rows, columns=None, width: int = 160) -> str:
        """A fixed-width terminal table of ``rows`` (a short column set by default)."""
        columns = columns or ["Index", "NPU Name", "Op Type", "Compute Dtype", "Cosine", "MaxAbsErr",
                              "MaxRelativeErr", "One Thousandth Err Ratio", "Overflow Status", "Result"]
        heads = {"One Thousandth Err Ratio": "1/1000 ratio", "Five Thousandths Err Ratio": "5/1000 ratio",
                 "Overflow Status": "Status", "Compute Dtype": "Compute"}
        cells = [[heads.get(c, c) for c in columns]]
        for r in rows:
            cells.append([printable(_short(r.get(c))) for c in columns])
        widths = [max(len(row[k]) for row in cells) for k in range(len(columns))]
        # the name column gives way when the table is too wide
        if "NPU Name" in columns:
            k = columns.index("NPU Name")
            excess = sum(widths) + 2 * len(widths) - width
            if excess > 0:
                widths[k] = max(16, widths[k] - excess)
        lines = []
        for j, row in enumerate(cells):
            parts = []
            for k, v in enumerate(row):
                if len(v) > widths[k]:
                    v = "..." + v[-(widths[k] - 3):]
                parts.append(v.ljust(widths[k]) if k == 0 or not _numeric(v) else v.rjust(widths[k]))
            lines.append("  ".join(parts).rstrip())
            if j == 0:
                lines.append("-" * len(lines[0]))
        return "\n".join(lines)

    def counts(self) -> dict:
        c = {"tensors": len(self.rows), "compared": 0, "pass": 0, "warning": 0, "error": 0}
        for r, i in zip(self.rows, self._info):
            c[i.kind] = c.get(i.kind, 0) + 1
            if r["Result"] in (PASS, WARNING, ERROR):
                c["compared"] += 1
                c[r["Result"]] += 1
        return c

    def summary_text(self, first_divergent: bool = True) -> str:
        """A few lines for the terminal: counts, worst cosine, first divergent op (``first_divergent=False``: not
        that line, for a caller that prints the op's own block, :meth:`Divergence.format_text`, which names it)."""
        c = self.counts()
        cos = [r["Cosine"] for r in self.rows if isinstance(r["Cosine"], float)]
        warn = f"{c['warning']} warning, " if self.rules == "msprobe" else ""
        lines = [f"WARNING: {self.forced_note()}"] if self.forced else []
        lines += [f"compared {c['compared']} of {c['tensors']} tensors: {c['pass']} pass, {warn}{c['error']} error"
                 f" (NPU dump {self.npu.path} vs bench dump {self.bench.path}; rules: {self.rules})"]
        extra = [f"{c[k]} {k}" for k in ("cast", "npu only", "bench only", "fused", "stats only") if c.get(k)]
        if self.internal:
            extra.append(f"{len(self.internal)} op(s) inside the lowerings left out (not tensors of the model)")
        if extra:
            lines.append("also: " + ", ".join(extra))
        if cos:
            lines.append(f"lowest cosine {min(cos):.6f}; {sum(1 for x in cos if x < self.thresholds.cosine)} "
                         f"tensor(s) below {self.thresholds.cosine} (the pass rule's cosine)")
        nan_rows = sum(1 for r in self.rows if r["Cosine"] == NAN)
        if nan_rows:
            lines.append(f"{nan_rows} tensor(s) whose inf/nan positions differ between NPU and bench (Nan)")
        ov = sum(1 for op in self.npu.ops if op.get("status"))
        if ov:
            lines.append(f"{ov} op(s) with overflow status bits (float status 0x{self.npu.status_bits:x})")
        sd = self.state_differences()
        if sd:
            n = sum(len(self.rows_of(s)) for s in self.npu.state_inputs)
            fail = sum(1 for r in sd if r["Result"] == ERROR)
            lines.append(f"the steps start from different states: {len(sd)} of {n} state inputs differ (lowest "
                         f"cosine {_short(sd[0]['Cosine'])} at {sd[0]['NPU Name']}"
                         + (f"; {fail} fail" if fail else "") + "); the first divergent op is sought after them")
        fd = self.first_divergent()
        if first_divergent or fd is None:
            lines.append("first divergent op: " + (f"[{fd.op['tf_type']}][{fd.op['index']}] {fd.op['name']}"
                                                    if fd else self.no_divergence_reason()))
        if self._noise_ops and (first_divergent or fd is None):   # else the caller's Divergence.format_text names them
            lines.append(self.noise_line())
        return "\n".join(map(printable, lines))    # a name from the dump never starts a line of its own


    def no_divergence_reason(self) -> str:
        """When :meth:`first_divergent` names no op, why: every op passes, or the failing tensors are passed over
        (rounding noise of an exact 0, a training step's state inputs, or ops reading them)."""
        self.first_divergent()
        if not self.counts().get("error"):
            return "none (every op passes)"
        why = (["rounding noise of an exact 0"] if self._noise_ops else []) + \
            (["a training step's state inputs"] if self.state_differences() else [])
        if not why:
            return "none: every failing op reads a failing tensor"
        return "none: the failing tensors are " + " or ".join(why) + ", or ops reading them"

    def noise_line(self) -> str:
        """One line naming the ops passed over as rounding noise ("" when none was)."""
        self.first_divergent()
        return _noise_line(self._noise_ops) if self._noise_ops else ""


def _noise_line(ops: list) -> str:
    return ("passed over as rounding noise (an additive result whose exact value is 0; both sides within float32 "
            "rounding of it, so their cosine compares two roundings of 0): " + ", ".join(ops[:5])
            + (f" and {len(ops) - 5} more" if len(ops) > 5 else ""))


@dataclass
class Divergence:
    """The first divergent op: its manifest entry, its output rows, its inputs' rows and the
    chain of ops (with their first output's row) it feeds to the model output."""

    op: dict
    outputs: list[dict]
    inputs: list[dict]
    chain: list[str]
    chain_rows: list = field(default_factory=list)
    #: whether the op is a model output (else a chain of one op reaches no output in the dump)
    is_output: bool = False
    #: a Cast whose output is its input rounded to this format (float16, bfloat16): the format's own error
    rounding: str | None = None
    #: then: the first later op whose error exceeds its inputs' (None: none does)
    exceeds: str | None = None
    #: earlier ops that failed with no more error than their inputs' (a loss scale's multiply: the absolute
    #: error grows with the values, the relative error and the cosine do not): passed over, named here
    carried: list = field(default_factory=list)
    #: no op made the error grow: this op is the first that failed, and it failed only as its inputs did
    scaled_only: bool = False
    #: earlier ops whose failing outputs are all rounding noise of an exact 0 (analysis.noise): passed over
    noise: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.op["name"]

    @property
    def index(self) -> int:
        return self.op["index"]

    def to_dict(self) -> dict:
        return {"name": self.name, "index": self.index, "tf_type": self.op.get("tf_type"),
                "ascend_type": self.op.get("ascend_type"), "engine": self.op.get("engine"),
                "compute_dtype": self.op.get("compute_dtype"), "precision": self.op.get("precision"),
                "status": self.op.get("status"), "outputs": self.outputs,
                "inputs": [{"tensor": i["tensor"], "metrics": i["row"]} for i in self.inputs],
                "chain": self.chain, "rounding": self.rounding, "exceeds": self.exceeds, "carried": self.carried,
                "scaled_only": self.scaled_only, "noise": self.noise}

    def format_text(self) -> str:
        op = self.op
        lines = [f"first divergent op: [{op.get('tf_type')}][{op['index']}] {op['name']}  "
                 f"({op.get('ascend_type')}, {op.get('engine')}, compute {op.get('compute_dtype')}"
                 + (f", {op['precision']['list']} list" if op.get("precision") and op["precision"].get("list") else "")
                 + ")"]
        lines.append("  inputs:")
        for i in self.inputs:
            r = i["row"]
            if r is None:
                lines.append(f"    {i['tensor']}: not compared (constant, placeholder or not dumped) -> pass")
            else:
                lines.append(f"    {i['tensor']}: {_metric_line(r)}")
        lines.append("  outputs:")
        for r in self.outputs:
            lines.append(f"    {r['NPU Name']}: {_metric_line(r)}")
            if r["Err_message"]:
                lines.append(f"      {r['Err_message']}")
        lines.append("  feeds the output through: " + (" -> ".join(
            f"{n} (cos {_short(r['Cosine']) if r else '?'})" for n, r in zip(self.chain, self.chain_rows))
            if len(self.chain) > 1 else "(it is a model output)" if self.is_output
            else "(no consumer in the dump leads to a model output)"))
        if self.rounding:
            lines.append(self.rounding_note())
        if self.carried:
            lines.append("  passed over before it (they fail the absolute-error rule with no more relative error "
                         "and no lower cosine than their inputs: a scaling, not where the error enters): "
                         + ", ".join(self.carried[:5]) + (f" and {len(self.carried) - 5} more" if len(self.carried) > 5
                                                         else ""))
        if self.noise:
            lines.append("  " + _noise_line(self.noise))
        if self.scaled_only:
            lines.append("  its relative error and cosine are its inputs' (a scaling such as a loss scale's multiply); "
                         "no op after it makes the error larger")
        return "\n".join(map(printable, lines))    # a name from the dump never starts a line of its own

    def rounding_note(self) -> str:
        """For a first divergent Cast whose error is its format's rounding: one line saying so, and where the
        error next grows ("" otherwise)."""
        if not self.rounding:
            return ""
        return (f"  this Cast's output is its input rounded to {self.rounding} (the format's own rounding and range: "
                f"where precision is lost, not an error of the op); "
                + (f"the first op whose error exceeds its inputs' is {self.exceeds}" if self.exceeds else
                   "no later op's error exceeds its inputs' (the outputs carry this rounding only)"))


def _carries(outs: list, inputs: list) -> bool:
    """Whether an op's failing outputs carry its inputs' error and add none: some input was compared, and every
    failing output has a cosine no lower and a MaxRelativeErr no larger than its compared inputs' worst (a
    multiply by a loss scale of 2^16 fails msprobe's MaxAbsErr > 1 rule on a loss whose error passes)."""
    rows = [r for r in inputs if r is not None and r["Result"] != NA]
    cos_in = [r["Cosine"] for r in rows if _finite(r["Cosine"])]
    rel_in = [r["MaxRelativeErr"] for r in rows if _finite(r["MaxRelativeErr"])]
    if not cos_in or not rel_in:
        return False
    lo_cos, hi_rel = min(cos_in), max(rel_in)
    for r in outs:
        if r["Result"] != ERROR:
            continue
        if not (_finite(r["Cosine"]) and _finite(r["MaxRelativeErr"])):
            return False
        # (a tolerance of the metrics' own float64 arithmetic: the scaled values give the same ratios)
        if r["Cosine"] < lo_cos - 1e-12 or r["MaxRelativeErr"] > hi_rel * (1 + 1e-9) + 1e-300:
            return False
    return True


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _inserted_cast(op: dict) -> bool:
    return op.get("tf_type") == "Cast" and _CAST_MARK in op["name"] and bool(op.get("inputs"))


def _metric_line(r: dict) -> str:
    return (f"{r['Result']:5s} cos {_short(r['Cosine'])}  MaxAbsErr {_short(r['MaxAbsErr'])}  "
            f"MaxRelErr {_short(r['MaxRelativeErr'])}  1/1000 {_short(r['One Thousandth Err Ratio'])}  "
            f"{r['NPU Dtype'] or '-'} vs {r['Bench Dtype'] or '-'}")


def _numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _short(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if v == 1.0 or v == 0.0:
            return f"{v:g}"
        if 0.99 <= v < 1.0:
            # enough decimals that a cosine below 1 never prints as 1
            k = min(15, max(6, math.ceil(-math.log10(1.0 - v)) + 1))
            return f"{v:.{k}f}"
        return f"{v:.4g}"
    return str(v)


def _csv_stat(v):
    """A statistic: a number, "inf", "-inf", "nan", or N/A; never an empty cell."""
    if v is None:
        return NA
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return _csv_value(v)


def _csv_value(v):
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return NAN
        return repr(v)
    return str(v)

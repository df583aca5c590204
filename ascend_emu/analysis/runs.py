"""Two emulated runs of the same model, op by op: identical, or where they part (random-error detection).

The NPU's "random error detection" (seed 001, NUMERICS.md section 11): run the same model twice, dump
every op, and compare the dumps to find the op where the runs first differ. :func:`compare_runs`
compares two dumps of the same model and inputs bit for bit, in execution order; for the first op
that differs it says whether its inputs were identical in both runs (the op is a **source** of the
difference) or not (it only **propagates** one), and it lists every source. :func:`write_runs_report`
writes the HTML report of several runs (their loss curves when they trained). No TensorFlow here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import AscendEmuError, printable
from ..fileio import atomic_write_text, check_writable
from .compare import same_output as _same_output
from .dump import load_dump
from .metrics import tensor_metrics

@dataclass
class RunDiff:
    """Where two runs of one model differ, op by op (:func:`compare_runs`).

    ``differing``: names of the ops with an output that differs, in execution order; ``sources``: those
    whose inputs were identical in both runs (the difference starts there); ``first``: the first
    differing op as ``{"name", "tf_type", "phase", "index", "source", "inputs_identical", "metrics"}``
    or None when the runs are identical; ``compared``: ops compared; ``unknown``: ops whose outputs
    were not dumped in a comparable form.
    """

    dump_a: str
    dump_b: str
    compared: int
    differing: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    first: dict | None = None
    unknown: int = 0
    types: dict = field(default_factory=dict)
    #: the training step's state inputs (weights, slots, loss scale) that differ: the runs' states
    state: list = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differing

    def to_dict(self) -> dict:
        return {"dump_a": self.dump_a, "dump_b": self.dump_b, "compared": self.compared, "identical": self.identical,
                "differing": list(self.differing), "sources": list(self.sources), "first": self.first,
                "unknown": self.unknown, "state": list(self.state)}

    def format_text(self) -> str:
        if self.identical:
            line = f"identical: all {self.compared} ops hold the same bytes in both runs"
            if self.unknown:
                line += f" ({self.unknown} ops without a comparable output)"
            return line
        lines = []
        if self.state:
            lines.append(f"the steps start from different states: {len(self.state)} state inputs differ ("
                         + ", ".join(self.state[:5]) + (", ..." if len(self.state) > 5 else "") + ")")
        f = self.first
        if f is None:
            return "\n".join(map(printable, lines + [f"no op differs but the state ({self.compared} ops compared)"]))
        role = ("the source: its inputs were identical in both runs" if f["source"]
                else "it only propagates: its inputs already differed")
        lines += [f"the runs part at op {f['index']} {f['name']} ({f['tf_type']}"
                 + (f", phase {f['phase']}" if f.get("phase") else "") + f"): {role}",
                 f"ops that differ: {len(self.differing)} of {self.compared}"]
        m = f.get("metrics") or {}
        if m:
            lines.append("  first difference: " + ", ".join(
                f"{k} {_fmt(m[k])}" for k in ("Cosine", "MaxAbsErr", "MaxRelativeErr") if k in m))
        if self.sources:
            lines.append("sources (differ with identical inputs): "
                         + ", ".join(f"{n} ({self.types.get(n, '?')})" for n in self.sources[:10])
                         + (f", ... ({len(self.sources)} in all)" if len(self.sources) > 10 else ""))
        return "\n".join(map(printable, lines))    # a name from the dump never starts a line of its own


def _fmt(v) -> str:
    return f"{v:.9g}" if isinstance(v, float) else str(v)


def compare_runs(dump_a, dump_b, *, force: bool = False) -> RunDiff:
    """Compare two emulated runs of the same model and inputs bit for bit, op by op.

    Parameters
    ----------
    dump_a, dump_b : str, os.PathLike or Dump
        Dumps of two runs (replays, or the same training step of two trainings).
    force : bool
        Compare even if the manifests say the models or inputs differ.

    Returns
    -------
    RunDiff
    """
    from .compare import mismatch_reasons

    a, b = load_dump(dump_a), load_dump(dump_b)
    bad = mismatch_reasons(a, b)
    if bad and not force:
        raise AscendEmuError(f"refusing to compare runs of {'; '.join(bad)} ({a.path}, {b.path}); random-error "
                             "detection compares two runs of one model on the same inputs, or pass --force "
                             "(force=True) to compare anyway")
    if a.ops and b.ops and not any(op["name"] in b for op in a.ops):
        # else "identical: all 0 ops hold the same bytes": dumps of two different models are not two runs
        raise AscendEmuError(f"dumps {a.path} and {b.path} have no op name in common (different models? "
                             f"{a.model.get('name')!r} vs {b.model.get('name')!r}); compare two runs of the same "
                             "model, or a replay with its reference")
    same: dict[str, bool | None] = {}
    res = RunDiff(a.path, b.path, 0)
    state = set(a.state_inputs) if a.state_inputs == b.state_inputs else set()
    for op in a.ops:
        if op["name"] not in b:
            continue
        bop = b.op(op["name"])
        res.compared += 1
        flags = [_same_output(a, b, op, bop, k) for k in range(len(op["outputs"]))]
        for k, s in enumerate(flags):
            same[f"{op['name']}:{k}"] = s
        if any(s is None for s in flags) and not any(s is False for s in flags):
            res.unknown += 1
        if not any(s is False for s in flags):
            continue
        res.differing.append(op["name"])
        res.types[op["name"]] = op["tf_type"]
        if op["name"] in state:       # where the steps start (the runs' states), not where they part
            res.state.append(op["name"])
            continue
        ins = [same.get(r if ":" in r else r + ":0") for r in op.get("inputs", [])]
        inputs_identical = all(s is True for s in ins) if ins else True
        if inputs_identical:
            res.sources.append(op["name"])
        if res.first is None:
            k = next(i for i, s in enumerate(flags) if s is False)
            metrics = {}
            if a.has_tensor(op["name"], k) and b.has_tensor(bop["name"], k):
                ta, tb = a.tensor(op["name"], k), b.tensor(bop["name"], k)
                if ta.size == tb.size and ta.dtype.kind in "fiub" and tb.dtype.kind in "fiub":
                    m = tensor_metrics(np.asarray(ta), np.asarray(tb))
                    metrics = {c: m[c] for c in ("Cosine", "MaxAbsErr", "MaxRelativeErr", "MeanAbsErr")
                               if c in m}
            res.first = {"name": op["name"], "tf_type": op["tf_type"], "phase": op.get("phase"),
                         "index": op["index"], "output": k, "source": inputs_identical,
                         "inputs_identical": inputs_identical, "metrics": metrics}
    return res


def output_spread(values: list) -> dict:
    """How far N runs' values of one tensor (or loss) spread: ``{"runs", "max_abs", "max_rel", "std"}``
    (max over elements of max - min across runs; that divided by max |value|; the largest per-element
    standard deviation across runs)."""
    arr = np.stack([np.asarray(v, dtype=np.float64).reshape(-1) for v in values])
    with np.errstate(invalid="ignore"):
        rng = np.nanmax(arr, axis=0) - np.nanmin(arr, axis=0) if arr.size else np.zeros(0)
        scale = float(np.nanmax(np.abs(arr))) if arr.size else 0.0
        mx = float(np.nanmax(rng)) if rng.size else 0.0
        std = float(np.nanmax(arr.std(axis=0))) if arr.size else 0.0
    return {"runs": int(arr.shape[0]), "max_abs": mx, "max_rel": mx / scale if scale else 0.0, "std": std}


def _loss_plot(runs: list) -> str:
    from matplotlib.figure import Figure

    from .report import _png

    fig = Figure(figsize=(11, 7))
    ax1, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    base = runs[0]["losses"]
    for r in runs:
        xs = list(range(len(r["losses"])))
        ax1.plot(xs, r["losses"], "-o", ms=2, label=f"run seed {r['run_seed']}")
        d = [abs(v - w) if math.isfinite(v) and math.isfinite(w) else math.nan for v, w in zip(r["losses"], base)]
        if r is not runs[0]:
            ax2.plot(xs, [max(v, 1e-12) for v in d], "-", label=f"|run {r['run_seed']} - run {runs[0]['run_seed']}|")
    ax1.set_ylabel("loss")
    ax1.legend(fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("|loss difference| (log; 1e-12 = equal)")
    ax2.set_xlabel("step")
    if len(runs) > 1:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def write_runs_report(result: dict, path) -> str:
    """Write the HTML report of a random-error detection (``RandomErrors.to_json()``): the verdict, the
    first differing op and the sources, the spread of the final output (or loss), every run's loss
    curve when they trained, and the configuration. Returns ``path``."""
    from .report import _e, _flat, _img, _page, _table

    path = check_writable(path, "report")
    runs = result.get("runs") or []
    title = f"ascend-emu random-error detection: {result.get('model', 'model')}"
    parts = _page(title)
    first = result.get("first")
    rows = [("runs", len(runs)), ("run seeds", ", ".join(str(r["run_seed"]) for r in runs)),
            ("deterministic level", result.get("deterministic_level")), ("mode", result.get("mode")),
            ("verdict", "identical: every run dumped the same bytes" if result.get("identical")
             else "the runs differ")]
    if first:
        where = f"step {first['step']}, " if first.get("step") is not None else ""
        rows.append(("first difference", f"{where}op {first['name']} ({first['tf_type']}"
                     + (f", phase {first['phase']}" if first.get("phase") else "") + "): "
                     + ("source (identical inputs)" if first["source"] else "propagates (inputs differed)")))
    rows.append(("ops that differ", result.get("differing_ops", 0)))
    for key, label in (("output_spread", "final output spread"), ("loss_spread", "final loss spread")):
        s = result.get(key)
        if s:
            rows.append((label, f"max |a - b| {s['max_abs']:.6g}, relative {s['max_rel']:.3g}, "
                                f"std {s['std']:.3g} over {s['runs']} runs"))
    parts.append('<section id="summary"><h2>Summary</h2><table class="kv">'
                 + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows) + "</table></section>")
    srcs = result.get("sources") or []
    parts.append('<section id="sources"><h2>Sources of the difference</h2><p class="muted">Ops whose outputs '
                 'differ between runs although their inputs were identical: there the accumulation order '
                 'changed (NUMERICS.md section 11).</p>'
                 + (_table([{"op": s["name"], "type": s["tf_type"], "step": s.get("step", "-"),
                             "multi-core split": s.get("split", "-")} for s in srcs],
                           ["op", "type", "step", "multi-core split"]) if srcs else "<p>None.</p>") + "</section>")
    if runs and runs[0].get("losses"):
        parts.append('<section id="curves"><h2>Loss of every run</h2>'
                     + _img(_loss_plot(runs), "loss of every run per step") + "</section>")
    crow = [{"setting": k, "value": v} for k, v in sorted(_flat("", result.get("config") or {}, {}).items())]
    parts.append('<section id="config"><h2>Configuration</h2>' + _table(crow, ["setting", "value"]) + "</section>")
    parts.append("</body></html>\n")
    return atomic_write_text(path, "\n".join(parts))

"""The mixlist search's core (:mod:`ascend_emu.tools.mixlist_search`): targets, the result, the ranking of op
types from one op-by-op comparison (worker side: :func:`op_analysis`), and the greedy-add-then-prune loop
(:func:`_search`) that replay and training searches share."""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import AscendEmuError


TARGET_METRICS = ("cosine", "max_rel_err", "max_abs_err", "rmse")


#: targets on a training's loss curve against the float32 reference training (``data=`` given)
TRAIN_METRICS = ("loss_rel_err", "loss_abs_err")


#: the denominator of loss_rel_err where the reference loss is 0
TINY = 1e-30


MIXED_MODES = ("allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16")


#: candidates tried side by side per greedy step
DEFAULT_BEAM = 4


#: relative L2 error above which an op counts as divergent (fp16 rounding alone gives ~3e-4)
DIVERGENT = 1e-2


BY_NAME_REFUSAL = ("--by name: CANN's modify_mixlist (ops_info.json) lists op types only, so a list of op "
                   "names cannot be written in it; CANN takes names only through ATC/AOE --keep_dtype (inference "
                   "builds; replay --keep-dtype FILE emulates it), and the search does not write such a file yet; "
                   "use --by type, or list the names in a --keep-dtype file yourself")


_TARGET = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|>|<)\s*([-+0-9.eE]+|inf)\s*$")


@dataclass(frozen=True)
class Target:
    """An accuracy target on the model's outputs against the float32 reference: ``metric op value``."""

    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text) -> "Target":
        if isinstance(text, Target):
            return text
        m = _TARGET.match(str(text))
        if not m:
            raise AscendEmuError(f"target {text!r}: write it as METRIC>=VALUE or METRIC<=VALUE, e.g. "
                                 "\"cosine>=0.999\" or \"max_rel_err<=0.01\"")
        metric, op, v = m.group(1), m.group(2), m.group(3)
        if metric not in TARGET_METRICS + TRAIN_METRICS:
            raise AscendEmuError(f"target {text!r}: unknown metric {metric!r}; choose one of: "
                                 f"{', '.join(TARGET_METRICS + TRAIN_METRICS)}")
        try:
            value = float(v)
        except ValueError:
            raise AscendEmuError(f"target {text!r}: {v!r} is not a number") from None
        higher = metric == "cosine"
        if higher != (op in (">=", ">")):
            want = ">= or >" if higher else "<= or <"
            raise AscendEmuError(f"target {text!r}: {metric} is {'higher' if higher else 'lower'} when better; "
                                 f"use {want}")
        if not math.isfinite(value) or (metric == "cosine" and not -1 <= value <= 1) or \
                (metric != "cosine" and value < 0):
            raise AscendEmuError(f"target {text!r}: {value} is out of range for {metric}")
        return cls(metric, op, value)

    def met(self, metrics: dict) -> bool:
        v = metrics[self.metric]
        if math.isnan(v):
            return False
        return {">=": v >= self.value, ">": v > self.value, "<=": v <= self.value, "<": v < self.value}[self.op]

    def better(self, a: dict, b: dict) -> bool:
        """``a`` strictly better than ``b`` on this target's metric (nan is the worst)."""
        x, y = a[self.metric], b[self.metric]
        if math.isnan(x):
            return False
        if math.isnan(y):
            return True
        return x > y if self.metric == "cosine" else x < y

    def __str__(self):
        return f"{self.metric}{self.op}{self.value:.10g}"


@dataclass
class Step:
    """One step of the search: what changed, the list after it, the metric, the replays it took."""

    action: str           # "baseline", "add T", "remove T"
    black: tuple          # types added to the black list after this step
    metrics: dict
    met: bool
    replays: int
    tried: list = field(default_factory=list)   # [(type, metric value)] of a greedy step's candidates


@dataclass
class MixlistResult:
    """What :func:`mixlist_search` found."""

    model: str
    target: Target
    precision_mode: str
    base_mixlist: dict
    steps: list = field(default_factory=list)
    black: list = field(default_factory=list)      # op types added to the black list (1-minimal if met)
    met: bool = False
    replays: int = 0
    cost: dict = field(default_factory=dict)
    baseline_metrics: dict = field(default_factory=dict)
    final_metrics: dict = field(default_factory=dict)
    ranking: list = field(default_factory=list)    # the baseline's ranking: [(type, score, first op)]
    scheduler: str = "none"
    #: training searches: the float32 reference training's loss per step (None: a replay search)
    reference_losses: list | None = None
    #: what computed the float32 reference: TensorFlow, or onnxruntime for an ONNX model
    reference: str = "TensorFlow"

    def ops_info(self) -> dict:
        """The CANN modify_mixlist (ops_info.json) content: the user's edits plus the found black-list types."""
        return merge_mixlist(self.base_mixlist, self.black)

    def write(self, path) -> str:
        from ..fileio import atomic_write_text

        atomic_write_text(path, json.dumps(self.ops_info(), indent=2) + "\n")
        return os.fspath(path)

    def to_json(self) -> dict:
        return {"model": self.model, "target": str(self.target), "precision_mode": self.precision_mode,
                "met": self.met, "black_list_added": list(self.black), "replays": self.replays,
                "cost": self.cost, "baseline": self.baseline_metrics, "final": self.final_metrics,
                "ranking": [list(r) for r in self.ranking], "scheduler": self.scheduler,
                "steps": [{"action": s.action, "black": list(s.black), "metrics": s.metrics, "met": s.met,
                           "replays": s.replays, "tried": [list(t) for t in s.tried]} for s in self.steps],
                "ops_info": self.ops_info(),
                **({"reference_losses": self.reference_losses} if self.reference_losses is not None else {})}

    def format_text(self) -> str:
        m = self.target.metric
        what = (f"loss of {len(self.reference_losses)} training steps against the float32 TensorFlow training"
                if self.reference_losses is not None else f"outputs against the {self.reference} float32 reference")
        out = [f"mixlist-search {self.model}: precision_mode {self.precision_mode}, target {self.target} on the "
               f"{what}", ""]
        if self.ranking:
            out.append("ranking of the baseline (first divergent op's type first, then by error growth):")
            for t, score, op in self.ranking[:8]:
                out.append(f"  {t:<24} growth {score:<10.3g} at {op}")
            out.append("")
        out.append(f"{'step':<5} {'action':<32} {m:<16} {'target':<7} {'replays':<8} black list added")
        for i, s in enumerate(self.steps):
            out.append(f"{i:<5} {s.action:<32} {_fmt(s.metrics[m]):<16} {'met' if s.met else '-':<7} "
                       f"{s.replays:<8} {', '.join(s.black) or '-'}")
        out.append("")
        c = self.cost
        if self.met:
            out.append(f"black-list: {', '.join(self.black) if self.black else 'nothing (the target already holds)'}"
                       f"{' (1-minimal: removing any one misses the target)' if len(self.black) else ''}")
            out.append(f"cost: {c.get('ops_moved', 0)} of {c.get('ops_fp16', 0)} reduced-precision ops now run in "
                       f"float32, {100 * c.get('flops_share', 0.0):.2f}% of the model's FLOPs "
                       f"({c.get('flops_moved', 0):.3g} of {c.get('flops_total', 0):.3g})")
        else:
            out.append(f"target {self.target} not met: best {m} {_fmt(self.final_metrics.get(m, math.nan))} with "
                       f"{', '.join(self.black) or 'nothing'} black-listed")
        out.append(f"{'training runs' if self.reference_losses is not None else 'replays'}: {self.replays} "
                   f"(scheduler {self.scheduler})")
        return "\n".join(out)


def _fmt(v) -> str:
    # 10 digits: a cosine target such as 0.9999999 needs them
    return "nan" if isinstance(v, float) and math.isnan(v) else (f"{v:.10g}" if isinstance(v, float) else str(v))


def merge_mixlist(base: dict, black) -> dict:
    """``base`` (a modify_mixlist dict) with every type of ``black`` in black-list.to-add and nowhere else."""
    out: dict = {}
    black = list(black)
    for key, entry in (base or {}).items():
        new = {a: [n for n in names if n not in black] for a, names in entry.items()}
        new = {a: names for a, names in new.items() if names}
        if new:
            out[key] = new
    if black:
        bl = out.setdefault("black-list", {})
        bl["to-add"] = sorted(set(bl.get("to-add", [])) | set(black))
    return out


def _rel_err(n, b) -> float:
    """||n - b|| / ||b|| in float64; an inf/nan on one side only is infinite error."""
    n = np.asarray(n, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if n.size != b.size:
        return math.nan
    if n.size == 0:
        return 0.0
    fn, fb = np.isfinite(n), np.isfinite(b)
    same = (~fn & ~fb) & ((n == b) | (np.isnan(n) & np.isnan(b)))
    if ((~fn | ~fb) & ~same).any():
        return math.inf
    d = np.where(same, 0.0, n - b)
    bb = np.where(same, 0.0, b)
    return float(np.linalg.norm(d) / max(np.linalg.norm(bb), 1e-30))


def _flops(rec, tensors, out) -> float:
    """Estimated FLOPs of one op: 2*outputs*K for cube ops, else one per element of its largest tensor."""
    from ..ops import CUBE, OPS

    ins = [np.shape(tensors[i]) for i in rec.inputs if i in tensors]
    osz = float(np.prod(np.shape(out))) if out is not None else 0.0
    opdef = OPS.get(rec.tf_type)
    if opdef is not None and opdef.kind == CUBE and len(ins) >= 2:
        a, w = ins[0], ins[1]
        if "Conv" in rec.tf_type and len(w) == 4:
            k = w[0] * w[1] * (w[2] if w[3] == (np.shape(out) or [0])[-1] else 1)
        elif len(a) >= 1 and len(w) >= 2:
            k = a[-1] if a[-1] in (w[-2], w[-1]) else (a[-2] if len(a) >= 2 else a[-1])
        else:
            k = 1
        return 2.0 * osz * float(k)
    return max([osz] + [float(np.prod(s)) for s in ins])


def op_analysis(res, ctx) -> dict:
    """Per AI Core op of a replay: name, Ascend type, compute dtype, FLOPs, output error, error growth.

    Runs where the replay ran (a worker); returns plain lists (a few numbers per op).
    """
    ref = ctx.ref_tensors or {}
    errs: dict = {}

    def err(t):
        if t not in errs:
            n, b = res.tensors.get(t), ref.get(t)
            ok = n is not None and b is not None and np.asarray(n).dtype.kind == "f" or \
                (n is not None and np.asarray(n).dtype.name == "bfloat16")
            errs[t] = _rel_err(n, b) if ok and b is not None else None
        return errs[t]

    ops = []
    for r in res.records:
        if r.engine != "AICORE" or r.inserted or (r.precision or {}).get("exact"):
            continue        # (an exact op, which no list changes: an exported program's window maximum)
        out_name = f"{r.name}:0"
        out = res.tensors.get(out_name)
        e_out = err(out_name)
        e_in = [e for e in (err(i) for i in r.inputs) if e is not None and not math.isnan(e)]
        worst_in = max(e_in, default=0.0)
        if e_out is None or math.isnan(e_out):
            growth = 0.0
        elif math.isinf(e_out):
            growth = 0.0 if math.isinf(worst_in) else math.inf
        else:
            growth = e_out - (0.0 if math.isinf(worst_in) else worst_in)
        ops.append([r.name, r.ascend_type, r.compute_dtype, _flops(r, res.tensors, out),
                    e_out if e_out is not None else math.nan, growth])
    return {"ops": ops}


def rank(analysis: dict, exclude=()) -> list:
    """[(type, score, op)] of the op types that ran in reduced precision, best candidate first."""
    best: dict = {}
    first = None
    for name, typ, dtype, _fl, e_out, growth in analysis["ops"]:
        if dtype not in ("float16", "bfloat16") or typ in exclude:
            continue
        if first is None and not math.isnan(e_out) and e_out > DIVERGENT:
            first = (typ, name)
        if typ not in best or growth > best[typ][0]:
            best[typ] = (growth, name)
    order = sorted(best, key=lambda t: (-best[t][0] if not math.isnan(best[t][0]) else math.inf, t))
    if first is not None:
        order.remove(first[0])
        order.insert(0, first[0])
    return [(t, best[t][0], first[1] if first and t == first[0] else best[t][1]) for t in order]


def _cost(base: dict, final: dict) -> dict:
    reduced = {n for n, _t, d, _f, _e, _g in base["ops"] if d in ("float16", "bfloat16")}
    now = {n: d for n, _t, d, _f, _e, _g in final["ops"]}
    flops = {n: f for n, _t, _d, f, _e, _g in base["ops"]}
    moved = sorted(n for n in reduced if now.get(n) not in (None, "float16", "bfloat16"))
    total = float(sum(flops.values()))
    fm = float(sum(flops[n] for n in moved))
    return {"ops_moved": len(moved), "ops_fp16": len(reduced), "flops_moved": fm, "flops_total": total,
            "flops_share": fm / total if total else 0.0, "moved": moved}


def memoized(run):
    """``evaluate(sets)`` for :func:`_search` from ``run(todo) -> results``: each distinct set of added types
    runs once (``todo``: sorted tuples, in first-asked order); returns (one result per set, runs made)."""
    seen: dict = {}

    def evaluate(sets) -> tuple:
        todo = list(dict.fromkeys(tuple(sorted(frozenset(s))) for s in sets if frozenset(s) not in seen))
        for t, r in zip(todo, run(todo)):
            seen[frozenset(t)] = r
        return [seen[frozenset(s)] for s in sets], len(todo)

    return evaluate


def _search(res: MixlistResult, evaluate, target: Target, black0, beam: int, max_steps: int) -> None:
    """Baseline, rank, greedy add, prune to 1-minimal: the search proper, whatever an evaluation is.

    ``evaluate(sets)`` -> (results, evaluations run) (:func:`memoized`): one result per set of added types,
    each with ``metrics`` (the target's metric among them) and ``analysis`` (:func:`op_analysis`'s per-op
    rows); ``black0`` the types already black-listed. Fills ``res`` (steps, ranking, black, met, final
    metrics, cost).
    """
    (r0,), n = evaluate([()])
    baseline = r0.analysis
    res.baseline_metrics = r0.metrics
    res.ranking = rank(baseline, exclude=black0)
    res.steps.append(Step("baseline", (), r0.metrics, target.met(r0.metrics), n))
    chosen: list = []
    current = r0
    for _ in range(max_steps):
        if target.met(current.metrics):
            break
        cands = [t for t, _s, _o in rank(current.analysis, exclude=set(chosen) | set(black0))]
        if not cands:
            break
        cands = cands[:beam]
        runs, n = evaluate([tuple(chosen) + (t,) for t in cands])
        # the best-ranked candidate that improves the metric, else the one with the best metric: the
        # ranking says where the error enters, and preferring the best metric, or the first candidate
        # that meets the target, favours the cube types, which put everything after them in fp32 (on
        # the planted test model: MatMulV2, 99.9% of the FLOPs, instead of three vector types, 1.6%)
        best = next((i for i, r in enumerate(runs) if target.better(r.metrics, current.metrics)), None)
        if best is None:
            best = 0
            for i in range(1, len(runs)):
                if target.better(runs[i].metrics, runs[best].metrics):
                    best = i
        chosen.append(cands[best])
        current = runs[best]
        res.steps.append(Step(f"add {cands[best]}", tuple(chosen), current.metrics, target.met(current.metrics),
                              n, [(t, r.metrics[target.metric]) for t, r in zip(cands, runs)]))
    res.met = target.met(current.metrics)
    if res.met and chosen:
        # prune to 1-minimal: drop a type whose removal keeps the target, the most expensive first
        flops_of = {}
        for _n, typ, dtype, fl, _e, _g in baseline["ops"]:
            if dtype in ("float16", "bfloat16"):
                flops_of[typ] = flops_of.get(typ, 0.0) + fl
        while chosen:
            order = sorted(chosen, key=lambda t: (-flops_of.get(t, 0.0), t))
            runs, n = evaluate([tuple(x for x in chosen if x != t) for t in order])
            drop = next((i for i, r in enumerate(runs) if target.met(r.metrics)), None)
            if drop is None:
                res.steps.append(Step("prune: every removal misses", tuple(chosen), current.metrics, True, n,
                                      [(t, r.metrics[target.metric]) for t, r in zip(order, runs)]))
                break
            chosen.remove(order[drop])
            current = runs[drop]
            res.steps.append(Step(f"remove {order[drop]}", tuple(chosen), current.metrics, True, n,
                                  [(t, r.metrics[target.metric]) for t, r in zip(order, runs)]))
    res.black = sorted(chosen)
    res.final_metrics = current.metrics
    res.cost = _cost(baseline, current.analysis)


def _copy_device(device):
    import copy

    d = copy.copy(device)
    d._fusion_cache = {}
    return d


def _base_mixlist(device) -> dict:
    """The user's modify_mixlist edits of ``device``, as a modify_mixlist dict.

    Rebuilt from the difference between the device's lists and the built-in ones: a type now in a
    list it was not in is in that list's ``to-add``; a built-in white or black type now gray is in its
    list's ``to-remove`` (which moves it to gray, ASCEND-FACTS section 1). Applying the result to the
    built-in lists gives the device's lists again.
    """
    from ..npu.precision import MixLists

    d, now = MixLists.default(), device.precision.lists
    out: dict = {}
    for key, was, cur in (("white-list", d.white, now.white), ("black-list", d.black, now.black)):
        add, rem = sorted(cur - was), sorted(was - cur - (now.white | now.black))
        entry = {k: v for k, v in (("to-add", add), ("to-remove", rem)) if v}
        if entry:
            out[key] = entry
    return out

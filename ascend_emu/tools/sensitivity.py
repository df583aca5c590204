"""``sensitivity``: does a conclusion of the emulator hold whatever the assumed parameters are?

The model is replayed under the device's own values of the assumed parameters
(:data:`ascend_emu.numerics.assumptions.ASSUMED`), then under each other candidate value of each one, one at
a time (a parameter active only under another's value, such as ``cube_extra_bits`` under
``cube_block_sum=aligned``, is varied with that value set), and under two joint corners (every parameter at
its first other candidate; every one at its last). Every variant is compared with the float32 TensorFlow
reference exactly as ``compare`` and ``overflow`` do, and each conclusion those tools draw is checked
across the variants:

- ``first_divergent``: the first divergent op (``compare``);
- ``first_overflow``: the first overflowing op and its verdict (``overflow``);
- ``output_cosine``: the final outputs' cosine against the reference (robust when its band across the
  variants is within ``cosine_tol``);
- ``float_status``: the float status register at the end of the run.

A conclusion that moves names the parameters (and values) whose variants move it. The variants run on the
sweep layer (:mod:`ascend_emu.tools.sweep`). ``dump``: the NPU dump whose conclusions these are; the result
is written beside it as ``<dump>.sensitivity.json``, where ``compare`` and ``report`` find it.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field

from ..errors import AscendEmuError
from ..analysis.robustness import ORDER, robust_line, sidecar
from ..numerics import assumptions as _asm
from ..npu.precision import HIF8_MODES

CONCLUSIONS = ORDER[:4]


def variants(policy, names=None, hif8: bool = False) -> list:
    """[(label, {parameter: value}, the parameters it varies)]: the default, each other value of each
    parameter one at a time, then the two corners. Parameters that cannot act on this device (HF32 off; a
    family's HF32 tie rule where the family has no HF32 or ``hf32_rounding`` overrides it; HiFloat8 casts
    outside cube_hif8 / mixed_hif8 (``hif8``); multi-core splits of a deterministic run; the torch eager path's
    parameters, which a graph replay never reads) are left out."""
    cur = _asm.current(policy)
    skip = {a.name for a in _asm.ASSUMED if a.family == _asm.TORCH}
    if not policy.allow_hf32:
        skip.add("hf32_bits")
    for fam in ("conv", "matmul"):
        # a family without HF32, or every family's rule overridden by --hf32-rounding
        if fam not in policy.allow_hf32 or policy.hf32_rounding is not None:
            skip.add(f"hf32_{fam}_rounding")
    if not hif8:
        skip.add("hif8_rounding")
    if policy.deterministic_level != 0:
        skip.add("multicore_reduce_min_chunk")
    ps = [a for a in _asm.ASSUMED if (names is None or a.name in names) and a.name not in skip]
    out = [("default", {}, ())]
    for a in ps:
        for v in a.tried():
            if v == cur[a.name]:
                continue
            params = {a.name: v}
            label = f"{a.name}={v}"
            if a.active and cur[a.active[0]] != a.active[1]:
                params[a.active[0]] = a.active[1]
                label += f" (with {a.active[0]}={a.active[1]})"
            out.append((label, params, (a.name,)))
    for label, pick in (("corner: first alternatives", 0), ("corner: last alternatives", -1)):
        params = {}
        for a in ps:
            others = [v for v in a.tried() if v != cur[a.name]]
            if others:
                params[a.name] = others[pick]
        if params:
            out.append((label, params, tuple(params)))
    return out


@dataclass
class SensitivityResult:
    model: str
    variants: list
    conclusions: dict
    ops: list = field(default_factory=list)
    inputs_sha256: str | None = None
    skipped: list = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    #: the model's fingerprint: with the inputs hash, what ties the result to the dump it is kept beside
    model_fingerprint: str | None = None

    def to_json(self) -> dict:
        return {"model": self.model, "model_fingerprint": self.model_fingerprint,
                "inputs_sha256": self.inputs_sha256, "variants": self.variants,
                "conclusions": self.conclusions, "parameters": self.parameters, "ops": self.ops,
                "not_varied": self.skipped}

    def robust_line(self) -> str:
        return robust_line(self.to_json())

    def format_text(self) -> str:
        lines = [f"sensitivity of {self.model}: {len(self.variants)} variants of the assumed parameters", ""]
        for name, c in self.conclusions.items():
            head = f"{name:<16} {'ROBUST' if c['robust'] else 'MOVES':<7} default: {_show(c['default'])}"
            lines.append(head)
            for m in c.get("moved_by", []):
                lines.append(f"{'':<24}{m['variant']}: {_show(m['value'])}")
        lines.append("")
        for name, p in self.parameters.items():
            what = ", ".join(p["moves"]) or "no conclusion"
            if "max_loss_rel_shift" in p:
                lines.append(f"{name:<28} moves: {what}; largest relative loss shift {p['max_loss_rel_shift']:.3g}")
            else:
                lines.append(f"{name:<28} moves: {what}; largest op cosine shift {p['max_op_cosine_shift']:.3g}, "
                             f"{p['ops_changed']} op(s) changed")
        if self.skipped:
            lines.append("not varied (cannot act on this device): " + ", ".join(self.skipped))
        lines.append(self.robust_line())
        return "\n".join(lines)


def _show(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k}={_show(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _first_output_cosines(cmp) -> dict:
    out: dict = {}
    for r in cmp.rows:
        name, c = r.get("NPU Name"), r.get("Cosine")
        if isinstance(name, str) and isinstance(c, float) and ":" in name:
            op = name.rsplit(":", 1)[0]
            out.setdefault(op, c)
    return out


def _analyse(dump_dir: str, ref_dir: str, metrics: dict, status: int) -> dict:
    from ..analysis.compare import compare
    from ..analysis.overflow import overflow_report

    cmp = compare(dump_dir, ref_dir)
    first = cmp.first_divergent()
    ovf = overflow_report(dump_dir)
    fo = None
    if ovf.first is not None:
        fo = {"op": ovf.first.get("name"), "verdict": (ovf.first.get("verdict") or {}).get("verdict")}
    cos = metrics.get("cosine")
    return {"first_divergent": first.name if first is not None else None, "first_overflow": fo,
            "output_cosine": None if cos is None or math.isnan(cos) else cos, "float_status": f"0x{status:x}",
            "op_cosine": _first_output_cosines(cmp)}


def sensitivity(model, inputs=None, *, device=None, device_kwargs=None, signature=None, shapes=None, seed: int = 0,
                params=None, dump=None, json_path=None, report=None, cosine_tol: float = 1e-3,
                keep_dumps=None, overwrite: bool = False, progress: bool = True, scheduler="none",
                n_workers: int | None = None, data=None, steps: int | None = None, loss_tol: float = 1e-3,
                **train) -> SensitivityResult:
    """Replay ``model`` under every variant of the assumed parameters and say which conclusions hold.

    ``device`` / ``device_kwargs``: the run's configuration (its assumed values are the default variant);
    ``params``: the parameter names to vary (default all); ``dump``: the NPU dump of this run whose
    conclusions are checked (the JSON goes beside it, ``<dump>.sensitivity.json``; without ``device``, the
    configuration keywords ``device_kwargs`` leaves out are the ones its manifest records); ``json_path``, ``report``:
    also write the JSON / the HTML report there; ``keep_dumps``: keep each variant's dump (and the
    reference's) under this directory (dumps of an earlier run there are replaced only with ``overwrite``). ``data`` and ``steps`` (and ``train``: ``loss``, ``optimizer``,
    ``learning_rate``, ``batch_size``, ``loss_scale``, ``shuffle``): train every variant instead
    (:mod:`ascend_emu.tools.sensitivity_train`; the loss curve is robust within ``loss_tol``, relative).
    Returns a :class:`SensitivityResult`.
    """
    from ..fileio import atomic_write_text, make_output_dir
    from ..frontend.inputs import inputs_sha256, make_inputs
    from ..frontend.tf.loader import load_graph
    from ..frontend.tf.reference import reference
    from ..graph.core import Graph
    from .fit import variant
    from .sweep import (ReplayTask, Sweep, SweepContext, check_scheduler, flat_outputs, raise_failures, remember,
                        sweep_device)

    scheduler = check_scheduler(scheduler)
    if not (isinstance(cosine_tol, (int, float)) and cosine_tol >= 0):
        raise AscendEmuError(f"cosine_tol must be a number >= 0, got {cosine_tol!r}")
    if dump is not None and device is None and "device" not in (device_kwargs or {}):
        from ..analysis.dump import load_dump

        from .fit import adopt_configuration

        # the options not given are the dump's own (its conclusions are about its configuration)
        device_kwargs = adopt_configuration(load_dump(dump).config, dict(device_kwargs or {}), device_kwargs or ())[0]
    device = sweep_device(device, device_kwargs)
    for n in params or ():
        _asm.assumed(n)
    if data is not None or steps is not None or train:
        if dump is not None or keep_dumps is not None:
            raise AscendEmuError("sensitivity of a training keeps no dumps: drop --dump and --keep-dumps")
        return _sensitivity_train(model, data, steps, train, device, params, seed, json_path, report, loss_tol,
                                  progress, scheduler, n_workers)
    if dump is not None:
        from ..analysis.dump import load_dump

        from .fit import refuse_other_configuration

        # a missing or broken dump fails before the slow part
        refuse_other_configuration(dump, load_dump(dump).config, device, "sensitivity")
    if keep_dumps is not None:
        make_output_dir(keep_dumps, "--keep-dumps")
        there = sorted(n for n in os.listdir(keep_dumps) if n == "reference" or n.startswith("variant-"))
        if there and not overwrite:
            raise AscendEmuError(f"--keep-dumps {os.fspath(keep_dumps)} already holds the dumps of an earlier run "
                                 f"({', '.join(there[:3])}{', ...' if len(there) > 3 else ''}); pass --overwrite "
                                 "(overwrite=True) to replace them, or give another directory")
    work = os.fspath(keep_dumps) if keep_dumps is not None else tempfile.mkdtemp(prefix="ascend-emu-sensitivity-")
    try:
        with Sweep(scheduler, n_workers=n_workers, progress=progress, desc="sensitivity") as sweep:
            graph = model if isinstance(model, Graph) else load_graph(model, signature=signature, input_shapes=shapes)
            if isinstance(inputs, (list, tuple)) and not inputs:
                inputs = None
            feeds = make_inputs(graph, inputs, seed=seed, shapes=shapes)
            ref_dir = os.path.join(work, "reference")
            ref = reference(graph, feeds, dump_dir=ref_dir, overwrite=True, progress=False)
            bench = flat_outputs(ref.outputs[t] for t in graph.outputs)
            path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
            ctx = SweepContext(path or graph, graph.fingerprint, feeds, bench, signature=signature, shapes=shapes)
            remember(graph, ctx)
            vs = variants(device.numerics, params, device.precision.mode in HIF8_MODES)
            tasks = [ReplayTask(label, variant(device, p), os.path.join(work, f"variant-{i}"))
                     for i, (label, p, _) in enumerate(vs)]
            runs = sweep.run(ctx, tasks)
            raise_failures(runs)
        rows = []
        for (label, p, varied), r in zip(vs, runs):
            a = _analyse(r.dump, ref_dir, r.metrics, r.float_status)
            rows.append({"label": label, "params": {**_asm.current(device.numerics), **p},
                         "varies": list(varied), **a})
    finally:
        if keep_dumps is None:
            shutil.rmtree(work, ignore_errors=True)
    conclusions = _conclusions(rows, cosine_tol)
    ops = _op_bands(rows)
    skipped = [a.name for a in _asm.ASSUMED if (params is None or a.name in params)
               and not any(a.name in v[2] for v in vs)]
    res = SensitivityResult(graph.name, [{k: v for k, v in r.items() if k != "op_cosine"} for r in rows],
                            conclusions, ops, inputs_sha256(feeds), skipped, _per_parameter(rows, conclusions, skipped),
                            model_fingerprint=graph.fingerprint)
    text = json.dumps(res.to_json(), indent=1, sort_keys=True) + "\n"
    if dump is not None:
        atomic_write_text(sidecar(dump), text)
    if json_path is not None:
        atomic_write_text(json_path, text)
    if report is not None:
        from ..analysis.sensitivity_report import write_sensitivity_report

        write_sensitivity_report(res.to_json(), report)
    return res


def _per_parameter(rows: list, conclusions: dict, skipped: list) -> dict:
    """Per varied parameter (one-at-a-time variants only): the conclusions it moves, how many ops' cosine
    against the reference it changes and by how much at most."""
    base = rows[0]["op_cosine"]
    out: dict = {}
    for r in rows[1:]:
        if r["label"].startswith("corner"):
            continue
        name = r["label"].split("=", 1)[0]
        p = out.setdefault(name, {"moves": [], "max_op_cosine_shift": 0.0, "ops_changed": 0, "_ops": set()})
        for op, c in r["op_cosine"].items():
            b = base.get(op)
            if isinstance(b, float) and isinstance(c, float) and (c != b) and not (math.isnan(c) and math.isnan(b)):
                p["_ops"].add(op)
                d = abs(c - b)
                if math.isfinite(d):
                    p["max_op_cosine_shift"] = max(p["max_op_cosine_shift"], d)
        for cname, c in conclusions.items():
            if any(m["variant"] == r["label"] for m in c["moved_by"]) and cname not in p["moves"]:
                p["moves"].append(cname)
    for p in out.values():
        p["ops_changed"] = len(p.pop("_ops"))
    return out


def _conclusions(rows: list, cosine_tol: float) -> dict:
    base = rows[0]
    out = {}
    for name in CONCLUSIONS:
        vals = [r[name] for r in rows]
        if name == "output_cosine":
            finite = [v for v in vals if v is not None]
            lo, hi = (min(finite), max(finite)) if finite else (None, None)
            robust = len(finite) == len(vals) and (hi - lo) <= cosine_tol
            moved = [r for r in rows[1:] if r[name] is None or base[name] is None
                     or abs(r[name] - base[name]) > cosine_tol]
            c = {"robust": robust, "default": base[name], "min": lo, "max": hi, "tolerance": cosine_tol}
        else:
            moved = [r for r in rows[1:] if r[name] != base[name]]
            c = {"robust": not moved, "default": base[name]}
        c["moved_by"] = [{"variant": r["label"], "parameters": r["varies"], "value": r[name]} for r in moved]
        out[name] = c
    return out


def _op_bands(rows: list) -> list:
    """Per op: its first output's cosine against the reference under the default, and its band across
    every variant."""
    names = list(rows[0]["op_cosine"])
    out = []
    for op in names:
        vals = [r["op_cosine"].get(op) for r in rows]
        finite = [v for v in vals if isinstance(v, float) and math.isfinite(v)]
        if not finite:
            continue
        worst = min(range(len(rows)), key=lambda i: vals[i] if isinstance(vals[i], float) else math.inf)
        out.append({"op": op, "default": vals[0], "min": min(finite), "max": max(finite),
                    "worst_variant": rows[worst]["label"]})
    return out


def _sensitivity_train(model, data, steps, train, device, params, seed, json_path, report, loss_tol, progress,
                       scheduler, n_workers) -> SensitivityResult:
    from ..fileio import atomic_write_text
    from .fit import variant
    from .sensitivity_train import TRAIN_OPTIONS, run_training, train_conclusions
    from .sweep import Sweep

    bad = sorted(set(train) - set(TRAIN_OPTIONS))
    if bad:
        raise AscendEmuError(f"unknown training option {bad[0]!r}; choose from: {', '.join(TRAIN_OPTIONS)}")
    if data is None or steps is None:
        raise AscendEmuError("sensitivity of a training needs both data (--data) and steps (--steps)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise AscendEmuError(f"steps must be a positive integer, got {steps!r}")
    if not (isinstance(loss_tol, (int, float)) and loss_tol >= 0):
        raise AscendEmuError(f"loss_tol must be a number >= 0, got {loss_tol!r}")
    vs = variants(device.numerics, params, device.precision.mode in HIF8_MODES)
    with Sweep(scheduler, n_workers=n_workers, progress=progress, desc="sensitivity") as sweep:
        rows = run_training(sweep, device, model, data, steps, seed, {k: v for k, v in train.items() if v is not None},
                            vs, variant)
    conclusions = train_conclusions(rows, loss_tol)
    per: dict = {}
    for r in rows[1:]:
        if r["label"].startswith("corner"):
            continue
        p = per.setdefault(r["label"].split("=", 1)[0], {"moves": [], "max_loss_rel_shift": 0.0})
        p["max_loss_rel_shift"] = max(p["max_loss_rel_shift"], r["loss_rel_shift"])
        for cname, c in conclusions.items():
            if any(m["variant"] == r["label"] for m in c["moved_by"]) and cname not in p["moves"]:
                p["moves"].append(cname)
    skipped = [a.name for a in _asm.ASSUMED if (params is None or a.name in params)
               and not any(a.name in v[2] for v in vs)]
    name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else str(getattr(model, "name", "model"))
    res = SensitivityResult(name, rows, conclusions, [], None, skipped, per)
    text = json.dumps(res.to_json(), indent=1, sort_keys=True) + "\n"
    if json_path is not None:
        atomic_write_text(json_path, text)
    if report is not None:
        from ..analysis.sensitivity_report import write_sensitivity_report

        write_sensitivity_report(res.to_json(), report)
    return res

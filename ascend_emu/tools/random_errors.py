"""Random-error detection: run a model N times with different run seeds and find where the runs part.

CANN's accuracy workflow (seed 001, step 6): "the calculation with the same inputs may produce
different outputs. ... perform training twice, collect the compute result (dump data) of each
operator, and compare the data to quickly locate the fishy operator". Here each run is the emulated
device with ``deterministic`` off and its own ``run_seed`` (NUMERICS.md section 11), dumping every op
(every step when training); the dumps of runs 2..N are compared with run 1's op by op, bit for bit
(:func:`ascend_emu.analysis.runs.compare_runs`). By default a run's dump holds each output's statistics and the
sha256 of its bytes (enough to compare bit for bit) and the tensors of a replay's final outputs; when the runs
part, the two runs of the first difference run again, dumping the tensors of that op and of its inputs (at that
step) beside the statistics. ``full_dumps`` keeps every tensor of every run instead. The result names the
first op that differs (the step and phase too when training), whether its inputs were identical (the op is
a source) or not (it propagates), every source with its multi-core split (:data:`ascend_emu.ops.multicore.MULTICORE_OPS`),
how many ops differ, and the spread of the final output or loss across runs.

:func:`run_once` is one run as a function of a plain task dict (model path or object, device options,
run seed, output directory) returning a small JSON-able summary, so a sweep can run the runs
elsewhere and :func:`summarize` can put their summaries together.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from ..analysis.runs import compare_runs, output_spread, write_runs_report
from ..errors import AscendEmuError
from ..fileio import make_output_dir
from ..ops.multicore import MULTICORE_OPS

#: Device options a task may carry (plain values only, so a task pickles / serialises)
DEVICE_OPTIONS = ("precision_mode", "overflow_mode", "modify_mixlist", "soc", "subnormals", "impl_mode",
                  "reduce_accumulate", "op_model", "fusion_switch", "aicpu_fallback", "deterministic",
                  "deterministic_level", "cube_model", "multicore", "precision_mode_v2", "allow_hf32",
                  "hf32_rounding", "hf32_bits", "hf32_conv_rounding", "hf32_matmul_rounding", "cce_ftz",
                  "hif8_rounding", "hif8_cube_out", "cube_mx", "fa_kv_block", "use_fp16_out", "compound_ops",
                  "float_status_clear")
#: the most runs one detection takes
MAX_RUNS = 10_000
#: options of a training run (Device.train's keywords)
TRAIN_OPTIONS = ("loss", "optimizer", "learning_rate", "optimizer_options", "batch_size", "steps", "epochs",
                 "loss_scale", "shuffle", "seed", "overflow_check")


def run_once(task: dict) -> dict:
    """One run of a random-error detection, a function of its task alone.

    Parameters
    ----------
    task : dict
        ``model`` (a path, or a model object), ``run_seed`` (int), ``out`` (this run's output directory),
        ``device`` (Device keyword arguments: ``precision_mode`` and the others of
        :data:`DEVICE_OPTIONS`), and either replay options ``inputs``, ``shapes``, ``seed``,
        ``signature`` or, with ``data`` (an .npz path, a dict with x and y, or a pair), the training
        options of :data:`TRAIN_OPTIONS`; ``full`` (dump every tensor) or ``keep`` (op names: dump
        statistics and digests, and these ops' tensors; without either, statistics and digests only, and a
        replay's final outputs).

    Returns
    -------
    dict
        ``{"run_seed", "mode", "dumps": {step or 0: dir}, "outputs": [names], "losses": [...] (training),
        "deterministic_level"}`` (JSON-able).
    """
    from ..npu.device import Device

    dev_kw = dict(task.get("device") or {})
    unknown = set(dev_kw) - set(DEVICE_OPTIONS)
    if unknown:
        raise AscendEmuError(f"unknown device option(s) {', '.join(sorted(unknown))}; "
                             f"choose from: {', '.join(DEVICE_OPTIONS)}")
    mode = dev_kw.pop("precision_mode", None)
    if mode is None and dev_kw.get("precision_mode_v2") is None:
        # neither given: the TF adapter's default, a training's the SoC's (as train and emulate)
        from ..npu.precision import TRAIN_PRECISION_DEFAULT

        mode = (TRAIN_PRECISION_DEFAULT.get(dev_kw.get("soc", "Ascend910"), "allow_fp32_to_fp16")
                if task.get("data") is not None else None)
    dev = Device(mode, run_seed=int(task["run_seed"]), **dev_kw)
    out = os.fspath(task["out"])
    summary = {"run_seed": int(task["run_seed"]), "deterministic_level": dev.deterministic_level}
    keep = set(task.get("keep") or ())
    dump = {} if task.get("full") else {"digest": True, "select": lambda name, tf_type: name in keep}
    if task.get("data") is not None:
        kw = {k: task[k] for k in TRAIN_OPTIONS if task.get(k) is not None}
        if not kw.get("steps") and not kw.get("epochs"):
            raise AscendEmuError("random-error detection of a training needs steps (e.g. steps=20)")
        dump_steps = task.get("dump_steps")
        if dump_steps is None:
            dump_steps = list(range(kw["steps"])) if kw.get("steps") else None
        res = dev.train(task["model"], task["data"], dump_dir=out, dump_steps=dump_steps, overwrite=True,
                        progress=False, dump_options=dump, **kw)
        summary.update(mode="train", dumps={str(k): v for k, v in sorted(res.dumps.items())},
                       losses=[float(s["loss"]) for s in res.steps])
    else:
        from ..frontend.tf.graph_cache import load_graph_cached

        graph = load_graph_cached(task["model"], signature=task.get("signature"), input_shapes=task.get("shapes"))
        keep.update(t.rpartition(":")[0] for t in graph.outputs)    # the final outputs' spread is reported
        res = dev.replay(graph, task.get("inputs"), out, shapes=task.get("shapes"), seed=int(task.get("seed", 0)),
                         overwrite=True, progress=False, keep_tensors=False, **dump)
        summary.update(mode="replay", dumps={"0": res.dump}, outputs=list(res.graph.outputs))
    return summary


@dataclass
class RandomErrors:
    """The result of :func:`random_errors` (``to_json()`` is what the CLI's ``--json`` writes)."""

    model: str
    mode: str
    runs: list
    first: dict | None
    sources: list
    differing_ops: int
    output_spread: dict | None = None
    loss_spread: dict | None = None
    config: dict = field(default_factory=dict)
    deterministic_level: int = 0
    #: training: the first step whose loss differs between runs (None: the same losses throughout)
    first_loss_step: int | None = None

    @property
    def identical(self) -> bool:
        return self.first is None and self.first_loss_step is None

    def to_json(self) -> dict:
        return {"model": self.model, "mode": self.mode, "runs": self.runs, "first": self.first,
                "sources": self.sources, "differing_ops": self.differing_ops, "identical": self.identical,
                "output_spread": self.output_spread, "loss_spread": self.loss_spread, "config": self.config,
                "deterministic_level": self.deterministic_level, "first_loss_step": self.first_loss_step}

    def format_text(self) -> str:
        n = len(self.runs)
        seeds = ", ".join(str(r["run_seed"]) for r in self.runs)
        lines = [f"random-error detection: {n} runs of {self.model} ({self.mode}; run seeds {seeds}; "
                 f"deterministic level {self.deterministic_level})"]
        if self.identical:
            lines.append("identical: every run dumped the same bytes for every op"
                         + (" of every dumped step, and every step's loss is the same" if self.mode == "train"
                            else ""))
        elif self.first is None:
            lines.append(f"the losses differ from step {self.first_loss_step}, but no dumped step differs: "
                         "dump that step (dump_steps) to find the op")
        else:
            f = self.first
            where = f"step {f['step']}, " if f.get("step") is not None else ""
            role = ("the source (its inputs were identical in every run)" if f["source"]
                    else "it propagates a difference (its inputs already differed)")
            lines.append(f"first difference: {where}op {f['name']} ({f['tf_type']}"
                         + (f", phase {f['phase']}" if f.get("phase") else "") + f"): {role}")
            if f.get("split"):
                lines.append(f"  multi-core op: {f['split']}")
            lines.append(f"ops that differ: {self.differing_ops}" + (" (in that step)" if self.mode == "train" else ""))
            if self.first_loss_step is not None:
                lines.append(f"first step whose loss differs: {self.first_loss_step}")
            if self.sources:
                lines.append("sources: " + ", ".join(
                    f"{s['name']} ({s['tf_type']}" + (f", step {s['step']}" if s.get("step") is not None else "")
                    + ")" for s in self.sources[:8]) + (f", ... ({len(self.sources)} in all)"
                                                         if len(self.sources) > 8 else ""))
        for s, label in ((self.output_spread, "final output"), (self.loss_spread, "final loss")):
            if s:
                lines.append(f"{label} spread over {s['runs']} runs: max |a - b| {s['max_abs']:.6g} "
                             f"(relative {s['max_rel']:.3g}), std {s['std']:.3g}")
        if self.mode == "train" and self.runs and self.runs[0].get("losses"):
            for r in self.runs:
                lines.append(f"  run seed {r['run_seed']}: loss first {r['losses'][0]:.9g}, last {r['losses'][-1]:.9g}")
        return "\n".join(lines)


def _split_note(tf_type: str) -> str | None:
    row = MULTICORE_OPS.get(tf_type)
    return f"{tf_type}: {row.kind} split ({row.split}); {row.combine}" if row else None


def _final_outputs(summary: dict) -> list:
    from ..analysis.dump import load_dump

    d = load_dump(summary["dumps"]["0"])
    vals = []
    for t in summary.get("outputs") or []:
        name, _, idx = t.rpartition(":")
        if name in d and d.has_tensor(name, int(idx)):
            vals.append(np.asarray(d.tensor(name, int(idx)), dtype=np.float64).reshape(-1))
    return vals


def summarize(summaries: list, model_name: str = "model", config: dict | None = None) -> RandomErrors:
    """Compare the runs of :func:`run_once` summaries (the first is the baseline) and put the result together."""
    if len(summaries) < 2:
        raise AscendEmuError("random-error detection needs at least 2 runs; give runs=2 or more")
    base = summaries[0]
    mode = base["mode"]
    first, sources, differing = None, {}, set()
    steps = sorted(base["dumps"], key=int)
    for other in summaries[1:]:
        for k in steps:
            if k not in other["dumps"]:
                continue
            diff = compare_runs(base["dumps"][k], other["dumps"][k])
            step = int(k) if mode == "train" else None
            differing.update((step, n) for n in diff.differing)
            for n in diff.sources:
                sources.setdefault((step, n), {"name": n, "tf_type": diff.types.get(n), "step": step,
                                               "split": _split_note(diff.types.get(n) or "")})
            if diff.first is not None:
                cand = {**diff.first, "step": step, "split": _split_note(diff.first["tf_type"]),
                        "run_seeds": [base["run_seed"], other["run_seed"]]}
                key = (step if step is not None else 0, cand["index"])
                if first is None or key < (first["step"] if first["step"] is not None else 0, first["index"]):
                    first = cand
                break   # later steps of this pair start from different weights: their differences follow
    res = RandomErrors(model_name, mode, summaries, first, sorted(sources.values(), key=lambda s: (
        s["step"] if s["step"] is not None else 0, s["name"])), len(differing), config=config or {},
        deterministic_level=base.get("deterministic_level", 0))
    if mode == "train":
        res.loss_spread = output_spread([[s["losses"][-1]] for s in summaries])
        losses = np.array([s["losses"] for s in summaries], dtype=np.float64)
        differ = np.nonzero((losses != losses[0]).any(axis=0))[0]
        res.first_loss_step = int(differ[0]) if differ.size else None
    else:
        outs = [_final_outputs(s) for s in summaries]
        if all(len(o) == len(outs[0]) and o for o in outs):
            res.output_spread = output_spread([np.concatenate(o) for o in outs])
    return res


def random_errors(model, *, runs: int = 2, run_seed: int = 0, out_dir=None, device_options: dict | None = None,
                  inputs=None, shapes=None, seed: int = 0, signature=None, data=None, dump_steps=None,
                  report=None, runner=None, scheduler=None, n_workers=None, progress: bool = False,
                  overwrite: bool = False, full_dumps: bool = False, **train_options) -> RandomErrors:
    """Run ``model`` ``runs`` times with different run seeds and find where the runs part.

    Parameters
    ----------
    model : path or model object (as :meth:`Device.replay` / :meth:`Device.train` take).
    runs : number of runs (>= 2); run k uses ``run_seed + k``.
    out_dir : where each run's dumps go (``out_dir/run-K``); default ``random-errors-output``.
    device_options : Device keyword arguments (``precision_mode``, ``soc``, ...); determinism is off
        unless they set ``deterministic`` / ``deterministic_level`` (then every run must agree).
    inputs, shapes, seed, signature : replay inputs (as :meth:`Device.replay`); with ``data``, ``seed`` is the
        training's seed (of its shuffle) unless ``train_options`` give one.
    data : training data (an .npz path, a dict with x and y, or a pair): train instead of replaying,
        with ``train_options`` (:data:`TRAIN_OPTIONS`; ``steps`` or ``epochs`` must be given).
    dump_steps : the training steps dumped and compared (default: every step); the losses of every
        step are compared whatever it says.
    report : path of an HTML report to write (loss curves of every run when training).
    runner : optional callable mapping a list of tasks to a list of summaries (default: one after the
        other in this process, or on ``scheduler``).
    scheduler, n_workers : run the runs through the sweep layer (:class:`~ascend_emu.tools.sweep.Sweep`:
        ``"none"`` serial, ``"local"`` a Dask LocalCluster, or a Dask address; None: serial).
    progress : a progress bar over the runs (with a scheduler).
    overwrite : replace the dumps of earlier runs in ``out_dir`` (without it, a ``run-K`` already there is an
        error: nothing is replaced unasked).
    full_dumps : dump every tensor of every run (and step). By default each run dumps statistics and the
        sha256 of every output (the comparison stays bit for bit) and a replay's final outputs; when the
        runs part, the two runs of the first difference run again and dump the tensors of that op and its
        inputs at that step. The estimate of the dumps' size is told on stderr (with ``progress``) before
        any run, and refused in one line when the file system will not hold it.

    Returns
    -------
    RandomErrors
    """
    if isinstance(runs, bool) or not isinstance(runs, (int, np.integer)) or runs < 2:
        raise AscendEmuError(f"runs must be an integer >= 2, got {runs!r}")
    if runs > MAX_RUNS:    # every run is a whole replay or training, listed before the first starts
        raise AscendEmuError(f"{runs} runs are more than random-error detection takes (at most {MAX_RUNS}); "
                             "give fewer --runs")
    bad = set(train_options) - set(TRAIN_OPTIONS)
    if bad:
        raise AscendEmuError(f"unknown option(s) {', '.join(sorted(bad))}; training takes: {', '.join(TRAIN_OPTIONS)}")
    if data is None and train_options:
        raise AscendEmuError(f"{', '.join(sorted(train_options))} apply to training only; give data= to train")
    dev = dict(device_options or {})
    if dev.get("deterministic") is None and dev.get("deterministic_level") is None:
        dev["deterministic"] = False
    # what every run would refuse is refused here, before a cluster starts or a run's output directory exists
    if isinstance(model, (str, os.PathLike)) and not os.path.exists(model):
        raise AscendEmuError(f"model path {os.fspath(model)!r} does not exist; pass a .keras file, a SavedModel "
                             "directory or a frozen GraphDef (.pb/.pbtxt)")
    if data is not None and not train_options.get("steps") and not train_options.get("epochs"):
        raise AscendEmuError("random-error detection of a training needs steps (e.g. steps=20)")
    from ..frontend.inputs import check_seed, load_npz

    if data is not None:
        train_options.setdefault("seed", seed)     # --seed of a training: its shuffle's (not ignored)
    check_seed(train_options.get("seed", seed))
    if isinstance(data, (str, os.PathLike)):
        load_npz(data, f"--data {os.fspath(data)}")
    target = out_dir if out_dir is not None else "random-errors-output"
    # every run dumps its steps: estimated from the traced step (the loaded graph) before any directory is made
    _refuse_earlier_runs(target, overwrite)    # before the estimate, which loads the model
    _check_disk(model, data, dump_steps, train_options, inputs, shapes, seed, signature, int(runs), target,
                bool(full_dumps), bool(progress))
    out_dir = make_output_dir(target, "random-errors output")
    _refuse_earlier_runs(out_dir, overwrite)
    tasks = []
    for k in range(int(runs)):
        t = {"model": model, "run_seed": int(run_seed) + k, "out": os.path.join(out_dir, f"run-{k}"), "device": dev,
             "full": bool(full_dumps)}
        if data is not None:
            t.update(data=data, dump_steps=dump_steps, **train_options)
        else:
            t.update(inputs=inputs, shapes=shapes, seed=seed, signature=signature)
        tasks.append(t)
    name = model if isinstance(model, (str, os.PathLike)) else getattr(model, "name", type(model).__name__)
    name = os.fspath(name) if isinstance(name, os.PathLike) else str(name)
    config = {"device": {k: v for k, v in dev.items() if k not in ("cube_model", "multicore")},
              "runs": int(runs), "run_seed": int(run_seed), "full_dumps": bool(full_dumps),
              **({"train": {k: v for k, v in train_options.items() if not callable(v)}} if data is not None else {})}
    with contextlib.ExitStack() as stack:
        sweep = None
        if runner is None and scheduler is not None:
            from .sweep import Sweep

            sweep = stack.enter_context(Sweep(scheduler, n_workers=n_workers, progress=progress, desc="random-errors"))

        def execute(batch):
            if runner is not None:
                return runner(batch)
            if sweep is not None:
                return sweep.map(run_once, batch, names=[f"{os.path.basename(t['out'])} (run seed {t['run_seed']})"
                                                         for t in batch])
            return [run_once(t) for t in batch]

        summaries = execute(tasks)
        res = summarize(summaries, name, config)
        if not full_dumps and res.first is not None:
            _dump_where_runs_part(res, tasks, summaries, execute)
            res = summarize(summaries, name, config)
    if report is not None:
        write_runs_report(res.to_json(), report)
    return res


def _refuse_earlier_runs(target, overwrite: bool) -> None:
    """Nothing is replaced unasked: a ``run-K`` already in ``target`` needs ``overwrite``."""
    there = sorted(n for n in os.listdir(target) if n.startswith("run-")) if os.path.isdir(target) else []
    if there and not overwrite:
        raise AscendEmuError(f"{os.fspath(target)} already holds the dumps of earlier runs ({', '.join(there[:3])}"
                             f"{', ...' if len(there) > 3 else ''}); pass --overwrite (overwrite=True) to replace "
                             "them, or give another --out")


def _dump_where_runs_part(res: RandomErrors, tasks: list, summaries: list, execute) -> None:
    """Run the two runs of the first difference again (the same seeds: the same bytes), dumping the tensors of
    that op and of the ops feeding it (at that step) beside the statistics, into the same dumps."""
    from ..analysis.dump import load_dump

    f = res.first
    step = f.get("step")
    base = summaries[0]
    d = load_dump(base["dumps"][str(step if step is not None else 0)])
    keep = [f["name"]] + [r.rpartition(":")[0] if ":" in r else r for r in d.op(f["name"]).get("inputs", [])]
    by_seed = {t["run_seed"]: k for k, t in enumerate(tasks)}
    ks = [by_seed[s] for s in f["run_seeds"]]
    again = [{**tasks[k], "keep": keep, **({"dump_steps": [step]} if step is not None else {})} for k in ks]
    for k, new in zip(ks, execute(again)):
        if new.get("losses") != summaries[k].get("losses"):
            raise AscendEmuError(f"run seed {tasks[k]['run_seed']} did not repeat its losses when run again "
                                 "(the emulation should be reproducible for a given run seed): please report it")


def _check_disk(model, data, dump_steps, train_options, inputs, shapes, seed, signature, runs: int, target,
                full: bool, announce: bool) -> None:
    """Estimate what the runs will dump (:func:`~ascend_emu.analysis.dump.graph_dump_bytes` of the traced step
    or the loaded graph); refuse in one line, nothing written, when the file system will not hold it; tell it
    on stderr when ``announce`` (or when it passes about 1 GB)."""
    from ..analysis.dump import check_disk_space, fmt_bytes, graph_dump_bytes

    if data is not None:
        from ..npu.training import training_step_bytes

        kw = {k: v for k, v in train_options.items() if k != "overflow_check"}
        dumped = len(set(dump_steps)) if dump_steps is not None else int(train_options.get("steps") or 1)
        one = training_step_bytes(model, data, stats_only=not full, **kw)
        what = f"the dumps of {runs} runs x {dumped} step(s)"
    else:
        from ..frontend.tf.graph_cache import load_graph_cached
        from ..frontend.inputs import make_inputs

        graph = load_graph_cached(model, signature=signature, input_shapes=shapes)
        feeds = make_inputs(graph, inputs, seed=seed, shapes=shapes)
        batch = max([int(np.shape(v)[0]) for v in feeds.values() if np.ndim(v)] or [1])
        outs = {t.rpartition(":")[0] for t in graph.outputs}
        dumped, what = 1, f"the dumps of {runs} runs"
        one = graph_dump_bytes(graph.nodes, batch, select=None if full else (lambda name, tf_type: name in outs))
    total = one * dumped * runs
    what += " (every tensor)" if full else " (statistics and digests; --full-dumps for every tensor)"
    fix = ("give fewer --runs" + (" or --steps" if data is not None else "") + (", leave out --full-dumps" if full
           else "") + " or free space")
    line = check_disk_space(total, target, what, fix=fix)
    if line or announce:
        print(f"ascend-emu: {line or f'{what} will take about {fmt_bytes(total)} in {os.fspath(target)}'}",
              file=sys.stderr, flush=True)

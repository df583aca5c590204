"""One function per subcommand, each a thin call into the public API (:mod:`ascend_emu.cli.main` builds
the parser that dispatches to them)."""
from __future__ import annotations

import os
import sys

from ..errors import AscendEmuError
from .options import (_device, _device_for_dump, _device_kwargs, _device_options, _mode_options,
                      _optimizer_options, _scheduler, _select, _shapes, _tf1_train_step)


def cmd_replay(a):
    res = _device(a).replay(a.model, a.input, a.dump, signature=a.signature, shapes=_shapes(a), seed=a.seed,
                            overwrite=a.overwrite, stats_only=a.stats_only, select=_select(a),
                            progress=not a.quiet, keep_tensors=False)
    print(res.format_summary(), flush=True)
    return 0


def cmd_reference(a):
    from ..frontend.tf.reference import reference

    res = reference(a.model, a.input, a.dump, signature=a.signature, shapes=_shapes(a), seed=a.seed,
                    overwrite=a.overwrite, stats_only=a.stats_only, select=_select(a), progress=not a.quiet)
    s = res.summary
    runtime = f"onnxruntime {s['onnxruntime']}" if "onnxruntime" in s else f"torch {s['torch']}" if "torch" in s \
        else f"TensorFlow {s.get('tensorflow', '')}"
    print(f"reference: {s['ops']} ops in {runtime} float32 on the CPU")
    for engine, per in s["per_engine_dtype"].items():
        print(f"  {engine:<7} " + ", ".join(f"{dt}: {n}" for dt, n in per.items()))
    print(f"ops with inf/nan outputs: {s['nonfinite_ops']}"
          + (f" (first: {s['first_nonfinite']})" if s.get("first_nonfinite") else ""))
    line = f"time: {s.get('seconds', 0):.2f} s"
    if res.dump:
        from ..analysis.dump import dump_bytes, fmt_bytes

        line += f"; dump: {res.dump} ({fmt_bytes(dump_bytes(res.dump))})"
    print(line)
    return 0


def cmd_compare(a):
    from ..analysis.compare import compare
    from ..analysis.dump import load_dump

    if load_dump(a.npu_dir).kind == "npu" and load_dump(a.bench_dir).kind == "npu":
        # two emulated runs of one model: bit for bit first (random-error detection), then the metrics
        from ..analysis.runs import compare_runs

        print(compare_runs(a.npu_dir, a.bench_dir, force=a.force).format_text(), flush=True)
    cmp = compare(a.npu_dir, a.bench_dir, rules=a.rules, force=a.force, workers=a.workers)
    if a.csv:
        cmp.to_csv(a.csv)
        print(f"wrote {a.csv}")
    first = cmp.first_divergent()
    print(cmp.summary_text(first_divergent=first is None))   # the op's block below names it: once
    if first is not None:
        print(first.format_text())
    if a.cosine is not None or a.limit is not None:
        print(cmp.format_worst(cosine=a.cosine if a.cosine is not None else 0.98,
                               limit=a.limit if a.limit is not None else 10))
    _print_robustness(cmp.npu)
    return 0


def _print_robustness(dump) -> None:
    """The robustness line when ``ascend-emu sensitivity --dump`` ran for this dump."""
    from ..analysis.robustness import read_sidecar, robust_line, sidecar

    sens = read_sidecar(dump)
    if sens is not None:
        print(robust_line(sens) + f" [{sidecar(dump)}]")


def cmd_overflow(a):
    import json

    from ..analysis.overflow import overflow_report

    from ..fileio import atomic_write_text

    rep = overflow_report(a.dump)
    print(rep.format_text())
    if a.json:
        atomic_write_text(a.json, json.dumps(rep.to_json(), indent=1))
        print(f"wrote {a.json}")
    if a.ops_info:
        sug = rep.suggestion()
        if sug is None and rep.eager_torch:
            print(f"a torch_npu eager run reads no modify_mixlist (its precision is torch.autocast's): {a.ops_info} "
                  "not written")
        elif sug is None:
            print(f"no abnormal first overflow with an op type to black-list: {a.ops_info} not written")
        else:
            atomic_write_text(a.ops_info, json.dumps(sug, indent=1) + "\n")
            print(f"wrote {a.ops_info} (suggested modify_mixlist; try it: --modify-mixlist {a.ops_info})")
    return 0


def cmd_report(a):
    from ..analysis.report import write_report

    path = write_report(a.npu_dir, a.bench_dir, a.output, rules=a.rules, force=a.force)
    print(f"report: {os.path.abspath(path)}")
    _print_robustness(a.npu_dir)
    return 0


def cmd_export_msprobe(a):
    from ..analysis.msprobe import export_msprobe

    root = export_msprobe(a.dump, a.out, step=a.step, rank=a.rank, tensor_format=a.tensor_format,
                          framework=a.framework, overwrite=a.overwrite)
    print(f"msprobe dump: {root} (compare with: msprobe compare -tp {os.path.dirname(root)} -gp <other step dir>)")
    return 0


def cmd_import_msprobe(a):
    from ..analysis.msprobe import import_msprobe

    d = import_msprobe(a.dir, a.out, mapping=a.mapping, against=a.against, kind=a.kind, step=a.step,
                       rank=a.rank, allow_unmatched=a.allow_unmatched, overwrite=a.overwrite)
    files = sum(1 for op in d.ops for o in op["outputs"] if o["file"])
    outs = sum(len(op["outputs"]) for op in d.ops)
    print(f"ascend-emu dump: {d.path} ({len(d.ops)} ops, {outs} outputs, {files} with tensors)")
    return 0


def _sweep_train_options(a) -> dict:
    """The training options of a sweep over trainings (``_sweep_training_args``'s), those given."""
    return {k: v for k, v in (("steps", a.steps), ("batch_size", a.batch_size), ("loss", a.loss),
                              ("optimizer", a.optimizer), ("learning_rate", a.learning_rate),
                              ("loss_scale", a.loss_scale), ("shuffle", a.shuffle or None)) if v is not None}


def _print_result(res, json_path) -> None:
    """A sweep's text to stdout and, with ``--json``, its JSON written atomically."""
    import json

    from ..fileio import atomic_write_text

    print(res.format_text())
    if json_path:
        atomic_write_text(json_path, json.dumps(res.to_json(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {json_path}")


def cmd_bisect(a):
    from ..tools.bisect import fusion_bisect

    train = _sweep_train_options(a)
    a.training_defaults = a.data is not None    # a training: the SoC's training precision mode by default
    res = fusion_bisect(a.model, a.input, device_kwargs=_device_kwargs(a), signature=a.signature,
                        shapes=_shapes(a), seed=a.seed, metric=a.metric, threshold=a.threshold,
                        keep_dumps=a.keep_dumps, progress=not a.quiet, scheduler=_scheduler(a), n_workers=a.workers,
                        data=a.data, **train)
    _print_result(res, a.json)
    return 0


def cmd_mixlist_search(a):
    from ..tools.mixlist_search import mixlist_search

    train = _sweep_train_options(a)
    res = mixlist_search(a.model, a.input, target=a.target, device_kwargs=_device_kwargs(a), signature=a.signature,
                         shapes=_shapes(a), seed=a.seed, by=a.by, output=a.output, beam=a.beam,
                         max_steps=a.max_steps, scheduler=_scheduler(a), n_workers=a.workers, progress=not a.quiet,
                         data=a.data, **train)
    _print_result(res, a.json)
    if not res.met:
        print(f"no {a.output} written: the target is not met", file=sys.stderr)
        return 1
    print(f"wrote {a.output} (pass it to: ascend-emu replay MODEL --precision-mode {res.precision_mode} "
          f"--modify-mixlist {a.output}, or to CANN as modify_mixlist)")
    return 0


def _rank_inits(pairs) -> dict:
    """--rank-init RANK=SEED pairs as a dict; a rank named twice is refused (the later one would win silently)."""
    out: dict = {}
    for rank, seed in pairs or ():
        if rank in out:
            raise AscendEmuError(f"--rank-init names rank {rank} twice ({rank}={out[rank]} and {rank}={seed}); "
                                 "give each rank once")
        out[rank] = seed
    return out


def cmd_train(a):
    import json

    from ..fileio import atomic_write_text

    model = _tf1_train_step(a) if str(a.model).endswith(".meta") else a.model
    if model is a.model and any(v is not None for v in (a.checkpoint, a.x_name, a.y_name, a.loss_tensor, a.train_op)):
        raise AscendEmuError("--checkpoint, --x-name, --y-name, --loss-tensor and --train-op apply to a TF1 MetaGraph "
                             "(.meta) only")
    res = _device(a).train(model, a.data, loss=a.loss, optimizer=a.optimizer, learning_rate=a.learning_rate,
                           optimizer_options=_optimizer_options(a), batch_size=a.batch_size, steps=a.steps,
                           epochs=a.epochs, loss_scale=a.loss_scale, shuffle=a.shuffle, seed=a.seed,
                           dump_dir=a.dump, dump_steps=a.dump_steps, reference=a.reference,
                           overflow_check=a.overflow_check, overwrite=a.overwrite, progress=not a.quiet,
                           ranks=a.ranks, allreduce=a.allreduce, allreduce_dtype=a.allreduce_dtype,
                           rank_init=_rank_inits(a.rank_init), check_rank_weights=a.check_rank_weights)
    print(res.format_text(), flush=True)
    run = res.to_json()
    if a.json:
        atomic_write_text(a.json, json.dumps(run, indent=1, sort_keys=True) + "\n")
        print(f"wrote {a.json}")
    for k in sorted(res.dumps):
        line = f"dump of step {k}: {res.dumps[k]}"
        if k in res.reference_dumps:
            line += f" (reference: {res.reference_dumps[k]})"
        print(line)
    if a.report:
        from ..analysis.train_report import write_train_report

        path = write_train_report(run, a.report)
        print(f"report: {os.path.abspath(path)}")
    return 0


def cmd_check(a):
    import json

    from ..fileio import atomic_write_text
    from ..tools.check import check

    res = check(a.model, a.data, device=_device(a), benchmark=a.benchmark, benchmark_config=a.benchmark_config,
                loss=a.loss, optimizer=a.optimizer, learning_rate=a.learning_rate, batch_size=a.batch_size,
                steps=a.steps, epochs=a.epochs, loss_scale=a.loss_scale, overflow_check=a.overflow_check,
                shuffle=a.shuffle, seed=a.seed, work_dir=a.keep_dumps, progress=not a.quiet)
    print(res.format_text(), flush=True)
    if res.ops_info:
        text = json.dumps(res.ops_info, indent=1)
        if a.ops_info:
            atomic_write_text(a.ops_info, text + "\n")
            print(f"wrote {a.ops_info} (suggested modify_mixlist; try it: --modify-mixlist {a.ops_info})")
        else:
            print("suggested ops_info.json (write it with --ops-info FILE, use it with --modify-mixlist):\n" + text)
    if a.json:
        atomic_write_text(a.json, json.dumps(res.to_json(), indent=1) + "\n")
        print(f"wrote {a.json}")
    if a.report:
        from ..analysis.check_report import write_check_report

        print(f"report: {os.path.abspath(write_check_report(res.report_data(), a.report))}")
    return res.exit_code


def cmd_demo(a):
    from ..tools.demo import run_demo

    run_demo(a.out, overwrite=True, progress=not a.quiet)
    return 0


def cmd_warmup(a):
    from ..tools.warmup import DEMO_MANIFEST, MANIFEST, warmup

    warmup(a.jobs, path=DEMO_MANIFEST if a.demo else MANIFEST)
    return 0


def cmd_ops(a):
    from ..ops import OPS
    from ..ops.multicore import MULTICORE_OPS

    kinds = {}
    for t, d in sorted(OPS.items()):
        kinds.setdefault("fused (made by fusion rules)" if t.startswith("_") else d.kind, []).append(t)
    for k, ts in kinds.items():
        print(f"{k}: {', '.join(ts)}")
    print("other op types run through TensorFlow on the emulated AI CPU (engine AICPU)")
    print("\nsplit over several cores, non-deterministic with --deterministic 0 (NUMERICS.md section 11):")
    for t, row in MULTICORE_OPS.items():
        print(f"  {t} ({row.kind})\n    splits:   {row.split}\n    combines: {row.combine}\n    source:   {row.source}")
    return 0


def cmd_random_errors(a):
    import json

    from ..fileio import atomic_write_text
    from ..tools.random_errors import random_errors
    from ..tools.sweep import check_scheduler

    cm = {k: v for k, v in {"block_size": a.cube_block_size, "block_sum": a.cube_block_sum,
                            "extra_bits": a.cube_extra_bits, "normalize": a.cube_normalize,
                            "conv_k_order": a.cube_conv_k_order}.items() if v is not None}
    fusion = "off" if a.fusion_off else a.fusion_switch
    opts = _device_options(a, cm, fusion)
    run_seed = opts.pop("run_seed")
    if a.data is not None:
        train = {k: v for k, v in {"steps": a.steps, "batch_size": a.batch_size, "loss": a.loss,
                                   "optimizer": a.optimizer, "learning_rate": a.learning_rate,
                                   "loss_scale": a.loss_scale, "shuffle": a.shuffle or None}.items() if v is not None}
        if a.input or a.shape:
            raise AscendEmuError("--input and --shape apply to replays; training reads --data")
    else:
        a.training_defaults = False     # a replay: the inference default
        train = {}
        if any(v is not None for v in (a.steps, a.batch_size, a.loss, a.optimizer, a.learning_rate, a.loss_scale)) \
                or a.shuffle:
            raise AscendEmuError("--steps, --batch-size, --loss, --optimizer, --learning-rate, --loss-scale and "
                                 "--shuffle apply to training: give --data FILE.npz")
    opts.update(_mode_options(a))
    opts = {k: v for k, v in opts.items() if v is not None}
    res = random_errors(a.model, runs=a.runs, run_seed=run_seed, out_dir=a.out, device_options=opts,
                        inputs=a.input or None, shapes=_shapes(a), seed=a.seed, signature=a.signature,
                        data=a.data, report=a.report, scheduler=check_scheduler(_scheduler(a)), n_workers=a.workers,
                        progress=not a.quiet, overwrite=a.overwrite, full_dumps=a.full_dumps, **train)
    print(res.format_text(), flush=True)
    if a.json:
        atomic_write_text(a.json, json.dumps(res.to_json(), indent=1, sort_keys=True, default=str) + "\n")
        print(f"wrote {a.json}")
    if a.report:
        print(f"report: {os.path.abspath(a.report)}")
    return 0


def cmd_socs(a):
    import json

    from ..numerics.policy import SOCS

    rows = [chip.row() for chip in SOCS.values()]
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    cols = (("soc", "SoC"), ("cube_dtypes", "cube operands"), ("vector_bf16", "vector bf16"),
            ("overflow_modes", "overflow modes (default)"), ("ai_cores", "AI cores"), ("vector_cores", "vector cores"),
            ("op_model", "op_model"), ("allow_hf32_default", "HF32 default"), ("hf32_bits", "HF32 bits"),
            ("train_precision_default", "training default"))

    def cell(r, k):
        v = r[k]
        if k == "overflow_modes":
            v = ", ".join(m + (" (default)" if m == r["overflow_default"] and len(v) > 1 else "") for m in v)
        elif isinstance(v, list):
            v = ", ".join(v)
        elif isinstance(v, bool):
            v = "yes" if v else "no"
        elif v is None:
            v = "-"
        return str(v) + ("*" if k in r["assumed"] or (k == "overflow_modes" and "overflow_default" in r["assumed"])
                         else "")
    table = [[h for _, h in cols]] + [[cell(r, k) for k, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print("\n".join(["", "aliases: " + "; ".join(f"{r['soc']}: {', '.join(r['aliases'])}" for r in rows if r["aliases"]),
                      "inference default on every SoC: force_fp16 (precision_mode_v2 fp16)",
                      "* an assumption (no public source): NUMERICS.md section 13 gives each cell's source and the "
                      "parameter that changes it (--aicore-num, --op-model, --overflow-mode)"]))
    return 0


def cmd_rules(a):
    from ..npu.fusion import RULES

    from ..npu.fusion.onnx_forms import ONNX_FORMS

    for r in RULES.values():
        print(f"{r.name} ({r.kind})\n  pattern:  {r.pattern}\n  numerics: {r.numerics}")
        print(f"  onnx:     {ONNX_FORMS.get(r.name, 'not checked on ONNX models')}")
    return 0


def _dump_device(a, dump, command) -> dict:
    """The Device of a command checking ``dump``: the dump's configuration for the options not given, said in
    one line when that changed the run."""
    d, adopted = _device_for_dump(a, dump)
    if adopted and not a.quiet:
        print(f"{command}: running with the configuration {dump} was made with (its manifest): {', '.join(adopted)}")
    return {"device": d}


def cmd_fit(a):
    from ..tools.fit import fit

    res = fit(a.dump, a.model, a.input, device_kwargs=_dump_device(a, a.dump, "fit"), signature=a.signature,
              shapes=_shapes(a), progress=not a.quiet, scheduler=_scheduler(a), n_workers=a.workers,
              params=a.param or None)
    _print_result(res, a.json)
    return 0


def cmd_sensitivity(a):
    from ..tools.sensitivity import sensitivity

    train = {}
    if a.data is not None or a.steps is not None:
        train = {"data": a.data, "steps": a.steps, "loss_tol": a.loss_tol, "batch_size": a.batch_size,
                 "loss": a.loss, "optimizer": a.optimizer, "learning_rate": a.learning_rate,
                 "loss_scale": a.loss_scale}
    kw = _dump_device(a, a.dump, "sensitivity") if a.dump else _device_kwargs(a)
    res = sensitivity(a.model, a.input, device_kwargs=kw, signature=a.signature, shapes=_shapes(a),
                      seed=a.seed, params=a.param or None, dump=a.dump, json_path=a.json, report=a.report,
                      cosine_tol=a.cosine_tol, keep_dumps=a.keep_dumps, overwrite=a.overwrite,
                      progress=not a.quiet,
                      scheduler=_scheduler(a), n_workers=a.workers, **train)
    print(res.format_text())
    for what, path in (("JSON", a.json), ("report", a.report)):
        if path:
            print(f"wrote {what}: {path}")
    if a.dump:
        from ..tools.sensitivity import sidecar

        print(f"wrote {sidecar(a.dump)} (compare and report of {a.dump} show which conclusions are robust)")
    return 0


def cmd_run(a):
    import json
    import traceback

    from ..fileio import atomic_write_text
    from ..analysis.dump import json_safe
    from ..tools.run_script import ScriptExit, ScriptFailed, run_script

    status, run = 0, None
    try:
        run = run_script(a.script, a.args, soc=a.soc, msprobe=a.msprobe, ranks=a.ranks)
    except ScriptFailed as e:
        # the script's own error: its traceback from its own frames on, and Python's exit status
        run, tb = e.run, e.exc.__traceback__
        script = os.path.abspath(a.script)
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
            tb = tb.tb_next
        traceback.print_exception(type(e.exc), e.exc, tb or e.exc.__traceback__, file=sys.stderr)
        status = 1
    except ScriptExit as e:
        run = e.run
        if isinstance(e.code, int):
            status = e.code
        else:
            print(e.code, file=sys.stderr)
            status = 1
    print(run.format_text(), flush=True)
    if a.json:
        atomic_write_text(a.json, json.dumps(json_safe(run.to_json()), indent=1, sort_keys=True) + "\n")
        print(f"wrote {a.json}")
    return status


def cmd_torch_run(a):
    import json

    from ..analysis.dump import json_safe
    from ..fileio import atomic_write_text
    from ..tools.torch_script import torch_run
    from .options import torch_numerics_options

    rec = torch_run(a.script, a.args, soc=a.soc, dump=a.dump, dump_steps=a.dump_steps, reference=a.reference,
                    steps=a.steps, stats_only=a.stats_only, overwrite=a.overwrite,
                    aicpu_fallback=not a.no_aicpu_fallback, progress=not a.quiet, **torch_numerics_options(a))
    opts = rec["options"]
    if opts["sources"].get("soc") == "emulate(...)":
        opts["sources"]["soc"] = "--soc"      # this command's option, not the Python API's call
    set_by_script = {k: v for k, v in opts["sources"].items() if v != "default"}
    print(f"torch-run {os.path.basename(rec['script'])} on {rec['soc']}: exit status {rec['exit_status']}"
          + (f", stopped after {rec['stopped_after_steps']} step(s) (--steps)" if rec["stopped_after_steps"] else ""))
    print(f"  precision mode {opts['effective_precision_mode']}, matmul allow_hf32 {opts['allow_hf32_matmul']}, "
          f"conv allow_hf32 {opts['allow_hf32_conv']}, cube_math_type {opts['cube_math_type']}, deterministic "
          f"level {opts['effective_deterministic_level']}")
    for k, src in sorted(set_by_script.items()):
        print(f"  {k} = {opts.get(k)!r}  (set by {src})")
    per = ", ".join(f"{eng} {dt}: {n}" for eng, d in sorted(rec["per_engine_dtype"].items())
                    for dt, n in sorted(d.items()))
    print(f"  {rec['aten_calls']} aten calls ({per or 'none'}); {len(rec['steps'])} step(s), "
          f"{len(rec['skipped_steps'])} skipped{': ' + ', '.join(map(str, rec['skipped_steps'])) if rec['skipped_steps'] else ''}")
    fo = rec["first_overflow"]
    if fo:
        print(f"  first overflow: {fo['name']} ({fo['phase']}, step {fo['step']})")
    for step, path in sorted(rec["dumps"].items()):
        ref = rec["reference_dumps"].get(step)
        print(f"  dump of step {step}: {path}" + (f" (float32: {ref}; ascend-emu compare {path} {ref})" if ref else ""))
    missing = sorted(set(a.dump_steps or [0]) - {int(k) for k in rec["dumps"]}) if a.dump else []
    if missing:
        # else a --dump-steps past the script's last step leaves nothing and says nothing
        print(f"  no dump of step {', '.join(map(str, missing))}: the script ran {len(rec['steps'])} training "
              f"step(s), numbered from 0 (--dump-steps)")
    if a.json:
        atomic_write_text(a.json, json.dumps(json_safe(rec), indent=1, allow_nan=False))
        print(f"  wrote {a.json}")
    return rec["exit_status"]

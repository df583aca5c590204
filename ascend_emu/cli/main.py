"""ascend-emu command line: a thin shell over the public API, one call per subcommand."""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from ..errors import AscendEmuError

EPILOG = """examples:
  ascend-emu demo                                   # the whole workflow on the bundled model
  ascend-emu reference model.keras --dump bench/
  ascend-emu replay model.keras --precision-mode allow_mix_precision --dump npu/
  ascend-emu compare npu/ bench/ --cosine 0.98 --limit 10 --csv compare.csv
  ascend-emu overflow npu/
  ascend-emu report npu/ bench/ -o report.html
  ascend-emu fusion-bisect model.keras --precision-mode force_fp16
  ascend-emu mixlist-search model.keras --target "cosine>=0.999" --output ops_info.json
  ascend-emu train model.keras --data train.npz --steps 50 --loss-scale dynamic --reference --report train.html
  ascend-emu check model.keras --data train.npz --loss-scale dynamic --report check.html
  ascend-emu export-msprobe npu/ msprobe-npu/          # msprobe's layout, for msprobe compare
  ascend-emu import-msprobe hw-dump/ hw/ --against npu/ --mapping names.yaml
"""


def _model_args(p, dump=True):
    p.add_argument("model", help="a .keras file, SavedModel directory, or frozen GraphDef (.pb/.pbtxt)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy|FILE.npz",
                   help="model input (repeatable); default: seeded N(0,1) random inputs of the signature's shapes")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="shape for an input whose signature leaves dimensions unknown")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--signature", default=None, help="SavedModel signature (default serving_default)")
    if not dump:
        return
    p.add_argument("--dump", required=False, metavar="DIR", help="write the dump to DIR")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dump in DIR")
    p.add_argument("--stats-only", action="store_true", help="dump statistics only, no tensors (large models)")
    p.add_argument("--select", metavar="REGEX", help="save tensors only of ops whose name matches REGEX")
    p.add_argument("--select-type", action="append", default=[], metavar="OPTYPE",
                   help="save tensors only of ops of this TF type (repeatable)")


#: the TF adapter's training default per SoC (ASCEND-FACTS section 1): Atlas A2 (910B) keeps the dtypes
from ..npu.precision import TRAIN_PRECISION_DEFAULT  # noqa: E402  (the TF adapter's training default)


def _device_args(p, fusion=True, training=False):
    from ..npu.precision import PRECISION_MODES

    if training:
        p.add_argument("--precision-mode", default=None, choices=PRECISION_MODES,
                       help="CANN precision_mode (default: the TF adapter's training default, allow_fp32_to_fp16 "
                            "on Ascend910, must_keep_origin_dtype on Ascend910B)")
    else:
        p.add_argument("--precision-mode", default="force_fp16", choices=PRECISION_MODES,
                       help="CANN precision_mode (default force_fp16, the TF adapter's inference default)")
    p.add_argument("--overflow-mode", choices=("saturation", "inf_nan"), default=None,
                   help="default: the SoC's (Ascend910 saturation, Ascend910B inf_nan)")
    p.add_argument("--modify-mixlist", metavar="FILE", help="CANN mixlist edits (JSON)")
    p.add_argument("--soc", default="Ascend910", choices=("Ascend910", "Ascend910B"))
    if fusion:
        p.add_argument("--fusion-switch", metavar="FILE",
                       help="CANN fusion_switch.cfg (JSON, or ATC's PassName:on|off lines)")
        p.add_argument("--fusion-off", action="store_true",
                       help="turn every fusion pass off (precision_tool's fusion-off)")
    p.add_argument("--no-aicpu-fallback", action="store_true",
                   help="fail on ops without an AI Core kernel instead of running them through TensorFlow")
    p.add_argument("--subnormals", choices=("keep", "flush"), default="keep")
    p.add_argument("--impl-mode", choices=("high_precision", "high_performance"), default="high_precision")
    p.add_argument("--reduce-accumulate", choices=("float32", "float16"), default="float32")
    p.add_argument("--op-model", choices=("tbe_v100", "tbe_v220", "ascendc", "exact"), default=None,
                   help="kernels of Gelu, Tanh, Sigmoid, Exp, Rsqrt, Softmax, LayerNorm, ReduceMean, BatchNorm: "
                        "CANN's, step by step (default: the SoC's TBE kernels) or exact (float64, one rounding)")
    p.add_argument("--cube-block-size", type=int, default=None, help="cube model: terms per block (default 16)")
    p.add_argument("--cube-block-sum", choices=("tree", "sequential", "aligned"), default=None)
    p.add_argument("--cube-extra-bits", type=int, default=None)
    p.add_argument("--cube-normalize", choices=("rne", "truncate"), default=None)
    p.add_argument("--cube-conv-k-order", choices=("hwc", "c1hwc0"), default=None,
                   help="cube model: K order of Conv2D (default hwc = TF's (kh, kw, cin); c1hwc0 = NC1HWC0's)")
    p.add_argument("--deterministic", type=int, choices=(0, 1), default=None,
                   help="CANN's deterministic: 0 = multi-core ops combine partial sums in a seeded random order "
                        "(NUMERICS.md section 11), 1 = a fixed order (the default here; CANN's default is 0)")
    p.add_argument("--deterministic-level", type=int, choices=(0, 1, 2), default=None,
                   help="0 off, 1 deterministic, 2 strong consistency (a row independent of its batch)")
    p.add_argument("--run-seed", type=int, default=None, metavar="N",
                   help="seed of the arrival orders with --deterministic 0 (default 0: reproducible)")
    p.add_argument("--aicore-num", type=int, default=None, metavar="N",
                   help="AI Cores a split op uses (ATC --aicore_num; default: the SoC's)")


def _device(a):
    from ..npu.device import Device

    cm = {k: v for k, v in {"block_size": a.cube_block_size, "block_sum": a.cube_block_sum,
                            "extra_bits": a.cube_extra_bits, "normalize": a.cube_normalize,
                            "conv_k_order": a.cube_conv_k_order}.items() if v is not None}
    fusion = "off" if getattr(a, "fusion_off", False) else getattr(a, "fusion_switch", None)
    mode = a.precision_mode if a.precision_mode is not None else TRAIN_PRECISION_DEFAULT[a.soc]
    return Device(mode, **_device_options(a, cm, fusion))


def _device_options(a, cm, fusion) -> dict:
    from ..numerics.multicore import MultiCoreModel
    from ..numerics.policy import CubeModel

    return dict(overflow_mode=a.overflow_mode, modify_mixlist=a.modify_mixlist, soc=a.soc,
                cube_model=CubeModel(**cm) if cm else None, subnormals=a.subnormals, impl_mode=a.impl_mode,
                reduce_accumulate=a.reduce_accumulate, op_model=a.op_model, fusion_switch=fusion,
                aicpu_fallback=not a.no_aicpu_fallback,
                deterministic=None if a.deterministic is None else bool(a.deterministic),
                deterministic_level=a.deterministic_level,
                run_seed=a.run_seed if a.run_seed is not None else 0,
                multicore=MultiCoreModel(aicore_num=a.aicore_num) if a.aicore_num is not None else None)


def _rules_arg(p):
    p.add_argument("--rules", choices=("ascend-emu", "msprobe"), default="ascend-emu",
                   help="how Result is decided: ascend-emu (default: the cosine / MaxAbsErr rule) or msprobe "
                        "(msprobe 26.x's checkers: pass / warning / error)")


def _select(a):
    from ..analysis.dump import op_selector

    return op_selector(a.select, a.select_type)


def _shapes(a):
    return a.shape or None


def cmd_replay(a):
    res = _device(a).replay(a.model, a.input, a.dump, signature=a.signature, shapes=_shapes(a), seed=a.seed,
                            overwrite=a.overwrite, stats_only=a.stats_only, select=_select(a),
                            progress=not a.quiet, keep_tensors=False)
    print(res.format_summary(), flush=True)
    return 0


def cmd_reference(a):
    from ..frontend.reference import reference

    res = reference(a.model, a.input, a.dump, signature=a.signature, shapes=_shapes(a), seed=a.seed,
                    overwrite=a.overwrite, stats_only=a.stats_only, select=_select(a), progress=not a.quiet)
    s = res.summary
    print(f"reference: {s['ops']} ops in TensorFlow {s.get('tensorflow', '')} float32 on the CPU")
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
    cmp = compare(a.npu_dir, a.bench_dir, rules=a.rules, force=a.force)
    if a.csv:
        cmp.to_csv(a.csv)
        print(f"wrote {a.csv}")
    print(cmp.summary_text())
    first = cmp.first_divergent()
    if first is not None:
        print(first.format_text())
    if a.cosine is not None or a.limit is not None:
        rows = cmp.worst(cosine=a.cosine if a.cosine is not None else 0.98,
                         limit=a.limit if a.limit is not None else 10)
        print(cmp.format_table(rows))
    return 0


def cmd_overflow(a):
    import json

    from ..analysis.overflow import overflow_report

    rep = overflow_report(a.dump)
    print(rep.format_text())
    if a.json:
        from ..fileio import atomic_write_text

        atomic_write_text(a.json, json.dumps(rep.to_json(), indent=1))
        print(f"wrote {a.json}")
    return 0


def cmd_report(a):
    from ..analysis.report import write_report

    path = write_report(a.npu_dir, a.bench_dir, a.output, rules=a.rules, force=a.force)
    print(f"report: {os.path.abspath(path)}")
    return 0


def cmd_export_msprobe(a):
    from ..analysis.msprobe import export_msprobe

    root = export_msprobe(a.dump, a.out, step=a.step, rank=a.rank, tensor_format=a.tensor_format,
                          overwrite=a.overwrite)
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


def cmd_bisect(a):
    from ..tools.bisect import fusion_bisect

    res = fusion_bisect(a.model, a.input, device_kwargs=_device_kwargs(a), signature=a.signature,
                        shapes=_shapes(a), seed=a.seed, metric=a.metric, threshold=a.threshold,
                        keep_dumps=a.keep_dumps, progress=not a.quiet, scheduler=a.scheduler, n_workers=a.workers)
    print(res.format_text())
    return 0


def cmd_mixlist_search(a):
    import json

    from ..fileio import atomic_write_text, check_writable
    from ..tools.mixlist_search import mixlist_search

    if a.json:
        check_writable(a.json, "--json")
    res = mixlist_search(a.model, a.input, target=a.target, device_kwargs=_device_kwargs(a), signature=a.signature,
                         shapes=_shapes(a), seed=a.seed, by=a.by, output=a.output, beam=a.beam,
                         max_steps=a.max_steps, scheduler=a.scheduler, n_workers=a.workers, progress=not a.quiet)
    print(res.format_text())
    if a.json:
        atomic_write_text(a.json, json.dumps(res.to_json(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {a.json}")
    if not res.met:
        print(f"no {a.output} written: the target is not met", file=sys.stderr)
        return 1
    print(f"wrote {a.output} (pass it to: ascend-emu replay MODEL --precision-mode {res.precision_mode} "
          f"--modify-mixlist {a.output}, or to CANN as modify_mixlist)")
    return 0


def _sweep_args(p):
    p.add_argument("--scheduler", default=None, metavar="none|local|tcp://HOST:PORT",
                   help="where the replays run: local (default with Dask installed: a Dask LocalCluster of worker "
                        "processes), none (serial, in this process; the default without Dask) or the address of "
                        "a running Dask scheduler")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="workers of --scheduler local (default: the cores)")


def _device_kwargs(a):
    d = _device(a)
    return {"device": d}


def _dump_steps(text):
    try:
        return sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give step numbers separated by commas, e.g. 0,10,49") from None


def _rank_init(text):
    rank, eq, seed = text.partition("=")
    try:
        if not eq:
            raise ValueError
        return int(rank), int(seed)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give RANK=SEED, e.g. 1=7") from None


def _optimizer_options(a) -> dict:
    opts = {"momentum": a.momentum, "nesterov": True if a.nesterov else None, "beta_1": a.beta_1,
            "beta_2": a.beta_2, "epsilon": a.epsilon, "amsgrad": True if a.amsgrad else None,
            "weight_decay": a.weight_decay, "rho": a.rho, "centered": True if a.centered else None}
    return {k: v for k, v in opts.items() if v is not None}


def _tf1_train_step(a):
    """The TrainStep of a TF1 MetaGraph named on the command line (its variables from --checkpoint)."""
    from ..frontend.tf1_step import train_step_from_tf1_graph

    missing = [f for f, v in (("--checkpoint", a.checkpoint), ("--loss-tensor", a.loss_tensor),
                              ("--train-op", a.train_op)) if v is None]
    if missing:
        raise AscendEmuError(f"training a MetaGraph needs {', '.join(missing)} (and --x-name/--y-name unless its "
                             "placeholders are x and y)")
    return train_step_from_tf1_graph(a.model, x=a.x_name or "x", y=a.y_name or "y", loss=a.loss_tensor,
                                     train_op=a.train_op, checkpoint=a.checkpoint)


def cmd_train(a):
    import json

    from ..fileio import atomic_write_text, check_writable

    # every output path is checked before the first step runs, so a long run never ends in a write error
    if a.json:
        check_writable(a.json, "--json")
    if a.report:
        check_writable(a.report, "--report")
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
                           rank_init=dict(a.rank_init or ()), check_rank_weights=a.check_rank_weights)
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

    from ..fileio import atomic_write_text, check_writable
    from ..tools.check import check

    for path, what in ((a.json, "--json"), (a.report, "--report"), (a.ops_info, "--ops-info")):
        if path:
            check_writable(path, what)
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

    from ..fileio import atomic_write_text, check_writable
    from ..tools.random_errors import random_errors

    if a.json:
        check_writable(a.json, "--json")
    if a.report:
        check_writable(a.report, "--report")
    cm = {k: v for k, v in {"block_size": a.cube_block_size, "block_sum": a.cube_block_sum,
                            "extra_bits": a.cube_extra_bits, "normalize": a.cube_normalize,
                            "conv_k_order": a.cube_conv_k_order}.items() if v is not None}
    fusion = "off" if a.fusion_off else a.fusion_switch
    opts = _device_options(a, cm, fusion)
    run_seed = opts.pop("run_seed")
    if a.data is not None:
        mode = a.precision_mode if a.precision_mode is not None else TRAIN_PRECISION_DEFAULT[a.soc]
        train = {k: v for k, v in {"steps": a.steps, "batch_size": a.batch_size, "loss": a.loss,
                                   "optimizer": a.optimizer, "learning_rate": a.learning_rate,
                                   "loss_scale": a.loss_scale, "shuffle": a.shuffle or None}.items() if v is not None}
        if a.input or a.shape:
            raise AscendEmuError("--input and --shape apply to replays; training reads --data")
    else:
        mode = a.precision_mode if a.precision_mode is not None else "force_fp16"
        train = {}
        if any(v is not None for v in (a.steps, a.batch_size, a.loss, a.optimizer, a.learning_rate, a.loss_scale)) \
                or a.shuffle:
            raise AscendEmuError("--steps, --batch-size, --loss, --optimizer, --learning-rate, --loss-scale and "
                                 "--shuffle apply to training: give --data FILE.npz")
    opts["precision_mode"] = mode
    opts = {k: v for k, v in opts.items() if v is not None}
    res = random_errors(a.model, runs=a.runs, run_seed=run_seed, out_dir=a.out, device_options=opts,
                        inputs=a.input or None, shapes=_shapes(a), seed=a.seed, signature=a.signature,
                        data=a.data, report=a.report, **train)
    print(res.format_text(), flush=True)
    if a.json:
        atomic_write_text(a.json, json.dumps(res.to_json(), indent=1, sort_keys=True, default=str) + "\n")
        print(f"wrote {a.json}")
    if a.report:
        print(f"report: {os.path.abspath(a.report)}")
    return 0


def cmd_rules(a):
    from ..npu.fusion import RULES

    for r in RULES.values():
        print(f"{r.name} ({r.kind})\n  pattern:  {r.pattern}\n  numerics: {r.numerics}")
    return 0


def build_parser():
    p = argparse.ArgumentParser(prog="ascend-emu", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Emulate Ascend NPU numerics on a CPU: replay TensorFlow graphs, "
                                            "dump every op, compare with float32, find the op that goes wrong.",
                                epilog=EPILOG)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def add(name, fn, help, example):
        sp = sub.add_parser(name, help=help, description=help, epilog="example:\n  " + example,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.set_defaults(fn=fn)
        sp.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars")
        return sp

    sp = add("replay", cmd_replay, "replay a model op by op on the emulated NPU and dump every op",
             "ascend-emu replay model.keras --precision-mode allow_mix_precision --dump npu/")
    _model_args(sp)
    _device_args(sp)
    sp = add("reference", cmd_reference, "run the model in TensorFlow float32 and dump every op (the benchmark)",
             "ascend-emu reference model.keras --dump bench/")
    _model_args(sp)
    sp = add("compare", cmd_compare, "compare an NPU dump with a benchmark dump, op by op",
             "ascend-emu compare npu/ bench/ --cosine 0.98 --limit 10 --csv compare.csv")
    sp.add_argument("npu_dir")
    sp.add_argument("bench_dir")
    sp.add_argument("--csv", metavar="FILE", help="write every row in msprobe's column order")
    sp.add_argument("--cosine", type=float, default=None, help="list ops with any output cosine <= C")
    sp.add_argument("--limit", type=int, default=None, help="at most N ops in that list (default 10)")
    _rules_arg(sp)
    sp.add_argument("--force", action="store_true",
                    help="compare even if the dumps are of different models or inputs (the output says so)")
    sp = add("overflow", cmd_overflow, "list overflowing ops, the first one, and a normal/abnormal verdict",
             "ascend-emu overflow npu/ --json overflow.json")
    sp.add_argument("dump")
    sp.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    sp = add("report", cmd_report, "write a self-contained HTML report with plots",
             "ascend-emu report npu/ bench/ -o report.html")
    sp.add_argument("npu_dir")
    sp.add_argument("bench_dir")
    sp.add_argument("-o", "--output", default="report.html")
    _rules_arg(sp)
    sp.add_argument("--force", action="store_true",
                    help="report even if the dumps are of different models or inputs (the report says so)")
    sp = add("export-msprobe", cmd_export_msprobe, "write a dump in msprobe's dump layout (step/rank/dump.json)",
             "ascend-emu export-msprobe npu/ msprobe-npu/ --step 0 --rank 0")
    sp.add_argument("dump", help="an ascend-emu dump directory")
    sp.add_argument("out", help="the msprobe dump root (OUT/step{N}/rank{R}/ is written)")
    sp.add_argument("--step", type=int, default=0, help="step number of the directory (default 0)")
    sp.add_argument("--rank", type=int, default=0, help="rank number of the directory (default 0)")
    sp.add_argument("--tensor-format", choices=("npy", "pt"), default="npy",
                    help="tensor files: .npy (default) or .pt (read by msprobe's PyTorch compare; needs torch)")
    sp.add_argument("--overwrite", action="store_true", help="replace an msprobe dump already there")
    sp = add("import-msprobe", cmd_import_msprobe, "read an msprobe dump (e.g. from a real NPU) as an ascend-emu dump",
             "ascend-emu import-msprobe hw-dump/ hw/ --against npu/ --mapping names.yaml")
    sp.add_argument("dir", help="the msprobe dump: its root, a step directory or a rank directory")
    sp.add_argument("out", help="the ascend-emu dump directory to write")
    sp.add_argument("--mapping", metavar="FILE",
                    help="msprobe name -> ascend-emu name, as YAML (name: name) or a two-column CSV")
    sp.add_argument("--against", metavar="DUMP",
                    help="the ascend-emu dump it will be compared with: names are checked against it and "
                         "matched ops take its op types and inputs")
    sp.add_argument("--allow-unmatched", action="store_true", help="import even if some names match no op of --against")
    sp.add_argument("--kind", choices=("npu", "bench"), default="npu", help="kind of the dump written (default npu)")
    sp.add_argument("--step", type=int, default=None, help="the step to read when the dump has several")
    sp.add_argument("--rank", type=int, default=None, help="the rank to read when the dump has several")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing dump in OUT")
    sp = add("fusion-bisect", cmd_bisect, "find the fusion rules that cost accuracy, by bisection",
             "ascend-emu fusion-bisect model.keras --precision-mode force_fp16")
    _model_args(sp, dump=False)
    _device_args(sp, fusion=False)
    sp.add_argument("--metric", default="cosine", choices=("cosine", "max_rel_err", "max_abs_err", "rmse"))
    sp.add_argument("--threshold", type=float, default=None,
                    help="how much the metric may differ between all-on and all-off before a rule is blamed")
    sp.add_argument("--keep-dumps", metavar="DIR", default=None, help="keep each configuration's dump under DIR")
    _sweep_args(sp)
    sp = add("mixlist-search", cmd_mixlist_search, "find the op types to black-list (CANN ops_info.json) so the "
                                                   "model meets an accuracy target under allow_mix_precision",
             'ascend-emu mixlist-search model.keras --target "cosine>=0.999" --output ops_info.json')
    _model_args(sp, dump=False)
    _device_args(sp)
    for act in sp._actions:
        if act.dest == "precision_mode":
            act.default, act.help = "allow_mix_precision", "allow_mix_precision (default), _fp16 or _bf16: the lists decide"
    sp.add_argument("--target", default="cosine>=0.999", metavar="METRIC>=VALUE",
                    help="accuracy of the outputs against float32: cosine>=C, max_rel_err<=E, max_abs_err<=E or "
                         "rmse<=E (default cosine>=0.999)")
    sp.add_argument("--output", "-o", default="ops_info.json", metavar="FILE",
                    help="the CANN modify_mixlist file to write (default ops_info.json)")
    sp.add_argument("--by", choices=("type", "name"), default="type",
                    help="black-list op types (CANN's lists are per type; name is refused, see README)")
    sp.add_argument("--beam", type=int, default=4, help="candidates replayed side by side per step (default 4)")
    sp.add_argument("--max-steps", type=int, default=32, help="at most this many greedy steps (default 32)")
    sp.add_argument("--json", metavar="FILE", help="also write every step, the cost and the ranking as JSON")
    _sweep_args(sp)
    sp = add("train", cmd_train, "train a Keras model step by step on the emulated NPU (forward, backward, "
                                 "optimizer, loss scaling), beside TensorFlow float32",
             "ascend-emu train model.keras --data train.npz --steps 50 --batch-size 32 "
             "--precision-mode allow_mix_precision --loss-scale dynamic --reference --dump npu-train/ "
             "--dump-steps 0,10,49 --json train.json --report train.html")
    sp.add_argument("model", help="a .keras file (compiled with a loss and an optimizer, or give --loss/--optimizer), "
                                  "or a TF1 MetaGraph (.meta) with --checkpoint, --loss-tensor and --train-op")
    sp.add_argument("--data", required=True, metavar="FILE.npz", help="training data: an .npz with arrays x and y")
    sp.add_argument("--steps", type=int, default=None, help="number of steps (default: one epoch, or --epochs)")
    sp.add_argument("--epochs", type=int, default=None, help="epochs, when --steps is not given")
    sp.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32)")
    sp.add_argument("--shuffle", action="store_true", help="a seeded permutation of the samples per epoch")
    sp.add_argument("--seed", type=int, default=0, help="seed of --shuffle (default 0)")
    sp.add_argument("--loss", default=None, metavar="NAME",
                    help="Keras loss name (default: the compiled one), e.g. sparse_categorical_crossentropy, "
                         "categorical_crossentropy, binary_crossentropy, mean_squared_error, mean_absolute_error; "
                         "append _from_logits for logits")
    sp.add_argument("--optimizer", default=None, metavar="NAME",
                    help="sgd, adam, adamw or rmsprop (default: the compiled one)")
    sp.add_argument("--learning-rate", type=float, default=None)
    sp.add_argument("--momentum", type=float, default=None, help="sgd, rmsprop")
    sp.add_argument("--nesterov", action="store_true", help="sgd")
    sp.add_argument("--beta-1", type=float, default=None, help="adam, adamw")
    sp.add_argument("--beta-2", type=float, default=None, help="adam, adamw")
    sp.add_argument("--epsilon", type=float, default=None, help="adam, adamw, rmsprop")
    sp.add_argument("--amsgrad", action="store_true", help="adam, adamw")
    sp.add_argument("--weight-decay", type=float, default=None, help="adamw")
    sp.add_argument("--rho", type=float, default=None, help="rmsprop")
    sp.add_argument("--centered", action="store_true", help="rmsprop")
    sp.add_argument("--loss-scale", default="none", metavar="SPEC",
                    help="none (default), fixed:N, dynamic (Keras LossScaleOptimizer / NpuLossScaleOptimizer: "
                         "2^15, x2 after 2000 good steps, /2 on overflow) or "
                         "exponential:init=..,incr_every=..,decr_every=..,incr_ratio=..,decr_ratio=..")
    sp.add_argument("--overflow-check", choices=("status", "isfinite"), default="status",
                    help="status (default: the float status register after the backward pass, as the NPU) or "
                         "isfinite (Inf/NaN in the gradients, as a plain Keras LossScaleOptimizer)")
    sp.add_argument("--reference", action="store_true",
                    help="also train in TensorFlow float32 from the same weights on the same batches")
    sp.add_argument("--dump", metavar="DIR", default=None, help="dump the listed steps to DIR/step-N")
    sp.add_argument("--dump-steps", type=_dump_steps, default=None, metavar="LIST",
                    help="steps to dump, e.g. 0,10,49 (default with --dump: the first and the last)")
    sp.add_argument("--overwrite", action="store_true", help="replace existing step dumps")
    dp = sp.add_argument_group("data parallel (NUMERICS.md section 12)")
    dp.add_argument("--ranks", type=int, default=1, metavar="N",
                    help="split each batch over N emulated ranks and all-reduce their gradients (default 1)")
    dp.add_argument("--allreduce", choices=("ring", "hd", "tree", "mesh"), default=None,
                    help="HCCL's algorithm: ring, hd (recursive halving-doubling; tree = hd) or mesh "
                         "(default: ring on Ascend910, mesh on Ascend910B)")
    dp.add_argument("--allreduce-dtype", choices=("float32", "float16"), default=None,
                    help="the all-reduce's accumulator (default float32; float16: gradients cast to fp16)")
    dp.add_argument("--check-rank-weights", action="store_true",
                    help="compare every rank's initial weights with rank 0's before training")
    dp.add_argument("--rank-init", type=_rank_init, action="append", metavar="RANK=SEED",
                    help="initialise RANK's copy of the model under another seed (repeatable)")
    tf1 = sp.add_argument_group("TF1 MetaGraph (model.meta)")
    tf1.add_argument("--checkpoint", metavar="PREFIX", default=None,
                     help="checkpoint the variables start from (e.g. model.ckpt, as Saver.save writes it)")
    tf1.add_argument("--x-name", default=None, metavar="NAME", help="input placeholder (default x)")
    tf1.add_argument("--y-name", default=None, metavar="NAME", help="target placeholder (default y)")
    tf1.add_argument("--loss-tensor", default=None, metavar="NAME", help="the loss tensor, e.g. loss:0")
    tf1.add_argument("--train-op", default=None, metavar="NAME", help="the op one training step runs")
    sp.add_argument("--json", metavar="FILE", help="write the per-step record as JSON")
    sp.add_argument("--report", metavar="FILE", help="write an HTML report (loss curves, loss scale, overflows)")
    _device_args(sp, training=True)
    sp = add("check", cmd_check, "the pre-tuning checklist: every item a program can decide (data, benchmark, "
                                 "training, mixed precision, loss scaling, fp16 overflow and error), Passed / Failed / "
                                 "Not checked; exit status 1 when an item failed",
             "ascend-emu check model.keras --data train.npz --benchmark bench.keras --steps 20 "
             "--precision-mode allow_mix_precision --loss-scale dynamic --json check.json --report check.html")
    sp.add_argument("model", help="a .keras file compiled with a loss and an optimizer (or give --loss/--optimizer)")
    sp.add_argument("--data", required=True, metavar="FILE.npz", help="training data: an .npz with arrays x and y")
    sp.add_argument("--benchmark", metavar="MODEL.keras", default=None,
                    help="the benchmark model: item 10 compares its compiled optimizer and loss")
    sp.add_argument("--benchmark-config", metavar="FILE.json", default=None,
                    help='the benchmark\'s hyperparameters, e.g. {"optimizer": "sgd", "learning_rate": 0.01, '
                         '"batch_size": 32, "epochs": 90, "loss": "sparse_categorical_crossentropy"}')
    sp.add_argument("--steps", type=int, default=20, help="training steps run by the reference and the emulator "
                                                          "(default 20)")
    sp.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32)")
    sp.add_argument("--epochs", type=int, default=None, help="the planned epochs (compared with the benchmark only)")
    sp.add_argument("--shuffle", action="store_true", help="a seeded permutation of the samples per epoch")
    sp.add_argument("--seed", type=int, default=0, help="seed of --shuffle (default 0)")
    sp.add_argument("--loss", default=None, metavar="NAME", help="Keras loss name (default: the compiled one)")
    sp.add_argument("--optimizer", default=None, metavar="NAME",
                    help="sgd, adam, adamw or rmsprop (default: the compiled one)")
    sp.add_argument("--learning-rate", type=float, default=None)
    sp.add_argument("--loss-scale", default="none", metavar="SPEC",
                    help="the port's loss scaling: none (default), fixed:N, dynamic or exponential:...")
    sp.add_argument("--overflow-check", choices=("status", "isfinite"), default="status",
                    help="the port's overflow check: status (the float status register) or isfinite")
    sp.add_argument("--json", metavar="FILE", help='write {"rows": [...]}')
    sp.add_argument("--report", metavar="FILE", help="write an HTML report: the table and the numeric rows' plots")
    sp.add_argument("--ops-info", metavar="FILE", help="write the suggested modify_mixlist when an item fails for "
                                                       "precision reasons")
    sp.add_argument("--keep-dumps", metavar="DIR", default=None,
                    help="keep the dumps the check writes (reference runs, emulated step 0) in DIR")
    _device_args(sp, training=True)
    sp = add("demo", cmd_demo, "the whole workflow on the bundled model: reference, replay, compare, overflow, report",
             "ascend-emu demo --out demo-output")
    sp.add_argument("--out", default="demo-output", help="output directory (default demo-output)")
    sp = add("random-errors", cmd_random_errors, "run a model N times with different run seeds (deterministic off) "
             "and find the first op where the runs differ", "ascend-emu random-errors model.keras --runs 2 "
             "--precision-mode must_keep_origin_dtype   (or --data train.npz --steps 20 --runs 4 --report re.html)")
    _model_args(sp, dump=False)
    sp.add_argument("--runs", type=int, default=2, help="number of runs (default 2), run k with run seed N + k")
    sp.add_argument("--out", default="random-errors-output", metavar="DIR",
                    help="each run's dumps go to DIR/run-K (default random-errors-output)")
    sp.add_argument("--json", metavar="FILE", help="write the result as JSON")
    sp.add_argument("--report", metavar="FILE", help="write an HTML report (every run's loss curve when training)")
    tr = sp.add_argument_group("training (give --data to train instead of replaying)")
    tr.add_argument("--data", default=None, metavar="FILE.npz", help="training data: an .npz with arrays x and y")
    tr.add_argument("--steps", type=int, default=None, help="steps per run (every step is dumped)")
    tr.add_argument("--batch-size", type=int, default=None)
    tr.add_argument("--loss", default=None, metavar="NAME")
    tr.add_argument("--optimizer", default=None, metavar="NAME")
    tr.add_argument("--learning-rate", type=float, default=None)
    tr.add_argument("--loss-scale", default=None, metavar="SPEC")
    tr.add_argument("--shuffle", action="store_true")
    _device_args(sp, training=True)
    add("ops", cmd_ops, "list the op types with an emulated kernel", "ascend-emu ops")
    add("rules", cmd_rules, "list the fusion rules and their numerics", "ascend-emu rules")
    return p


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "fn", None):
        parser.print_help()
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.formatwarning = lambda msg, cat, *rest: f"ascend-emu: warning: {msg}\n"
        try:
            return a.fn(a)
        except AscendEmuError as e:
            print(f"ascend-emu: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            # a file-system fault the layers below did not name (they turn the ones they expect into
            # AscendEmuError): still one line, never a traceback
            where = f": {e.filename}" if getattr(e, "filename", None) else ""
            print(f"ascend-emu: error: {e.strerror or e}{where}; check the path, its permissions and the free "
                  "space", file=sys.stderr)
            return 2
        except MemoryError:
            print("ascend-emu: error: out of memory; use a smaller model, batch or --shape, or --stats-only",
                  file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("ascend-emu: interrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())

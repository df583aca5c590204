"""ascend-emu command line: a thin shell over the public API, one call per subcommand (:mod:`.commands`;
the options they share are in :mod:`.options`)."""
from __future__ import annotations

import argparse
import os
import sys
import warnings

from ..errors import AscendEmuError, printable
from .commands import (cmd_bisect, cmd_check, cmd_compare, cmd_demo, cmd_export_msprobe, cmd_import_msprobe,
                       cmd_mixlist_search, cmd_ops, cmd_overflow, cmd_random_errors, cmd_reference, cmd_replay,
                       cmd_report, cmd_rules, cmd_socs, cmd_train)
from .commands import cmd_fit, cmd_run, cmd_sensitivity, cmd_torch_run, cmd_warmup
from .memory import out_of_memory_line
from .options import _device_args, _dump_steps, _model_args, _rank_init, _rules_arg, _sweep_args, check_outputs
from .options import torch_numerics_args

EPILOG = """examples:
  ascend-emu demo                                   # the whole workflow on the bundled model
  ascend-emu reference model.keras --dump bench/
  ascend-emu replay model.keras --precision-mode allow_mix_precision --dump npu/
  ascend-emu compare npu/ bench/ --cosine 0.98 --limit 10 --csv compare.csv
  ascend-emu overflow npu/
  ascend-emu report npu/ bench/ -o report.html
  ascend-emu fusion-bisect model.keras --precision-mode force_fp16
  ascend-emu fusion-bisect model.keras --data train.npz --steps 20 --precision-mode allow_mix_precision
  ascend-emu mixlist-search model.keras --target "cosine>=0.999" --output ops_info.json
  ascend-emu train model.keras --data train.npz --steps 50 --loss-scale dynamic --reference --report train.html
  ascend-emu check model.keras --data train.npz --loss-scale dynamic --report check.html
  ascend-emu export-msprobe npu/ msprobe-npu/          # msprobe's layout, for msprobe compare
  ascend-emu import-msprobe hw-dump/ hw/ --against npu/ --mapping names.yaml
  ascend-emu torch-run --dump npu/ --reference train.py --epochs 1   # a torch_npu script, unchanged
  ascend-emu socs                                   # the SoCs: Ascend910, 910B, 910_93, 310P3, 950
  ascend-emu fit hw/ model.keras --json fit.json     # which assumed parameters reproduce a dump
  ascend-emu sensitivity model.keras --dump npu/     # which conclusions hold under every assumption
  ascend-emu run train_npu.py --epochs 2            # a script ported to Ascend (npu_bridge / npu_device), unchanged
"""



def _sweep_training_args(tr) -> None:
    """The training options a sweep over training runs takes (fusion-bisect and mixlist-search with --data)."""
    tr.add_argument("--batch-size", type=int, default=None, help="samples per step (default 32)")
    tr.add_argument("--loss", default=None, metavar="NAME", help="Keras loss name (default: the compiled one)")
    tr.add_argument("--optimizer", default=None, metavar="NAME", help="sgd, adam, adamw or rmsprop (default: the "
                                                                      "compiled one)")
    tr.add_argument("--learning-rate", type=float, default=None)
    tr.add_argument("--loss-scale", default=None, metavar="SPEC", help="none (default), fixed:N, dynamic or "
                                                                       "exponential:... (as train)")
    tr.add_argument("--shuffle", action="store_true", help="a seeded permutation of the samples per epoch (--seed)")

def build_parser():
    p = argparse.ArgumentParser(prog="ascend-emu", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Emulate Ascend NPU numerics on a CPU: replay TensorFlow, ONNX and exported "
                                            "PyTorch (.pt2) models or run a PyTorch script as torch_npu would, dump "
                                            "every op, compare with float32, find the op that goes wrong.",
                                epilog=EPILOG)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def add(name, fn, help, example):
        sp = sub.add_parser(name, help=help, description=help, epilog="example:\n  " + example,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.set_defaults(fn=fn)
        sp.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress bars")
        return sp

    sp = add("replay", cmd_replay, "replay a model (Keras, SavedModel, GraphDef, .onnx, or a torch.export .pt2) op "
                                   "by op on the emulated NPU and dump every op",
             "ascend-emu replay model.keras --precision-mode allow_mix_precision --dump npu/\n"
             "  ascend-emu replay model.pt2 --soc Ascend910B --dump npu/")
    _model_args(sp)
    _device_args(sp)
    sp = add("reference", cmd_reference, "run the model in float32 (TensorFlow; onnxruntime for an .onnx model; torch for a "
                                         ".pt2) and "
                                         "dump every op (the benchmark)",
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
    sp.add_argument("--workers", type=int, default=None, metavar="N",
                    help="tensor pairs compared at once, in threads (default: the cores, at most 4); the rows "
                         "are the same for any N")
    sp = add("overflow", cmd_overflow, "list overflowing ops, the first one, and a normal/abnormal verdict",
             "ascend-emu overflow npu/ --json overflow.json")
    sp.add_argument("dump")
    sp.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    sp.add_argument("--ops-info", metavar="FILE", help="write the suggested modify_mixlist (CANN ops_info.json: the "
                    "op types of an abnormal first overflow black-listed) to FILE")
    sp = add("report", cmd_report, "write a self-contained HTML report: the op graph coloured by error, plots, tables",
             "ascend-emu report npu/ bench/ -o report.html")
    sp.add_argument("npu_dir")
    sp.add_argument("bench_dir")
    sp.add_argument("-o", "--output", default="report.html")
    _rules_arg(sp)
    sp.add_argument("--force", action="store_true",
                    help="report even if the dumps are of different models or inputs (the report says so)")
    sp = add("export-msprobe", cmd_export_msprobe, "write a dump in msprobe's dump layout (step/rank/dump.json)",
             "ascend-emu export-msprobe npu/ msprobe-npu/ --step 0 --rank 0 [--framework pytorch]")
    sp.add_argument("dump", help="an ascend-emu dump directory")
    sp.add_argument("out", help="the msprobe dump root (OUT/step{N}/rank{R}/ is written)")
    sp.add_argument("--step", type=int, default=0, help="step number of the directory (default 0)")
    sp.add_argument("--rank", type=int, default=0, help="rank number of the directory (default 0)")
    sp.add_argument("--tensor-format", choices=("npy", "pt"), default=None,
                    help="tensor files: .npy (the graph layout's default) or .pt (read by msprobe's PyTorch "
                         "compare; needs torch)")
    sp.add_argument("--framework", choices=("graph", "pytorch"), default="graph",
                    help="graph (default): every op one Functional.<name>.0.forward key; pytorch: msprobe's "
                         "PyTorch dump of a torch script (.pt files, Aten.* keys of a torch run kept, "
                         ".backward entries with input/output)")
    sp.add_argument("--overwrite", action="store_true", help="replace an msprobe dump already there")
    sp = add("torch-run", cmd_torch_run, "run a PyTorch script written for torch_npu, unchanged, on the emulated NPU",
             "ascend-emu torch-run --soc Ascend910B --dump npu/ --reference --json run.json train.py --epochs 1")
    sp.add_argument("--soc", default="Ascend910B", help="the emulated SoC (ascend-emu socs; default Ascend910B); "
                                                        "torch_npu's defaults follow it")
    sp.add_argument("--dump", metavar="DIR", help="ascend-emu dumps of the dumped steps in DIR/step-N")
    sp.add_argument("--dump-steps", type=_dump_steps, default=None, metavar="N,N,...",
                    help="the training steps to dump (default 0)")
    sp.add_argument("--stats-only", action="store_true", help="dump statistics only, no tensors")
    sp.add_argument("--reference", action="store_true", help="also the same aten calls in torch float32 on the same "
                                                             "inputs and weights, dumped in DIR/reference/step-N")
    sp.add_argument("--steps", type=int, default=None, metavar="N",
                    help="stop the script at the end of its N-th training step (default: run it to its end)")
    sp.add_argument("--no-aicpu-fallback", action="store_true",
                    help="refuse an aten op without an emulated kernel instead of running it on the AI CPU")
    sp.add_argument("--json", metavar="FILE", help="write the run's record: the torch_npu options and where each "
                                                   "came from, what ran where, the steps")
    sp.add_argument("--overwrite", action="store_true", help="replace dumps already in --dump")
    torch_numerics_args(sp)
    sp.add_argument("script", help="the Python script")
    sp.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
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
    sp.add_argument("--metric", default=None, choices=("cosine", "max_rel_err", "max_abs_err", "rmse", "loss_rel_err",
                                                       "loss_abs_err"),
                    help="default cosine; with --data loss_rel_err (or loss_abs_err): the loss curve against float32's")
    sp.add_argument("--threshold", type=float, default=None,
                    help="how much the metric may differ between all-on and all-off before a rule is blamed")
    sp.add_argument("--keep-dumps", metavar="DIR", default=None, help="keep each configuration's dump under DIR")
    sp.add_argument("--json", metavar="FILE", help="also write every configuration tried and the verdict as JSON")
    tr = sp.add_argument_group("training (bisect over a training's loss curve: --data and --steps)")
    tr.add_argument("--data", metavar="FILE.npz", default=None,
                    help="training data (x and y): each configuration trains --steps steps from the same weights on "
                         "the same batches against one float32 training")
    tr.add_argument("--steps", type=int, default=None, help="training steps per configuration (required with --data)")
    _sweep_training_args(tr)
    _sweep_args(sp)
    sp = add("mixlist-search", cmd_mixlist_search, "find the op types to black-list (CANN ops_info.json) so the "
                                                   "model meets an accuracy target under allow_mix_precision",
             'ascend-emu mixlist-search model.keras --target "cosine>=0.999" --output ops_info.json')
    _model_args(sp, dump=False)
    _device_args(sp)
    sp.set_defaults(precision_mode_default="allow_mix_precision")
    for act in sp._actions:
        if act.dest == "precision_mode":
            act.help = "allow_mix_precision (default), _fp16 or _bf16: the lists decide"
    sp.add_argument("--target", default="cosine>=0.999", metavar="METRIC>=VALUE",
                    help="accuracy of the outputs against float32: cosine>=C, max_rel_err<=E, max_abs_err<=E or "
                         "rmse<=E (default cosine>=0.999); with --data: loss_rel_err<=E or loss_abs_err<=E")
    sp.add_argument("--output", "-o", default="ops_info.json", metavar="FILE",
                    help="the CANN modify_mixlist file to write (default ops_info.json)")
    sp.add_argument("--by", choices=("type", "name"), default="type",
                    help="black-list op types (CANN's lists are per type; name is refused, see README)")
    sp.add_argument("--beam", type=int, default=4, help="candidates replayed side by side per step (default 4)")
    sp.add_argument("--max-steps", type=int, default=32, help="at most this many greedy steps (default 32)")
    sp.add_argument("--json", metavar="FILE", help="also write every step, the cost and the ranking as JSON")
    tr = sp.add_argument_group("training (search over a training's loss curve: --data, --steps and a loss target)")
    tr.add_argument("--data", metavar="FILE.npz", default=None,
                    help="training data (x and y): each candidate trains --steps steps against one float32 training; "
                         "the target is then loss_rel_err<=E or loss_abs_err<=E")
    tr.add_argument("--steps", type=int, default=None, help="training steps per candidate (required with --data)")
    _sweep_training_args(tr)
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
                                 "Not checked; exit status 1 when an item failed or a run it needs could not be made",
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
    sp = add("warmup", cmd_warmup, "compile the kernels a first run needs into Numba's cache, in parallel processes "
             "(make test runs it after installing, make demo with --demo)", "ascend-emu warmup --jobs 2")
    sp.add_argument("--jobs", "-j", type=int, default=None, help="processes at once (default: the cores, at most 16)")
    sp.add_argument("--demo", action="store_true", help="only the kernels `ascend-emu demo` compiles")
    sp = add("random-errors", cmd_random_errors, "run a model N times with different run seeds (deterministic off) "
             "and find the first op where the runs differ", "ascend-emu random-errors model.keras --runs 2 "
             "--precision-mode must_keep_origin_dtype   (or --data train.npz --steps 20 --runs 4 --report re.html)")
    _model_args(sp, dump=False)
    sp.add_argument("--runs", type=int, default=2, help="number of runs (default 2), run k with run seed N + k")
    _sweep_args(sp)
    sp.add_argument("--out", default="random-errors-output", metavar="DIR",
                    help="each run's dumps go to DIR/run-K (default random-errors-output)")
    sp.add_argument("--overwrite", action="store_true", help="replace the dumps of earlier runs in --out")
    sp.add_argument("--full-dumps", action="store_true",
                    help="dump every tensor of every run (default: statistics and a sha256 of every output, a "
                         "replay's final outputs, and the tensors of the op where the runs part and of its inputs)")
    sp.add_argument("--json", metavar="FILE", help="write the result as JSON")
    sp.add_argument("--report", metavar="FILE", help="write an HTML report (every run's loss curve when training)")
    tr = sp.add_argument_group("training (give --data to train instead of replaying)")
    tr.add_argument("--data", default=None, metavar="FILE.npz", help="training data: an .npz with arrays x and y")
    tr.add_argument("--steps", type=int, default=None, help="steps per run (every step is dumped and compared)")
    tr.add_argument("--batch-size", type=int, default=None)
    tr.add_argument("--loss", default=None, metavar="NAME")
    tr.add_argument("--optimizer", default=None, metavar="NAME")
    tr.add_argument("--learning-rate", type=float, default=None)
    tr.add_argument("--loss-scale", default=None, metavar="SPEC")
    tr.add_argument("--shuffle", action="store_true")
    _device_args(sp, training=True)
    sp = add("fit", cmd_fit, "fit the assumed parameters (cube model, op model, ...) to a dump: rerun every dumped op "
                             "on its own inputs under each candidate value",
             "ascend-emu fit hw/ model.keras --json fit.json")
    sp.add_argument("dump", help="the dump to fit (a real NPU's, imported with import-msprobe, or a replay's)")
    _model_args(sp, dump=False)
    _device_args(sp)
    sp.add_argument("--param", action="append", default=[], metavar="NAME",
                    help="fit only this assumed parameter (repeatable; default all: see NUMERICS.md)")
    sp.add_argument("--json", metavar="FILE", help="write the result as JSON")
    _sweep_args(sp)
    sp = add("sensitivity", cmd_sensitivity, "replay under every variant of the assumed parameters and say which "
                                             "conclusions (first divergent op, first overflow, output cosine) hold",
             "ascend-emu sensitivity model.keras --precision-mode allow_mix_precision --dump npu/ --report s.html")
    _model_args(sp, dump=False)
    _device_args(sp)
    sp.add_argument("--dump", metavar="DIR", default=None,
                    help="the NPU dump of this run: the result is kept beside it (DIR.sensitivity.json), where "
                         "compare and report find it")
    sp.add_argument("--param", action="append", default=[], metavar="NAME",
                    help="vary only this assumed parameter (repeatable; default all)")
    sp.add_argument("--cosine-tol", type=float, default=1e-3,
                    help="the output cosine is robust when its band across variants is within this (default 1e-3)")
    sp.add_argument("--keep-dumps", metavar="DIR", default=None, help="keep each variant's dump under DIR")
    sp.add_argument("--overwrite", action="store_true", help="replace the dumps of an earlier run in --keep-dumps")
    sp.add_argument("--json", metavar="FILE", help="write the result as JSON")
    sp.add_argument("--report", metavar="FILE", help="write the HTML report (per-op cosine bands)")
    tr = sp.add_argument_group("training (give --data and --steps to train every variant instead of replaying)")
    tr.add_argument("--data", default=None, metavar="FILE.npz", help="training data: an .npz with arrays x and y")
    tr.add_argument("--steps", type=int, default=None, help="training steps per variant")
    tr.add_argument("--loss-tol", type=float, default=1e-3,
                    help="the loss curve is robust when no variant's loss moves by more than this, relative "
                         "(default 1e-3)")
    tr.add_argument("--batch-size", type=int, default=None)
    tr.add_argument("--loss", default=None, metavar="NAME")
    tr.add_argument("--optimizer", default=None, metavar="NAME")
    tr.add_argument("--learning-rate", type=float, default=None)
    tr.add_argument("--loss-scale", default=None, metavar="SPEC")
    _sweep_args(sp)
    sp = add("run", cmd_run, "run a script ported to Ascend (npu_bridge / npu_device) unchanged on the emulated NPU, "
                             "with the NPU options it sets itself",
             "ascend-emu run --json run.json train_npu.py --epochs 2")
    from ..numerics.policy import SOC_ALIASES, SOCS

    sp.add_argument("--soc", default="Ascend910", choices=tuple(SOCS) + tuple(SOC_ALIASES),
                    help="the emulated SoC (default Ascend910); the script's options set everything else")
    sp.add_argument("--json", metavar="FILE", help="write the run's record: every option taken from the script and "
                                                   "where it was set, each step, the dumps")
    sp.add_argument("--ranks", type=int, default=1, metavar="N",
                    help="each training step over N emulated data-parallel ranks: the script's batch in N shards, "
                         "the gradients all-reduced as HCCL does (default 1; the script's rank helpers say 1)")
    sp.add_argument("--msprobe", action="store_true",
                    help="also write each dump the script asks for in msprobe's layout (dump_path/msprobe/stepN/rank0)")
    sp.add_argument("script", help="the Python script, run as __main__")
    sp.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    add("ops", cmd_ops, "list the op types with an emulated kernel", "ascend-emu ops")
    add("rules", cmd_rules, "list the fusion rules and their numerics", "ascend-emu rules")
    sp = add("socs", cmd_socs, "list the emulated SoCs: cube operand types, bf16, overflow modes, cores, kernels, HF32",
             "ascend-emu socs --json")
    sp.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


class _PrintableStdout:
    """A command's standard output with every control character but newline and tab escaped (``\\x1b``):
    whatever reaches it from a dump or a model (an op name, a file name in a manifest) cannot clear the
    screen, set the terminal's title or overwrite a result line with a carriage return. (The text
    builders also escape the newlines inside a name; standard error keeps the progress bars' ``\\r``.)"""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        if isinstance(text, str) and not text.isprintable():
            text = "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


#: the commands that run the user's own script (its output is not ours to escape)
_SCRIPT_COMMANDS = ("run", "torch-run")


def main(argv=None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "fn", None):
        parser.print_help()
        return 2
    if a.cmd in _SCRIPT_COMMANDS:
        # the user's own script prints through the real stream: its progress bars' \r and colours are its own
        return _run(a)
    stdout = sys.stdout
    sys.stdout = _PrintableStdout(stdout)
    try:
        return _run(a)
    finally:
        sys.stdout = stdout


def _run(a) -> int:
    # catch_warnings restores the filters and showwarning, not formatwarning: put Python's back ourselves, so a
    # program that calls main() keeps its own warning format afterwards
    formatwarning = warnings.formatwarning
    try:
        return _run_command(a)
    finally:
        warnings.formatwarning = formatwarning


def _run_command(a) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.formatwarning = lambda msg, cat, *rest: f"ascend-emu: warning: {printable(msg)}\n"
        try:
            check_outputs(a)    # before anything runs: no output over an input, another output or into a dump
            return a.fn(a)
        except AscendEmuError as e:
            if out_of_memory_line(e):
                return _out_of_memory(e)
            print(f"ascend-emu: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            if out_of_memory_line(e):
                return _out_of_memory(e)
            # a file-system fault the layers below did not name (they turn the ones they expect into
            # AscendEmuError): still one line, never a traceback
            where = f": {e.filename}" if getattr(e, "filename", None) else ""
            print(f"ascend-emu: error: {e.strerror or e}{where}; check the path, its permissions and the free "
                  "space", file=sys.stderr)
            return 2
        except Exception as e:  # noqa: BLE001
            # MemoryError, and what TensorFlow raises instead under a memory limit (a library that cannot be
            # mapped, a thread without a stack): one line saying memory ran out; anything else is a bug, raised
            if out_of_memory_line(e) is None:
                raise
            return _out_of_memory(e)
        except KeyboardInterrupt:
            print("ascend-emu: interrupted", file=sys.stderr)
            return 130


def _out_of_memory(e: BaseException) -> int:
    """Say in one line that memory ran out (:mod:`ascend_emu.cli.memory`); exit status 2."""
    print(f"ascend-emu: error: {out_of_memory_line(e)}", file=sys.stderr)
    # half-built TensorFlow objects fail again as they are collected at exit: not the user's concern
    sys.unraisablehook = lambda unraisable: None
    return 2


if __name__ == "__main__":
    sys.exit(main())

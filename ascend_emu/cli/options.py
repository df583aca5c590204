"""The options the subcommands share and their parsing: model, device, rules, sweeps, training."""
from __future__ import annotations

import argparse

from ..errors import AscendEmuError
from ..npu.precision import TRAIN_PRECISION_DEFAULT  # the TF adapter's training default


def _model_args(p, dump=True):
    p.add_argument("model", help="a .keras file, SavedModel directory, frozen GraphDef (.pb/.pbtxt), ONNX model "
                                 "(.onnx) or exported PyTorch program (.pt2, torch.export.save)")
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


class _Given(argparse.Action):
    """Store the option's value and note that it was given (``a.given``): fit and sensitivity --dump take the
    configuration the dump's manifest records for the options not given."""

    def __call__(self, parser, ns, values, option_string=None):
        setattr(ns, self.dest, values)
        ns.given = set(getattr(ns, "given", None) or ()) | {self.dest}


def _device_args(p, fusion=True, training=False):
    from ..npu.precision import PRECISION_MODES, PRECISION_MODES_V2
    from ..numerics.policy import HF32_BITS, HF32_FAMILY_ROUNDING, HF32_ROUNDINGS, SOC_ALIASES, SOCS

    if training:
        p.add_argument("--precision-mode", default=None, choices=PRECISION_MODES, action=_Given,
                       help="CANN precision_mode (default: the TF adapter's training default, must_keep_origin_dtype "
                            "where the SoC's cube has float32 (Ascend910B, Ascend910_93, Ascend950), else "
                            "allow_fp32_to_fp16)")
    else:
        p.add_argument("--precision-mode", default=None, choices=PRECISION_MODES, action=_Given,
                       help="CANN precision_mode (default force_fp16, the TF adapter's and ATC's inference default)")
    p.add_argument("--precision-mode-v2", default=None, action=_Given, choices=tuple(PRECISION_MODES_V2),
                   help="CANN precision_mode_v2 instead of --precision-mode (not both): fp16 = force_fp16, origin = "
                        "must_keep_origin_dtype, cube_fp16in_fp32out, mixed_float16 = allow_mix_precision, "
                        "mixed_bfloat16 = allow_mix_precision_bf16 ; mixed_hif8, cube_hif8: "
                        "the Ascend950's HiFloat8 cube operands")
    p.set_defaults(training_defaults=training)
    p.add_argument("--overflow-mode", choices=("saturation", "inf_nan"), default=None, action=_Given,
                   help="default: the SoC's (Ascend910, Ascend310P3 saturation; the others inf_nan)")
    p.add_argument("--modify-mixlist", metavar="FILE", action=_Given, help="CANN mixlist edits (JSON)")
    p.add_argument("--keep-dtype", metavar="FILE", action=_Given,
                   help="ATC's --keep_dtype file: node names (one a line; OpType::<type> for a type) kept in their "
                        "original dtype (float32) under any precision mode")
    p.add_argument("--soc", default="Ascend910", choices=tuple(SOCS) + tuple(SOC_ALIASES), action=_Given,
                   help="the emulated SoC (default Ascend910; `ascend-emu socs` lists what each has)")
    p.add_argument("--allow-hf32", default=None, action=_Given, metavar="conv|matmul|conv,matmul|none",
                   help="cube ops whose float32 operands are rounded to HF32 (TF ENABLE_HF32_EXECUTION, ATC "
                        "--allow_hf32; default: the SoC's, conv on Ascend910B, Ascend910_93 and Ascend950)")
    p.add_argument("--hf32-bits", default=None, type=int, choices=HF32_BITS,
                   help="stored significand bits of HF32 (default: the SoC's, 11 on Ascend910B and Ascend910_93, "
                        "10 on Ascend950 (assumed))")
    p.add_argument("--hf32-conv-rounding", default=HF32_FAMILY_ROUNDING["conv"], choices=HF32_ROUNDINGS,
                   help="HF32 tie rule of the convolutions (default rint: nearest even, their kernels' transMode 0)")
    p.add_argument("--hf32-matmul-rounding", default=HF32_FAMILY_ROUNDING["matmul"], choices=HF32_ROUNDINGS,
                   help="HF32 tie rule of MatMul / BatchMatMul / Einsum (default round: ties away from zero, "
                        "MatMulV3's SetHF32(true, 1))")
    p.add_argument("--hf32-rounding", default=None, choices=HF32_ROUNDINGS,
                   help="override every family's HF32 tie rule: rint (nearest even), round (ties away) or trunc "
                        "(toward zero)")
    p.add_argument("--cce-ftz", choices=("on", "off"), default=None, action=_Given,
                   help="Exp, Ln, Reciprocal, Sqrt, Rsqrt, Div flush subnormals (the 950's --cce-ftz; default: the "
                        "SoC's, on for Ascend950 only)")
    p.add_argument("--hif8-rounding", choices=("round", "hybrid"), default=None,
                   help="cube_hif8 / mixed_hif8: rounding of the Casts to HiFloat8 (default round: half away from 0)")
    p.add_argument("--cube-mx", choices=("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "float4_e1m2"),
                   action=_Given, default=None,
                   help="what-if (Ascend950): MatMul/BatchMatMul operands MX block-quantized along K to "
                        "this element format, one E8M0 scale per 32, multiplied in float32")
    p.add_argument("--hif8-cube-out", choices=("16bit", "float32"), default=None,
                   help="cube_hif8 / mixed_hif8: output dtype of a HiFloat8 cube op (default 16bit: fp16, bf16 for "
                        "a bf16 op)")
    torch_numerics_args(p)
    if fusion:
        p.add_argument("--fusion-switch", metavar="FILE",
                       help="CANN fusion_switch.cfg (JSON, or ATC's PassName:on|off lines)")
        p.add_argument("--fusion-off", action="store_true",
                       help="turn every fusion pass off (precision_tool's fusion-off)")
    p.add_argument("--no-aicpu-fallback", action="store_true",
                   help="fail on ops without an AI Core kernel instead of running them through TensorFlow")
    p.add_argument("--subnormals", choices=("keep", "flush"), default="keep", action=_Given)
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
    p.add_argument("--multicore-reduce-min-chunk", type=int, default=None, metavar="N",
                   help="assumed: a reduction splits over cores only if each core gets at least N elements "
                        "(default 256; NUMERICS.md section 11)")


def _device(a):
    from ..npu.device import Device

    d = Device(**_plain_device_kwargs(a))
    _refuse_idle_options(a, d)
    return d


def _plain_device_kwargs(a) -> dict:
    cm = {k: v for k, v in {"block_size": a.cube_block_size, "block_sum": a.cube_block_sum,
                            "extra_bits": a.cube_extra_bits, "normalize": a.cube_normalize,
                            "conv_k_order": a.cube_conv_k_order}.items() if v is not None}
    fusion = "off" if getattr(a, "fusion_off", False) else getattr(a, "fusion_switch", None)
    return {**_mode_options(a), **_device_options(a, cm, fusion)}


def _device_for_dump(a, dump):
    """fit and sensitivity --dump: the run's Device, the options the command line did not give taken from the
    configuration the dump's manifest records; and those settings ("soc=Ascend910B", ...) where they changed
    the run (issue 45 item 9). Options given that differ from the dump's are refused by the command."""
    from ..analysis.dump import load_dump
    from ..npu.device import Device
    from ..tools.fit import adopt_configuration

    kw, adopted = adopt_configuration(load_dump(dump).config, _plain_device_kwargs(a), getattr(a, "given", None) or ())
    d = Device(**kw)
    _refuse_idle_options(a, d)
    return d, adopted


def _refuse_idle_options(a, d) -> None:
    """An option of a mode the run is not in does nothing: said in one line instead of accepted without a word."""
    from ..npu.precision import HIF8_MODES

    idle = [f for f, v in (("--hif8-rounding", a.hif8_rounding), ("--hif8-cube-out", a.hif8_cube_out))
            if v is not None]
    if idle and d.precision.mode not in HIF8_MODES:
        raise AscendEmuError(f"{' and '.join(idle)} act{'' if len(idle) > 1 else 's'} in the precision modes {', '.join(sorted(HIF8_MODES))} "
                             f"only; this run's is {d.precision.mode}: drop {'them' if len(idle) > 1 else 'it'} or "
                             "choose one of those modes")
    if a.hf32_rounding is not None and not d.numerics.allow_hf32:
        raise AscendEmuError("--hf32-rounding acts where HF32 is on, and it is off in this run (the SoC's default or "
                             "--allow-hf32 none): drop it or turn HF32 on with --allow-hf32 conv, matmul or conv,matmul")


def _mode_options(a) -> dict:
    """precision_mode / precision_mode_v2 as given (the Device refuses both); neither: the command's default
    (training: the SoC's; mixlist-search: allow_mix_precision; else the Device's, force_fp16)."""
    if a.precision_mode is not None or a.precision_mode_v2 is not None:
        return {"precision_mode": a.precision_mode, "precision_mode_v2": a.precision_mode_v2}
    default = getattr(a, "precision_mode_default", None)
    if default is None and getattr(a, "training_defaults", False):
        default = TRAIN_PRECISION_DEFAULT[a.soc]
    return {"precision_mode": default}


def torch_numerics_args(p):
    """The torch eager path's assumed parameters (NUMERICS.md section 16): replay takes them so that fit and
    sensitivity can name them; torch-run and ae.torch.emulate read them."""
    from ..numerics.policy import COMPOUND_OPS, FA_KV_BLOCKS, FLOAT_STATUS_CLEARS, USE_FP16_OUTS

    p.add_argument("--fa-kv-block", type=int, choices=FA_KV_BLOCKS, default=128,
                   help="torch: FlashAttentionScore's key block along S2, one online-softmax rescale per block "
                        "(default 128, assumed)")
    p.add_argument("--use-fp16-out", choices=USE_FP16_OUTS, default="float16",
                   help="torch: the output of a float32 cube op whose operands cubeMathType casts to fp16 (USE_FP16, "
                        "the 910's default): float16 then widened (default, assumed) or float32")
    p.add_argument("--compound-ops", choices=COMPOUND_OPS, default="sequence",
                   help="torch: silu, addcmul, addcdiv, lerp on 16-bit tensors as vector ops in sequence, one rounding "
                        "each (default, assumed), or in float32 with one rounding")
    p.add_argument("--float-status-clear", choices=FLOAT_STATUS_CLEARS, default="update",
                   help="torch, saturation SoCs: where the float status register is cleared under upstream's "
                        "GradScaler: at its update (default, assumed: the next forward counts) or at the iteration's "
                        "first scale() (as torch_npu's scaler)")


def torch_numerics_options(a) -> dict:
    return dict(fa_kv_block=a.fa_kv_block, use_fp16_out=a.use_fp16_out, compound_ops=a.compound_ops,
                float_status_clear=a.float_status_clear)


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
                multicore=_multicore(a, MultiCoreModel),
                allow_hf32=a.allow_hf32, hf32_rounding=a.hf32_rounding, hf32_bits=a.hf32_bits,
                hf32_conv_rounding=a.hf32_conv_rounding, hf32_matmul_rounding=a.hf32_matmul_rounding,
                cce_ftz=None if getattr(a, "cce_ftz", None) is None else a.cce_ftz == "on",
                hif8_rounding=a.hif8_rounding or "round", hif8_cube_out=a.hif8_cube_out or "16bit", cube_mx=a.cube_mx,
                keep_dtype=getattr(a, "keep_dtype", None), **torch_numerics_options(a))


def _multicore(a, cls):
    kw = {k: v for k, v in (("aicore_num", a.aicore_num),
                            ("reduce_min_chunk", getattr(a, "multicore_reduce_min_chunk", None))) if v is not None}
    return cls(**kw) if kw else None


def _rules_arg(p):
    p.add_argument("--rules", choices=("ascend-emu", "msprobe"), default="ascend-emu",
                   help="how Result is decided: ascend-emu (default: the cosine / MaxAbsErr rule) or msprobe "
                        "(msprobe 26.x's checkers: pass / warning / error)")


def _select(a):
    from ..analysis.dump import op_selector

    return op_selector(a.select, a.select_type)


def _shapes(a):
    return a.shape or None


def _sweep_args(p):
    p.add_argument("--scheduler", default=None, metavar="none|local|tcp://HOST:PORT",
                   help="where the replays run: local (a Dask LocalCluster of worker processes; the default with "
                        "Dask installed on 3 or more cores), none (serial, in this process; the default on 1 or 2 "
                        "cores, where a cluster's start costs more than the second core gives, or without Dask) or "
                        "the address of a running Dask scheduler")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="workers of --scheduler local (default: the cores)")
    p.add_argument("--serial", action="store_true",
                   help="run one after the other in this process (the same as --scheduler none)")


def _scheduler(a):
    """The sweep's scheduler from --scheduler and --serial (None: the sweep layer's default)."""
    if getattr(a, "serial", False):
        if a.scheduler not in (None, "none"):
            raise AscendEmuError(f"--serial runs in this process, --scheduler {a.scheduler} on a cluster: give one")
        return "none"
    return a.scheduler


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
    from ..frontend.tf.tf1_step import train_step_from_tf1_graph

    missing = [f for f, v in (("--checkpoint", a.checkpoint), ("--loss-tensor", a.loss_tensor),
                              ("--train-op", a.train_op)) if v is None]
    if missing:
        raise AscendEmuError(f"training a MetaGraph needs {', '.join(missing)} (and --x-name/--y-name unless its "
                             "placeholders are x and y)")
    return train_step_from_tf1_graph(a.model, x=a.x_name or "x", y=a.y_name or "y", loss=a.loss_tensor,
                                     train_op=a.train_op, checkpoint=a.checkpoint)


#: options naming a file a command writes, and (per command) a directory it writes into
_OUTPUT_FILES = ("json", "report", "ops_info", "csv", "output")
_OUTPUT_DIRS = {"replay": ("dump",), "reference": ("dump",), "train": ("dump",), "check": ("keep_dumps",),
                "fusion-bisect": ("keep_dumps",), "random-errors": ("out",), "demo": ("out",),
                "export-msprobe": ("out",), "import-msprobe": ("out",), "sensitivity": ("keep_dumps",),
                "torch-run": ("dump",)}
#: options naming what a command reads (``dump`` is read by the commands that do not write one)
_INPUTS = ("model", "data", "input", "benchmark", "benchmark_config", "modify_mixlist", "fusion_switch", "checkpoint",
           "mapping", "against", "npu_dir", "bench_dir", "dir", "dump", "script", "keep_dtype")
#: positional arguments among them (named in messages as the usage names them)
_POSITIONAL = {"model": "MODEL", "npu_dir": "NPU_DIR", "bench_dir": "BENCH_DIR", "dir": "DIR", "script": "SCRIPT"}


def _paths(a, names) -> list:
    """(how the command line names it, path) of each of ``names`` ``a`` has set; ``--input NAME=FILE`` gives FILE."""
    positional = dict(_POSITIONAL, **({"dump": "DUMP"} if a.cmd in ("overflow", "export-msprobe", "fit") else {}),
                      **({"out": "OUT"} if a.cmd in ("export-msprobe", "import-msprobe") else {}))
    out = []
    for name in names:
        v = getattr(a, name, None)
        for p in v if isinstance(v, list) else [v]:
            if isinstance(p, str) and p and "\x00" not in p:
                out.append((positional.get(name, "--" + name.replace("_", "-")),
                            p.partition("=")[2] or p if name == "input" else p))
    return out


def check_outputs(a) -> None:
    """Every output checked before a command runs, so a long run never ends in a write error nor writes over
    what it reads: ``--json`` / ``--report`` / ``--ops-info`` must be writable files (:func:`check_writable`),
    and no output (those files, ``--csv``, ``--output``, the directory a dump is written to) may be an input
    of the command or inside an input directory (a dump, a SavedModel), another of its outputs, or lie inside
    a directory it writes."""
    import os

    from ..fileio import check_writable

    for flag in ("json", "report", "ops_info"):
        if isinstance(getattr(a, flag, None), str):   # a path (socs --json is a switch)
            check_writable(getattr(a, flag), "--" + flag.replace("_", "-"))
    written = _OUTPUT_DIRS.get(a.cmd, ())
    dirs = _paths(a, written)
    outputs = _paths(a, _OUTPUT_FILES) + dirs
    if a.cmd == "sensitivity" and isinstance(getattr(a, "dump", None), str) and "\x00" not in a.dump:
        from ..analysis.robustness import sidecar    # written beside the dump it reads

        outputs.append(("the sidecar of --dump", check_writable(sidecar(a.dump), "the sidecar of --dump")))
    inputs = _paths(a, [n for n in _INPUTS if n not in written])
    real = os.path.realpath    # links resolved: two spellings of one file are one file

    def same(p, q) -> bool:
        try:
            return real(p) == real(q) or os.path.samefile(p, q)   # samefile: hard links
        except (OSError, ValueError):
            return False

    def inside(p, d) -> bool:
        return real(p).startswith(real(d).rstrip(os.sep) + os.sep)

    for i, (flag, path) in enumerate(outputs):
        for iflag, ipath in inputs:
            if same(path, ipath) or (os.path.isdir(ipath) and inside(path, ipath)):
                raise AscendEmuError(f"{flag} {path} is {'inside' if inside(path, ipath) else 'also'} what this "
                                     f"command reads ({iflag} {ipath}); writing it would change that input: give "
                                     "another path")
        for oflag, opath in outputs[:i]:
            if same(path, opath):
                raise AscendEmuError(f"{oflag} {opath} and {flag} {path} are the same path, so one output would "
                                     "replace the other: give each its own")
        for dflag, dpath in dirs:
            if inside(path, dpath):
                raise AscendEmuError(f"{flag} {path} is inside {dflag} {dpath}, which this command writes (a dump "
                                     "holds only its own files): write it elsewhere")

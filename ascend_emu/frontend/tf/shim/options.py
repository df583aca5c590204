"""The Ascend TF adapter's session options as data, read and checked as the adapter reads them.

``NpuOptimizer``'s ``parameter_map`` (TF1), ``NPURunConfig`` / ``DumpConfig`` (the Estimator) and TF2's
``npu.global_options()`` all end in the same keys; this module says, for each key, what ``ascend-emu run``
does with it (``HONOURED``: it sets the emulated device; ``NOTED``: accepted, it changes nothing on a CPU) and
checks the values with the adapter's own rules and messages (hicann/tensorflow
``tf_adapter/util/npu_attrs.cc::NpuAttrs::SetNpuOptimizerAttr``; ASCEND-FACTS.md section 14.2). Plain Python,
no TensorFlow: the shim decodes the ``AttrValue`` protos before calling :func:`read_parameter_map`.
"""
from __future__ import annotations

import os

from ....errors import AscendEmuError

#: ATTRS kPrecisionModeList / kPrecisionModeV2List
PRECISION_MODE_LIST = ("force_fp32", "allow_fp32_to_fp16", "force_fp16", "must_keep_origin_dtype",
                       "allow_mix_precision", "cube_fp16in_fp32out", "allow_mix_precision_fp16",
                       "allow_mix_precision_bf16", "allow_fp32_to_bf16")
PRECISION_MODE_V2_LIST = ("fp16", "origin", "cube_fp16in_fp32out", "mixed_float16", "mixed_bfloat16", "cube_hif8",
                          "mixed_hif8")
MIXED_MODES = ("allow_mix_precision", "allow_mix_precision_fp16", "allow_mix_precision_bf16")
MIXED_MODES_V2 = ("mixed_float16", "mixed_bfloat16", "mixed_hif8")
OP_SELECT_IMPLMODES = ("high_precision", "high_performance", "high_precision_for_all", "high_performance_for_all")

#: keys that set the emulated device or its dumps: key -> what it does here
HONOURED = {
    "precision_mode": "the device's precision_mode",
    "precision_mode_v2": "the device's precision_mode_v2",
    "modify_mixlist": "the device's mix lists (the JSON's to-add / to-remove)",
    "fusion_switch_file": "the device's fusion switch",
    "op_select_implmode": "the device's impl_mode (high_precision / high_performance; *_for_all: the same here)",
    "deterministic": "the device's deterministic (0: the multi-core accumulation order is drawn per run)",
    "enable_dump": "the emulated dump of each dump_step step in dump_path/step-N",
    "dump_path": "where the dumps go (an existing directory, as the adapter checks)",
    "dump_step": "the steps dumped ('0|5|10-20'; default every step)",
    "enable_dump_debug": "the dump and overflow analysis of each step whose float status was set, in "
                         "dump_path/step-N",
    "customize_dtypes": "entries keeping an op (type) in float32: the device's keep_dtype; 16-bit entries are said "
                        "and not emulated; ignored under origin / must_keep_origin_dtype, as by the adapter",
}
#: keys accepted and recorded that change nothing on a CPU: key -> why
NOTED = {
    "dump_mode": "the emulated dump always holds every op's outputs with its inputs named",
    "dump_debug_mode": "checked; the emulated overflow dump covers AI Core and atomic overflow alike",
    "dump_data": "the emulated dump always holds the tensors and their statistics",
    "dump_layer": "every op is dumped",
    "op_precision_mode": "not emulated: ops keep the precision mode's implementation",
    "optypelist_for_implmode": "not emulated: op_select_implmode applies to every op",
    "iterations_per_loop": "each step is emulated and recorded on its own",
    "use_off_line": "the graph always runs on the emulated device",
    "mix_compile_mode": "ops without an AI Core kernel run on the emulated AI CPU anyway",
    "enable_data_pre_proc": "input pipelines stay in TensorFlow",
    "hcom_parallel": "one rank",
    "graph_run_mode": "a train op trains, anything else runs in TensorFlow",
    "profiling_mode": "no profiling", "profiling_options": "no profiling",
    "auto_tune_mode": "a legacy name: no tuning here", "aoe_mode": "no tuning here", "work_path": "no tuning here",
    "variable_format_optimize": "a legacy name", "enable_small_channel": "no layout choice here",
    "jit_compile": "nothing is compiled for a device", "input_fusion_size": "no input fusion here",
    "session_device_id": "one emulated device", "op_debug_level": "a legacy name", "op_debug_config": "no CCE build",
    "enable_exception_dump": "checked (0, 1 or 2); no exception dump", "debug_dir": "no CCE build",
    "graph_memory_max_size": "no device memory", "variable_memory_max_size": "no device memory",
    "op_compiler_cache_mode": "nothing is compiled", "op_compiler_cache_dir": "nothing is compiled",
    "is_tailing_optimization": "one rank", "stream_max_parallel_num": "no streams",
    "enable_scope_fusion_passes": "scope fusion is not emulated", "soc_config": "use --soc",
}


class AdapterOptionError(AscendEmuError):
    """An option value the Ascend TF adapter refuses (its own message, one line)."""


def _dump_step_ok(dump_step: str) -> str | None:
    """ATTRS ``checkDumpStep``: its message, or None."""
    groups = dump_step.split("|") if dump_step else []
    if len(groups) > 100:
        return "dump_step only support dump <= 100 sets of data"
    for g in groups:
        parts = g.split("-")
        if len(parts) > 2 or not all(p.isdigit() or p == "" for p in parts):
            return "dump_step string style is error, correct example:'0|5|10|50-100'"
        if len(parts) == 2 and int(parts[0] or 0) >= int(parts[1] or 0):
            return "in range steps, the first step is >= second step, correct example:'0|5|10-20'"
    return None


def dump_steps(dump_step: str | None):
    """The step numbers of a ``dump_step`` string, or ``"all"`` when unset."""
    if dump_step is None:
        return "all"
    out = set()
    for g in filter(None, dump_step.split("|")):
        a, _, b = g.partition("-")
        out.update(range(int(a or 0), int(b) + 1) if b else (int(a),))
    return sorted(out)


def _allowed(name: str, value, allowed) -> None:
    # ATTRS CheckValueAllowed: "<v> is invalid, it should be one of the list:[...]"
    if value not in allowed:
        raise AdapterOptionError(f"{name}: {value} is invalid, it should be one of the list:[{', '.join(allowed)}]")


def read_parameter_map(params: dict) -> dict:
    """Check a decoded ``parameter_map`` (key -> bool, int, float or str) in the adapter's order and with its
    messages; returns it unchanged. Unknown keys pass, as the adapter ignores them."""
    p = params
    enable_dump, enable_dump_debug = bool(p.get("enable_dump", False)), bool(p.get("enable_dump_debug", False))
    if enable_dump or enable_dump_debug:
        if "dump_path" not in p:
            raise AdapterOptionError("if use dump function, dump_path must be set.")
        if not os.path.isdir(str(p["dump_path"])):
            raise AdapterOptionError(f"the path {p['dump_path']} is not directory.")
        if not os.access(str(p["dump_path"]), os.R_OK | os.W_OK):
            raise AdapterOptionError(f"the path {p['dump_path']} doesn't have read, write permissions.")
    if enable_dump:
        if "dump_step" in p and (msg := _dump_step_ok(str(p["dump_step"]))):
            raise AdapterOptionError(msg)
        if "dump_mode" in p and p["dump_mode"] not in ("input", "output", "all"):
            raise AdapterOptionError("dump mode should be one of the list:[input, output, all]")
    if enable_dump_debug and "dump_debug_mode" in p and p["dump_debug_mode"] not in (
            "aicore_overflow", "atomic_overflow", "all"):
        raise AdapterOptionError("dump debug mode should be one of the list:[aicore_overflow, atomic_overflow, all]")
    if enable_dump and enable_dump_debug:
        # the docs (D1/session_config/accuracy_comparison.md), not ATTRS: one of the two per run
        raise AdapterOptionError("enable_dump and enable_dump_debug can not be enabled at the same time; "
                                 "set one of them")
    if "graph_run_mode" in p and int(p["graph_run_mode"]) > 1:
        raise AdapterOptionError("graph_run_mode value must be 0 or 1")
    if "precision_mode" in p:
        _allowed("precision_mode", p["precision_mode"], PRECISION_MODE_LIST)
    if "precision_mode_v2" in p:
        _allowed("precision_mode_v2", p["precision_mode_v2"], PRECISION_MODE_V2_LIST)
    if "enable_exception_dump" in p and not 0 <= int(p["enable_exception_dump"]) <= 2:
        raise AdapterOptionError("enable_exception_dump should be one of 0, 1 and 2.")
    if "op_select_implmode" in p and p["op_select_implmode"] not in OP_SELECT_IMPLMODES:
        raise AdapterOptionError("op select impl mode should be one of the list:[high_precision, high_performance, "
                                 "high_precision_for_all, high_performance_for_all]")
    if "optypelist_for_implmode" in p and "op_select_implmode" not in p:
        raise AdapterOptionError("when use optypelist_for_implmode, op_select_implmode must be set.")
    if "modify_mixlist" in p:
        if "precision_mode" in p and p["precision_mode"] not in MIXED_MODES:
            raise AdapterOptionError("modify_mixlist is assigned, please ensure that precision_mode is assigned to "
                                     "'allow_mix_precision' or 'allow_mix_precision_fp16' or "
                                     "'allow_mix_precision_bf16'(if available).")
        if "precision_mode" not in p and "precision_mode_v2" in p and p["precision_mode_v2"] not in MIXED_MODES_V2:
            raise AdapterOptionError("modify_mixlist is assigned, please ensure that precision_mode_v2 is assigned to "
                                     "'mixed_float16', 'mixed_hif8' or 'mixed_bfloat16'(if available).")
        if "precision_mode" not in p and "precision_mode_v2" not in p:
            raise AdapterOptionError("modify_mixlist is assigned, please ensure precision_mode only can be assigned "
                                     "to 'allow_mix_precision' or 'allow_mix_precision_fp16' or "
                                     "'allow_mix_precision_bf16'(if available),precision_mode_v2 only can be assigned "
                                     "to 'mixed_float16', 'mixed_hif8' or 'mixed_bfloat16'(if available).")
    if "precision_mode" in p and "precision_mode_v2" in p:
        raise AdapterOptionError("'precision_mode' and 'precision_mode_v2' can not be assigned at the same time.")
    if "dump_data" in p and p["dump_data"] not in ("tensor", "stats"):
        raise AdapterOptionError("dump_data should be 'tensor' or 'stats'.")
    return p


def option_status(key: str) -> tuple[str, str]:
    """(``honoured`` | ``noted``, what it does here) of a parameter_map key."""
    if key in HONOURED:
        return "honoured", HONOURED[key]
    if key in NOTED:
        return "noted", NOTED[key]
    return "noted", "not an option the adapter reads either"

"""Checklist items read from the emulated run's dumps: 2/3 (mixed precision), 4 (loss scaling) and the
emulator-only items 16 (fp16 overflow), 17 (first divergent op), 18 (gradient underflow), 19 (long fp16 reductions)."""
from __future__ import annotations

import math

import numpy as np

from .common import (CheckRow, FAILED, PASSED, RANDOM_OPS, REDUCTIONS, THRESHOLDS, _fmt, _names,
                     _no_emulated_run, _not_checked, _row)
from .runs import _Ctx


# --------------------------------------------------------------------------- precision (emulated run)

def _shape_of(dump, ref):
    from ...graph.core import split_tensor_name

    node, idx = split_tensor_name(ref)
    if node not in dump:
        return None
    outs = dump.op(node)["outputs"]
    return outs[idx]["shape"] if idx < len(outs) else None


def _cube_flops(dump, op) -> float:
    """2 x output elements x the contraction length (from the operand shapes in the dump)."""
    outs = op["outputs"]
    if not outs:
        return 0.0
    size = float(np.prod(outs[0]["shape"])) if outs[0]["shape"] else 1.0
    shapes = [_shape_of(dump, r) for r in op.get("inputs", [])]
    t = op["tf_type"]
    attrs = op.get("attrs") or {}
    k = None
    try:
        if "MatMul" in t and shapes and shapes[0]:
            a = shapes[0]
            ta = attrs.get("transpose_a") or attrs.get("adj_x")
            k = a[-2] if ta else a[-1]
        elif t in ("Conv2D", "_FusedConv2D") and len(shapes) > 1 and shapes[1]:
            w = shapes[1]
            k = float(np.prod(w[:3]))
        elif t.startswith("Conv2DBackprop") and len(shapes) > 1:
            w = shapes[1] if t.endswith("Input") else shapes[2] if len(shapes) > 2 else None
            if t.endswith("Filter"):   # output is the filter: contraction over batch and positions
                k = float(np.prod(shapes[0])) / max(1, shapes[0][-1]) if shapes[0] else None
            elif w:
                k = float(np.prod(w[:2])) * w[3]
        elif t.startswith("DepthwiseConv2dNative") and len(shapes) > 1 and shapes[1]:
            k = float(np.prod(shapes[1][:2]))
    except (TypeError, IndexError):
        k = None
    return 2.0 * size * float(k or 1)


def _row_mixed_precision(c: _Ctx) -> CheckRow:
    from ...ops import CUBE, OPS

    item = "Mixed precision enabled and effective"
    method = ("emulated step 0: dtype of every matrix op (MatMul, BatchMatMul, Conv2D and their backprops) "
              "under the precision mode and lists; share of the matrix FLOPs in fp16/bf16; matrix ops the shipped "
              "black list keeps in float32")
    if skip := _no_emulated_run(c, "2/3", item, method):
        return skip
    d = c.npu_dump
    cube = [op for op in d.ops if op["tf_type"] in OPS and OPS[op["tf_type"]].kind == CUBE]
    if not cube:
        return _not_checked("2/3", item, method, "the model has no matrix op")
    low = [op for op in cube if op.get("compute_dtype") in ("float16", "bfloat16")]
    flops = {op["name"]: _cube_flops(d, op) for op in cube}
    total = sum(flops.values()) or 1.0
    share = sum(flops[op["name"]] for op in low) / total
    from ...npu.precision import MixLists

    black = [op for op in cube if (op.get("precision") or {}).get("list") == "black"]
    shipped = MixLists.default().black
    # a matrix op the shipped lists black-list is a victim nobody asked for; one the user's modify_mixlist
    # black-listed is intended, and only counts against the FLOP share
    victims = [op for op in black if op.get("ascend_type") in shipped]
    mode = c.device.precision.requested_mode
    ev = (f"precision_mode {mode}: {len(low)} of {len(cube)} matrix ops in fp16/bf16, {share:.1%} of "
          f"{total:.3g} FLOPs")
    if black and not victims:
        ev += "; black-listed by modify_mixlist, so in float32: " + _names(
            f"{op['name']} ({op.get('ascend_type')})" for op in black)
    if victims:
        for op in victims:
            c.suggest("to-remove", op.get("ascend_type"))
        return _row("2/3", item, method, FAILED, ev + "; on the shipped black list, so kept in float32: "
                    + _names(f"{op['name']} ({op.get('ascend_type')})" for op in victims)
                    + " (take them off with modify_mixlist black-list to-remove)")
    if share < THRESHOLDS["fp16_flop_share"]:
        fp32 = [op["name"] for op in cube if op not in low]
        return _row("2/3", item, method, FAILED, ev + f"; in float32: {_names(fp32)}. Mixed precision is off: use "
                                                      "--precision-mode allow_mix_precision (or allow_fp32_to_fp16)")
    return _row("2/3", item, method, PASSED, ev)


def _fp16_in_use(c: _Ctx) -> str | None:
    """'float16' / 'bfloat16' if some op of the emulated step computes in it (fp16 first), else None."""
    dts = {op.get("compute_dtype") for op in c.npu_dump.ops} if c.npu_dump is not None else set()
    return "float16" if "float16" in dts else "bfloat16" if "bfloat16" in dts else None


def _row_loss_scale(c: _Ctx) -> CheckRow:
    item = "Loss scaling configured"
    method = ("the loss scale and overflow check against the precision and overflow mode; the emulated run's "
              "status register against the steps it applied")
    if skip := _no_emulated_run(c, 4, item, method, dump=False):
        return skip
    mode = c.device.overflow_mode
    low = _fp16_in_use(c)
    ls = c.npu.config.get("loss_scale")
    steps = c.npu.steps
    skipped = [s["step"] for s in steps if s["skipped"]]
    missed = [s["step"] for s in steps if s["float_status"] and not s["skipped"]]
    scales = f"scale {_fmt(steps[0]['loss_scale'])} -> {_fmt(steps[-1]['loss_scale'])}, {len(skipped)} skipped step(s)"
    if low is None:
        return _row(4, item, method, PASSED, "no op computes in fp16 or bf16: loss scaling is not needed")
    if low == "bfloat16" and ls == "none":
        return _row(4, item, method, PASSED, "bf16 has float32's range: loss scaling is not needed")
    if ls == "none" or isinstance(ls, dict) and ls.get("kind") == "fixed" and ls.get("loss_scale", 0) <= 1:
        return _row(4, item, method, FAILED, f"no loss scale with ops in {low} and overflow mode {mode}: small "
                                             "gradients flush to zero and"
                    + (" an overflow saturates to 65504 unseen" if mode == "saturation" else " an overflow gives Inf")
                    + "; use --loss-scale dynamic (NpuLossScaleOptimizer / LossScaleOptimizer)"
                    + (f"; steps with status bits set that were applied: {_names(missed)}" if missed else ""))
    if steps and len(skipped) == len(steps):
        # every update thrown away: the run trained nothing, whatever the scale did
        return _row(4, item, method, FAILED, f"every step skipped: {len(skipped)} of {len(steps)} steps overflowed "
                                             f"and were not applied ({scales}); nothing was trained (item 16 names "
                                             "the first overflow)")
    if c.overflow_check == "isfinite" and mode == "saturation":
        return _row(4, item, method, FAILED, "overflow check isfinite under saturation mode: an overflow gives "
                                             "65504, not Inf, so the check misses it (the NPU reads the float status "
                                             "register: NpuLossScaleOptimizer)"
                    + (f"; status bits set but step applied at step(s) {_names(missed)}" if missed else "")
                    + f"; {scales}")
    return _row(4, item, method, PASSED, f"loss scale {c.loss_scale}, overflow check {c.overflow_check}, overflow mode "
                                         f"{mode}; {scales}")


def _row_overflow(c: _Ctx) -> CheckRow:
    from ...analysis.overflow import overflow_report

    item = "No fp16 overflow in forward or backward"
    method = ("emulated step 0 (initial weights, first batch): first op whose inputs are finite and output "
              "overflows, its phase and a float32 rerun; later steps' first overflows listed")
    if skip := _no_emulated_run(c, 16, item, method):
        return skip
    rep = overflow_report(c.npu_dump)
    later = [s for s in c.npu.steps[1:] if s.get("first_overflow")]
    tail = ""
    if later:
        s = later[0]
        f = s["first_overflow"]
        tail = (f"; later: {len(later)} step(s) with an overflow, first step {s['step']} at {f['name']} "
                f"({f['phase']}, loss scale {_fmt(s['loss_scale'])})")
    first = rep.first
    if first is None:
        return _row(16, item, method, PASSED, f"step 0: no op overflows (status register 0x{rep.register:x})" + tail)
    op = c.npu_dump.op(first["name"])
    phase = op.get("phase") or "forward"
    v = first["verdict"]
    scale = c.npu.steps[0]["loss_scale"]
    desc = (f"step 0: {first['name']} ({first['tf_type']}, {first.get('compute_dtype')}), phase {phase}, "
            f"status {'; '.join(first['status_names']) or 'non-finite output'}; verdict {v['verdict']}"
            + (f", float32 max |x| {_fmt(v['fp32_max_abs'])}" if v.get("fp32_max_abs") is not None else ""))
    blame = first.get("blame") or {}
    advice = ""
    if v["verdict"] == "abnormal":
        # the op type(s) to keep in float32: for an inserted Cast its consumer's, for a fused op the types
        # it replaced (analysis.overflow); the suggested modify_mixlist (--ops-info) lists them
        if blame.get("types"):
            advice = (f"; black-list {', '.join(blame['types'])} (--ops-info)"
                      + (f": {blame['explanation']}" if blame.get("inserted_cast") or op.get("fusion") else ""))
    handled = phase == "backward" and c.npu.config.get("loss_scale") != "none" and scale > 1
    if not handled or all(s["skipped"] for s in c.npu.steps):      # the row fails: suggest the list
        for t in (rep.suggestion() or {"black-list": {"to-add": []}})["black-list"]["to-add"]:
            c.suggest("to-add", t)
    if handled:
        if all(s["skipped"] for s in c.npu.steps):
            return _row(16, item, method, FAILED, desc + f" at loss scale {_fmt(scale)}, and every step overflows"
                        + advice)
        return _row(16, item, method, PASSED, desc + f" at loss scale {_fmt(scale)}: the loss scale handles it "
                                                     f"({int(c.npu.skipped.sum())} step(s) skipped)" + tail)
    return _row(16, item, method, FAILED, desc + advice + tail)


def _row_divergence(c: _Ctx) -> CheckRow:
    from ...analysis.compare import compare
    from ...analysis.metrics import ERROR, PASS, WARNING, Thresholds, accuracy_reached
    from ...frontend.tf.training import UNSCALE_PREFIX

    item = "fp16 error within the msprobe threshold"
    t = Thresholds()
    method = (f"emulated step 0 against float32 on the same weights and batch, op by op: first op failing msprobe's "
              f"rule (cos < {t.cosine} and MaxAbsErr > {t.max_abs_err}, cos < {t.cosine_min} or MaxAbsErr > "
              f"{t.max_abs_err_max}) whose inputs pass; backward errors divided by the loss scale; tensors whose "
              f"values and error all stay below {t.max_abs_err} pass; overflowing and random ops are items 16's and "
              "1's")
    if skip := _no_emulated_run(c, 17, item, method, bench=True):
        return skip
    cmp = compare(c.npu_dump, c.bench_dump)
    scale = float(c.npu.steps[0]["loss_scale"]) or 1.0
    npu = c.npu_dump

    def fails(row) -> bool:
        if row is None:
            return False
        name = str(row["NPU Name"]).rsplit(":", 1)[0]
        if name in random:
            return True      # a random op's output differs by nature (item 1): its consumers are not blamed
        if row["Result"] not in (PASS, WARNING, ERROR):
            return False
        mae = row["MaxAbsErr"]
        unit = _unit(name)
        if _negligible(row):
            return False   # every value and the error below the absolute threshold: the cosine of rounding noise
        return not accuracy_reached(row["Cosine"], mae / unit if isinstance(mae, float) else mae, t)

    def _unit(name) -> float:
        """A backward tensor's errors are in loss-scale units (the unscaling itself excepted)."""
        backward = name in npu and npu.op(name).get("phase") == "backward" and not name.startswith(UNSCALE_PREFIX)
        return scale if backward else 1.0

    def _negligible(row) -> bool:
        unit = _unit(str(row["NPU Name"]).rsplit(":", 1)[0])
        mae = row["MaxAbsErr"]
        big = max((abs(v) for v in (row.get("Bench max"), row.get("Bench min")) if isinstance(v, (int, float))),
                  default=math.inf)
        return isinstance(mae, float) and mae / unit <= t.max_abs_err and big / unit <= t.max_abs_err

    random = {op["name"] for op in npu.ops if op["tf_type"] in RANDOM_OPS}
    # a skipped step's update is thrown away: its ops are not judged (item 16 reports the overflow)
    skipped = bool(c.npu.steps[0].get("skipped"))
    discarded = {op["name"] for op in npu.ops if skipped and op.get("phase") == "update"}
    by_tensor = {r["NPU Name"]: r for r in cmp.rows if r.get("NPU Name")}
    compared = sum(1 for r in cmp.rows if r["Result"] in (PASS, WARNING, ERROR))
    # ops downstream of an overflow or a random op are "tainted": their errors are items 16's and 1's
    overflowed, tainted = set(), set(random)
    for op in npu.ops:
        if int(op.get("status", 0)):
            overflowed.add(op["name"])
            tainted.add(op["name"])
            continue
        if op["name"] in random or op["name"] in discarded:
            continue
        if any(ref.rsplit(":", 1)[0] in tainted or fails(by_tensor.get(ref)) for ref in op.get("inputs", [])):
            tainted.add(op["name"])
            continue
        bad = [r for r in cmp.rows_of(op["name"]) if fails(r)]
        if not bad:
            continue
        r = bad[0]
        if op.get("compute_dtype") in ("float16", "bfloat16"):
            c.suggest("to-add", op.get("ascend_type"))
        return _row(17, item, method, FAILED,
                    f"first divergent op {op['name']} ({op['tf_type']} / {op.get('ascend_type')}, compute "
                    f"{op.get('compute_dtype')}, phase {op.get('phase')}): cos {_fmt(r['Cosine'])}, MaxAbsErr "
                    f"{_fmt(r['MaxAbsErr'])}, MaxRelativeErr {_fmt(r['MaxRelativeErr'])}")
    worst = min((r["Cosine"] for r in cmp.rows if isinstance(r["Cosine"], float) and not _negligible(r)
                 and str(r["NPU Name"]).rsplit(":", 1)[0] not in tainted | discarded), default=1.0)
    return _row(17, item, method, PASSED, f"{compared} tensors compared, none fails; lowest cosine {worst:.6f}"
                + (f"; {len(overflowed)} overflowing op(s) and the {len(tainted) - len(overflowed) - len(random)} "
                   "op(s) they feed left to item 16" if overflowed else "")
                + (f"; random op(s) {_names(sorted(random))} not compared" if random else "")
                + (f"; step 0 was skipped: its {len(discarded)} update op(s) not judged" if discarded else ""))


def _row_underflow(c: _Ctx) -> CheckRow:
    item = "fp16 gradient underflow"
    method = ("emulated step 0 against float32 on the same weights: gradient elements that are zero in the "
              "emulated run but not in float32, at the configured loss scale; float32 gradients below fp16's range")
    if skip := _no_emulated_run(c, 18, item, method, dump=False):
        return skip
    s = c.npu.steps[0]
    if s["float_status"]:
        return _not_checked(18, item, method, "step 0 overflowed (item 16): its gradients say nothing about underflow")
    n = s["grad_values"] or 1
    extra = max(0, s["grad_zeros"] - s.get("reference_grad_zeros", 0))
    share = extra / n
    ls = c.npu.config.get("loss_scale")
    ev = (f"{extra} of {n} gradient elements ({share:.2%}) flush to zero "
          + ("without loss scaling" if ls == "none" else f"at loss scale {_fmt(s['loss_scale'])}"))
    if c.ref_a is not None and ls != "none":
        tiny, total = c.ref_a.tiny0
        ev += (f"; without loss scaling {tiny} of {total} float32 gradient elements ({tiny / max(1, total):.2%}) "
               "are below fp16's smallest subnormal")
    if share > THRESHOLDS["underflow_share"]:
        return _row(18, item, method, FAILED, ev + "; use (a larger) --loss-scale")
    return _row(18, item, method, PASSED, ev)


def _row_reductions(c: _Ctx) -> CheckRow:
    item = "No fp16 reduction over a long axis"
    lim = THRESHOLDS["reduce_length"]
    method = (f"emulated step 0: reductions ({', '.join(sorted(REDUCTIONS))}) computing in fp16/bf16 over more "
              f"than {lim} terms per output")
    if skip := _no_emulated_run(c, 19, item, method):
        return skip
    d = c.npu_dump
    long, count = [], 0
    for op in d.ops:
        if op["tf_type"] not in REDUCTIONS:
            continue
        count += 1
        if op.get("compute_dtype") not in ("float16", "bfloat16") or not op.get("inputs") or not op["outputs"]:
            continue
        shp = _shape_of(d, op["inputs"][0])
        if shp is None:
            continue
        terms = float(np.prod(shp)) / max(1.0, float(np.prod(op["outputs"][0]["shape"] or [1])))
        if terms > lim:
            long.append((op, int(terms)))
    if long:
        for op, _ in long:
            c.suggest("to-add", op.get("ascend_type"))
        return _row(19, item, method, FAILED, "; ".join(f"{op['name']} ({op.get('ascend_type')}, "
                                                         f"{op.get('compute_dtype')}) sums {k} terms"
                                                         for op, k in long[:5])
                    + f" (reduce accumulator: {c.device.reduce_accumulate}); keep them in float32")
    return _row(19, item, method, PASSED, f"{count} reduction(s); none in fp16 over more than {lim} terms")

"""Compare an NPU dump with a bench dump, tensor by tensor, and find where the error enters.

:func:`compare` pairs the two dumps' tensors (same op name and output index; inserted
Casts with the bench value they cast; ops only on one side; ops fused away) and fills
one row per tensor with the metrics of :mod:`ascend_emu.analysis.metrics` (msprobe's
``compare`` with the additions of msaccucmp; NUMERICS.md section 7). The rows make a
:class:`~ascend_emu.analysis.comparison.Comparison`, which finds the first divergent op
and writes the CSV. Tensors are streamed from disk chunk by chunk.

No TensorFlow here.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..errors import AscendEmuError, DumpError
from ..graph.core import split_tensor_name
from .comparison import (COLUMNS, EXTRA_COLUMNS, MSPROBE_COLUMNS, STAT_COLUMNS, Comparison,  # noqa: F401
                         Divergence, _Info)
from .dump import VARIANT, Dump, load_dump
from .dump.format import CODED_FORMATS
from .metrics import (CHUNK, ERROR, METRIC_COLUMNS, NA, NAN, PASS, WARNING, Thresholds,  # noqa: F401
                      _stats_compare, accuracy_reached, dtype_eps, tensor_metrics)
from .noise import additive_terms, rounding_noise

#: how a row's Result is decided: ours (msprobe's former cosine rule) or msprobe 26.x's checkers
RULES = ("ascend-emu", "msprobe")
CAST_MARK = "/ascend_cast"
#: nodes a graph fusion pass of GE adds after an op, named ``<op><suffix>`` in a dump: the suffix -> the op types
#: they follow (AvgPoolFusionPass: a SAME fp16 AvgPool gives the window sum, its Mul ``_mul_layer`` the mean)
ADDED_NODES = {"_mul_layer": ("AvgPool",)}


def _fmt_shape(shape):
    return None if shape is None else "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _stat(v):
    return NA if v is None else float(v)


def _blank_row() -> dict:
    return {c: None for c in COLUMNS}


def _fill_side(row: dict, side: str, dump: Dump, op: dict, out: dict) -> None:
    row[f"{side} Name"] = f"{op['name']}:{out['index']}"
    row[f"{side} Dtype"] = out["dtype"]
    row[f"{side} Tensor Shape"] = _fmt_shape(out["shape"])
    for k in ("max", "min", "mean", "l2norm"):
        row[f"{side} {k}"] = _stat(out.get(k))


def _fill_op_columns(row: dict, op: dict, out: dict | None) -> None:
    row["Op Type"] = op.get("source_type") or op.get("tf_type")     # an ONNX node's own type (Conv, not Transpose)
    row["Ascend Op Type"] = op.get("ascend_type")
    row["Engine"] = op.get("engine")
    row["Compute Dtype"] = op.get("compute_dtype")
    row["Overflow Status"] = f"0x{int(out.get('status', 0) if out else op.get('status', 0)):x}"
    row["Index"] = op.get("index")


def _compare_pair(row: dict, npu: Dump, nop: dict, nout: dict, bench: Dump, bop: dict, bout: dict,
                  t: Thresholds, chunk: int, defer: list, note: str | None = None, exact_ints: bool = True) -> str:
    """Fill the metric columns of a matched tensor pair; returns the row's kind. ``exact_ints``: an integer or
    boolean pair is compared exact or not (:func:`_fill_exact`; msprobe's rules measure it as any tensor).

    The tensors' metrics (the only slow part: both files streamed) are left to a function appended to
    ``defer``, which fills the row when called; ``note`` leads the row's message."""
    msgs = [note] if note else []
    if VARIANT in (nout["dtype"], bout["dtype"]):
        for c in METRIC_COLUMNS:
            row[c] = NA
        row["Result"] = NA
        row["Err_message"] = " ".join(msgs + ["a variant (TensorList) output: no tensor to compare."])
        return "stats only"
    if nout.get("skipped") or bout.get("skipped"):
        for c in METRIC_COLUMNS:
            row[c] = NA
        row["Result"] = NA
        row["Err_message"] = " ".join(msgs + [f"not compared: {nout.get('skipped') or bout.get('skipped')}."])
        return "matched"
    if list(nout["shape"]) != list(bout["shape"]):
        for c in METRIC_COLUMNS:
            row[c] = NA
        row["Result"] = ERROR
        row["Err_message"] = " ".join(msgs + ["Shape of NPU and bench tensor do not match. Skipped."])
        return "matched"
    ndt, bdt = np.dtype(_dt(nout["dtype"])), np.dtype(_dt(bout["dtype"]))
    if _kind(ndt) != _kind(bdt):
        msgs.append(f"Dtype of NPU and bench tensor do not match ({nout['dtype']} vs {bout['dtype']}); "
                    "compared as float64.")
    if nout["file"] is None or bout["file"] is None:
        for c in METRIC_COLUMNS:
            row[c] = NA
        res, msg = _stats_compare(nout, bout, t)
        row["Result"] = res
        row["Err_message"] = " ".join(msgs + [msg])
        return "stats only"

    if exact_ints and _kind(ndt) != "float" and _kind(ndt) == _kind(bdt) and \
            nout["dtype"] not in CODED_FORMATS and bout["dtype"] not in CODED_FORMATS:
        defer.append(lambda: _fill_exact(row, npu, nop, nout, bench, bop, bout, chunk, msgs))
        return "matched"

    def fill():
        m = tensor_metrics(npu.chunks(nop["name"], nout["index"], chunk),
                           bench.chunks(bop["name"], bout["index"], chunk), bench_dtype=bdt, thresholds=t, chunk=chunk)
        for c in METRIC_COLUMNS:
            row[c] = m[c]
        if m["Err_message"]:
            msgs.append(m["Err_message"])
        row["Result"] = PASS if m["count"] == 0 else (PASS if accuracy_reached(m["Cosine"], m["MaxAbsErr"], t)
                                                      else ERROR)
        row["Err_message"] = " ".join(msgs)
    defer.append(fill)
    return "matched"


def _fill_exact(row: dict, npu: Dump, nop: dict, nout: dict, bench: Dump, bop: dict, bout: dict, chunk: int,
                msgs: list) -> None:
    """An integer (or boolean) pair: exact or not. Its values are indices, counts, masks, not measurements, so no
    accuracy metric applies (a cosine of two index tensors says nothing); the row counts the elements that differ:
    pass when none does, warning when some do (an argmax a tie or a rounding moved is not an accuracy error by
    itself: the float outputs that use it carry any error on)."""
    n = m = 0
    for a, b in zip(npu.chunks(nop["name"], nout["index"], chunk), bench.chunks(bop["name"], bout["index"], chunk)):
        n += int(np.count_nonzero(np.asarray(a, np.int64) != np.asarray(b, np.int64)))
        m += a.size
    for c in METRIC_COLUMNS:
        row[c] = NA
    what = "booleans" if _kind(np.dtype(_dt(nout["dtype"]))) == "bool" else "integers"
    if n == 0:
        row["Result"] = PASS
        msgs.append(f"{what}: exact ({m} of {m} equal; compared exact or not, no accuracy metric).")
    else:
        row["Result"] = WARNING
        msgs.append(f"{what} differ at {n} of {m} (match rate {(m - n) / m:.4%}; compared exact or not, no accuracy "
                    "metric).")
    row["Err_message"] = " ".join(msgs)


def _run_deferred(jobs: list, workers: int) -> None:
    """Run the pairs' metric functions, ``workers`` at a time (threads: the chunk reads and the metric kernels
    release the GIL). Each fills only its own row, so the rows are the same for any number of workers; the
    first failing pair in row order raises, as it would serially."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            job()
        return
    from concurrent.futures import ThreadPoolExecutor

    ex = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ascend-emu-compare")
    try:
        for f in [ex.submit(job) for job in jobs]:
            f.result()
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def _dt(name: str):
    from .dump import _dtype_from_name
    return _dtype_from_name(name)


def _kind(dt: np.dtype) -> str:
    """float (also complex and the coded low formats, whose codes are stored as uint8 but decode to floats), bool or
    int: which tensors are compared exact or not."""
    if dt.kind in "fVc":
        return "float"
    if dt.kind == "b":
        return "bool"
    return "int"


def added_nodes(dump: Dump) -> dict:
    """The ops of ``dump`` that a fusion pass split (:data:`ADDED_NODES`): op name -> the name of the node added after
    it, which gives what the graph's consumers read as the op's output ``<op>:0`` (AvgPool's mean; the op's own
    output is the window sum)."""
    out = {}
    for op in dump.ops:
        for suffix, types in ADDED_NODES.items():
            base = op["name"][:-len(suffix)]
            if op["name"].endswith(suffix) and base in dump and (dump.op(base).get("tf_type") in types
                                                                 or dump.op(base).get("ascend_type") in types):
                out[base] = op["name"]
    return out


def _cast_source(npu: Dump, bench: Dump, op: dict):
    """For an inserted Cast absent from the bench dump: the bench (op, output) holding the value it casts,
    looking through chains of inserted casts."""
    seen = set()
    while op.get("tf_type") == "Cast" and op.get("inputs") and op["name"] not in seen:
        seen.add(op["name"])
        src, idx = split_tensor_name(op["inputs"][0])
        if src in bench:
            bop = bench.op(src)
            if idx < len(bop["outputs"]):
                return bop, bop["outputs"][idx]
            return None
        if src in npu:
            op = npu.op(src)
            continue
        return None
    return None


def compare(npu_dump, bench_dump, *, thresholds=None, rules: str = "ascend-emu", chunk: int = CHUNK,
            force: bool = False, workers: int | None = None) -> Comparison:
    """Compare an NPU dump with a bench dump, tensor by tensor.

    Parameters
    ----------
    npu_dump, bench_dump : str, os.PathLike or Dump
        Dump directories (or loaded dumps) written by the replay and the reference.
    thresholds : Thresholds or dict, optional
        The accuracy rule's thresholds (msprobe's defaults).
    rules : {"ascend-emu", "msprobe"}
        How each row's Result is decided: ``"ascend-emu"`` (default) the cosine / MaxAbsErr rule
        above; ``"msprobe"`` msprobe 26.x's checkers (:func:`ascend_emu.analysis.msprobe.apply_msprobe_rules`),
        which give pass, warning or error.
    chunk : int
        Elements read per step when streaming tensors.
    force : bool
        Compare even when the manifests say the dumps are of different models (model
        fingerprint) or of different inputs (inputs hash); the result's ``forced`` says why
        and its summary, CSV and report say so.
    workers : int, optional
        Tensor pairs compared at once, in threads (default: the CPUs this process may use, at most 4). The
        rows are the same for any number: each pair's metrics are computed in one fixed order.

    Returns
    -------
    Comparison
        One row per tensor in the NPU dump's execution order: matched tensors (same op
        name and output index), inserted Casts (compared with the bench value they
        cast), ops only in the NPU dump, ops fused away, and ops only in the bench dump
        (placed after the NPU op that precedes them in the bench order; ops fused away just
        before the op they were fused into).

    Raises
    ------
    DumpError
        A dump is missing, incomplete or corrupt, holds no op, or a tensor file is missing or truncated.
    AscendEmuError
        The dumps are of different models or inputs (without ``force``), or share no op name.
    """
    t = Thresholds.coerce(thresholds)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise AscendEmuError(f"compare: workers must be a positive integer, got {workers!r}")
    if rules not in RULES:
        raise AscendEmuError(f"unknown rules {rules!r}; choose one of: {', '.join(RULES)}")
    npu = load_dump(npu_dump)
    bench = load_dump(bench_dump)
    for d, side in ((npu, "NPU"), (bench, "bench")):
        if not d.ops:
            raise DumpError(f"{side} dump {d.path} holds no ops, so there is nothing to compare; re-run the "
                            f"{'replay' if side == 'NPU' else 'reference'} of the model with --dump")
    forced = mismatch_reasons(npu, bench)
    if forced and not force:
        raise AscendEmuError(f"refusing to compare dumps of {'; '.join(forced)} (NPU dump {npu.path}, bench dump "
                             f"{bench.path}); compare a replay with the reference of the same model and inputs, "
                             "or pass --force (force=True) to compare anyway")
    common = [op["name"] for op in npu.ops if op["name"] in bench]
    if npu.ops and bench.ops and not common:
        raise AscendEmuError(
            f"dumps {npu.path} and {bench.path} have no op name in common (different models? "
            f"{npu.model.get('name')!r} vs {bench.model.get('name')!r}); compare a replay with the reference "
            "of the same model")
    fused = {f["name"]: f for f in npu.fused_away}
    internal = _internal(npu)
    # an op split by a fusion pass: its own output is another thing than the bench op of its name, and the node
    # added after it gives that op's output
    split = {base: added for base, added in added_nodes(npu).items() if base in bench and added not in bench}
    after = {added: base for base, added in split.items()}
    exact = rules != "msprobe"     # msprobe's checkers measure integer tensors like any other (its numbers kept)
    left_out: list[str] = []
    keyed: list[tuple[tuple, dict, _Info]] = []
    deferred: list = []   # the pairs' metric computations, run together below

    for op in npu.ops:
        bop = bench.op(op["name"]) if op["name"] in bench else None
        if bop is None and internal(op):
            left_out.append(op["name"])
            continue
        for out in op["outputs"]:
            row = _blank_row()
            _fill_side(row, "NPU", npu, op, out)
            _fill_op_columns(row, op, out)
            bout = bop["outputs"][out["index"]] if bop is not None and out["index"] < len(bop["outputs"]) else None
            kind = "npu only"
            base = after.get(op["name"])
            if op["name"] in split:
                # not the bench op of its name: never compared as if it were
                for c in METRIC_COLUMNS:
                    row[c] = NA
                row["Result"] = NA
                row["Err_message"] = (f"not compared: on the NPU a fusion pass splits {op['name']} "
                                      f"({op.get('tf_type')}) and {split[op['name']]} carries its output on "
                                      f"(AvgPoolFusionPass: this is the window sum); {split[op['name']]} is compared "
                                      f"with the bench {op['name']}.")
                info = _Info(kind, op["name"], None, out["index"], op["index"])
            elif base is not None:
                sop = bench.op(base)
                sout = sop["outputs"][out["index"]] if out["index"] < len(sop["outputs"]) else None
                if sout is None:
                    continue
                _fill_side(row, "Bench", bench, sop, sout)
                note = (f"added by a fusion pass after {base} (AvgPoolFusionPass's Mul): compared with the bench "
                        f"{base}, whose output it gives.")
                kind = _compare_pair(row, npu, op, out, bench, sop, sout, t, chunk, deferred, note, exact)
                info = _Info(kind, op["name"], base, out["index"], op["index"], sout["index"])
            elif bout is not None:
                _fill_side(row, "Bench", bench, bop, bout)
                kind = _compare_pair(row, npu, op, out, bench, bop, bout, t, chunk, deferred, exact_ints=exact)
                info = _Info(kind, op["name"], bop["name"], out["index"], op["index"], out["index"])
            else:
                src = _cast_source(npu, bench, op) if bop is None else None
                if src is not None:
                    sop, sout = src
                    _fill_side(row, "Bench", bench, sop, sout)
                    note = f"inserted Cast: compared with the bench value it casts ({sop['name']}:{sout['index']})."
                    _compare_pair(row, npu, op, out, bench, sop, sout, t, chunk, deferred, note, exact)
                    kind = "cast"
                    info = _Info(kind, op["name"], sop["name"], out["index"], op["index"], sout["index"])
                else:
                    for c in METRIC_COLUMNS:
                        row[c] = NA
                    row["Result"] = NA
                    if bop is not None:
                        row["Err_message"] = f"output {out['index']} exists only in the NPU dump."
                    elif CAST_MARK in op["name"] or op.get("tf_type") == "Cast":
                        row["Err_message"] = "NPU only: Cast inserted at a precision boundary."
                    else:
                        row["Err_message"] = "NPU only: no op of this name in the bench dump."
                    info = _Info(kind, op["name"], None, out["index"], op["index"])
            keyed.append(((op["index"], 0, 0, out["index"]), row, info))

    # bench ops without an NPU counterpart: after the NPU op that precedes them in bench order
    anchor = -1
    for bop in bench.ops:
        if bop["name"] in npu:
            anchor = npu.op(bop["name"])["index"]
            nop = npu.op(bop["name"])
            extra = range(len(nop["outputs"]), len(bop["outputs"]))
            for k in extra:
                bout = bop["outputs"][k]
                row = _blank_row()
                _fill_side(row, "Bench", bench, bop, bout)
                _fill_op_columns(row, bop, bout)
                row["Index"] = anchor
                for c in METRIC_COLUMNS:
                    row[c] = NA
                row["Result"] = NA
                row["Err_message"] = f"output {k} exists only in the bench dump."
                keyed.append(((anchor, 1, bop["index"], k), row, _Info("bench only", None, bop["name"], k, None, k)))
            continue
        for bout in bop["outputs"] or [None]:
            row = _blank_row()
            if bout is not None:
                _fill_side(row, "Bench", bench, bop, bout)
            else:
                row["Bench Name"] = bop["name"]
            _fill_op_columns(row, bop, bout)
            row["Index"] = None
            row["Overflow Status"] = None
            for c in METRIC_COLUMNS:
                row[c] = NA
            row["Result"] = NA
            k = bout["index"] if bout is not None else 0
            key = (anchor, 1, bop["index"], k)
            if bop["name"] in fused:
                f = fused[bop["name"]]
                row["Err_message"] = f"fused away on the NPU by {f['rule']} into {f['into']}."
                kind = "fused"
                if f["into"] in npu:  # listed just before the fused op that took its place
                    key = (npu.op(f["into"])["index"], -1, bop["index"], k)
            else:
                row["Err_message"] = "no op of this name in the NPU dump (bench only)."
                kind = "bench only"
            keyed.append((key, row, _Info(kind, None, bop["name"], k, None, k)))
    # fused ops the bench dump does not have either: still listed
    for name, f in fused.items():
        if name in bench:
            continue
        if internal({"name": name, "tf_type": f.get("tf_type")}):
            left_out.append(name)
            continue
        row = _blank_row()
        row["Op Type"] = f.get("tf_type")
        row["Bench Name"] = None
        row["NPU Name"] = None
        for c in METRIC_COLUMNS:
            row[c] = NA
        row["Result"] = NA
        row["Err_message"] = f"{name}: fused away on the NPU by {f['rule']} into {f['into']} (not in the bench dump)."
        into = npu.op(f["into"])["index"] if f["into"] in npu else -1
        keyed.append(((into, -1, -1, 0), row, _Info("fused", None, name, 0, None)))

    if workers is None:
        workers = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    _run_deferred(deferred, int(workers))
    if rules == "ascend-emu":
        _mark_noise(npu, bench, keyed)
    keyed.sort(key=lambda x: x[0])
    cmp = Comparison(npu, bench, [k[1] for k in keyed], [k[2] for k in keyed], t, rules, forced, left_out)
    if rules == "msprobe":
        from .msprobe import apply_msprobe_rules

        apply_msprobe_rules(cmp)
    return cmp


def _mark_noise(npu: Dump, bench: Dump, keyed: list) -> None:
    """Failing float rows that are rounding noise of an exact 0 on both sides (:mod:`.noise`): their message says
    so and the first divergent op passes them over. ascend-emu's rules only; the Result stays the metric rule's.
    Only rows the metrics judged (a number for a cosine: not a shape mismatch, not an inf/nan mismatch)."""
    for _, row, info in keyed:
        if row["Result"] != ERROR or info.kind != "matched" or info.npu_op is None or info.bench_op is None \
                or not isinstance(row["Cosine"], float) or row["NPU Tensor Shape"] != row["Bench Tensor Shape"]:
            continue
        try:
            ndt, bdt = np.dtype(_dt(row["NPU Dtype"])), np.dtype(_dt(row["Bench Dtype"]))
        except Exception:      # a dtype this numpy cannot name: no rule
            continue
        if _kind(ndt) != "float" or _kind(bdt) != "float" or row["NPU Dtype"] in CODED_FORMATS \
                or row["Bench Dtype"] in CODED_FORMATS:
            continue
        op = npu.op(info.npu_op)
        if additive_terms(npu, op, info.output) is None:
            continue           # not a sum: no tensor read (a failing MatMul or Mul is never noise)
        try:
            nv = npu.tensor(info.npu_op, info.output)
            bv = bench.tensor(info.bench_op, info.bench_output if info.bench_output is not None else info.output)
        except Exception:      # statistics only, or no tensor file: nothing to judge element by element
            continue
        msg = rounding_noise(npu, op, info.output, nv, bv)
        if msg:
            info.noise = True
            row["Err_message"] = f"{row['Err_message']} {msg}".strip()


def _internal(npu: Dump):
    """Whether an NPU op (with no bench op of its name) is a step inside a source node's lowering rather than a tensor
    of the model: marked so by the loader (``internal``: a .pt2 program's aten lowering), named under a node whose
    lowering has marked steps (what fusion made of them: ``convolution/Conv2D_4``, ``.../ConvBnFilterHost``), or a
    Cast of such a step. A dump without marks (TensorFlow, ONNX) has none."""
    owners = {op["internal"] for op in npu.ops if op.get("internal")}

    def under(name: str) -> bool:
        parts = name.split("/")
        return any("/".join(parts[:i]) in owners for i in range(1, len(parts)))

    def internal(op: dict) -> bool:
        if op.get("internal"):
            return True
        if not owners:
            return False
        if CAST_MARK in op["name"] or op.get("tf_type") == "Cast":
            srcs = [split_tensor_name(r)[0] for r in op.get("inputs") or []]
            return bool(srcs) and all(s in npu and internal(npu.op(s)) for s in srcs)
        return under(op["name"])
    return internal


_STATS = ("max", "min", "mean", "l2norm", "nan", "inf")


def same_output(a, b, aop: dict, bop: dict, k: int) -> bool | None:
    """Whether output ``k`` of an op holds the same bytes in both dumps (None: not comparable)."""
    ao = aop["outputs"][k]
    bo = bop["outputs"][k] if k < len(bop["outputs"]) else None
    if bo is None:
        return False
    if ao.get("dtype") != bo.get("dtype") or list(ao.get("shape") or []) != list(bo.get("shape") or []):
        return False
    if isinstance(ao.get("sha256"), str) and isinstance(bo.get("sha256"), str):
        return ao["sha256"] == bo["sha256"]     # digests of the stored bytes (random-errors' dumps): exact
    if a.has_tensor(aop["name"], k) and b.has_tensor(bop["name"], k):
        x = np.ascontiguousarray(a.tensor(aop["name"], k))
        y = np.ascontiguousarray(b.tensor(bop["name"], k))
        return x.tobytes() == y.tobytes()
    # statistics only (stats-only dumps, ops outside --select): equal statistics is all one can say
    if any(f in ao for f in _STATS):
        return all(_eq(ao.get(f), bo.get(f)) for f in _STATS)
    return None


def _eq(u, v) -> bool:
    if isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v):
        return True
    return u == v


def step_inputs(npu: Dump, bench: Dump) -> tuple[list, list] | None:
    """Two dumps of one training step (both record the step's state inputs, the same ones): the names of the
    step's other inputs (batch, step number) that differ between them, and of the state inputs that do; None
    when they are not both such dumps."""
    state = npu.state_inputs
    if not state or state != bench.state_inputs:
        return None
    batch, states = [], []
    for op in npu.ops:
        if op.get("tf_type") != "Placeholder" or op["name"] not in bench:
            continue
        bop = bench.op(op["name"])
        if any(same_output(npu, bench, op, bop, k) is False for k in range(len(op["outputs"]))):
            (states if op["name"] in state else batch).append(op["name"])
    return batch, states


def mismatch_reasons(npu: Dump, bench: Dump) -> list[str]:
    """Why two dumps do not belong together, from their manifests: a different model fingerprint,
    a different inputs hash (each naming both values). Empty if they match or a value is absent. Dumps of one
    training step (of two runs, or a run and its reference) may differ in their state inputs (weights, optimizer
    slots, loss scale): that is no reason; their batch and step number must match."""
    out = []
    fn, fb = npu.model.get("fingerprint"), bench.model.get("fingerprint")
    if fn and fb and fn != fb:
        out.append(f"different models (NPU model {npu.model.get('name')!r} fingerprint {fn}, bench model "
                   f"{bench.model.get('name')!r} fingerprint {fb})")
    hn, hb = npu.inputs_sha256, bench.inputs_sha256
    if hn and hb and hn != hb:
        steps = step_inputs(npu, bench) if not out else None
        if steps is None or not (steps[0] or steps[1]):
            # (no input seen to differ although the hashes do: tensors not dumped, so nothing shows it is state)
            out.append(f"different inputs (NPU inputs sha256 {hn}, bench inputs sha256 {hb})")
        elif steps[0]:
            # two steps that differ by more than their state (a state difference is compared, not refused)
            out.append(f"different inputs ({', '.join(steps[0][:5])} differ; the steps' other inputs are their "
                       "state)")
    return out

"""Checklist items on the data and the benchmark: 6 (dataset integrity), 7 (data order), 1 (constant predictions)."""
from __future__ import annotations

import hashlib
import math

import numpy as np

from ...errors import AscendEmuError
from .common import CheckRow, FAILED, PASSED, THRESHOLDS, _fmt, _names, _not_checked, _row
from .runs import _Ctx, _first_differing_op, _label_spec


# --------------------------------------------------------------------------- item 6: the dataset

def _row_dataset(c: _Ctx) -> CheckRow:
    item = "Dataset integrity"
    method = ("x and y scanned: sizes, NaN/Inf, constant or all-zero features, labels against the model's "
              "outputs and loss, duplicated samples, feature scales")
    x, y = c.x, c.y
    bad, notes = [], []
    if len(x) == 0 or len(y) == 0:
        c.valid = None
        return _row(6, item, method, FAILED, f"empty arrays: x has {len(x)} samples, y {len(y)}")
    if len(x) != len(y):
        c.valid = None
        return _row(6, item, method, FAILED, f"truncated: x has {len(x)} samples but y {len(y)}; which labels "
                                             "belong to which samples is unknown")
    n = len(x)
    xf = x.reshape(n, -1)
    yf = y.reshape(n, -1)
    valid = np.ones(n, bool)
    if x.dtype.kind == "f":
        fin = np.isfinite(xf).all(axis=1)
        if not fin.all():
            nan = int(np.isnan(xf).any(axis=1).sum())
            bad.append(f"{int((~fin).sum())} sample(s) with NaN/Inf in x ({nan} with NaN; first at sample "
                       f"{int(np.argmin(fin))})")
            valid &= fin
    if y.dtype.kind == "f":
        fin = np.isfinite(yf).all(axis=1)
        if not fin.all():
            bad.append(f"{int((~fin).sum())} sample(s) with NaN/Inf in y (first at sample {int(np.argmin(fin))})")
            valid &= fin
    # labels against the model's classes
    units = None
    outs = getattr(c.model, "outputs", None)
    if outs:
        units = outs[0].shape[-1]
    kind, classes = _label_spec(c.loss_fn, units)
    if kind == "sparse" and classes:
        yy = np.where(np.isfinite(yf.astype(np.float64)), yf.astype(np.float64), 0.0)
        ok = ((yy >= 0) & (yy < classes) & (yy == np.floor(yy))).all(axis=1)
        if not ok.all():
            vals = np.unique(yy[~ok.reshape(-1)] if yf.shape[1] == 1 else yy[~ok])
            bad.append(f"{int((~ok).sum())} label(s) outside the model's {classes} classes 0..{classes - 1} "
                       f"(values {_names([_fmt(v) for v in vals[:5]])})")
            valid &= ok
        present = np.unique(yy[ok].astype(np.int64)) if ok.any() else []
        notes.append(f"{len(present)} of {classes} classes present")
    elif kind == "categorical" and classes:
        if yf.shape[1] != classes:
            bad.append(f"y has {yf.shape[1]} columns but the model has {classes} outputs")
            valid[:] = False
        else:
            s = yf.astype(np.float64).sum(axis=1)
            ok = (np.abs(s - 1) < 1e-3) & ((yf >= 0) & (yf <= 1)).all(axis=1)
            if not ok.all():
                bad.append(f"{int((~ok).sum())} one-hot label row(s) not in [0, 1] summing to 1")
                valid &= ok
    elif kind == "binary":
        ok = ((yf >= 0) & (yf <= 1)).all(axis=1)
        if not ok.all():
            bad.append(f"{int((~ok).sum())} label(s) outside [0, 1] for a binary loss")
            valid &= ok
    else:
        notes.append("no label range to check for this loss")
    # features: per column (per channel for images and sequences), on the finite samples
    if x.dtype.kind in "fiu" and valid.any():
        feat = x[valid].reshape(-1, x.shape[-1] if x.ndim > 2 else xf.shape[1]).astype(np.float64)
        std = feat.std(axis=0)
        rms = np.sqrt((feat ** 2).mean(axis=0))
        zero = np.flatnonzero(rms == 0)
        const = np.flatnonzero((std == 0) & (rms != 0))
        if zero.size:
            bad.append(f"{zero.size} all-zero feature(s) (index {_names(zero.tolist())})")
        if const.size:
            bad.append(f"{const.size} constant feature(s) (index {_names(const.tolist())})")
        live = rms[rms > 0]
        if live.size > 1:
            ratio = float(live.max() / live.min())
            if ratio > THRESHOLDS["feature_scale_ratio"]:
                small = int(np.flatnonzero(rms == live.min())[0])
                bad.append(f"features not normalised: their RMS spans {ratio:.3g}x (feature {int(np.argmax(rms))}: "
                           f"{_fmt(rms.max())}, feature {small}: {_fmt(live.min())}; limit "
                           f"{THRESHOLDS['feature_scale_ratio']:g}x)")
            notes.append(f"feature RMS {_fmt(live.min())}..{_fmt(live.max())}")
    # duplicates
    keys = {}
    dup = 0
    for i in range(n):
        k = hashlib.sha1(xf[i].tobytes() + yf[i].tobytes()).digest()
        if k in keys:
            dup += 1
        else:
            keys[k] = i
    if dup / n > THRESHOLDS["duplicate_share"]:
        bad.append(f"{dup} duplicated sample(s) ({dup / n:.1%} of {n})")
    elif dup:
        notes.append(f"{dup} duplicated sample(s)")
    c.valid = valid if valid.any() else None
    if bad:
        return _row(6, item, method, FAILED, "; ".join(bad) + (f"; the training items use the {int(valid.sum())} "
                                                                 "clean samples" if valid.any() else ""))
    return _row(6, item, method, PASSED, f"{n} samples, x {tuple(x.shape[1:])} {x.dtype}, y "
                                         f"{tuple(y.shape[1:])} {y.dtype}; no NaN/Inf, no duplicates"
                + (f"; {'; '.join(notes)}" if notes else ""))


# --------------------------------------------------------------------------- item 7: data order

def _row_order(c: _Ctx) -> CheckRow:
    from ...npu.training import batch_order

    item = "Shuffle order reproducible"
    if c.valid is None:
        return _not_checked(7, item, "-", "no usable samples (item 6)")
    n = int(c.valid.sum())
    if c.shuffle:
        method = f"the seeded shuffle (seed {c.seed}) run twice over {c.steps} batches, and with another seed"
        a = batch_order(n, c.batch_size, c.steps, shuffle=True, seed=c.seed)
        b = batch_order(n, c.batch_size, c.steps, shuffle=True, seed=c.seed)
        other = batch_order(n, c.batch_size, c.steps, shuffle=True, seed=c.seed + 1)
        same = all(np.array_equal(p, q) for p, q in zip(a, b))
        if not same:
            return _row(7, item, method, FAILED, "two passes with the same seed give different orders")
        differs = not all(np.array_equal(p, q) for p, q in zip(a, other))
        return _row(7, item, method, PASSED, f"two passes with seed {c.seed} give the same order (first batch "
                                             f"starts {_names(a[0][:5].tolist())})"
                    + ("" if differs else "; note: another seed gives the same order (too few samples)")
                    + ". For a tf.data pipeline: shuffle(seed=...) and Options().deterministic = True")
    method = "batches in file order (no --shuffle): labels per batch"
    yv = c.yv.reshape(n, -1)
    order = batch_order(n, c.batch_size, min(c.steps, math.ceil(n / c.batch_size)), shuffle=False, seed=0)
    single = sum(1 for idx in order if len(idx) > 1 and len({r.tobytes() for r in yv[idx]}) == 1)
    labels = len({r.tobytes() for r in yv})
    share = single / max(1, len(order))
    if labels > 1 and yv.shape[1] == 1 and share > THRESHOLDS["sorted_label_batches"]:
        return _row(7, item, method, FAILED, f"{single} of {len(order)} batches hold a single label: the file is "
                                             "sorted by label and not shuffled; train with --shuffle --seed S")
    return _row(7, item, method, PASSED, f"file order, reproducible by construction; {single} of {len(order)} "
                                         "batches hold a single label")


# --------------------------------------------------------------------------- item 1: constant predictions

def _run_inference_twice(c: _Ctx) -> None:
    from ...frontend.tf.loader import load_graph
    from ...frontend.tf.reference import reference

    try:
        graph = load_graph(c.model)
        if len(graph.inputs) != 1:
            raise AscendEmuError(f"the check feeds one input; the model has {len(graph.inputs)}")
        xb = c.xv[:c.batch_size]
        feeds = {graph.inputs[0].name: xb.astype(graph.inputs[0].dtype) if graph.inputs[0].dtype else xb}
        a = reference(graph, feeds, progress=False)
        b = reference(graph, feeds, progress=False)
    except AscendEmuError as e:
        c.inf_error = str(e)
        return
    c.inf_ops = len(graph.nodes)
    for node in graph.nodes:
        for t in node.outputs():
            ta, tb = a.tensors.get(t), b.tensors.get(t)
            if ta is None or tb is None or ta.dtype == object:
                continue
            if ta.shape != tb.shape or ta.tobytes() != tb.tobytes():
                d = (float(np.nanmax(np.abs(ta.astype(np.float64) - tb.astype(np.float64))))
                     if ta.shape == tb.shape and ta.dtype.kind in "fiu" and ta.size else math.nan)
                c.inf_diff = (node.name, node.op, t.rsplit(":", 1)[-1], d)
                return


def _row_constant(c: _Ctx) -> CheckRow:
    item = "Benchmark gives constant predictions"
    method = (f"float32 reference run twice: inference on one batch and {c.steps} training steps, "
              "compared bit for bit")
    if c.valid is None:
        return _not_checked(1, item, method, "no usable samples (item 6)")
    if c.inf_error or c.ref_error:
        return _not_checked(1, item, method, f"the reference did not run: {c.inf_error or c.ref_error}")
    bad = []
    if c.inf_diff is not None:
        name, op, t, d = c.inf_diff
        bad.append(f"inference: first differing op {name} ({op}) output {t}, max |difference| {_fmt(d)}")
    a, b = c.ref_a, c.ref_b
    k = next((i for i, (p, q) in enumerate(zip(a.digests, b.digests)) if p != q), None)
    if k is not None:
        line = f"training: step {k} differs (loss {a.losses[k]!r} vs {b.losses[k]!r})"
        if k == 0 and a.dump0 and c.ref_c is not None and c.ref_c.dump0:
            first = _first_differing_op(a.dump0, c.ref_c.dump0)
            if first is not None:
                op, idx, d = first
                line += f"; first differing op {op['name']} ({op['tf_type']}) output {idx}, max |difference| {_fmt(d)}"
        bad.append(line)
    if bad:
        return _row(1, item, method, FAILED, "; ".join(bad) + ": a nondeterministic benchmark cannot serve as "
                                                             "the accuracy reference (seed it, or remove the "
                                                             "stateful random op)")
    return _row(1, item, method, PASSED, f"inference: {c.inf_ops} ops bit-identical; training: {c.steps} steps' "
                                         "losses, gradients and weights bit-identical")

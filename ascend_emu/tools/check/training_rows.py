"""Checklist items on training read from the float32 reference: 9 (training process), 11 (initialisation),
12 (gradients), 13 (activation saturation), 14 (loss), 15 (learning rate), 10 (hyperparameters), 8 (distributed)."""
from __future__ import annotations

import math

import numpy as np

from ...errors import AscendEmuError
from .common import (ACTIVATIONS, CheckRow, FAILED, LR_RANGES, PASSED, THRESHOLDS, _HIST_BINS, _fmt, _names,
                     _not_checked, _row)
from .runs import _Ctx


# --------------------------------------------------------------------------- training items (reference run)

def _layers(model):
    out, stack = [], list(getattr(model, "layers", []))
    while stack:
        layer = stack.pop(0)
        out.append(layer)
        stack[0:0] = list(getattr(layer, "layers", []) or [])
    return out


def _row_training(c: _Ctx) -> CheckRow:
    item = "Training process: weights update, BatchNorm and dropout modes"
    method = ("frozen layers and variables outside the optimizer; trainable weights compared before and after "
              "the reference steps; BatchNorm moving statistics after step 0; inference run twice (dropout off)")
    if c.ref_a is None or c.ref_a.state0 is None:
        return _not_checked(9, item, method, c.ref_error or "no usable samples (item 6)")
    a = c.ref_a
    bad, notes = [], []
    frozen = [layer.name for layer in _layers(c.model) if not layer.trainable and layer.weights
              and not getattr(layer, "layers", None)]
    if frozen:
        bad.append(f"frozen layer(s), not in the optimizer: {_names(frozen)}")
    same = [k.split("/", 1)[1] for k in a.grad_keys if np.array_equal(a.initial[k], a.final[k])]
    if same:
        bad.append(f"weights unchanged after {c.steps} steps (no gradient reaches them): {_names(same)}")
    bn = [layer for layer in _layers(c.model) if type(layer).__name__ == "BatchNormalization" and layer.trainable]
    stuck = []
    for layer in bn:
        keys = [k for k in a.initial if k.startswith("non_trainable/") and layer.name in k and "moving_mean" in k]
        if keys and all(np.array_equal(a.initial[k], a.state0[k]) for k in keys):
            stuck.append(layer.name)
    if stuck:
        bad.append(f"BatchNorm moving statistics not updated in training: {_names(stuck)}")
    elif bn:
        notes.append(f"{len(bn)} BatchNorm layer(s) update their statistics in training")
    drop = [layer.name for layer in _layers(c.model) if "Dropout" in type(layer).__name__]
    if drop:
        if c.inf_diff is not None and any(d in c.inf_diff[0] for d in drop):
            bad.append(f"inference differs between two runs (dropout active in inference?): {_names(drop)}")
        else:
            notes.append(f"dropout {_names(drop)} off in inference (the two inference runs agree on it)")
    shared = {}
    for layer in _layers(c.model):
        for w in getattr(layer, "weights", []):
            shared.setdefault(id(w), set()).add(layer.name)
    both = [sorted(v) for v in shared.values() if len(v) > 1 and not any(
        getattr(lay, "layers", None) for lay in _layers(c.model) if lay.name in v)]
    if both:
        notes.append(f"shared weights: {_names('/'.join(v) for v in both)}")
    if bad:
        return _row(9, item, method, FAILED, "; ".join(bad + notes))
    return _row(9, item, method, PASSED, f"all {len(a.grad_keys)} trainable variables change"
                + (f"; {'; '.join(notes)}" if notes else ""))


def _row_init(c: _Ctx) -> CheckRow:
    item = "Weights initialised (not all zero, units not identical)"
    method = "every trainable weight matrix of the model as given: all zeros, or every unit (output column) the same"
    zero, ident, n = [], [], 0
    for v in c.model.trainable_variables:
        w = np.asarray(v.numpy())
        if w.ndim < 2:
            continue   # biases, BatchNorm's beta/gamma: zero or one by design
        n += 1
        if not np.any(w):
            zero.append(v.path)
            continue
        cols = w.reshape(-1, w.shape[-1])
        if cols.shape[1] > 1 and np.all(cols == cols[:, :1]):
            ident.append(v.path)
    bad = ([f"all zero: {_names(zero)}"] if zero else []) + ([f"identical units: {_names(ident)}"] if ident else [])
    if bad:
        return _row(11, item, method, FAILED, "; ".join(bad) + " (symmetric units learn the same thing: use a "
                                                               "random initializer)")
    return _row(11, item, method, PASSED, f"{n} weight matrices, none all zero, none with identical units")


def _layer_norms(c: _Ctx):
    """(layer names, steps x layers array) of the float32 gradient norm per layer (its variables together)."""
    keys = c.ref_a.grad_keys
    layers = []
    for k in keys:
        lay = k.split("/", 1)[1].rsplit("/", 1)[0]
        if lay not in layers:
            layers.append(lay)
    arr = np.zeros((len(c.ref_a.grad_norms), len(layers)))
    for i, step in enumerate(c.ref_a.grad_norms):
        for k, v in step.items():
            j = layers.index(k.split("/", 1)[1].rsplit("/", 1)[0])
            arr[i, j] = math.hypot(arr[i, j], v) if math.isfinite(v) else math.inf
    return layers, arr


def _row_gradients(c: _Ctx) -> CheckRow:
    item = "Gradients neither vanish nor explode"
    method = ("float32 gradient norm per layer over the first steps: growth of the largest, ratio of the "
              "smallest to the largest at step 0")
    if c.ref_a is None or not c.ref_a.grad_norms:
        return _not_checked(12, item, method, c.ref_error or "no usable samples (item 6)")
    layers, arr = _layer_norms(c)
    plot = {"layers": layers, "norms": arr.tolist()}
    bad = []
    nonfinite = np.flatnonzero(~np.isfinite(arr).all(axis=1))
    if nonfinite.size:
        j = int(np.flatnonzero(~np.isfinite(arr[nonfinite[0]]))[0])
        bad.append(f"non-finite gradient at step {int(nonfinite[0])} in layer {layers[j]}")
    top0 = float(arr[0].max())
    fin = arr[np.isfinite(arr).all(axis=1)]
    growth = float(fin.max(axis=1).max() / top0) if top0 > 0 and len(fin) else math.nan
    if not bad and math.isfinite(growth) and growth > THRESHOLDS["explode_growth"]:
        i = int(np.argmax(fin.max(axis=1)))
        bad.append(f"exploding: the largest layer gradient norm grows {growth:.3g}x over {len(arr)} steps "
                   f"({_fmt(top0)} at step 0, {_fmt(fin.max(axis=1)[i])} at step {i}, layer "
                   f"{layers[int(np.argmax(fin[i]))]})")
    live = arr[0][arr[0] > 0]
    ratio = float(live.min() / live.max()) if live.size > 1 else 1.0
    if ratio < THRESHOLDS["vanish_ratio"]:
        j = int(np.flatnonzero(arr[0] == live.min())[0])
        bad.append(f"vanishing: layer {layers[j]}'s gradient norm is {ratio:.3g} of the largest at step 0")
    ev = (f"step 0 norms {_fmt(live.min() if live.size else 0)}..{_fmt(top0)} over {len(layers)} layers; largest "
          f"grows {_fmt(growth)}x over {len(arr)} steps")
    if bad:
        return _row(12, item, method, FAILED, "; ".join(bad), plot)
    return _row(12, item, method, PASSED, ev, plot)


def _row_saturation(c: _Ctx) -> CheckRow:
    from ...analysis.dump import load_dump

    item = "Activations not saturated"
    p = THRESHOLDS["pinned"]
    method = (f"float32 step 0 forward: sigmoid outputs within {p:g} of 0 or 1, tanh within {p:g} of +-1, ReLU "
              "units zero on the whole batch")
    if c.ref_a is None or c.ref_a.dump0 is None:
        return _not_checked(13, item, method, c.ref_error or "no usable samples (item 6)")
    d = load_dump(c.ref_a.dump0)
    hists, bad, n = [], [], 0
    for op in d.ops:
        if op["tf_type"] not in ACTIVATIONS or c.ref_a.phase(op["name"]) != "forward":
            continue
        if not d.has_tensor(op["name"], 0):
            continue
        v = np.asarray(d.tensor(op["name"], 0), np.float64)
        if v.size == 0:
            continue
        n += 1
        t = op["tf_type"]
        if t == "Sigmoid":
            share = float(np.mean(np.minimum(v, 1 - v) < p))
            what = "pinned at 0 or 1"
        elif t == "Tanh":
            share = float(np.mean(np.abs(v) > 1 - p))
            what = "pinned at +-1"
        else:
            units = v.reshape(-1, v.shape[-1]) if v.ndim > 1 else v.reshape(-1, 1)
            share = float(np.mean(~np.any(units > 0, axis=0)))
            what = "dead units"
        fin = v[np.isfinite(v)]
        counts, edges = (np.histogram(fin, bins=_HIST_BINS) if fin.size
                         else (np.zeros(_HIST_BINS), np.zeros(_HIST_BINS + 1)))
        hists.append({"name": op["name"], "type": t, "share": share, "what": what,
                      "counts": counts.tolist(), "edges": edges.tolist()})
        if share > THRESHOLDS["saturated_share"]:
            bad.append(f"{op['name']} ({t}): {share:.0%} {what}")
    plot = {"activations": hists} if hists else None
    if not n:
        return _row(13, item, method, PASSED, "no sigmoid, tanh or ReLU activation in the model", plot)
    if bad:
        return _row(13, item, method, FAILED, "; ".join(bad) + " (scale the inputs or the initial weights down)",
                    plot)
    return _row(13, item, method, PASSED, f"{n} activation(s): "
                + "; ".join(f"{h['name']} {h['share']:.0%} {h['what']}" for h in hists[:4]), plot)


def _row_loss(c: _Ctx) -> CheckRow:
    item = "Loss decreases and stays finite"
    method = f"float32 reference: loss of every step, and of the first batch before and after {c.steps} steps"
    if c.ref_a is None or not c.ref_a.losses:
        return _not_checked(14, item, method, c.ref_error or "no usable samples (item 6)")
    losses = c.ref_a.losses
    npu = c.npu.losses.tolist() if c.npu is not None else None
    plot = {"reference": losses, "npu": npu}
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    if bad:
        return _row(14, item, method, FAILED, f"loss {losses[bad[0]]} at step {bad[0]}", plot)
    start, end = losses[0], c.ref_a.end_loss_batch0
    if end is None or not math.isfinite(end):
        return _row(14, item, method, FAILED, f"loss of the first batch after {c.steps} steps: {end}", plot)
    ev = f"first batch: {_fmt(start)} at the start, {_fmt(end)} after {c.steps} steps"
    if not end < start:
        return _row(14, item, method, FAILED, ev + ": not decreasing", plot)
    if start == 0:
        return _row(14, item, method, FAILED, "loss is 0 at the start", plot)
    return _row(14, item, method, PASSED, ev + f" (step losses {_fmt(min(losses))}..{_fmt(max(losses))})", plot)


def _row_lr(c: _Ctx) -> CheckRow:
    item = "Learning rate in a sensible range"
    lo, hi = LR_RANGES.get(c.fopt.kind, (1e-6, 1e-2))
    method = f"initial learning rate of {c.fopt.kind} against {lo:g}..{hi:g}"
    lr = c.fopt.config.get("learning_rate")
    sched = ""
    if c.fopt.schedule is not None:
        lr = float(np.asarray(c.fopt.schedule(0)))
        sched = f" ({type(c.fopt.schedule).__name__} at step 0)"
    if lr is None:
        return _not_checked(15, item, method, "the learning rate is not a number")
    ev = f"{c.fopt.kind} learning rate {lr:g}{sched}"
    if not lo <= lr <= hi:
        return _row(15, item, method, FAILED, ev + f" is outside {lo:g}..{hi:g}")
    return _row(15, item, method, PASSED, ev)


# --------------------------------------------------------------------------- item 10: hyperparameters

def _config_of(c: _Ctx) -> dict:
    opt = c.fopt.to_dict()
    out = {"optimizer": str(opt.pop("name")).lower(), "loss": _loss_name(c.loss_fn), "batch_size": c.batch_size}
    out.update({k: v for k, v in opt.items()})
    if c.epochs is not None:
        out["epochs"] = c.epochs
    return out


def _loss_name(loss_fn) -> str:
    name = getattr(loss_fn, "name", None) or type(loss_fn).__name__
    cfg = loss_fn.get_config() if hasattr(loss_fn, "get_config") else {}
    if isinstance(cfg, dict) and cfg.get("from_logits"):
        name += "_from_logits"
    return str(name)


def _benchmark_settings(benchmark, benchmark_config) -> tuple[dict, str]:
    """(settings, source) of the benchmark: its model's compiled optimizer and loss, or the config's keys."""
    from ...frontend.tf import training as T
    from ...npu.training import _load_model

    if benchmark_config is not None:
        cfg = dict(benchmark_config)
        out = {}
        opt = cfg.pop("optimizer", None)
        if isinstance(opt, dict):
            opt = dict(opt)
            out["optimizer"] = str(opt.pop("name", "")).lower()
            out.update(opt)
        elif opt is not None:
            out["optimizer"] = str(opt).lower()
        out.update(cfg)
        return out, "--benchmark-config"
    bm = _load_model(benchmark)
    if getattr(bm, "optimizer", None) is None or getattr(bm, "loss", None) is None:
        raise AscendEmuError("the benchmark model is not compiled with an optimizer and a loss, so it states no "
                             "hyperparameters; give --benchmark-config CONFIG.json instead")
    fopt = T.resolve_optimizer(bm)
    loss = T.resolve_loss(bm)
    opt = fopt.to_dict()
    out = {"optimizer": str(opt.pop("name")).lower(), "loss": _loss_name(loss)}
    out.update(opt)
    return out, f"--benchmark {getattr(bm, 'name', '')}".strip()


def _val(v) -> str:
    if isinstance(v, float):
        return f"{v:.7g}"
    return repr(v)


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=0.0)
    return a == b


def _row_hyper(c: _Ctx) -> CheckRow:
    item = "Hyperparameters match the benchmark"
    method = "optimizer and its settings, learning rate (and schedule), loss, batch size, epochs: every one both state"
    if c.benchmark is None:
        return _not_checked(10, item, method, "no benchmark given: pass --benchmark MODEL.keras or "
                                              "--benchmark-config CONFIG.json")
    bench, src = c.benchmark
    mine = _config_of(c)
    diffs = []
    for k in sorted(set(bench) & set(mine)):
        if not _same(mine[k], bench[k]):
            diffs.append(f"{k}: {_val(mine[k])} here, {_val(bench[k])} in the benchmark")
    only = sorted(set(bench) - set(mine))
    compared = sorted(set(bench) & set(mine))
    tail = f" (not compared, stated by the benchmark only: {', '.join(only)})" if only else ""
    if diffs:
        return _row(10, item, method, FAILED, "; ".join(diffs) + tail)
    return _row(10, item, method, PASSED, f"{len(compared)} setting(s) equal ({', '.join(compared)}) against "
                                          f"{src}" + tail)


def _row_distributed() -> CheckRow:
    return _not_checked(8, "Distributed training and data sharding",
                        "needs the user's cluster and data-reading code",
                        "by hand: print each node's file list and sample count after sharding (sorted file names, "
                        "no file on two nodes, the benchmark's policy), check every rank starts from the same "
                        "weights (same seed or a broadcast) and that distributed training is enabled in the port")

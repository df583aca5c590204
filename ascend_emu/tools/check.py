"""The pre-tuning checklist, automated: every item a program can decide, before any numerics work.

Seed 000 opens accuracy tuning with a numbered checklist (Passed / Failed / Not checked) that rules out
errors in the benchmark model and in the port; seed 003 lists the training problems worth checking
first (data, hyperparameters, model structure, loss curve). :func:`check` runs them on a Keras model and
its training data, plus the checks only an emulator can run (fp16 overflow, fp16 error against float32,
gradient underflow, long fp16 reductions), and returns one :class:`CheckRow` per item.

What runs (all on the samples that pass the dataset check, so one bad sample does not hide the rest):

- the float32 reference (TensorFlow on the CPU) twice, inference on the first batch and ``steps``
  training steps, compared bit for bit (item 1); the first run's gradients per layer, losses, weights and
  step-0 activations feed the model-structure and training items;
- the emulated NPU training for ``steps`` steps on the user's device (precision mode, lists, SoC, loss
  scale, overflow check) beside the float32 reference of the same steps, step 0 dumped by both: the
  precision items read the two dumps.

Every threshold is in :data:`THRESHOLDS`; README "Pre-tuning checklist" says what each row decides.
"""
from __future__ import annotations

import hashlib
import math
import os
import tempfile
import textwrap
from dataclasses import dataclass, field

import numpy as np

from ..errors import AscendEmuError

PASSED, FAILED, NOT_CHECKED = "Passed", "Failed", "Not checked"
RESULTS = (PASSED, FAILED, NOT_CHECKED)

#: every threshold a row decides by, in one visible table
THRESHOLDS = {
    "duplicate_share": 0.01,       # item 6: duplicated samples, share of all samples
    "feature_scale_ratio": 100.0,  # item 6: largest / smallest per-feature RMS ("orders of magnitude apart")
    "sorted_label_batches": 0.5,   # item 7: share of single-label batches in file order without --shuffle
    "fp16_flop_share": 0.5,        # item 2/3: share of the matrix FLOPs that must run in fp16/bf16
    "explode_growth": 100.0,       # item 12: largest layer gradient norm grows this many times over the steps
    "vanish_ratio": 1e-5,          # item 12: smallest / largest layer gradient norm at step 0
    "pinned": 1e-3,                # item 13: sigmoid within this of 0 or 1, tanh within it of +-1
    "saturated_share": 0.5,        # item 13: share of pinned outputs (sigmoid, tanh) or dead units (ReLU)
    "underflow_share": 0.01,       # item 18: gradient elements zero in fp16 but not in float32
    "reduce_length": 2048,         # item 19: terms per output of an fp16 reduction (fp16 has 11 significant bits)
}
#: item 15: a sensible initial learning rate per optimizer (inclusive)
LR_RANGES = {"sgd": (1e-5, 1.0), "adam": (1e-6, 1e-2), "adamw": (1e-6, 1e-2), "rmsprop": (1e-6, 1e-2)}
#: reductions whose fp16 accumulation loses precision over long axes (ASCEND-FACTS section 3)
REDUCTIONS = {"Sum", "Mean", "Prod", "BiasAddGrad", "L2Loss"}
#: stateful random ops: their outputs differ between any two runs (item 1), so item 17 does not compare them
RANDOM_OPS = {"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt", "Multinomial",
              "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2"}
ACTIVATIONS = {"Sigmoid", "Tanh", "Relu", "Relu6", "Elu", "Selu", "LeakyRelu"}
_HIST_BINS = 40


# --------------------------------------------------------------------------- rows and result

@dataclass
class CheckRow:
    """One checklist item: ``result`` is exactly ``Passed``, ``Failed`` or ``Not checked`` (the reason then
    in ``evidence``). ``plot`` holds the numbers behind a numeric row's report plot (not in the JSON)."""

    number: str
    item: str
    method: str
    result: str
    evidence: str
    plot: dict | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {"number": self.number, "item": self.item, "method": self.method, "result": self.result,
                "evidence": self.evidence}


@dataclass
class CheckResult:
    """What :func:`check` found: the rows in checklist order (iterate over it, or ``result["6"]``),
    the suggested CANN ``modify_mixlist`` (``ops_info``, None when no row failed for precision reasons)
    and the configuration checked."""

    rows: list
    ops_info: dict | None = None
    config: dict = field(default_factory=dict)

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, number) -> CheckRow:
        for r in self.rows:
            if r.number == str(number):
                return r
        raise KeyError(f"no checklist row {number!r}; rows: {', '.join(r.number for r in self.rows)}")

    @property
    def failed(self) -> list:
        return [r for r in self.rows if r.result == FAILED]

    @property
    def exit_code(self) -> int:
        """0 when nothing failed, 1 when something did (the CLI's exit status)."""
        return 1 if self.failed else 0

    def to_json(self) -> dict:
        """``{"rows": [{"number", "item", "method", "result", "evidence"}, ...]}``."""
        return {"rows": [r.to_json() for r in self.rows]}

    def format_text(self, width: int = 160) -> str:
        """The checklist as a table: number, item, method, result, evidence (cells wrapped)."""
        heads = ["No.", "Item", "Method", "Result", "Evidence"]
        fixed = [5, 30, 38, 11]
        widths = fixed + [max(30, width - sum(fixed) - 2 * len(fixed))]
        out = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip(), "-" * min(width, sum(widths) + 8)]
        for r in self.rows:
            cells = [textwrap.wrap(str(v), w) or [""] for v, w in
                     zip((r.number, r.item, r.method, r.result, r.evidence), widths)]
            for k in range(max(len(c) for c in cells)):
                out.append("  ".join((c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)).rstrip())
        counts = {k: sum(1 for r in self.rows if r.result == k) for k in RESULTS}
        out.append("")
        out.append(f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[NOT_CHECKED]} not checked")
        return "\n".join(out)

    def report_data(self) -> dict:
        """Everything the HTML report needs: the rows with their plot data, the suggestion, the config."""
        return {"rows": [dict(r.to_json(), plot=r.plot) for r in self.rows], "ops_info": self.ops_info,
                "config": self.config}


def _row(number, item, method, result, evidence, plot=None) -> CheckRow:
    assert result in RESULTS
    return CheckRow(str(number), item, method, result, evidence, plot)


def _not_checked(number, item, method, reason) -> CheckRow:
    return _row(number, item, method, NOT_CHECKED, reason)


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.4g}"
    return str(v)


def _names(items, limit=5) -> str:
    items = list(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(map(str, items[:limit])) + more


# --------------------------------------------------------------------------- data

def _read_data(data) -> tuple[np.ndarray, np.ndarray]:
    """x and y as given (no cleaning): an .npz path, a dict or a pair. A file that cannot be read, missing
    arrays or non-numeric arrays are bad input; empty or mismatched arrays are item 6's to report."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if not os.path.isfile(path):
            raise AscendEmuError(f"--data {path}: no such file; give an .npz with arrays x and y")
        try:
            with np.load(path, allow_pickle=False) as f:
                data = {k: f[k] for k in f.files}
        except (ValueError, OSError, EOFError) as e:
            raise AscendEmuError(f"--data {path}: not a readable .npz ({str(e).splitlines()[0][:200]})") from None
    if isinstance(data, dict):
        missing = [k for k in ("x", "y") if k not in data]
        if missing:
            raise AscendEmuError(f"training data needs arrays x and y; missing {', '.join(missing)} "
                                 f"(has: {', '.join(sorted(data)) or 'nothing'})")
        x, y = np.asarray(data["x"]), np.asarray(data["y"])
    elif isinstance(data, (tuple, list)) and len(data) == 2:
        x, y = np.asarray(data[0]), np.asarray(data[1])
    else:
        raise AscendEmuError("training data must be an .npz path, a dict with x and y, or a pair (x, y)")
    for name, a in (("x", x), ("y", y)):
        if a.dtype.kind not in "fiub":
            raise AscendEmuError(f"training data {name} has dtype {a.dtype}; numbers only")
        if a.ndim == 0:
            raise AscendEmuError(f"training data {name} is a scalar; give one entry per sample")
    return x, y


def _label_spec(loss_fn, units):
    """(kind, classes) the loss expects of y: sparse / categorical / binary / None (no range to check)."""
    name = type(loss_fn).__name__
    cfg_name = str(getattr(loss_fn, "name", "") or "")
    key = (name + " " + cfg_name).lower()
    if "sparsecategorical" in key.replace("_", "") or "sparse_categorical" in key:
        return "sparse", units
    if "categorical" in key.replace("_", ""):
        return "categorical", units
    if "binary" in key:
        return "binary", units
    return None, units


# --------------------------------------------------------------------------- the runs

@dataclass
class _RefRun:
    """What one float32 reference training run saw: per step the loss, a digest of its outputs, the
    gradient norm per variable; the state after step 0 and at the end; the loss of batch 0 at the end."""

    losses: list = field(default_factory=list)
    digests: list = field(default_factory=list)
    grad_norms: list = field(default_factory=list)      # per step: {state key: norm}
    grad_keys: list = field(default_factory=list)
    state0: dict | None = None                           # after step 0
    initial: dict | None = None
    final: dict | None = None
    end_loss_batch0: float | None = None
    tiny0: tuple = (0, 0)                                # step 0: gradient elements below fp16's range, of all
    phase: object = None                                 # TrainStep.phase
    dump0: str | None = None
    error: str | None = None


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _reference_run(step, x, y, *, batch_size, steps, shuffle, seed, dump_dir, detail, progress) -> _RefRun:
    from ..frontend import training as T
    from ..npu.training import reference_train

    run = _RefRun()
    first = {}

    def on_step(i, sg, feeds, outs):
        ng = sg.n_grads
        keys = [k for k, _, _ in sg.state]
        run.losses.append(float(np.asarray(outs[0], np.float64)))
        run.digests.append(_digest(outs))
        if not detail:
            return
        run.phase = sg.phase
        if i == 0:
            grads = [np.abs(np.asarray(g, np.float64)) for g in outs[1:1 + ng]]
            # below half fp16's smallest subnormal (2^-24): rounds to zero in fp16 without a loss scale
            run.tiny0 = (int(sum(np.count_nonzero((g > 0) & (g < 2.0 ** -25)) for g in grads)),
                         int(sum(g.size for g in grads)))
            run.grad_keys = list(sg.trainable)
            run.initial = {k: np.array(feeds[ph], copy=True) for k, ph, _ in sg.state}
            run.state0 = {k: np.array(v, copy=True) for k, v in zip(keys, outs[1 + ng:])}
            first.update(feeds=dict(feeds), sg=sg)
        run.grad_norms.append({k: float(np.linalg.norm(np.asarray(g, np.float64)))
                               for k, g in zip(sg.trainable, outs[1:1 + ng])})
        if i == steps - 1:
            run.final = {k: np.array(v, copy=True) for k, v in zip(keys, outs[1 + ng:])}
            # the final trainable weights, everything else (the dropout seed state above all) as at step 0, so
            # both losses of batch 0 see the same dropout mask
            feeds0 = dict(first["feeds"])
            for k, ph, _ in sg.state:
                if k.startswith("trainable/"):
                    feeds0[ph] = run.final[k]
            run.end_loss_batch0 = float(np.asarray(T.run_reference_step(sg, feeds0)[0], np.float64))

    res = reference_train(step, (x, y), batch_size=batch_size, steps=steps,
                          shuffle=shuffle, seed=seed, dump_dir=dump_dir, dump_steps=[0] if dump_dir else None,
                          overwrite=True,
                          progress=progress, on_step=on_step)
    run.dump0 = res.dumps.get(0)
    return run


def _first_differing_op(dump_a, dump_b):
    """(op, output index, max |difference|) of the first op, in execution order, whose outputs differ in a
    single bit between two dumps of the same graph; None if every tensor is bit-identical."""
    from ..analysis.dump import load_dump

    a, b = load_dump(dump_a), load_dump(dump_b)
    for op in a.ops:
        if op["name"] not in b:
            return op, 0, math.nan
        bop = b.op(op["name"])
        for out in op["outputs"]:
            k = out["index"]
            if not (a.has_tensor(op["name"], k) and b.has_tensor(op["name"], k)):
                continue
            ta, tb = np.asarray(a.tensor(op["name"], k)), np.asarray(b.tensor(bop["name"], k))
            if ta.shape != tb.shape or ta.dtype != tb.dtype or ta.tobytes() != tb.tobytes():
                diff = math.nan
                if ta.shape == tb.shape and ta.dtype.kind in "fiu":
                    d = np.abs(ta.astype(np.float64) - tb.astype(np.float64))
                    diff = float(np.nanmax(d)) if d.size else 0.0
                return op, k, diff
    return None


# --------------------------------------------------------------------------- the context

@dataclass
class _Ctx:
    model: object
    loss_fn: object
    fopt: object
    x: np.ndarray
    y: np.ndarray
    valid: np.ndarray | None       # mask of the samples the training items use (None: no usable data)
    batch_size: int
    steps: int
    epochs: int | None
    shuffle: bool
    seed: int
    device: object
    loss_scale: object
    overflow_check: str
    benchmark: tuple | None        # (settings, source) of the benchmark, or None
    work: str
    progress: bool
    ref_a: _RefRun | None = None
    ref_b: _RefRun | None = None
    ref_c: _RefRun | None = None    # a third run, dumped, when the second differs at step 0
    ref_error: str | None = None
    inf_diff: object = None
    inf_ops: int = 0
    inf_error: str | None = None
    npu: object = None              # TrainResult of the emulated run
    npu_error: str | None = None
    npu_dump: object = None
    bench_dump: object = None
    ops_info: dict = field(default_factory=lambda: {"black-list": {"to-add": [], "to-remove": []}})

    @property
    def xv(self):
        return self.x[self.valid]

    @property
    def yv(self):
        return self.y[self.valid]

    def suggest(self, action: str, ascend_type: str | None) -> None:
        if ascend_type and ascend_type != "Cast":
            lst = self.ops_info["black-list"][action]
            if ascend_type not in lst:
                lst.append(ascend_type)


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
    from ..npu.training import batch_order

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
    from ..frontend.loader import load_graph
    from ..frontend.reference import reference

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


# --------------------------------------------------------------------------- precision (emulated run)

def _shape_of(dump, ref):
    from ..graph.core import split_tensor_name

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
    from ..ops import CUBE, OPS

    item = "Mixed precision enabled and effective"
    method = ("emulated step 0: dtype of every matrix op (MatMul, BatchMatMul, Conv2D and their backprops) "
              "under the precision mode and lists; share of the matrix FLOPs in fp16/bf16; matrix ops the shipped "
              "black list keeps in float32")
    if c.npu_dump is None:
        return _not_checked("2/3", item, method, c.npu_error or "the emulated run did not run")
    d = c.npu_dump
    cube = [op for op in d.ops if op["tf_type"] in OPS and OPS[op["tf_type"]].kind == CUBE]
    if not cube:
        return _not_checked("2/3", item, method, "the model has no matrix op")
    low = [op for op in cube if op.get("compute_dtype") in ("float16", "bfloat16")]
    flops = {op["name"]: _cube_flops(d, op) for op in cube}
    total = sum(flops.values()) or 1.0
    share = sum(flops[op["name"]] for op in low) / total
    from ..npu.precision import MixLists

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
    if c.npu is None:
        return _not_checked(4, item, method, c.npu_error or "the emulated run did not run")
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
    if c.overflow_check == "isfinite" and mode == "saturation":
        return _row(4, item, method, FAILED, "overflow check isfinite under saturation mode: an overflow gives "
                                             "65504, not Inf, so the check misses it (the NPU reads the float status "
                                             "register: NpuLossScaleOptimizer)"
                    + (f"; status bits set but step applied at step(s) {_names(missed)}" if missed else "")
                    + f"; {scales}")
    return _row(4, item, method, PASSED, f"loss scale {c.loss_scale}, overflow check {c.overflow_check}, overflow mode "
                                         f"{mode}; {scales}")


def _row_overflow(c: _Ctx) -> CheckRow:
    from ..analysis.overflow import overflow_report

    item = "No fp16 overflow in forward or backward"
    method = ("emulated step 0 (initial weights, first batch): first op whose inputs are finite and output "
              "overflows, its phase and a float32 rerun; later steps' first overflows listed")
    if c.npu_dump is None:
        return _not_checked(16, item, method, c.npu_error or "the emulated run did not run")
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
    if phase == "backward" and c.npu.config.get("loss_scale") != "none" and scale > 1:
        if all(s["skipped"] for s in c.npu.steps):
            return _row(16, item, method, FAILED, desc + f" at loss scale {_fmt(scale)}, and every step overflows")
        return _row(16, item, method, PASSED, desc + f" at loss scale {_fmt(scale)}: the loss scale handles it "
                                                     f"({int(c.npu.skipped.sum())} step(s) skipped)" + tail)
    if v["verdict"] == "abnormal":
        c.suggest("to-add", op.get("ascend_type"))
    return _row(16, item, method, FAILED, desc + tail)


def _row_divergence(c: _Ctx) -> CheckRow:
    from ..analysis.compare import compare
    from ..analysis.metrics import ERROR, PASS, WARNING, Thresholds, accuracy_reached
    from ..frontend.training import UNSCALE_PREFIX

    item = "fp16 error within the msprobe threshold"
    t = Thresholds()
    method = (f"emulated step 0 against float32 on the same weights and batch, op by op: first op failing msprobe's "
              f"rule (cos < {t.cosine} and MaxAbsErr > {t.max_abs_err}, cos < {t.cosine_min} or MaxAbsErr > "
              f"{t.max_abs_err_max}) whose inputs pass; backward errors divided by the loss scale; tensors whose "
              f"values and error all stay below {t.max_abs_err} pass; overflowing and random ops are items 16's and "
              "1's")
    if c.npu_dump is None or c.bench_dump is None:
        return _not_checked(17, item, method, c.npu_error or "the emulated run did not run")
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
        unit = scale if name in npu and npu.op(name).get("phase") == "backward" and \
            not name.startswith(UNSCALE_PREFIX) else 1.0
        if _negligible(row):
            return False   # every value and the error below the absolute threshold: the cosine of rounding noise
        return not accuracy_reached(row["Cosine"], mae / unit if isinstance(mae, float) else mae, t)

    def _negligible(row) -> bool:
        name = str(row["NPU Name"]).rsplit(":", 1)[0]
        unit = scale if name in npu and npu.op(name).get("phase") == "backward" and \
            not name.startswith(UNSCALE_PREFIX) else 1.0
        mae = row["MaxAbsErr"]
        big = max((abs(v) for v in (row.get("Bench max"), row.get("Bench min")) if isinstance(v, (int, float))),
                  default=math.inf)
        return isinstance(mae, float) and mae / unit <= t.max_abs_err and big / unit <= t.max_abs_err

    random = {op["name"] for op in npu.ops if op["tf_type"] in RANDOM_OPS}
    by_tensor = {r["NPU Name"]: r for r in cmp.rows if r.get("NPU Name")}
    compared = sum(1 for r in cmp.rows if r["Result"] in (PASS, WARNING, ERROR))
    # ops downstream of an overflow or a random op are "tainted": their errors are items 16's and 1's
    overflowed, tainted = set(), set(random)
    for op in npu.ops:
        if int(op.get("status", 0)):
            overflowed.add(op["name"])
            tainted.add(op["name"])
            continue
        if op["name"] in random:
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
                 and str(r["NPU Name"]).rsplit(":", 1)[0] not in tainted), default=1.0)
    return _row(17, item, method, PASSED, f"{compared} tensors compared, none fails; lowest cosine {worst:.6f}"
                + (f"; {len(overflowed)} overflowing op(s) and the {len(tainted) - len(overflowed) - len(random)} "
                   "op(s) they feed left to item 16" if overflowed else "")
                + (f"; random op(s) {_names(sorted(random))} not compared" if random else ""))


def _row_underflow(c: _Ctx) -> CheckRow:
    item = "fp16 gradient underflow"
    method = ("emulated step 0 against float32 on the same weights: gradient elements that are zero in the "
              "emulated run but not in float32, at the configured loss scale; float32 gradients below fp16's range")
    if c.npu is None:
        return _not_checked(18, item, method, c.npu_error or "the emulated run did not run")
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
    if c.npu_dump is None:
        return _not_checked(19, item, method, c.npu_error or "the emulated run did not run")
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
    from ..analysis.dump import load_dump

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
    from ..frontend import training as T
    from ..npu.training import _load_model

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


# --------------------------------------------------------------------------- the job

ORDER = ["1", "2/3", "4", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16", "17", "18", "19"]


def check(model, data, *, device=None, benchmark=None, benchmark_config=None, loss=None, optimizer=None,
          learning_rate=None, batch_size: int = 32, steps: int = 20, epochs: int | None = None, loss_scale="none",
          overflow_check: str = "status", shuffle: bool = False, seed: int = 0, work_dir=None,
          progress: bool = False) -> CheckResult:
    """Run the pre-tuning checklist on a Keras model and its training data.

    Parameters
    ----------
    model : Keras 3 model (compiled, or with ``loss`` and ``optimizer``) or a ``.keras`` path.
    data : ``.npz`` path with arrays ``x`` and ``y``, a dict with them, or a pair ``(x, y)``.
    device : :class:`ascend_emu.npu.device.Device` the port runs on (default: ``Device("allow_fp32_to_fp16")``,
        the TF adapter's training default on the Ascend910).
    benchmark, benchmark_config : the benchmark's ``.keras`` model (its compiled optimizer and loss), or a
        dict / JSON path with any of ``optimizer`` (a name or ``{"name", ...settings}``), ``learning_rate``,
        ``loss``, ``batch_size``, ``epochs`` and optimizer settings; item 10 compares every key both state.
    loss, optimizer, learning_rate : as :meth:`Device.train`.
    batch_size, steps, epochs, shuffle, seed : the training run checked (``epochs`` is the planned number,
        only compared with the benchmark).
    loss_scale, overflow_check : the port's loss scaling, as :meth:`Device.train`.
    work_dir : keep the dumps the check writes here (default: a temporary directory, removed).

    Returns
    -------
    CheckResult
        The rows in checklist order (``result.rows``; each ``number``, ``item``, ``method``, ``result``,
        ``evidence``), ``ops_info`` (a suggested CANN ``modify_mixlist`` when a row failed for precision
        reasons) and ``exit_code``.
    """
    from ..fileio import read_json
    from ..frontend import training as T
    from ..npu.device import Device
    from ..npu.training import _load_model, loss_scale_manager

    device = device if device is not None else Device("allow_fp32_to_fp16")
    if not isinstance(device, Device):
        raise AscendEmuError("device must be an ascend_emu.Device")
    for name, v in (("batch_size", batch_size), ("steps", steps)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise AscendEmuError(f"{name} must be a positive integer, got {v!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise AscendEmuError(f"--seed must be a non-negative integer, got {seed!r}")
    if epochs is not None and (not isinstance(epochs, (int, np.integer)) or isinstance(epochs, bool) or epochs < 1):
        raise AscendEmuError(f"epochs must be a positive integer, got {epochs!r}")
    if overflow_check not in ("status", "isfinite"):
        raise AscendEmuError(f"unknown overflow_check {overflow_check!r}; choose status or isfinite")
    if benchmark is not None and benchmark_config is not None:
        raise AscendEmuError("give --benchmark or --benchmark-config, not both")
    if isinstance(benchmark_config, (str, os.PathLike)):
        benchmark_config = read_json(benchmark_config, "benchmark config",
                                     hint='give a JSON object such as {"optimizer": "sgd", "learning_rate": 0.01}')
    if benchmark_config is not None and not isinstance(benchmark_config, dict):
        raise AscendEmuError("the benchmark config must be a JSON object (optimizer, learning_rate, loss, "
                             "batch_size, epochs, ...)")
    if isinstance(benchmark, (str, os.PathLike)) and not os.path.exists(os.fspath(benchmark)):
        raise AscendEmuError(f"--benchmark {os.fspath(benchmark)}: no such file; give the benchmark's .keras model")
    loss_scale_manager(loss_scale)   # a bad spec is bad input, before anything runs
    x, y = _read_data(data)
    model = _load_model(model)
    loss_fn = T.resolve_loss(model, loss)
    fopt = T.resolve_optimizer(model, optimizer, learning_rate=learning_rate)
    in_shape = tuple(model.inputs[0].shape[1:]) if getattr(model, "inputs", None) else None
    if in_shape is not None and len(x) and (len(in_shape) != x.ndim - 1 or any(
            d is not None and d != s for d, s in zip(in_shape, x.shape[1:]))):
        raise AscendEmuError(f"training data x has samples of shape {tuple(x.shape[1:])} but the model takes "
                             f"{in_shape}")
    bench = None
    if benchmark is not None or benchmark_config is not None:
        try:
            bench = _benchmark_settings(benchmark, benchmark_config)
        except AscendEmuError as e:
            raise AscendEmuError(f"{'--benchmark' if benchmark is not None else '--benchmark-config'}: {e}") from None

    with tempfile.TemporaryDirectory(prefix="ascend-emu-check-") as tmp:
        work = os.fspath(work_dir) if work_dir is not None else tmp
        c = _Ctx(model, loss_fn, fopt, x, y, None, int(batch_size), int(steps), epochs, bool(shuffle), int(seed),
                 device, loss_scale, overflow_check, bench, work, progress)
        rows = {"6": _row_dataset(c)}
        if c.valid is not None:
            _run(c)
        else:
            c.ref_error = c.npu_error = "no usable samples (item 6)"
        rows["1"] = _row_constant(c)
        for fn in (_row_mixed_precision, _row_loss_scale, _row_order, _row_training, _row_hyper, _row_init,
                   _row_gradients, _row_saturation, _row_loss, _row_lr, _row_overflow, _row_divergence,
                   _row_underflow, _row_reductions):
            r = fn(c)
            rows[r.number] = r
        rows["8"] = _row_distributed()
        ops_info = {"black-list": {k: v for k, v in c.ops_info["black-list"].items() if v}}
        config = {"device": device.config(), "batch_size": c.batch_size, "steps": c.steps,
                  "loss_scale": str(loss_scale), "overflow_check": overflow_check, "shuffle": c.shuffle, "seed": c.seed,
                  "model": getattr(model, "name", ""), "samples": int(len(x)),
                  "samples_used": int(c.valid.sum()) if c.valid is not None else 0}
        return CheckResult([rows[k] for k in ORDER], ops_info if ops_info["black-list"] else None, config)


def _run(c: _Ctx) -> None:
    """The reference runs (twice), the inference runs (twice) and the emulated run, on the clean samples.

    The training step is traced once and the three training runs replay that one graph (a step that cannot
    be traced is bad input); each run starts from the model's weights and fresh optimizer slots.
    """
    from ..analysis.dump import load_dump
    from ..frontend import training as T

    xv, yv = c.xv, c.yv
    step = T.trace_train_step(c.model, c.loss_fn, c.fopt, xv[:1], yv[:1])
    step.initial = T.initial_state(c.model, c.fopt)
    step.description = {"kind": "keras", "loss": _loss_name(c.loss_fn)}
    kw = dict(batch_size=c.batch_size, steps=c.steps, shuffle=c.shuffle, seed=c.seed, progress=c.progress)
    try:
        c.ref_a = _reference_run(step, xv, yv, dump_dir=os.path.join(c.work, "reference-a"), detail=True, **kw)
        c.ref_b = _reference_run(step, xv, yv, dump_dir=None, detail=False, **kw)
        if c.ref_a.digests[:1] != c.ref_b.digests[:1]:
            # step 0 differs: one more run, dumped, names the first op that differs from the first run's dump
            c.ref_c = _reference_run(step, xv, yv, dump_dir=os.path.join(c.work, "reference-c"), detail=False,
                                     **dict(kw, steps=1))
    except AscendEmuError as e:
        c.ref_a = c.ref_b = None
        c.ref_error = str(e)
    _run_inference_twice(c)
    try:
        c.npu = c.device.train(step, (xv, yv), loss_scale=c.loss_scale, overflow_check=c.overflow_check,
                               dump_dir=os.path.join(c.work, "npu"), dump_steps=[0], reference=True,
                               overwrite=True, **kw)
        c.npu_dump = load_dump(c.npu.dumps[0])
        c.bench_dump = load_dump(c.npu.reference_dumps[0])
    except AscendEmuError as e:
        c.npu = None
        c.npu_error = f"the emulated run failed: {e}"

"""The checklist's runs: the training data, the float32 reference runs and the context every row reads."""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ...errors import AscendEmuError


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
    from ...frontend.tf import training as T
    from ...npu.training import reference_train

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
    from ...analysis.dump import load_dump

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

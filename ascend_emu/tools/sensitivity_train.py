"""``sensitivity`` over a training (``--data``, ``--steps``): every variant of the assumed parameters
(:func:`ascend_emu.tools.sensitivity.variants`) trains the same steps from the same weights on the same batches,
and the conclusions a training run draws are checked across them:

- ``loss_curve``: robust when no variant's loss leaves the default's by more than ``loss_tol`` (relative,
  at any step; a non-finite loss where the default's is finite moves it);
- ``skipped_steps``: the steps the loss scaling skipped (an overflow);
- ``first_overflow``: the first step whose status is set, and its first overflowing op.
"""
from __future__ import annotations

import math

import numpy as np

#: the conclusions of a training's sensitivity, in the order they are printed
TRAIN_CONCLUSIONS = ("loss_curve", "skipped_steps", "first_overflow")
#: training options passed through to :meth:`Device.train`
TRAIN_OPTIONS = ("loss", "optimizer", "learning_rate", "batch_size", "loss_scale", "shuffle")


def train_variant(task: dict) -> dict:
    """One variant's training (a function of its task alone: :meth:`Sweep.map` runs it on the workers)."""
    res = task["device"].train(task["model"], task["data"], steps=task["steps"], seed=task["seed"], progress=False,
                               **task["train"])
    first = next((s for s in res.steps if s.get("first_overflow")), None)
    return {"losses": [float(s["loss"]) for s in res.steps],
            "skipped_steps": [int(s["step"]) for s in res.steps if s["skipped"]],
            "first_overflow": ({"step": int(first["step"]), "op": first["first_overflow"]["name"]}
                               if first is not None else None)}


def train_conclusions(rows: list, loss_tol: float) -> dict:
    """The training conclusions across ``rows`` (the default first), as :func:`sensitivity._conclusions`."""
    base = rows[0]
    b = np.asarray(base["losses"], dtype=np.float64)
    out = {}
    moved_loss, worst = [], 0.0
    for r in rows[1:]:
        a = np.asarray(r["losses"], dtype=np.float64)
        with np.errstate(all="ignore"):
            rel = np.abs(a - b) / np.maximum(np.abs(b), 1e-30)
        bad = ~np.isfinite(a) & np.isfinite(b)
        d = math.inf if bad.any() else float(np.nanmax(rel)) if rel.size else 0.0
        worst = max(worst, d)
        r["loss_rel_shift"] = d
        if d > loss_tol:
            moved_loss.append(r)
    lo = [min(v) for v in zip(*(r["losses"] for r in rows))]
    hi = [max(v) for v in zip(*(r["losses"] for r in rows))]
    out["loss_curve"] = {"robust": not moved_loss, "default": base["losses"], "min": lo, "max": hi,
                         "tolerance": loss_tol, "max_rel_shift": worst,
                         "moved_by": [{"variant": r["label"], "parameters": r["varies"],
                                       "value": r["loss_rel_shift"]} for r in moved_loss]}
    for name in ("skipped_steps", "first_overflow"):
        moved = [r for r in rows[1:] if r[name] != base[name]]
        out[name] = {"robust": not moved, "default": base[name],
                     "moved_by": [{"variant": r["label"], "parameters": r["varies"], "value": r[name]}
                                  for r in moved]}
    return out


def run_training(sweep, device, model, data, steps: int, seed: int, train: dict, vs: list, variant) -> list:
    """Every variant of ``vs`` trained on ``sweep``: rows with ``label``, ``params``, ``varies`` and the
    findings of :func:`train_variant`."""
    from ..numerics import assumptions as _asm

    tasks = [{"device": variant(device, p), "model": model, "data": data, "steps": steps, "seed": seed,
              "train": train} for _, p, _ in vs]
    outs = sweep.map(train_variant, tasks, names=[f"train under {label}" for label, _, _ in vs])
    return [{"label": label, "params": {**_asm.current(device.numerics), **p}, "varies": list(varied), **o}
            for (label, p, varied), o in zip(vs, outs)]

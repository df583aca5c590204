"""Fusion bisection over a training (``fusion-bisect MODEL --data D --steps N``).

Every configuration of the fusion switch trains the same ``steps`` steps from the same weights on the same
batches (same seed), and its loss curve is scored as ``mixlist-search`` scores a training: its distance to one
float32 TensorFlow training of those steps (:func:`ascend_emu.tools.mixlist_train.loss_metrics`,
``loss_rel_err`` or ``loss_abs_err``). A fused pass usually brings the curve *closer* to float32 (one rounding
where the unfused ops round several times), so a configuration counts as changing the curve when its
distance differs from all-off's either way: one of the two exceeds the other by more than ``threshold``
times the smaller (:func:`changed`). Delta debugging over the passes that fired in the step graph (forward,
backward and update) then finds a minimal set of passes whose enabling alone changes the curve, and the
answer names, of those, the pass whose switch alone changes it most. Each training is one task of the
sweep (:func:`train_config`, a function of its task alone).
"""
from __future__ import annotations

import copy
import math

import numpy as np

from ..errors import AscendEmuError
from .mixlist_train import TRAIN_OPTIONS, loss_metrics

#: the scores of a training bisection (the loss curve against the float32 training's)
TRAIN_METRICS = ("loss_rel_err", "loss_abs_err")
#: default threshold: one distance more than 1.5 times the other
DEFAULT_TRAIN_THRESHOLD = 0.5
TINY = 1e-30
__all__ = ["TRAIN_METRICS", "TRAIN_OPTIONS", "changed", "curve_shift", "train_config"]


def changed(value: float, base: float, threshold: float) -> bool:
    """True if ``value`` and ``base`` (distances to the reference, >= 0) differ by more than ``threshold``
    times the smaller of the two, either way; nan (a non-finite loss) differs from any number."""
    if math.isnan(value) or math.isnan(base):
        return math.isnan(value) != math.isnan(base)
    return abs(value - base) > threshold * max(min(value, base), TINY)


def curve_shift(losses, base) -> float:
    """Max over steps of ``|loss - base| / max(|base|, 1e-30)``: how far a curve is from all-off's."""
    a = np.asarray(losses, dtype=np.float64)
    b = np.asarray(base, dtype=np.float64)
    if not (np.isfinite(a) == np.isfinite(b)).all():
        return math.nan
    ok = np.isfinite(a)
    if not ok.any():
        return 0.0
    return float(np.max(np.abs(a[ok] - b[ok]) / np.maximum(np.abs(b[ok]), TINY)))


def train_config(task: dict) -> dict:
    """One configuration's training (run by :meth:`Sweep.map` on the workers): ``device`` (with the
    configuration's fusion switch), ``model``, ``data``, ``steps``, ``seed``, ``train`` (:data:`TRAIN_OPTIONS`),
    ``ref_losses``. Returns the losses, their metrics against the reference, the passes that fired (times per
    step graph) and the OR of the steps' float status."""
    dev = copy.copy(task["device"])
    dev._fusion_cache = {}
    res = dev.train(task["model"], task["data"], steps=task["steps"], seed=task["seed"], progress=False,
                    **task["train"])
    losses = [float(s["loss"]) for s in res.steps]
    fired: dict = {}
    for entry in dev._fusion_cache.values():    # (graph, fused, ...) per step graph the training replayed
        for rule, n in entry[1].counts.items():
            fired[rule] = max(fired.get(rule, 0), int(n))
    status = 0
    for s in res.steps:
        status |= int(s["float_status"])
    return {"losses": losses, "metrics": loss_metrics(losses, task["ref_losses"]), "fired": fired,
            "float_status": status}


def check_training(data, steps, train_options, inputs, shapes, signature, keep_dumps) -> None:
    """The training arguments of :func:`fusion_bisect`, checked before any slow work."""
    bad = set(train_options) - set(TRAIN_OPTIONS)
    if bad:
        raise AscendEmuError(f"unknown option(s) {', '.join(sorted(bad))}; training takes: {', '.join(TRAIN_OPTIONS)}")
    if data is None:
        given = sorted(k for k, v in train_options.items() if v is not None) + (["steps"] if steps is not None else [])
        if given:
            raise AscendEmuError(f"{', '.join(given)} apply to training only: give the training data (--data "
                                 "FILE.npz, data=) and --steps")
        return
    if (inputs is not None and not (isinstance(inputs, (list, tuple)) and not inputs)) or shapes or \
            signature is not None:
        raise AscendEmuError("--input, --shape and --signature apply to a replay; a training bisection reads --data")
    if keep_dumps is not None:
        raise AscendEmuError("--keep-dumps applies to a replay; a training bisection keeps no dumps (train one "
                             "configuration with `ascend-emu train --fusion-switch ... --dump DIR`)")
    if steps is None:
        raise AscendEmuError("a training bisection needs steps (--steps N) beside the data")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise AscendEmuError(f"steps must be a positive integer (--steps N), got {steps!r}")


class SubsetTrials:
    """ddmin's test over subsets of the passes that fired: a subset is keyed by its passes in firing order and
    tried once (``run_batch(keys)`` -> one Trial per key, its ``degraded`` set); ``first`` is the all-on trial."""

    def __init__(self, fired, run_batch, first):
        self.fired, self.run_batch = list(fired), run_batch
        self.cache: dict = {tuple(self.fired): first}

    def key(self, subset) -> tuple:
        return tuple(r for r in self.fired if r in subset)

    def batch(self, subsets) -> None:
        keys = []
        for s in subsets:
            k = self.key(s)
            if k not in self.cache and k not in keys:
                keys.append(k)
        if keys:
            for k, t in zip(keys, self.run_batch(keys)):
                self.cache[k] = t

    def test(self, subset) -> bool:
        k = self.key(subset)
        if k not in self.cache:
            self.batch([subset])
        return bool(self.cache[k].degraded)


def run_training_bisect(result, sweep, device, model, data, steps: int, seed: int, train: dict, task_switch,
                        ddmin, rules_in_order, trial_cls) -> None:
    """Fill ``result`` (a :class:`~ascend_emu.tools.bisect.BisectResult`): the float32 training once, all-off
    and all-on, then ddmin over the passes that fired. ``task_switch(name, switch)`` -> a device with that
    fusion switch; ``ddmin`` and ``trial_cls`` are :mod:`.bisect`'s."""
    from ..npu.training import reference_train

    ref = reference_train(model, data, steps=steps, seed=seed, progress=False, **train)
    ref_losses = [float(s["loss"]) for s in ref.steps]
    result.reference_losses = ref_losses
    metric, threshold = result.metric, result.threshold

    def run(named):
        tasks = [{"device": dev, "model": model, "data": data, "steps": steps, "seed": seed, "train": train,
                  "ref_losses": ref_losses} for _, dev in named]
        return sweep.map(train_config, tasks, names=[f"train with {n}" for n, _ in named])

    off_r, on_r = run([("all-off", task_switch("off")), ("all-on", task_switch(None))])

    def trial(name, enabled, r):
        m = dict(r["metrics"], curve_shift=curve_shift(r["losses"], off_r["losses"]))
        t = trial_cls(name, tuple(enabled), m, r["fired"], r["float_status"], None)
        t.losses = r["losses"]
        return t

    off = trial("all-off", (), off_r)
    result.trials.append(off)
    on = trial("all-on", tuple(rules_in_order), on_r)
    on.degraded = changed(on.metrics[metric], off.metrics[metric], threshold)
    result.trials.append(on)
    result.fired = [r for r in rules_in_order if on.fired.get(r)]
    result.degraded = on.degraded
    if not on.degraded:
        return
    def run_batch(keys):
        names = [f"only-{'+'.join(k)}" for k in keys]
        out = []
        for n, k, r in zip(names, keys, run([(n, task_switch(k)) for n, k in zip(names, keys)])):
            t = trial(n, k, r)
            t.degraded = changed(t.metrics[metric], off.metrics[metric], threshold)
            result.trials.append(t)
            out.append(t)
        return out

    trials = SubsetTrials(result.fired, run_batch, on)
    culprits = ddmin(list(result.fired), trials.test, trials.batch)
    if not trials.test(culprits):
        return
    # of a minimal set, the pass whose switch alone moves the score furthest from all-off's (ddmin's
    # 1-minimality tested the singletons of a set of two; a larger set's are trained here)
    trials.batch([[r] for r in culprits])

    def moved(r):
        v = trials.cache[(r,)].metrics[metric]
        return math.inf if math.isnan(v) != math.isnan(off.metrics[metric]) else abs(v - off.metrics[metric])

    result.culprits = sorted(culprits, key=lambda r: (-moved(r), culprits.index(r)))

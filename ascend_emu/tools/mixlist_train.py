"""The mixlist search over a training (:mod:`ascend_emu.tools.mixlist_search`): each candidate list is an
emulated training of N steps against one float32 reference run, measured on the loss curve and ranked from
step 0 op by op (:func:`train_task`, a function of its task alone, runs on the sweep's workers)."""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from ..errors import AscendEmuError
from .mixlist_core import TINY, MixlistResult, _copy_device, _search, memoized, op_analysis


#: training options of a search (:meth:`Device.train`'s keywords besides steps and seed)
TRAIN_OPTIONS = ("loss", "optimizer", "learning_rate", "optimizer_options", "batch_size", "loss_scale", "shuffle")


class _Eval:
    """One evaluation's result as the search reads it."""

    def __init__(self, metrics: dict, analysis: dict):
        self.metrics, self.analysis = metrics, analysis


def loss_metrics(losses, ref) -> dict:
    """``loss_rel_err`` (max over steps of ``|loss - ref| / max(|ref|, TINY)``) and ``loss_abs_err``; a
    non-finite loss where the reference is finite makes both nan (the worst value)."""
    a = np.asarray(losses, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape:
        raise AscendEmuError(f"{a.size} losses against {b.size} reference losses")
    if not np.isfinite(a).all():
        return {"loss_rel_err": math.nan, "loss_abs_err": math.nan}
    d = np.abs(a - b)
    return {"loss_rel_err": float(np.max(d / np.maximum(np.abs(b), TINY))), "loss_abs_err": float(np.max(d))}


def train_task(task: dict) -> dict:
    """One evaluation of a training search, a function of its task alone (run by :meth:`Sweep.map`).

    ``task``: ``device`` (the candidate's Device), ``model``, ``data``, ``steps``, ``seed``, ``train``
    (:data:`TRAIN_OPTIONS`), ``ref_losses`` (the float32 run's), ``step0`` (the traced step's graph),
    ``feeds0`` (step 0's inputs) and ``ref0`` (the float32 tensors of step 0 from those inputs).
    Trains ``steps`` steps and replays step 0 keeping its tensors for the op-by-op ranking; returns
    ``{"metrics", "losses", "analysis"}`` (small: a few numbers per op).
    """
    dev = _copy_device(task["device"])
    res = dev.train(task["model"], task["data"], steps=task["steps"], seed=task["seed"], progress=False,
                    **task["train"])
    losses = [float(s["loss"]) for s in res.steps]
    # step 0 again with its tensors kept: the same device, inputs and launch as the training's step 0
    r0 = _copy_device(task["device"]).replay(task["step0"], task["feeds0"], progress=False, keep_tensors=True,
                                              launch=0)
    analysis = op_analysis(r0, _RefTensors(task["ref0"]))
    return {"metrics": loss_metrics(losses, task["ref_losses"]), "losses": losses, "analysis": analysis}


class _RefTensors:
    def __init__(self, tensors):
        self.ref_tensors = tensors


def _train_search(model, data, steps, train_options, seed, target, device, mode, base, device_with, output, beam,
                  max_steps, scheduler, n_workers, progress) -> MixlistResult:
    from ..frontend.tf.reference import reference
    from ..npu.training import first_step, reference_train
    from .sweep import Sweep

    opts = dict(train_options)
    with Sweep(scheduler, n_workers=n_workers, progress=progress, desc="mixlist-search") as sweep:
        # once: the float32 training (its loss curve) and step 0's float32 tensors from the emulated step's inputs
        ref = reference_train(model, data, steps=steps, seed=seed, progress=False, **opts)
        ref_losses = [float(s["loss"]) for s in ref.steps]
        sg, feeds0 = first_step(model, data, steps=steps, seed=seed, **opts)
        # a replay never reads the serialised GraphDef: shipping it with every task would send the weights twice
        step0 = dataclasses.replace(sg.graph, graph_def=None) if sg.graph.graph_def else sg.graph
        r = reference(sg.graph, feeds0, progress=False)
        ref0 = {k: v for k, v in r.tensors.items() if np.asarray(v).dtype.kind == "f"}
        name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else str(getattr(model, "name", "model"))
        res = MixlistResult(name, target, mode, base, scheduler=scheduler)
        res.reference_losses = ref_losses
        def run(todo) -> list:
            tasks = [{"device": device_with(t), "model": model, "data": data, "steps": steps, "seed": seed,
                      "train": opts, "ref_losses": ref_losses, "step0": step0, "feeds0": feeds0, "ref0": ref0}
                     for t in todo]
            outs = sweep.map(train_task, tasks, names=["train with " + ("+".join(t) or "the user's lists")
                                                       for t in todo])
            return [_Eval(o["metrics"], o["analysis"]) for o in outs]

        _search(res, memoized(run), target, device.precision.lists.black, beam, max_steps)
        res.replays = sweep.replays
    if output is not None and res.met:
        res.write(output)
    return res

"""Mixed-precision list search: the op types to black-list so a model meets an accuracy target.

Seed 004 tunes accuracy by hand: find the ops that lose precision in fp16, add them to the black list of
an ``ops_info.json`` (CANN ``modify_mixlist``), rerun, repeat. :func:`mixlist_search` automates it under
``allow_mix_precision`` (or ``_bf16``):

1. **baseline**: replay with the user's lists; compare every op with the float32 reference;
2. **rank** the op types that ran in fp16: the type of the first divergent op first, then by the
   largest error growth of any of its ops (its output's relative error minus its inputs');
3. **greedy add**: each step replays the current list plus each of the ``beam`` best-ranked types
   (side by side on the sweep's workers) and keeps the best-ranked one that improves the metric (else
   the one with the best metric); the ranking is recomputed from that replay; until the target holds
   (or no candidate is left);
4. **prune**: replay the list without each of its types; drop one whose removal keeps the target (the
   most expensive first) and repeat until no single removal keeps it: the list is 1-minimal.

Which candidates a step tries depends only on replay results, never on the scheduler, so the search
gives the same list under ``scheduler="none"`` and on a cluster. The result reports the replays used,
the metric after each step and the cost: the ops that run in float32 instead of fp16 and their share of
the model's FLOPs (estimated: 2*M*N*K for cube ops, one per element otherwise).

CANN's lists are per op type (``modify_mixlist``); see :data:`BY_NAME_REFUSAL`. The shared core (targets,
ranking, the search loop) is in :mod:`.mixlist_core`, the training side in :mod:`.mixlist_train`.
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import AscendEmuError
from .mixlist_core import (BY_NAME_REFUSAL, DEFAULT_BEAM, MIXED_MODES, TARGET_METRICS, TRAIN_METRICS,  # noqa: F401
                           MixlistResult, Target, _base_mixlist, _copy_device, _search, memoized, merge_mixlist,
                           op_analysis)
from .mixlist_train import TRAIN_OPTIONS, _train_search, loss_metrics  # noqa: F401


def mixlist_search(model, inputs=None, *, target="cosine>=0.999", device=None, device_kwargs=None, signature=None,
                   shapes=None, seed: int = 0, by: str = "type", output=None, beam: int = DEFAULT_BEAM,
                   max_steps: int = 32, scheduler="none", n_workers: int | None = None,
                   progress: bool = True, data=None, steps: int | None = None, **train_options) -> MixlistResult:
    """Find a 1-minimal set of op types to black-list so the model's outputs meet ``target``.

    Parameters
    ----------
    model : Keras model, path, tf.function, ConcreteFunction or Graph
        Anything :func:`ascend_emu.frontend.tf.loader.load_graph` accepts.
    inputs, signature, shapes, seed
        As :meth:`ascend_emu.npu.device.Device.replay`.
    target : str or Target
        ``"cosine>=0.999"``, ``"max_rel_err<=0.01"``, ``"max_abs_err<=..."``, ``"rmse<=..."``: the model's
        float outputs (flattened, concatenated) against the float32 TensorFlow reference.
    device : Device, optional
        The emulated NPU; its precision mode must be ``allow_mix_precision`` (``_fp16``/``_bf16``). Its
        ``modify_mixlist`` is the starting point and is kept in the written file. Default
        ``Device("allow_mix_precision")``.
    device_kwargs : dict, optional
        ``{"device": Device}`` (what the CLI passes) or keyword arguments for ``Device``.
    by : {"type"}
        CANN lists are per op type; ``"name"`` is refused (:data:`BY_NAME_REFUSAL`).
    output : path, optional
        Write the found ``ops_info.json`` there (only if the target is met).
    beam : int
        Candidates replayed side by side per greedy step (default 4).
    max_steps : int
        At most this many greedy steps.
    scheduler, n_workers, progress
        As :class:`ascend_emu.tools.sweep.Sweep` (default ``"none"``: serial in this process).
    data, steps, train_options
        Training instead of replaying: ``data`` (an .npz path, a dict with x and y, or a pair), ``steps``
        (required) and the options of :data:`TRAIN_OPTIONS` (``batch_size``, ``loss``, ``optimizer``,
        ``learning_rate``, ``optimizer_options``, ``loss_scale``, ``shuffle``; ``seed`` is the shuffle's).
        Each evaluation trains ``steps`` steps under the candidate lists; the target is on the loss curve
        against one float32 :func:`~ascend_emu.npu.training.reference_train` run of the same steps and
        batches: ``loss_rel_err`` (max over steps of ``|loss - ref| / max(|ref|, 1e-30)``) or
        ``loss_abs_err``. The ranking compares step 0 op by op (forward and backward) with TensorFlow
        float32 from the same inputs, weights and loss scale.

    Returns
    -------
    MixlistResult
    """
    from ..frontend.inputs import make_inputs
    from ..frontend.tf.loader import load_graph
    from ..frontend.tf.reference import reference
    from ..graph.core import Graph
    from ..npu.device import Device
    from ..npu.precision import PrecisionPolicy
    from .sweep import (ReplayTask, Sweep, SweepContext, check_scheduler, flat_outputs, raise_failures,
                        reference_engine, remember)

    if by == "name":
        raise AscendEmuError(BY_NAME_REFUSAL)
    if by != "type":
        raise AscendEmuError(f"by {by!r}: use type")
    target = Target.parse(target)
    bad = set(train_options) - set(TRAIN_OPTIONS)
    if bad:
        raise AscendEmuError(f"unknown option(s) {', '.join(sorted(bad))}; training takes: {', '.join(TRAIN_OPTIONS)}")
    if data is None:
        if target.metric in TRAIN_METRICS:
            raise AscendEmuError(f"target {target}: {target.metric} is on a training's loss; give the training data "
                                 "(--data train.npz, data=) and --steps, or a replay target such as cosine>=0.999")
        if steps is not None or any(v is not None for v in train_options.values()):
            raise AscendEmuError(f"{', '.join(sorted(set(train_options) | ({'steps'} if steps is not None else set())))}"
                                 " apply to training only; give --data (data=) to search over a training")
    else:
        if target.metric not in TRAIN_METRICS:
            raise AscendEmuError(f"target {target}: with training data the target is on the loss curve: give "
                                 "loss_rel_err<=E or loss_abs_err<=E (or drop --data to search over a replay)")
        if (inputs is not None and not (isinstance(inputs, (list, tuple)) and not inputs)) or shapes or \
                signature is not None:
            raise AscendEmuError("--input, --shapes and --signature apply to a replay; a training reads --data")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise AscendEmuError(f"a training search needs steps, a positive integer (--steps N), got {steps!r}")
    scheduler = check_scheduler(scheduler)
    if not isinstance(beam, int) or beam < 1:
        raise AscendEmuError(f"beam must be a positive integer, got {beam!r}")
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
        raise AscendEmuError(f"max_steps (--max-steps) must be a positive integer, got {max_steps!r}")
    kw = dict(device_kwargs or {})
    if device is None:
        device = kw.pop("device", None)
    if device is None:
        if kw.get("precision_mode") is None and kw.get("precision_mode_v2") is None:
            kw["precision_mode"] = "allow_mix_precision"
        device = Device(**kw)
    elif kw:
        raise AscendEmuError("pass either device= or Device keyword arguments in device_kwargs, not both")
    if not isinstance(device, Device):
        raise AscendEmuError("device must be an ascend_emu.Device")
    mode = device.precision.requested_mode
    if mode not in MIXED_MODES:
        raise AscendEmuError(f"mixlist-search needs --precision-mode allow_mix_precision (or _fp16/_bf16): the lists "
                             f"decide nothing under {mode}")
    base = _base_mixlist(device)
    if output is not None:
        from ..fileio import check_writable

        check_writable(output, "--output")

    def device_with(black) -> Device:
        d = _copy_device(device)
        d.precision = PrecisionPolicy(mode, merge_mixlist(base, black))
        return d

    if data is not None:
        return _train_search(model, data, int(steps), train_options, seed, target, device, mode, base, device_with,
                             output, beam, max_steps, scheduler, n_workers, progress)
    # the cluster first: an unreachable scheduler fails before the model is even loaded
    with Sweep(scheduler, n_workers=n_workers, progress=progress, desc="mixlist-search") as sweep:
        graph = model if isinstance(model, Graph) else load_graph(model, signature=signature, input_shapes=shapes)
        if isinstance(inputs, (list, tuple)) and not inputs:
            inputs = None
        feeds = make_inputs(graph, inputs, seed=seed, shapes=shapes)
        ref = reference(graph, feeds, progress=False)
        bench = flat_outputs(ref.outputs[t] for t in graph.outputs)
        tensors = {k: v for k, v in ref.tensors.items() if np.asarray(v).dtype.kind == "f"}
        path = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        ctx = SweepContext(path or graph, graph.fingerprint, feeds, bench, signature=signature, shapes=shapes,
                           ref_tensors=tensors)
        remember(graph, ctx)
        res = MixlistResult(graph.name, target, mode, base, scheduler=scheduler,
                            reference=reference_engine(graph))
        def run(todo) -> list:
            runs = sweep.run(ctx, [ReplayTask("+".join(t) or "baseline", device_with(t), analyze=op_analysis)
                                   for t in todo])
            raise_failures(runs)
            return runs

        _search(res, memoized(run), target, device.precision.lists.black, beam, max_steps)
        res.replays = sweep.replays
    if output is not None and res.met:
        res.write(output)
    return res
